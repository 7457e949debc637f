"""Pytrees in declaration order, and the layout of a ``params`` tree from a template.

A plain dict is walked in insertion order, not ``jax.tree_util``'s sorted order; any other node JAX
knows is opened with JAX's own flatten, consulted only when the caller has imported JAX already, so
the data tools stay free of it. The order and the key-path text are defined in ``docs/pytrees.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pskd_jax.errors import MismatchError
from pskd_jax.format.encodings import is_bfloat16, is_real_dtype
from pskd_jax.format.keypaths import check_dict_keys, key_json, key_of_json, key_piece, path_keys
from pskd_jax.format.layout import Layout, Leaf

Rebuild = Callable[[Sequence[Any]], Any]
# Deeper than any model, well inside Python's recursion limit (a checkpoint's layout file allows 64
# keys and says so itself): a cyclic or hostile structure gets E9005, not RecursionError.
MAX_TREE_DEPTH = 256


def _is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


def _class_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _children(node: Any, path: str = "") -> tuple[list[tuple[str, Any]], Callable[[list[Any]], Any], dict] | None:
    """The (key, child) pairs of a container node, a function that rebuilds it, and the node's
    description (without its children), or None for a leaf. A dict two of whose keys would come
    back as one is refused (E9005 naming both: :func:`pskd_jax.format.keypaths.check_dict_keys`)."""
    if isinstance(node, dict):
        keys = list(node.keys())
        check_dict_keys(keys, path)
        kind = type(node)
        factory = getattr(node, "default_factory", None)
        info: dict[str, Any] = {"dict": [key_json(k) for k in keys]}
        if kind is not dict:
            info["class"] = _class_name(kind)
        return [(key_piece(k), node[k]) for k in keys], lambda vs: _make_dict(kind, keys, vs, factory), info
    if _is_namedtuple(node):
        kind = type(node)
        info = {"namedtuple": kind.__name__, "fields": list(node._fields)}
        return [(f".{f}", getattr(node, f)) for f in node._fields], lambda vs: kind(*vs), info
    if isinstance(node, (list, tuple)):
        sequence_kind = type(node)
        info = {"list" if isinstance(node, list) else "tuple": len(node)}
        if sequence_kind not in (list, tuple):
            info["class"] = _class_name(sequence_kind)
        return [(f"[{i}]", v) for i, v in enumerate(node)], lambda vs: sequence_kind(vs), info
    registered = _jax_children(node)
    if registered is not None:
        return registered
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return _dataclass_children(node, path)
    return None


def _dataclass_children(node: Any, path: str) -> tuple[list[tuple[str, Any]], Callable[[list[Any]], Any], dict]:
    """A dataclass's fields, every one of them (``init=False`` ones too: what the instance holds is
    what is saved), and a rebuild that gives each its value back. A field the instance does not
    hold (``init=False`` and never set) is refused, E9005 naming it."""
    fields = dataclasses.fields(node)
    names = [f.name for f in fields]
    for name in names:
        if not hasattr(node, name):
            raise MismatchError(f"{path or '(root)'}.{name}: the field {name} of the dataclass "
                                f"{_class_name(type(node))} holds no value (init=False, never set), so "
                                "it cannot be saved; give it a default or set it")
    given = {f.name for f in fields if f.init}
    info = {"dataclass": _class_name(type(node)), "fields": names}

    def rebuild(values: list[Any]) -> Any:
        pairs = dict(zip(names, values))
        out = dataclasses.replace(node, **{n: v for n, v in pairs.items() if n in given})
        for n, v in pairs.items():
            if n not in given:  # (set as the instance held it, not as __post_init__ computes it)
                object.__setattr__(out, n, v)
        return out

    return [(f".{n}", getattr(node, n)) for n in names], rebuild, info


def _make_dict(kind: type[dict], keys: list[Any], values: list[Any], factory: Any = None) -> dict:
    pairs = zip(keys, values)
    if kind is dict:
        return dict(pairs)
    if issubclass(kind, collections.defaultdict):
        return kind(factory, pairs)
    return kind(pairs)


def _is_array(node: Any) -> bool:
    """An array or an array's description: a leaf whatever attributes it has."""
    if isinstance(node, (np.ndarray, np.generic)):
        return True
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(node, (jax.Array, jax.ShapeDtypeStruct))


def _jax_children(node: Any):
    """Children of a node registered with JAX, in JAX's flatten order (None if JAX is absent or
    the node is a leaf for it). A registered node is opened even when it looks like an array (a
    flax ``Variable`` has a ``shape`` and a ``dtype``): its leaves are what is stored."""
    jax = sys.modules.get("jax")
    if jax is None or node is None or _is_array(node) or isinstance(node, (int, float, complex, str, bytes)):
        return None
    tree_util = jax.tree_util
    with_path, treedef = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # the node itself is a leaf for JAX
        return None
    pairs = [(tree_util.keystr(path), child) for path, child in with_path]
    info: dict[str, Any] = {"node": _class_name(type(node)), "children": [key for key, _ in pairs]}
    if pairs and all(len(path) == 1 and isinstance(path[0], tree_util.DictKey) for path, _ in with_path):
        info["mapping"] = True  # (an nnx State, a FrozenDict: int keys stay keys, not list indices)
    return pairs, lambda vs: tree_util.tree_unflatten(treedef, list(vs)), info


def _looks_like_array(node: Any) -> bool:
    return hasattr(node, "shape") and hasattr(node, "dtype")


def flatten(tree: Any, *, path: str = "", what: str = "the tree", _depth: int = 0
            ) -> tuple[list[tuple[str, Any]], Rebuild]:
    """Flattens a pytree in declaration order into (key path, leaf) pairs, and a rebuild function.

    ``None`` is an empty node, as in JAX. A tree nested deeper than :data:`MAX_TREE_DEPTH`
    containers (a cycle: a list holding itself) is refused with E9005, and so is a node whose own
    flattening fails (a registered node that raises), naming ``what`` was walked.

    >>> pairs, rebuild = flatten({"b": 1.0, "a": [2.0, 3.0]})
    >>> [p for p, _ in pairs]
    ["['b']", "['a'][0]", "['a'][1]"]
    >>> rebuild([10, 20, 30])
    {'b': 10, 'a': [20, 30]}
    """
    pairs, rebuild, _ = flatten_described(tree, path=path, what=what, _depth=_depth)
    return pairs, rebuild


def flatten_described(tree: Any, *, path: str = "", what: str = "the tree", _depth: int = 0
                      ) -> tuple[list[tuple[str, Any]], Rebuild, Any]:
    """:func:`flatten`, and a JSON description of the tree's containers (what a layout file
    records so that a tree can be rebuilt without its program; see :func:`build_described`).

    A leaf is described by its number in declaration order, ``None`` by null, a container by an
    object: ``{"dict": [[key, child], …]}``, ``{"list": […]}``, ``{"tuple": […]}``,
    ``{"namedtuple": NAME, "fields": [[field, child], …]}``, ``{"dataclass": CLASS, "fields": …}``
    or ``{"node": CLASS, "children": [[key path piece, child], …]}`` for other nodes JAX knows
    (with ``"mapping": true`` when their children are a mapping's entries).

    >>> flatten_described({"a": [1.0, None], 3: 2.0})[2]
    {'dict': [['a', {'list': [0, None]}], [3, 1]]}
    """
    pairs: list[tuple[str, Any]] = []
    try:
        rebuild, description = _flatten_into(tree, path, _depth, pairs)
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as e:
        # A container of the caller's (a registered pytree node, a dataclass) that cannot be taken
        # apart: the toolkit's error, never the node's own exception.
        raise MismatchError(f"{what} cannot be walked: {type(e).__name__}: {str(e)[:200]}") from e
    return pairs, rebuild, description


def _flatten_into(tree: Any, path: str, depth: int, pairs: list[tuple[str, Any]]) -> tuple[Rebuild, Any]:
    if tree is None:
        return (lambda values: None), None
    opened = None if _is_array(tree) else _children(tree, path)
    if opened is None:
        pairs.append((path, tree))
        return (lambda values: values[0]), len(pairs) - 1
    children, make, info = opened
    if depth >= MAX_TREE_DEPTH:
        shown = path if len(path) <= 200 else path[:200] + "…"
        raise MismatchError(f"{shown}: a tree nested deeper than {MAX_TREE_DEPTH} containers (a cycle?)")
    rebuilds: list[tuple[int, int, Rebuild]] = []
    described = []
    for key, child in children:
        start = len(pairs)
        child_rebuild, child_description = _flatten_into(child, path + key, depth + 1, pairs)
        rebuilds.append((start, len(pairs) - start, child_rebuild))
        described.append(child_description)
    base = len(rebuilds) and rebuilds[0][0]

    def rebuild(values: Sequence[Any]) -> Any:
        return make([child(values[start - base : start - base + n]) for start, n, child in rebuilds])

    return rebuild, _describe_node(info, described)


def _describe_node(info: dict, children: list[Any]) -> dict:
    """A node's description with its children's descriptions put in."""
    out = dict(info)
    for name in ("dict", "fields", "children"):
        if name in out:
            out[name] = [[key, child] for key, child in zip(out[name], children)]
    for name in ("list", "tuple"):
        if name in out:
            out[name] = children
    return out


def leaf_of_spec(path: str, spec: Any) -> Leaf:
    """The leaf an array (or ``jax.ShapeDtypeStruct``) is stored as in a data file."""
    if not _looks_like_array(spec):
        spec = np.asarray(spec)
    dtype = np.dtype(spec.dtype)
    shape = tuple(int(d) for d in spec.shape)
    if is_real_dtype(dtype):
        return Leaf(path, shape)
    if dtype.kind == "b":
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


def build_described(description: Any, values: Sequence[Any]) -> Any:
    """The tree a description (:func:`flatten_described`) stands for, its leaves ``values``, built
    of plain Python containers: dicts with their own keys (str and int; other keys as their
    ``repr`` text), lists, tuples, NamedTuples (a ``collections.namedtuple`` of the recorded name
    and fields: no class is ever imported from a description), dataclasses as dicts of their
    fields, and other registered nodes as the keys of their children allow: a box of one
    ``.value`` (a flax ``Variable``, a linen ``Partitioned``) as its value, a mapping (an nnx
    ``State``, a ``FrozenDict``) as a dict, keys 0…n−1 as a list, other keys as a dict."""
    if description is None:
        return None
    if isinstance(description, int):
        return values[description]
    if "dict" in description:
        return {key_of_json(key): build_described(child, values) for key, child in description["dict"]}
    if "list" in description:
        return [build_described(child, values) for child in description["list"]]
    if "tuple" in description:
        return tuple(build_described(child, values) for child in description["tuple"])
    if "namedtuple" in description:
        fields = [name for name, _ in description["fields"]]
        kind = _namedtuple_class(description["namedtuple"], tuple(fields))
        return kind(*[build_described(child, values) for _, child in description["fields"]])
    if "dataclass" in description:
        return {name: build_described(child, values) for name, child in description["fields"]}
    return _build_node(description["children"], values, description.get("mapping") is True)


def _build_node(children: list, values: Sequence[Any], mapping: bool) -> Any:
    built = [build_described(child, values) for _, child in children]
    pieces = [piece for piece, _ in children]
    if pieces == [".value"]:
        return built[0]
    keys = [path_keys(piece) for piece in pieces]
    single = [k[0] if len(k) == 1 else piece for k, piece in zip(keys, pieces)]
    if not mapping and single and all(isinstance(k, int) for k in single) and single == list(range(len(single))):
        return built
    return dict(zip(single, built))


_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], type] = {}


def _namedtuple_class(name: str, fields: tuple[str, ...]) -> type:
    """One class per (name, fields), so that leaves rebuilt alike share it (JAX compares node types)."""
    key = (name, fields)
    if key not in _NAMEDTUPLES:
        safe = name if name.isidentifier() and not name.startswith("_") else "Restored"
        _NAMEDTUPLES[key] = collections.namedtuple(safe, fields, rename=True)
    return _NAMEDTUPLES[key]


def described_paths(description: Any) -> list[str]:
    """The key path of each leaf of a (checked) description, in leaf order, as :func:`flatten`
    writes them."""
    out: list[tuple[int, str]] = []

    def walk(node: Any, path: str) -> None:
        if node is None:
            return
        if isinstance(node, int):
            out.append((node, path))
            return
        if "dict" in node:
            for key, child in node["dict"]:
                walk(child, path + (f"[{key['repr']}]" if isinstance(key, dict) else key_piece(key)))
        elif "list" in node or "tuple" in node:
            for i, child in enumerate(node.get("list", node.get("tuple"))):
                walk(child, f"{path}[{i}]")
        elif "children" in node:
            for piece, child in node["children"]:
                walk(child, path + piece)
        else:
            for name, child in node["fields"]:
                walk(child, f"{path}.{name}")

    walk(description, "")
    return [path for _, path in sorted(out)]


def check_description(description: Any, leaves: int, max_depth: int) -> None:
    """Refuses (ValueError saying why) a description that does not describe ``leaves`` leaves
    numbered 0…leaves−1 once each in order, nests deeper than ``max_depth``, or is malformed."""
    seen: list[int] = []
    _check_node(description, seen, 0, max_depth)
    if seen != list(range(leaves)):
        raise ValueError(f"the tree describes leaves {_abridged_numbers(seen)}, not 0…{leaves - 1} in order")


def _abridged_numbers(numbers: list[int]) -> str:
    return str(numbers) if len(numbers) <= 8 else str(numbers[:8])[:-1] + f", … ({len(numbers)})]"


def _check_node(node: Any, seen: list[int], depth: int, max_depth: int) -> None:
    if node is None:
        return
    if isinstance(node, bool) or not isinstance(node, (int, dict)):
        raise ValueError(f"a tree node {str(node)[:60]} is neither a leaf number, null nor an object")
    if isinstance(node, int):
        seen.append(node)
        return
    if depth >= max_depth:
        raise ValueError(f"a tree nested deeper than {max_depth}")
    kinds = [k for k in ("dict", "list", "tuple", "namedtuple", "dataclass", "node") if k in node]
    if len(kinds) != 1:
        raise ValueError(f"a tree node with keys {sorted(node)[:6]}")
    kind = kinds[0]
    if kind in ("list", "tuple"):
        children = node[kind]
        if not isinstance(children, list):
            raise ValueError(f"a {kind} node whose items are not a list")
        for child in children:
            _check_node(child, seen, depth + 1, max_depth)
        return
    if kind in ("namedtuple", "dataclass") and not isinstance(node[kind], str):
        raise ValueError(f"a {kind} node whose name is not a string")
    if kind == "node" and (not isinstance(node["node"], str) or not isinstance(node.get("mapping", False), bool)):
        raise ValueError("a node whose class is not a string or whose mapping flag is not a bool")
    field = {"dict": "dict", "namedtuple": "fields", "dataclass": "fields", "node": "children"}[kind]
    pairs = node.get(field)
    if not isinstance(pairs, list):
        raise ValueError(f"a {kind} node without its list of {field}")
    keys = []
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"a {kind} node whose {field} are not [key, child] pairs")
        key = pair[0]
        if kind == "dict":
            if isinstance(key, dict):
                if list(key) != ["repr"] or not isinstance(key["repr"], str):
                    raise ValueError("a dict key object other than {\"repr\": text}")
                key = key_of_json(key)
            elif isinstance(key, bool) or not isinstance(key, (str, int)):
                raise ValueError(f"a dict key {str(key)[:60]} that is not a string or an integer")
        elif not isinstance(key, str) or (kind != "node" and not key.isidentifier()):
            raise ValueError(f"a {kind} field {str(key)[:60]} that is not a name")
        keys.append(key)
        _check_node(pair[1], seen, depth + 1, max_depth)
    # (dict keys as a restore gives them back: two that Python holds equal, 1 and True, are one)
    if len({(type(key), repr(key)) for key in keys}) != len(keys) or len(set(keys)) != len(keys):
        raise ValueError(f"a {kind} node that names a key twice")


def describe_dtype(dtype: np.dtype) -> str:
    return "bfloat16" if is_bfloat16(np.dtype(dtype)) else str(np.dtype(dtype))


__all__ = [
    "build_described",
    "check_description",
    "check_leaf_shape",
    "describe_dtype",
    "described_paths",
    "flatten",
    "flatten_described",
    "layout_of_template",
    "leaf_of_spec",
    "template_dtypes",
]
