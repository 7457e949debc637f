"""The layout file written beside a ``params`` checkpoint, and reading it back.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any
from pskd_jax.errors import NotClosedError
from pskd_jax._os.jsonfile import read_strict, write_json
from pskd_jax._os.names import layout_path_for
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.checkpoint.keypaths import MAX_KEY_DEPTH, nested_rebuild, path_keys
from pskd_jax.checkpoint.planning import SavePlan


LAYOUT_FORMAT = "pskd-layout"

LAYOUT_VERSION = 1

def layout_json(plan_: SavePlan) -> dict:
    """The layout file's content for a planned save."""
    placement = plan_.placement
    leaves = []
    for leaf, encoding, dtype in zip(placement.layout.leaves, placement.encodings, plan_.dtypes):
        entry: dict[str, Any] = {"path": leaf.path, "keys": path_keys(leaf.path), "shape": list(leaf.shape),
                                 "dtype": dtype}
        if leaf.is_real:
            entry["encoding"] = encoding.label
        else:
            entry["bound"] = leaf.bound
        leaves.append(entry)
    return {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "type": plan_.type_text, "leaves": leaves}

def write_layout(path: str, plan_: SavePlan, *, durable: bool = True) -> None:
    """Writes the layout file of a planned save, atomically."""
    write_json(path, layout_json(plan_), durable=durable)

@dataclasses.dataclass(frozen=True)
class LayoutFile:
    """A layout file read back: the layout, the type it was written for, each leaf's dtype."""

    layout: Layout
    type_text: str
    dtypes: tuple[str, ...]
    keys: tuple[tuple[str | int, ...], ...]

def read_layout_file(path: str | os.PathLike) -> LayoutFile:
    """Reads ``NAME.layout.json`` (E9001 naming the file when it is not one)."""
    path = os.fspath(path)
    content = read_strict(path, NotClosedError, what="the layout file")
    try:
        if content.get("format") != LAYOUT_FORMAT or content.get("version") != LAYOUT_VERSION:
            raise ValueError(f"format {content.get('format')!r} version {content.get('version')!r}, "
                             f"expected {LAYOUT_FORMAT!r} version {LAYOUT_VERSION}")
        leaves, keys, dtypes = [], [], []
        for k, entry in enumerate(content["leaves"]):
            where = f"leaf {k} ({str(entry['path'])[:80]})"
            shape = tuple(int(d) for d in entry["shape"])
            bound = entry.get("bound")
            leaves.append(Leaf(str(entry["path"]), shape, int(bound) if bound is not None else None))
            keys.append(_layout_keys(entry.get("keys") or path_keys(entry["path"]), where))
            dtypes.append(str(entry.get("dtype", "")))
        type_text = str(content["type"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        # (OverflowError: int() of an infinite number, which the JSON decoder makes of 1e999)
        raise NotClosedError(f"{path}: not a layout file ({e})") from None
    return LayoutFile(Layout(tuple(leaves), tuple(range(len(leaves))), nested_rebuild(keys)), type_text,
                      tuple(dtypes), tuple(keys))

def _layout_keys(keys: Any, where: str) -> tuple[str | int, ...]:
    """A leaf's ``keys`` in a layout file: a list of strings and integers, at most
    :data:`MAX_KEY_DEPTH` of them (ValueError otherwise)."""
    if not isinstance(keys, list):
        raise ValueError(f"{where}: keys {str(keys)[:80]} is not a list")
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ValueError(f"{where}: the key {str(key)[:80]} is not a string or an integer")
    if len(keys) > MAX_KEY_DEPTH:
        raise ValueError(f"{where}: a key path {len(keys)} keys deep (at most {MAX_KEY_DEPTH})")
    return tuple(keys)

def read_layout(path: str | os.PathLike) -> Layout:
    """The :class:`Layout` in a layout file: leaves in storage order, rebuilt as nested dicts
    (string keys) and lists (int keys)."""
    return read_layout_file(path).layout

def find_layout(checkpoint: str | os.PathLike) -> Layout | None:
    """The layout written beside a checkpoint, or None when there is none."""
    candidate = layout_path_for(checkpoint)
    return read_layout(candidate) if os.path.exists(candidate) else None


__all__ = [
    "LAYOUT_FORMAT",
    "LAYOUT_VERSION",
    "LayoutFile",
    "find_layout",
    "layout_json",
    "read_layout",
    "read_layout_file",
    "write_layout",
]
