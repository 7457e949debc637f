"""Where a source's bytes come from, kept apart from which bytes a read needs.

A source of samples (:class:`~pskd_jax.format.reader.Reader`, ``CorpusWindows``) works out which
bytes a gather needs, as :class:`Runs` (runs of consecutive records or tokens), and asks its
:class:`ByteSource` for them. The one byte source today is a local regular file,
:class:`FileBytes`: read through a memory map (``access="mmap"``) or with positional reads
(``access="pread"``). A byte source that reads byte ranges (an object store) implements
:meth:`ByteSource.read_spans` and :meth:`ByteSource.size` and serves ``"pread"``; it has no map.
See ``docs/format.md`` (Sources of samples).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import io
import mmap
import os
from collections.abc import Sequence

import numpy as np

from pskd_jax._os.files import open_fd
from pskd_jax._os.positional import pread_spans, read_into
from pskd_jax.errors import NotPskdError, PskdError, TruncatedError


@dataclasses.dataclass(frozen=True, eq=False)
class Runs:
    """Which bytes a read needs: run ``j`` is ``lengths[j]`` bytes from byte ``offsets[j]`` of byte
    source ``sources[j]`` (an index into the caller's list of sources; None: all from the first),
    and lands at byte ``starts[j]`` of the output buffer. int64 arrays, one element a run."""

    offsets: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    sources: np.ndarray | None = None

    @classmethod
    def of_records(cls, positions: np.ndarray, record_bytes: int, first_byte: int) -> Runs:
        """The runs of consecutive records among ``positions`` (record ``p`` at ``first_byte + p *
        record_bytes``), read into one array of ``len(positions)`` records in that order."""
        if not len(positions):
            return cls.of_rows(np.zeros(0, np.int64), 0)
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        firsts = np.concatenate(([0], breaks)).astype(np.int64)
        ends = np.concatenate((breaks, [len(positions)])).astype(np.int64)
        return cls(first_byte + positions[firsts].astype(np.int64) * record_bytes, (ends - firsts) * record_bytes,
                   firsts * record_bytes)

    @classmethod
    def of_rows(cls, offsets: np.ndarray, row_bytes: int, sources: np.ndarray | None = None,
                rows: np.ndarray | None = None) -> Runs:
        """One run of ``row_bytes`` a row: row ``rows[j]`` (default ``j``) of the output read from
        ``offsets[j]`` (a window's tokens, one leaf of a large sample)."""
        rows = np.arange(len(offsets), dtype=np.int64) if rows is None else rows.astype(np.int64)
        return cls(np.asarray(offsets, np.int64), np.full(len(offsets), row_bytes, np.int64), rows * row_bytes,
                   sources)

    def spans(self, out: np.ndarray) -> list[memoryview]:
        """The run's pieces of ``out`` (a C-contiguous array), as writable byte buffers."""
        flat = out.reshape(-1).view(np.uint8).data
        return [flat[start : start + length] for start, length in zip(self.starts.tolist(), self.lengths.tolist())]


class ByteSource(abc.ABC):
    """The bytes of one file or object, read by position. ``name`` names it in messages."""

    name: str

    @abc.abstractmethod
    def size(self) -> int:
        """The size now (a file cut short since it was opened shows here)."""

    @abc.abstractmethod
    def read_spans(self, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        """Fills each buffer of ``spans`` with the bytes from its offset; E9003 when they end first."""

    def read_at(self, buffer: memoryview, offset: int) -> None:
        """Fills ``buffer`` with the bytes from ``offset`` on."""
        self.read_spans([buffer], [offset])

    @classmethod
    def read_spans_of(cls, sources: Sequence[ByteSource], which: Sequence[int], spans: Sequence[memoryview],
                      offsets: Sequence[int], name: str) -> None:
        """Fills span ``j`` from ``sources[which[j]]``: spans of several sources of this kind read
        together. One source after the other here; a kind that can have reads of several sources in
        flight at once (files through one ``map``, an object store's requests) says so by overriding."""
        grouped: dict[int, tuple[list[memoryview], list[int]]] = {}
        for k, span, offset in zip(which, spans, offsets):
            mine = grouped.setdefault(k, ([], []))
            mine[0].append(span)
            mine[1].append(offset)
        for k, (mine_spans, mine_offsets) in grouped.items():
            sources[k].read_spans(mine_spans, mine_offsets)

    def mapped(self, size: int) -> mmap.mmap | None:
        """A read-only map of the first ``size`` bytes, or None where the bytes can only be read."""
        return None

    # Not abstract on purpose: a source that holds nothing has nothing to let go of.
    def close(self) -> None:  # noqa: B027
        """Lets go of what the source holds."""


def read_runs(sources: Sequence[ByteSource], runs: Runs, out: np.ndarray, name: str) -> np.ndarray:
    """Fills ``out`` (C-contiguous) with the bytes of ``runs``, and returns it. ``name`` (what the
    caller opened: a file, a manifest) names a failure that more than one source shares."""
    spans = runs.spans(out)
    if spans:
        offsets = runs.offsets.tolist()
        if runs.sources is None:
            sources[0].read_spans(spans, offsets)
        else:
            type(sources[0]).read_spans_of(sources, runs.sources.tolist(), spans, offsets, name)
    return out


def cut_short(where: str, size: int, needed: int, what: str) -> TruncatedError:
    """The error for bytes that were cut short since they were opened (a file rewritten in place)."""
    return TruncatedError(f"{where}: truncated since it was opened: {size} bytes now, {needed} needed for {what}")


class FileBytes(ByteSource):
    """A regular file, opened once (a FIFO or a device is E9002 at once, never waited on), read with
    ``preadv`` or through one read-only memory map of it, made when first asked for.

    A map's pages stay valid while a view of them lives: :meth:`mapped` with a new size (a file
    that grew) and :meth:`close` close the old map, or leave it to close with its last view.
    """

    def __init__(self, path: str, *, fd: int | None = None, error: type[PskdError] = NotPskdError) -> None:
        self.name = path
        self.file = io.FileIO(open_fd(path, error) if fd is None else fd, "rb", closefd=True)
        self.fd: int | None = self.file.fileno()
        self.map: mmap.mmap | None = None

    def size(self) -> int:
        if self.fd is None:
            raise TruncatedError(f"{self.name}: the file was closed")
        try:
            return os.fstat(self.fd).st_size
        except OSError as e:
            raise TruncatedError(f"{self.name}: cannot read: {e.strerror or e}") from e

    def read_spans(self, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        pread_spans(self.fileno(), spans, offsets, self.name)

    def read_at(self, buffer: memoryview, offset: int) -> None:
        read_into(self.fileno(), buffer, offset, self.name)

    @classmethod
    def read_spans_of(cls, sources: Sequence[ByteSource], which: Sequence[int], spans: Sequence[memoryview],
                      offsets: Sequence[int], name: str) -> None:
        fds = [sources[k].fd for k in which]  # type: ignore[attr-defined]
        if None in fds:
            raise TruncatedError(f"{name}: a file was closed")
        pread_spans(fds, spans, offsets, name)  # one preadv a span, through map

    def fileno(self) -> int:
        """The descriptor (E9003 once closed)."""
        if self.fd is None:
            raise TruncatedError(f"{self.name}: the file was closed")
        return self.fd

    def mapped(self, size: int) -> mmap.mmap | None:
        """The map of the first ``size`` bytes (None for none), made now when there is none of that
        size yet; a map of another size (before the file grew) is let go."""
        if not size:
            return None
        if self.map is not None and len(self.map) == size:
            return self.map
        try:
            fresh = mmap.mmap(self.fileno(), size, access=mmap.ACCESS_READ)
        except ValueError:  # shorter than its size a moment ago
            raise TruncatedError(f"{self.name}: the file was cut short while being opened") from None
        except OSError as e:
            raise TruncatedError(f"{self.name}: cannot map: {e.strerror or e}") from e
        release_map(self.map)
        self.map = fresh
        return fresh

    def close(self) -> None:
        release_map(self.map)
        self.map = None
        self.file.close()
        self.fd = None


def first_cut_short(sources: Sequence[FileBytes], needed: Sequence[int]) -> tuple[int, int] | None:
    """``(j, size now)`` of the first file shorter than ``needed[j]``, None when none is: one
    ``fstat`` a file, what a copy out of their maps checks first."""
    try:
        sizes = [status.st_size for status in map(os.fstat, [source.fileno() for source in sources])]
    except OSError as e:
        raise TruncatedError(f"{sources[0].name}: cannot read: {e.strerror or e}") from e
    for j, (size, want) in enumerate(zip(sizes, needed)):
        if size < want:
            return j, size
    return None


def release_map(mapped: mmap.mmap | None) -> None:
    """Closes a map now, or leaves it to close with the last view a caller still holds of it."""
    if mapped is not None:
        with contextlib.suppress(BufferError, ValueError):
            mapped.close()


__all__ = ["ByteSource", "FileBytes", "Runs", "cut_short", "first_cut_short", "read_runs", "release_map"]
