"""Packed segments of windows cut across documents: each input token's segment id and position.

Windows of a corpus run across document boundaries, with the boundary token between documents.
For a batch of input windows ``(n, T)`` :func:`segment_ids_and_positions` gives, per token:

- ``segment_ids``: 1 at the window's first token, one more on the token after each boundary
  token (a boundary ends its document's segment: it carries the id of the tokens before it);
- ``positions``: 0 at each segment's first token, counting on through the segment.

Both are arrays ``(n, T)`` of a signed dtype that holds T (:func:`segment_dtype`: int16 for T
up to 32767), the form flax, MaxText and levanter attention masks take.

Two implementations give the same arrays. Where the package was built with a C compiler, one
scan of the tokens writes both outputs (``_segments.c``: blocks of 32 tokens in vectors, of 32
bytes where the processor has AVX2, else of 16; the GIL let go); it takes a corpus's unsigned
tokens of 1, 2 or 4 bytes (:data:`_SCANNED`). A mapped corpus's gather runs it (or its check of
the tokens alone) on each window as it copies it (:func:`gathered_windows`). Elsewhere numpy
does it, vectorised over the whole batch with as few passes as numpy allows: one comparison
makes the mask of the segments' starts, a test of its words of eight finds the few words holding
a start, their lengths, ids and starts are a few arrays of one entry a segment, and one
``np.repeat`` of those makes both outputs (the positions one addition more, in the outputs' own
dtype, of a held row of counts). No Python work per token or per segment either way. The two
outputs of a batch are the halves of one array; while a caller keeps many batches alive, they
are written into pieces of blocks of memory aligned to huge pages instead (:class:`_Pieces`: at
most a few blocks of 8 MiB held for reuse), which takes fresh memory with far fewer page faults.
See ``docs/training.md`` (Packed segments and a mixture of corpora).
"""

from __future__ import annotations

import collections
import operator
import os
import sys
import threading
import types
import weakref

import numpy as np

_native: types.ModuleType | None
try:  # the compiled scan, where the package was built with a C compiler (see setup.py)
    import pskd_jax.corpus._segments as _native
except ImportError:  # (built without one: numpy computes the same arrays)
    _native = None

# The token dtypes the compiled scan reads (a corpus's), each with the bound of a boundary it can hold.
_SCANNED = {np.dtype(np.uint8): 1 << 8, np.dtype(np.uint16): 1 << 16, np.dtype(np.uint32): 1 << 32}
_NO_BOUND = (1 << 64) - 1  # (the compiled scan's bound when none is asked: above every token it reads)
_largest = np.maximum.reduce  # (without ndarray.max's wrapper)

__all__ = ["segment_dtype", "segment_ids_and_positions"]


_INT16, _INT32, _INT64 = np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64)


def segment_dtype(seq: int) -> np.dtype:
    """The dtype of the segment ids and positions of windows of ``seq`` tokens: int16 when they
    fit (``seq`` up to 32767), else int32 (else int64). Narrow as a corpus's tokens are: the
    arrays are half the bytes of int32's for the usual window lengths.

    >>> segment_dtype(1024), segment_dtype(32768)
    (dtype('int16'), dtype('int32'))
    """
    return _INT16 if seq <= 32767 else _INT32 if seq <= 2147483647 else _INT64


COUNT_ROW = 1 << 16  # the flat index is added a row of this many tokens at a time (int16 wraps after it)
_count_rows: dict[str, np.ndarray] = {}


def _count_row(dtype: np.dtype) -> np.ndarray:
    """``0, 1, …, COUNT_ROW - 1`` in ``dtype``, wrapping as the dtype does (read-only; one a dtype)."""
    held = _count_rows.get(dtype.str)
    if held is None:
        held = np.arange(COUNT_ROW, dtype=np.int64).astype(dtype)  # (wraps: only differences are used)
        held.flags.writeable = False
        _count_rows[dtype.str] = held
    return held


def _add_flat_index(values: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = values[i] + i`` for every i, wrapping as their dtype does: rows of
    :data:`COUNT_ROW` tokens plus one held row of counts, then (in a dtype wider than int16,
    where a row's start does not wrap to 0) each row's start; a batch of any size costs one add
    a token (two for int32), with no count made for its size."""
    size, row = values.size, COUNT_ROW
    count = _count_row(values.dtype)
    if size <= row:  # (a batch of B = 64 windows of 1024 tokens: one add)
        np.add(values, count[:size], out=out)
        return
    dtype, whole = values.dtype, size - size % row
    if whole:
        rows = out[:whole].reshape(-1, row)
        np.add(values[:whole].reshape(-1, row), count, out=rows)
        if dtype.itemsize > 2:
            rows += np.arange(0, whole, row, dtype=np.int64).astype(dtype)[:, None]
    if whole < size:
        np.add(values[whole:], count[: size - whole], out=out[whole:])
        if whole and dtype.itemsize > 2:
            np.add(out[whole:], np.array(whole, np.int64).astype(dtype), out=out[whole:])  # (wrapping)


def segment_ids_and_positions(inputs: np.ndarray, boundary: int) -> tuple[np.ndarray, np.ndarray]:
    """``(segment_ids, positions)`` of a batch of input windows ``(n, T)`` (see the module).

    >>> ids, positions = segment_ids_and_positions(np.array([[5, 9, 6, 7, 9], [9, 9, 1, 2, 3]]), 9)
    >>> ids.tolist(), positions.tolist()
    ([[1, 1, 2, 2, 2], [1, 2, 3, 3, 3]], [[0, 1, 0, 1, 2], [0, 0, 0, 1, 2]])
    """
    inputs, boundary = np.asarray(inputs), operator.index(boundary)
    if inputs.ndim != 2:
        raise ValueError(f"inputs are (n, T) windows, got shape {inputs.shape}")
    n, seq = inputs.shape
    size, dtype = n * seq, segment_dtype(seq)
    if size == 0:
        return np.zeros((n, seq), dtype), np.zeros((n, seq), dtype)
    if _compiled(inputs, boundary, dtype):
        ids, positions, _ = _scan(np.ascontiguousarray(inputs), boundary, dtype, _NO_BOUND)
        return ids, positions
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
    # Per segment, in one array of the outputs' dtype: its id (its ordinal among the segments of
    # its window, from 1) and its start negated; one repeat by the segments' lengths makes both outputs.
    window = starts // seq
    pair = np.empty((2, count), dtype)
    firsts = (starts == window * seq).nonzero()[0]  # each window's first segment
    np.subtract(np.arange(1, count + 1, dtype=np.int64), firsts.take(window), out=pair[0], casting="unsafe")
    np.negative(starts, out=pair[1], casting="unsafe")
    both = pair.repeat(lengths, axis=1)
    out = _OUTPUTS.place(both)  # (the repeat's own array, or a piece of a block: see _Pieces)
    if out is not both:
        np.copyto(out[0], both[0])
    # A token's position: its flat index less its segment's start. Both are taken modulo the
    # dtype's range (they wrap alike), and the difference, below T, is exact.
    _add_flat_index(both[1], out[1])
    return out[0].reshape(n, seq), out[1].reshape(n, seq)


def segments_below(inputs: np.ndarray, boundary: int, bound: int | None) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(segment_ids, positions, below)`` of a corpus's gathered batch: C-contiguous input windows
    ``(n, T)``, an integer boundary; ``below``: whether every input token is
    below ``bound`` (None: no bound), the check a gather makes of its tokens against the vocabulary
    size. Where the compiled scan reads these tokens the check rides in its pass (a compare more a
    vector), and the gather makes no pass of its own over the inputs."""
    dtype = segment_dtype(inputs.shape[1])
    if inputs.size and _compiled(inputs, boundary, dtype):  # (an empty batch, T = 0 too, has nothing to scan)
        return _scan(inputs, boundary, dtype, _limit(bound))
    ids, positions = segment_ids_and_positions(inputs, boundary)
    return ids, positions, bound is None or inputs.size == 0 or bool(_largest(inputs, None) < bound)


def gathered_windows(views: tuple[np.ndarray, np.ndarray], records: np.ndarray, dtype: np.dtype, boundary: int,
                     bound: int | None, segmented: bool) -> tuple[list[np.ndarray], bool] | None:
    """A mapped corpus's windows gathered by the compiled pass, or None where it is not built or
    does not read these tokens: the leaves ``[inputs, targets]`` (with ``segmented``, then the
    inputs' segment ids and positions), row w from record ``records[w]`` of ``views`` (the
    corpus's views over its maps: the inputs', the targets'), and whether every input token and
    each target's last one is below ``bound`` (None: no bound). Each window is copied, checked
    and scanned while it is in the cache (``_segments.c``'s ``gather``), where numpy's copies
    and passes go over the whole batch one after another."""
    n, seq = len(records), views[0].dtype.itemsize // dtype.itemsize
    out_dtype = segment_dtype(seq)
    if _native is None or dtype not in _SCANNED or not 0 <= boundary < _SCANNED[dtype] or out_dtype.itemsize == 8:
        return None
    inputs, targets = np.empty((n, seq), dtype), np.empty((n, seq), dtype)
    outputs = _OUTPUTS.place(np.empty((2, n, seq), out_dtype)) if segmented else None
    below = _native.gather(views[0], views[1], records, inputs, targets, outputs, boundary, _limit(bound))
    return ([inputs, targets] if outputs is None else [inputs, targets, outputs[0], outputs[1]]), below


def _limit(bound: int | None) -> int:
    """The bound as the compiled passes take it, in [0, 2**64): one past that is above every
    token, as None is; one at or below 0 is above none."""
    return _NO_BOUND if bound is None else min(max(operator.index(bound), 0), _NO_BOUND)


def _compiled(inputs: np.ndarray, boundary: int, dtype: np.dtype) -> bool:
    """Whether the compiled scan computes these segments: it is built, reads these tokens, their
    dtype holds the boundary, and the outputs are of 2 or 4 bytes."""
    return _native is not None and 0 <= boundary < _SCANNED.get(inputs.dtype, 0) and dtype.itemsize < 8


def _scan(inputs: np.ndarray, boundary: int, dtype: np.dtype, bound: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The compiled scan of C-contiguous windows: both outputs in one array (see :class:`_Pieces`),
    and whether every token is below ``bound``."""
    assert _native is not None
    n, seq = inputs.shape
    out = _OUTPUTS.place(np.empty((2, n, seq), dtype))
    below = _native.fill(inputs, boundary, seq, out, bound)
    return out[0], out[1], below


class _Pieces:
    """Where the outputs of batches are written. While callers let batches go within a few batches
    (a training loop, a short queue of prefetched batches), in the repeat's own array: the
    allocator gives back memory just freed, with no page to fault in. While they keep more (a
    list of batches, a long queue), in a piece of a block of :data:`BLOCK` bytes, aligned to huge
    pages (numpy asks for them on arrays this large), so that fresh memory is taken a huge page
    at a time rather than 4 KiB at a time: either a piece handed out before that nothing refers to any more
    (its reference count says so; the most recent such, likely still in the cache) or a new one.
    A batch's arrays stay its caller's as long as they are kept. The last :data:`KEPT` pieces are
    held for reuse (at most that many batches' outputs, and the blocks they lie in); a block
    lives while any piece of it does (a batch kept alone keeps its 8 MiB block)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: list[tuple[np.ndarray, int]] = []  # (piece, its count of references when unused)
        self._block = memoryview(b"")
        self._at = 0
        # The outputs of the last batches, the oldest first: a weak reference to an array of
        # their own, or the entry of their piece (still referred to while its count is higher).
        self._held: collections.deque[weakref.ref | tuple[np.ndarray, int]] = collections.deque(maxlen=LOOK_BACK)

    def place(self, made: np.ndarray) -> np.ndarray:
        """The array a batch's outputs go to: ``made`` itself, or (when the outputs of the batch
        :data:`LOOK_BACK` batches ago are still held and ``made``'s size is within :data:`PIECES`)
        a piece of that dtype and shape. (The common case, batches let go, takes no lock: a
        deque's append is atomic, and two threads that both choose ``made`` lose nothing.)"""
        held = self._held
        if len(held) == LOOK_BACK and PIECES[0] <= made.nbytes <= PIECES[1] and _still_held(held[0]):
            with self._lock:
                entry = self._take(made.nbytes)
                held.append(entry)
                return entry[0].view(made.dtype).reshape(made.shape)
        held.append(weakref.ref(made))
        return made

    def _take(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A piece of ``nbytes`` bytes nothing refers to, or a new one (its entry)."""
        pieces = self._pieces
        for i in range(len(pieces) - 1, -1, -1):  # (the most recent first)
            if pieces[i][0].nbytes == nbytes and sys.getrefcount(pieces[i][0]) == pieces[i][1]:
                pieces.append(pieces.pop(i))
                return pieces[-1]
        if self._at + nbytes > len(self._block):
            memory = np.empty(BLOCK + HUGE_PAGE, np.uint8)
            skip = -memory.ctypes.data % HUGE_PAGE
            self._block, self._at = memoryview(memory[skip : skip + BLOCK]), 0  # type: ignore[arg-type]
            del memory
        # A piece that is its own base (made through a memoryview, not a view of the block's
        # memory), so that its references are those of the arrays made from it.
        pieces.append((np.frombuffer(self._block[self._at : self._at + nbytes], np.uint8), 0))
        self._at += -(-nbytes // 64) * 64
        unused = sys.getrefcount(pieces[-1][0])
        pieces[-1] = (pieces[-1][0], unused)
        del pieces[:-KEPT]
        return pieces[-1]

    def _forget(self) -> None:
        self.__init__()  # type: ignore[misc]  # (a forked child: its parent's lock may be held)


def _still_held(outputs: weakref.ref | tuple[np.ndarray, int]) -> bool:
    """Whether a batch's outputs (an entry of ``_Pieces._held``) are still referred to."""
    if type(outputs) is tuple:
        return sys.getrefcount(outputs[0]) > outputs[1]
    return outputs() is not None  # type: ignore[operator]


BLOCK = 8 << 20  # bytes of a block of outputs (32 batches of B = 64, T = 1024)
HUGE_PAGE = 2 << 20
PIECES = (64 << 10, BLOCK // 4)  # the sizes of outputs taken from blocks (bytes, both outputs)
KEPT = 16  # pieces held for reuse
LOOK_BACK = 4  # outputs go to pieces while those of the batch this many batches ago are held
_OUTPUTS = _Pieces()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_OUTPUTS._forget)
