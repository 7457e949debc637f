"""``.safetensors`` ↔ ``.psk.d``, bit for bit (bf16, f32, f64; integer and bool tensors too).

The ``safetensors`` package is an optional extra (``pip install safetensors``); the format is read
and written with it, never by hand, and it is imported only when a conversion runs.

Names and trees: a safetensors name ``a.b.0.c`` is the key path ``['a']['b'][0]['c']``: the names
give nested dicts (string keys, in the order of first appearance in the file's data) and lists (a
node whose keys are exactly 0..n-1). Going back, each leaf's keys joined by ``.`` are its name;
a key containing ``.`` cannot be written as a name and is refused.

A ``.psk.d`` written from a safetensors file stores its leaves in tree order; the safetensors
library writes tensors in an order of its own (by dtype, then name), so the checkpoint's order is
kept in the metadata (``pskd.order``) and used when converting back: ``.psk.d`` → safetensors →
``.psk.d`` gives the same bytes. A recorded order that is not a list of exactly the file's names
is ignored (the file's own order is used).

A name holds at most :data:`pskd_jax.MAX_KEY_DEPTH` keys (E9005 otherwise). Both ways
the output is written atomically (a temporary file, renamed into place); an import that refuses
the data (a NaN, a negative integer) writes nothing, neither the checkpoint nor its layout file.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import numpy as np

from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.keypaths import MAX_KEY_DEPTH, nest, path_keys
from pskd_jax.checkpoint.layout_file import read_layout_file
from pskd_jax.checkpoint.planning import SaveResult
from pskd_jax.checkpoint.saving import save
from pskd_jax.format.reader import Reader
from pskd_jax.format.encodings import REAL_DTYPES, Encoding
from pskd_jax.errors import MismatchError, NotClosedError, NotPskdError, PskdError, UsageError
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.files import open_fd
from pskd_jax._os.positional import read_into

ORDER_KEY = "pskd.order"
TYPE_KEY = "pskd.type"


def _safetensors(module: str = "safetensors"):
    """The optional safetensors package (E9012 saying how to install it when it is missing)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError("converting safetensors files needs the safetensors package: "
                                   "pip install 'pskd_jax[convert]' (or safetensors)") from None


def name_keys(name: str) -> list[str | int]:
    """``"a.b.0.c"`` → ``["a", "b", 0, "c"]``."""
    return [int(part) if part.isdigit() and part.isascii() else part for part in name.split(".")]


def keys_name(keys: Any, path: str) -> str:
    """Keys → a safetensors name; refuses keys that a dotted name cannot hold (E9005)."""
    parts = []
    for key in keys:
        text = str(key)
        if not text or "." in text:
            raise MismatchError(f"leaf {path or '(root)'}: the key {key!r} cannot be part of a "
                                      "safetensors name (empty, or holds a '.')")
        parts.append(text)
    if not parts:
        raise MismatchError("a single-array checkpoint has no name for safetensors")
    return ".".join(parts)


def safetensors_to_pskd(source: str | os.PathLike, destination: str | os.PathLike, *, name: str | None = None,
                        durable: bool = True) -> SaveResult:
    """Writes the tensors of a ``.safetensors`` file as a ``params`` checkpoint (and its layout file)."""
    source = os.fspath(source)
    order, metadata, tensors = _read_tensors(source)
    if not tensors:
        raise MismatchError(f"{source}: no tensors to convert")
    keys = [name_keys(n) for n in order]
    for tensor_name, tensor_keys in zip(order, keys):
        if len(tensor_keys) > MAX_KEY_DEPTH:
            shown = tensor_name if len(tensor_name) <= 80 else tensor_name[:80] + "…"
            raise MismatchError(f"{source}: tensor {shown!r}: a name of {len(tensor_keys)} keys; a "
                                      f"checkpoint's tree nests at most {MAX_KEY_DEPTH} deep")
    tree = nest(keys, [tensors[n] for n in order])
    if name is None and metadata.get(TYPE_KEY, "").startswith("params "):
        name = metadata[TYPE_KEY].split(" ", 1)[1]
    return save(destination, tree, name=name, durable=durable)


# Dtypes read here with positional reads: numpy's own, and ml_dtypes' (as the library gives them).
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
           "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_, "BF16": REAL_DTYPES[Encoding.BF16]}


def _read_tensors(source: str) -> tuple[list[str], dict, dict[str, np.ndarray]]:
    """The tensor names in checkpoint order, the metadata and the tensors of a ``.safetensors`` file.

    The file is opened once, as a regular file (a FIFO or a device is E9002 at once). The library
    checks its header (through the open descriptor, so that it reads the same file); the tensors'
    bytes are then read with positional reads, so that a file cut short meanwhile is E9003 naming
    it, not a SIGBUS in the library's memory map (a dtype this module does not know is still
    copied by the library, the one remaining way)."""
    safe_open = _safetensors().safe_open
    fd = open_fd(source, NotPskdError)
    try:
        by_descriptor = f"/proc/self/fd/{fd}"
        opened = by_descriptor if os.path.exists(by_descriptor) else source
        try:
            with safe_open(opened, framework="np") as f:
                names = list(f.offset_keys())
                metadata = f.metadata() or {}
                order = _recorded_order(metadata, names)
                kinds = {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in order}
                offsets = _data_offsets(fd, source)
                tensors = {}
                for n in order:
                    dtype, shape = kinds[n]
                    if dtype in _DTYPES and n in offsets:
                        tensors[n] = _read_tensor(fd, source, offsets[n], np.dtype(_DTYPES[dtype]), shape)
                    else:
                        tensors[n] = f.get_tensor(n)
        except PskdError:
            raise
        except Exception as e:  # the library's own errors: a file it cannot read
            raise NotPskdError(f"{source}: not a safetensors file the library reads: {e}") from None
    finally:
        os.close(fd)
    return order, metadata, tensors


def _data_offsets(fd: int, source: str) -> dict[str, tuple[int, int]]:
    """Each tensor's byte range in the file, from its header (which the library accepted)."""
    prefix = bytearray(8)
    read_into(fd, memoryview(prefix), 0, source)
    length = int.from_bytes(prefix, "little")
    header = bytearray(length)
    read_into(fd, memoryview(header), 8, source)
    entries = json.loads(bytes(header))
    start = 8 + length
    return {name: (start + entry["data_offsets"][0], start + entry["data_offsets"][1])
            for name, entry in entries.items() if name != "__metadata__"}


def _read_tensor(fd: int, source: str, span: tuple[int, int], dtype: np.dtype, shape: list[int]) -> np.ndarray:
    out = np.empty(span[1] - span[0], dtype=np.uint8)
    if out.size:
        read_into(fd, memoryview(out), span[0], source)
    return out.view(dtype).reshape(shape)


def _recorded_order(metadata: dict, names: list[str]) -> list[str]:
    recorded = metadata.get(ORDER_KEY)
    if recorded:
        try:
            order = json.loads(recorded)
        except ValueError:
            order = None
        # (only a list of the names themselves: sorting a list of mixed types would raise)
        if isinstance(order, list) and all(isinstance(n, str) for n in order) and sorted(order) == sorted(names):
            return order
    return names


def pskd_to_safetensors(source: str | os.PathLike, destination: str | os.PathLike, *,
                        layout: Any = None) -> int:
    """Writes a checkpoint's leaves as a ``.safetensors`` file; returns the number of tensors.

    The layout comes from ``layout`` (a layout file, :class:`Layout` or template), else the layout
    file beside the checkpoint; a closed type needs none. Each tensor gets the dtype the leaf was
    saved from when the layout file records it (float16, int32, bool …), else its stored dtype."""
    source, destination = os.fspath(source), os.fspath(destination)
    serialize = _safetensors("safetensors.numpy").save
    dtypes: tuple[str, ...] = ()
    if isinstance(layout, (str, os.PathLike)) or layout is None:
        layout_path = os.fspath(layout) if layout is not None else layout_path_for(source)
        if layout is not None or os.path.exists(layout_path):
            layout_file = read_layout_file(layout_path)
            layout, dtypes = layout_file.layout, layout_file.dtypes
    with Reader(source, layout=layout, access="pread") as reader:  # positional reads: E9003 if cut short
        if reader.placement is None:
            raise NotClosedError(f"{source}: type {reader.header.type_text!r} needs its layout: --layout FILE, or keep "
                f"{os.path.basename(layout_path_for(source))} beside it",
            )
        if reader.header.count != 1:
            raise MismatchError(f"{source}: a checkpoint holds one sample, this file holds {reader.header.count}")
        placement = reader.placement
        tensors: dict[str, np.ndarray] = {}
        for i, leaf in enumerate(placement.layout.leaves):
            name = keys_name(path_keys(leaf.path), leaf.path)
            if name in tensors:
                raise MismatchError(f"leaf {leaf.path}: the name {name!r} is taken by another leaf")
            value = reader.leaf_range(0, i, 0, leaf.size).reshape(leaf.shape)  # read, not mapped
            wanted = _dtype_named(dtypes[i]) if i < len(dtypes) else None
            if wanted is not None and wanted != value.dtype:
                value = value.astype(wanted)  # exact: the leaf was saved from this dtype
            tensors[name] = value
        metadata = {ORDER_KEY: json.dumps(list(tensors)), TYPE_KEY: reader.header.type_text}
        # The library serializes to bytes, written through atomic_output (a temporary file locked by
        # this writer, so that no other writer's cleanup removes it; renamed into place).
        data = serialize(tensors, metadata=metadata)
        count = len(tensors)
        del tensors
    with atomic_output(destination) as f:
        f.write(data)
    return count


def _dtype_named(name: str) -> np.dtype | None:
    if not name:
        return None
    if name == "bfloat16":
        return REAL_DTYPES[Encoding.BF16]
    try:
        return np.dtype(name)
    except TypeError:
        return None


def convert(source: str | os.PathLike, destination: str | os.PathLike, *, layout: Any = None,
            name: str | None = None) -> str:
    """Converts by extension: ``.safetensors`` → ``.psk.d`` or ``.psk.d`` → ``.safetensors``;
    returns a line saying what was written."""
    source, destination = os.fspath(source), os.fspath(destination)
    if source.endswith(".safetensors") and destination.endswith(".psk.d"):
        result = safetensors_to_pskd(source, destination, name=name)
        labels = sorted({e.label for e in result.encodings})
        return (f"wrote {destination} ({len(result.encodings)} leaves of type {result.type_text}, "
                f"encodings {' '.join(labels)}, {result.bytes} bytes)")
    if source.endswith(".psk.d") and destination.endswith(".safetensors"):
        count = pskd_to_safetensors(source, destination, layout=layout)
        return f"wrote {destination} ({count} tensors)"
    raise UsageError(f"convert {source} → {destination}: expected .safetensors → .psk.d or "
                               ".psk.d → .safetensors")


__all__ = ["convert", "keys_name", "name_keys", "pskd_to_safetensors", "safetensors_to_pskd"]
