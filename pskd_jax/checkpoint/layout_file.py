"""Writing the layout file beside a ``params`` checkpoint. Its format, its reader and the proof
that it belongs to its data file are in :mod:`pskd_jax.format.layout_file`.
"""

from __future__ import annotations

from typing import Any

from pskd_jax._os.jsonfile import write_json
from pskd_jax.checkpoint.planning import SavePlan
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.keypaths import path_keys
from pskd_jax.format.layout_file import LAYOUT_FORMAT, LAYOUT_VERSION, header_digest


def layout_json(plan_: SavePlan, *, xxh3_128: str | None = None, extra: dict | None = None) -> dict:
    """The layout file's content for a planned save: each leaf's stored form and the dtype it gives
    back, the tree's containers, and what identifies the data file (its size, the digest of its
    header, and — when the save computed it — the xxh3_128 of the whole file)."""
    placement = plan_.placement
    leaves = []
    for leaf, encoding, form in zip(placement.layout.leaves, placement.encodings, plan_.forms):
        entry: dict[str, Any] = {"path": leaf.path, "keys": path_keys(leaf.path), "shape": list(leaf.shape),
                                 "dtype": form.dtype}
        if leaf.is_real:
            entry["encoding"] = encoding.label
        else:
            entry["bound"] = leaf.bound
        if form.kind != sd.KIND_VALUE:
            entry["kind"] = form.kind
        if form.impl is not None:
            entry["impl"] = form.impl
        leaves.append(entry)
    identity: dict[str, Any] = {"bytes": plan_.size, "header_xxh3_128": header_digest(plan_.header)}
    if xxh3_128 is not None:
        identity["xxh3_128"] = xxh3_128
    content = {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "type": plan_.type_text, "data": identity,
               "leaves": leaves, "tree": plan_.description}
    content.update(extra or {})
    return content


def write_layout(path: str, plan_: SavePlan, *, durable: bool = True, xxh3_128: str | None = None,
                 extra: dict | None = None) -> None:
    """Writes the layout file of a planned save, atomically."""
    write_json(path, layout_json(plan_, xxh3_128=xxh3_128, extra=extra), durable=durable)


__all__ = ["layout_json", "write_layout"]
