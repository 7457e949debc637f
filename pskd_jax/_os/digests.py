"""Digests of whole files and of byte streams: the one place where the toolkit hashes.

``xxh3_128`` (``xxhsum -H2``) against damage, ``sha256`` (``sha256sum``) against tampering; reading
and hashing release the GIL, so files hash in parallel on threads (``docs/files.md``, "Digests").
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Any, Protocol

import xxhash

from pskd_jax._os.files import open_fd, open_regular
from pskd_jax.errors import TruncatedError, UsageError


class _Hash(Protocol):
    """What the toolkit asks of a hash object, hashlib's or xxhash's."""

    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


class _NewHash(Protocol):
    """Makes a hash object, fed ``data`` first when it is given."""

    def __call__(self, data: bytes = ..., /) -> _Hash: ...


# algorithm → a new hash object
DIGESTS: dict[str, _NewHash] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
BLOCK = 8 << 20  # bytes read and hashed at a time


def check_algorithm(algorithm: Any, what: str) -> str:
    """``algorithm`` when it is a key of :data:`DIGESTS`, else E9012 naming ``what``."""
    if algorithm not in DIGESTS:
        raise UsageError(f"{what}: no digest {algorithm!r}: expected one of {sorted(DIGESTS)}")
    return algorithm


def hash_file(path: str | os.PathLike, digest: Any, *, block: int = BLOCK) -> str:
    """Feeds a whole file to ``digest`` (a hashlib-like object) in blocks; returns its hexdigest.

    A file that cannot be read, or that is not a regular file (a FIFO would block), is E9003
    naming it."""
    with open_regular(path, TruncatedError) as f:
        # A small file gets a small buffer: what is read in one block need not be allocated larger.
        buffer = bytearray(max(1, min(block, os.fstat(f.fileno()).st_size + 1)))
        view = memoryview(buffer)
        try:
            while n := f.readinto(buffer):
                digest.update(view[:n])
        except OSError as e:
            raise TruncatedError(f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e
    return digest.hexdigest()


def file_digest(path: str | os.PathLike, algorithm: str = "xxh3_128") -> str:
    """The digest of a whole file, as ``xxhsum -H2`` (``"xxh3_128"``) or ``sha256sum``
    (``"sha256"``) print it.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "empty")
    >>> open(path, "wb").close()
    >>> file_digest(path), file_digest(path, "sha256")[:16]
    ('99aa06d3014798d86001c324468d497f', 'e3b0c44298fc1c14')
    """
    check_algorithm(algorithm, os.fspath(path))
    return hash_file(path, DIGESTS[algorithm]())


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a whole file, as ``sha256sum`` prints it."""
    return file_digest(path, "sha256")


class Hasher:
    """A digest of a byte stream, computed on a helper thread so that hashing overlaps writing
    or reading. ``feed`` keeps a reference to each piece until it is hashed; ``hexdigest`` or
    ``abandon`` ends the thread."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._hash = DIGESTS[algorithm]()
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, name=f"pskd-{algorithm}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            piece = self._queue.get()
            if piece is None:
                return
            self._hash.update(piece)

    def feed(self, piece: Any) -> None:
        self._queue.put(memoryview(piece).cast("B") if not isinstance(piece, bytes) else piece)

    def hexdigest(self) -> str:
        self.abandon()
        return self._hash.hexdigest()

    def abandon(self) -> None:
        self._queue.put(None)
        self._thread.join()


def sampled_digest(path: str | os.PathLike, spans: list[tuple[int, int]]) -> str:
    """xxh3_128 of the bytes of a file at ``spans`` (offset, size), read with positional reads:
    a cheap identity of a large file (its header and a few blocks), not a check of its content.

    Spans beyond the end count as the bytes that are there; a file that cannot be read is
    E9003 (``open_fd``'s errors)."""
    digest = xxhash.xxh3_128()
    fd = open_fd(path)
    try:
        for offset, size in spans:
            digest.update(offset.to_bytes(8, "little"))
            digest.update(os.pread(fd, size, offset) if size > 0 else b"")
    except OSError as e:
        raise TruncatedError(f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    return digest.hexdigest()


__all__ = ["BLOCK", "DIGESTS", "Hasher", "check_algorithm", "file_digest", "file_sha256", "hash_file",
           "sampled_digest"]
