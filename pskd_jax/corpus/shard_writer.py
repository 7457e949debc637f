"""Writing one shard chunk by chunk, so that a reader sees whole chunks only, and never changing a
file that a reader may hold.

A shard is a header with count 0, then chunks of ``chunk_tokens`` tokens, each appended and synced
*before* the header's count is rewritten (a crash leaves at most trailing bytes after the counted
tokens; the bytes do not depend on ``chunk_tokens``). A new shard is written in place, so a reader
may follow it as it grows; one that replaces a file (or a symbolic link, never written through) is
written to a temporary file beside it and renamed over it, and so is the rest of a shard
:meth:`ShardWriter.reset` empties after a reader could have seen it. A writer holds an exclusive
``flock`` on what it writes and replaces. The rules a reader relies on: ``docs/corpus.md``
(Building, the directory while a build runs).
"""

from __future__ import annotations

import contextlib
import os
import stat

import numpy as np

from pskd_jax._os.atomic import fsync_directory, remove_stale_temporaries, temporary_path_for
from pskd_jax._os.checks import checked_integer, mode_words
from pskd_jax._os.locks import flock
from pskd_jax._os.positional import write_at
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import TruncatedError, UsageError

DEFAULT_CHUNK_TOKENS = 1 << 22  # 4 Mi tokens (8 MiB of u16) between header updates

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class ShardWriter:
    """Appends tokens to a shard chunk by chunk (see the module docstring); :meth:`close` puts it
    in place and returns its token count.

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
        chunk_tokens = checked_integer(chunk_tokens, "chunk_tokens", low=1)
        self.path, self.tokenizer, self.durable = path, tokenizer, durable
        self.count = 0  # tokens counted in the header
        self._chunk = chunk_tokens
        # Grown up to a chunk as tokens come: a chunk larger than the default (one header update a
        # shard, say) holds no more memory than the shard's tokens, never chunk_tokens up front.
        self._pending = np.empty(min(chunk_tokens, DEFAULT_CHUNK_TOKENS), tokenizer.dtype)
        self._held = 0
        self._item = tokenizer.dtype.itemsize
        self._data_offset = len(tokenizer.header(0))
        self._fd = -1  # the file written: the shard itself (in place) or a temporary file
        self._temporary: str | None = None  # the temporary file renamed over ``path`` at the end
        self._replaced = -1  # a descriptor of the file at ``path`` being replaced, held locked
        self._created: int | None = None  # the inode of the file this writer created at ``path``
        try:
            self._open()
            self._restart()
        except BaseException:
            self._close_descriptors()
            raise

    @property
    def in_place(self) -> bool:
        """Whether the shard is written at its path (a reader may follow it) rather than beside it."""
        return self._temporary is None

    def _open(self) -> None:
        """Creates the shard at its path when nothing stands there, else starts a temporary file
        beside it (holding the file it will replace locked)."""
        remove_stale_temporaries(self.path)  # what killed writers of this shard left
        for _ in range(100):  # another process may create or remove the file in between
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _CLOEXEC | _NOFOLLOW, 0o644)
            except FileExistsError:
                if self._hold_existing():
                    self._start_temporary()
                    return
                continue  # gone again: try to create it
            except OSError as e:
                raise TruncatedError(f"{self.path}: cannot write: {e.strerror or e}") from e
            flock(self._fd, wait=True)  # a new file: only a writer that opened it since could hold it
            self._created = os.fstat(self._fd).st_ino
            return
        raise TruncatedError(f"{self.path}: cannot write: the file there keeps appearing and disappearing")

    def _hold_existing(self) -> bool:
        """Locks the file standing at the path (waiting for a writer of it to finish); False when
        it is gone. A symbolic link is not followed (it is replaced); anything but a regular file or
        a link is refused."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise TruncatedError(f"{self.path}: cannot write: {e.strerror or e}") from e
        if stat.S_ISLNK(info.st_mode):
            return True
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{self.path}: {mode_words(info.st_mode)} stands at the shard's name; a shard would "
                             "replace it: move it away")
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | _NOFOLLOW)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # replaced by a link meanwhile, or unreadable: replaced without the lock
        flock(fd, wait=True)
        self._replaced = fd
        return True

    def _start_temporary(self) -> None:
        fd, temporary = temporary_path_for(self.path)  # created and locked
        self._fd, self._temporary = fd, temporary

    def _sync(self) -> None:
        if self.durable:
            (getattr(os, "fdatasync", None) or os.fsync)(self._fd)

    def _restart(self) -> None:
        """An empty shard: the header with count 0, nothing after it. Only a file no reader has
        seen is truncated (a new one, or this writer's temporary file)."""
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
        self._write_at(np.ascontiguousarray(tokens).data, self._data_offset + self.count * self._item)
        self._sync()
        self.count += len(tokens)
        self._write_at(self.tokenizer.header(self.count), 0)
        self._sync()

    def append(self, tokens: np.ndarray) -> None:
        """Adds tokens; every full chunk is committed as it fills."""
        size = self._chunk
        at = 0
        while at < len(tokens):
            take = min(size - self._held, len(tokens) - at)
            if self._held + take > len(self._pending):
                self._grow(self._held + take)
            self._pending[self._held : self._held + take] = tokens[at : at + take]
            self._held += take
            at += take
            if self._held == size:
                self._commit(self._pending)
                self._held = 0

    def _grow(self, needed: int) -> None:
        """Room for ``needed`` pending tokens: the buffer doubled (at most a chunk), what it holds kept."""
        grown = np.empty(min(self._chunk, max(needed, 2 * len(self._pending))), self._pending.dtype)
        grown[: self._held] = self._pending[: self._held]
        self._pending = grown

    def reset(self) -> None:
        """Back to an empty shard (a ``.txt`` document found bad under skip_bad). A shard written
        in place that readers may have seen is left as it is; the empty shard is written beside it
        and renamed over it at :meth:`close`."""
        if self.in_place and self.count:
            self._replaced = self._fd  # still locked: it is the file being replaced now
            self._fd = -1
            self._start_temporary()
        self._restart()

    def close(self) -> int:
        """Commits the last, shorter chunk, puts the shard in place; returns the token count."""
        self._commit(self._pending[: self._held])
        self._held = 0
        if self._temporary is not None:
            if self.durable:
                os.fsync(self._fd)
            try:
                os.replace(self._temporary, self.path)  # while both locks are held
            except OSError as e:
                raise TruncatedError(f"{self.path}: cannot put the shard in place: {e.strerror or e}") from e
            self._temporary = None
            if self.durable:
                fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        self._close_descriptors()
        return self.count

    def abort(self) -> None:
        """Deletes the unfinished shard: the temporary file, and the file this writer created at
        the path (a file that stood there before it stays as it was). Its locks go with the
        descriptors."""
        if self._created is not None:
            with contextlib.suppress(OSError):
                if os.lstat(self.path).st_ino == self._created:
                    os.unlink(self.path)
            self._created = None
        self._close_descriptors()

    def _close_descriptors(self) -> None:
        for fd in (self._fd, self._replaced):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._temporary is not None:  # failed before close: the temporary file is not the shard
            with contextlib.suppress(OSError):
                os.unlink(self._temporary)
            self._temporary = None
        self._fd = self._replaced = -1


__all__ = ["DEFAULT_CHUNK_TOKENS", "ShardWriter"]
