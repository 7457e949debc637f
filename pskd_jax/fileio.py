"""Writing files so that a reader sees the old content or the new, never a torn file.

Every writer of the toolkit writes into a temporary file in the destination's directory, flushes
and syncs it, renames it over the destination and syncs the directory. If anything fails before
the rename, the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import BinaryIO, Iterator

from pskd_jax.errors import TRUNCATED, PskdError


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


def temporary_path_for(path: str) -> tuple[int, str]:
    """Creates a hidden temporary file beside ``path``; returns its descriptor and path."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        return tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as e:
        raise PskdError(TRUNCATED, f"{path}: cannot create a file in {directory}: {e.strerror}") from e


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
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise PskdError(TRUNCATED, f"{path}: {e.strerror or e}") from e
        raise
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))
