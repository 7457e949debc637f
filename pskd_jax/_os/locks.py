"""Locks held with ``flock(2)``: the one implementation behind every lock of the toolkit.

A descriptor the caller already has is locked with :func:`flock`; a lock *file* is taken with
:func:`acquire`, given back with :func:`release`, or held for a ``with`` block by :func:`holding`.
Why removing a lock file is safe, and what happens where ``flock`` is missing: ``docs/files.md``
("Locks").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from types import ModuleType

from pskd_jax._os import names
from pskd_jax._os.files import fsync_directory
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

    A commit that a killed writer left marked (:func:`mark_committing`) is settled as soon as the
    lock is held: its data file and layout file are then one save's pair
    again, before this writer does anything. So is a commit of this writer's own that an error cut
    short, on the way out. The lock file is removed by its last holder; one left by a killed writer
    is reused by the next writer of its destination (and removed then) — except one still marking
    a commit that could not be settled (a file that could not be renamed or removed), which is kept
    for readers; and one whose mark does not say which data is the new one, unless
    ``keep_committing`` is False (a checkpoint manager's step files, which its index and digests
    vouch for)."""
    path = os.fspath(path)
    lock = names.save_lock(path)
    fd = acquire(lock, wait=wait, what=path)
    if fd is None:
        yield False
        return
    try:
        try:
            _settle_held(path, fd)
        except OSError as e:
            raise TruncatedError(f"{path}: cannot put back in order the commit a killed save of it left "
                                 f"({lock}): {e.strerror or e}") from e
        yield True
    finally:
        with contextlib.suppress(OSError):
            _settle_held(path, fd)
        left = _mark(fd)  # (a mark still there: one that could not be settled, kept for readers)
        release(fd, None if left is not None and (keep_committing or left.data is not None) else lock)


# What a save writes into its destination's lock file just before it puts its layout file and its
# data in place (two renames: no rename puts two files in place at once), and clears once both are:
# this line, then one line of JSON saying which data file is the new one ("data": its st_dev,
# st_ino and st_size; a rename keeps them), whether the layout file the commit replaces or removes
# is kept meanwhile under a second name ("before": names.layout_before), and whether the commit
# puts a layout file of its own in place ("layout"). A lock file that still says so, with no writer
# holding it, is a save cut off between the two renames: the data there tells which save's pair
# stands (CutShort), and the next writer puts that pair back in order (destination_lock).
COMMITTING = b"pskd: committing the data and its layout file\n"
_MARK_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class CutShort:
    """A commit a killed writer left marked, as its mark says (:data:`COMMITTING`). ``data`` is
    None for a mark that says nothing more (which save's pair stands cannot then be told)."""

    data: tuple[int, int, int] | None
    before: bool = False
    layout: bool = False

    def committed(self, path: str | os.PathLike) -> bool:
        """Whether the data file at ``path`` is the commit's new one (its second rename done: the
        layout file in place is the new one too); False when it is the old one."""
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return False
        return self.data == (st.st_dev, st.st_ino, st.st_size)


def _identity(data: int | str) -> tuple[int, int, int]:
    st = os.fstat(data) if isinstance(data, int) else os.stat(data, follow_symlinks=False)
    return st.st_dev, st.st_ino, st.st_size


def keep_layout_before(path: str | os.PathLike, *, durable: bool) -> bool:
    """Before a commit replaces or removes the layout file of ``path`` (its caller holds
    :func:`destination_lock`): gives the regular file standing at
    :func:`~pskd_jax._os.names.layout_path_for` a second name, :func:`~pskd_jax._os.names.layout_before`
    (a hard link; a copy where the file system has none), so that a commit cut short can be read
    as the old pair. False when no regular file stands there (the old save had no layout file)."""
    path = os.fspath(path)
    layout, kept = names.layout_path_for(path), names.layout_before(path)
    _remove_kept(kept)
    try:
        if not stat.S_ISREG(os.lstat(layout).st_mode):
            return False
    except FileNotFoundError:
        return False
    try:
        os.link(layout, kept, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:  # (no hard links here: a copy, whole before the mark that names it)
        with open(layout, "rb") as source:
            content = source.read()
        fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            _write_whole(fd, content)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    return True


def mark_committing(path: str | os.PathLike, *, data: int | str, before: bool, layout: bool,
                    durable: bool) -> None:
    """Marks the commit of a save of ``path`` under way (its caller holds :func:`destination_lock`):
    ``data`` is the new data file (a descriptor, or the path of its temporary file), ``before``
    what :func:`keep_layout_before` returned, ``layout`` whether the commit renames a layout file
    into place. Durable: the mark, and the names made so far (the lock, the kept layout), are on
    the disk before either rename is."""
    path = os.fspath(path)
    dev, ino, size = _identity(data)
    line = json.dumps({"data": [dev, ino, size], "before": before, "layout": layout}, separators=(",", ":"))
    fd = os.open(names.save_lock(path), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, 0)
        try:
            _write_whole(fd, COMMITTING + line.encode("ascii") + b"\n")
        except BaseException:
            os.ftruncate(fd, 0)  # (nothing renamed yet: no mark rather than half of one)
            raise
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


def _write_whole(fd: int, data: bytes) -> None:
    """Writes ``data`` at the start of the file open as ``fd`` (a short write is an error)."""
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.EFBIG, "a short write")


def clear_committing(path: str | os.PathLike) -> None:
    """Ends the mark of :func:`mark_committing`: the data and its layout file are both in place.
    The kept old layout file goes first (a kill between the two leaves a mark whose data is the
    new one, which reads as the new pair)."""
    path = os.fspath(path)
    _remove_kept(names.layout_before(path))
    with contextlib.suppress(OSError):
        fd = os.open(names.save_lock(path), os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def _remove_kept(kept: str) -> None:
    """Removes what stands at a :func:`~pskd_jax._os.names.layout_before` name (a directory there
    is not the toolkit's: left, and refused by the link that follows)."""
    try:
        mode = os.lstat(kept).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(kept)


def _mark(fd: int) -> CutShort | None:
    """The mark in the lock file open as ``fd``; None when there is none."""
    try:
        content = os.pread(fd, _MARK_BYTES, 0)
    except OSError:
        return None
    if not content.startswith(COMMITTING):
        return None
    rest = content[len(COMMITTING):]
    if rest and b"\n" not in rest:
        return None  # (a mark cut off while written: nothing was renamed yet)
    try:
        found = json.loads(rest.split(b"\n", 1)[0])
        data = tuple(found["data"])
        if len(data) != 3 or not all(type(n) is int for n in data):
            raise ValueError
        return CutShort((data[0], data[1], data[2]), found.get("before") is True, found.get("layout") is True)
    except (ValueError, TypeError, KeyError, AttributeError):
        return CutShort(None)


def commit_cut_short(path: str | os.PathLike) -> CutShort | None:
    """The commit of a save of ``path`` that its writer was cut off in, between putting its layout
    file and its data in place (:data:`COMMITTING`), as its mark says; None when there is none. A
    writer committing now is waited for (looked at again until its mark is cleared or it is gone).
    Nothing is created or changed: a reader leaves no lock file."""
    lock = names.save_lock(os.fspath(path))
    pause = 0.001
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            return None  # (no lock file: no save was cut off)
        try:
            found = _mark(fd)
            if found is None:
                return None
            if flock(fd, wait=False) is not False:
                return found  # (no writer holds it; or no flock to tell, and the mark says so)
        finally:
            os.close(fd)
        time.sleep(pause)  # a live writer between its two renames, or settling a cut-off one's
        pause = min(pause * 2, 0.05)


def commit_witness(path: str | os.PathLike) -> tuple[CutShort | None, tuple[int, int, int] | None]:
    """What a reader that pairs the data file at ``path`` with a layout file compares before and
    after it reads the layout: the commit a killed save left marked (:func:`commit_cut_short`,
    which first waits for a save committing now) and the identity of the data file standing there
    (its st_dev, st_ino and st_size; None: none). Each step of a commit changes one of the two: its
    mark is written before its first rename and cleared after its second, and its data's rename
    puts another file there (a file held open keeps its inode number, so none comes back with
    it). The same witness on both sides of a read of the layout file therefore means that no
    commit began or ended meanwhile: the layout read is the one standing beside that very data
    file (or, after a save cut short, its own pair as :func:`commit_cut_short` tells it)."""
    cut = commit_cut_short(path)
    try:
        st = os.stat(path)  # (through a link, as a save writes through it)
    except (OSError, ValueError):
        return cut, None
    return cut, (st.st_dev, st.st_ino, st.st_size)


def _settle_held(path: str, fd: int) -> None:
    """Puts a commit of ``path`` that was cut short back in order, for the holder of its lock
    (open as ``fd``): when the data file is the commit's new one, the kept old layout file goes;
    when it is the old one, the old layout file is put back (or the commit's new layout file
    removed, where the old save had none). The mark is cleared then. (Where ``flock`` is missing,
    as for every lock, the holder is taken to be the destination's only writer.)"""
    found = _mark(fd)
    kept = names.layout_before(path)
    if found is None:
        _remove_kept(kept)  # (a writer killed after clearing its mark's line, or never marking)
        return
    if found.data is None:
        return  # (which save's pair stands cannot be told: the mark stays for readers)
    if not found.committed(path):
        layout = names.layout_path_for(path)
        if found.before:
            if os.path.lexists(kept):  # (else put back already, by a writer cut off settling it)
                os.replace(kept, layout)
        elif found.layout:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.lstat(layout).st_mode):
                    os.unlink(layout)
        fsync_directory(os.path.dirname(os.path.abspath(path)))
    clear_committing(path)


__all__ = ["COMMITTING", "CutShort", "acquire", "clear_committing", "commit_cut_short", "commit_witness",
           "destination_lock", "flock", "holding", "keep_layout_before", "mark_committing", "release"]
