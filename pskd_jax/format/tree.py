"""Pytrees in declaration order, and the layout of a ``params`` tree from a template.

A checkpoint stores a parameter tree's leaves in *declaration order*: dict insertion order,
dataclass and NamedTuple field order, list and tuple order. ``jax.tree_util`` flattens a plain
dict in sorted key order instead, so this module walks the common containers itself. Any other
node type that JAX knows (registered with ``jax.tree_util``) is opened with JAX's own flatten —
consulted only when JAX has already been imported by the caller, so the data tools stay free of it.

Key paths are written the way ``jax.tree_util.keystr`` writes them: ``['blocks'][0]['w']``.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any, Callable, Sequence

import numpy as np

from pskd_jax.format.encodings import bfloat16, is_real_dtype
from pskd_jax.errors import MismatchError
from pskd_jax.format.layout import Layout, Leaf

Rebuild = Callable[[Sequence[Any]], Any]
# Deeper than any model, well inside Python's recursion limit (a checkpoint's layout file allows 64
# keys and says so itself): a cyclic or hostile structure gets E9005, not RecursionError.
MAX_TREE_DEPTH = 256


def _is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


def _children(node: Any) -> tuple[list[tuple[str, Any]], Callable[[list[Any]], Any]] | None:
    """The (key, child) pairs of a container node and a function that rebuilds it, or None."""
    if isinstance(node, dict):
        keys = list(node.keys())
        kind = type(node)
        factory = getattr(node, "default_factory", None)
        return [(f"[{k!r}]", node[k]) for k in keys], lambda vs: _make_dict(kind, keys, vs, factory)
    if _is_namedtuple(node):
        kind = type(node)
        return [(f".{f}", getattr(node, f)) for f in node._fields], lambda vs: kind(*vs)
    if isinstance(node, (list, tuple)):
        kind = type(node)
        return [(f"[{i}]", v) for i, v in enumerate(node)], lambda vs: kind(vs)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = [f.name for f in dataclasses.fields(node) if f.init]
        return (
            [(f".{n}", getattr(node, n)) for n in names],
            lambda vs: dataclasses.replace(node, **dict(zip(names, vs))),
        )
    return _jax_children(node)


def _make_dict(kind: type, keys: list[Any], values: list[Any], factory: Any = None) -> dict:
    pairs = zip(keys, values)
    if kind is dict:
        return dict(pairs)
    if issubclass(kind, collections.defaultdict):
        return kind(factory, pairs)
    return kind(pairs)


def _jax_children(node: Any):
    """Children of a node registered with JAX, in JAX's flatten order (None if JAX is absent)."""
    jax = sys.modules.get("jax")
    if jax is None or node is None or _looks_like_array(node):
        return None
    tree_util = jax.tree_util
    with_path, treedef = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1:  # the node itself is a leaf for JAX
        return None
    pairs = [(tree_util.keystr(path), child) for path, child in with_path]
    return pairs, lambda vs: tree_util.tree_unflatten(treedef, list(vs))


def _looks_like_array(node: Any) -> bool:
    return hasattr(node, "shape") and hasattr(node, "dtype")


def flatten(tree: Any, *, path: str = "", _depth: int = 0) -> tuple[list[tuple[str, Any]], Rebuild]:
    """Flattens a pytree in declaration order into (key path, leaf) pairs, and a rebuild function.

    ``None`` is an empty node, as in JAX. A tree nested deeper than :data:`MAX_TREE_DEPTH`
    containers (a cycle: a list holding itself) is refused with E9005.

    >>> pairs, rebuild = flatten({"b": 1.0, "a": [2.0, 3.0]})
    >>> [p for p, _ in pairs]
    ["['b']", "['a'][0]", "['a'][1]"]
    >>> rebuild([10, 20, 30])
    {'b': 10, 'a': [20, 30]}
    """
    if tree is None:
        return [], lambda values: None
    opened = None if _looks_like_array(tree) else _children(tree)
    if opened is None:
        return [(path, tree)], lambda values: values[0]
    children, make = opened
    if _depth >= MAX_TREE_DEPTH:
        shown = path if len(path) <= 200 else path[:200] + "…"
        raise MismatchError(f"{shown}: a tree nested deeper than {MAX_TREE_DEPTH} containers (a cycle?)")
    pairs: list[tuple[str, Any]] = []
    rebuilds: list[tuple[int, int, Rebuild]] = []
    for key, child in children:
        child_pairs, child_rebuild = flatten(child, path=path + key, _depth=_depth + 1)
        rebuilds.append((len(pairs), len(child_pairs), child_rebuild))
        pairs.extend(child_pairs)

    def rebuild(values: Sequence[Any]) -> Any:
        return make([child(values[start : start + n]) for start, n, child in rebuilds])

    return pairs, rebuild


def leaf_of_spec(path: str, spec: Any) -> Leaf:
    """The leaf an array (or ``jax.ShapeDtypeStruct``) is stored as (SPEC §3)."""
    if not _looks_like_array(spec):
        spec = np.asarray(spec)
    dtype = np.dtype(spec.dtype)
    shape = tuple(int(d) for d in spec.shape)
    if is_real_dtype(dtype):
        return Leaf(path, shape)
    if dtype == bool:
        return Leaf(path, shape, 2)
    if dtype.kind == "u":
        return Leaf(path, shape, 2 ** (8 * dtype.itemsize))
    if dtype.kind == "i":
        return Leaf(path, shape, 2 ** (8 * dtype.itemsize - 1))
    raise MismatchError(f"leaf {path or '(root)'}: dtype {dtype} cannot be stored")


def layout_of_template(template: Any) -> Layout:
    """The layout of a ``params`` tree: its leaves in declaration order, rebuilt into its nodes.

    >>> import numpy as np
    >>> layout = layout_of_template({"w": np.zeros((2, 3), np.float32), "step": np.int32(0)})
    >>> [(leaf.path, leaf.shape, leaf.bound) for leaf in layout.leaves]
    [("['w']", (2, 3), None), ("['step']", (), 2147483648)]
    """
    pairs, rebuild = flatten(template)
    leaves = tuple(leaf_of_spec(path, spec) for path, spec in pairs)
    return Layout(leaves, tuple(range(len(leaves))), rebuild)


def template_dtypes(template: Any) -> list[np.dtype]:
    """The dtype of each leaf of a template, in declaration order."""
    pairs, _ = flatten(template)
    return [np.dtype(spec.dtype) if _looks_like_array(spec) else np.asarray(spec).dtype for _, spec in pairs]


def check_leaf_shape(leaf: Leaf, array: np.ndarray, *, batched: bool) -> None:
    """Refuses an array whose shape is not the leaf's (E9005), naming the key path."""
    shape = array.shape[1:] if batched else array.shape
    if tuple(shape) != leaf.shape:
        raise MismatchError(f"at {leaf.path or '(root)'}: expected shape {leaf.shape}, got {tuple(shape)}"
            + (" after the batch axis" if batched else ""),
        )


def describe_dtype(dtype: np.dtype) -> str:
    return "bfloat16" if np.dtype(dtype) == bfloat16 else str(np.dtype(dtype))


__all__ = [
    "flatten",
    "layout_of_template",
    "leaf_of_spec",
    "template_dtypes",
    "check_leaf_shape",
    "describe_dtype",
]
