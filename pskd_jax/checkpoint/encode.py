"""A leaf's values as on-disk bytes, a bounded chunk at a time.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pskd_jax.checkpoint.planning import SavePlan, leaf_name
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.encodings import (
    REAL_DTYPES,
    Encoding,
    Rounding,
    Site,
    check_finite_encoded,
    narrow,
    to_f64,
    to_index,
)

CHUNK_BYTES = 8 << 20  # a conversion or a check works on at most this much at a time


@dataclasses.dataclass(frozen=True)
class _ChunkSite(Site):
    """Names positions of a chunk by their index in the whole leaf."""

    full_shape: tuple[int, ...] = ()
    start: int = 0
    origin: tuple[int, ...] = ()  # where the chunk's box starts in the leaf (a shard's corner)

    def at(self, shape: tuple[int, ...], flat_index: int) -> str:
        position = np.unravel_index(self.start + flat_index, self.full_shape) if self.full_shape else ()
        if self.origin:
            position = tuple(p + o for p, o in zip(position, self.origin))
        return f"{self.leaf} at index {[int(i) for i in position]}"


def _flat_chunks(array: np.ndarray, max_bytes: int):
    """(start, flat contiguous chunk) pieces of an array, each at most ``max_bytes`` (or one row)."""
    if array.ndim == 0:
        yield 0, array.reshape(1)
        return
    itemsize = max(1, array.dtype.itemsize)
    if array.flags.c_contiguous:
        flat = array.reshape(-1)
        step = max(1, max_bytes // itemsize)
        for start in range(0, flat.size, step):
            yield start, flat[start : start + step]
        return
    row = math.prod(array.shape[1:])
    rows = max(1, max_bytes // max(1, row * itemsize))
    for r in range(0, array.shape[0], rows):
        yield r * row, np.ascontiguousarray(array[r : r + rows]).reshape(-1)


def _native_real(array: np.ndarray, encoding: Encoding) -> np.ndarray | None:
    """The array in its encoding's own dtype without any conversion (a byte-swapped float32 is
    swapped, not converted), or None when a conversion is needed."""
    own = REAL_DTYPES[encoding]
    if array.dtype == own:
        return array
    if array.dtype.kind == "f" and array.dtype.newbyteorder("=") == own:
        return array.astype(own)
    return None


def encode_chunks(i: int, plan_: SavePlan, round_to_encoding: bool, reports: dict[int, Rounding],
                  array: np.ndarray | None = None, origin: tuple[int, ...] = (), *, finite_only: bool = False):
    """Leaf i (or the box ``array`` of its values starting at ``origin``) as on-disk bytes, chunk by
    chunk (views of the caller's buffer when no conversion is needed). Refuses what its encoding
    does not hold (E9004); NaN and ±Inf are kept, bit for bit in the leaf's own encoding, unless
    ``finite_only``."""
    placement = plan_.placement
    leaf = placement.layout.leaves[i]
    if array is None:
        array = plan_.arrays[i]
    if plan_.forms:
        array = sd.to_stored(array, plan_.forms[i])
    box = tuple(array.shape)
    disk = placement.disk_dtypes[i]
    name = leaf_name(leaf.path)
    if leaf.bound is not None:  # an idx leaf
        for start, chunk in _flat_chunks(array, CHUNK_BYTES):
            site = _ChunkSite(name, full_shape=box, start=start, origin=origin)
            if chunk.dtype == disk or chunk.dtype == np.bool_:
                yield chunk.view(disk)  # every value of the dtype is below the bound
            else:
                yield to_index(chunk, leaf.bound, leaf=site)
        return
    encoding = placement.encodings[i]
    half = array.dtype == np.float16 and encoding == Encoding.F32
    native = None if half else _native_real(array, encoding)
    for start, chunk in _flat_chunks(array, CHUNK_BYTES):
        site = _ChunkSite(name, full_shape=box, start=start, origin=origin)
        if half or native is not None:
            # float16 goes to f32 by its bits (the hardware conversion would quiet a signalling NaN)
            encoded = sd.float16_to_float32(chunk) if half else _native_real(chunk, encoding)
            assert encoded is not None  # (a chunk of an array in its encoding's dtype is too)
            if finite_only:
                check_finite_encoded(encoded, encoding, site)
            yield encoded.view(disk)
            continue
        narrowed, report = narrow(to_f64(chunk, leaf=site), encoding, leaf=site,
                                  round_to_encoding=round_to_encoding, allow_nonfinite=not finite_only)
        if report is not None:
            if report.where:
                where = np.unravel_index(start + report.where[0], box) if box else ()
                report.where = tuple(int(k) + (origin[a] if origin else 0) for a, k in enumerate(where))
            report.leaf = name
            if i in reports:
                reports[i].merge(report)
            else:
                reports[i] = report
        yield narrowed.astype(REAL_DTYPES[encoding], copy=False).view(disk)


def bytes_of(chunk: np.ndarray) -> memoryview:
    return np.ascontiguousarray(chunk).reshape(-1).view(np.uint8).data


__all__ = ["CHUNK_BYTES", "bytes_of", "encode_chunks"]
