"""What a save writes: the sample type, the stored leaf and form of every value, and the encodings.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from pskd_jax.checkpoint.jax_arrays import is_array_like, is_global, is_key_array, key_data, key_impl_of
from pskd_jax.checkpoint.options import SaveOptions, check_params_name, is_params_name, save_options
from pskd_jax.errors import BadValueError, MismatchError, PskdError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.encodings import Encoding, Rounding
from pskd_jax.format.header import encode_header
from pskd_jax.format.keypaths import check_key_depth, path_keys
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.placement import Placement
from pskd_jax.format.sample_type import header_text


def leaf_name(path: str) -> str:
    """How messages name a leaf: ``leaf ['blocks'][0]['w']`` (``(root)`` for a bare array)."""
    return f"leaf {path or '(root)'}"


def _is_plain_tuple(node: Any) -> bool:
    return type(node) is tuple


def _object_ints(array: np.ndarray, path: str) -> np.ndarray | None:
    """An object array of Python ints as the narrowest integer dtype that holds them all (None when
    they are not all ints); integers beyond 64 bits in an array are refused (E9004)."""
    flat = array.reshape(-1)
    if not flat.size or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in flat):
        return None
    low, high = int(min(flat)), int(max(flat))
    kinds = ("uint8", "uint16", "uint32", "uint64") if low >= 0 else ("int8", "int16", "int32", "int64")
    for name in kinds:
        info = np.iinfo(name)
        if info.min <= low and high <= info.max:
            return np.array(flat.tolist(), dtype=name).reshape(array.shape)
    bad = high if high > np.iinfo("uint64").max or low >= 0 else low
    raise BadValueError(f"{leaf_name(path)}: {bad} in an array of integers is beyond 64 bits (a single Python "
                        "int of any size is stored exactly; an array holds at most 64-bit integers)")


def _source(path: str, value: Any, keep_global: bool) -> tuple[Any, sd.Form]:
    """A leaf's values as an array to store (the caller's buffer when it already is one: it is
    only ever read) and their form. Refuses what no checkpoint holds (E9005 naming the leaf)."""
    form = sd.python_form(value)
    if form is not None:
        if isinstance(value, bool):
            return np.asarray(value), form
        if isinstance(value, float):
            return np.asarray(value, dtype=np.float64), form
        return sd.python_int_pattern(value), form
    if is_array_like(value) and type(value).__name__ == "ShapeDtypeStruct":
        raise MismatchError(f"{leaf_name(path)}: a ShapeDtypeStruct describes an array; it holds no values to save")
    if is_key_array(value):
        impl, width = key_impl_of(value.dtype)
        data = key_data(value)
        return (data if keep_global and is_global(data) else np.asarray(data)), sd.key_form(impl, width)
    if isinstance(value, (str, bytes)):
        raise MismatchError(f"{leaf_name(path)}: a {type(value).__name__}, not an array or a number")
    if is_array_like(value) and not isinstance(value, np.ndarray):
        if is_global(value) and not keep_global:
            raise MismatchError(f"{leaf_name(path)}: an array spread over several processes; "
                                "use save_distributed (every process calls it)")
        array = value if is_global(value) else np.asarray(value)
    elif isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (complex, np.generic)):
        array = np.asarray(value)
    elif isinstance(value, numbers.Real) or hasattr(value, "__float__"):
        array = np.asarray(value, dtype=object)  # rounded once to f64 when encoded
    else:
        raise MismatchError(f"{leaf_name(path)}: a {type(value).__name__}, not an array or a number")
    dtype = getattr(array, "dtype", None)
    if isinstance(array, np.ndarray) and array.dtype == object:
        ints = _object_ints(array, path)
        array, dtype = (ints, ints.dtype) if ints is not None else (array, np.dtype(np.float64))
    form = sd.form_of_dtype(dtype)
    if form is None:
        raise MismatchError(f"{leaf_name(path)}: dtype {dtype} cannot be stored in a checkpoint (numbers, bools, "
                            "complex numbers and PRNG keys can)")
    if isinstance(array, np.ndarray):
        sd.check_f64_range(array, leaf_name(path))  # (Fraction, Decimal, long double beyond f64: E9004)
    return array, form


def _encodings_asked(pairs: list[tuple[str, Any]], leaves: list[Leaf], asked: Any) -> list[Encoding | None]:
    """``encodings`` (as :class:`SaveOptions` holds it): None, one label for every real leaf, a
    sequence in storage order, or a dict from key path to label."""
    if asked is None:
        return [None] * len(leaves)
    if isinstance(asked, (str, Encoding)):
        one = Encoding.parse(asked) if isinstance(asked, str) else Encoding(asked)
        return [one if leaf.is_real else None for leaf in leaves]
    if isinstance(asked, dict):
        unknown = set(asked) - {p for p, _ in pairs}
        if unknown:
            raise MismatchError(f"encodings given for {sorted(map(str, unknown))[:20]}, which are not leaves of the "
                                f"tree")
        labels = [asked.get(p) for p, _ in pairs]
    else:  # (a sequence: SaveOptions made it a tuple)
        labels = list(asked)
        if len(labels) != len(leaves):
            raise MismatchError(f"{len(labels)} encodings for a tree of {len(leaves)} leaves")
    out: list[Encoding | None] = []
    for leaf, label in zip(leaves, labels):
        if label is None or label == "-":
            out.append(None)
            continue
        try:
            encoding = Encoding.parse(label) if isinstance(label, str) else Encoding(label)
        except (ValueError, TypeError):
            raise BadValueError(f"{leaf_name(leaf.path)}: unknown encoding {label!r:.40}; "
                                "expected f64, f32 or bf16") from None
        if not leaf.is_real and encoding != Encoding.F64:
            raise MismatchError(f"{leaf_name(leaf.path)} is an index leaf; it has no real encoding")
        out.append(encoding)
    return out


@dataclasses.dataclass
class SavePlan:
    """What a save writes: the type, and per leaf its values, stored leaf, form and encoding."""

    type_text: str
    paths: list[str]
    arrays: list[Any]  # each leaf's values (numpy, or a global JAX array), before to_stored
    dtypes: list[str]  # the dtype name of each leaf as given, for the layout file
    layout: Layout
    placement: Placement
    forms: list[sd.Form] = dataclasses.field(default_factory=list)
    description: Any = None  # the tree's containers (tree_lib.flatten_described)

    @property
    def header(self) -> bytes:
        return encode_header(self.type_text, 1, self.placement.encodings)

    @property
    def size(self) -> int:
        return len(self.header) + self.placement.sample_bytes


def _type_name(tree: Any, name: str | None) -> str:
    if name is None:
        kind = type(tree)
        name = kind.__name__ if (dataclasses.is_dataclass(tree) or hasattr(kind, "_fields")) else "Params"
        if not is_params_name(name):
            name = "Params"
    return check_params_name(name)


def _closed_leaf_text(leaf: Leaf, form: sd.Form) -> str:
    dims = "[" + ", ".join(str(d) for d in leaf.shape) + "]"
    if leaf.is_real:
        return "ℝ" + dims
    if form.dtype == "bool":
        return "bool" + dims
    return f"idx[{leaf.bound}]" + dims


def _closed_form(form: sd.Form, value: Any) -> bool:
    """A leaf a closed type gives back as it was (its stored view is its value): f64, f32, bf16,
    unsigned integers, bool — not a Python scalar, which a ``params`` layout file gives back."""
    return is_array_like(value) and form.kind == sd.KIND_VALUE and form.dtype != "float16"


def _own_encoding(form: sd.Form, leaf: Leaf) -> Encoding:
    """The encoding a leaf gets when none is asked for: its form's for a real leaf, 0 for an idx leaf."""
    if leaf.is_real:
        assert form.encoding is not None  # (every real form has its encoding)
        return form.encoding
    return Encoding.F64


def plan(tree: Any, options: SaveOptions | None = None, *, keep_global: bool = False) -> SavePlan:
    """The type, layout and encodings a save of ``tree`` with ``options`` writes (no file is
    touched); ``keep_global`` keeps arrays spread over several processes (a distributed save)."""
    options = save_options(options)
    name, encodings = options.name, options.encodings
    pairs, rebuild, description = tree_lib.flatten_described(tree)
    arrays, forms, leaves = [], [], []
    for path, value in pairs:
        try:
            array, form = _source(path, value, keep_global)
        except PskdError:
            raise
        except (TypeError, ValueError, OverflowError, AttributeError, RuntimeError) as e:
            # (RuntimeError: a JAX array whose buffer was deleted, or donated to a computation)
            raise MismatchError(f"{leaf_name(path)}: cannot be stored: {type(e).__name__}: {str(e)[:200]}") from None
        arrays.append(array)
        forms.append(form)
        shape = tuple(int(d) for d in array.shape)
        if form.kind == sd.KIND_COMPLEX:  # (keys and Python ints come as their stored elements)
            shape = form.stored_shape(shape)
        leaves.append(Leaf(path, shape, form.bound))
    asked = _encodings_asked(pairs, leaves, encodings)
    chosen = [a if a is not None else _own_encoding(f, leaf) for a, f, leaf in zip(asked, forms, leaves)]
    closed = [_closed_form(f, v) for f, (_, v) in zip(forms, pairs)]
    if pairs and is_array_like(tree) and not isinstance(tree, (list, tuple, dict)) and len(pairs) == 1 \
            and pairs[0][1] is tree and closed[0]:
        type_text = _closed_leaf_text(leaves[0], forms[0])
        layout = Layout.of_type(type_text)
    elif _is_plain_tuple(tree) and len(tree) >= 2 and len(pairs) == len(tree) \
            and all(v is t for (_, v), t in zip(pairs, tree)) and all(closed):
        type_text = "(" + ", ".join(_closed_leaf_text(l, f) for l, f in zip(leaves, forms)) + ")"
        layout = Layout.of_type(type_text)
    else:
        type_text = f"params {_type_name(tree, name)}"
        for path, _ in pairs:  # its layout file could not be read back
            check_key_depth(path_keys(path), f"leaf {path}")
        layout = Layout(tuple(leaves), tuple(range(len(leaves))), rebuild)
    placement = Placement.of(layout, chosen)
    return SavePlan(header_text(type_text), [p for p, _ in pairs], arrays, [f.dtype for f in forms], layout,
                    placement, forms, description)


@dataclasses.dataclass(frozen=True)
class SaveResult:
    """What a save wrote: the file, its type, header version, encodings (an idx leaf's is its byte
    0, F64), the largest rounding error of each rounded leaf, its size, its layout file (None when
    none was written), the digests computed while writing (``{"xxh3_128": hex}``; empty when none
    was asked), and each leaf's encoding as a summary names it (``labels``: idx for an idx leaf)."""

    path: str
    type_text: str
    version: int
    encodings: tuple[Encoding, ...]
    rounding: list[Rounding]
    bytes: int
    layout_path: str | None
    digests: Mapping[str, str]
    labels: tuple[str, ...] = ()  # each leaf's encoding as summaries name it: f64, f32, bf16, or idx

    @classmethod
    def of(cls, path: str, plan_: SavePlan, reports: dict[int, Rounding], digests: Mapping[str, str],
           layout_path: str | None) -> SaveResult:
        """The result of a save of ``plan_``: ``reports`` the rounding of each rounded leaf, by leaf."""
        encodings = plan_.placement.encodings
        version = 2 if any(e != Encoding.F64 for e in encodings) else 1
        return cls(path, plan_.type_text, version, encodings, [reports[i] for i in sorted(reports)], plan_.size,
                   layout_path, dict(digests), plan_.placement.labels)


__all__ = ["SavePlan", "SaveResult", "leaf_name", "plan"]
