"""Packed segments of windows cut across documents: each input token's segment id and position.

Windows of a corpus run across document boundaries, with the boundary token between documents.
For a batch of input windows ``(n, T)`` :func:`segment_ids_and_positions` gives, per token:

- ``segment_ids``: 1 at the window's first token, one more on the token after each boundary
  token (a boundary ends its document's segment: it carries the id of the tokens before it);
- ``positions``: 0 at each segment's first token, counting on through the segment.

Both are arrays ``(n, T)`` of a signed dtype that holds T (:func:`segment_dtype`: int16 for T
up to 32767), the form flax, MaxText and levanter attention masks take. The computation is
vectorised over the whole batch: the segments' starts are found with one comparison (and a scan
eight tokens a step), their lengths and ids are a few arrays of one entry a segment, and each
output is one ``np.repeat`` of those (the positions one subtraction more). No Python work per
token or per segment. See ``docs/training.md`` (Packed segments and a mixture of corpora).
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


_columns_held: dict[tuple[int, str], np.ndarray] = {}


def _columns(seq: int, dtype: np.dtype) -> np.ndarray:
    """``arange(seq)`` of ``dtype`` (read-only, kept for the last few window lengths)."""
    key = (seq, dtype.str)
    held = _columns_held.get(key)
    if held is None:
        held = np.arange(seq, dtype=dtype)
        held.flags.writeable = False
        if len(_columns_held) >= 8:
            _columns_held.clear()
        _columns_held[key] = held
    return held


def _true_positions(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero`` of a one-axis bool array where True is rare: words of eight are scanned
    first, and only the words holding a True are looked into."""
    size = mask.size
    whole = size - size % 8
    words = mask[:whole].view(np.uint64)
    hit = np.flatnonzero(words != 0)  # (faster than np.flatnonzero of the integers)
    inside = np.flatnonzero(mask[:whole].reshape(-1, 8)[hit])
    found = (hit[inside >> 3] << 3) + (inside & 7)
    if whole < size:
        found = np.concatenate([found, whole + np.flatnonzero(mask[whole:])])
    return found


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
    # Whether each token starts a segment: the window's first, and each one after a boundary.
    first = np.empty(size, dtype=bool)
    np.equal(np.ascontiguousarray(inputs).reshape(-1)[:-1], boundary, out=first[1:])
    first.reshape(n, seq)[:, 0] = True  # (also over a boundary that ends the window before)
    starts = _true_positions(first)  # the segments' starts, flat, in order
    count = len(starts)
    lengths = np.empty(count, dtype=np.int64)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = size - starts[-1]
    local = starts % seq  # a start's column in its window
    # A segment's id: its ordinal among the segments of its window, from 1.
    ids = np.arange(1, count + 1, dtype=np.int64) - np.flatnonzero(local == 0)[starts // seq]
    segment_ids = np.repeat(ids.astype(dtype), lengths).reshape(n, seq)
    positions = np.repeat(local.astype(dtype), lengths).reshape(n, seq)
    np.subtract(_columns(seq, dtype), positions, out=positions)
    return segment_ids, positions
