"""Output that replaces its destination whole or not at all.

A writer writes a temporary file beside the destination (held under ``flock`` until its rename, so
the next writer removes only stale ones: :func:`remove_stale_temporaries`), syncs it and renames it
over the destination. What stands at the output path is looked at once (:func:`destination_for`):
a link a user names is written through, one at a name the writer chooses itself is replaced
(``links="replace"``), anything but a regular file is refused. The rules: ``docs/files.md``
("Outputs: whole or not at all").
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from pskd_jax._os import interrupts, locks, names
from pskd_jax._os.files import fsync_directory
from pskd_jax.errors import TruncatedError, UsageError

_MAX_LINKS = 40  # the most symbolic links followed from an output path (as the kernel's ELOOP)
_DESCRIPTOR_DIRECTORIES = ("/proc/", "/dev/fd/")  # links here name a process's open descriptors


def _kind_of(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


LINK_RULES = ("follow", "replace")  # what an output does with a link at its path (docs/files.md, "Outputs")


def destination_for(path: str | os.PathLike, *, links: str = "follow") -> str:
    """The file an output to ``path`` replaces, decided once, before anything is written.

    ``path`` itself when nothing or a regular file stands there; the final target of a symbolic
    link (followed link by link, then made absolute with the real directories), whether it exists
    or not; E9012 naming the path for ``-`` (the standard output), a directory, a named pipe, a
    device, a socket, a loop of links, or a link into a process's descriptors (``/dev/stdout``).
    With ``links="replace"``, a link at ``path`` is the destination itself (replaced, not followed).
    """
    name = os.fspath(path)
    if name == names.STANDARD_STREAM:
        raise UsageError(f"{name}: '-' is the standard output, which this output cannot be written to; "
                         "give a file name (./- for a file named '-')")
    if not name or name.endswith(os.sep):
        raise UsageError(f"{name!r}: not a file's name (empty, or ending in {os.sep})")
    if "\0" in name:
        raise TruncatedError(f"{name!r}: cannot create a file: a path holds no NUL byte")
    current = name
    for _ in range(_MAX_LINKS + 1):
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return current if current == name else os.path.realpath(current)
        except OSError:
            return current  # (a directory we cannot search: creating the file says why)
        kind = _kind_of(mode)
        if kind is None:
            return current if current == name else os.path.realpath(current)
        if kind == "a symbolic link" and links == "replace":
            return current
        if kind != "a symbolic link":
            shown = name if current == name else f"{name} (a link to {current})"
            raise UsageError(f"{shown}: {kind} stands there; an output replaces only a regular file: "
                             "give a file's name")
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        if any(os.path.realpath(current).startswith(d) or current.startswith(d) for d in _DESCRIPTOR_DIRECTORIES):
            raise UsageError(f"{name}: a link to {target}, a descriptor of a process, not a file; "
                             "use -o - for the standard output where a command writes text")
    raise UsageError(f"{name}: more than {_MAX_LINKS} symbolic links (a loop?); give a file's name")


def check_destination(destination: str, *, links: str = "follow") -> None:
    """Refuses (E9012) a destination that became something other than a regular file (or nothing,
    or with ``links="replace"`` a link) since :func:`destination_for` chose it: checked again just
    before the rename."""
    try:
        mode = os.lstat(destination).st_mode
    except OSError:
        return
    kind = _kind_of(mode)
    if kind is not None and not (kind == "a symbolic link" and links == "replace"):
        raise UsageError(f"{destination}: {kind} stands there now; an output replaces only a regular file")


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
    return remove_unlocked(directory, found)


def remove_unlocked(directory: str, found: Iterable[str]) -> list[str]:
    """Removes those of the files ``found`` in ``directory`` (names of temporary files) that are
    regular files no live writer holds locked; returns them (see :func:`remove_stale_temporaries`)."""
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
    (keep it open until the file is renamed into place); first removes stale ones of ``path``.

    ``path`` is the destination as :func:`destination_for` gave it: the temporary file lies in
    the directory the rename happens in."""
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


def commit(fd_file: BinaryIO, temporary: str, path: str, *, durable: bool, links: str = "follow") -> None:
    """Puts a finished temporary file in place of ``path``: flush, sync, rename (while its lock is
    still held), sync the directory."""
    fd_file.flush()
    if durable:
        os.fsync(fd_file.fileno())
    check_destination(path, links=links)
    interrupts.check()  # (a Ctrl-C a library swallowed still leaves the destination as it was)
    os.replace(temporary, path)


@contextlib.contextmanager
def atomic_output(path: str, *, durable: bool = True, links: str = "follow") -> Iterator[BinaryIO]:
    """Yields a binary file open for writing; on a clean exit it replaces ``path`` whole.

    ``path`` is resolved once by :func:`destination_for` (a link is written through, or with
    ``links="replace"`` replaced; a directory, FIFO, device or ``-`` is refused with E9012 before
    anything is written).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_output(os.path.join(d, "x.bin")) as f:
    ...     _ = f.write(b"abc")
    >>> open(os.path.join(d, "x.bin"), "rb").read()
    b'abc'
    """
    path = destination_for(path, links=links)
    fd, tmp = temporary_path_for(path)
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            commit(f, tmp, path, durable=durable, links=links)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise TruncatedError(f"{path}: {e.strerror or e}") from e
        raise
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def text_output(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """:func:`atomic_output` for an output that is text, where ``-`` names the standard output.

    To the standard output the text is first written to an anonymous temporary file, then copied
    out once complete: an error midway writes nothing there, as it leaves no file behind."""
    if os.fspath(path) != names.STANDARD_STREAM:
        with atomic_output(os.fspath(path), durable=durable) as f:
            yield f
        return
    try:
        # Closed by the ``with`` below; made apart so that failing to make it gets its own message.
        spool = tempfile.TemporaryFile()  # noqa: SIM115
    except OSError as e:
        raise TruncatedError(f"-: cannot make a temporary file for the standard output: {e.strerror or e}") from e
    with spool:
        yield spool
        interrupts.check()
        try:
            spool.flush()
            spool.seek(0)
            sys.stdout.flush()
            out = sys.stdout.buffer
            while block := spool.read(1 << 20):
                out.write(block)
            out.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise TruncatedError(f"-: cannot write the standard output: {e.strerror or e}") from e


__all__ = ["LINK_RULES", "atomic_output", "check_destination", "commit", "destination_for", "fsync_directory",
           "remove_stale_temporaries", "temporary_path_for", "text_output", "unlocked_temporary_for"]
