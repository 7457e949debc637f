"""A read-only memory map of a file that holds no file descriptor: :func:`map_read_only`.

Python's ``mmap.mmap`` keeps a duplicate of the descriptor it maps for as long as the map lives
(before Python 3.13's ``trackfd=False``), so a source holding many maps holds two descriptors a
map with its own, and a corpus of ~500 shards reaches the usual limit of 1024. A map stays valid
after the descriptor it was made from is closed (POSIX ``mmap``), so here the map is made with the
C library's ``mmap`` and the caller closes its descriptor at once. The map is let go (``munmap``)
when the last buffer or array view of it is collected, never under a live view.

A map's owner may still keep its descriptor for a cheaper guard (``fstat`` of it, against
``stat`` of a path): :data:`KEPT_DESCRIPTORS` hands out up to half the process's soft limit of
open files to owners that ask, and none beyond, so a corpus of any number of shards opens.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

import numpy as np

from pskd_jax._os.files import descriptor_limit

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """Owns one mapped range: unmapped when collected (the buffer made of it holds it)."""

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size

    def __del__(self) -> None:
        _munmap(self.address, self.size)


def map_read_only(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes (> 0) of the file open at ``fd``, mapped read-only and shared, as a
    read-only uint8 array that does not keep ``fd``: close it when you like. OSError when the
    system refuses the map."""
    if size <= 0:
        raise ValueError(f"a map of {size} bytes")
    address = _mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    owner = _Mapping(address, size)
    buffer = (ctypes.c_ubyte * size).from_address(address)
    buffer._owner = owner  # type: ignore[attr-defined]  # (the map lives as long as the buffer and its views)
    # Read-only as a buffer too, so that no array of it can be made writable again (PROT_READ:
    # a write would kill the process).
    array = np.frombuffer(memoryview(buffer).toreadonly(), np.uint8)
    return array


class DescriptorBudget:
    """How many descriptors the owners of maps may keep open: half the soft limit of open files
    (looked at on every ask, so a limit raised meanwhile counts), shared by all owners."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0

    def take(self) -> bool:
        """Whether one more descriptor may be kept (counted as kept when it may)."""
        with self._lock:
            if self.held >= self._limit():
                return False
            self.held += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.held = max(0, self.held - 1)

    @staticmethod
    def _limit() -> int:
        soft = descriptor_limit()
        return 256 if soft is None else max(0, soft // 2)  # (256: a limit that cannot be read)


KEPT_DESCRIPTORS = DescriptorBudget()


__all__ = ["KEPT_DESCRIPTORS", "DescriptorBudget", "map_read_only"]
