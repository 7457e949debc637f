"""A checkpoint saved to a bucket by several JAX processes with no shared file system: each process
uploads the bytes it owns as one *part object*, and the checkpoint's own object is a small JSON
*parts index* that lists every part and which bytes of the checkpoint file each part holds. The
index is put last, by process 0, once every part is up: until then nothing stands at the
checkpoint's name (or the previous save does). The checkpoint file is never assembled; a restore
reads each byte range from the part that holds it. The design and its reasons are in
``docs/checkpoints.md`` ("Several processes, no shared file system").

A part object is named after the checkpoint: ``NAME.part-00001-of-00004`` for process 1 of 4.
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

from pskd_jax.format.parts_index import PARTS_FORMAT, PARTS_VERSION, PREFIX, PartsIndex


def part_key(key: str, process: int, count: int) -> str:
    """The key of process ``process``'s part object (of ``count``) of the checkpoint ``key``."""
    return f"{key}.part-{process:05d}-of-{count:05d}"


__all__ = ["PARTS_FORMAT", "PARTS_VERSION", "PREFIX", "PartsIndex", "part_key"]
