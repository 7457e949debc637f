"""A checkpoint saved to a bucket by several JAX processes with no shared file system: each process
uploads the bytes it owns as one *part object*, and the checkpoint's own object is a small JSON
*parts index* that lists every part and which bytes of the checkpoint file each part holds. The
index is put by process 0 once every part is up: until then nothing stands at the checkpoint's
name (or the previous save does); the layout object follows it, recording the index's version.
The checkpoint file is never assembled; a restore reads each byte range from the part that holds
it. The design and its reasons are in ``docs/checkpoints.md`` ("Several processes, no shared file
system").

A part object is named after the checkpoint and the save: ``NAME.part-00001-of-00004.TOKEN`` for
process 1 of 4, ``TOKEN`` twelve lowercase hex digits drawn for the save (:func:`part_of` recognises
exactly these names, and nothing else is ever removed as a part).
The index::

    {"format": "pskd-parts", "version": 1, "bytes": SIZE,
     "parts": [{"key": "NAME.part-00000-of-00002", "bytes": N, "extents": [[OFFSET, LENGTH, AT], …]}, …]}

Each extent says: bytes ``[OFFSET, OFFSET + LENGTH)`` of the checkpoint file are bytes ``[AT, AT +
LENGTH)`` of the part. The extents of all parts tile the file exactly once (checked when read:
E9002 naming the index otherwise). Reading an index (parsing, checking, mapping ranges of the file
to the parts) is :mod:`pskd_jax.format.parts_index`, which every reader shares; this module names
the parts and is where a save finds the index it writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pskd_jax.format.parts_index import PARTS_FORMAT, PARTS_VERSION, PREFIX, PartsIndex, index_of
from pskd_jax.storage import Store

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
    if found is None:
        return None
    read = index_of(store, key, found[0], found[1], where)
    return None if read is None else read[0]


__all__ = ["PARTS_FORMAT", "PARTS_VERSION", "PREFIX", "TOKEN_BYTES", "PartsIndex", "part_key", "part_of",
           "parts_index_at", "parts_named_for"]
