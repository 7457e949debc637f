"""What every store does: the small set of operations checkpoints and corpora are written against.

A store holds *objects* by key: a local directory tree (:class:`pskd_jax.storage.local.LocalStore`)
or a bucket of an object store (:class:`pskd_jax.storage.objects.ObjectStore`). An object is
written whole or not at all (there is no rename on a bucket, so nothing is ever "moved into
place"), read whole or by byte ranges, listed by prefix and deleted. A write can be conditional —
only if nothing is there yet, or only if what is there is still the version read — which is how
an index (``checkpoints.json``, ``shards.json``) written last commits a checkpoint or a corpus
without a lock (:class:`Conflict` for the loser). See ``docs/storage.md``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.digests import DIGESTS

# A buffer of bytes: bytes, a memoryview, a 1-D uint8 numpy array or obstore's Bytes.
Buffer = Any

CREATE = "create"  # write only when nothing stands at the key
OVERWRITE = "overwrite"  # write whatever stands there (the default)


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a store says of one object: its key, size in bytes and version tag (an ETag, a
    generation, or for a local file its inode, size and modification time): two reads that see
    the same tag saw the same object."""

    key: str
    size: int
    tag: str


@dataclasses.dataclass(frozen=True)
class Version:
    """A conditional write's precondition: write only when the object at the key still has
    ``tag`` (the version read before)."""

    tag: str


class Conflict(Exception):
    """A conditional write lost: something is at the key already (``create``), or the object
    there is no longer the version read. Internal: each caller raises its own E9xxx, naming what
    lost (a checkpoint step, a corpus)."""

    def __init__(self, url: str, why: str):
        super().__init__(f"{url}: {why}")
        self.url = url
        self.why = why


class Changed(Exception):
    """A read conditioned on a version tag (``read_ranges(…, tag=…)``) found another version of
    the object at the key: it was replaced since the tag was taken. Internal: the reader raises
    its own E9xxx, naming what changed (a shard, a ``.psk.d`` object)."""

    def __init__(self, url: str, tag: str):
        super().__init__(f"{url}: no longer the version {tag} read before")
        self.url = url
        self.tag = tag


def merged_ranges(offsets: Sequence[int], lengths: Sequence[int], gap: int = 0
                  ) -> tuple[list[int], list[int], list[int]]:
    """The ranges to request for spans at ``offsets`` of ``lengths`` (empty ones left out): the
    spans sorted, those that overlap, touch or lie at most ``gap`` bytes apart merged into one
    ``[start, stop)``. Returns the starts, the stops, and for each span the index of the range
    that holds it (-1 for an empty span).

    >>> merged_ranges([10, 0, 4, 30], [5, 4, 2, 1])
    ([0, 10, 30], [6, 15, 31], [1, 0, 0, 2])
    >>> merged_ranges([10, 0, 4, 30], [5, 4, 2, 1], gap=4)
    ([0, 30], [15, 31], [0, 0, 0, 1])
    """
    order = sorted((int(o), int(n), j) for j, (o, n) in enumerate(zip(offsets, lengths)) if n > 0)
    starts: list[int] = []
    stops: list[int] = []
    which = [-1] * len(offsets)
    for offset, length, j in order:
        if starts and offset <= stops[-1] + gap:
            stops[-1] = max(stops[-1], offset + length)
        else:
            starts.append(offset)
            stops.append(offset + length)
        which[j] = len(starts) - 1
    return starts, stops, which


class Store(abc.ABC):
    """A place that holds objects by key (see the module's documentation). Keys are ``/``-separated
    relative names; for a local store they are paths. Every error is a ``PskdError`` naming the
    URL (E9003 for an object that is missing or shorter than asked, E9018 for a store that keeps
    failing), except :class:`Conflict`."""

    scheme: str

    @abc.abstractmethod
    def url(self, key: str) -> str:
        """The URL (or path) of ``key``, as messages show it."""

    @abc.abstractmethod
    def info(self, key: str) -> ObjectInfo | None:
        """The object at ``key``, or None when there is none."""

    @abc.abstractmethod
    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        """The whole object and what it was (its tag is the version read); E9003 when missing."""

    @abc.abstractmethod
    def read_ranges(self, key: str, starts: Sequence[int], stops: Sequence[int], *,
                    coalesce: int | None = None, tag: str | None = None) -> list[Buffer]:
        """The bytes of each range ``[start, stop)``, many requests in flight; E9003 when the object
        is missing or ends before a range does. ``coalesce``: ranges at most this many bytes apart
        are read in one request (None: the client's default, 1 MiB; a local store ignores it).
        ``tag``: every request is conditioned on the object still being that version (an
        ``If-Match``, no request more), :class:`Changed` when it is not."""

    @abc.abstractmethod
    def read_into(self, key: str, offset: int, out: memoryview, *, tag: str | None = None) -> None:
        """Fills ``out`` with the object's bytes from ``offset`` on, in pieces read concurrently and
        copied straight into ``out``; E9003 when the object ends first. ``tag``: as for
        :meth:`read_ranges`."""

    def head(self, key: str, size: int) -> tuple[bytes, ObjectInfo] | None:
        """The first ``size`` bytes of the object (fewer when it is shorter) and what it is, None
        when there is none: a header and the object's size and version tag in one request where
        the store allows it."""
        info = self.info(key)
        if info is None:
            return None
        first = min(size, info.size)
        got = self.read_ranges(key, [0], [first])[0] if first else b""
        return bytes(memoryview(got).cast("B")), info

    def read_spans(self, key: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        """Fills each buffer of ``spans`` with the object's bytes from its offset in ``offsets``
        (a restore's leaves and shard runs, each straight into its destination); E9003 when the
        object ends first. Every span is filled, or the call raises."""
        stops = [int(offset) + len(span) for span, offset in zip(spans, offsets)]
        for span, got in zip(spans, self.read_ranges(key, offsets, stops)):
            span[:] = memoryview(got).cast("B")

    @abc.abstractmethod
    def chunks(self, key: str, chunk_bytes: int = 8 << 20) -> Iterator[Buffer]:
        """The whole object, in order, a chunk at a time (for digests of whole objects)."""

    @abc.abstractmethod
    def put(self, key: str, data: Buffer | Iterable[Buffer], *, mode: str | Version = OVERWRITE,
            durable: bool = True, size: int | None = None) -> ObjectInfo:
        """Writes an object whole, visible only once complete (a generator that raises leaves
        nothing). ``mode``: :data:`OVERWRITE`, :data:`CREATE` or a :class:`Version`; a condition
        that does not hold raises :class:`Conflict` and writes nothing. ``size``: the bytes an
        iterable of pieces holds, when the caller knows them: an object store makes the parts of
        its upload large enough to fit S3's 10000 (a local store ignores it)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Removes the object at ``key`` (nothing when there is none)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """The objects directly under ``prefix`` (one level, like a directory's files), by key."""


def read_all(store: Store, key: str, size: int) -> np.ndarray:
    """The first ``size`` bytes of an object in a new array (E9003 when it is shorter)."""
    out = np.empty(size, np.uint8)
    store.read_into(key, 0, out.data)
    return out


def object_digest(store: Store, key: str, algorithm: str) -> str:
    """The digest of a whole object (``"sha256"`` or ``"xxh3_128"``), streamed: never held whole."""
    digest = DIGESTS[algorithm]()
    for chunk in store.chunks(key):
        digest.update(chunk)
    return digest.hexdigest()


__all__ = ["CREATE", "OVERWRITE", "Buffer", "Changed", "Conflict", "ObjectInfo", "Store", "Version", "merged_ranges",
           "object_digest", "read_all"]
