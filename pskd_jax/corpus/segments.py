"""Packed segments of windows cut across documents: each input token's segment id and position.

Windows of a corpus run across document boundaries, with the boundary token between documents.
For a batch of input windows ``(n, T)`` :func:`segment_ids_and_positions` gives, per token:

- ``segment_ids``: 1 at the window's first token, one more on the token after each boundary
  token (a boundary ends its document's segment: it carries the id of the tokens before it);
- ``positions``: 0 at each segment's first token, counting on through the segment.

Both are arrays ``(n, T)`` of a signed dtype that holds T (:func:`segment_dtype`: int16 for T
up to 32767), the form flax, MaxText and levanter attention masks take. The computation is
vectorised over the whole batch, with as few passes over its tokens as numpy allows: one
comparison makes the mask of the segments' starts, a test of its words of eight finds the few
words holding a start, their lengths and ids are a few arrays of one entry a segment, and each
output is one ``np.repeat`` of those (the positions one in-place addition more, in the output's
own dtype). No Python work per token or per segment, no temporary of the batch's size beyond the
mask. See ``docs/training.md`` (Packed segments and a mixture of corpora).
"""

from __future__ import annotations

import numpy as np

__all__ = ["segment_dtype", "segment_ids_and_positions"]


def segment_dtype(seq: int) -> np.dtype:
    """The dtype of the segment ids and positions of windows of ``seq`` tokens: int16 when they
    fit (``seq`` up to 32767), else int32 (else int64). Narrow as a corpus's tokens are: the
    arrays are half the bytes of int32's for the usual window lengths.

    >>> segment_dtype(1024), segment_dtype(32768)
    (dtype('int16'), dtype('int32'))
    """
    for dtype in (np.int16, np.int32):
        if seq <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


_counts_held: dict[tuple[int, str], np.ndarray] = {}
HELD_COUNT = 1 << 20  # flat counts of batches up to this many tokens are kept (2 MiB in int16)


def _count_up(size: int, dtype: np.dtype) -> np.ndarray:
    """``0, 1, …, size - 1`` in ``dtype``, wrapping as the dtype does (read-only; kept for the
    last few sizes up to :data:`HELD_COUNT`)."""
    key = (size, dtype.str)
    held = _counts_held.get(key)
    if held is None:
        held = np.arange(size, dtype=np.int64).astype(dtype)  # (wraps: only differences are used)
        held.flags.writeable = False
        if size <= HELD_COUNT:
            if len(_counts_held) >= 8:
                _counts_held.clear()
            _counts_held[key] = held
    return held


def segment_ids_and_positions(inputs: np.ndarray, boundary: int) -> tuple[np.ndarray, np.ndarray]:
    """``(segment_ids, positions)`` of a batch of input windows ``(n, T)`` (see the module).

    >>> ids, positions = segment_ids_and_positions(np.array([[5, 9, 6, 7, 9], [9, 9, 1, 2, 3]]), 9)
    >>> ids.tolist(), positions.tolist()
    ([[1, 1, 2, 2, 2], [1, 2, 3, 3, 3]], [[0, 1, 0, 1, 2], [0, 0, 0, 1, 2]])
    """
    inputs = np.asarray(inputs)
    if inputs.ndim != 2:
        raise ValueError(f"inputs are (n, T) windows, got shape {inputs.shape}")
    n, seq = inputs.shape
    size, dtype = n * seq, segment_dtype(seq)
    if size == 0:
        return np.zeros((n, seq), dtype), np.zeros((n, seq), dtype)
    # Whether each token starts a segment (the window's first, and each one after a boundary),
    # padded with False to whole words of eight.
    first = np.empty(size + (-size) % 8, dtype=bool)
    np.equal(np.ascontiguousarray(inputs).reshape(-1)[:-1], boundary, out=first[1:size])
    first[size:] = False
    first[:size:seq] = True  # (also over a boundary that ends the window before)
    # The starts, flat and in order: the words holding one, then the bytes inside those words.
    hit = (first.view(np.uint64) != 0).nonzero()[0]
    inside = first.reshape(-1, 8).take(hit, axis=0).reshape(-1).nonzero()[0]
    starts = hit.take(inside >> 3)
    starts <<= 3
    starts |= inside & 7
    count = starts.size
    ends = np.empty(count + 1, dtype=np.int64)
    ends[:-1] = starts
    ends[-1] = size
    lengths = ends[1:] - starts
    # A segment's id: its ordinal among the segments of its window, from 1.
    window = starts // seq
    ids = np.arange(1, count + 1, dtype=np.int64)
    ids -= (starts == window * seq).nonzero()[0].take(window)  # (each window's first segment)
    segment_ids = ids.astype(dtype).repeat(lengths).reshape(n, seq)
    # A token's position: its flat index less its segment's start. Both are taken modulo the
    # dtype's range (they wrap alike), and the difference, below T, is exact.
    positions = np.negative(starts).astype(dtype).repeat(lengths)
    np.add(positions, _count_up(size, dtype), out=positions)
    return segment_ids, positions.reshape(n, seq)
