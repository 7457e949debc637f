"""Every store does the same things: one suite run over a local directory, ``memory://`` and a
bucket of the loopback S3 server."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from pskd_jax.errors import StorageError, TruncatedError
from pskd_jax.storage import CREATE, Conflict, StorageOptions, Version, locate, read_all, resolve


def _place(any_place: str, name: str):
    return resolve(locate(any_place).child(name))


def test_put_get_info_list_delete(any_place):
    store, where = _place(any_place, "a.bin")
    assert store.info(where.key) is None
    written = store.put(where.key, b"hello world")
    assert written.size == 11
    data, info = store.get(where.key)
    assert data == b"hello world" and info.size == 11 and info.tag
    assert store.info(where.key).tag == info.tag
    other = locate(any_place).child("b.bin")
    store.put(other.key, [b"ab", memoryview(b"cd"), np.frombuffer(b"ef", np.uint8)])
    assert store.get(other.key)[0] == b"abcdef"
    listed = store.list(locate(any_place).key)
    assert [locate(any_place).child(n).key for n in ("a.bin", "b.bin")] == [o.key for o in listed]
    store.delete(where.key)
    store.delete(where.key)  # nothing there: nothing to do
    assert store.info(where.key) is None


def test_ranges_and_read_into(any_place):
    store, where = _place(any_place, "r.bin")
    payload = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8)
    store.put(where.key, payload.tobytes())
    got = store.read_ranges(where.key, [0, 10, 299_990], [5, 20, 300_000])
    assert [bytes(g) for g in got] == [payload[0:5].tobytes(), payload[10:20].tobytes(), payload[299_990:].tobytes()]
    assert store.read_ranges(where.key, [], []) == []
    out = np.empty(200_000, np.uint8)
    store.read_into(where.key, 50_000, memoryview(out))
    assert np.array_equal(out, payload[50_000:250_000])
    assert np.array_equal(read_all(store, where.key, 300_000), payload)
    assert b"".join(bytes(c) for c in store.chunks(where.key, 1 << 16)) == payload.tobytes()


def test_read_into_in_parts(any_place):
    """A read larger than one part goes in concurrent parts, each into its place."""
    where = locate(any_place).child("p.bin")
    store, _ = resolve(where, StorageOptions(part_bytes=1 << 16, concurrency=4))
    payload = np.random.default_rng(1).integers(0, 256, (1 << 18) + 123, dtype=np.uint8)
    store.put(where.key, payload.tobytes())
    out = np.zeros(len(payload) - 7, np.uint8)
    store.read_into(where.key, 7, memoryview(out))
    assert np.array_equal(out, payload[7:])


def test_short_and_missing_reads_are_e9003(any_place):
    store, where = _place(any_place, "s.bin")
    with pytest.raises(TruncatedError):
        store.get(where.key)
    store.put(where.key, b"0123456789")
    with pytest.raises(TruncatedError):
        store.read_into(where.key, 5, memoryview(bytearray(10)))
    tag = store.info(where.key).tag
    for start, stop in ((10, 11), (12, 20)):  # wholly past the end (S3 answers 416): E9003 as a range cut short
        for condition in (None, tag):
            with pytest.raises(TruncatedError):
                store.read_ranges(where.key, [start], [stop], tag=condition)
    for condition in (None, tag):  # an empty range is no request, and no error
        assert [bytes(g) for g in store.read_ranges(where.key, [3, 0], [3, 2], tag=condition)] == [b"", b"01"]


def test_conditional_puts(any_place):
    store, where = _place(any_place, "index.json")
    first = store.put(where.key, b"v1", mode=CREATE)
    with pytest.raises(Conflict):
        store.put(where.key, b"v1-again", mode=CREATE)
    second = store.put(where.key, b"v2", mode=Version(first.tag))
    with pytest.raises(Conflict):
        store.put(where.key, b"v3", mode=Version(first.tag))  # a stale version loses
    assert store.get(where.key)[0] == b"v2"
    assert store.get(where.key)[1].tag == second.tag


def test_a_failing_stream_leaves_nothing(any_place):
    store, where = _place(any_place, "torn.bin")

    def pieces():
        yield b"x" * (1 << 20)
        raise RuntimeError("the writer failed midway")

    with pytest.raises(RuntimeError):
        store.put(where.key, pieces())
    assert store.info(where.key) is None
    assert store.list(locate(any_place).key) == []


def test_stores_pickle(any_place):
    store, where = _place(any_place, "k.bin")
    store.put(where.key, b"kept")
    again = pickle.loads(pickle.dumps(store))
    assert again.get(where.key)[0] == b"kept"


def test_local_store_reads_and_lists_regular_files_only(tmp_path):
    store, where = resolve(str(tmp_path / "f.bin"))
    store.put(where.key, b"data")
    os.symlink(tmp_path / "f.bin", tmp_path / "link.bin")
    os.mkdir(tmp_path / "sub")
    assert [os.path.basename(o.key) for o in store.list(str(tmp_path))] == ["f.bin"]
    with pytest.raises(TruncatedError, match="symbolic link"):
        store.info(str(tmp_path / "link.bin"))
    store.delete(str(tmp_path / "sub"))  # a directory is not an object: refused, never removed
    assert (tmp_path / "sub").is_dir()


def test_unknown_scheme_never_becomes_a_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match="ftp://"):
        resolve("ftp://host/x")
    assert os.listdir(tmp_path) == []


def test_equal_options_share_one_client_and_the_clients_kept_are_bounded(monkeypatch):
    """Options are values: made afresh for every open (as a loop reopening a corpus does), equal
    ones reach the bucket through one client, not one client (and its threads) each, and the
    clients kept for reuse are the last few, whatever a process opens."""
    import pskd_jax.storage as storage

    where = locate("memory://shared-clients/k")
    first, _ = resolve(where, StorageOptions(config={"a": "1"}, retries=2))
    again, _ = resolve(where, StorageOptions(config={"a": "1"}, retries=2))
    other, _ = resolve(where, StorageOptions(config={"a": "2"}, retries=2))
    assert again is first and other is not first and other.options.config == {"a": "2"}
    first.put(where.key, b"bytes")
    first.get(where.key)  # (the client's threads started)
    monkeypatch.setattr(storage, "KEPT_STORES", 4)
    for n in range(20):
        store, _ = resolve(where, StorageOptions(retries=n % 10, concurrency=1 + n))
        assert store.get(where.key)[0] == b"bytes"  # (memory buckets are one process's, by name)
    assert len(storage._STORES) <= 4  # (a client dropped from them ends its threads once unused)


def test_the_bucket_itself_is_no_object(object_place):
    """``s3://bucket`` (the empty key) names the bucket: no object is there, none is read or written
    there, and nothing is asked of the store (S3 answers a GET of it with the bucket's listing, and a
    PUT with errors it would retry)."""
    store, where = resolve(object_place)
    assert where.key == ""
    store.put("a.bin", b"an object of the bucket")
    assert store.info("") is None and store.head("", 8) is None
    for read in (lambda: store.get(""), lambda: list(store.chunks("")), lambda: store.read_ranges("", [0], [1])):
        with pytest.raises(TruncatedError, match="names the bucket, not an object"):
            read()
    for mode in ("overwrite", CREATE):
        with pytest.raises(StorageError, match="names the bucket, not an object") as refused:
            store.put("", b"x", mode=mode)
        assert "tries" not in str(refused.value)  # refused before any request
    store.delete("")  # nothing there: nothing to do
    assert [o.key for o in store.list("")] == ["a.bin"]


def test_a_key_longer_than_a_store_takes_is_refused_naming_it(object_place):
    """S3 and GCS store keys of at most 1024 bytes (UTF-8); moto and memory:// take longer ones, a
    real store answers 400 after the data was sent. The toolkit refuses such a key itself, before
    any request, whether given whole or made from a prefix."""
    longest = "é" * 510 + "abcd"  # 1024 bytes
    place = locate(object_place).child(longest)
    store, _ = resolve(place)
    store.put(place.key, b"fits")
    assert store.get(place.key)[0] == b"fits"
    too_long = locate(object_place).child("é" * 510 + "abcde")  # 1025 bytes
    with pytest.raises(StorageError, match="E9018") as refused:
        locate(too_long.url)
    assert too_long.url in str(refused.value) and "1025 bytes" in str(refused.value)
    long_prefix = locate(object_place).child("p" * 1020)  # a prefix that fits, and a name made under it
    for call in (lambda k: store.put(k, b"x"), lambda k: store.put(k, b"x", mode=CREATE), store.info, store.get,
                 lambda k: store.head(k, 10), lambda k: store.read_ranges(k, [0], [1])):
        with pytest.raises(StorageError, match="E9018") as refused:
            call(long_prefix.child("step-1").key)
        assert long_prefix.child("step-1").url in str(refused.value) and "1027 bytes" in str(refused.value)
    assert [o.key for o in store.list(locate(object_place).key)] == [place.key]


def test_a_key_too_long_is_refused_without_showing_a_credential(object_place, monkeypatch):
    """(The store's own check, of a key made under a prefix, redacts as locate does.)"""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "key-secret-words")
    long_prefix = locate(object_place).child("key-secret-words-" + "p" * 1010)
    store, _ = resolve(long_prefix)
    with pytest.raises(StorageError, match=r"E9018: .*\*\*\*-p+/step-1: the key is 1034 bytes long") as refused:
        store.put(long_prefix.child("step-1").key, b"x")
    assert "key-secret-words" not in str(refused.value)


def test_a_whole_output_states_its_size_so_that_its_upload_fits_the_parts(object_place, monkeypatch):
    """(S3's 10000 parts an upload, made 1 here: the spooled output's size is known and said.)"""
    from pskd_jax.storage import objects, whole_output

    monkeypatch.setattr(objects, "MAX_PARTS", 1)
    where = locate(object_place).child("out.bin")
    data = os.urandom(9 << 20)  # two parts of 8 MiB
    with whole_output(where.url) as f:
        f.write(data)
    store, _ = resolve(where)
    assert store.get(where.key)[0] == data


def test_a_read_from_a_bucket_that_is_not_there_says_so(s3_bucket):
    """S3 answers a GET in a missing bucket with NoSuchBucket (a 404, as for a missing object): a
    read says the bucket is missing (E9018), not that the object is (E9003), so that a mistyped
    bucket is not taken for a missing checkpoint. A HEAD's answer has no body: ``info``, finding no
    object, asks a listing once whether the bucket is there, so that a missing single input of a
    corpus build or a stream of a pipeline says so too."""
    from pskd_jax import checkpoint as ck

    missing = f"{s3_bucket.name}-missing"
    store, where = resolve(f"s3://{missing}/run/ckpt.psk.d")
    for read in (lambda: store.get(where.key), lambda: store.head(where.key, 64),
                 lambda: store.read_ranges(where.key, [0], [8]),
                 lambda: store.read_ranges(where.key, [0], [8], tag="x"),
                 lambda: b"".join(store.chunks(where.key)), lambda: ck.restore(where.url, as_numpy=True)):
        with pytest.raises(StorageError, match="E9018") as refused:
            read()
        assert where.url in str(refused.value) and f"there is no bucket {missing!r}" in str(refused.value)
    with pytest.raises(StorageError, match=f"there is no bucket {missing!r}"):
        store.info(where.key)
    from pskd_jax.corpus import build_corpus
    with pytest.raises(StorageError, match=f"there is no bucket {missing!r}"):
        build_corpus([f"s3://{missing}/raw/docs.jsonl"], "unused-output")
    there, key = resolve(f"s3://{s3_bucket.name}/run/none-here.psk.d")
    assert there.info(key.key) is None  # (a missing key of a bucket that is there: no error)


def test_a_listing_or_a_write_in_a_bucket_that_is_not_there_says_so(s3_bucket):
    """A listing of a missing bucket is the client's generic error (not its 'not found'), a write's
    its 'not found': each said E9018 with the client's dump of the answer (a listing: '1 try in
    0.0 s … GenericError: … <Code>NoSuchBucket</Code> …'), so that `pskd corpus build -o` and a
    manager's directory in a mistyped bucket did not say the bucket is missing."""
    missing = f"{s3_bucket.name}-missing"
    store, where = resolve(f"s3://{missing}/run/step.bin")
    for act in (lambda: store.list("run"), lambda: store.list(""), lambda: store.put(where.key, b"x"),
                lambda: store.put(where.key, b"x", mode=CREATE), lambda: store.put(where.key, [b"x", b"y"])):
        with pytest.raises(StorageError, match="E9018") as refused:
            act()
        message = str(refused.value)
        assert f"there is no bucket {missing!r} (the store answered NoSuchBucket)" in message, message
        assert "<Code>" not in message and "GenericError" not in message, message
