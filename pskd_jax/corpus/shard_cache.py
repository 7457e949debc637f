"""A local cache of whole corpus shards fetched from an object store: :class:`ShardCache`.

The cache is a directory of shard files named by their sha256 (``<sha256>.psk.d``: the content
names the file, so corpora that share a shard share its copy, and a shard rebuilt under the same
key is another file). A shard is fetched whole in one streamed request, hashed while it is
written to a temporary file beside its name, and put in place by a rename only when its size and
sha256 are the manifest's: a mismatch is E9017 naming the shard and its URL, and nothing is kept.
So no process ever sees a partial file, and two processes filling one cache (even the same
shard at once) each see a whole one.

The directory is bounded (``max_bytes``): after each fill the least recently used shards (by
modification time, which opening a cached shard renews, and so does a reader using it, at most
once a second: :mod:`pskd_jax.corpus.shard_copies`) are removed until it fits, never a shard the
caller is using, never a file the cache did not name. Shards are fetched when a reader first
needs them, and one that does not fit is not fetched (the reader reads it by byte ranges). A
removed shard that another process still has open stays readable there (a removal unlinks, it
never truncates). A fill's temporary file is the toolkit's usual one (locked while written):
those of fills whose process was killed are removed too, as beside any output. See
``docs/corpus.md`` (Corpora in a store).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output, remove_stale_temporaries
from pskd_jax._os.checks import checked_integer
from pskd_jax.errors import ShardMismatchError, TruncatedError, UsageError
from pskd_jax.storage import Store, locate

DEFAULT_CACHE_BYTES = 32 << 30  # the cache's default bound


class ShardCache:
    """The cache directory ``directory`` (made if missing), holding at most ``max_bytes`` of shards
    beyond those in use."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.directory = locate(directory).path  # a local directory: E9018 for a URL, never a directory "s3:"
        self.max_bytes = checked_integer(max_bytes, "cache_bytes", low=1)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except (OSError, ValueError) as e:
            raise UsageError(f"{self.directory}: cannot use it as a shard cache: "
                             f"{getattr(e, 'strerror', None) or e}") from None
        if not os.path.isdir(self.directory):
            raise UsageError(f"{self.directory}: not a directory, so no shard cache")

    def path(self, sha256: str) -> str:
        return os.path.join(self.directory, names.cached_shard(sha256))

    def open(self, store: Store, key: str, sha256: str, size: int, where: str) -> int:
        """A read-only descriptor of the shard ``key`` of ``store`` in the cache, fetched and
        checked now when it is not there (or is not ``size`` bytes long); ``where`` names the shard
        in messages (the manifest and the shard's index and path)."""
        path = self.path(sha256)
        fd = self._cached(path, size)
        if fd is not None:
            return fd
        return self._fill(store, key, sha256, size, where)

    def _cached(self, path: str, size: int) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None  # not there (or not a file of the cache's): fetched again
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode) or status.st_size != size:
                os.close(fd)
                return None
            with contextlib.suppress(OSError):
                os.utime(fd)  # used now: the last to go
        except OSError:
            os.close(fd)
            return None
        return fd

    def _fill(self, store: Store, key: str, sha256: str, size: int, where: str) -> int:
        path, url = self.path(sha256), store.url(key)
        digest, seen = hashlib.sha256(), 0
        with atomic_output(path, durable=True, links="replace") as f:
            for chunk in store.chunks(key):
                view = memoryview(chunk).cast("B")
                f.write(view)
                digest.update(view)
                seen += len(view)
            found = digest.hexdigest()
            if seen != size:
                raise ShardMismatchError(f"{where} ({url}): {seen} bytes fetched, the manifest makes it {size}; not "
                                         f"kept in the cache {self.directory}")
            if found != sha256:
                raise ShardMismatchError(f"{where} ({url}): sha256 {found}, the manifest records {sha256}; not kept "
                                         f"in the cache {self.directory}")
            # The descriptor of the file written, kept: once renamed into place it is the cached
            # shard, whatever another process removes meanwhile.
            fd = os.dup(f.fileno())
        os.lseek(fd, 0, os.SEEK_SET)  # (the copy shares the writer's offset, at the end)
        return fd

    def evict(self, keep: Iterable[str] = ()) -> int:
        """Removes the least recently used shards until the cache holds at most ``max_bytes``,
        never one whose sha256 is in ``keep``; returns the bytes the cache holds then."""
        kept = set(keep)
        found = []
        try:
            entries = list(os.scandir(self.directory))
        except OSError as e:
            raise TruncatedError(f"{self.directory}: cannot list the shard cache: {e.strerror or e}") from e
        for entry in entries:
            sha = names.cached_shard_sha256(entry.name)
            if sha is None:
                self._remove_if_abandoned(entry)  # a fill's temporary file, or anything not the cache's own
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    status = entry.stat(follow_symlinks=False)
                    found.append((status.st_mtime_ns, status.st_size, sha, entry.path))
            except OSError:
                continue  # gone while listed
        total = sum(size for _, size, _, _ in found)
        for _, size, sha, path in sorted(found):
            if total <= self.max_bytes:
                break
            if sha in kept:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        return total

    def _remove_if_abandoned(self, entry: os.DirEntry) -> None:
        """Removes the temporary files left beside a shard's name by fills whose process died
        (the toolkit's rule for any output: those no live writer holds locked)."""
        left = names.leftover(entry.name)
        if left is not None and left[0] == "random" and names.cached_shard_sha256(left[1]) is not None:
            remove_stale_temporaries(os.path.join(self.directory, left[1]))


__all__ = ["DEFAULT_CACHE_BYTES", "ShardCache"]
