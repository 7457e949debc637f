"""Restoring a checkpoint exactly, into numpy or JAX arrays, sharded or not, by key path.

What a restore gives back:

- **with a target** (a pytree of arrays, ``jax.ShapeDtypeStruct``s, typed PRNG keys, Python
  scalars, flax ``Variable``s, optax states…): the target's own containers, every leaf matched to
  the saved leaf of the same key path through the layout file (any dict order works: a target
  built by ``jax.eval_shape``, ``jax.tree.map``, ``jit`` or linen ``init``), with the target's
  dtype (an explicit cast: integer values that do not fit, a bool other than 0 or 1, and — unless
  ``allow_overflow=True`` — a finite value beyond a float dtype's range are refused, E9004 naming
  the key path and index) and sharding. A Python scalar in the target comes back as a Python
  scalar. ``partial=True`` restores only the key paths the target names, reading only their bytes.
  A file without a layout file is matched by position, its leaves read as the target describes;
- **without a target**: the saved dtypes (int32 stays int32, bool stays bool, float16 stays
  float16, a typed key array comes back as a key array of its implementation, a Python scalar as
  a Python scalar) in the containers the layout file records: dicts with their own key types,
  lists, tuples, NamedTuples as ``collections.namedtuple`` classes of the recorded name and
  fields, dataclasses as dicts of their fields, flax ``Variable``s (a box of one ``.value``) as
  their value — what ``nnx.replace_by_pure_dict`` takes — and other registered nodes as dicts or
  lists (:func:`pskd_jax.format.tree.build_described`). A closed type gives its tuple; a leaf
  saved in an encoding narrower than its dtype (``encodings=``) gives the stored values.

Leaves come back as JAX arrays, except for numpy target leaves, with ``as_numpy=True`` and with
``zero_copy=True`` (read-only numpy views of the map, for tools that only read); key arrays then
come back as their key data (uint32, the key words last).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import mmap
import os
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.files import open_fd
from pskd_jax._os.names import layout_path_for
from pskd_jax._os.positional import read_into
from pskd_jax.checkpoint.integrity import check_digest, expected_digests
from pskd_jax.checkpoint.jax_arrays import (
    is_array_like,
    is_key_array,
    jax_module,
    key_impl_of,
    sharding_of,
    single_device,
    wants_jax,
    wrap_keys,
)
from pskd_jax.checkpoint.planning import leaf_name
from pskd_jax.checkpoint.regions import read_region
from pskd_jax.errors import BadValueError, MismatchError, NotClosedError, PskdError, TruncatedError, UsageError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.layout_file import LayoutFile, check_belongs, find_layout_file, read_layout_file
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader, template_mismatch
from pskd_jax.format.sample_type import IndexType, TupleType, parse_type

PARALLEL_READ_BYTES = 64 << 20  # restores larger than this read leaves on two threads

HASH_PIECE = 16 << 20  # a verified restore reads, and hashes, pieces of at most this size

MAX_LISTED = 20  # key paths a mismatch lists of each kind before abridging

GUARDED = "an error no check above foresaw"  # (in a message: the fuzz tests look for it)


# --------------------------------------------------------------------------------------------
# What the file holds, and what the target asks for


@dataclasses.dataclass
class _FileView:
    """The leaves of a file in storage order, how each gives its value back (None: as stored),
    whether they are matched to a target by key path, and how they form a tree without one."""

    layout: Layout
    forms: list[sd.Form | None]
    by_path: bool
    layout_file: LayoutFile | None = None


@dataclasses.dataclass
class _Spec:
    """A target leaf: its value shape, and its dtype (numpy), or that it is a Python scalar or a
    typed key array; where its value goes (JAX or numpy, with which sharding)."""

    shape: tuple[int, ...]
    dtype: np.dtype | None = None
    python: type | None = None
    key: tuple[str, int] | None = None  # (implementation, words per key)
    to_jax: bool = False
    sharding: Any = None

    @property
    def category(self) -> str:
        if self.key is not None:
            return "key"
        if self.python is not None:
            return {bool: "bool", int: "int", float: "real"}[self.python]
        return _category(self.dtype)

    def describe(self) -> str:
        if self.key is not None:
            return f"{self.shape} key<{self.key[0]}>"
        if self.python is not None:
            return f"a Python {self.python.__name__}"
        return f"{self.shape} {sd.dtype_name(self.dtype)}"


def _category(dtype: np.dtype) -> str:
    return _category_of(np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _category_of(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "bool"
    if dtype.kind == "c":
        return "complex"
    if dtype.kind in "iu" or dtype.name in ("int1", "int2", "int4", "uint1", "uint2", "uint4"):
        return "int"
    return "real"


def _spec_of(path: str, spec: Any, as_numpy: bool) -> _Spec:
    """What a target leaf asks for (E9005 naming the key path for what no restore gives)."""
    where = leaf_name(path)
    if isinstance(spec, (bool, int, float)) and not isinstance(spec, np.generic):
        return _Spec((), python=bool if isinstance(spec, bool) else int if isinstance(spec, int) else float)
    if is_key_array(spec):
        jax_bound = not as_numpy and wants_jax(spec)
        return _Spec(tuple(int(d) for d in spec.shape), key=key_impl_of(spec.dtype), to_jax=jax_bound,
                     sharding=sharding_of(spec) if jax_bound else None)
    if not is_array_like(spec):
        if isinstance(spec, (str, bytes)) or not (isinstance(spec, (complex, np.generic))):
            raise MismatchError(f"{where}: the target holds a {type(spec).__name__}, not an array, a "
                                "ShapeDtypeStruct or a Python scalar")
        spec = np.asarray(spec)
    try:
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
    except (TypeError, ValueError) as e:
        raise MismatchError(f"{where}: the target's dtype {getattr(spec, 'dtype', None)!s:.60} is not one a "
                            f"checkpoint gives back ({e})") from None
    if sd.form_of_dtype(dtype) is None:
        raise MismatchError(f"{where}: the target asks for dtype {dtype}, which no checkpoint holds")
    jax_bound = not as_numpy and wants_jax(spec)
    return _Spec(shape, dtype=dtype, to_jax=jax_bound, sharding=sharding_of(spec) if jax_bound else None)


def _form_of_spec(spec: _Spec, value: Any) -> sd.Form:
    """How a target leaf would have been stored (a file without a layout file is read so)."""
    if spec.key is not None:
        return sd.key_form(*spec.key)
    if spec.python is not None:
        return sd.python_form(value)
    return sd.form_of_dtype(spec.dtype)


def _stored_leaf(path: str, spec: _Spec, form: sd.Form, value: Any) -> Leaf:
    if spec.python is int:
        return Leaf(path, tuple(np.shape(sd.python_int_pattern(value))), form.bound)
    shape = form.stored_shape(spec.shape) if form.trailing is not None else spec.shape
    return Leaf(path, shape, form.bound)


def _closed_forms(type_text: str, layout: Layout) -> list[sd.Form | None]:
    """A closed type's leaves: ``bool`` ones give bools back, the others their stored values."""
    parsed = parse_type(type_text)
    items = parsed.items if isinstance(parsed, TupleType) else (parsed,)
    forms: list[sd.Form | None] = []
    for item in items:
        is_bool = isinstance(item, IndexType) and item.is_bool
        forms.append(sd.Form(sd.KIND_VALUE, "bool", 2) if is_bool else None)
    return forms if len(forms) == len(layout.leaves) else [None] * len(layout.leaves)


def _file_view(reader: Reader, layout: Any, target_pairs, specs: list[_Spec] | None) -> _FileView:
    """How to read the file: its layout file (by key path), an explicit layout, its closed type, or
    — a ``params`` file without a layout file — the target (by position)."""
    path = reader.path
    if layout is not None:
        if isinstance(layout, (str, os.PathLike)):
            found = read_layout_file(layout, data=path)
            return _FileView(found.layout, list(found.forms), True, found)
        if isinstance(layout, LayoutFile):  # (read already: its forms and key paths serve)
            check_belongs(layout, path)
            return _FileView(layout.layout, list(layout.forms) or [None] * len(layout.layout.leaves), True, layout)
        if isinstance(layout, Layout):
            return _FileView(layout, [None] * len(layout.leaves), False)
        template_pairs, rebuild = tree_lib.flatten(layout, what="the layout template")
        template_specs = [_spec_of(p, s, True) for p, s in template_pairs]
        return _template_view(template_pairs, template_specs, rebuild)
    if not reader.header.is_params:
        own = Layout.of_type(reader.header.type_text)
        return _FileView(own, _closed_forms(reader.header.type_text, own), False)
    beside = find_layout_file(path)
    if beside is not None:
        return _FileView(beside.layout, list(beside.forms), True, beside)
    if target_pairs is None:
        raise NotClosedError(f"{path}: type {reader.header.type_text!r} needs its layout: pass a target pytree, "
                             f"layout=..., or keep {os.path.basename(layout_path_for(path))} beside it")
    return _template_view(target_pairs, specs, None)


def _template_view(pairs, specs: list[_Spec], rebuild) -> _FileView:
    forms = [_form_of_spec(spec, value) for spec, (_, value) in zip(specs, pairs)]
    leaves = tuple(_stored_leaf(p, spec, form, value) for (p, value), spec, form in zip(pairs, specs, forms))
    return _FileView(Layout(leaves, tuple(range(len(leaves))), rebuild), forms, False)


# --------------------------------------------------------------------------------------------
# Matching the target's leaves to the file's


def _abridged(paths: Sequence[str]) -> str:
    shown = ", ".join(p or "(root)" for p in paths[:MAX_LISTED])
    return shown + (f", … and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")


def _mismatch(path: str, missing: list[str], extra: list[str], *, partial: bool, positional: bool = False) -> str:
    """The message of a target that names other key paths than the file."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} key path(s) of the target not in the checkpoint: {_abridged(missing)}")
    if extra:
        parts.append(f"{len(extra)} key path(s) of the checkpoint not in the target: {_abridged(extra)}"
                     + ("" if partial else " (restore(..., partial=True) restores a subset)"))
    return f"{path}: " + "; ".join(parts)


def _without_value(path: str) -> str | None:
    """A flax Variable's key path without its ``.value`` (a pure dict's), or None."""
    return path[: -len(".value")] if path.endswith(".value") else None


def _match_by_path(path: str, file_layout: Layout, target_paths: list[str], partial: bool) -> list[int]:
    """The file leaf of each target leaf, by key path (a Variable's ``….value`` also matches a pure
    dict's ``…`` and back); E9005 listing every missing and extra key path."""
    index = {leaf.path: i for i, leaf in enumerate(file_layout.leaves)}
    aliases: dict[str, int | None] = {}
    for i, leaf in enumerate(file_layout.leaves):
        for alias in (_without_value(leaf.path), leaf.path + ".value"):
            if alias is not None and alias not in index:
                aliases[alias] = None if alias in aliases else i  # (an ambiguous alias matches nothing)
    chosen, missing = [], []
    for target_path in target_paths:
        i = index.get(target_path)
        if i is None:
            i = aliases.get(target_path)
        if i is None:
            missing.append(target_path)
        chosen.append(i)
    found = [c for c in chosen if c is not None]
    used = set(found)
    if len(used) != len(found):
        twice = [p for p, c in zip(target_paths, chosen) if c is not None and chosen.count(c) > 1]
        raise MismatchError(f"{path}: target key paths {_abridged(twice)} name the same saved leaf")
    extra = [] if partial else [leaf.path for i, leaf in enumerate(file_layout.leaves) if i not in used]
    if missing or extra:
        raise MismatchError(_mismatch(path, missing, extra, partial=partial))
    return chosen


def _match_by_position(path: str, file_layout: Layout, target_paths: list[str]) -> list[int]:
    """The file leaves in order; E9005 naming what differs, and saying when the target holds the
    same leaves in another order (a dict sorted by ``jax.tree.map``)."""
    problem = template_mismatch(target_paths, [leaf.path for leaf in file_layout.leaves], listed=MAX_LISTED)
    if problem is not None:
        raise MismatchError(f"{path}: {problem} (without a layout file, leaves are matched by position, in the "
                            "order they were saved)")
    return list(range(len(target_paths)))


def _value_shape(leaf: Leaf, form: sd.Form | None) -> tuple[int, ...]:
    return form.value_shape(leaf.shape) if form is not None else leaf.shape


def _saved_category(leaf: Leaf, form: sd.Form | None) -> str:
    if form is None:
        return "real" if leaf.is_real else "int"
    if form.kind == sd.KIND_KEY:
        return "key"
    if form.kind == sd.KIND_PYTHON:
        return {"bool": "bool", "int": "int", "float": "real"}[form.dtype]
    return _category(sd.dtype_named(form.dtype))


def _describe_saved(leaf: Leaf, form: sd.Form | None, placement: Placement, i: int) -> str:
    shape = _value_shape(leaf, form)
    if form is not None and form.kind == sd.KIND_PYTHON:
        return f"a Python {form.dtype}"
    name = form.dtype if form is not None else sd.dtype_name(placement.value_dtype(i))
    return f"{shape} {name}"


_COMPATIBLE = {("bool", "int"), ("int", "bool")}


def _check_pair(path: str, leaf: Leaf, form: sd.Form | None, spec: _Spec, placement: Placement, i: int) -> None:
    """Refuses a target leaf whose shape or kind of value differs from the saved one (E9005)."""
    where = f"{path}: at {leaf.path or '(root)'}"
    saved_shape = _value_shape(leaf, form)
    if spec.shape != saved_shape:
        raise MismatchError(f"{where}: expected {spec.describe()}, found {_describe_saved(leaf, form, placement, i)}")
    have, want = _saved_category(leaf, form), spec.category
    if have == want or (have, want) in _COMPATIBLE:
        if have == "key" and form is not None and spec.key is not None and form.impl != spec.key[0]:
            raise MismatchError(f"{where}: expected keys of {spec.key[0]}, found keys of {form.impl}")
        return
    found = {"real": "reals", "int": f"indices below {leaf.bound}", "bool": "bools", "complex": "complex numbers",
             "key": "PRNG keys"}[have]
    raise MismatchError(f"{where}: expected {spec.describe()}, found {found}")


# --------------------------------------------------------------------------------------------
# Values: stored elements → the saved dtype → the target's dtype


def _where(path: str, leaf: Leaf) -> str:
    return f"{path}: at {leaf.path or '(root)'}"


def _saved_values(raw: np.ndarray, leaf: Leaf, form: sd.Form | None, placement: Placement, i: int,
                  where: str) -> Any:
    """A leaf's saved values from its stored elements: an array in the saved dtype, key data
    (uint32), or a Python scalar (:func:`pskd_jax.format.stored_dtypes.saved_values`)."""
    return sd.saved_values(raw, form, where, bound=leaf.bound,
                           stored_encoding=placement.encodings[i] if leaf.is_real else None)


def _dtype_info(dtype: np.dtype):
    try:
        return np.iinfo(dtype)
    except ValueError:
        return ml_dtypes.iinfo(dtype)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask.reshape(-1))[0])


def _index(shape: tuple[int, ...], flat: int) -> list[int]:
    return [int(k) for k in np.unravel_index(flat, shape)] if shape else []


def _cast(values: np.ndarray, dtype: np.dtype, where: str, *, allow_overflow: bool) -> np.ndarray:
    """The explicit cast a target asks for. Refused (E9004, naming the index): an integer that does
    not fit, a bool other than 0 or 1, a finite value beyond a float dtype's range (unless
    ``allow_overflow``). Rounding to a narrower float is the cast asked for."""
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    target = _category(dtype)
    if target == "bool":
        return sd.as_bool(values, where)
    if target == "int":
        if values.size:
            info = _dtype_info(dtype)
            wide = values.astype(np.int64) if values.dtype.kind == "b" else values
            low, high = wide.min(), wide.max()
            if int(low) < int(info.min) or int(high) > int(info.max):
                bad = _first((wide < info.min) | (wide > info.max))
                raise BadValueError(f"{where} at index {_index(values.shape, bad)}: the stored value "
                                    f"{wide.reshape(-1)[bad]} does not fit the target's {sd.dtype_name(dtype)}")
        return values.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(dtype)
    if not allow_overflow and values.size:
        parts = (values.real, out.real, values.imag, out.imag) if target == "complex" else (values, out)
        for before, after in zip(parts[::2], parts[1::2]):
            before64 = before.astype(np.float64) if before.dtype.kind != "f" or before.dtype.itemsize < 8 else before
            after64 = after.astype(np.float64)
            beyond = np.isfinite(before64) & ~np.isfinite(after64)
            if beyond.any():
                bad = _first(beyond)
                raise BadValueError(f"{where} at index {_index(values.shape, bad)}: the stored value "
                                    f"{before64.reshape(-1)[bad]!r} is beyond the range of the target's "
                                    f"{sd.dtype_name(dtype)} (restore(..., allow_overflow=True) makes it ±inf)")
    return out


def _to_target(saved: Any, spec: _Spec | None, where: str, allow_overflow: bool) -> Any:
    """Saved values as the target leaf asks (a Python scalar, or an array of its dtype)."""
    if spec is None or spec.key is not None:
        return saved
    if spec.python is not None:
        if isinstance(saved, (bool, int, float)):
            value = saved
        else:
            value = np.asarray(saved).reshape(()).item()
        if spec.python is bool:
            return bool(sd.as_bool(np.asarray(value), where)) if not isinstance(value, bool) else value
        if spec.python is int and isinstance(value, float):
            raise MismatchError(f"{where}: expected a Python int, found a real")
        return spec.python(value)
    if isinstance(saved, (bool, int, float)):
        return _python_to_array(saved, spec.dtype, where, allow_overflow)
    return _cast(saved, spec.dtype, where, allow_overflow=allow_overflow)


def _python_to_array(value: Any, dtype: np.dtype, where: str, allow_overflow: bool) -> np.ndarray:
    if isinstance(value, int) and not isinstance(value, bool) and _category(dtype) == "int":
        info = _dtype_info(dtype)
        if not int(info.min) <= value <= int(info.max):
            raise BadValueError(f"{where}: the stored value {value} does not fit the target's {sd.dtype_name(dtype)}")
        return np.asarray(value).astype(dtype)
    source = np.asarray(value, dtype=np.float64 if isinstance(value, float) else None)
    return _cast(source, dtype, where, allow_overflow=allow_overflow)


def _check_x64(where: str, dtype: np.dtype, asked: bool) -> None:
    jax = jax_module()
    if dtype.itemsize >= 8 and dtype.kind in "fiuc" and not jax.config.jax_enable_x64 \
            and not (dtype.kind == "c" and dtype.itemsize == 8):
        stored = {"f": "f64", "c": "complex128"}.get(dtype.kind, str(dtype))
        how = "ask for a 32-bit dtype in the target"
        raise MismatchError(f"{where}: {'the target asks for' if asked else 'stored as'} {stored}, but JAX has x64 "
                            f"disabled: enable jax_enable_x64 or {how} (an explicit cast)")


def _final_dtype(leaf: Leaf, form: sd.Form | None, spec: _Spec | None, placement: Placement, i: int) -> np.dtype | None:
    """The dtype a JAX-bound leaf will have (None for keys and Python scalars)."""
    if spec is not None:
        return spec.dtype
    if form is None:
        return placement.value_dtype(i)
    if form.kind in (sd.KIND_KEY, sd.KIND_PYTHON):
        return None
    if not sd.restore_dtype(form, placement.encodings[i] if leaf.is_real else None):
        return placement.value_dtype(i)
    return sd.dtype_named(form.dtype)


# --------------------------------------------------------------------------------------------
# restore


def restore(
    path: str | os.PathLike,
    target: Any = None,
    *,
    layout: Any = None,
    as_numpy: bool = False,
    zero_copy: bool = False,
    sha256: str | None = None,
    xxh3_128: str | None = None,
    partial: bool = False,
    allow_overflow: bool = False,
) -> Any:
    """Restores a checkpoint, every leaf bit for bit (see the module's docstring for what comes back).

    ``target`` is a pytree of arrays, ``jax.ShapeDtypeStruct``s, key arrays or Python scalars:
    its containers, shapes and dtypes are what the result has, its leaves matched to the saved
    ones by key path through the layout file (by position for a file without one). A mismatch
    lists every missing and extra key path (E9005). ``partial=True`` restores the subset the
    target names, reading only those bytes. A target dtype other than the saved one is an explicit
    cast; one that would change a value is refused (E9004), except rounding to a narrower float, and
    overflow to ±inf when ``allow_overflow=True``. A leaf whose target carries a
    ``jax.sharding.Sharding`` is built shard by shard, each read from its own region of the file.

    Without a target, a closed type restores to its tuple and a ``params`` file needs its layout
    (``layout=`` a layout file's path or :class:`LayoutFile`, which give the saved dtypes and match
    by key path; a :class:`Layout` or template, which give the stored view and match by position;
    or the ``NAME.layout.json`` beside it, which must belong to the file: E9005 otherwise; E9001
    when there is none).

    Leaves come back as JAX arrays, except for numpy target leaves, with ``as_numpy=True``, and with
    ``zero_copy=True`` (read-only numpy views of the map). 64-bit leaves into JAX with x64 disabled
    are refused unless the target asks for a narrower dtype.

    ``xxh3_128`` or ``sha256`` (hex) checks the whole file's digest while reading (each given is
    checked) and raises E9013 naming the file on a mismatch; nothing is returned from a file that
    does not verify.
    """
    path = os.fspath(path)
    expected = expected_digests(path, {"xxh3_128": xxh3_128, "sha256": sha256})
    try:
        return _restore(path, target, layout, as_numpy, zero_copy, expected, partial, allow_overflow)
    except PskdError:
        raise
    except (TypeError, ValueError, OverflowError, KeyError, IndexError) as e:
        # A last guard: the roots are checked above; no raw error of numpy's or JAX's escapes.
        raise MismatchError(f"{path}: cannot restore into this target ({GUARDED}): {type(e).__name__}: "
                            f"{str(e)[:300]}") from None


def _restore(path, target, layout, as_numpy, zero_copy, expected, partial, allow_overflow):
    if partial and target is None:
        raise UsageError(f"{path}: partial=True restores the key paths a target names: give a target")
    target_pairs, rebuild = tree_lib.flatten(target, what="the target") if target is not None else (None, None)
    specs = [_spec_of(p, s, as_numpy or zero_copy) for p, s in target_pairs] if target_pairs is not None else None
    with Reader(path) as reader:
        view = _file_view(reader, layout, target_pairs, specs)
        if partial and not view.by_path:
            raise NotClosedError(f"{path}: partial=True matches key paths through the layout file, and there "
                                 f"is none ({os.path.basename(layout_path_for(path))})")
        reader.with_layout(view.layout)
        placement = reader.placement
        if reader.header.count != 1:
            raise MismatchError(f"{path}: a checkpoint holds one sample, this file holds {reader.header.count}")
        if target_pairs is None:
            chosen = list(range(len(view.layout.leaves)))
        elif view.by_path:
            chosen = _match_by_path(path, view.layout, [p for p, _ in target_pairs], partial)
        else:
            chosen = _match_by_position(path, view.layout, [p for p, _ in target_pairs])
        leaves = view.layout.leaves
        spec_of_leaf = [specs[k] if specs is not None else None for k in range(len(chosen))]
        for k, i in enumerate(chosen):
            if spec_of_leaf[k] is not None:
                _check_pair(path, leaves[i], view.forms[i], spec_of_leaf[k], placement, i)
        if zero_copy:
            values = _zero_copy_values(path, reader, view, chosen, spec_of_leaf, expected, allow_overflow)
        else:
            values = _read_values(path, reader, view, chosen, spec_of_leaf, as_numpy, expected, allow_overflow)
    if rebuild is not None:
        return rebuild(values)
    return view.layout.unflatten(values)


def _zero_copy_values(path, reader, view, chosen, specs, expected, allow_overflow) -> list[Any]:
    if expected:
        from_file = _hash_only(path, reader, list(expected))
        for name, found in from_file.items():
            check_digest(path, name, found, expected[name])
    raw = _map_views(path, reader, reader.placement, chosen)
    out = []
    for k, i in enumerate(chosen):
        leaf = view.layout.leaves[i]
        where = _where(path, leaf)
        saved = _saved_values(raw[i], leaf, view.forms[i], reader.placement, i, where)
        out.append(_to_target(saved, specs[k], where, allow_overflow))
    return out


def _hash_only(path: str, reader: Reader, names: list[str]) -> dict[str, str]:
    hashes = {name: DIGESTS[name]() for name in names}
    fd = open_fd(path, TruncatedError)  # a regular file only: never a FIFO to block on
    try:
        buffer = bytearray(min(HASH_PIECE, max(1, reader.file_size)))
        position = 0
        while position < reader.file_size:
            n = min(len(buffer), reader.file_size - position)
            view = memoryview(buffer)[:n]
            read_into(fd, view, position, path)
            for digest in hashes.values():
                digest.update(view)
            position += n
    finally:
        os.close(fd)
    return {name: digest.hexdigest() for name, digest in hashes.items()}


def _map_views(path: str, reader: Reader, placement: Placement, which: Sequence[int]) -> dict[int, np.ndarray]:
    """Read-only views of the leaves ``which`` over a map of their own: ``np.frombuffer`` holds the
    map's buffer, so the map lives exactly as long as a view does (the reader's own map closes)."""
    leaves = placement.layout.leaves
    if reader.file_size == 0 or placement.sample_bytes == 0:
        return {i: np.zeros(leaves[i].shape, placement.value_dtype(i)) for i in which}
    fd = open_fd(path, TruncatedError)  # a regular file only: never a FIFO to block on
    try:
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise TruncatedError(f"{path}: cannot map: {getattr(e, 'strerror', None) or e}") from e
    finally:
        os.close(fd)
    views = {}
    for i in which:
        leaf = leaves[i]
        view = np.frombuffer(mapped, dtype=placement.disk_dtypes[i], count=leaf.size,
                             offset=reader.header.data_offset + placement.offsets[i])
        views[i] = view.reshape(leaf.shape).view(placement.value_dtype(i))
    return views


def _read_values(path, reader, view: _FileView, chosen, specs, as_numpy, expected, allow_overflow) -> list[Any]:
    placement = reader.placement
    leaves = view.layout.leaves
    data_offset = reader.header.data_offset
    forms = view.forms
    results: list[Any] = [None] * len(chosen)
    sharded: list[int] = []  # positions k in the target
    plain: list[int] = []
    for k, i in enumerate(chosen):
        spec = specs[k]
        elementwise = forms[i] is None or forms[i].kind in (sd.KIND_VALUE, sd.KIND_BITS)
        if spec is not None and spec.sharding is not None and not single_device(spec.sharding) and elementwise:
            sharded.append(k)
        else:
            plain.append(k)
    to_jax = [not as_numpy and (specs[k].to_jax if specs[k] is not None else True) for k in range(len(chosen))]
    for k, i in enumerate(chosen):
        if to_jax[k]:
            dtype = _final_dtype(leaves[i], forms[i], specs[k], placement, i)
            if dtype is not None:
                _check_x64(_where(path, leaves[i]), dtype, specs[k] is not None)
    fd = open_fd(path, TruncatedError)  # a regular file only: never a FIFO to block on
    hashes = {name: DIGESTS[name]() for name in expected}
    try:
        header_bytes = bytearray(data_offset)
        read_into(fd, memoryview(header_bytes), 0, path)
        for digest in hashes.values():
            digest.update(header_bytes)
        # Leaves bound for JAX are read and put on their device one at a time, so the host holds
        # one leaf, not a second copy of the tree (unless verifying, which reads all in file order).
        streamed = [] if hashes else [k for k in plain if to_jax[k]]
        wanted = sorted({chosen[k] for k in plain if k not in streamed} | (set(chosen[k] for k in sharded) if hashes else set()))
        host = _read_leaves(fd, path, data_offset, placement, wanted, list(hashes.values()),
                            every=len(leaves) if hashes else 0)
        for k in streamed:
            i = chosen[k]
            one = _read_leaves(fd, path, data_offset, placement, [i], [])[i]
            results[k] = _finish(path, one, leaves[i], forms[i], specs[k], placement, i, True, allow_overflow)
            del one
        if hashes:
            end = data_offset + placement.sample_bytes
            if reader.file_size > end:
                tail = bytearray(reader.file_size - end)
                read_into(fd, memoryview(tail), end, path)
                for digest in hashes.values():
                    digest.update(tail)
            for name, digest in hashes.items():
                check_digest(path, name, digest.hexdigest(), expected[name])
        for k in plain:
            if k not in streamed:
                i = chosen[k]
                results[k] = _finish(path, host[i], leaves[i], forms[i], specs[k], placement, i, to_jax[k],
                                     allow_overflow)
        for k in sharded:
            i = chosen[k]
            results[k] = _restore_sharded(fd, path, data_offset + placement.offsets[i], leaves[i], forms[i],
                                          placement, i, specs[k], host.get(i), allow_overflow)
    finally:
        os.close(fd)
    return results


def _pieces(sizes: dict[int, int], piece: int | None) -> list[tuple[int, int, int]]:
    """(leaf, start, stop) byte ranges covering the leaves in order, each at most ``piece`` bytes
    (a whole leaf a range when ``piece`` is None)."""
    out = []
    for i, size in sizes.items():
        if piece is None or size <= piece:
            out.append((i, 0, size))
        else:
            out.extend((i, start, min(size, start + piece)) for start in range(0, size, piece))
    return out


def _read_leaves(fd: int, path: str, data_offset: int, placement: Placement, which: list[int],
                 hashes: list[Any], every: int = 0) -> dict[int, np.ndarray]:
    """Leaves ``which`` (in storage order) read into fresh arrays; on two threads when large (the
    page faults of fresh buffers are half the cost of a read, and they run in parallel). With
    ``hashes`` (hash objects), the reads go by pieces of :data:`HASH_PIECE` bytes, and this thread
    hashes each piece once it and every piece before it are read (the hashes see the file's byte
    order) while the two threads read on; then the leaves not in ``which`` (of the ``every``
    leaves) are read too, for the hash only, a piece at a time."""
    leaves = placement.layout.leaves
    out = {i: np.empty(leaves[i].shape, dtype=placement.value_dtype(i)) for i in which}
    order = range(every) if every else which
    sizes = {i: (out[i].nbytes if i in out else leaves[i].size * placement.disk_dtypes[i].itemsize) for i in order}
    pieces = _pieces(sizes, HASH_PIECE if hashes else None)

    def read(piece: tuple[int, int, int]) -> memoryview:
        i, start, stop = piece
        view = _as_bytes(out[i])[start:stop] if i in out else memoryview(bytearray(stop - start))
        read_into(fd, view, data_offset + placement.offsets[i] + start, path)
        return view

    if sum(sizes.values()) <= PARALLEL_READ_BYTES or len(pieces) < 2:
        for piece in pieces:
            view = read(piece)
            for digest in hashes:
                digest.update(view)
        return out
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pskd-read") as pool:
        for view in pool.map(read, pieces):  # in order
            for digest in hashes:
                digest.update(view)
    return out


def _as_bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


def _finish(path: str, raw: np.ndarray, leaf: Leaf, form: sd.Form | None, spec: _Spec | None,
            placement: Placement, i: int, to_jax: bool, allow_overflow: bool) -> Any:
    where = _where(path, leaf)
    saved = _saved_values(raw, leaf, form, placement, i, where)
    value = _to_target(saved, spec, where, allow_overflow)
    is_key = form is not None and form.kind == sd.KIND_KEY
    if not to_jax or isinstance(value, (bool, int, float)):
        return value
    jax = jax_module()
    sharding = spec.sharding if spec is not None else None
    if is_key:
        impl = form.impl if form is not None else spec.key[0]
        keys = wrap_keys(jax.device_put(value), impl)
        return jax.device_put(keys, sharding) if sharding is not None else keys
    return jax.device_put(value, sharding) if sharding is not None else jax.device_put(value)


def _restore_sharded(fd: int, path: str, offset: int, leaf: Leaf, form: sd.Form | None, placement: Placement,
                     i: int, spec: _Spec, host: np.ndarray | None, allow_overflow: bool) -> Any:
    """A leaf built shard by shard, each distinct box read once from its region of the file."""
    jax = jax_module()
    where = _where(path, leaf)
    disk, value = placement.disk_dtypes[i], placement.value_dtype(i)
    cache: dict[tuple, np.ndarray] = {}

    def shard(index: tuple) -> np.ndarray:
        index = tuple(index) if index is not None else ()
        key = tuple(s.indices(d) for s, d in zip(index, leaf.shape))
        if key not in cache:
            if host is not None:
                piece = np.ascontiguousarray(host[index]) if index else host
            else:
                piece = read_region(fd, path, offset, leaf.shape, disk, value, index)
            saved = _saved_values(piece, leaf, form, placement, i, where)
            cache[key] = _cast(saved, spec.dtype, where, allow_overflow=allow_overflow)
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, spec.sharding, shard, dtype=spec.dtype)


def read_saved_leaves(path: str | os.PathLike, *, layout: Any = None) -> tuple[list[tuple[str, Any]], LayoutFile | None]:
    """Every leaf of a checkpoint as (key path, saved value), in storage order, as numpy (key
    arrays as their key data, Python scalars as themselves), and its layout file (when it has
    one): what a conversion writes out."""
    path = os.fspath(path)
    with Reader(path) as reader:
        view = _file_view(reader, layout, None, None)
        reader.with_layout(view.layout)
        if reader.header.count != 1:
            raise MismatchError(f"{path}: a checkpoint holds one sample, this file holds {reader.header.count}")
        chosen = list(range(len(view.layout.leaves)))
        # Positional reads, leaf by leaf: a file cut short meanwhile is E9003, never a SIGBUS.
        raw = {i: reader.leaf_range(0, i, 0, view.layout.leaves[i].size).reshape(view.layout.leaves[i].shape)
               for i in chosen}
        out = []
        for i in chosen:
            leaf = view.layout.leaves[i]
            out.append((leaf.path, _saved_values(raw[i], leaf, view.forms[i], reader.placement, i, _where(path, leaf))))
    return out, view.layout_file


__all__ = ["HASH_PIECE", "PARALLEL_READ_BYTES", "read_saved_leaves", "restore"]
