"""The *parts index* of a checkpoint that several processes saved to a bucket, read: the small JSON
object at the checkpoint's own key that lists its part objects and which bytes of the checkpoint
file each holds (the save that writes it: :mod:`pskd_jax.checkpoint.parts`). Everything that
reads such an object goes through here: parsing the index, checking that its parts hold every
byte of the file exactly once (E9002 naming the index otherwise), looking at the parts, and
mapping byte ranges of the file to the ranges of the parts that hold them.

The index::

    {"format": "pskd-parts", "version": 1, "bytes": SIZE,
     "parts": [{"key": "NAME.part-00000-of-00002", "bytes": N, "extents": [[OFFSET, LENGTH, AT], …]}, …]}

Each extent says: bytes ``[OFFSET, OFFSET + LENGTH)`` of the checkpoint file are bytes ``[AT, AT +
LENGTH)`` of the part. A part's key is a key of the same store (not relative to the index).
See ``docs/checkpoints.md`` ("Several processes, no shared file system").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskd_jax._os.jsonfile import json_text, loads_strict
from pskd_jax.errors import NotPskdError, TruncatedError
from pskd_jax.storage import ObjectInfo, Store

PARTS_FORMAT = "pskd-parts"
PARTS_VERSION = 1
PREFIX = b'{"format": "pskd-parts"'  # how an index object begins (it is written so)
LOOK_THREADS = 16  # the most parts looked at at once when an index is opened


@dataclasses.dataclass(frozen=True)
class PartsIndex:
    """A parts index read back: the checkpoint file's size, each part's key and size, and every
    extent as (file offset, length, part, offset in the part), by file offset."""

    size: int
    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    extents: np.ndarray  # int64 (n, 4)

    def to_json(self) -> dict[str, Any]:
        parts = []
        for p, (key, size) in enumerate(zip(self.keys, self.sizes)):
            mine = self.extents[self.extents[:, 2] == p]
            parts.append({"key": key, "bytes": size, "extents": [[int(a), int(n), int(at)] for a, n, _, at in mine]})
        return {"format": PARTS_FORMAT, "version": PARTS_VERSION, "bytes": self.size, "parts": parts}

    def encoded(self) -> bytes:
        return json_text(self.to_json()).encode("utf-8")

    @classmethod
    def of(cls, size: int, keys: Sequence[str], sizes: Sequence[int], extents: Sequence[np.ndarray],
           where: str) -> PartsIndex:
        """The index of parts ``keys`` whose extents (one (n, 3) array a part: file offset,
        length, offset in the part) must tile ``[0, size)``."""
        rows = [np.column_stack([e[:, 0], e[:, 1], np.full(len(e), p), e[:, 2]]) for p, e in enumerate(extents)
                if len(e)]
        table = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 4), np.int64)
        table = table[table[:, 1] > 0]
        table = table[np.argsort(table[:, 0], kind="stable")]
        index = cls(int(size), tuple(keys), tuple(int(s) for s in sizes), table)
        index.check(where)
        return index

    def check(self, where: str) -> None:
        """E9002 naming ``where`` unless the extents tile the file exactly once, each within its part."""
        table = self.extents
        starts, lengths, parts, at = table[:, 0], table[:, 1], table[:, 2], table[:, 3]
        ends = starts + lengths
        if len(table) == 0:
            ok = self.size == 0
        else:
            ok = (starts[0] == 0 and ends[-1] == self.size and bool(np.all(starts[1:] == ends[:-1]))
                  and bool(np.all(lengths > 0)) and bool(np.all(at >= 0)) and bool(np.all(parts >= 0))
                  and bool(np.all(parts < len(self.keys)))
                  and bool(np.all(lengths <= np.asarray(self.sizes, np.int64)[parts] - at)))  # (no sum to wrap)
        if not ok:
            raise NotPskdError(f"{where}: a parts index whose parts do not hold every byte of the checkpoint "
                               "exactly once")

    @classmethod
    def parse(cls, raw: bytes, where: str) -> PartsIndex:
        content = loads_strict(raw, where, NotPskdError, kind="a parts index")
        try:
            if content["format"] != PARTS_FORMAT or content["version"] != PARTS_VERSION:
                raise ValueError(f"format {content['format']!r} version {content['version']!r}")
            keys, sizes, extents = [], [], []
            for part in content["parts"]:
                if not isinstance(part["key"], str) or not _count(part["bytes"]):
                    raise ValueError("a part's key or size")
                rows = np.asarray(part["extents"], dtype=np.int64).reshape(-1, 3)
                if not all(_count(v) for row in part["extents"] for v in row):
                    raise ValueError("an extent that is not three sizes")
                keys.append(part["key"])
                sizes.append(part["bytes"])
                extents.append(rows)
            if not _count(content["bytes"]):
                raise ValueError("bytes")
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise NotPskdError(f"{where}: not a parts index of this toolkit ({str(e)[:200]})") from None
        return cls.of(content["bytes"], keys, sizes, extents, where)

    def pieces(self, spans: Sequence[memoryview], offsets: Sequence[int], where: str
               ) -> dict[int, tuple[list[memoryview], list[int]]]:
        """Where each span's bytes are: for each part that holds some, the pieces of the spans it
        fills and their offsets in the part (E9003 naming ``where`` for a span past the file's end)."""
        starts = self.extents[:, 0]
        by_part: dict[int, tuple[list[memoryview], list[int]]] = {}
        for span, offset in zip(spans, offsets):
            view, offset = memoryview(span).cast("B"), int(offset)
            if offset < 0 or offset + len(view) > self.size:
                raise TruncatedError(f"{where}: the checkpoint ends before byte {offset + len(view)} (it holds "
                                     f"{self.size} bytes)")
            done = 0
            k = int(np.searchsorted(starts, offset, side="right")) - 1
            while done < len(view):
                start, length, part, at = (int(v) for v in self.extents[k])
                skip = offset + done - start
                take = min(length - skip, len(view) - done)
                views, places = by_part.setdefault(part, ([], []))
                views.append(view[done : done + take])
                places.append(at + skip)
                done += take
                k += 1
        return by_part

    def read_spans(self, store: Store, base: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        """Fills each span with the checkpoint file's bytes from its offset, read from the parts
        that hold them, one part after the other (``base`` names the checkpoint in messages)."""
        for part, (views, places) in sorted(self.pieces(spans, offsets, base).items()):
            store.read_spans(self.keys[part], views, places)

    def looked_at(self, store: Store, where: str) -> tuple[str, ...]:
        """Each part's version tag now, the parts looked at concurrently: E9003 naming the index and
        the part when one is missing, or not the size the index lists (cut short or replaced)."""
        def look(p: int) -> str:
            found = store.info(self.keys[p])
            if found is None:
                raise TruncatedError(f"{where}: part {store.url(self.keys[p])} of the checkpoint is missing")
            if found.size != self.sizes[p]:
                raise TruncatedError(f"{where}: part {store.url(self.keys[p])} holds {found.size} bytes, the index "
                                     f"lists {self.sizes[p]} (cut short or replaced since the save)")
            return found.tag

        if len(self.keys) <= 1:
            return tuple(look(p) for p in range(len(self.keys)))
        with concurrent.futures.ThreadPoolExecutor(min(LOOK_THREADS, len(self.keys)),
                                                   thread_name_prefix="pskd-parts") as pool:
            futures = [pool.submit(look, p) for p in range(len(self.keys))]
            concurrent.futures.wait(futures)
        return tuple(future.result() for future in futures)

    def changed(self, store: Store, tags: Sequence[str], where: str) -> str | None:
        """What changed among the parts since they had ``tags`` (:meth:`looked_at`), in words, or None."""
        try:
            now = self.looked_at(store, where)
        except TruncatedError as e:
            return e.message
        moved = [store.url(key) for key, then, tag in zip(self.keys, tags, now) if then != tag]
        return f"{where}: part {moved[0]} was replaced since the checkpoint was opened" if moved else None


def index_of(store: Store, key: str, head: bytes, info: ObjectInfo, where: str
             ) -> tuple[PartsIndex, ObjectInfo] | None:
    """The parts index at ``key`` when ``head`` (the object's first bytes, ``info`` what it was)
    begins as one does, and the version of the object it was read from; None for any other object."""
    if not head.startswith(PREFIX):
        return None
    if len(head) != info.size:
        head, info = store.get(key)
    return PartsIndex.parse(head, where), info


def _count(value: Any) -> bool:
    """Whether ``value`` is a size or an offset: an int in ``[0, 2**63)``, as the extents' int64 table holds."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


__all__ = ["LOOK_THREADS", "PARTS_FORMAT", "PARTS_VERSION", "PREFIX", "PartsIndex", "index_of"]
