"""Random-access sources of samples: the :class:`Source` protocol a loader reads, and the core that
:class:`~pskd_jax.format.reader.Reader` and ``CorpusWindows`` share (index checks, the access
modes, Python's sequence protocol, grain's batched hooks, pickling and ``repr``).

The subclasses say how to read the rows of a batch of checked positions; the core makes every
index rule the same for both. See ``docs/format.md`` (Sources of samples).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, Self

import numpy as np

from pskd_jax._os.checks import abridged, first_true
from pskd_jax.errors import IndexOutOfRangeError, IndexTypeError, PskdError, UsageError

ACCESS_MODES = ("mmap", "pread")  # how a source reaches its bytes: through a memory map, or positional reads
ITERATION_BYTES = 4 << 20  # iterating a source reads samples in blocks of about this many bytes
ITERATION_BLOCK = 1024  # and never more samples than this at once


class SourceRepr(str):
    """A source's ``repr``: ``TYPE(IDENTITY)``, its content's identity and no path.

    It also equals the ``repr`` earlier versions gave, ``TYPE('/absolute/path', IDENTITY)``, when
    the type and identity are the same, whatever the path: a grain state saved before the path
    left the ``repr`` still restores over the same data, moved or not. (grain compares the saved
    text with ``!=``, which Python asks of this subclass first, from either side.)"""

    kind: str
    identity: str

    def __new__(cls, kind: str, identity: str) -> SourceRepr:
        shown = super().__new__(cls, f"{kind}({identity})")
        shown.kind, shown.identity = kind, identity
        return shown

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return str.__eq__(self, other) or self._is_earlier_form(other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = str.__hash__  # (equal texts hash alike; the earlier form is a match, not a value)

    def _is_earlier_form(self, other: str) -> bool:
        head, tail = f"{self.kind}(", f", {self.identity})"
        if not (other.startswith(head) and other.endswith(tail)) or len(other) <= len(head) + len(tail):
            return False
        path = other[len(head) : -len(tail)]
        try:
            return isinstance(ast.literal_eval(path), str)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceRepr, (self.kind, self.identity))


class Source(Protocol):
    """What a loader reads from: a ``.psk.d`` Reader, corpus windows, or any random-access source
    of samples with a length and a vectorised ``gather`` (indices in, one batched pytree out)."""

    def __len__(self) -> int: ...

    def gather(self, indices: np.ndarray) -> Any: ...


def checked_access(access: Any, where: str) -> str:
    """``access`` when it is one of :data:`ACCESS_MODES`; E9012 naming ``where`` otherwise."""
    if access not in ACCESS_MODES:
        raise UsageError(f"{where}: access is one of {', '.join(ACCESS_MODES)}, got {abridged(access, 80)}")
    return access


def _range_words(count: int, what: str) -> str:
    return f"the {count} {what}s (indices from {-count} to {count - 1})" if count else f"the 0 {what}s"


def checked_index(index: Any, count: int, where: str, what: str) -> int:
    """One index as a position from 0 to ``count - 1``: an integer (Python's, numpy's, anything
    with ``__index__``; never a bool), a negative one counting from the end as Python's do.
    :class:`IndexTypeError` (E9012, a ``TypeError``) for any other value, :class:`IndexOutOfRangeError`
    (E9003, an ``IndexError``) for one outside ``-count .. count - 1``."""
    if isinstance(index, (bool, np.bool_)):
        raise IndexTypeError(f"{where}: a {what} index is an integer, got the bool {index!r}")
    try:
        index = operator.index(index)
    except TypeError:
        raise IndexTypeError(f"{where}: a {what} index is an integer, got {abridged(index, 80)} "
                             f"(a {type(index).__name__}); gather() reads several at once") from None
    if not -count <= index < count:
        raise IndexOutOfRangeError(f"{where}: {what} {index} is beyond {_range_words(count, what)}")
    return index + count if index < 0 else index


def checked_positions(indices: Any, count: int, where: str, what: str) -> np.ndarray:
    """Indices (one axis of integers, any integer dtype, negatives from the end) as positions from 0
    to ``count - 1`` (an ``intp`` array), with the errors of :func:`checked_index`. Vectorised:
    a few whole-array operations, whatever the number of indices."""
    array = np.asarray(indices)
    if array.ndim != 1:
        raise IndexTypeError(f"{where}: {what} indices are one axis of integers, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if not array.size:  # [] comes as float64: nothing to read
            return np.zeros(0, np.intp)
        if array.dtype.kind != "O" or not all(type(i) is int for i in array.tolist()):
            raise IndexTypeError(f"{where}: {what} indices are integers, got {array.dtype}")
        # Python ints past 64 bits (numpy keeps them as objects): beyond any count.
        bad = next(i for i in array.tolist() if not -count <= i < count)
        raise IndexOutOfRangeError(f"{where}: {what} {abridged(bad, 80)} is beyond {_range_words(count, what)}")
    if not array.size:
        return np.zeros(0, np.intp)
    low, high = array.min(), array.max()
    if low < -count or high >= count:
        bad = array[first_true((array < -count) | (array >= count))]
        raise IndexOutOfRangeError(f"{where}: {what} {bad} is beyond {_range_words(count, what)}")
    positions = array.astype(np.intp, copy=False)
    if low < 0:
        positions = np.where(positions < 0, positions + count, positions)
    return positions


class RandomAccessSource:
    """The part of a source of samples that does not depend on where its samples come from.

    A subclass gives its ``path`` and ``_what`` ("sample", "window") and says how to read:

    - ``_now()``: what one read uses from its start to its end (a snapshot a refresh replaces
      whole), and ``_length(now)`` its count;
    - ``_rows(now, positions)``: the leaves of the samples at checked positions (from 0, an ``intp``
      array), each with a leading batch axis, in one vectorised read;
    - ``_assemble(leaves)``: those leaves as the batch a user sees (a pytree, a tuple);
    - ``_sample_bytes()``, ``_identity()``, ``_reopen()``, ``_witness()``, ``_changed()``, ``close()``.

    It then has ``len``, ``source[i]`` (Python's sequence protocol: negative indices from the end,
    :class:`IndexOutOfRangeError` past it, :class:`IndexTypeError` for what is not an integer),
    ``gather`` and ``gather_leaves`` (the same rules over arrays), iteration in blocks, grain's and
    PyTorch's batched hook, pickling that reopens the source, and a ``repr`` that identifies it.
    """

    path: str
    _what = "sample"

    # -- what a subclass says ---------------------------------------------------------------------

    def _now(self) -> Any:
        return None

    def _length(self, now: Any) -> int:
        raise NotImplementedError

    def _rows(self, now: Any, positions: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _assemble(self, leaves: list[np.ndarray]) -> Any:
        raise NotImplementedError

    def _check_readable(self) -> None:
        """Raises when nothing can be read now (closed, no layout)."""

    def _sample_bytes(self) -> int:
        return 0

    def _identity(self) -> str:
        """What follows the path in the ``repr``: stable across processes and new sources of the
        same data, different for other data (grain checks a loader's saved state against it)."""
        raise NotImplementedError

    def _reopen(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments that open this source again (in a worker process)."""
        raise NotImplementedError

    def _witness(self) -> Any:
        """What a reopened source must equal to be the one that was pickled."""
        raise NotImplementedError

    def _changed(self, then: Any) -> PskdError:
        """The error for a reopened source whose witness is no longer ``then``."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- the sequence protocol ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._length(self._now())

    def __getitem__(self, index: int) -> Any:
        """Sample ``index`` (negative from the end) in fresh arrays, leaves of its own shape."""
        self._check_readable()
        now = self._now()
        position = checked_index(index, self._length(now), self.path, self._what)
        leaves = self._rows(now, np.array([position], dtype=np.intp))
        return self._assemble([leaf[0, ...] for leaf in leaves])  # 0-d arrays, not scalars

    def gather_leaves(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """:meth:`gather` as its list of leaves, each ``(len(indices), *shape)``."""
        self._check_readable()
        now = self._now()
        return self._rows(now, checked_positions(indices, self._length(now), self.path, self._what))

    def gather(self, indices: Sequence[int] | np.ndarray) -> Any:
        """The samples at ``indices`` under a new leading batch axis, in one vectorised read."""
        return self._assemble(self.gather_leaves(indices))

    def __iter__(self) -> Iterator[Any]:
        """The samples in order, read in blocks (one gather each), as ``source[i]`` gives them;
        those present when iteration starts."""
        self._check_readable()
        count = len(self)
        block = max(1, min(ITERATION_BLOCK, ITERATION_BYTES // max(1, self._sample_bytes())))
        for start in range(0, count, block):
            yield from self.__getitems__(np.arange(start, min(start + block, count)))

    # -- data-loader hooks (grain, PyTorch) -------------------------------------------------------

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """The samples at ``indices`` as a list, read in one gather: the batched-read hook grain's
        ``MapDataset`` calls as ``_getitems`` and PyTorch's ``DataLoader`` as ``__getitems__``."""
        leaves = self.gather_leaves(indices)
        return [self._assemble([leaf[k, ...] for leaf in leaves]) for k in range(len(indices))]

    _getitems = __getitems__

    def __repr__(self) -> str:
        """What identifies the data, by its content alone (no path, no object id): the same for a
        new source of the same data wherever it now lies (moved, copied, another mount), other for
        other data. grain checks a saved loader state against it; see :class:`SourceRepr`."""
        return SourceRepr(type(self).__name__, self._identity())

    # -- pickling (worker processes: grain's, multiprocessing's) -----------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """How to open the source again and what it must then be; no descriptor, no map."""
        return {"reopen": self._reopen(), "witness": self._witness()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        args, kwargs = state["reopen"]
        self.__init__(*args, **kwargs)  # type: ignore[misc]
        if self._witness() != state["witness"]:
            self.close()
            raise self._changed(state["witness"])

    # -- lifetime -----------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ACCESS_MODES", "ITERATION_BLOCK", "ITERATION_BYTES", "RandomAccessSource", "Source", "SourceRepr",
           "checked_access", "checked_index", "checked_positions"]
