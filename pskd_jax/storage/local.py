"""Local files as a :class:`pskd_jax.storage.base.Store`, with every guarantee the toolkit's local
writers give: a put is an atomic replace (a temporary file beside the destination, synced, renamed,
the directory synced); only regular files are read, listed or removed (a link, a directory, a FIFO
at a key is never followed into, replaced or deleted); conditional puts hold the destination's
save lock while they compare, so two writers of one machine cannot both win.

A key is a path (relative to the working directory, or absolute). A version tag is the file's
device, inode, size and modification time in nanoseconds: an atomic replace always changes the
inode, so a tag read before names exactly the file that was read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.checks import mode_words
from pskd_jax._os.files import open_fd
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.positional import pread_spans, read_into
from pskd_jax.errors import TruncatedError, UsageError
from pskd_jax.storage.base import CREATE, OVERWRITE, Buffer, Changed, Conflict, ObjectInfo, Store, Version


def _tag(found: os.stat_result) -> str:
    return f"{found.st_dev}:{found.st_ino}:{found.st_size}:{found.st_mtime_ns}"


def _regular(path: str) -> os.stat_result | None:
    """The ``lstat`` of a regular file at ``path``; None when nothing is there; E9003 naming what
    stands there otherwise (the store reads and replaces only regular files)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise TruncatedError(f"{path}: cannot look at it: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(found.st_mode):
        raise TruncatedError(f"{path}: {mode_words(found.st_mode)}, not a regular file")
    return found


def _check_tag(fd: int, key: str, tag: str | None) -> None:
    """:class:`Changed` when the file open at ``fd`` is not the version ``tag`` (None: any)."""
    if tag is not None and _tag(os.fstat(fd)) != tag:
        raise Changed(key, tag)


class LocalStore(Store):
    """The local file system (one instance serves every path)."""

    scheme = "file"

    def __repr__(self) -> str:
        return "LocalStore()"

    def url(self, key: str) -> str:
        return key

    def info(self, key: str) -> ObjectInfo | None:
        found = _regular(key)
        return None if found is None else ObjectInfo(key, found.st_size, _tag(found))

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        fd = open_fd(key)
        try:
            found = os.fstat(fd)
            data = bytearray(found.st_size)
            read_into(fd, memoryview(data), 0, key)
        finally:
            os.close(fd)
        return bytes(data), ObjectInfo(key, found.st_size, _tag(found))

    def read_ranges(self, key: str, starts: Sequence[int], stops: Sequence[int], *,
                    coalesce: int | None = None, tag: str | None = None) -> list[Buffer]:
        buffers = [bytearray(int(b) - int(a)) for a, b in zip(starts, stops)]
        if buffers:
            fd = open_fd(key)
            try:
                _check_tag(fd, key, tag)
                pread_spans(fd, [memoryview(b) for b in buffers], [int(a) for a in starts], key)
            finally:
                os.close(fd)
        return buffers

    def read_spans(self, key: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        if spans:
            fd = open_fd(key)
            try:
                pread_spans(fd, [memoryview(span).cast("B") for span in spans], [int(o) for o in offsets], key)
            finally:
                os.close(fd)

    def read_into(self, key: str, offset: int, out: memoryview, *, tag: str | None = None) -> None:
        fd = open_fd(key)
        try:
            _check_tag(fd, key, tag)
            read_into(fd, memoryview(out).cast("B"), offset, key)
        finally:
            os.close(fd)

    def chunks(self, key: str, chunk_bytes: int = 8 << 20) -> Iterator[Buffer]:
        fd = open_fd(key)
        try:
            while True:
                piece = os.read(fd, chunk_bytes)
                if not piece:
                    return
                yield piece
        finally:
            os.close(fd)

    def put(self, key: str, data: Buffer | Iterable[Buffer], *, mode: str | Version = OVERWRITE,
            durable: bool = True, size: int | None = None) -> ObjectInfo:
        pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) or hasattr(data, "__array__") \
            else data
        if mode == OVERWRITE:
            return self._write(key, pieces, durable)
        if mode != CREATE and not isinstance(mode, Version):
            raise ValueError(f"mode {mode!r}")
        with destination_lock(key):
            found = _regular(key)
            if mode == CREATE and found is not None:
                raise Conflict(key, "a file is there already")
            if isinstance(mode, Version) and (found is None or _tag(found) != mode.tag):
                raise Conflict(key, "the file there changed since it was read" if found is not None
                               else "the file read before is gone")
            return self._write(key, pieces, durable)

    def _write(self, key: str, pieces: Iterable[Buffer], durable: bool) -> ObjectInfo:
        if os.path.lexists(key):
            _regular(key)  # refuse (E9003) anything but a regular file at the key
        with atomic_output(key, durable=durable, links="replace") as f:
            for piece in pieces:
                f.write(memoryview(piece).cast("B"))
        found = _regular(key)
        if found is None:
            raise TruncatedError(f"{key}: written, then gone")
        return ObjectInfo(key, found.st_size, _tag(found))

    def delete(self, key: str) -> None:
        """Removes a regular file; anything else at the key (a link, a directory) is left alone."""
        try:
            if not stat.S_ISREG(os.lstat(key).st_mode):
                return
        except (OSError, ValueError):
            return
        try:
            os.unlink(key)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise TruncatedError(f"{key}: cannot remove it: {e.strerror or e}") from e

    def list(self, prefix: str) -> list[ObjectInfo]:
        """The regular files of the directory ``prefix`` (no links, no directories, none of the
        toolkit's temporary or lock files)."""
        directory = prefix or "."
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            raise UsageError(f"{directory}: not a directory") from None
        except OSError as e:
            raise TruncatedError(f"{directory}: cannot list it: {e.strerror or e}") from e
        found = []
        for entry in entries:
            if names.leftover(entry.name) is not None:
                continue  # a temporary or lock file of a writer, not an object
            try:
                if entry.is_file(follow_symlinks=False):
                    found.append(ObjectInfo(os.path.join(prefix, entry.name) if prefix else entry.name,
                                            entry.stat(follow_symlinks=False).st_size,
                                            _tag(entry.stat(follow_symlinks=False))))
            except OSError:
                continue  # gone while listed
        return sorted(found, key=lambda o: o.key)


LOCAL = LocalStore()

__all__ = ["LOCAL", "LocalStore"]
