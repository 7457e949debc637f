"""Where a source's bytes come from, kept apart from which bytes a read needs.

A source of samples (:class:`~pskd_jax.format.reader.Reader`, ``CorpusWindows``) works out which
bytes a gather needs, as :class:`Runs` (runs of consecutive records or tokens), and asks its
:class:`ByteSource` for them. Two kinds of byte source:

- :class:`FileBytes`, a local regular file, read through a memory map (``access="mmap"``) or
  with positional reads (``access="pread"``);
- :class:`StoreBytes`, an object of a :class:`~pskd_jax.storage.Store` (``s3://``, ``gs://``,
  ``memory://``), read by byte ranges: the spans of one read, overlapping or touching ones
  merged into one range, go to the store in one batched call (many requests in flight), a
  large span straight into its destination buffer; the spans of several objects (a gather over
  many shards) are read concurrently, one batched call an object. It has no map. An object
  that is a checkpoint's *parts index* (several processes saved it to a bucket) is served as
  the checkpoint file its parts hold, each range read from the part that holds it
  (:mod:`pskd_jax.format.parts_index`), so that every reader of ``.psk.d`` bytes sees the file.

See ``docs/format.md`` (Sources of samples) and ``docs/storage.md`` (Reading).
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import math
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import numpy as np

from pskd_jax._os.digests import BLOCK
from pskd_jax._os.files import open_fd, read_whole
from pskd_jax._os.maps import KEPT_DESCRIPTORS, map_read_only
from pskd_jax._os.positional import pread_runs, pread_spans, read_into
from pskd_jax.errors import NotPskdError, PskdError, TruncatedError, UsageError
from pskd_jax.format.parts_index import PREFIX, PartsIndex, index_of
from pskd_jax.storage import Changed, Location, ObjectInfo, StorageOptions, Store, locate, merged_ranges, store_for

BATCH_ALIGNMENT = 64  # bytes: what JAX's CPU backend needs to take a host array without copying it


def aligned_empty(shape: int | Sequence[int], dtype: np.dtype | type) -> np.ndarray:
    """A new uninitialised C-contiguous array whose first byte sits on a ``BATCH_ALIGNMENT``
    boundary: what every gather fills. ``jax.device_put`` on the CPU backend then aliases it
    (numpy's own allocations are only 16-byte aligned, and are copied). The array is fresh: the
    caller owns it, and nothing here writes to it again."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = dtype.itemsize * math.prod(shape)
    raw = np.empty(nbytes + BATCH_ALIGNMENT, np.uint8)
    skip = -raw.__array_interface__["data"][0] % BATCH_ALIGNMENT
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)


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

    can_map = False  # whether :meth:`mapped` gives a map (a local file) or never does (an object)

    @property
    def closed(self) -> bool:
        return False

    def header_stream(self) -> BinaryIO:
        """A binary stream of the bytes from the start, for reading a header with plain reads."""
        return io.BufferedReader(_RangedStream(self), HEADER_READ)

    def blocks(self, stop: int, block: int = BLOCK) -> Iterator[memoryview]:
        """The bytes ``[0, stop)`` in order, a block at a time (for a digest of the whole): each
        block valid until the next is asked for. E9003 when they end first."""
        buffer = np.empty(max(1, min(block, stop)), np.uint8)
        view = buffer.data
        position = 0
        while position < stop:
            n = min(len(buffer), stop - position)
            self.read_at(view[:n], position)
            yield view[:n]
            position += n

    # Not abstract on purpose: a source that holds nothing has nothing to let go of.
    def close(self) -> None:  # noqa: B027
        """Lets go of what the source holds."""


def read_runs(sources: Sequence[ByteSource], runs: Runs, out: np.ndarray, name: str) -> np.ndarray:
    """Fills ``out`` (C-contiguous) with the bytes of ``runs``, and returns it. ``name`` (what the
    caller opened: a file, a manifest) names a failure that more than one source shares."""
    if len(runs.lengths) >= MANY_RUNS and _read_files_together(sources, runs, out, name):
        return out
    spans = runs.spans(out)
    if spans:
        offsets = runs.offsets.tolist()
        if runs.sources is None:
            sources[0].read_spans(spans, offsets)
        else:
            which = runs.sources.tolist()
            kinds = {type(sources[k]) for k in set(which)}
            if len(kinds) == 1:
                kinds.pop().read_spans_of(sources, which, spans, offsets, name)
            else:  # (shards of a store, some of them read from copies in a local cache)
                for kind in kinds:
                    mine = [j for j, k in enumerate(which) if type(sources[k]) is kind]
                    kind.read_spans_of(sources, [which[j] for j in mine], [spans[j] for j in mine],
                                       [offsets[j] for j in mine], name)
    return out


MANY_RUNS = 4  # runs of local files read in one batched system call from this many on


def _read_files_together(sources: Sequence[ByteSource], runs: Runs, out: np.ndarray, name: str) -> bool:
    """Reads ``runs`` in one batched call when every one is of an open local file (one system call
    for a gather's windows rather than one a window); False, having read nothing, otherwise."""
    if runs.sources is None:
        first = sources[0]
        if type(first) is not FileBytes or first.fd is None:
            return False
        fds = np.full(len(runs.lengths), first.fd, np.int64)
    else:
        used = range(len(sources)) if len(sources) <= 16 else np.unique(runs.sources).tolist()
        table = np.full(len(sources), -1, np.int64)
        for k in used:  # (the sources the runs touch: a few shards of a corpus of thousands)
            source = sources[k]
            if type(source) is FileBytes and source.fd is not None:
                table[k] = source.fd
        fds = table.take(runs.sources)
        if int(fds.min()) < 0:  # (a run of an object, or of a closed file: read the usual way)
            return False
    return pread_runs(fds, out, runs.starts, runs.lengths, runs.offsets, name)


def cut_short(where: str, size: int, needed: int, what: str) -> TruncatedError:
    """The error for bytes that were cut short since they were opened (a file rewritten in place)."""
    return TruncatedError(f"{where}: truncated since it was opened: {size} bytes now, {needed} needed for {what}")


HEADER_READ = 64 << 10  # a header is read from the first bytes of a source, this many at a time


class _RangedStream(io.RawIOBase):
    """The bytes of a source from its start, as a raw stream (each read one positional read)."""

    def __init__(self, source: ByteSource) -> None:
        self.source, self.position, self.end = source, 0, source.size()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # (the io module's signature)
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.end - self.position))
        if n:
            self.source.read_at(view[:n], self.position)
            self.position += n
        return n


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

    can_map = True

    @property
    def closed(self) -> bool:
        return self.fd is None

    def header_stream(self) -> BinaryIO:
        self.file.seek(0)
        return self.file

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


class MappedFile(ByteSource):
    """A local regular file mapped whole, read through its map, ``mapped(size)`` that map; it
    takes over the descriptor it is made from, and keeps it only while the process's budget of
    kept descriptors allows (:data:`pskd_jax._os.maps.KEPT_DESCRIPTORS`: half the soft limit), so
    that a corpus of any number of shards opens.

    :meth:`size` guards a copy out of the map against a file cut short in place: the end of the
    kept descriptor (one ``lseek``), or without one the size of the file its path names while that
    is still this file (device and inode, one ``stat``). A file renamed over or removed at its path is then no
    longer reachable by its name to be cut short: its mapped bytes stay whole, and its size is the
    mapped size. Reads (a verification) use ``preadv`` of the kept descriptor, or of the path
    opened for the moment of the read while it still names this file, a file cut short meanwhile
    being E9003 and never a fault of the map; otherwise they copy from the map."""

    can_map = True

    def __init__(self, path: str, fd: int, size: int) -> None:
        try:
            status = os.fstat(fd)
            self.name, self.identity, self.length = path, (status.st_dev, status.st_ino), size
            self.map: np.ndarray | None = map_read_only(fd, size) if size else np.zeros(0, np.uint8)
        except BaseException:
            os.close(fd)
            raise
        self.fd: int | None = fd if KEPT_DESCRIPTORS.take() else None
        if self.fd is None:
            os.close(fd)

    def _open_same(self) -> int | None:
        """A descriptor of the file at the path when it is still this file, else None."""
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        status = os.fstat(fd)
        if (status.st_dev, status.st_ino) == self.identity:
            return fd
        os.close(fd)
        return None

    def size(self) -> int:
        if self.map is None:
            raise TruncatedError(f"{self.name}: the file was closed")
        if self.fd is not None:
            try:
                # (the end's offset is the size: a third of fstat's cost from Python, which builds
                # a whole stat result; nothing reads this private descriptor by its offset)
                return os.lseek(self.fd, 0, os.SEEK_END)
            except OSError as e:
                raise TruncatedError(f"{self.name}: cannot read: {e.strerror or e}") from e
        try:
            status = os.stat(self.name)
        except OSError:
            return self.length  # (removed at its name, or out of reach: the mapped file stays whole)
        return status.st_size if (status.st_dev, status.st_ino) == self.identity else self.length

    def read_spans(self, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        mapped = self.mapped(self.length)
        if self.fd is not None:
            pread_spans(self.fd, spans, offsets, self.name)
            return
        fd = self._open_same()
        if fd is not None:
            try:
                pread_spans(fd, spans, offsets, self.name)
            finally:
                os.close(fd)
            return
        for span, offset in zip(spans, offsets):
            if offset + len(span) > self.length:
                raise TruncatedError(f"{self.name}: {len(span)} bytes at {offset} asked of a file of {self.length}")
            assert mapped is not None
            np.frombuffer(span, np.uint8)[:] = mapped[offset : offset + len(span)]

    @property
    def closed(self) -> bool:
        return self.map is None

    def header_stream(self) -> BinaryIO:
        return io.BufferedReader(_RangedStream(self))

    def mapped(self, size: int) -> np.ndarray | None:  # type: ignore[override]
        """The map as bytes (None for an empty file); E9003 once closed or for another size."""
        if self.map is None:
            raise TruncatedError(f"{self.name}: the file was closed")
        if size != self.length:
            raise TruncatedError(f"{self.name}: mapped at {self.length} bytes, not {size}")
        return self.map if size else None

    def close(self) -> None:
        self.map = None  # (unmapped with the last view of it)
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            os.close(fd)
            KEPT_DESCRIPTORS.give_back()

    def __del__(self) -> None:
        try:  # (one collected without close(): its descriptor, and its place in the budget, given back)
            self.close()
        except Exception:
            pass


LARGE_SPAN = 8 << 20  # a span this long is read in parts straight into its buffer (Store.read_into)
# Runs at most this many bytes apart are read in one request. 0: one request a contiguous run, so
# that only the bytes a read needs cross the network (the client's own default, 1 MiB, reads most
# of a shard for a batch of random windows: fewer requests, many more bytes; see docs/storage.md).
COALESCE = 0
POOL_THREADS = 16  # the most objects of one read in flight at once


class StoreBytes(ByteSource):
    """An object of a :class:`~pskd_jax.storage.Store`, read by byte ranges (see the module's
    documentation). Its size and version tag are the ones the store gave when it was opened: an
    object is written whole and never grows, a read past its end now is E9003, and every read is
    conditioned on that version (an ``If-Match`` on each request, no request more), so that the
    bytes of two versions are never mixed: an object replaced since it was opened is ``changed``
    (an error class, default E9003) naming its URL.

    An object that is a *parts index* (a checkpoint several processes saved to a bucket, see
    :mod:`pskd_jax.format.parts_index`) stands for the checkpoint file its parts hold: its size is
    that file's, and each range is read from the part(s) holding it, each part's ranges batched
    as a plain object's are and conditioned on the part's version seen at opening, the parts in
    flight together. The parts are looked at when it opens (E9003 naming the index and the part
    when one is missing or not its listed size). ``parts`` is that index, ``part_tags`` the parts'
    version tags then; ``info`` is the object at the key itself (the index, for such a checkpoint).

    ``info``: what the caller was already told of a plain object (no request is then made to
    open it, and it is taken to be no parts index)."""

    def __init__(self, store: Store, key: str, *, info: ObjectInfo | None = None,
                 error: type[PskdError] = NotPskdError, changed: type[PskdError] = TruncatedError) -> None:
        self.store, self.key = store, key
        self.name = store.url(key)
        self.parts: PartsIndex | None = None
        self.part_tags: tuple[str, ...] = ()
        if info is None:
            found = store.head(key, len(PREFIX))  # (its size, tag and first bytes: one request)
            if found is None:
                raise error(f"{self.name}: no such object")
            first, info = found
            index = index_of(store, key, first, info, self.name)
            if index is not None:
                self.parts, info = index
                self.part_tags = self.parts.looked_at(store, self.name)
        self.info = info
        self._replaced_error = changed
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self) -> None:
        if self._closed:
            raise TruncatedError(f"{self.name}: the object's reader was closed")

    def size(self) -> int:
        self._open()
        return self.info.size if self.parts is None else self.parts.size

    def _replaced(self, key: str) -> PskdError:
        if key == self.key:
            return self._replaced_error(f"{self.name}: the object was replaced since it was opened (it was version "
                                        f"{self.info.tag}, of {self.info.size} bytes); its bytes are not mixed with "
                                        "another version's: open it anew")
        return self._replaced_error(f"{self.name}: part {self.store.url(key)} was replaced since the checkpoint was "
                                    "opened; its bytes are not mixed with another save's: open it anew")

    def read_spans(self, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        self._open()
        if self.parts is None:
            self._read_object(self.key, self.info.tag, spans, offsets)
            return
        pieces = self.parts.pieces(spans, offsets, self.name)
        keys, tags = self.parts.keys, self.part_tags
        all_done([functools.partial(self._read_object, keys[part], tags[part], views, places)
                  for part, (views, places) in sorted(pieces.items())])

    def _read_object(self, key: str, tag: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        try:
            read_object(self.store, key, spans, offsets, tag=tag)
        except Changed:
            raise self._replaced(key) from None

    def read_at(self, buffer: memoryview, offset: int) -> None:
        if len(buffer) >= LARGE_SPAN and self.parts is None:
            self._open()
            self._read_object(self.key, self.info.tag, [buffer], [offset])
        else:
            self.read_spans([buffer], [offset])

    @classmethod
    def read_spans_of(cls, sources: Sequence[ByteSource], which: Sequence[int], spans: Sequence[memoryview],
                      offsets: Sequence[int], name: str) -> None:
        """One batched call an object, the objects' calls in flight together; every call is waited
        for before an error is raised (none may still write into the caller's buffers)."""
        grouped: dict[int, tuple[list[memoryview], list[int]]] = {}
        for k, span, offset in zip(which, spans, offsets):
            mine = grouped.setdefault(k, ([], []))
            mine[0].append(span)
            mine[1].append(offset)
        all_done([functools.partial(sources[k].read_spans, mine_spans, mine_offsets)
                  for k, (mine_spans, mine_offsets) in grouped.items()])

    def blocks(self, stop: int, block: int = BLOCK) -> Iterator[memoryview]:
        """The object streamed whole (one request), in chunks of about ``block`` bytes; E9003 when
        it is not ``stop`` bytes long. The file a parts index stands for is read by ranges, in
        order, and E9003 says when a part was replaced before the last block was read."""
        self._open()
        if stop != self.size():
            raise UsageError(f"{self.name}: blocks of an object are its whole {self.size()} bytes, not {stop}")
        if self.parts is not None:
            yield from super().blocks(stop, block)
            self.check_unchanged()
            return
        for chunk in self.store.chunks(self.key, block):
            yield memoryview(chunk).cast("B")

    def changed(self) -> str | None:
        """What changed at the key since the source opened, in words (removed, replaced, a part
        replaced or gone), or None when nothing did (each object looked at again)."""
        found = self.store.info(self.key)
        if found is None or found.tag != self.info.tag:
            return f"{self.name}: {'removed' if found is None else 'replaced by another object'} since it was opened"
        if self.parts is not None:
            return self.parts.changed(self.store, self.part_tags, self.name)
        return None

    def check_unchanged(self) -> None:
        """E9003 unless every part is still the one looked at when the source opened."""
        if self.parts is not None:
            moved = self.parts.changed(self.store, self.part_tags, self.name)
            if moved is not None:
                raise TruncatedError(f"{moved}: what was read may mix two saves; open it again")

    def close(self) -> None:
        self._closed = True


def read_object(store: Store, key: str, spans: Sequence[memoryview], offsets: Sequence[int], *,
                tag: str | None = None) -> None:
    """Fills each span from the object ``key``: a large span straight into its buffer (in parts,
    concurrently), the others merged where they overlap or touch and read in one batched call;
    every request conditioned on version ``tag`` when given (:class:`~pskd_jax.storage.Changed`
    when the object is another version now)."""
    small = [(span, offset) for span, offset in zip(spans, offsets) if 0 < len(span) < LARGE_SPAN]
    for span, offset in zip(spans, offsets):
        if len(span) >= LARGE_SPAN:
            store.read_into(key, int(offset), span, tag=tag)  # in parts, concurrently, in place
    if not small:
        return
    starts, stops, which = merged_ranges([o for _, o in small], [len(s) for s, _ in small])
    found = store.read_ranges(key, starts, stops, coalesce=COALESCE, tag=tag)
    for (span, offset), k in zip(small, which):
        got = memoryview(found[k]).cast("B")
        skip = int(offset) - starts[k]
        span[:] = got[skip : skip + len(span)]


def all_done(calls: Sequence[Callable[[], None]]) -> None:
    """Runs the calls (reads of several objects) concurrently, one after the other when there is
    only one; every call is waited for before the first error is raised, so that none may still
    write into a caller's buffers."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    # A pool of the read's own (its threads gone when it returns: nothing lingers after a
    # read, nothing to survive a fork); a thread costs little beside a request.
    with concurrent.futures.ThreadPoolExecutor(min(POOL_THREADS, len(calls)),
                                               thread_name_prefix="pskd-ranges") as pool:
        futures = [pool.submit(call) for call in calls]
        concurrent.futures.wait(futures)
    for future in futures:
        future.result()


def open_bytes(place: str | os.PathLike | Location, storage: StorageOptions | None = None,
               error: type[PskdError] = NotPskdError) -> ByteSource:
    """The bytes of a ``.psk.d`` file or object: a local path or ``file://`` URL as a
    :class:`FileBytes`, an object URL (``s3://``, ``gs://``, ``memory://``) as a
    :class:`StoreBytes` (E9018 for a scheme the toolkit cannot serve, or without the client)."""
    where = locate(place)
    if where.is_local:
        return FileBytes(where.path, error=error)
    return StoreBytes(store_for(where, storage), where.key, error=error)


def read_small(place: str | os.PathLike | Location, error: type[PskdError], *, what: str = "", limit: int,
               storage: StorageOptions | None = None) -> bytes:
    """The bytes of a small file or object (a manifest, a layout file), whole: a local one through
    :func:`~pskd_jax._os.files.read_whole`, an object in one request. ``error`` names it when it is
    missing, cannot be read, or is larger than ``limit`` (a store that keeps failing is E9018)."""
    where = locate(place)
    if where.is_local:
        return read_whole(where.path, error, what=what, limit=limit)
    store = store_for(where, storage)
    try:
        data, _ = store.get(where.key)
    except TruncatedError:  # (the store's E9003: no such object)
        raise error(f"{where.url}: no such object{' (' + what + ')' if what else ''}") from None
    if len(data) > limit:
        raise error(f"{where.url}: {len(data)} bytes, more than the {limit} such a file may have")
    return data


def first_cut_short(sources: Sequence[ByteSource], needed: Sequence[int]) -> tuple[int, int] | None:
    """``(j, size now)`` of the first file shorter than ``needed[j]``, None when none is: one
    ``fstat`` or ``lseek`` (a :class:`MappedFile` without a descriptor: one ``stat``) a file, what
    a copy out of their maps checks first."""
    sizes = [source.size() for source in sources]
    for j, (size, want) in enumerate(zip(sizes, needed)):
        if size < want:
            return j, size
    return None


def release_map(mapped: mmap.mmap | None) -> None:
    """Closes a map now, or leaves it to close with the last view a caller still holds of it."""
    if mapped is not None:
        with contextlib.suppress(BufferError, ValueError):
            mapped.close()


__all__ = ["BATCH_ALIGNMENT", "COALESCE", "HEADER_READ", "LARGE_SPAN", "ByteSource", "FileBytes", "MappedFile", "Runs",
           "StoreBytes", "aligned_empty", "all_done", "cut_short", "first_cut_short", "merged_ranges", "open_bytes",
           "read_object", "read_runs", "read_small", "release_map"]
