"""CorpusWindows over a corpus in any place: a local directory, ``memory://`` and a bucket of the
loopback S3 server, read by byte ranges or from a local cache of whole shards. The same windows
everywhere; one batched call a shard a gather touches; the cache checked as it fills (a bad
shard named with its URL, nothing kept), bounded, least recently used removed, shared by
threads and processes; refresh against a bucket; verify over ranges."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax._os import names
from pskd_jax.corpus import BuildOptions
from pskd_jax.corpus.manifest import manifest_object, put_manifest
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.storage import StorageOptions, resolve
from tests.faultproxy import Rule, answer, cut, slow
from tests.helpers import ROOT, raises

from .helpers import make_inputs

SEQ = 8


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    return [str(p) for p in make_inputs(d)]


@pytest.fixture(scope="module")
def local(tmp_path_factory, inputs) -> str:
    d = tmp_path_factory.mktemp("local")
    corpus.build_corpus(inputs, d / "c", BuildOptions(durable=False))
    return str(d / "c" / "shards.json")


@pytest.fixture
def remote(any_place, inputs) -> str:
    """The same corpus built into the place; its manifest's URL (or path)."""
    place = any_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    return place + "/shards.json"


@pytest.fixture
def remote_object(object_place, inputs) -> str:
    """The same corpus built into an object store; its manifest's URL."""
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    return place + "/shards.json"


def batches(n: int, count: int = 5, size: int = 16):
    rng = np.random.default_rng(3)
    return [rng.integers(0, n, size) for _ in range(count)]


def same_windows(a: CorpusWindows, b: CorpusWindows) -> None:
    assert len(a) == len(b) and a.total_tokens == b.total_tokens
    for batch in [*batches(len(a)), np.arange(len(a))]:
        for got, want in zip(a.gather(batch), b.gather(batch)):
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(a.stream(0, a.total_tokens), b.stream(0, b.total_tokens))


def test_the_same_windows_in_every_place_by_ranges(remote, local):
    with CorpusWindows(remote, seq=SEQ, stride=3) as there, CorpusWindows(local, seq=SEQ, stride=3) as here:
        assert there.access == ("mmap" if "://" not in remote else "pread")
        same_windows(there, here)


def test_the_same_windows_from_a_cache(remote, local, tmp_path):
    cache = tmp_path / "cache"
    with CorpusWindows(remote, seq=SEQ, cache_dir=cache) as there, CorpusWindows(local, seq=SEQ) as here:
        same_windows(there, here)
        if "://" in remote:
            assert there.access == "mmap"
            held = sorted(os.listdir(cache))
            assert held == sorted(names.cached_shard(s.sha256) for s in there.manifest.shards)
        else:
            assert not cache.exists() or not os.listdir(cache)  # a local corpus is read in place


def test_a_gather_is_one_batched_call_a_shard(s3_bucket, inputs, monkeypatch):
    place = s3_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(place + "/shards.json", seq=SEQ) as windows:
        store = windows._store
        calls: list[tuple[str, int]] = []
        original = type(store).read_ranges

        def counted(self, key, starts, stops, **options):
            calls.append((key, len(starts)))
            return original(self, key, starts, stops, **options)

        monkeypatch.setattr(type(store), "read_ranges", counted)
        offsets = windows._state.offsets
        inside = [w for w in range(len(windows))
                  if np.searchsorted(offsets, w * SEQ, "right") == np.searchsorted(offsets, w * SEQ + SEQ, "right")]
        batch = np.array(inside[::3][:40])
        windows.gather(batch)
        keys = [key for key, _ in calls]
        assert len(keys) == len(set(keys))  # one call a shard touched
        shards = {int(np.searchsorted(offsets, w * SEQ, "right")) - 1 for w in batch}
        assert len(keys) == len(shards)
        calls.clear()
        windows.gather(np.arange(len(windows)))  # windows across shards too: still one call a shard
        keys = [key for key, _ in calls]
        assert len(keys) == len(set(keys)) == sum(1 for s in windows.manifest.shards if s.tokens)


def test_mmap_without_a_cache_refuses_a_store(remote_object):
    with raises("E9012", "access='mmap'", "cache_dir"):
        CorpusWindows(remote_object, seq=SEQ, access="mmap")


def test_verify_over_ranges_and_a_damaged_object(remote_object, tmp_path):
    with CorpusWindows(remote_object, seq=SEQ, verify=True) as windows:
        entry = windows.manifest.shards[2]
    store, where = resolve(remote_object)
    key = where.parent().child(entry.path).key
    data = bytearray(store.get(key)[0])
    data[-3] ^= 1
    store.put(key, bytes(data))
    with raises("E9017", f"shard 2 {entry.path}", "sha256"):
        CorpusWindows(remote_object, seq=SEQ, verify=True)
    with raises("E9017", f"shard 2 {entry.path}", "sha256"):
        corpus.verify_corpus(remote_object)
    cache = tmp_path / "cache"
    with CorpusWindows(remote_object, seq=SEQ, cache_dir=cache) as windows:  # nothing fetched yet
        start = int(windows._state.offsets[2])
        assert os.listdir(cache) == []
        windows.gather([0])  # shard 0 only
        with raises("E9017", f"shard 2 {entry.path}", where.parent().child(entry.path).url, "sha256",
                    "not kept in the cache"):
            windows.gather([start // SEQ + 1])  # the fill of shard 2, at the gather that needs it
        left = os.listdir(cache)
        assert names.cached_shard(entry.sha256) not in left
        assert left == [names.cached_shard(windows.manifest.shards[0].sha256)]  # no temporary file left behind


def test_a_cached_shard_is_not_fetched_again(s3_bucket, inputs, tmp_path, monkeypatch):
    place = s3_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache = tmp_path / "cache"
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as windows:
        windows.gather(np.arange(len(windows)))
    store, _ = resolve(place)
    fetched = []
    original = type(store).chunks
    monkeypatch.setattr(type(store), "chunks", lambda self, key, *a: (fetched.append(key), original(self, key, *a))[1])
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as windows:
        windows.gather(np.arange(len(windows)))
        assert len(windows) and fetched == []
    victim = cache / os.listdir(cache)[0]
    victim.write_bytes(b"short")  # a file of the wrong size there: fetched again, whole
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as windows:
        windows.gather(np.arange(len(windows)))
        assert len(fetched) == 1 and victim.stat().st_size > 5


def shard_sizes(windows: CorpusWindows) -> list[int]:
    return [s.bytes.size() for s in windows._state.shards]


def shard_of(windows: CorpusWindows, k: int) -> int:
    """A window inside shard k."""
    offsets = windows._state.offsets
    return -(-int(offsets[k]) // SEQ)


def cached(cache) -> list[str]:
    return sorted(n for n in os.listdir(cache) if names.cached_shard_sha256(n))


def test_a_corpus_larger_than_the_cache_gives_the_same_windows(object_place, inputs, local, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(local, seq=SEQ) as here:
        with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
            sizes = shard_sizes(w)
        assert len(sizes) >= 4 and len(set(sizes)) > 1
        below = sorted(sizes)[1]  # fewer bytes than most shards: those are read by ranges
        for bound in (min(sizes) - 1, below, sum(sizes) - min(sizes), sum(sizes) // 2):
            cache = tmp_path / f"cache-{bound}"
            for access in ("mmap", "pread"):
                with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache, cache_bytes=bound,
                                   access=access) as there:
                    same_windows(there, here)
                    assert sum((cache / n).stat().st_size for n in cached(cache)) <= bound
                    held = there._copies.held()
                    assert sum(c.size for c in held.values()) <= bound
                    assert all(size <= bound for size, s in zip(sizes, there.manifest.shards) if s.sha256 in held)
            if bound < min(sizes):
                assert cached(cache) == []  # no shard fits: every one read by ranges


def test_the_cache_is_bounded_least_recently_used_first(object_place, inputs, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache = tmp_path / "cache"
    with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
        sizes = shard_sizes(w)
        shas = [s.sha256 for s in w.manifest.shards]
    bound = sizes[0] + sizes[1] + sizes[2] - 1  # room for two of shards 0, 1, 2, never three
    assert bound >= max(sizes[:4])
    os.makedirs(cache)
    (cache / "notes.txt").write_text("mine")  # not the cache's: never removed
    (cache / (names.cached_shard(shas[3]) + ".bak")).write_text("mine too")
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache, cache_bytes=bound) as windows:
        for k in (0, 1):
            windows.gather([shard_of(windows, k)])
        assert cached(cache) == sorted(names.cached_shard(shas[k]) for k in (0, 1))
        windows.gather([shard_of(windows, 0)])  # shard 0 used again: shard 1 is the least recently used
        windows.gather([shard_of(windows, 2)])
        assert cached(cache) == sorted(names.cached_shard(shas[k]) for k in (0, 2))
        windows.gather([shard_of(windows, 1)])  # shard 0 is the least recently used now
        assert cached(cache) == sorted(names.cached_shard(shas[k]) for k in (1, 2))
    assert (cache / "notes.txt").read_text() == "mine"
    assert (cache / (names.cached_shard(shas[3]) + ".bak")).read_text() == "mine too"


def test_a_batch_needing_more_shards_than_fit(object_place, inputs, local, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache = tmp_path / "cache"
    with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
        sizes = shard_sizes(w)
    bound = max(sizes) + min(sizes)  # one or two shards, never all
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache, cache_bytes=bound) as there, \
            CorpusWindows(local, seq=SEQ) as here:
        everything = np.arange(len(there))
        for got, want in zip(there.gather(everything), here.gather(everything)):
            np.testing.assert_array_equal(got, want)
        assert 1 <= len(cached(cache)) < len(sizes)
        assert sum((cache / n).stat().st_size for n in cached(cache)) <= bound


def test_two_windows_share_one_cache_directory(object_place, inputs, local, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache = tmp_path / "cache"
    with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
        sizes = shard_sizes(w)
    bound = sum(sorted(sizes)[-2:])  # two shards at most: each evicts what the other holds
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache, cache_bytes=bound) as a, \
            CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache, cache_bytes=bound) as b, \
            CorpusWindows(local, seq=SEQ) as here:
        rng = np.random.default_rng(5)
        for _ in range(12):
            batch = rng.integers(0, len(here), 4)
            want = here.gather(batch)
            for one in (a, b):
                for got, expected in zip(one.gather(batch), want):
                    np.testing.assert_array_equal(got, expected)
        # A file the other evicted while this one was about to open it: fetched again.
        for n in cached(cache):
            os.unlink(cache / n)
        a._copies.close()  # (nothing held: the next gather opens the cache's files anew)
        for got, expected in zip(a.gather(np.arange(len(a))), here.gather(np.arange(len(here)))):
            np.testing.assert_array_equal(got, expected)
    assert all(names.cached_shard_sha256(n) for n in os.listdir(cache))  # no temporary file left


def test_the_shards_a_gather_needs_are_fetched_together(s3_bucket, inputs, tmp_path, monkeypatch):
    place = s3_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    store, _ = resolve(place)
    threads: dict[str, str] = {}
    original = type(store).chunks

    def watched(self, key, *a):
        threads[key] = threading.current_thread().name
        return original(self, key, *a)

    monkeypatch.setattr(type(store), "chunks", watched)
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=tmp_path / "cache") as windows:
        assert threads == {}  # nothing fetched when the windows open
        windows.gather(np.arange(len(windows)))
        assert len(threads) == sum(1 for s in windows.manifest.shards if s.tokens) >= 4
        assert len(set(threads.values())) > 1 and all(n.startswith("pskd-fill") for n in threads.values())
        threads.clear()
        windows.gather(np.arange(len(windows)))
        assert threads == {}


def test_threads_gather_from_one_windows_with_a_small_cache(object_place, inputs, local, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
        bound = sum(sorted(shard_sizes(w))[-2:])
    errors: list[BaseException] = []
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=tmp_path / "cache", cache_bytes=bound) as there, \
            CorpusWindows(local, seq=SEQ) as here:

        def one(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                for _ in range(10):
                    batch = rng.integers(0, len(here), 3)
                    for got, want in zip(there.gather(batch), here.gather(batch)):
                        np.testing.assert_array_equal(got, want)
            except BaseException as e:  # (reported below)
                errors.append(e)

        workers = [threading.Thread(target=one, args=(seed,)) for seed in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert errors == []
        assert sum(c.size for c in there._copies.held().values()) <= bound


def test_threads_share_a_cache(s3_bucket, inputs, local, tmp_path):
    place = s3_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache, errors = tmp_path / "cache", []

    def one():
        try:
            with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as w, \
                    CorpusWindows(local, seq=SEQ) as here:
                same_windows(w, here)
        except Exception as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_processes_share_a_cache(s3_bucket, inputs, local, tmp_path):
    place = s3_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(place + "/shards.json", seq=SEQ) as w:
        bound = sum(sorted(shard_sizes(w))[-2:])  # two shards: the processes remove each other's
    script = textwrap.dedent(f"""
        import numpy as np
        from pskd_jax.corpus import CorpusWindows
        with CorpusWindows({place + '/shards.json'!r}, seq={SEQ}, cache_dir={str(tmp_path / 'cache')!r},
                           cache_bytes={bound}) as w:
            here = CorpusWindows({local!r}, seq={SEQ})
            rng = np.random.default_rng()
            for _ in range(20):  # random batches: shards fetched, let go and removed again and again
                batch = rng.permutation(len(w))[:8]
                for got, want in zip(w.gather(batch), here.gather(batch)):
                    assert np.array_equal(got, want), batch
            print(int(w.gather(np.arange(len(w)))[0].astype(np.int64).sum()))
    """)
    processes = [subprocess.Popen([sys.executable, "-c", script], env=s3_bucket.env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    with CorpusWindows(local, seq=SEQ) as here:
        expected = int(here.gather(np.arange(len(here)))[0].astype(np.int64).sum())
    assert {out.strip() for out, _ in outputs} == {str(expected)}


def test_refresh_against_a_bucket(remote_object, tmp_path):
    store, where = resolve(remote_object)
    full, _ = manifest_object(store, where.key)
    put_manifest(store, where.key, full.tokenizer, full.shards[:2], full.build)
    for cache in (None, tmp_path / "cache"):
        with CorpusWindows(remote_object, seq=SEQ, cache_dir=cache) as windows:
            before = windows.total_tokens
            assert windows.refresh() is False
            put_manifest(store, where.key, full.tokenizer, full.shards, full.build)
            assert windows.refresh() is True
            assert windows.total_tokens == full.tokens > before
            put_manifest(store, where.key, full.tokenizer, full.shards[:2], full.build)


def test_refresh_with_a_cache_fetches_only_what_is_read(remote_object, local, tmp_path):
    store, where = resolve(remote_object)
    full, _ = manifest_object(store, where.key)
    put_manifest(store, where.key, full.tokenizer, full.shards[:2], full.build)
    cache = tmp_path / "cache"
    with CorpusWindows(remote_object, seq=SEQ, cache_dir=cache, cache_bytes=sum(
            len(full.tokenizer.header(0)) + s.tokens * 2 for s in full.shards[:3])) as windows, \
            CorpusWindows(local, seq=SEQ) as here:
        windows.gather([0])
        put_manifest(store, where.key, full.tokenizer, full.shards, full.build)
        assert windows.refresh() is True
        assert cached(cache) == [names.cached_shard(full.shards[0].sha256)]  # the new shards not fetched
        same_windows(windows, here)  # more than the cache holds: the rest by ranges
        assert len(cached(cache)) < len(full.shards)


def test_an_object_replaced_under_ranged_reads_is_e9017(object_place, inputs, tmp_path):
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    store, where = resolve(place + "/shards.json")
    for cache_bytes in (None, 1):  # by ranges; with a cache too small for any shard
        with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=None if cache_bytes is None else tmp_path,
                           cache_bytes=cache_bytes or 1) as windows:
            entry = windows.manifest.shards[1]
            key = where.parent().child(entry.path).key
            window = shard_of(windows, 1)
            before = windows[window]
            data = bytearray(store.get(key)[0])
            data[-1] ^= 1  # another version, of the same size
            store.put(key, bytes(data))
            with raises("E9017", f"{place}/{entry.path}", "replaced since it was opened"):
                windows.gather([window])
            with raises("E9017", f"{place}/{entry.path}", "replaced since it was opened"):
                windows.stream(0, windows.total_tokens)
            np.testing.assert_array_equal(windows[0][0], windows.gather([0])[0][0])  # shard 0 unchanged
            data[-1] ^= 1
            store.put(key, bytes(data))  # (as it was, for the next round)
        assert len(before[0]) == SEQ


def test_windows_of_a_store_pickle_and_reopen(tmp_path, inputs):
    place = "memory://pickled-windows/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    for cache in (None, str(tmp_path / "cache")):
        with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as windows:
            again = pickle.loads(pickle.dumps(windows))
            assert repr(again) == repr(windows)
            np.testing.assert_array_equal(again.gather([0, 3])[0], windows.gather([0, 3])[0])
            assert (again.cache is None) == (cache is None)


def test_a_missing_manifest_or_shard_object_is_named(object_place, inputs):
    with raises("E9016", f"{object_place}/none/shards.json", "no such object"):
        CorpusWindows(f"{object_place}/none/shards.json", seq=SEQ)
    place = object_place + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    store, where = resolve(place + "/shards.json")
    manifest, _ = manifest_object(store, where.key)
    store.delete(where.parent().child(manifest.shards[1].path).key)
    with raises("E9017", f"shard 1 {manifest.shards[1].path}", "missing"):
        CorpusWindows(place + "/shards.json", seq=SEQ)
    with raises("E9017", f"shard 1 {manifest.shards[1].path}", "missing"):
        corpus.verify_corpus(place + "/shards.json")


# -- faults between the windows and the store ---------------------------------------------------------

FAULTS = {"503": answer(503), "reset mid-body": cut(reset=True), "slow": slow(pause=0.01)}
QUICK = StorageOptions(retries=2, backoff_seconds=0.001)


@pytest.mark.parametrize("fault", FAULTS.values(), ids=FAULTS.keys())
def test_a_transient_fault_under_a_gather_or_a_fill_is_invisible(faulty_bucket, fault_proxy, inputs, local,
                                                                tmp_path, fault):
    place = faulty_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(local, seq=SEQ) as here:
        for cache in (None, tmp_path / "cache"):
            # (at most as many faults as a request's retries: one request meeting them all succeeds)
            fault_proxy.plan(Rule(fault, method="GET", path=r"shard-0000[0-9]\.psk\.d", ranged=None,
                                  times=QUICK.retries))
            with CorpusWindows(place + "/shards.json", seq=SEQ, storage=QUICK, cache_dir=cache) as there:
                same_windows(there, here)
            assert fault_proxy.faults_done() >= 1


def test_a_fault_that_persists_is_e9018_naming_the_shard_object(faulty_bucket, fault_proxy, inputs, tmp_path):
    place = faulty_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    with CorpusWindows(place + "/shards.json", seq=SEQ, storage=QUICK) as windows:
        fault_proxy.plan(Rule(answer(503), method="GET", path=r"shard-00001\.psk\.d", ranged=True, times=None))
        start = int(windows._state.offsets[1])
        with raises("E9018", f"{place}/shard-00001.psk.d", "503"):
            windows.gather([start // SEQ + 1])
        assert len(windows.gather([0])[0]) == 1  # the other shards still read
    fault_proxy.plan(Rule(answer(503), method="GET", path=r"shard-00002\.psk\.d", ranged=False, times=None))
    cache = tmp_path / "cache"
    with CorpusWindows(place + "/shards.json", seq=SEQ, storage=QUICK, cache_dir=cache) as windows:
        with raises("E9018", f"{place}/shard-00002.psk.d"):
            windows.gather([shard_of(windows, 2)])
    assert all(names.cached_shard_sha256(n) for n in os.listdir(cache))  # nothing partial left


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_fill_killed_midway_leaves_no_shard_and_the_next_open_completes(faulty_bucket, fault_proxy, inputs,
                                                                          local, tmp_path):
    import signal

    from tests.helpers import wait_until

    place = faulty_bucket.url + "/c"
    corpus.build_corpus(inputs, place, BuildOptions(durable=False))
    cache = tmp_path / "cache"
    # Whole-shard GETs trickle in: the process is killed while a fill is being written.
    fault_proxy.plan(Rule(slow(pause=0.5, pieces=40), method="GET", path=r"shard-0000[0-9]\.psk\.d", ranged=False,
                          times=None))
    script = (f"from pskd_jax.corpus import CorpusWindows\n"
              f"w = CorpusWindows({place + '/shards.json'!r}, seq={SEQ}, cache_dir={str(cache)!r})\n"
              f"w.gather(range(len(w)))\n")
    process = subprocess.Popen([sys.executable, "-c", script], env=faulty_bucket.env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: cache.exists() and any(n.endswith(".tmp") for n in os.listdir(cache)), alive=process,
                   what="a fill began")
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert [n for n in os.listdir(cache) if names.cached_shard_sha256(n)] == []  # no shard, whole or part
    left = [n for n in os.listdir(cache) if n.endswith(".tmp")]
    assert left
    fresh = cache / "notes.tmp"  # not a fill's name: never removed
    fresh.write_text("mine")
    fault_proxy.plan()
    with CorpusWindows(place + "/shards.json", seq=SEQ, cache_dir=cache) as there, \
            CorpusWindows(local, seq=SEQ) as here:
        same_windows(there, here)
    assert [n for n in os.listdir(cache) if not names.cached_shard_sha256(n)] == ["notes.tmp"]  # the dead fills' gone
