"""``info``: a file's header, its encodings and its first samples, as lines of text.
"""

from __future__ import annotations

from typing import Any, Iterator
import numpy as np
from pskd_jax.format.reader import Reader
from pskd_jax.data.export import plain


INFO_ELEMENTS = 64  # a leaf larger than this is shown in part by info

INFO_DEPTH = 32  # containers nested deeper than this are shown as … by info

class _Head:
    """The first INFO_ELEMENTS elements of a leaf too large to show whole, and its shape: all of it
    that info reads (a positional read of those elements, never the whole sample)."""

    def __init__(self, values: np.ndarray, shape: tuple[int, ...]):
        self.values, self.shape = values, shape
        self.size = int(np.prod(shape, dtype=object))


def _sample(reader: Reader, k: int) -> Any:
    """Sample ``k`` as info shows it: small leaves whole, large ones as their :class:`_Head`."""
    layout = reader.placement.layout
    values = []
    for i, leaf in enumerate(layout.leaves):
        if leaf.size > INFO_ELEMENTS:
            values.append(_Head(reader.leaf_range(k, i, 0, INFO_ELEMENTS), leaf.shape))
        else:
            values.append(reader.leaf_range(k, i, 0, leaf.size).reshape(leaf.shape))
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

def info_lines(path: str, *, samples: int = 2, layout: Any = None) -> list[str]:
    """What ``pskd info`` prints: the header, the encodings, trailing bytes, the first samples."""
    return list(iter_info_lines(path, samples=samples, layout=layout))

def iter_info_lines(path: str, *, samples: int = 2, layout: Any = None) -> Iterator[str]:
    """:func:`info_lines` one line at a time: the header's lines come out before a damaged sample
    (an idx value beyond its bound: E9004) stops the listing.

    The file is read with positional reads (a file cut short meanwhile is E9003), and of each
    sample shown only what is printed: a leaf of more than INFO_ELEMENTS elements shows its first
    ones, read on their own. Non-finite reals print as export writes them (``NaN``,
    ``Infinity``, ``-Infinity``, ``NaN:0x…``)."""
    with Reader(path, layout=layout, access="pread") as reader:
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
            yield f"[{k}] {_short(_sample(reader, k))}"

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


__all__ = ["INFO_DEPTH", "INFO_ELEMENTS", "info_lines", "iter_info_lines"]
