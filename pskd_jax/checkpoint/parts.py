"""A checkpoint saved to a bucket by several JAX processes with no shared file system: each process
uploads the bytes it owns as one *part object*, and the checkpoint's own object is a small JSON
*parts index* that lists every part and which bytes of the checkpoint file each part holds. The
index is put last, by process 0, once every part is up: until then nothing stands at the
checkpoint's name (or the previous save does). The checkpoint file is never assembled; a restore
reads each byte range from the part that holds it. The design and its reasons are in
``docs/checkpoints.md`` ("Several processes, no shared file system").

A part object is named after the checkpoint and the save: ``NAME.part-00001-of-00004.TOKEN`` for
process 1 of 4, ``TOKEN`` twelve lowercase hex digits drawn for the save (:func:`part_of` recognises
exactly these names, and nothing else is ever removed as a part).
The index::

    {"format": "pskd-parts", "version": 1, "bytes": SIZE,
     "parts": [{"key": "NAME.part-00000-of-00002", "bytes": N, "extents": [[OFFSET, LENGTH, AT], …]}, …]}

Each extent says: bytes ``[OFFSET, OFFSET + LENGTH)`` of the checkpoint file are bytes ``[AT, AT +
LENGTH)`` of the part. The extents of all parts tile the file exactly once (checked when read:
E9002 naming the index otherwise).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.jsonfile import json_text, loads_strict
from pskd_jax.errors import NotPskdError, TruncatedError
from pskd_jax.storage import Store

PARTS_FORMAT = "pskd-parts"
PARTS_VERSION = 1
PREFIX = b'{"format": "pskd-parts"'  # how an index object begins (it is written so)
TOKEN_BYTES = 6  # the random token of a save, in its part names as 12 lowercase hex digits
_PART_NAME = re.compile(r"(?P<key>.+)\.part-(?P<process>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.(?P<token>[0-9a-f]{12})")


def part_key(key: str, process: int, count: int) -> str:
    """The key of process ``process``'s part object (of ``count``) of the checkpoint ``key``."""
    return f"{key}.part-{process:05d}-of-{count:05d}"


def part_of(key: str) -> tuple[str, int, int, str] | None:
    """``(checkpoint key, process, count, token)`` of a part object's key named exactly as a parts
    save names it (``part_key(KEY, P, C) + "." + TOKEN``, process below count, the token 12
    lowercase hex digits); None for any other name (``NAME.part-notes``, ``NAME.part-00000-of-00002``
    without a token, an upper-case token, a padding other than the toolkit's).

    >>> part_of("run/step.psk.d.part-00001-of-00002.0123456789ab")
    ('run/step.psk.d', 1, 2, '0123456789ab')
    >>> part_of("run/step.psk.d.part-notes"), part_of("run/step.psk.d.part-00002-of-00002.0123456789ab")
    (None, None)
    """
    found = _PART_NAME.fullmatch(key)
    if found is None:
        return None
    name, process, count, token = found["key"], int(found["process"]), int(found["count"]), found["token"]
    if process >= count or f"{part_key(name, process, count)}.{token}" != key:
        return None
    return name, process, count, token


def parts_named_for(keys: Iterable[str], checkpoint: str) -> list[str]:
    """Those of ``keys`` (keys, or names in one directory) that are part objects of the checkpoint
    ``checkpoint`` (its key, or its name in that directory) by :func:`part_of`, in order."""
    return [key for key in keys if (found := part_of(key)) is not None and found[0] == checkpoint]


def parts_index_at(store: Store, key: str, where: str) -> PartsIndex | None:
    """The parts index standing at ``key`` (read and checked: E9002 naming ``where`` for a damaged
    one), or None when there is no object there or it is not a parts index."""
    found = store.head(key, 1 << 20)
    if found is None or not found[0].startswith(PREFIX):
        return None
    raw = found[0] if len(found[0]) == found[1].size else store.get(key)[0]
    return PartsIndex.parse(raw, where)


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
                  and bool(np.all(at + lengths <= np.asarray(self.sizes, np.int64)[parts])))
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

    def read_spans(self, store: Store, base: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        """Fills each span with the checkpoint file's bytes from its offset, read from the parts
        that hold them (``base``: the key prefix the part keys are under)."""
        starts = self.extents[:, 0]
        by_part: dict[int, tuple[list[memoryview], list[int]]] = {}
        for span, offset in zip(spans, offsets):
            view, offset = memoryview(span).cast("B"), int(offset)
            if offset + len(view) > self.size:
                raise TruncatedError(f"{base}: the checkpoint ends before byte {offset + len(view)}")
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
        for part, (views, places) in sorted(by_part.items()):
            store.read_spans(self.keys[part], views, places)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


__all__ = ["PARTS_FORMAT", "PARTS_VERSION", "PREFIX", "TOKEN_BYTES", "PartsIndex", "part_key", "part_of",
           "parts_index_at", "parts_named_for"]
