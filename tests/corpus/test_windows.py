"""Windows over a corpus's global token stream (pskd_jax.corpus.windows): equal to lm windows of the
concatenated shards, bounds, pickling, and through the pipeline and loader."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.data.windows import lm_windows_file
from pskd_jax.errors import IndexOutOfRangeError, IndexTypeError, PskdError

from .helpers import write_corpus

PIECES = [[5, 6, 7], [], [8], list(range(20, 60)), [9, 10], list(range(100, 131))]


@pytest.mark.parametrize("access", ["mmap", "pread"])
@pytest.mark.parametrize("seq,stride", [(4, 4), (4, 1), (3, 2), (8, 5), (1, 1), (30, 7), (76, 1), (10, 200)])
def test_windows_equal_lm_windows_of_the_concatenation(tmp_path, seq, stride, access):
    path = write_corpus(tmp_path / "c", [np.array(p) for p in PIECES])
    stream = np.concatenate([np.array(p, np.uint16) for p in PIECES])
    tokens_text = tmp_path / "tokens.txt"
    tokens_text.write_text(" ".join(map(str, stream.tolist())) + "\n")
    result = lm_windows_file(str(tokens_text), str(tmp_path / "w.psk.d"), vocab=257, seq=seq, stride=stride)
    with CorpusWindows(path, seq=seq, stride=stride, access=access) as windows, \
            pskd_jax.Reader(tmp_path / "w.psk.d") as reader:
        assert len(windows) == len(reader) == result.windows
        assert windows.type_text == reader.header.type_text
        if not len(windows):
            return
        order = np.random.default_rng(seq).permutation(len(windows))
        for idx in (np.arange(len(windows)), order, order[:3], np.array([-1, 0, -len(windows)])):
            inputs, targets = windows.gather(idx)
            want_in, want_tg = reader.gather(idx)
            assert inputs.dtype == want_in.dtype and inputs.flags.c_contiguous and targets.flags.c_contiguous
            np.testing.assert_array_equal(inputs, want_in)
            np.testing.assert_array_equal(targets, want_tg)
        i, t = windows[len(windows) - 1]
        np.testing.assert_array_equal(i, reader[len(windows) - 1][0])
        np.testing.assert_array_equal(windows.stream(0, windows.total_tokens), stream)
        assert windows.gather(np.array([], np.int64))[0].shape == (0, seq)


def test_windows_refuse_bad_indices(tmp_path):
    with CorpusWindows(write_corpus(tmp_path / "c", [np.arange(10)]), seq=4) as w:
        assert len(w) == 2
        for past in (lambda: w.gather([0, 2]), lambda: w[2], lambda: w[-3], lambda: w.__getitems__([1, 5])):
            with pytest.raises(IndexOutOfRangeError, match="E9003.*window (2|-3|5) is beyond the 2 windows"):
                past()
        for wrong in (lambda: w.gather(np.zeros((2, 2), np.int64)), lambda: w.gather([0.5]), lambda: w[1.5],
                      lambda: w["1"], lambda: w[True], lambda: w.gather([True])):
            with pytest.raises(IndexTypeError, match="E9012.*integer"):
                wrong()
        with pytest.raises(PskdError, match="E9012.*seq=0: expected an integer from 1 to"):
            CorpusWindows(w.path, seq=0)
        with pytest.raises(PskdError, match="E9012.*stride=2.5"):
            CorpusWindows(w.path, seq=2, stride=2.5)
        np.testing.assert_array_equal(w[np.int64(1)][1], np.arange(5, 9))
        np.testing.assert_array_equal(w[np.uint8(1)][0], np.arange(4, 8))
    assert len(w) == 2
    for closed in (lambda: w.gather([0]), lambda: w[0], lambda: list(w)):
        with pytest.raises(PskdError, match="E9012.*closed"):
            closed()


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_windows_longer_than_any_corpus(tmp_path, access):
    """A seq or stride past int64 is E9012; a seq longer than the stream (any up to 2**63 - 1) gives
    no windows, where it was a ValueError from numpy (a record of more bytes than numpy's largest)."""
    path = write_corpus(tmp_path / "c", [np.arange(10)])
    for seq, stride in ((2**63, None), (2**70, None), (2, 2**63), (2, 2**64)):
        with pytest.raises(PskdError, match=r"E9012.*(seq|stride)=\d+: expected an integer from 1 to \d+"):
            CorpusWindows(path, seq=seq, stride=stride, access=access)
    for seq in (11, 2**31, 2**40, 2**63 - 1):
        with CorpusWindows(path, seq=seq, access=access) as w:
            assert len(w) == 0 and list(w) == []
    with CorpusWindows(path, seq=2, stride=2**63 - 1, access=access) as w:
        assert len(w) == 1
        np.testing.assert_array_equal(w[0][1], [1, 2])


def test_windows_refuse_arguments_of_a_wrong_type(tmp_path):
    """verify='no' verified (a truthy string), verify=None did not, tokenizer=123 and cache_dir=5
    were TypeErrors: each is E9012 naming the argument."""
    path = write_corpus(tmp_path / "c", [np.arange(10)])
    for kwargs, what in ((dict(verify="no"), "verify is True or False, got 'no'"),
                         (dict(verify=None), "verify is True or False, got None"),
                         (dict(tokenizer=123), "tokenizer=123: expected a Tokenizer"),
                         (dict(cache_dir=5), "cache_dir is a directory's path, or None, got 5")):
        with pytest.raises(PskdError, match=f"E9012: .*{what}"):
            CorpusWindows(path, seq=2, **kwargs)
    with pytest.raises(PskdError, match="E9012: tokenizer=5: expected a Tokenizer"):
        corpus.verify_corpus(path, tokenizer=5)
    with CorpusWindows(path, seq=2, verify=np.True_) as w:
        with pytest.raises(PskdError, match="E9012: .*verify is True or False, got 'no'"):
            w.refresh(verify="no")
        assert w.refresh(verify=True) is False


def test_windows_keep_pythons_sequence_protocol_as_a_reader_does(tmp_path):
    """Iteration stops, negative indices count from the end in both, the same errors for the same
    indices, and numpy stacks a list of windows."""
    path = write_corpus(tmp_path / "c", [np.arange(40) % 257, np.arange(7) % 257, np.arange(30) % 257])
    stream = np.concatenate([np.arange(40), np.arange(7), np.arange(30)]).astype(np.uint16)
    tokens_text = tmp_path / "tokens.txt"
    tokens_text.write_text(" ".join(map(str, stream.tolist())) + "\n")
    lm_windows_file(str(tokens_text), str(tmp_path / "w.psk.d"), vocab=257, seq=6, stride=5)
    with CorpusWindows(path, seq=6, stride=5) as windows, pskd_jax.Reader(tmp_path / "w.psk.d") as reader:
        n = len(windows)
        assert n == len(reader) and n > 2
        got = list(windows)
        assert len(got) == n and len([w for w in windows]) == n  # noqa: C416  # (the plain loop is what is tested)
        for k, (inputs, targets) in enumerate(got):
            np.testing.assert_array_equal(inputs, stream[5 * k : 5 * k + 6])
            np.testing.assert_array_equal(targets, stream[5 * k + 1 : 5 * k + 7])
        stacked = np.asarray(got)
        assert stacked.shape == (n, 2, 6) and stacked.dtype == np.uint16
        np.testing.assert_array_equal(stacked[:, 0], windows.gather(np.arange(n))[0])
        for index in (-1, -n, 0, n - 1):
            for a, b in zip(windows[index], reader[index]):
                np.testing.assert_array_equal(a, b)
        for index in (n, -n - 1, 2**63, -2**70):
            for source in (windows, reader):
                with pytest.raises(IndexError) as caught:
                    source[index]
                assert caught.value.code == "E9003"
        for index in (1.0, "0", None, False):
            for source in (windows, reader):
                with pytest.raises(TypeError) as caught:
                    source[index]
                assert caught.value.code == "E9012"


def test_windows_pickle_and_verify(tmp_path):
    path = write_corpus(tmp_path / "c", [np.arange(50), np.arange(30)])
    w = CorpusWindows(path, seq=6, stride=5, verify=True)
    copy = pickle.loads(pickle.dumps(w))
    pread_copy = pickle.loads(pickle.dumps(CorpusWindows(path, seq=6, stride=5, access="pread")))
    assert pread_copy.access == "pread"
    for a, b in zip(w.gather(np.arange(len(w))), pread_copy.gather(np.arange(len(w)))):
        np.testing.assert_array_equal(a, b)
    pread_copy.close()
    with pytest.raises(PskdError, match="E9012.*access is one of mmap, pread"):
        CorpusWindows(path, seq=6, access="read")
    for a, b in zip(w.gather(np.arange(len(w))), copy.gather(np.arange(len(w)))):
        np.testing.assert_array_equal(a, b)
    copy.close()
    shard = tmp_path / "c" / "s1.psk.d"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + b"\x09")
    CorpusWindows(path, seq=6)  # the size and count match: only hashing finds it
    with pytest.raises(PskdError, match="E9017.*s1.psk.d: sha256"):
        CorpusWindows(path, seq=6, verify=True)
    with pytest.raises(PskdError, match="E9017: .*manifest changed"):
        write_corpus(tmp_path / "c", [np.arange(51), np.arange(30)])
        pickle.loads(pickle.dumps(w))


def test_windows_through_the_pipeline_and_loader(tmp_path):
    jax = pytest.importorskip("jax")
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline.batches import IteratorState, Pipeline

    path = write_corpus(tmp_path / "c", [np.arange(250) % 257, np.arange(123) % 257, np.arange(301) % 257])
    windows = CorpusWindows(path, seq=16, stride=9)
    pipeline = Pipeline(str(path), seed=3, batch_size=8)
    pipeline.check_batch_type(windows.type_text, "(idx[257][B, seq: 16], idx[257][B, seq: 16])")
    expected = [windows.gather(idx) for _, idx in pipeline.iter_batches(len(windows), epochs=2)]
    got = []
    with Loader(windows, pipeline, epochs=2) as loader:
        for inputs, targets in loader:
            assert isinstance(inputs, jax.Array)
            got.append((np.asarray(inputs), np.asarray(targets)))
    assert len(got) == len(expected) == 2 * (len(windows) // 8)
    for (a, b), (c, d) in zip(got, expected):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    resumed = Loader(windows, pipeline, state=IteratorState(2, 1), epochs=2)
    np.testing.assert_array_equal(np.asarray(next(iter(resumed))[0]), expected[len(expected) // 2 + 1][0])
    resumed.close()


@pytest.mark.subprocess
def test_mapped_shards_keep_descriptors_within_half_the_limit_so_any_number_opens(tmp_path):
    """With access="mmap" (the default) a shard keeps its descriptor only while the process keeps
    fewer than half its limit for maps (the rest hold their map alone): a corpus of more shards
    than the process may open files opens, verifies, serves every window and refreshes in a
    process whose limit is set low, holding 32 more descriptors (half of 64) while open and none
    once closed."""
    from tests.helpers import run_python

    pieces = [(np.arange(10 + i % 7, dtype=np.uint16) + i) % 200 for i in range(150)]
    manifest = write_corpus(tmp_path / "c", pieces)
    result = run_python("""
        import os, resource, sys
        import numpy as np
        from pskd_jax.corpus import CorpusWindows
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        before = len(os.listdir("/proc/self/fd"))
        windows = CorpusWindows(sys.argv[1], seq=4, verify=True, workers=4)
        inputs, targets = windows.gather(np.arange(len(windows)))
        assert windows.refresh(verify=True) is False
        held = len(os.listdir("/proc/self/fd")) - before
        windows.close()
        print(held, len(os.listdir("/proc/self/fd")) - before, len(windows))
        np.save(sys.argv[2], np.concatenate([inputs, targets[:, -1:]], axis=1))
    """, manifest, tmp_path / "got.npy")
    assert result.returncode == 0, result.stderr[-2000:]
    stream = np.concatenate(pieces)
    count = (len(stream) - 1) // 4
    assert result.stdout.split() == ["32", "0", str(count)]
    want = np.stack([stream[4 * w : 4 * w + 5] for w in range(count)])
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), want)


@pytest.mark.subprocess
@pytest.mark.parametrize("access", ["pread"])
def test_a_corpus_of_more_shards_than_descriptors_left_says_to_raise_the_limit(tmp_path, access):
    """A process that runs out of file descriptors opening a corpus's shards (with access="pread"
    each holds one) is told so (EMFILE is the process's limit, not a shard's fault), with the
    limit and what to do, in a process whose limit is set low."""
    from tests.helpers import run_python

    manifest = write_corpus(tmp_path / "c", [np.arange(10, dtype=np.uint16) % 200 for _ in range(150)])
    result = run_python("""
        import resource, sys
        from pskd_jax.corpus import CorpusWindows
        from pskd_jax.errors import PskdError
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        try:
            CorpusWindows(sys.argv[1], seq=4, access=sys.argv[2])
        except PskdError as e:
            print(e.code, e.message)
    """, manifest, access)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("E9017 "), result.stdout
    assert "the process has no file descriptor left, its limit (64 here) reached" in result.stdout
    assert "raise the limit (ulimit -n)" in result.stdout


@pytest.mark.parametrize("kept", [True, False])
def test_a_mapped_shard_renamed_over_keeps_serving_its_mapped_bytes(tmp_path, monkeypatch, kept):
    """A mapped shard, with its descriptor or without one (beyond the process's budget): its path
    renamed over by a shorter file (no longer the file mapped: another inode) is not taken for
    the mapped file cut short: the windows serve the bytes they mapped, and a refresh-free gather
    and stream see the corpus they opened."""
    from pskd_jax._os import maps
    if not kept:
        monkeypatch.setattr(maps.KEPT_DESCRIPTORS, "_limit", lambda: 0)
    pieces = [np.arange(40, dtype=np.uint16) % 200, np.arange(30, dtype=np.uint16) % 100]
    manifest = write_corpus(tmp_path / "c", pieces)
    with CorpusWindows(manifest, seq=4) as windows:
        before = windows.gather(np.arange(len(windows)))
        other = tmp_path / "c" / "other.psk.d"
        other.write_bytes((tmp_path / "c" / "s0.psk.d").read_bytes()[:20])
        os.replace(other, tmp_path / "c" / "s0.psk.d")
        after = windows.gather(np.arange(len(windows)))
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
        np.testing.assert_array_equal(windows.stream(0, 70), np.concatenate(pieces))
