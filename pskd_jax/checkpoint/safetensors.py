"""``.safetensors`` ↔ ``.psk.d``, bit for bit, for every dtype safetensors has.

The ``safetensors`` package is an optional extra (``pip install safetensors``); the format is read
and written with it, never by hand, and it is imported only when a conversion runs.

Dtypes: BOOL, U8…U64, I8…I64, F16, BF16, F32, F64, the float8 types (F8_E4M3, F8_E5M2 and
their fnuz variants, F8_E8M0) and C64 convert both ways as themselves; NaN and ±Inf are kept, as
in any checkpoint. A checkpoint leaf of a dtype safetensors lacks goes out as its stored form:
complex128 as F64 (real, imaginary) pairs on a last axis, int4 and the other narrow ``ml_dtypes``
types as U8 bit patterns, typed PRNG keys as U32 key data, a Python int as I64 (refused beyond
64 bits), a Python float as F64 and a bool as BOOL.

Names and trees: a safetensors name ``a.b.0.c`` is the key path ``['a']['b'][0]['c']``: a part
that is a canonical decimal number (``0``, ``17``; not ``01``) is an integer key, any other part a
string key (``01``, an empty part after a trailing dot). The names give nested dicts (in the order
of first appearance in the file's data) and lists (a node whose keys are exactly 0..n-1). Going
back, each leaf's keys joined by ``.`` are its name, so that names come back byte for byte
(``layers.01.w`` and ``a.`` too, and a file holding both ``a.01`` and ``a.1``); a key containing
``.`` cannot be written as a name and is refused, as is a leaf whose name would be ``__metadata__``
(the header's entry of the metadata).

Metadata: the source file's ``__metadata__`` is kept in the checkpoint's layout file and written
back as it was. A checkpoint of another origin gets ``pskd.order`` (its leaf order: the
safetensors library writes tensors in an order of its own, by dtype, then name), ``pskd.type``
and, where a name's parts would not read back as its leaf's keys (a string key ``'0'``),
``pskd.keys`` (those names' keys, typed) and ``pskd.tree`` (the tree's containers as the layout
file records them: a dict of key 0 stays a dict, an empty dict stays), so that ``.psk.d`` →
safetensors → ``.psk.d`` gives the same bytes and the same keys. A tree of no leaves is refused
on the way out (E9005), as a file of no tensors is on the way back. A Python int is written as
I64, or as U64 from 2^63 to 2^64 - 1.
A recorded order that is not a list of exactly the file's names is ignored (the file's own order
is used), and so are recorded keys that do not make up their name and recorded values that are not
strict JSON (a key given twice), and a recorded type whose name cannot name a ``params`` type (the
checkpoint is then ``params Params``). A header that gives a tensor name or a ``__metadata__`` key twice
is refused (E9002 naming it): the library would keep one of the two silently.

A name holds at most :data:`pskd_jax.MAX_KEY_DEPTH` keys, and a tensor at most 63 axes and 2^60
elements (E9005 otherwise: an empty tensor's other axes may be of any length in the file). Both ways
the output is written atomically (a temporary file, renamed into place; an object of a store in
one put); an import that refuses the data (a BOOL byte other than 0 or 1, a dtype with no numpy
counterpart) writes nothing, neither the checkpoint nor its layout file.

Either side may be a local file or an object of a store (``s3://``, ``gs://``, ``memory://``): a
``.safetensors`` object is read whole in one request, a checkpoint object by byte ranges (one
that several processes saved, a parts index, as the file its parts hold).
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
from typing import Any

import numpy as np

from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.checks import abridged
from pskd_jax._os.jsonfile import loads_strict
from pskd_jax.checkpoint.options import SaveOptions, is_params_name, save_options
from pskd_jax.checkpoint.planning import SaveResult
from pskd_jax.checkpoint.restoring import read_saved_leaves
from pskd_jax.checkpoint.saving import save_checkpoint
from pskd_jax.errors import BadValueError, MismatchError, NotPskdError, PskdError, UsageError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.byte_sources import open_bytes, read_small
from pskd_jax.format.encodings import LazyDtypes, bfloat16_dtype
from pskd_jax.format.header import read_header
from pskd_jax.format.keypaths import MAX_KEY_DEPTH, nest, path_keys, shown_key, shown_path
from pskd_jax.format.sample_type import MAX_AXES, MAX_SAMPLE_ELEMENTS
from pskd_jax.format.tree import build_described, check_description, described_paths
from pskd_jax.storage import locate, store_for

# safetensors' dtype names → numpy dtypes (little-endian, as the format stores them); those of
# ml_dtypes are made when first needed.
_ML_DTYPES_LABELS = (("F8_E4M3", "float8_e4m3fn"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2", "float8_e5m2"),
                     ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("F8_E8M0", "float8_e8m0fnu"))


def _ml_dtypes_labels() -> dict[str, np.dtype]:
    import ml_dtypes

    return {"BF16": bfloat16_dtype(), **{label: np.dtype(getattr(ml_dtypes, name)) for label, name in _ML_DTYPES_LABELS
                                         if hasattr(ml_dtypes, name)}}


SAFETENSORS_DTYPES: LazyDtypes[str] = LazyDtypes({
    "BOOL": np.dtype(bool), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"), "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"), "C64": np.dtype("<c8"),
}, _ml_dtypes_labels, ("BF16", *(label for label, _ in _ML_DTYPES_LABELS)))


@functools.cache
def _written() -> frozenset[np.dtype]:
    """The dtypes a tensor is written as itself."""
    return frozenset(SAFETENSORS_DTYPES.values())


ORDER_KEY = "pskd.order"
TYPE_KEY = "pskd.type"
KEYS_KEY = "pskd.keys"  # the keys of each name whose parts do not read back as its keys ('0' a string)
TREE_KEY = "pskd.tree"  # the tree's containers, as a layout file records them (a dict of key 0, an empty dict)
_METADATA = "__metadata__"  # the header's entry of the file's metadata: no tensor's name
_WHOLE = 1 << 62  # a safetensors file is read whole, whatever its size (the library parses bytes in memory)


def _safetensors(module: str = "safetensors"):
    """The optional safetensors package (E9012 saying how to install it when it is missing)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError("converting safetensors files needs the safetensors package: "
                                   "pip install 'pskd_jax[convert]' (or safetensors)") from None


def _is_index(part: str) -> bool:
    """A name part that is an integer key: a canonical decimal (``0``, ``17``; not ``01`` or ``+1``)."""
    return part.isascii() and part.isdigit() and (part == "0" or part[0] != "0")


def name_keys(name: str) -> list[str | int]:
    """``"a.b.0.c"`` → ``["a", "b", 0, "c"]``; ``"layers.01.w"`` keeps ``"01"``, ``"a."`` ends in ``""``."""
    return [int(part) if _is_index(part) else part for part in name.split(".")]


def keys_name(keys: Any, path: str) -> str:
    """Keys → a safetensors name; refuses keys that a dotted name cannot hold and the name
    ``__metadata__`` (E9005)."""
    parts = []
    for key in keys:
        text = str(key)
        if "." in text:
            raise MismatchError(f"leaf {shown_path(path) or '(root)'}: the key {shown_key(key)} cannot be part of a "
                                "safetensors name (it holds a '.')")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise MismatchError(f"leaf {shown_path(path)}: the key {shown_key(key)} is not UTF-8 text (a "
                                "surrogate-escaped name), which a safetensors name must be") from None
        parts.append(text)
    if not parts:
        raise MismatchError("a single-array checkpoint has no name for safetensors")
    name = ".".join(parts)
    if name == _METADATA:  # (the library would write the file, two __metadata__ entries, which nothing reads)
        raise MismatchError(f"leaf {shown_path(path)}: the name {_METADATA!r} is the one safetensors reserves "
                            "for the file's metadata, not a tensor's")
    return name


def _tensors(source: str) -> tuple[dict[str, np.ndarray], list[str], dict[str, str] | None]:
    """A safetensors file's tensors (numpy views of its bytes, by name), its names in data order, and
    its ``__metadata__`` (None when it has none)."""
    safetensors = _safetensors()
    # Read once, as a regular file (a FIFO or a device is refused before anything waits on it),
    # with plain reads: the library then parses bytes in memory, never a map a truncation could
    # turn into a SIGBUS.
    raw = read_small(source, NotPskdError, what="the safetensors file", limit=_WHOLE)  # (an object: one get)
    try:
        entries = safetensors.deserialize(raw)
    except Exception as e:  # the library's own errors: bytes it cannot read
        raise NotPskdError(f"{source}: not a safetensors file the library reads: {str(e)[:300]}") from None
    # The library keeps one of two entries of the same name (a tensor or a __metadata__ key), as
    # json.loads would: the header (accepted above) is read again strictly, refusing a name given twice.
    header = loads_strict(raw[8 : 8 + int.from_bytes(raw[:8], "little")], source, NotPskdError,
                          kind="a safetensors header")
    metadata = header.get(_METADATA)
    names = sorted((n for n in header if n != _METADATA), key=lambda n: header[n]["data_offsets"][0])
    tensors = {}
    for name, entry in entries:
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        shown = name if len(name) <= 80 else name[:80] + "…"
        if dtype is None:
            raise MismatchError(f"{source}: tensor {shown!r}: dtype {entry['dtype']} has no numpy counterpart "
                                f"here (expected one of {', '.join(SAFETENSORS_DTYPES)})")
        array = _shaped(entry["data"], dtype, entry["shape"], f"{source}: tensor {shown!r}")
        if dtype == np.bool_:
            array = sd.as_bool(array.view(np.uint8), f"{source}: tensor {shown!r}")
        tensors[name] = array
    return tensors, names, metadata


def _shaped(data: Any, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """A tensor's bytes as its array; E9005 for a shape no checkpoint leaf has (more than 63 axes,
    more than 2^60 elements with an empty axis counted as one) or numpy cannot make. The library
    checks the byte count, which is 0 for an empty tensor whatever its other axes."""
    if len(shape) > MAX_AXES or math.prod(d for d in shape if d) > MAX_SAMPLE_ELEMENTS:
        raise MismatchError(f"{where}: shape {abridged(shape, 120)}: a checkpoint's leaf has at most {MAX_AXES} "
                            "axes and 2^60 elements (an empty axis counted as one)")
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as e:  # (an empty F64 tensor of 2^60 elements: more bytes than numpy counts)
        raise MismatchError(f"{where}: shape {abridged(shape, 120)}: numpy cannot make it ({e})") from None


def safetensors_to_pskd(source: str | os.PathLike, destination: str | os.PathLike,
                        options: SaveOptions | None = None) -> SaveResult:
    """Writes the tensors of a ``.safetensors`` file as a ``params`` checkpoint (and its layout file,
    which keeps the source's ``__metadata__``), saved with ``options`` (the type's name, when they
    give none: the one the source records as ``pskd.type``, else ``Params``)."""
    source = _named(source)
    options = save_options(options)
    tensors, names, metadata = _tensors(source)
    if not tensors:
        raise MismatchError(f"{source}: no tensors to convert")
    order = _recorded_order(metadata or {}, names)
    recorded = _recorded_keys(metadata or {}, names)
    keys = [recorded.get(n) or name_keys(n) for n in order]
    for tensor_name, tensor_keys in zip(order, keys):
        if len(tensor_keys) > MAX_KEY_DEPTH:
            shown = tensor_name if len(tensor_name) <= 80 else tensor_name[:80] + "…"
            raise MismatchError(f"{source}: tensor {shown!r}: a name of {len(tensor_keys)} keys; a "
                                f"checkpoint's tree nests at most {MAX_KEY_DEPTH} deep")
    described = _recorded_tree(metadata or {}, keys)
    try:
        values = [tensors[n] for n in order]
        tree = build_described(described, values) if described is not None else nest(keys, values)
    except MismatchError as e:
        raise MismatchError(f"{source}: {e.message} (one name is a prefix of another)") from None
    recorded_name = _recorded_params_name(metadata or {})
    if options.name is None and recorded_name is not None:
        options = options.replace(name=recorded_name)
    extra = {"safetensors": {"metadata": metadata}}  # (None: the source had none, and gets none back)
    return save_checkpoint(destination, tree, options, layout_extra=extra)


def _recorded_json(metadata: dict, key: str) -> Any:
    """The JSON value the metadata records under ``key``; None where it records none or no strict
    JSON (an object giving a key twice: which one was meant is unknown), and the record is ignored."""
    recorded = metadata.get(key)
    if not recorded:
        return None
    try:
        return loads_strict(recorded.encode("utf-8", "surrogatepass"), key, NotPskdError)
    except NotPskdError:
        return None


def _recorded_params_name(metadata: dict) -> str | None:
    """The name of the params type ``pskd.type`` records (``params NAME``); None where it records
    none or one that cannot name a params type. The record is advisory (the tensors hold the data
    whole), so an unusable one is ignored, as the other records are, and the default name applies."""
    recorded = metadata.get(TYPE_KEY)
    if not isinstance(recorded, str) or not recorded.startswith("params "):
        return None
    name = recorded.removeprefix("params ")
    return name if is_params_name(name) else None


def _recorded_order(metadata: dict, names: list[str]) -> list[str]:
    order = _recorded_json(metadata, ORDER_KEY)
    # (only a list of the names themselves: sorting a list of mixed types would raise)
    if isinstance(order, list) and all(isinstance(n, str) for n in order) and sorted(order) == sorted(names):
        return order
    return names


def _recorded_keys(metadata: dict, names: list[str]) -> dict[str, list[str | int]]:
    """The keys ``pskd.keys`` records for names whose parts do not read back as the leaf's keys
    (a string key ``'0'``): used only where they are strings and ints that make up the name itself,
    ignored otherwise (the name's own parts are used)."""
    found = _recorded_json(metadata, KEYS_KEY)
    if not isinstance(found, dict):
        return {}
    known = set(names)
    out: dict[str, list[str | int]] = {}
    for name, keys in found.items():
        if name in known and isinstance(keys, list) and keys \
                and all(isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)) for k in keys) \
                and ".".join(map(str, keys)) == name:
            out[name] = keys
    return out


def _recorded_tree(metadata: dict, keys: list[list[str | int]]) -> Any:
    """The containers ``pskd.tree`` records, used only where they describe exactly the leaves the
    names give, in their order (None otherwise: the names' nested dicts and lists are used)."""
    described = _recorded_json(metadata, TREE_KEY)
    if described is None:
        return None
    try:
        check_description(described, len(keys), MAX_KEY_DEPTH + 1)
        paths = described_paths(described)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    if [path_keys(path) for path in paths] != [list(leaf) for leaf in keys]:
        return None
    return described


def _tensor_of(value: Any, where: str) -> np.ndarray:
    """A saved leaf as the array safetensors writes: its own dtype when safetensors has it, else its
    stored form (see the module's docstring)."""
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, int):
        if 2**63 <= value < 2**64:  # (U64 holds it)
            return np.asarray(value, dtype=np.uint64)
        if not -(2**63) <= value < 2**63:
            raise BadValueError(f"{where}: the Python int {value} is beyond the 64 bits safetensors holds "
                                "(I64 from -2^63, U64 up to 2^64 - 1)")
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    array = np.asarray(value)
    if array.dtype in _written():
        return sd.contiguous(array)
    form = sd.form_of_dtype(array.dtype)
    if form is not None and form.kind in (sd.KIND_BITS, sd.KIND_COMPLEX):
        return sd.contiguous(sd.to_stored(array, form))
    return sd.contiguous(array)


def pskd_to_safetensors(source: str | os.PathLike, destination: str | os.PathLike, *,
                        layout: Any = None) -> int:
    """Writes a checkpoint's leaves as a ``.safetensors`` file; returns the number of tensors.

    The layout comes from ``layout`` (a layout file, :class:`Layout` or template), else the layout
    file beside the checkpoint (which must belong to it); a closed type needs none. Each tensor
    has the dtype its leaf gives back (float16, int32, bool, float8 …), exactly: a layout file
    whose dtype the stored data do not hold is refused, never applied."""
    source, destination = _named(source), _named(destination)
    serialize = _safetensors("safetensors.numpy").save
    leaves, layout_file = read_saved_leaves(source, layout=layout)
    if not leaves:  # (refused here, as the way back refuses a file of no tensors)
        raise MismatchError(f"{source}: a tree of no leaves: a safetensors file of no tensors does not convert "
                            "back to a checkpoint, so none is written")
    tensors: dict[str, np.ndarray] = {}
    typed: dict[str, list[str | int]] = {}  # the keys of names whose parts would not read back as them
    for path, value in leaves:
        leaf_keys = path_keys(path)
        try:
            tensor_name = keys_name(leaf_keys, path)
        except MismatchError as e:
            raise MismatchError(f"{source}: {e.message}") from None
        if tensor_name in tensors:
            raise MismatchError(f"{source}: leaf {shown_path(path)}: the name {tensor_name!r} is taken by another "
                                "leaf (keys written alike: a safetensors name holds text)")
        if name_keys(tensor_name) != leaf_keys:
            typed[tensor_name] = leaf_keys
        tensors[tensor_name] = _tensor_of(value, f"{source}: leaf {path}")
    source_entry = layout_file.extra.get("safetensors") if layout_file is not None else None
    if source_entry is not None:  # converted from safetensors: its metadata as it was (or none)
        metadata = dict(source_entry["metadata"]) if source_entry["metadata"] is not None else None
    else:
        metadata = {ORDER_KEY: json.dumps(list(tensors)), TYPE_KEY: _type_text(source)}
        if typed:
            metadata[KEYS_KEY] = json.dumps(typed)
        if layout_file is not None and layout_file.description is not None:
            metadata[TREE_KEY] = json.dumps(layout_file.description, ensure_ascii=False)
    # The library serializes to bytes, written through atomic_output (a temporary file locked by
    # this writer, so that no other writer's cleanup removes it; renamed into place), or to an
    # object of a store in one put (which appears whole or not at all).
    try:
        data = serialize(tensors, metadata=metadata)
    except PskdError:
        raise
    except Exception as e:  # the library's own refusal
        raise MismatchError(f"{source}: safetensors refuses the tensors: {str(e)[:300]}") from None
    count = len(tensors)
    del tensors, leaves
    where = locate(destination)
    if where.is_local:
        with atomic_output(where.path) as f:
            f.write(data)
    else:
        store_for(where).put(where.key, data)
    return count


def _named(path: str | os.PathLike) -> str:
    """A local path as itself, an object of a store as its URL (E9018 for a scheme no store serves)."""
    where = locate(path)
    return where.path if where.is_local else where.url


def _type_text(source: str) -> str:
    """The checkpoint's type text (a params checkpoint's name), from its header: a local file (a
    FIFO or a device refused, never waited on) or an object (a parts index: the file it stands for)."""
    found = open_bytes(source)
    try:
        return read_header(found.header_stream(), source, found.size()).type_text
    finally:
        found.close()


def convert(source: str | os.PathLike, destination: str | os.PathLike, *, layout: Any = None,
            name: str | None = None) -> str:
    """Converts by extension: ``.safetensors`` → ``.psk.d`` or ``.psk.d`` → ``.safetensors``;
    returns a line saying what was written."""
    source, destination = _named(source), _named(destination)
    if source.endswith(".safetensors") and destination.endswith(".psk.d"):
        result = safetensors_to_pskd(source, destination, SaveOptions(name=name))
        labels = sorted(set(result.labels))  # (an integer leaf is idx, never its encoding byte's f64)
        return (f"wrote {destination} ({len(result.encodings)} leaves of type {result.type_text}, "
                f"encodings {' '.join(labels)}, {result.bytes} bytes)")
    if source.endswith(".psk.d") and destination.endswith(".safetensors"):
        count = pskd_to_safetensors(source, destination, layout=layout)
        return f"wrote {destination} ({count} tensors)"
    raise UsageError(f"convert {source} → {destination}: expected .safetensors → .psk.d or "
                               ".psk.d → .safetensors")


__all__ = ["convert", "keys_name", "name_keys", "pskd_to_safetensors", "safetensors_to_pskd"]
