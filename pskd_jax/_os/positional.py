"""Positional reads and writes (``preadv``, ``pwrite``) that finish what they start or say why not:
each loops until its buffer is full or written, and raises E9003 naming the file when it cannot be
(``docs/files.md``, "Inputs").
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pskd_jax._os import uring
from pskd_jax.errors import TruncatedError

PIECE = 1 << 30  # one call moves at most this many bytes


def read_into(fd: int, buffer: memoryview, offset: int, path: str) -> None:
    """Fills ``buffer`` with the bytes of ``fd`` from ``offset`` on; E9003 when the file ends first."""
    done, total = 0, len(buffer)
    try:
        while done < total:
            n = os.preadv(fd, [buffer[done : done + PIECE]], offset + done)
            if n <= 0:
                raise TruncatedError(f"{path}: truncated: {total - done} bytes missing at offset {offset + done} "
                                     "(the file was cut short since it was opened, or is shorter than it says)")
            done += n
    except OSError as e:
        raise TruncatedError(f"{path}: cannot read: {e.strerror or e}") from e


def pread_spans(fds: int | Sequence[int], spans: Sequence[memoryview], offsets: Sequence[int], path: str) -> None:
    """Fills each buffer of ``spans`` from its file descriptor (one for all, or one a span) at its
    offset: one ``preadv`` a span, called through ``map`` (no Python loop per span), and more only
    after a short read. E9003 when a file ends first: it was cut short since it was opened."""
    fds = [fds] * len(spans) if isinstance(fds, int) else fds
    try:
        done = list(map(os.preadv, fds, ([span] for span in spans), offsets))
    except OSError as e:
        raise TruncatedError(f"{path}: cannot read: {e.strerror or e}") from e
    for fd, view, offset, got in zip(fds, spans, offsets, done):
        if got < len(view):
            try:
                read_into(fd, view[got:], offset + got, path)
            except TruncatedError:
                raise TruncatedError(f"{path}: the file ends before byte {offset + len(view)}, inside the data "
                                     "it announced (cut short since it was opened)") from None


def pread_runs(fds: np.ndarray, out: np.ndarray, starts: np.ndarray, lengths: np.ndarray, offsets: np.ndarray,
               path: str) -> bool:
    """Fills bytes ``[starts[j], starts[j] + lengths[j])`` of ``out`` (C-contiguous, writable)
    from ``fds[j]`` at ``offsets[j]``, for every j (int64 arrays), in one batched system call
    (:mod:`pskd_jax._os.uring`); a read that ends early is finished, or refused with E9003, as
    :func:`pread_spans` does. Returns False, having read nothing, where io_uring is not to be
    had (the caller then reads with :func:`pread_spans`)."""
    if not len(lengths) or int(lengths.max()) > uring.MAX_LENGTH:
        return False
    flat = out.reshape(-1).view(np.uint8)
    if not flat.flags.writeable or int(starts.min()) < 0 or int((starts + lengths).max()) > flat.nbytes:
        raise ValueError(f"{path}: runs outside the output buffer of {flat.nbytes} bytes")  # (a caller's bug)
    results = uring.read(fds, flat.ctypes.data + starts, lengths, offsets)
    if results is None:
        return False
    for j in np.flatnonzero(results != lengths).tolist():
        got, start, length = int(results[j]), int(starts[j]), int(lengths[j])
        if got < 0:
            raise TruncatedError(f"{path}: cannot read: {os.strerror(-got)}")
        try:
            read_into(int(fds[j]), flat.data[start + got : start + length], int(offsets[j]) + got, path)
        except TruncatedError:
            raise TruncatedError(f"{path}: the file ends before byte {int(offsets[j]) + length}, inside the data "
                                 "it announced (cut short since it was opened)") from None
    return True


def write_at(fd: int, data: bytes | memoryview, offset: int, path: str) -> None:
    """Writes all of ``data`` at ``offset``; E9003 naming the file when the system refuses."""
    view = memoryview(data).cast("B")
    done = 0
    try:
        while done < len(view):
            n = os.pwrite(fd, view[done : done + PIECE], offset + done)
            if n <= 0:
                raise TruncatedError(f"{path}: write failed at offset {offset + done}")
            done += n
    except OSError as e:
        raise TruncatedError(f"{path}: write failed: {e.strerror or e}") from e


__all__ = ["PIECE", "pread_runs", "pread_spans", "read_into", "write_at"]
