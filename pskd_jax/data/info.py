"""``info``: a file's header, its encodings and its first samples, as lines of text.

A checkpoint (a ``params`` file, or a file read through a layout file) shows its leaves instead —
each key path, the dtype and shape a restore gives back, and how it is stored — and its values
only on request (``values=True``, or ``samples`` given), as a restore gives them back
(:func:`pskd_jax.data.export.shown_values`). What ``pskd info`` prints: ``docs/commands.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from pskd_jax._os.checks import checked_integer, counted
from pskd_jax.data.export import ShownLeaves, open_with_layout, plain
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.layout_file import LayoutFile
from pskd_jax.format.reader import Reader

INFO_ELEMENTS = 64  # a leaf larger than this is shown in part by info

INFO_DEPTH = 32  # containers nested deeper than this are shown as … by info

INFO_SAMPLES = 2  # the samples shown when values are shown and no count is given

PATH_WIDTH = 60  # key paths are padded to the longest, up to this many characters

BYTE_0_LABEL = "f64|idx"  # encoding byte 0 of a params file read without its layout


class _Head:
    """The first INFO_ELEMENTS elements of a leaf too large to show whole, and its shape: all of it
    that info reads (a positional read of those elements, never the whole sample)."""

    def __init__(self, values: np.ndarray, shape: tuple[int, ...]):
        self.values, self.shape = values, shape
        self.size = int(np.prod(shape, dtype=object))


def _sample(reader: Reader, k: int, shown: ShownLeaves) -> Any:
    """Sample ``k`` as info shows it: small leaves whole, large ones as their :class:`_Head`."""
    layout = shown.placement.layout
    values = []
    for i, leaf in enumerate(layout.leaves):
        if leaf.size > INFO_ELEMENTS and not shown.whole(i):
            values.append(_Head(shown.leaf(i, reader.leaf_range(k, i, 0, INFO_ELEMENTS)), leaf.shape))
        else:
            values.append(shown.leaf(i, reader.leaf_range(k, i, 0, leaf.size).reshape(leaf.shape)))
    return layout.unflatten(values)


def _short(value: Any, depth: int = 0) -> str:
    """A sample as ``info`` prints it: large leaves cut to their first elements, and containers
    nested deeper than INFO_DEPTH shown as ``…`` (a tree of a thousand levels would otherwise
    exhaust Python's recursion limit)."""
    if isinstance(value, _Head):
        return f"{_text(plain(value.values))[:-1]}, … ({value.size} elements, shape {list(value.shape)})]"
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


def info_lines(path: str, *, samples: int | None = None, layout: Any = None, values: bool | None = None) -> list[str]:
    """What ``pskd info`` prints: the header, then a data file's encodings and first samples, or a
    checkpoint's leaves (see :func:`iter_info_lines`)."""
    return list(iter_info_lines(path, samples=samples, layout=layout, values=values))


def iter_info_lines(path: str, *, samples: int | None = None, layout: Any = None,
                    values: bool | None = None) -> Iterator[str]:
    """:func:`info_lines` one line at a time: the header's lines come out before a damaged sample
    (an idx value beyond its bound: E9004) stops the listing.

    ``layout`` reads a ``params`` file: a :class:`LayoutFile` (which must belong to the file:
    E9005 naming both files otherwise), a :class:`Layout` or a template. A checkpoint — a
    ``params`` file, or any file read through a layout file — lists its leaves (key path, the
    dtype and shape a restore gives back, how each is stored) and shows values only when
    ``values`` is True or ``samples`` is given; a data file shows its first ``samples`` samples
    (default :data:`INFO_SAMPLES`) unless ``values`` is False. Values are shown as a restore gives
    them back when the layout file says how (an int8 −3 as -3).

    The file is read with positional reads (a file cut short meanwhile is E9003), and of each
    sample shown only what is printed: a leaf of more than INFO_ELEMENTS elements shows its first
    ones, read on their own. Non-finite reals print as export writes them (``NaN``,
    ``Infinity``, ``-Infinity``, ``NaN:0x…``)."""
    # (--samples -1 is a mistake to say, not "show none": E9012 before the file is opened)
    if samples is not None:
        samples = checked_integer(samples, "--samples", low=0)
    source = layout.path if isinstance(layout, LayoutFile) and layout.path else None
    reader, forms = open_with_layout(path, layout)
    with reader:
        header = reader.header
        yield from [f"type    {header.type_text}", f"count   {header.count}", f"version {header.version}"]
        if reader.placement is None:
            yield from _params_lines(reader)
            return
        placement = reader.placement
        leaves = placement.layout.leaves
        checkpoint = header.is_params or forms is not None
        show = values if values is not None else (samples is not None or not checkpoint)
        yield f"sample  {counted(placement.sample_bytes, 'byte')}, {counted(len(leaves), 'leaf', 'leaves')}"
        if checkpoint:
            if source:
                yield f"layout  {source}"
            yield from _leaf_lines(placement, forms)
        elif header.version == 2:
            yield "encodings " + " ".join(f"{leaf.path or '(root)'}={label}"
                                          for leaf, label in zip(leaves, placement.labels))
        if reader.trailing_bytes:
            yield (f"trailing {reader.trailing_bytes} bytes after the last sample (an interrupted "
                   "append; readers ignore them)")
        if not show:
            yield "values  not shown (--values shows them)"
            return
        shown = ShownLeaves(reader, forms)
        for k in range(min(INFO_SAMPLES if samples is None else samples, len(reader))):
            yield f"[{k}] {_short(_sample(reader, k, shown))}"


def _leaf_lines(placement, forms: list[sd.Form | None] | None) -> list[str]:
    """One line a leaf: its key path, the dtype and shape it gives back, and how it is stored."""
    leaves = placement.layout.leaves
    rows = []
    for i, leaf in enumerate(leaves):
        form = forms[i] if forms is not None else None
        encoding = placement.encodings[i] if leaf.is_real else None
        rows.append((leaf.path or "(root)", _restored(leaf, form, placement.value_dtype(i), encoding),
                     _stored(leaf, form, encoding)))
    path_width = min(PATH_WIDTH, max((len(p) for p, _, _ in rows), default=0))
    dtype_width = min(PATH_WIDTH // 2, max((len(d) for _, d, _ in rows), default=0))
    lines = [f"leaves  {len(leaves)}: key path, dtype and shape as restored, stored as"]
    lines += [f"  {p:<{path_width}}  {d:<{dtype_width}}  {s}" for p, d, s in rows]
    return lines


def _restored(leaf, form: sd.Form | None, stored_dtype: np.dtype, encoding) -> str:
    """The dtype and shape a leaf gives back: ``int32[]``, ``key<fry>[4]``, ``int (Python)``."""
    if form is None:
        return f"{sd.dtype_name(stored_dtype)}{list(leaf.shape)}"
    if form.kind == sd.KIND_PYTHON:
        return f"{form.dtype} (Python)"
    if not sd.restore_dtype(form, encoding):  # stored narrower than its dtype, as the caller asked
        return f"{sd.dtype_name(stored_dtype)}{list(leaf.shape)}"
    return f"{form.dtype}{list(form.value_shape(leaf.shape))}"


def _stored(leaf, form: sd.Form | None, encoding) -> str:
    """How a leaf is stored: its ``.psk.d`` type, and what its elements stand for."""
    stored = f"ℝ{list(leaf.shape)} {encoding.label}" if leaf.is_real else f"idx[{leaf.bound}]{list(leaf.shape)}"
    note = None
    if form is not None:
        if form.kind == sd.KIND_BITS:
            note = "two's complement" if form.dtype.startswith("int") and form.dtype[3:].isdigit() else "bit pattern"
        elif form.kind == sd.KIND_COMPLEX:
            note = "(real, imaginary) pairs"
        elif form.kind == sd.KIND_KEY:
            note = f"key data of {form.impl}"
        elif form.kind == sd.KIND_PYTHON and form.dtype == "int":
            note = "two's complement" + (f" in {math.prod(leaf.shape)} 64-bit limbs" if leaf.shape else "")
        elif form.kind == sd.KIND_VALUE and form.dtype == "float16" and leaf.is_real:
            note = "float16 values, exact in f32"
    return stored + (f", {note}" if note else "")


def _params_lines(reader: Reader) -> list[str]:
    header = reader.header
    lines = []
    if header.encodings is not None:
        # Without the layout a leaf of byte 0 may be f64 or idx: the header cannot tell them apart.
        labels = " ".join(BYTE_0_LABEL if e == Encoding.F64 else e.label for e in header.encodings)
        lines.append(f"leaves  {len(header.encodings)} (encodings in storage order: {labels}; {BYTE_0_LABEL} is "
                     "byte 0, f64 for a real leaf and idx for an index leaf, which only the layout tells apart)")
    lines.append(f"data    {reader.file_size - header.data_offset} bytes")
    lines.append(
        f"layout  the leaves of {header.type_text} come from the program that wrote it: "
        "supply its layout to read the samples"
    )
    return lines


__all__ = ["INFO_DEPTH", "INFO_ELEMENTS", "INFO_SAMPLES", "info_lines", "iter_info_lines"]
