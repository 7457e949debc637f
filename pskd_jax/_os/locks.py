"""Locks held with ``flock(2)``: the one implementation behind every lock of the toolkit.

A descriptor the caller already has is locked with :func:`flock`; a lock *file* is taken with
:func:`acquire`, given back with :func:`release`, or held for a ``with`` block by :func:`holding`.
Why removing a lock file is safe, and what happens where ``flock`` is missing: ``docs/files.md``
("Locks").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType

from pskd_jax._os import names
from pskd_jax.errors import PskdError, TruncatedError

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: locks are granted without excluding anyone
    fcntl = None


def flock(fd: int, *, wait: bool) -> bool | None:
    """Locks ``fd`` exclusively: True once held; False when ``wait`` is False and another holder
    has it; None where there is no ``flock`` (granted, excluding no one: a caller that would
    remove a file on the strength of the lock must not)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without flock: as where there is no fcntl
        return None
    return True


def _open(path: str, error: type[PskdError], what: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        raise error(f"{what}: cannot open the lock file {path}: {e.strerror or e}") from e
    except ValueError:  # a NUL in the path
        raise error(f"{what!r}: cannot open a lock file: a path holds no NUL byte") from None


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def acquire(path: str, *, wait: bool, error: type[PskdError] = TruncatedError, what: str = "") -> int | None:
    """Takes the lock file ``path`` (creating it) and returns its descriptor, or None when ``wait``
    is False and another holder has it. ``error`` is raised, naming ``what``, when the file cannot
    be opened."""
    while True:
        fd = _open(path, error, what or path)
        if flock(fd, wait=wait) is False:
            os.close(fd)
            return None
        if _same_file(path, fd):
            return fd
        os.close(fd)  # removed (or replaced) by its last holder while this one waited: lock the new one


def release(fd: int, path: str | None = None) -> None:
    """Gives back a lock :func:`acquire` took; with ``path``, removes the lock file first (while
    still held, so that no one locks the old file once the name is gone)."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
    os.close(fd)


@contextlib.contextmanager
def holding(path: str, *, wait: bool = True, remove: bool = False, error: type[PskdError] = TruncatedError,
            what: str = "", busy: Callable[[], PskdError] | None = None) -> Iterator[bool]:
    """Holds the lock file ``path`` for a ``with`` block; yields True once held.

    When another holder has it and ``wait`` is False: raises ``busy()`` when given, else yields
    False (the block then runs without the lock, knowing it). ``remove`` removes the file on the
    way out."""
    fd = acquire(path, wait=wait, error=error, what=what)
    if fd is None:
        if busy is not None:
            raise busy()
        yield False
        return
    try:
        yield True
    finally:
        release(fd, path if remove else None)


@contextlib.contextmanager
def destination_lock(path: str | os.PathLike, *, wait: bool = True) -> Iterator[bool]:
    """One writer of a destination at a time, in any process: holds ``.NAME.lock`` beside
    ``path`` (:func:`pskd_jax._os.names.save_lock`), so that a checkpoint and its layout file
    always come from the same save. Yields True once held (waiting for another writer to finish);
    with ``wait=False``, yields False at once when another writer holds it.

    The lock file is removed by its last holder; one left by a killed writer is reused by the next
    writer of its destination (and removed then)."""
    path = os.fspath(path)
    with holding(names.save_lock(path), wait=wait, remove=True, what=path) as held:
        yield held


__all__ = ["acquire", "destination_lock", "flock", "holding", "release"]
