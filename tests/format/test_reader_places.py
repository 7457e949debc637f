"""The Reader over any place: a local path, ``file://``, ``memory://`` and a bucket of the loopback
S3 server. The same samples everywhere; an object read by byte ranges (one batched call a read,
spans that touch merged), its length checked as a file's is; the access modes that need a map
refuse an object; layout files found beside the object; a scheme the toolkit cannot serve never
becomes a local path."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from pskd_jax import checkpoint
from pskd_jax.format import byte_sources
from pskd_jax.format.byte_sources import StoreBytes, merged_ranges
from pskd_jax.format.layout_file import find_layout_file
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import write
from pskd_jax.storage import resolve
from tests.helpers import raises

TYPE = "(idx[1000][seq: 5], ℝ[2])"


def _data(n: int = 50):
    rng = np.random.default_rng(0)
    return rng.integers(0, 1000, (n, 5)), rng.standard_normal((n, 2))


def upload(local: str, place: str, name: str) -> str:
    """``local``'s bytes as ``place/name`` (a copy for a local place); the URL or path."""
    url = f"{place}/{name}"
    store, where = resolve(url)
    with open(local, "rb") as f:
        store.put(where.key, f.read())
    return url


@pytest.fixture
def written(tmp_path) -> str:
    path = str(tmp_path / "src.psk.d")
    write(path, TYPE, _data())
    return path


def test_the_same_samples_in_every_place(any_place, written):
    url = upload(written, any_place, "w.psk.d")
    indices = np.array([3, 4, 5, 0, 49, 3, 17, 18])
    with Reader(written) as local, Reader(url) as there:
        assert there.access == ("mmap" if "://" not in url else "pread")
        assert len(there) == len(local) == 50 and there.header == local.header
        for got, want in zip(there.gather(indices), local.gather(indices)):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(there[-1][1], local[-1][1])
        assert there.read_data(0, 40).tobytes() == local.read_data(0, 40).tobytes()
        assert there.leaf_range(7, 0, 1, 4).tolist() == local.leaf_range(7, 0, 1, 4).tolist()
        assert [s[0].tolist() for s in there] == [s[0].tolist() for s in local]


def test_a_file_url_is_the_local_file(written):
    with Reader("file://" + written) as reader:
        assert reader.path == written and reader.access == "mmap" and len(reader) == 50


def test_an_object_is_read_by_ranges_in_one_batched_call(object_place, written, monkeypatch):
    url = upload(written, object_place, "w.psk.d")
    with Reader(url) as reader:
        calls = []
        original = type(reader._bytes.store).read_ranges

        def counted(self, key, starts, stops, **options):
            calls.append(list(zip(starts, stops)))
            return original(self, key, starts, stops, **options)

        monkeypatch.setattr(type(reader._bytes.store), "read_ranges", counted)
        reader.gather(np.array([10, 11, 12, 40, 2]))
        assert len(calls) == 1  # one call for the whole gather
        record, start = reader.sample_bytes, reader.header.data_offset
        assert calls[0] == [(start + 2 * record, start + 3 * record), (start + 10 * record, start + 13 * record),
                            (start + 40 * record, start + 41 * record)]  # runs 10-12 as one range


def test_merged_ranges_cover_each_span_once():
    starts, stops, which = merged_ranges([100, 0, 50, 60, 10, 5], [10, 5, 10, 5, 0, 5])
    assert (starts, stops) == ([0, 50, 100], [10, 65, 110])
    assert which == [2, 0, 1, 1, -1, 0]  # the empty span is not requested


def test_large_spans_go_straight_into_their_buffer(object_place, tmp_path, monkeypatch):
    monkeypatch.setattr(byte_sources, "LARGE_SPAN", 1024)
    blob = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    store, where = resolve(object_place + "/blob")
    store.put(where.key, blob.tobytes())
    source = StoreBytes(store, where.key)
    big, small = np.empty(5000, np.uint8), np.empty(100, np.uint8)
    source.read_spans([big.data, small.data], [3000, 50])
    assert big.tobytes() == blob[3000:8000].tobytes() and small.tobytes() == blob[50:150].tobytes()
    with raises("E9003", "ends before"):
        source.read_spans([np.empty(10, np.uint8).data], [9995])


def test_an_object_refuses_a_map(object_place, written):
    url = upload(written, object_place, "w.psk.d")
    with raises("E9012", "access='mmap'", url):
        Reader(url, access="mmap")
    with Reader(url) as reader:
        for view in (reader.leaves, reader.samples, reader.raw_data):
            with raises("E9012", "memory map", url):
                view()
        assert reader[0][0].tolist() == _data()[0][0].tolist()  # still readable


def test_a_truncated_object_is_refused_as_a_file_is(any_place, written, tmp_path):
    cut = str(tmp_path / "cut.psk.d")
    with open(written, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:-7])
    url = upload(cut, any_place, "cut.psk.d")
    with raises("E9003", "truncated", "50 samples", "49 present"):
        Reader(url)


def test_a_missing_object_is_named(object_place):
    with raises("E9002", f"{object_place}/none.psk.d", "no such object"):
        Reader(f"{object_place}/none.psk.d")


@pytest.mark.parametrize("url", ["ftp://host/x.psk.d", "s3://No_Bucket/x.psk.d", "hdfs://a/b"])
def test_a_url_not_served_is_never_a_local_path(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with raises("E9018"):
        Reader(url)
    assert os.listdir(tmp_path) == []


def test_an_object_pickles_and_reopens(written):
    url = upload(written, "memory://pickled", "w.psk.d")
    with Reader(url) as reader:
        again = pickle.loads(pickle.dumps(reader))
        with Reader(written) as local:  # its identity is its content: the object's is the file's
            assert repr(again) == repr(reader) == repr(local)
        np.testing.assert_array_equal(again.gather([1, 2])[0], reader.gather([1, 2])[0])
        store, where = resolve(url)
        with open(written, "rb") as f:
            store.put(where.key, f.read())  # the same bytes, a new object
        with raises("E9005", "changed since the reader was pickled"):
            pickle.loads(pickle.dumps(reader))
        with raises("E9002", "replaced"):
            reader.refresh()


def test_refresh_of_an_unchanged_object_keeps_its_count(any_place, written):
    url = upload(written, any_place, "w.psk.d")
    with Reader(url) as reader:
        assert reader.refresh() == 50


def test_a_layout_file_beside_the_object(any_place, tmp_path):
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -3], np.int8)}
    (tmp_path / "src").mkdir()
    local = str(tmp_path / "src" / "p.psk.d")
    checkpoint.save(local, tree)
    url = upload(local, any_place, "p.psk.d")
    assert find_layout_file(url) is None  # nothing beside it yet
    upload(str(tmp_path / "src" / "p.layout.json"), any_place, "p.layout.json")
    found = find_layout_file(url)
    assert found is not None and len(found.layout.leaves) == 2
    with Reader(url, layout=found.layout) as reader:
        w, b = reader.gather_leaves([0])
        assert w[0].tolist() == tree["w"].tolist()
    with Reader(url, layout=tree) as reader:  # a template is checked against the layout object
        assert reader.count == 1
    with raises("E9005", "does not match its layout file"):
        Reader(url, layout={"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, np.int8)})


def test_without_the_client_an_object_url_names_itself_and_the_extra(monkeypatch, tmp_path):
    import sys

    from pskd_jax.corpus import CorpusWindows

    monkeypatch.setitem(sys.modules, "obstore", None)  # as if the extra were not installed
    monkeypatch.chdir(tmp_path)
    from pskd_jax.storage import StorageOptions

    fresh = StorageOptions(retries=1)  # (a store not made yet)
    with raises("E9018", "s3://some-bucket/x.psk.d: ", "pip install 'pskd_jax[storage]'"):
        Reader("s3://some-bucket/x.psk.d", storage=fresh)
    with raises("E9018", "gs://some-bucket/c/shards.json: ", "pip install"):
        CorpusWindows("gs://some-bucket/c/shards.json", seq=4, storage=fresh)
    assert os.listdir(tmp_path) == []
