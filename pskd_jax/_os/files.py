"""Opening the files the toolkit reads: regular files only, never blocking, errors that name them.

:func:`open_regular` opens without blocking, looks at what it opened, and refuses anything but a
regular file (E9002) before a byte is read (``docs/files.md``, "Inputs").
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from pskd_jax.errors import NotPskdError, PskdError, TruncatedError, UsageError


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # how a URL starts (pskd_jax.storage.urls): never a local path


# How a URL is read: set by pskd_jax.storage when it is imported (the layer above, which this one
# must not import), as it is before any input is read (the format layer reads through it). It gives
# a descriptor of the bytes the URL names: ``url_descriptor(url, error, what)``.
url_descriptor: Callable[[str, type[PskdError], str], int] | None = None


def out_of_descriptors(e: BaseException) -> str:
    """For an error that is the process's own lack of file descriptors (EMFILE, ENFILE), what to
    do about it (to add to the message naming the file it could not open); "" for any other."""
    seen: BaseException | None = e
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE)):
        seen = seen.__cause__ or seen.__context__  # (an error of the toolkit's made of the OSError)
    if seen is None:
        return ""
    soft = descriptor_limit()
    limit = f" ({soft} here)" if soft is not None else ""
    return (f": the process has no file descriptor left, its limit{limit} reached (a corpus read with "
            "access='pread' holds one open a shard): raise the limit (ulimit -n)")


UNLIMITED_DESCRIPTORS = 1 << 17  # what an unlimited soft limit of open files counts as


def descriptor_limit() -> int | None:
    """The process's soft limit of open files now (:data:`UNLIMITED_DESCRIPTORS` for none); None
    where it cannot be read (off Unix)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # (no resource module off Unix)
        return None
    return UNLIMITED_DESCRIPTORS if soft == resource.RLIM_INFINITY else soft


def same_place(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Whether two local paths name one place: the same string, the same real path (``x`` and
    ``./x``, a link and its target, also for a file not there), or what is there now one file
    (a hard link). Strings that are no path (a URL) are the same place only when equal."""
    first, second = os.fspath(first), os.fspath(second)
    if first == second:
        return True
    if _URL.match(first) or _URL.match(second):
        return False
    try:
        return os.path.realpath(first) == os.path.realpath(second) or os.path.samefile(first, second)
    except (OSError, ValueError):
        return False


def fsync_directory(directory: str) -> None:
    """Makes a rename inside ``directory`` durable (a no-op where directories cannot be opened).
    (Here, below both pskd_jax._os.atomic and pskd_jax._os.locks, which both call it.)"""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_fd(path: str | os.PathLike, error: type[PskdError] = TruncatedError, what: str = "") -> int:
    """A read-only descriptor of the regular file ``path``. E9002 when it is anything else;
    ``error`` (E9003 by default) naming the file (and ``what`` it is) when it cannot be opened."""
    name = os.fspath(path)
    if isinstance(path, str) and _URL.match(path):  # (a URL is never opened as a local path "s3:/…")
        if url_descriptor is None:
            raise error(f"{name}: a URL, which only pskd_jax.storage reads, and it is not loaded")
        return url_descriptor(name, error, what)
    what = f" {what}" if what else ""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{name}: cannot read{what}: {e.strerror or e}") from e
    except ValueError:  # a NUL in the path
        raise error(f"{name!r}: cannot read{what}: a path holds no NUL byte") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise error(f"{name}: cannot read{what}: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotPskdError(f"{name}: {_kind(mode)}, not a regular file; give a file")
    return fd


def check_regular(fd: int, path: str | os.PathLike) -> None:
    """Refuses (E9012) an output descriptor that is not a regular file: a writer that opens its
    file itself (a shard written in place) never writes into a FIFO or a device that stood at its
    name. The descriptor is left open for the caller to close."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        raise TruncatedError(f"{os.fspath(path)}: cannot write: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        raise UsageError(f"{os.fspath(path)}: {_kind(mode)} stands there; an output replaces only a regular file")


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, error: type[PskdError] = TruncatedError, *, what: str = "",
                 buffering: int = 0) -> Iterator[io.FileIO | io.BufferedReader]:
    """:func:`open_fd` as a binary file object, closed on the way out. Its size at opening is
    kept: :func:`read_some` then tells a file cut short while it is read from its end (E9003)."""
    with open(open_fd(path, error, what), "rb", buffering=buffering) as f:
        assert isinstance(f, io.FileIO | io.BufferedReader)  # what "rb" opens, unbuffered or buffered
        try:
            # Both take attributes at run time; their stubs declare none beyond their own.
            f.size_at_open = os.fstat(f.fileno()).st_size  # type: ignore[union-attr]
        except (OSError, AttributeError):
            pass
        yield f


def read_some(f: BinaryIO, path: str | os.PathLike, size: int, error: type[PskdError] = TruncatedError) -> bytes:
    """Up to ``size`` bytes of ``f`` (all that is left with -1); an OS error becomes ``error``.

    For a file of :func:`open_regular`, the end of the file before the size it had when opened is
    E9003 naming it (it was cut short while read), never a silently shorter input."""
    expected = getattr(f, "size_at_open", None)
    try:
        before = f.tell() if expected is not None else 0
        data = f.read(size)
    except OSError as e:
        raise error(f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e
    if expected is not None and size != 0 and (size < 0 or not data) and before + len(data) < expected:
        raise TruncatedError(f"{os.fspath(path)}: cut short while being read: it ends at byte {before + len(data)}, "
                             f"it had {expected} bytes when opened")
    return data


def read_whole(path: str | os.PathLike, error: type[PskdError] = TruncatedError, *, what: str = "",
               limit: int | None = None) -> bytes:
    """The bytes of a small regular file (a vocabulary, a manifest, a layout); ``error`` names the
    file when it cannot be read or, with ``limit``, when it is larger than that."""
    with open_regular(path, error, what=what, buffering=-1) as f:
        if limit is not None:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise error(f"{os.fspath(path)}: {size} bytes, more than the {limit} such a file may have")
        return read_some(f, path, -1, error)


def line_at(path: str | os.PathLike, offset: int, *, block: int = 1 << 17) -> int:
    """The 1-based line of byte ``offset`` of a file: one more than the line feeds before it.

    For error messages only: the hot paths never count lines, and this reads the file again."""
    line = 1
    with open_regular(path, buffering=-1) as f:
        while offset > 0:
            data = read_some(f, path, min(offset, block))
            if not data:
                break
            line += data.count(b"\n")
            offset -= len(data)
    return line


__all__ = ["check_regular", "fsync_directory", "line_at", "open_fd", "open_regular", "out_of_descriptors", "read_some",
           "read_whole"]
