"""The copies of a store's shards that one ``CorpusWindows`` holds open from its local cache:
:class:`ShardCopies`.

A shard is fetched into the cache (:class:`~pskd_jax.corpus.shard_cache.ShardCache`) when a read
first touches it, not when the windows open: the shards a read touches that are not held yet
are fetched together (on threads, each hashed as it is written) as far as they fit in the
cache's bound beside the held ones that read also needs; the windows' own least recently used
copies are let go to make room, and the cache then removes its least recently used files down to
its bound, never one held here. A shard that does not fit (larger than the whole cache, or
beyond what a read's other shards leave) is not fetched: the caller reads it by byte ranges from
the store. So the copies held never take more than the cache's bound, whatever the corpus's size.

A copy let go is closed only when the last view of its map is collected (a gather still reading
it on another thread finishes), and a cached file removed while a copy of it is held stays
readable through it (a removal unlinks, it never truncates).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pskd_jax.corpus.shard_cache import ShardCache
from pskd_jax.errors import PskdError
from pskd_jax.format.byte_sources import FileBytes

RENEW_SECONDS = 1.0  # a held copy's file is marked used (its mtime renewed) at most this often


@dataclasses.dataclass(eq=False)
class Copy:
    """One shard's file in the cache, held open: its descriptor and, with mapped access, its tokens
    as a view of the map (else an empty array)."""

    sha256: str
    size: int
    bytes: FileBytes
    tokens: np.ndarray
    renewed: float = dataclasses.field(default_factory=time.monotonic)


class ShardCopies:
    """The copies held from ``cache``, at most ``cache.max_bytes`` of them, ``threads`` fetched at
    once. Safe to use from several threads."""

    def __init__(self, cache: ShardCache, threads: int):
        self.cache = cache
        self.threads = threads
        self._lock = threading.Lock()  # the held copies
        self._filling = threading.Lock()  # one fill of several shards at a time
        self._held: collections.OrderedDict[str, Copy] = collections.OrderedDict()  # least recently used first
        self._frozen: Mapping[str, Copy] = {}  # the held copies, replaced whole when they change
        self.version = 0  # counts the changes of the held copies
        self._renewed = time.monotonic()

    def held(self) -> Mapping[str, Copy]:
        """The copies held now, by sha256 (a mapping that does not change)."""
        return self._frozen

    def obtain(self, wanted: Sequence[tuple[str, int]], fill: Callable[[int], Copy]) -> tuple[int, Mapping[str, Copy]]:
        """Marks the shards ``wanted`` (``(sha256, size)`` each, those a read touches) used and
        fetches those not held that fit (``fill(j)`` makes the copy of ``wanted[j]``); returns the
        version of the held copies and the copies. An error of a fill (E9017 for a shard that does
        not match) is raised once the other fills are done and kept."""
        with self._lock:
            missing = self._use(wanted)
            if not missing:
                return self.version, self._frozen
        with self._filling:
            with self._lock:
                missing = self._use(wanted)
                if not missing:
                    return self.version, self._frozen
                chosen = self._make_room(wanted, missing)
            if not chosen:
                return self.version, self._frozen
            made, errors = self._fill(chosen, fill)
            with self._lock:
                for copy in made:
                    self._held[copy.sha256] = copy
                    self._held.move_to_end(copy.sha256)
                self._changed()
                keep = set(self._held)
            self.cache.evict(keep=keep)
            if errors:
                raise errors[0]
            return self.version, self._frozen

    def _use(self, wanted: Sequence[tuple[str, int]]) -> list[int]:
        """Marks the held shards of ``wanted`` used now; returns the indices of the others (each
        shard once) that could be held at all (not larger than the cache)."""
        missing, seen, now = [], set(), 0.0
        for j, (sha, size) in enumerate(wanted):
            copy = self._held.get(sha)
            if copy is not None:
                self._held.move_to_end(sha)
                now = now or time.monotonic()
                if now - copy.renewed > RENEW_SECONDS:  # other processes sharing the cache see it used
                    copy.renewed = now
                    with contextlib.suppress(OSError, PskdError):
                        os.utime(copy.bytes.fileno())
            elif sha not in seen and size <= self.cache.max_bytes:
                seen.add(sha)
                missing.append(j)
        return missing

    def renew(self) -> None:
        """Marks every held copy used, at most once in ``RENEW_SECONDS`` (what a read of shards all
        held calls in place of :meth:`obtain`: none is fetched, none let go)."""
        now = time.monotonic()
        if now - self._renewed > RENEW_SECONDS:
            self._renewed = now
            with self._lock:
                self._use([(sha, copy.size) for sha, copy in self._held.items()])

    def _make_room(self, wanted: Sequence[tuple[str, int]], missing: list[int]) -> list[int]:
        """Which of ``missing`` to fetch (in order, while they fit beside the held shards this read
        needs), the least recently used other copies let go to make room for them."""
        needed = {sha for sha, _ in wanted}
        room = self.cache.max_bytes - sum(c.size for sha, c in self._held.items() if sha in needed)
        chosen = []
        for j in missing:
            if wanted[j][1] <= room:
                chosen.append(j)
                room -= wanted[j][1]
        if chosen:
            total = sum(c.size for c in self._held.values()) + sum(wanted[j][1] for j in chosen)
            for sha in [s for s in self._held if s not in needed]:  # least recently used first
                if total <= self.cache.max_bytes:
                    break
                total -= self._held.pop(sha).size  # closed with its last view (see the module)
            self._changed()
        return chosen

    def _fill(self, chosen: list[int], fill: Callable[[int], Copy]) -> tuple[list[Copy], list[BaseException]]:
        if len(chosen) == 1:
            futures_results: list[tuple[Copy | None, BaseException | None]] = []
            try:
                futures_results.append((fill(chosen[0]), None))
            except Exception as e:
                futures_results.append((None, e))
        else:
            with concurrent.futures.ThreadPoolExecutor(min(self.threads, len(chosen)),
                                                       thread_name_prefix="pskd-fill") as pool:
                futures = [pool.submit(fill, j) for j in chosen]
                concurrent.futures.wait(futures)
            futures_results = [(f.result(), None) if f.exception() is None else (None, f.exception())
                               for f in futures]
        made = [copy for copy, _ in futures_results if copy is not None]
        errors = [error for _, error in futures_results if error is not None]
        return made, errors

    def _changed(self) -> None:
        self._frozen = dict(self._held)
        self.version += 1

    def close(self) -> None:
        """Closes every copy held (their maps when no view of them is left)."""
        with self._lock:
            copies = list(self._held.values())
            self._held.clear()
            self._changed()
        for copy in copies:
            copy.bytes.close()


__all__ = ["Copy", "ShardCopies"]
