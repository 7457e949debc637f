"""Looking into files: ``info`` (header and first samples), ``diff`` (distance between the real
leaves of two files) and ``export`` (samples as JSON, every real read back exactly)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterator

import numpy as np

from pskd_jax.container import Reader
from pskd_jax.encodings import REAL_DISK_DTYPES, REAL_DTYPES, Encoding
from pskd_jax.errors import MISMATCH, PskdError
from pskd_jax.fileio import atomic_output

CHUNK_ELEMENTS = 1 << 20  # bounds the memory of diff and export, whatever the file's size
INFO_ELEMENTS = 64  # a leaf larger than this is shown in part by info
INFO_DEPTH = 32  # containers nested deeper than this are shown as … by info


# --------------------------------------------------------------------------------------------
# Values as text


def plain(value: Any) -> Any:
    """A sample's pytree → plain Python (lists, tuples, dicts, ints, floats) for printing or JSON.

    Reals become Python floats holding the stored value exactly (bf16 and f32 widen exactly).
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fV" or value.dtype == REAL_DTYPES[Encoding.BF16]:
            return value.astype(np.float64).tolist()
        return value.tolist()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {f: plain(getattr(value, f)) for f in value._fields}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _short(value: Any, depth: int = 0) -> str:
    """A sample as ``info`` prints it: large leaves cut to their first elements, and containers
    nested deeper than INFO_DEPTH shown as ``…`` (a tree of a thousand levels would otherwise
    exhaust Python's recursion limit)."""
    if isinstance(value, np.ndarray):
        if value.size > INFO_ELEMENTS:
            head = plain(value.reshape(-1)[:INFO_ELEMENTS])
            return f"{_text(head)[:-1]}, … ({value.size} elements, shape {list(value.shape)})]"
        return _text(plain(value))
    if isinstance(value, (tuple, dict, list)) and depth >= INFO_DEPTH:
        return "…"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return "(" + ", ".join(_short(v, depth + 1) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_short(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v, depth + 1) for v in value) + "]"
    return _text(plain(value))


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


# --------------------------------------------------------------------------------------------
# info


def info_lines(path: str, *, samples: int = 2, layout: Any = None) -> list[str]:
    """What ``pskd info`` prints: the header, the encodings, trailing bytes, the first samples."""
    return list(iter_info_lines(path, samples=samples, layout=layout))


def iter_info_lines(path: str, *, samples: int = 2, layout: Any = None) -> Iterator[str]:
    """:func:`info_lines` one line at a time: the header's lines come out before a damaged sample
    (an idx value beyond its bound: E9004) stops the listing."""
    with Reader(path, layout=layout) as reader:
        header = reader.header
        yield from [f"type    {header.type_text}", f"count   {header.count}", f"version {header.version}"]
        if reader.placement is None:
            yield from _params_lines(reader)
            return
        placement = reader.placement
        leaves = placement.layout.leaves
        yield f"sample  {placement.sample_bytes} bytes, {len(leaves)} leaves"
        if header.version == 2:
            yield "encodings " + " ".join(
                f"{leaf.path or '(root)'}={enc.label}" if leaf.is_real else f"{leaf.path or '(root)'}=idx"
                for leaf, enc in zip(leaves, placement.encodings)
            )
        if reader.trailing_bytes:
            yield (f"trailing {reader.trailing_bytes} bytes after the last sample (an interrupted "
                   "append; readers ignore them)")
        for k in range(min(samples, len(reader))):
            yield f"[{k}] {_short(reader[k])}"


def _params_lines(reader: Reader) -> list[str]:
    header = reader.header
    lines = []
    if header.encodings is not None:
        labels = " ".join(e.label for e in header.encodings)
        lines.append(f"leaves  {len(header.encodings)} (encodings in storage order: {labels})")
    lines.append(f"data    {reader.file_size - header.data_offset} bytes")
    lines.append(
        f"layout  the leaves of {header.type_text} come from the program that wrote it: "
        "supply its layout to read the samples"
    )
    return lines


# --------------------------------------------------------------------------------------------
# diff


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
            raise PskdError(
                MISMATCH,
                f"{path_a} holds {a.header.type_text!r}, {path_b} holds {b.header.type_text!r}",
            )
        if len(a) != len(b):
            raise PskdError(MISMATCH, f"{path_a} has {len(a)} samples, {path_b} has {len(b)}")
        if a.placement is None:
            return _diff_flat(a, b)
        if a.placement.layout.leaves != b.placement.layout.leaves:
            raise PskdError(MISMATCH, f"{path_a} and {path_b}: the layouts differ")
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
        raise PskdError(MISMATCH, f"{a.path} and {b.path}: the leaf encodings differ")
    kinds = set(encodings) if encodings is not None else {Encoding.F64}
    if len(kinds) != 1:
        raise PskdError(
            MISMATCH,
            f"{a.path}: its leaves have several encodings; supply the layout to compare them",
        )
    dtype = REAL_DISK_DTYPES[kinds.pop()]
    data_a, data_b = a.raw_data(), b.raw_data()
    if len(data_a) != len(data_b) or len(data_a) % dtype.itemsize:
        raise PskdError(MISMATCH, f"{a.path} and {b.path}: data of {len(data_a)} and {len(data_b)} bytes")
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


# --------------------------------------------------------------------------------------------
# export


def export_json(path: str, output: str, *, layout: Any = None) -> int:
    """Writes the samples of ``path`` as JSON to ``output``; returns the number of samples.

    ``{"type": …, "version": …, "encodings": […], "samples": […]}``: tensors as nested lists,
    tuples as lists, parameter trees as objects. Every real is the shortest decimal that reads
    back to the stored value (Python's float repr), so a reader in f64 gets the exact number.
    """
    with Reader(path, layout=layout) as reader:
        placement = reader.placement
        if placement is None:
            reader.samples()  # raises E9001 naming what is missing
        head = {
            "type": reader.header.type_text,
            "version": reader.header.version,
            "encodings": [
                enc.label if leaf.is_real else "idx"
                for leaf, enc in zip(placement.layout.leaves, placement.encodings)
            ],
            "count": len(reader),
        }
        layout = placement.layout
        per_sample = max(1, layout.sample_elements)
        step = max(1, CHUNK_ELEMENTS // per_sample)
        with atomic_output(output) as f:
            f.write(json.dumps(head, ensure_ascii=False)[:-1].encode("utf-8"))
            f.write(b', "samples": [')
            for start in range(0, len(reader), step):
                # gathered, not viewed: idx values are checked against their bound (E9004)
                chunk = reader.gather_leaves(np.arange(start, min(start + step, len(reader))))
                columns = [plain(leaf) for leaf in chunk]
                for k, row in enumerate(zip(*columns)):
                    sample = plain(layout.unflatten(list(row)))
                    separator = b"" if start + k == 0 else b", "
                    f.write(separator + json.dumps(sample, ensure_ascii=False, allow_nan=False).encode("utf-8"))
            f.write(b"]}\n")
        return len(reader)
