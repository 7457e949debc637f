"""One writable checkpoint manager a directory: the directory's lock (``.pskd-checkpoints.lock``, an
``flock`` refused at once to another process), and this process's registry of the managers that
hold one, so that a new manager of a directory (a notebook cell run twice) takes the lock over from
the one before instead of being refused by its own process.
"""

from __future__ import annotations

import os
import stat
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from pskd_jax._os import locks, names
from pskd_jax._os.checks import mode_words
from pskd_jax.errors import CheckpointDirectoryError

LOCK = names.CHECKPOINT_LOCK  # held by the manager that has the directory open


class HandsOver(Protocol):
    """A holder of a directory's lock that can give it to a newer holder in the same process."""

    def _hand_over(self) -> int | None: ...


class DirectoryHold:
    """The lock descriptor a manager holds: closed (the lock released) once, by :meth:`release` or
    when the manager is collected, unless it was handed to another manager (:meth:`detach`)."""

    def __init__(self, owner: object, fd: int):
        self._finalizer = weakref.finalize(owner, os.close, fd)

    def release(self) -> None:
        """Releases the lock (once)."""
        self._finalizer()

    def detach(self) -> int | None:
        """The descriptor, no longer closed by this hold (for a manager that takes over); None when
        it was released or detached already."""
        detached = self._finalizer.detach()
        return detached[2][0] if detached is not None else None


# The writable managers of this process, by directory (device, inode), with the process that made
# each: a forked child's copy of the registry names managers that hold nothing it may take over.
_OPEN: dict[tuple[int, int], tuple[weakref.ref[HandsOver], int]] = {}
_OPEN_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def directory_key(directory: str) -> tuple[int, int]:
    """What identifies a directory whatever path leads to it; E9014 when it is no directory."""
    try:
        found = os.stat(directory)
    except OSError as e:
        raise CheckpointDirectoryError(f"{directory}: cannot open the checkpoint directory: {e.strerror or e}") from e
    if not stat.S_ISDIR(found.st_mode):
        raise CheckpointDirectoryError(f"{directory}: {mode_words(found.st_mode)}, not a directory")
    return found.st_dev, found.st_ino


def lock_directory(directory: str) -> int:
    """Takes ``DIR/.pskd-checkpoints.lock`` and returns its descriptor, or refuses at once (E9014
    naming the directory) when another manager holds it."""
    path = os.path.join(directory, LOCK)
    try:
        fd = locks.acquire(path, wait=False, error=CheckpointDirectoryError, what=directory)
    except CheckpointDirectoryError as e:
        raise CheckpointDirectoryError(f"{e.message} (to only read the checkpoints, open the directory with "
                                       "read_only=True)") from e.__cause__
    if fd is None:
        raise CheckpointDirectoryError(f"{directory}: another CheckpointManager has this checkpoint directory "
                                       f"open (it holds {path}); close it first, or open this one with "
                                       "read_only=True to only read")
    return fd


def open_directory(directory: str, owner: HandsOver, recover: Callable[[DirectoryHold], None]) -> None:
    """Gives ``owner`` the hold of ``directory``'s lock: taken over from this process's manager of
    the directory when one still holds it (it waits for that one's save), else acquired (refused
    when another process holds it). ``recover`` runs with the hold once the lock is held (and
    keeps it); if it fails, the lock is released and its error raised. The owner is then the one
    a later manager of the directory in this process takes over from."""
    key = directory_key(directory)
    with _OPEN_LOCK:
        reference, pid = _OPEN.get(key, (None, None))
        previous = reference() if reference is not None and pid == os.getpid() else None
        fd = previous._hand_over() if previous is not None else None
        hold = DirectoryHold(owner, fd if fd is not None else lock_directory(directory))
        try:
            recover(hold)
        except BaseException:
            hold.release()
            raise
        _OPEN[key] = (weakref.ref(owner), os.getpid())


__all__ = ["LOCK", "DirectoryHold", "HandsOver", "directory_key", "lock_directory", "open_directory"]
