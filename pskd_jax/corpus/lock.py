"""The build lock of a corpus directory: one build (or merge) of a directory at a time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from pskd_jax._os import locks, names
from pskd_jax.errors import CorpusDirectoryError


@contextlib.contextmanager
def directory_lock(directory: str) -> Iterator[int]:
    """Holds ``DIR/.pskd-corpus.lock``, refusing at once (E9016) when another build holds it;
    yields the lock's descriptor (a build's forked workers close it).

    The lock file stays in the directory after the build: it is empty, and nothing reads the
    directory for it (``verify``, ``info``, ``merge`` and the readers open the manifest and the
    shards it lists only). Leaving it is safe whatever another program does with the directory,
    where removing it is safe only if every opener checks, after locking, that the name still
    leads to the file it locked."""
    path = os.path.join(directory, names.CORPUS_LOCK)
    fd = locks.acquire(path, wait=False, error=CorpusDirectoryError, what=directory)
    if fd is None:
        raise CorpusDirectoryError(f"{directory}: another corpus build is running in this directory (it holds "
                                   f"{path}); wait for it to finish or build into another directory")
    try:
        yield fd
    finally:
        locks.release(fd)


__all__ = ["directory_lock"]
