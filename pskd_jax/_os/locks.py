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
def destination_lock(path: str | os.PathLike, *, wait: bool = True, keep_committing: bool = True) -> Iterator[bool]:
    """One writer of a destination at a time, in any process: holds ``.NAME.lock`` beside
    ``path`` (:func:`pskd_jax._os.names.save_lock`), so that a checkpoint and its layout file
    always come from the same save. Yields True once held (waiting for another writer to finish);
    with ``wait=False``, yields False at once when another writer holds it.

    The lock file is removed by its last holder; one left by a killed writer is reused by the next
    writer of its destination (and removed then) — except one marking a commit cut short
    (:func:`mark_committing`), which is kept until a save commits (unless ``keep_committing`` is
    False: a checkpoint manager's step files, which its index and digests vouch for)."""
    path = os.fspath(path)
    lock = names.save_lock(path)
    fd = acquire(lock, wait=wait, what=path)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        release(fd, None if keep_committing and _committing(fd) else lock)


# What a save writes into its destination's lock file just before it puts its layout file and its
# data in place (two renames: no rename puts two files in place at once), and clears once both are.
# A lock file that still says so, with no writer holding it, is a save cut off between the two: the
# data and the layout file beside it may come from two saves (whose headers may be alike, so that
# the layout's identity cannot tell), and a reader refuses them rather than mix them.
COMMITTING = b"pskd: committing the data and its layout file\n"


def mark_committing(path: str | os.PathLike, *, durable: bool) -> None:
    """Marks the commit of a save of ``path`` under way (its caller holds :func:`destination_lock`)."""
    fd = os.open(names.save_lock(os.fspath(path)), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, COMMITTING, 0)
        if durable:  # (on the disk before either rename is)
            os.fsync(fd)
    finally:
        os.close(fd)


def clear_committing(path: str | os.PathLike) -> None:
    """Ends the mark of :func:`mark_committing`: the data and its layout file are both in place."""
    with contextlib.suppress(OSError):
        fd = os.open(names.save_lock(os.fspath(path)), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def _committing(fd: int) -> bool:
    try:
        return os.pread(fd, len(COMMITTING), 0) == COMMITTING
    except OSError:
        return False


def commit_cut_short(path: str | os.PathLike) -> bool:
    """Whether a save of ``path`` was cut off between putting its layout file and its data in
    place (:data:`COMMITTING`). A save committing now is waited for (its lock, held for the two
    renames only), then looked at again. Nothing is created: a reader leaves no lock file."""
    lock = names.save_lock(os.fspath(path))
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            return False  # (no lock file: no save was cut off)
        try:
            if not _committing(fd):
                return False
            free = flock(fd, wait=False)
            if free is False:  # a live writer is between the two renames: wait for it
                flock(fd, wait=True)
                continue
            return True  # (no writer holds it; or no flock to tell, and the mark says so)
        finally:
            os.close(fd)


__all__ = ["COMMITTING", "acquire", "clear_committing", "commit_cut_short", "destination_lock", "flock", "holding",
           "mark_committing", "release"]
