"""Packed segments (pskd_jax.corpus.segments, ``CorpusWindows(…, segments=True)``): segment ids and
positions equal a plain loop's over every token, for any windows, through gather, indexing,
pickling and grain; each test of the module once with the compiled scan (``_segments.c``; in
each width of vectors it scans in here) and once with numpy's."""

from __future__ import annotations

import pickle
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.corpus import segments
from pskd_jax.corpus.segments import segment_dtype, segment_ids_and_positions
from pskd_jax.corpus.windows import CorpusWindows

from .helpers import write_corpus

BOUNDARY = 256  # the bytes tokenizer's
COMPILED = segments._native  # (None where the package was built without a C compiler)


# The scans to test: numpy's always, the compiled one wherever the install built it (wherever a
# C compiler is: test_segments_compiled.py requires that), and where it scans in 32-byte vectors
# (AVX2) its 16-byte form too.
SCANS = {"numpy": None}
if COMPILED is not None:
    SCANS["compiled"] = COMPILED
    if COMPILED.VECTOR_BYTES == 32:
        SCANS["compiled, 16-byte vectors"] = types.SimpleNamespace(fill=lambda *args: COMPILED.fill(*args, 16),
                                                                   gather=lambda *args: COMPILED.gather(*args, 16))


@pytest.fixture(scope="module", autouse=True, params=list(SCANS))
def implementation(request):
    """Every test of the module with each implementation of the scan (module-scoped, so that
    hypothesis's tests take it too)."""
    segments._native = SCANS[request.param]
    yield request.param
    segments._native = COMPILED


def reference(inputs: np.ndarray, boundary: int) -> tuple[np.ndarray, np.ndarray]:
    """The definition (docs/training.md, packed segments) token by token: ids from 1 at the
    window's first token, one more on the token after each boundary; positions from 0 at each
    segment's first token."""
    ids = np.zeros(inputs.shape, np.int64)
    positions = np.zeros(inputs.shape, np.int64)
    for r, row in enumerate(inputs.tolist()):
        segment, position = 1, 0
        for t in range(len(row)):
            if t and row[t - 1] == boundary:
                segment, position = segment + 1, 0
            ids[r, t], positions[r, t] = segment, position
            position += 1
    return ids, positions


def assert_reference(inputs: np.ndarray, boundary: int) -> None:
    ids, positions = segment_ids_and_positions(inputs, boundary)
    want_ids, want_positions = reference(inputs, boundary)
    assert ids.dtype == positions.dtype == segment_dtype(inputs.shape[1])
    assert ids.shape == positions.shape == inputs.shape
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(positions, want_positions)


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(0, 6), seq=st.integers(1, 40), density=st.sampled_from([0.0, 0.02, 0.2, 0.7, 1.0]),
       seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from([np.uint8, np.uint16, np.uint32]))
def test_segments_equal_a_plain_loop(rows, seq, density, seed, dtype):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, 200, (rows, seq)).astype(dtype)
    boundary = 250
    inputs[rng.random((rows, seq)) < density] = boundary
    assert_reference(inputs, boundary)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 4), seq=st.integers(1, 200), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.uint8, np.uint16, np.uint32]),
       places=st.lists(st.integers(0, 799), max_size=40))
def test_segments_with_boundaries_at_any_place_of_the_scans_blocks(rows, seq, seed, dtype, places):
    """Boundaries where the compiled scan's blocks of 32 tokens begin and end, in runs, in every
    lane; windows of any length (whole blocks and a rest)."""
    inputs = np.random.default_rng(seed).integers(0, 200, (rows, seq)).astype(dtype)
    flat = inputs.reshape(-1)
    flat[[p for p in places if p < flat.size]] = 250
    assert_reference(inputs, 250)


@pytest.mark.parametrize("places", [[], [4095], [4094, 4095, 4096], [0, 4096, 8191, 8192], [8194],
                                    list(range(4090, 4100))])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_segments_across_the_compiled_scans_chunks(places, dtype):
    """Windows longer than the chunk the compiled scan reads before it writes (4096 tokens):
    a segment that runs on from one chunk into the next, and boundaries at a chunk's edges."""
    inputs = np.random.default_rng(len(places)).integers(0, 200, (2, 2 * 4096 + 3)).astype(dtype)
    inputs[:, places] = 250
    assert_reference(inputs, 250)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 4), seq=st.integers(1, 100), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.uint8, np.uint16, np.uint32, np.int16, np.uint64]),
       bound=st.one_of(st.none(), st.integers(0, 300)), places=st.lists(st.integers(0, 399), max_size=3))
def test_segments_below_answers_whether_every_token_is_below_the_bound(rows, seq, seed, dtype, bound, places):
    """A gather's segments and its check of the tokens against the vocabulary size, in one call:
    the same segments, and True exactly when every token is below the bound (or none is asked);
    tokens at the bound or just below it put anywhere (in the compiled scan's vectors and in a
    window's last tokens)."""
    inputs = np.random.default_rng(seed).integers(0, 200, (rows, seq)).astype(dtype)
    inputs[:, ::7] = 250
    for place in places:
        if place < inputs.size and bound is not None:
            inputs.flat[place] = min(max(bound - place % 2, 0), np.iinfo(dtype).max)
    ids, positions, below = segments.segments_below(inputs, 250, bound)
    want_ids, want_positions = segment_ids_and_positions(inputs, 250)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(positions, want_positions)
    assert below is (bound is None or inputs.size == 0 or bool(inputs.max() < bound))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("bound", [-1, -(2**70), 2**64 - 1, 2**64, 2**70])
def test_segments_below_a_bound_beyond_what_the_scan_takes(dtype, bound):
    """A bound past [0, 2**64) is answered as numpy answers it (above every token, or above none),
    by the compiled scan too, whose argument it does not fit (found by fuzz/targets.py's segments
    target: the scan's OverflowError)."""
    inputs = np.array([[1, 5, 0, np.iinfo(dtype).max], [5, 5, 2, 3]], dtype=dtype)
    ids, positions, below = segments.segments_below(inputs, 5, bound)
    want_ids, want_positions = segment_ids_and_positions(inputs, 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(positions, want_positions)
    assert below is (bound > 0)


@pytest.mark.parametrize("shape", [(3, 0), (0, 0), (0, 5)])
def test_segments_below_of_an_empty_batch(shape):
    """Windows of no token (T = 0), or no window: empty outputs, every token below the bound, by
    the compiled scan too, which refused T = 0 with ValueError (found by the segments fuzz target)."""
    inputs = np.zeros(shape, np.uint16)
    ids, positions, below = segments.segments_below(inputs, 1, 5)
    assert ids.shape == positions.shape == shape and ids.dtype == positions.dtype == segment_dtype(shape[1])
    assert below is True


def test_segments_of_other_token_dtypes_and_boundaries_no_token_can_be():
    """Signed tokens, 8-byte tokens and a boundary outside the tokens' range: the same
    definition (numpy computes those; the compiled scan takes a corpus's dtypes only)."""
    tokens = np.array([[5, 9, 6, 7, 9, 1], [9, 9, 1, 2, 3, 4]])
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint64):
        assert_reference(tokens.astype(dtype), 9)
    assert_reference(np.array([[1, 2, 3, 0]], np.uint8), 256)  # (no uint8 token is 256)
    assert_reference(np.array([[1, 65535, 3]], np.uint16), 1 << 16)
    ids, positions = segment_ids_and_positions(np.array([[5, 9, 6]], np.uint16), np.uint16(9))
    assert ids.tolist() == [[1, 1, 2]] and positions.tolist() == [[0, 1, 0]]


def test_segments_of_edge_cases():
    assert_reference(np.full((3, 1), 9, np.uint16), 9)  # T = 1: every id 1, every position 0
    assert_reference(np.full((2, 7), 9, np.uint16), 9)  # every token a boundary
    assert_reference(np.zeros((2, 9), np.uint16), 9)  # none
    assert_reference(np.zeros((0, 4), np.uint16), 9)
    # Non-contiguous inputs (a column slice), and batches of sizes around the eight-token scan.
    wide = np.tile(np.array([1, 9, 2, 3, 9], np.uint16), (5, 3))
    assert_reference(wide[:, 1:12], 9)
    for n in range(1, 20):
        assert_reference(np.tile(np.array([9, 1, 2], np.uint8), (n, 1)), 9)
    assert segment_dtype(32767) == np.int16 and segment_dtype(32768) == np.int32
    with pytest.raises(ValueError):
        segment_ids_and_positions(np.zeros(4, np.uint16), 9)


def test_segments_of_long_windows_use_int32():
    inputs = np.zeros((2, 40000), np.uint16)
    inputs[0, [5, 39998, 39999]] = 9
    ids, positions = segment_ids_and_positions(inputs, 9)
    assert ids.dtype == np.int32 and positions.max() == 39999 and ids[0, -1] == 3 and positions[0, -1] == 0


def reference_by_sums(inputs: np.ndarray, boundary: int) -> tuple[np.ndarray, np.ndarray]:
    """The same definition by running sums (for batches too long for the loop)."""
    n, seq = inputs.shape
    after = np.zeros(inputs.shape, bool)
    after[:, 1:] = inputs[:, :-1] == boundary
    ids = 1 + np.cumsum(after, axis=1)
    columns = np.broadcast_to(np.arange(seq), inputs.shape)
    starts = np.maximum.accumulate(np.where(after, columns, 0), axis=1)
    return ids, columns - starts


@pytest.mark.parametrize("rows,seq", [(70, 1000), (128, 1024), (2048, 1024), (4, 40000), (7, 65536)])
def test_segments_of_batches_longer_than_a_count_row(rows, seq):
    """Batches of more tokens than the held row of counts (COUNT_ROW): whole rows and a rest,
    int16 (which wraps each row) and int32 (each row's start added)."""
    rng = np.random.default_rng(rows * seq)
    inputs = rng.integers(0, 200, (rows, seq)).astype(np.uint16)
    inputs[rng.random(inputs.shape) < 0.003] = BOUNDARY
    ids, positions = segment_ids_and_positions(inputs, BOUNDARY)
    want_ids, want_positions = reference_by_sums(inputs, BOUNDARY)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(positions, want_positions)
    assert reference_by_sums(inputs[:3, :50], BOUNDARY)[1].tolist() == reference(inputs[:3, :50], BOUNDARY)[1].tolist()


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
def test_the_flat_index_is_added_exactly_at_every_size(dtype):
    from pskd_jax.corpus.segments import COUNT_ROW, _add_flat_index
    rng = np.random.default_rng(5)
    for size in (0, 1, 7, COUNT_ROW - 1, COUNT_ROW, COUNT_ROW + 1, 3 * COUNT_ROW + 12345):
        values = rng.integers(-30000, 30000, size).astype(dtype)
        out = np.empty_like(values)
        _add_flat_index(values, out)
        np.testing.assert_array_equal(out, (values.astype(np.int64) + np.arange(size)).astype(dtype))


PIECES = [[5, 256, 7], [], [8, 256], list(range(20, 60)) + [256], [256, 256, 9, 10], list(range(100, 131))]


@pytest.mark.parametrize("access", ["mmap", "pread"])
@pytest.mark.parametrize("seq,stride", [(4, 4), (4, 1), (3, 2), (8, 5), (1, 1), (30, 7)])
def test_corpus_windows_with_segments(tmp_path, seq, stride, access):
    path = write_corpus(tmp_path / "c", [np.array(p) for p in PIECES])
    with CorpusWindows(path, seq=seq, stride=stride, access=access) as plain, \
            CorpusWindows(path, seq=seq, stride=stride, access=access, segments=True) as windows:
        assert len(windows) == len(plain) and windows.type_text == plain.type_text
        order = np.random.default_rng(seq).permutation(len(windows))
        for idx in (np.arange(len(windows)), order, order[:3], np.array([-1, 0])):
            inputs, targets, ids, positions = windows.gather(idx)
            want_inputs, want_targets = plain.gather(idx)
            np.testing.assert_array_equal(inputs, want_inputs)
            np.testing.assert_array_equal(targets, want_targets)
            want_ids, want_positions = reference(want_inputs, BOUNDARY)
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(positions, want_positions)
        sample = windows[len(windows) - 1]
        assert len(sample) == 4 and all(leaf.shape == (seq,) for leaf in sample)
        np.testing.assert_array_equal(sample[2], reference(sample[0][None], BOUNDARY)[0][0])
        assert [leaf.shape for leaf in windows.gather(np.array([], np.int64))] == [(0, seq)] * 4
        assert "segments=True" in repr(windows) and "segments" not in repr(plain)
        assert windows._sample_bytes() == plain._sample_bytes() + 2 * seq * segment_dtype(seq).itemsize
        copy = pickle.loads(pickle.dumps(windows))
        try:
            assert copy.segments and repr(copy) == repr(windows)
            for a, b in zip(copy.gather(order[:3]), windows.gather(order[:3])):
                np.testing.assert_array_equal(a, b)
        finally:
            copy.close()


def test_segments_must_be_a_bool(tmp_path):
    from pskd_jax.errors import PskdError

    path = write_corpus(tmp_path / "c", [np.arange(10)])
    with pytest.raises(PskdError, match="E9012.*segments is True or False"):
        CorpusWindows(path, seq=4, segments=1)


def test_segments_through_grain(tmp_path):
    grain = pytest.importorskip("grain")
    path = write_corpus(tmp_path / "c", [np.array(p) for p in PIECES])
    with CorpusWindows(path, seq=5, stride=2, segments=True) as windows:
        through = list(grain.MapDataset.source(windows).to_iter_dataset())
        assert len(through) == len(windows)
        for w, sample in enumerate(through):
            assert all(np.array_equal(a, b) for a, b in zip(sample, windows[w]))
        batches = grain.MapDataset.source(windows).shuffle(seed=3).batch(4, drop_remainder=True)
        order = grain.MapDataset.range(len(windows)).shuffle(seed=3)
        inputs, targets, ids, positions = batches[1]
        picked = np.array([int(order[j]) for j in range(4, 8)])
        for got, want in zip((inputs, targets, ids, positions), windows.gather(picked)):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(ids, reference(inputs, BOUNDARY)[0])


def test_batches_kept_are_never_written_over_and_batches_let_go_are_reused():
    """Outputs go to pieces of shared blocks while many batches are kept: each kept batch keeps
    its numbers however many batches follow, and the memory of batches let go is used again."""
    from pskd_jax.corpus import segments

    rng = np.random.default_rng(5)
    inputs = [rng.integers(0, 200, (64, 1024)).astype(np.uint16) for _ in range(3)]
    for batch in inputs:
        batch[rng.random(batch.shape) < 0.01] = 250
    kept = [segment_ids_and_positions(inputs[k % 3], 250) for k in range(3 * segments.KEPT)]
    pieces = [(piece.ctypes.data, piece.ctypes.data + piece.nbytes) for piece, _ in segments._OUTPUTS._pieces]

    def in_a_piece(ids):
        return any(low <= ids.ctypes.data < high for low, high in pieces)

    assert sum(in_a_piece(ids) for ids, _ in kept) >= segments.KEPT
    for k in range(2 * segments.KEPT):  # more batches, some let go at once
        segment_ids_and_positions(inputs[k % 3], 250)
    for k, (ids, positions) in enumerate(kept):
        want_ids, want_positions = reference(inputs[k % 3][:2], 250)
        np.testing.assert_array_equal(ids[:2], want_ids)
        np.testing.assert_array_equal(positions[:2], want_positions)
        assert ids.flags.c_contiguous and positions.flags.c_contiguous and not np.shares_memory(ids, positions)
    del kept
    again = [segment_ids_and_positions(inputs[0], 250) for _ in range(3 * segments.KEPT)]
    assert any(in_a_piece(ids) for ids, _ in again)  # let go: used again
    for ids, positions in again:
        want_ids, want_positions = reference(inputs[0][:2], 250)
        np.testing.assert_array_equal(ids[:2], want_ids)
        np.testing.assert_array_equal(positions[:2], want_positions)
