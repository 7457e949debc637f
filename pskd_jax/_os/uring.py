"""Many positional reads in one system call: Linux's io_uring, reached through ``ctypes``.

A gather with ``access="pread"`` reads one run of bytes a window or a record: 64 small reads a
batch, each one ``preadv`` and its Python call. Here a whole batch of reads is written into the
kernel's submission ring with one numpy assignment a field (file descriptor, offset, length,
destination address) and handed over with one ``io_uring_enter``, which also waits for every one
of them; the interpreter lock is released while the kernel copies. Reads served from the page
cache complete inside that call; the others on the kernel's own workers, in parallel.

Only a thread's own ring is used by it (rings are per thread and per process: a forked child or a
new thread makes its own). Where the kernel has no io_uring, or refuses it (a sandbox, a container
whose seccomp profile blocks it, ``kernel.io_uring_disabled``), or ``PSKD_IO_URING=0`` is set,
:func:`ring` is None and the callers read with ``preadv`` as before; the bytes are the same either
way. A read that ends early (a file cut short since it was opened) is finished, or refused with
E9003, by the caller's own positional read.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import itertools
import mmap
import os
import sys
import threading

import numpy as np

_SETUP, _ENTER = 425, 426  # the io_uring system calls (one number on every Linux architecture)
_OP_READ = 22  # IORING_OP_READ: read len bytes at off into addr
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000

ENTRIES = 256  # submission slots of a ring: a longer batch is handed over in pieces of this many
MAX_LENGTH = 1 << 30  # a read longer than this is left to preadv (a ring's length is 32 bits)
_NUMBERS = np.arange(ENTRIES, dtype=np.uint64)


class Ring:
    """One io_uring instance: its submission and completion rings mapped as numpy arrays."""

    def __init__(self, entries: int = ENTRIES) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        setup, self._enter = libc["syscall"], libc["syscall"]  # (two function objects: two signatures)
        setup.restype = self._enter.restype = ctypes.c_long
        setup.argtypes = [ctypes.c_long, ctypes.c_uint32, ctypes.c_void_p]
        self._enter.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                ctypes.c_void_p, ctypes.c_size_t]
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params: 10 words, then the two offset blocks
        fd = setup(_SETUP, entries, params)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.fd, self.pid = int(fd), os.getpid()
        self._maps: list[mmap.mmap] = []
        try:
            self._map_rings(list(params))
        except BaseException:
            self.close()
            raise

    def _map_rings(self, params: list[int]) -> None:
        sq_entries, cq_entries, features = params[0], params[1], params[5]
        sq_off, cq_off = params[10:20], params[20:30]
        sq_bytes = sq_off[6] + sq_entries * 4  # up to the end of the slot array
        cq_bytes = cq_off[5] + cq_entries * 16  # up to the end of the completions
        if features & _FEAT_SINGLE_MMAP:
            sq_map = cq_map = self._map(max(sq_bytes, cq_bytes), _OFF_SQ_RING)
        else:
            sq_map, cq_map = self._map(sq_bytes, _OFF_SQ_RING), self._map(cq_bytes, _OFF_CQ_RING)
        sq = np.frombuffer(sq_map, np.uint32)
        cq = np.frombuffer(cq_map, np.uint32)
        self._sq_tail = sq[sq_off[1] // 4 : sq_off[1] // 4 + 1]
        self._sq_mask = int(sq[sq_off[2] // 4])
        self._cq_head = cq[cq_off[0] // 4 : cq_off[0] // 4 + 1]
        self._cq_tail = cq[cq_off[1] // 4 : cq_off[1] // 4 + 1]
        self._cq_mask = int(cq[cq_off[2] // 4])
        # Completions as four 32-bit words each (the read's number, 0, its result, flags), entries
        # as eight 64-bit words each (the first five written per read; the rest stay zero).
        self._cqes = np.frombuffer(cq_map, np.int32, cq_entries * 4, cq_off[5]).reshape(cq_entries, 4)
        self._sqes = np.frombuffer(self._map(sq_entries * 64, _OFF_SQES), np.uint64).reshape(sq_entries, 8)
        self._sqes[:] = 0
        # Slot i of the submission ring always names entry i: only the entries change.
        sq[sq_off[6] // 4 : sq_off[6] // 4 + sq_entries] = np.arange(sq_entries, dtype=np.uint32)
        self.entries = sq_entries

    def _map(self, size: int, offset: int) -> mmap.mmap:
        made = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        self._maps.append(made)
        return made

    def read(self, fds: np.ndarray, addresses: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Reads ``lengths[j]`` bytes of ``fds[j]`` at ``offsets[j]`` into the memory at
        ``addresses[j]`` (which the caller keeps alive and writable), for every j; returns each
        read's result: bytes read (fewer at the end of a file), or a negated errno. Returns only
        once the kernel has finished with every read it was given."""
        count = len(fds)
        # The entries' words as the kernel reads them: opcode and descriptor, offset, address,
        # length, and the read's number (its completion says which read it was).
        words = np.empty((count, 5), np.uint64)
        halves = words.view(np.uint32)  # (assignments only: a ufunc with a scalar costs more than a read)
        halves[:, 0] = _OP_READ  # (opcode; flags and priority 0)
        halves[:, 1] = fds
        words[:, 1] = offsets
        words[:, 2] = addresses
        words[:, 3] = lengths  # (the length; the read's flags 0)
        words[:, 4] = _NUMBERS[:count] if count <= ENTRIES else np.arange(count, dtype=np.uint64)
        results = np.empty(count, np.int64)
        for first in range(0, count, self.entries):
            self._read_some(words[first : first + self.entries], results)
        return results

    def _read_some(self, words: np.ndarray, results: np.ndarray) -> None:
        count = len(words)
        tail = int(self._sq_tail[0])
        at = tail & self._sq_mask
        head_part = min(count, self.entries - at)  # (the slots up to the ring's end, then from its start)
        self._sqes[at : at + head_part, :5] = words[:head_part]
        self._sqes[: count - head_part, :5] = words[head_part:]
        # The kernel reads the tail only inside io_uring_enter (no polling thread), after these stores.
        self._sq_tail[0] = (tail + count) & 0xFFFFFFFF
        pending, done = count, 0
        while done < count:
            got = self._enter(_ENTER, self.fd, pending, count - done, _ENTER_GETEVENTS, None, 0)
            if got < 0:
                code = ctypes.get_errno()
                if code not in (errno.EINTR, errno.EAGAIN, errno.EBUSY):
                    # (not expected of a well-formed ring: what was submitted is waited for first)
                    while done < count - pending:
                        done += self._collect(results)
                    raise OSError(code, os.strerror(code))
                got = 0
            pending -= min(pending, got)
            done += self._collect(results)

    def _collect(self, results: np.ndarray) -> int:
        """Moves the completions the kernel has posted into ``results`` (by each read's number);
        returns how many."""
        head, tail = int(self._cq_head[0]), int(self._cq_tail[0])
        ready = (tail - head) & 0xFFFFFFFF
        if ready:
            at = head & self._cq_mask
            first = min(ready, len(self._cqes) - at)
            for posted in (self._cqes[at : at + first], self._cqes[: ready - first]):
                results[posted[:, 0]] = posted[:, 2]  # (words: the read's number, 0, its result, flags)
            self._cq_head[0] = tail
        return ready

    def close(self) -> None:
        for made in self._maps:
            try:
                made.close()
            except BufferError:  # (a view of it is still alive: it closes when collected)
                pass
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:  # (at the interpreter's exit the os module's names may already be gone)
            if getattr(self, "fd", -1) >= 0 and self.pid == os.getpid():
                self.close()
        except Exception:
            pass


SHARED_RUNS = 512  # a batch of at least this many reads is shared with helper threads
HELPERS = max(0, min(3, (os.cpu_count() or 1) - 1))  # helper threads (each with its own ring)

_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def read(fds: np.ndarray, addresses: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """:meth:`Ring.read` of the reads given (None where io_uring cannot be used), a large batch in
    pieces read at once by this thread's ring and helper threads' rings: the kernel's copies
    from the page cache, the bulk of a batch's cost, then run on several cores. Returns once
    every piece is read, whatever fails."""
    own = ring()
    if own is None:
        return None
    count = len(fds)
    pieces = min(HELPERS + 1, count // (SHARED_RUNS // 2)) if HELPERS else 1
    if pieces <= 1:
        return own.read(fds, addresses, lengths, offsets)
    if not _pool:
        _pool.append(concurrent.futures.ThreadPoolExecutor(HELPERS, thread_name_prefix="pskd-read"))
    bounds = [count * k // pieces for k in range(pieces + 1)]
    helped = [_pool[0].submit(_read_with_own_ring, fds[a:b], addresses[a:b], lengths[a:b], offsets[a:b])
              for a, b in itertools.pairwise(bounds[1:])]
    try:
        first = own.read(fds[: bounds[1]], addresses[: bounds[1]], lengths[: bounds[1]], offsets[: bounds[1]])
    finally:
        concurrent.futures.wait(helped)  # (no return while a helper may still write to the buffers)
    return np.concatenate([first, *[future.result() for future in helped]])


def _read_with_own_ring(fds: np.ndarray, addresses: np.ndarray, lengths: np.ndarray, offsets: np.ndarray
                        ) -> np.ndarray:
    held = ring()
    if held is not None:
        return held.read(fds, addresses, lengths, offsets)
    # (the kernel gave the calling thread a ring but refuses this one: one preadv a read)
    results = np.empty(len(fds), np.int64)
    for j, (fd, address, length, offset) in enumerate(zip(fds.tolist(), addresses.tolist(), lengths.tolist(),
                                                          offsets.tolist())):
        try:
            results[j] = os.preadv(fd, [(ctypes.c_char * length).from_address(address)], offset)
        except OSError as e:
            results[j] = -(e.errno or errno.EIO)
    return results


_local = threading.local()
_unavailable: list[bool] = []  # [True] once the kernel refused a ring: not asked again


def ring() -> Ring | None:
    """This thread's ring, made when first asked for; None where io_uring cannot be used."""
    held = getattr(_local, "ring", None)
    if held is not None and held.pid == os.getpid():
        return held
    if _unavailable or not enabled():
        return None
    try:
        held = Ring()
    except (OSError, AttributeError, ValueError):  # (no such system call, refused, or no mmap of it)
        _unavailable.append(True)
        return None
    _local.ring = held
    return held


def enabled() -> bool:
    """Whether io_uring may be tried: Linux, and ``PSKD_IO_URING`` is not ``0``."""
    return sys.platform == "linux" and os.environ.get("PSKD_IO_URING", "1") != "0"


def _forget_in_child() -> None:
    _pool.clear()  # (its threads are the parent's; the child starts its own when it needs them)
    inherited = _local.__dict__.pop("ring", None)  # (the child's rings are its own, made when it reads)
    if inherited is not None:
        inherited.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


__all__ = ["ENTRIES", "HELPERS", "MAX_LENGTH", "SHARED_RUNS", "Ring", "enabled", "read", "ring"]
