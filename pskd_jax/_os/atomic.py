"""Output that replaces its destination whole or not at all.

Every writer of the toolkit writes into a temporary file in the destination's directory, flushes
and syncs it, renames it over the destination and syncs the directory. If anything fails before
the rename, the temporary file is removed and the destination is untouched: a reader sees the old
content or the new, never a torn file.

A writer killed outright (SIGKILL, a power cut) cannot remove its temporary file. Each temporary
file (named by :func:`pskd_jax._os.names.temporary_prefix`) is held under an exclusive ``flock`` by
its writer from its creation to its rename, so the next writer of the same destination removes the
ones no live writer holds (:func:`remove_stale_temporaries`): a rerun leaves nothing behind, and
two writers of one destination never remove each other's file. Where ``flock`` is missing, stale
temporary files are left alone rather than risk another writer's.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import BinaryIO, Iterator

from pskd_jax._os import locks, names
from pskd_jax.errors import TruncatedError


def fsync_directory(directory: str) -> None:
    """Makes a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
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


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux's /proc);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(path: str) -> list[str]:
    """Removes the temporary files that killed writers of ``path`` left beside it; returns them.

    Only regular files named as :mod:`pskd_jax._os.names` names ``path``'s temporary files are
    candidates, and of those only the ones no live writer holds locked (a writer holds its file's
    ``flock`` from creation to rename): a writer running now in another process keeps its file."""
    directory = os.path.dirname(os.path.abspath(path))
    pattern = names.temporary_pattern(path)
    try:
        found = [name for name in os.listdir(directory) if pattern.fullmatch(name)]
    except OSError:
        return []
    removed = []
    for name in found:
        candidate = os.path.join(directory, name)
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, a symbolic link, or not ours to open
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or locks.flock(fd, wait=False) is not True:
                continue  # a live writer holds it, or no lock can tell
            # Remove the name only if it still is the file locked (not one made since under it).
            if os.stat(candidate, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


_ATTEMPTS = 100  # temporary files made before giving up, when a cleanup keeps removing them


def temporary_path_for(path: str) -> tuple[int, str]:
    """Creates a hidden temporary file beside ``path``, locked by the descriptor returned with it
    (keep it open until the file is renamed into place); first removes stale ones of ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(path)
    for _ in range(_ATTEMPTS):
        try:
            fd, temporary = tempfile.mkstemp(prefix=names.temporary_prefix(path), suffix=".tmp", dir=directory)
        except OSError as e:
            raise TruncatedError(f"{path}: cannot create a file in {directory}: {e.strerror}") from e
        except ValueError:  # a NUL in the path
            raise TruncatedError(f"{path!r}: cannot create a file: a path holds no NUL byte") from None
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666 & ~_umask())  # the mode open() would give, not mkstemp's 0600
        # Blocking: another writer's cleanup may hold the new file for an instant (and remove it).
        if locks.flock(fd, wait=True) is None:
            return fd, temporary
        try:
            if os.stat(temporary, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd, temporary
        except FileNotFoundError:
            pass
        os.close(fd)  # removed by a cleanup in that instant: make another
    raise TruncatedError(f"{path}: cannot keep a temporary file in {directory}: each of {_ATTEMPTS} was "
                         "removed as soon as it was made")


def unlocked_temporary_for(path: str, mode: int = 0o644) -> str:
    """Creates an empty hidden temporary file beside ``path`` (named as :func:`temporary_path_for`
    names them, with ``mode`` less the umask) and returns its path, not locked: for a writer that
    opens and locks the file itself, then renames it over ``path`` or removes it. Unlike
    :func:`temporary_path_for`, it removes no stale temporary file: attempts of one destination
    running at once (a retried or speculative task) leave each other's files alone."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=names.temporary_prefix(path), suffix=".tmp", dir=directory)
    except OSError as e:
        raise TruncatedError(f"{path}: cannot create a file in {directory}: {e.strerror}") from e
    try:
        os.fchmod(fd, mode & ~_umask())
    except OSError:
        pass
    finally:
        os.close(fd)
    return temporary


def commit(fd_file: BinaryIO, temporary: str, path: str, *, durable: bool) -> None:
    """Puts a finished temporary file in place of ``path``: flush, sync, rename (while its lock is
    still held), sync the directory."""
    fd_file.flush()
    if durable:
        os.fsync(fd_file.fileno())
    os.replace(temporary, path)


@contextlib.contextmanager
def atomic_output(path: str, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Yields a binary file open for writing; on a clean exit it replaces ``path`` whole.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_output(os.path.join(d, "x.bin")) as f:
    ...     _ = f.write(b"abc")
    >>> open(os.path.join(d, "x.bin"), "rb").read()
    b'abc'
    """
    fd, tmp = temporary_path_for(path)
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            commit(f, tmp, path, durable=durable)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise TruncatedError(f"{path}: {e.strerror or e}") from e
        raise
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


__all__ = ["atomic_output", "commit", "fsync_directory", "remove_stale_temporaries", "temporary_path_for",
           "unlocked_temporary_for"]
