"""What a save writes: the sample type, the stored leaf of every value, and the encodings.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
import numpy as np
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.placement import Placement
from pskd_jax.format.header import encode_header
from pskd_jax.format.encodings import Encoding, Rounding, encoding_of_dtype, is_real_dtype
from pskd_jax.errors import BadValueError, MismatchError, NotClosedError
from pskd_jax.format.sample_type import header_text
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax._os.digests import DIGESTS
from pskd_jax.checkpoint.jax_arrays import is_array_like, is_global
from pskd_jax.checkpoint.keypaths import check_key_depth, path_keys


_IDENT = re.compile(r"[^\W\d]\w*")

def _is_plain_tuple(node: Any) -> bool:
    return type(node) is tuple

def _host_array(value: Any, path: str, *, keep_global: bool = False) -> Any:
    """A leaf as a numpy array without copying when it already is one (the caller's buffer is
    only ever read). Python numbers and objects with ``__float__`` become object arrays that
    :func:`to_f64` rounds once. A global JAX array stays as it is when ``keep_global``."""
    if isinstance(value, np.ndarray):
        return value
    if is_array_like(value):
        if is_global(value) and keep_global:
            return value
        if is_global(value):
            raise MismatchError(f"leaf {path or '(root)'}: an array spread over several processes; "
                "use save_distributed (every process calls it)",
            )
        return np.asarray(value)
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, int):
        return np.asarray(value, dtype=np.int64) if -(2**63) <= value < 2**63 else np.asarray(value, dtype=object)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    return np.asarray(value, dtype=object) if not isinstance(value, (list, tuple)) else np.asarray(value)

def _leaf_for(path: str, array: np.ndarray) -> Leaf:
    """The stored leaf of a value (SPEC §3); object arrays of reals are real leaves."""
    if array.dtype == object:
        flat = array.reshape(-1)
        if flat.size and all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            low, high = min(flat), max(flat)
            if low < 0:
                raise BadValueError(f"leaf {path or '(root)'}: {low} is not an index (negative)")
            return Leaf(path, tuple(array.shape), max(2, 1 << max(1, int(high).bit_length())))
        return Leaf(path, tuple(int(d) for d in array.shape))
    return tree_lib.leaf_of_spec(path, array)

def _default_encoding(leaf: Leaf, array: np.ndarray) -> Encoding:
    if not leaf.is_real:
        return Encoding.F64
    # (a byte-swapped float32 is still a float32: compare in native byte order)
    dtype = np.dtype(array.dtype)
    return encoding_of_dtype(dtype.newbyteorder("=")) if is_real_dtype(dtype) else Encoding.F64

def _encodings_asked(pairs: list[tuple[str, Any]], leaves: list[Leaf], asked: Any) -> list[Encoding | None]:
    """``encodings``: None, one label for every real leaf, a sequence in storage order, or a dict
    from key path to label."""
    if asked is None:
        return [None] * len(leaves)
    if isinstance(asked, (str, Encoding)):
        one = Encoding.parse(asked) if isinstance(asked, str) else Encoding(asked)
        return [one if leaf.is_real else None for leaf in leaves]
    if isinstance(asked, dict):
        unknown = set(asked) - {p for p, _ in pairs}
        if unknown:
            raise MismatchError(f"encodings given for {sorted(unknown)}, which are not leaves of the tree")
        labels = [asked.get(p) for p, _ in pairs]
    else:
        labels = list(asked)
        if len(labels) != len(leaves):
            raise MismatchError(f"{len(labels)} encodings for a tree of {len(leaves)} leaves")
    out: list[Encoding | None] = []
    for leaf, label in zip(leaves, labels):
        if label is None or label == "-":
            out.append(None)
            continue
        encoding = Encoding.parse(label) if isinstance(label, str) else Encoding(label)
        if not leaf.is_real and encoding != Encoding.F64:
            raise MismatchError(f"leaf {leaf.path or '(root)'} is an index leaf; it has no real encoding")
        out.append(encoding)
    return out

@dataclasses.dataclass
class SavePlan:
    """What a save writes: the type, and per leaf its array, stored leaf, encoding and dtype."""

    type_text: str
    paths: list[str]
    arrays: list[np.ndarray]
    dtypes: list[str]  # the dtype of each leaf as given, for the layout file
    layout: Layout
    placement: Placement

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
    if not _IDENT.fullmatch(name) or name in ("params", "idx", "bool", "R", "ℝ"):
        raise NotClosedError(f"params name {name!r}: expected an identifier such as 'MiniGPT'")
    return name

def _closed_leaf_text(leaf: Leaf, dtype: np.dtype) -> str:
    dims = "[" + ", ".join(str(d) for d in leaf.shape) + "]"
    if leaf.is_real:
        return "ℝ" + dims
    if dtype == np.bool_:
        return "bool" + dims
    return f"idx[{leaf.bound}]" + dims

def plan(tree: Any, *, name: str | None = None, encodings: Any = None, keep_global: bool = False) -> SavePlan:
    """The type, layout and encodings a save of ``tree`` writes (no file is touched)."""
    pairs, _ = tree_lib.flatten(tree)
    if not pairs:
        raise MismatchError("the tree has no leaves: nothing to save")
    arrays = [_host_array(value, path, keep_global=keep_global) for path, value in pairs]
    leaves = [_leaf_for(path, array) for (path, _), array in zip(pairs, arrays)]
    asked = _encodings_asked(pairs, leaves, encodings)
    chosen = [a if a is not None else _default_encoding(leaf, array) for a, leaf, array in zip(asked, leaves, arrays)]
    if is_array_like(tree) and not isinstance(tree, (list, tuple, dict)):
        type_text = _closed_leaf_text(leaves[0], arrays[0].dtype)
        layout = Layout.of_type(type_text)
    elif _is_plain_tuple(tree) and len(tree) >= 2 and all(is_array_like(v) or isinstance(v, (int, float)) for v in tree) \
            and len(pairs) == len(tree):
        type_text = "(" + ", ".join(_closed_leaf_text(l, a.dtype) for l, a in zip(leaves, arrays)) + ")"
        layout = Layout.of_type(type_text)
    else:
        type_text = f"params {_type_name(tree, name)}"
        for path, _ in pairs:  # its layout file could not be read back
            check_key_depth(path_keys(path), f"leaf {path}")
        _, rebuild = tree_lib.flatten(tree)
        layout = Layout(tuple(leaves), tuple(range(len(leaves))), rebuild)
    placement = Placement.of(layout, chosen)
    dtypes = [tree_lib.describe_dtype(np.dtype(a.dtype)) if a.dtype != object else "float64" for a in arrays]
    return SavePlan(header_text(type_text), [p for p, _ in pairs], arrays, dtypes, layout, placement)

@dataclasses.dataclass
class SaveResult:
    """What :func:`save` wrote; ``sha256`` or ``xxh3_128`` is the file's digest when asked for."""

    path: str
    type_text: str
    version: int
    encodings: tuple[Encoding, ...]
    rounding: list[Rounding]
    bytes: int
    sha256: str | None = None
    layout_path: str | None = None
    xxh3_128: str | None = None

    @property
    def digest(self) -> dict[str, str]:
        """The digests computed, by algorithm (``{"xxh3_128": hex}``; empty when none was asked)."""
        return {name: getattr(self, name) for name in DIGESTS if getattr(self, name) is not None}


__all__ = ["SavePlan", "SaveResult", "plan"]
