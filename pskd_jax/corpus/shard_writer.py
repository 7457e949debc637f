"""Writing one shard at its final path, chunk by chunk, so that a reader sees whole chunks only.
"""

from __future__ import annotations

import contextlib
import os
import numpy as np
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import TruncatedError, UsageError
from pskd_jax._os.files import check_regular
from pskd_jax._os.locks import flock
from pskd_jax._os.positional import write_at

DEFAULT_CHUNK_TOKENS = 1 << 22  # 4 Mi tokens (8 MiB of u16) between header updates


class ShardWriter:
    """Appends tokens to a shard at its final path, chunk by chunk (see the module docstring).

    >>> import tempfile, os
    >>> from pskd_jax import Reader
    >>> p = os.path.join(tempfile.mkdtemp(), "s.psk.d")
    >>> w = ShardWriter(p, Tokenizer.bytes(), chunk_tokens=2, durable=False)
    >>> w.append(np.array([104, 105, 256], np.uint16)); w.count   # one whole chunk is counted
    2
    >>> _ = w.close(); Reader(p)[2]
    array(256, dtype=uint16)
    """

    def __init__(self, path: str, tokenizer: Tokenizer, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                 durable: bool = True):
        if chunk_tokens < 1:
            raise UsageError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
        self.path, self.tokenizer, self.durable = path, tokenizer, durable
        self.count = 0  # tokens counted in the header
        self._pending = np.empty(chunk_tokens, tokenizer.dtype)
        self._held = 0
        self._item = tokenizer.dtype.itemsize
        self._data_offset = len(tokenizer.header(0))
        self._fd = self._open(path)
        try:
            check_regular(self._fd, path)  # a FIFO or a device at the shard's name: E9012, never written
            flock(self._fd, wait=True)  # waits for any other writer of this shard
            self._restart()
        except BaseException:
            os.close(self._fd)
            raise

    @staticmethod
    def _open(path: str) -> int:
        """Opens (creating) the shard file itself: a symbolic link at ``path`` is replaced by the
        shard, never written through (it could point anywhere, outside the corpus included)."""
        flags = (os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NOFOLLOW", 0))
        for _ in range(100):  # another process may make a link again between the unlink and the open
            try:
                return os.open(path, flags, 0o644)
            except OSError as e:
                if not (os.path.islink(path) and getattr(os, "O_NOFOLLOW", 0)):
                    raise TruncatedError(f"{path}: cannot write: {e.strerror or e}") from None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise TruncatedError(f"{path}: cannot replace the symbolic link: {e.strerror or e}") from None
        raise TruncatedError(f"{path}: cannot write: a symbolic link keeps reappearing there")

    def _sync(self) -> None:
        if self.durable:
            (getattr(os, "fdatasync", None) or os.fsync)(self._fd)

    def _restart(self) -> None:
        """An empty shard: the header with count 0, nothing after it."""
        os.ftruncate(self._fd, 0)
        self.count, self._held = 0, 0
        self._write_at(self.tokenizer.header(0), 0)
        self._sync()

    def _write_at(self, data: bytes | memoryview, offset: int) -> None:
        write_at(self._fd, data, offset, self.path)

    def _commit(self, tokens: np.ndarray) -> None:
        """Appends one chunk, syncs it, then counts it in the header and syncs that."""
        if not len(tokens):
            return
        self._write_at(memoryview(np.ascontiguousarray(tokens)), self._data_offset + self.count * self._item)
        self._sync()
        self.count += len(tokens)
        self._write_at(self.tokenizer.header(self.count), 0)
        self._sync()

    def append(self, tokens: np.ndarray) -> None:
        """Adds tokens; every full chunk is committed as it fills."""
        size = len(self._pending)
        at = 0
        while at < len(tokens):
            take = min(size - self._held, len(tokens) - at)
            self._pending[self._held : self._held + take] = tokens[at : at + take]
            self._held += take
            at += take
            if self._held == size:
                self._commit(self._pending)
                self._held = 0

    def reset(self) -> None:
        """Back to an empty shard (a ``.txt`` document found bad under skip_bad)."""
        self._restart()

    def close(self) -> int:
        """Commits the last, shorter chunk; returns the token count."""
        self._commit(self._pending[: self._held])
        self._held = 0
        os.close(self._fd)
        self._fd = -1
        return self.count

    def abort(self) -> None:
        """Deletes the unfinished shard (its lock goes with the descriptor)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(self._fd)
            self._fd = -1
