"""Writing the layout file beside a ``params`` checkpoint. Its format, its reader and the proof
that it belongs to its data file are in :mod:`pskd_jax.format.layout_file`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.jsonfile import json_text, write_json
from pskd_jax.checkpoint.planning import SavePlan
from pskd_jax.errors import PskdError, UsageError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.keypaths import path_keys
from pskd_jax.format.layout_file import (
    LAYOUT_FORMAT,
    LAYOUT_VERSION,
    ObjectVersion,
    header_digest,
    is_own_layout,
    layout_from_bytes,
    read_layout_file,
)


def layout_json(plan_: SavePlan, *, xxh3_128: str | None = None, extra: dict | None = None,
                data_name: str | None = None, version: ObjectVersion | None = None) -> dict:
    """The layout file's content for a planned save: each leaf's stored form and the dtype it gives
    back, the tree's containers, and what identifies the data file (its size, the digest of its
    header, — when the save computed it — the xxh3_128 of the whole file, the name of the data
    file it was written for: what proves it the toolkit's own to replace, and — an object of a
    store — its URL and the version tag its put was given: what tells this save's data from
    another save's of the same header and size)."""
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
    if data_name is not None:
        identity["name"] = data_name
    if xxh3_128 is not None:
        identity["xxh3_128"] = xxh3_128
    if version is not None:
        identity["url"], identity["tag"] = version
    content = {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "type": plan_.type_text, "data": identity,
               "leaves": leaves, "tree": plan_.description}
    content.update(extra or {})
    return content


def write_layout(path: str, plan_: SavePlan, *, durable: bool = True, xxh3_128: str | None = None,
                 extra: dict | None = None) -> None:
    """Writes the layout file of a planned save, atomically (recording the name of the data file
    whose layout ``path`` is)."""
    write_json(path, _content(path, plan_, xxh3_128, extra), durable=durable)


@contextlib.contextmanager
def layout_ready(path: str, plan_: SavePlan, *, durable: bool = True, xxh3_128: str | None = None,
                 extra: dict | None = None) -> Iterator[None]:
    """:func:`write_layout` in two steps: the file written (and synced) under its temporary name
    on entering, renamed into place on a clean exit, so that the block between is short (the
    directory's sync is left to the data's rename that follows, in the same directory)."""
    data = (json_text(_content(path, plan_, xxh3_128, extra), indent=1) + "\n").encode("utf-8")
    with atomic_output(path, durable=False) as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
        yield


def _content(path: str, plan_: SavePlan, xxh3_128: str | None, extra: dict | None) -> dict:
    data = names.data_path_for(path)
    return layout_json(plan_, xxh3_128=xxh3_128, extra=extra,
                       data_name=os.path.basename(data) if data is not None else None)


def check_layout_beside(path: str, *, writes: bool) -> bool:
    """Before a save of the data file ``path`` writes anything: refuses (E9012) what would lose a
    file that is not the toolkit's to replace, and says whether the file where ``path``'s layout
    goes is the toolkit's own layout of ``path`` (:func:`~pskd_jax.format.layout_file.is_own_layout`:
    replaced by the save's layout, or removed with the data it described where the save writes
    none). Refused: a save that writes a layout where something else stands (a user's notes, a
    data file, another file's layout, a directory), and a save whose destination is itself a
    layout file (a data file is never written over one). Where the save writes no layout,
    anything but its own layout is left as it is."""
    beside = names.layout_path_for(path)
    if names.is_layout_name(path) and _is_layout(path):
        raise UsageError(f"{path}: a layout file stands there (the layout of "
                         f"{names.data_path_for(path) or 'another checkpoint'}); a save never writes a "
                         "checkpoint over one: give another name")
    try:
        mode: int | None = os.lstat(beside).st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError):
        mode = -1
    if mode is None:
        return False
    own = mode != -1 and stat.S_ISREG(mode) and is_own_layout(beside, path)
    if writes and not own:
        raise UsageError(f"{beside}: the layout file of {path} goes there, but another file stands there "
                         "(not the layout of this checkpoint: a file of yours, another checkpoint's layout, "
                         "or not a regular file); nothing was written: move it away, or save under "
                         "another name")
    return own


def _is_layout(path: str) -> bool:
    """Whether ``path`` is a regular file that reads as a layout file."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        read_layout_file(path)
    except (OSError, ValueError, PskdError):
        return False
    return True


LAYOUT_HEAD_BYTES = 1 << 20  # the first read of the object where a save's layout goes


def own_store_layout(store: Any, beside: str, key: str, path: str, *, writes: bool) -> bool:
    """Whether the object where ``key``'s layout goes is the toolkit's own layout of ``key`` (a
    layout file recording that name, or one of an earlier version recording none); refuses (E9012)
    a save that would put its layout over anything else, before anything is put."""
    first = store.head(beside, LAYOUT_HEAD_BYTES)  # (one request: a layout is most often whole in it)
    if first is None:
        return False
    raw, info = first
    if len(raw) < info.size:
        raw, _ = store.get(beside)
    try:
        found = layout_from_bytes(raw, store.url(beside))
    except PskdError:
        found = None
    recorded = (found.identity or {}).get("name") if found is not None else None
    own = found is not None and recorded in (None, key.rsplit("/", 1)[-1])
    if writes and not own:
        raise UsageError(f"{store.url(beside)}: the layout of {path} goes there, but another object stands there "
                         "(not the layout of this checkpoint); nothing was written: move it away, or save under "
                         "another name")
    return own


__all__ = ["LAYOUT_HEAD_BYTES", "check_layout_beside", "layout_json", "own_store_layout", "write_layout"]
