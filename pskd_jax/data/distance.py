"""``diff``: the distance between the real leaves of two files.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator
import numpy as np
from pskd_jax.format.reader import Reader
from pskd_jax.format.encodings import REAL_DISK_DTYPES, REAL_DTYPES, Encoding
from pskd_jax.errors import MismatchError


CHUNK_ELEMENTS = 1 << 20  # bounds the memory of diff and export, whatever the file's size

@dataclasses.dataclass(frozen=True)
class Distance:
    """‖a − b‖₂ and ‖a‖₂ over the real leaves of two files; ``relative`` is their ratio."""

    diff_norm: float
    a_norm: float
    elements: int
    without_layout: bool = False

    @property
    def relative(self) -> float:
        if self.a_norm == 0.0:
            return 0.0 if self.diff_norm == 0.0 else math.inf
        return self.diff_norm / self.a_norm

class _Norm:
    """A 2-norm accumulated chunk by chunk without overflow (scaled sum of squares)."""

    def __init__(self) -> None:
        self.scale = 0.0
        self.ssq = 0.0

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        largest = float(np.max(np.abs(values)))
        if largest == 0.0:
            return
        if largest > self.scale:
            self.ssq *= (self.scale / largest) ** 2
            self.scale = largest
        scaled = values / self.scale
        self.ssq += float(np.dot(scaled, scaled))

    @property
    def value(self) -> float:
        return self.scale * math.sqrt(self.ssq)

def diff(path_a: str, path_b: str, *, layout: Any = None) -> Distance:
    """The distance between the real leaves of two files of one type and count (E9005 otherwise).

    Two ``params`` files without a layout compare as flat vectors when every leaf has one encoding.
    """
    with Reader(path_a, layout=layout) as a, Reader(path_b, layout=layout) as b:
        if a.header.type_text != b.header.type_text:
            raise MismatchError(f"{path_a} holds {a.header.type_text!r}, {path_b} holds {b.header.type_text!r}",
            )
        if len(a) != len(b):
            raise MismatchError(f"{path_a} has {len(a)} samples, {path_b} has {len(b)}")
        if a.placement is None:
            return _diff_flat(a, b)
        if a.placement.layout.leaves != b.placement.layout.leaves:
            raise MismatchError(f"{path_a} and {path_b}: the layouts differ")
        diff_norm, a_norm, elements = _Norm(), _Norm(), 0
        for i, leaf in enumerate(a.placement.layout.leaves):
            if not leaf.is_real:
                continue
            for chunk_a, chunk_b in zip(_chunks(a.leaves()[i]), _chunks(b.leaves()[i])):
                diff_norm.add(chunk_a - chunk_b)
                a_norm.add(chunk_a)
                elements += chunk_a.size
        return Distance(diff_norm.value, a_norm.value, elements)

def _chunks(view: np.ndarray) -> Iterator[np.ndarray]:
    """A leaf's values over all samples as flat f64 chunks of bounded size."""
    per_sample = max(1, math.prod(view.shape[1:]))
    step = max(1, CHUNK_ELEMENTS // per_sample)
    for start in range(0, view.shape[0], step):
        yield view[start : start + step].astype(np.float64).reshape(-1)

def _diff_flat(a: Reader, b: Reader) -> Distance:
    encodings = a.header.encodings
    if encodings != b.header.encodings:
        raise MismatchError(f"{a.path} and {b.path}: the leaf encodings differ")
    kinds = set(encodings) if encodings is not None else {Encoding.F64}
    if len(kinds) != 1:
        raise MismatchError(f"{a.path}: its leaves have several encodings; supply the layout to compare them",
        )
    dtype = REAL_DISK_DTYPES[kinds.pop()]
    data_a, data_b = a.raw_data(), b.raw_data()
    if len(data_a) != len(data_b) or len(data_a) % dtype.itemsize:
        raise MismatchError(f"{a.path} and {b.path}: data of {len(data_a)} and {len(data_b)} bytes")
    flat_a = np.frombuffer(data_a, dtype=dtype)
    flat_b = np.frombuffer(data_b, dtype=dtype)
    if dtype == REAL_DISK_DTYPES[Encoding.BF16]:
        flat_a, flat_b = flat_a.view(REAL_DTYPES[Encoding.BF16]), flat_b.view(REAL_DTYPES[Encoding.BF16])
    diff_norm, a_norm = _Norm(), _Norm()
    for start in range(0, flat_a.size, CHUNK_ELEMENTS):
        chunk_a = flat_a[start : start + CHUNK_ELEMENTS].astype(np.float64)
        chunk_b = flat_b[start : start + CHUNK_ELEMENTS].astype(np.float64)
        diff_norm.add(chunk_a - chunk_b)
        a_norm.add(chunk_a)
    return Distance(diff_norm.value, a_norm.value, int(flat_a.size), without_layout=True)


__all__ = ["CHUNK_ELEMENTS", "Distance", "diff"]
