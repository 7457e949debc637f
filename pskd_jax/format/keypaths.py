"""Key paths: the text ``jax.tree_util.keystr`` writes, the keys it stands for, and trees rebuilt from keys.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from pskd_jax.errors import MismatchError
from pskd_jax.format.sample_type import MAX_NESTING

# A key path (of a tree to save, a layout file, a safetensors name) holds at most this many keys:
# the nesting a sample type may have, so that no tree is rebuilt by recursing without bound.
MAX_KEY_DEPTH = MAX_NESTING

_KEY = re.compile(r"""\[(?P<q>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]|\[(?P<i>-?\d+)\]|\.(?P<a>[^\W\d]\w*)""")


def path_keys(path: str) -> list[str | int]:
    """A key path → its keys: ``"['blocks'][0]['w']"`` → ``['blocks', 0, 'w']``.

    Dict keys that are not strings or ints, and anything unparsable, become one string key.
    """
    keys: list[str | int] = []
    position = 0
    while position < len(path):
        match = _KEY.match(path, position)
        if match is None:
            keys.append(path[position:])
            break
        if match.group("q") is not None:
            quoted = match.group("q")
            # (without a backslash the text between the quotes is the key: no parse needed)
            keys.append(quoted[1:-1] if "\\" not in quoted else ast.literal_eval(quoted))
        elif match.group("i") is not None:
            keys.append(int(match.group("i")))
        else:
            keys.append(match.group("a"))
        position = match.end()
    return keys


def check_key_depth(keys: Sequence[Any], what: str) -> None:
    """Refuses a key path deeper than :data:`MAX_KEY_DEPTH` (E9005 naming ``what``)."""
    if len(keys) > MAX_KEY_DEPTH:
        raise MismatchError(f"{what[:200]}: a key path {len(keys)} keys deep; a checkpoint's tree "
                                  f"nests at most {MAX_KEY_DEPTH} deep")


def nest(keys: Sequence[Sequence[str | int]], values: Sequence[Any]) -> Any:
    """Nested dicts and lists from key sequences, dict keys in first-appearance order, list
    items by index: ``nest([["a", 0], ["a", 1], ["b"]], [x, y, z])`` → ``{"a": [x, y], "b": z}``."""
    if len(keys) == 1 and len(keys[0]) == 0:
        return values[0]
    root: dict = {}
    for key_path, value in zip(keys, values):
        check_key_depth(key_path, f"the key path {_abridged(key_path)}")
        node = root
        for depth, key in enumerate(key_path):
            last = depth == len(key_path) - 1
            if last:
                if key in node:
                    raise MismatchError(f"the key path {list(key_path)} names a leaf twice")
                node[key] = value
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise MismatchError(f"the key path {list(key_path)} goes through a leaf")
    return _listify(root)


def _abridged(keys: Sequence[Any]) -> str:
    """A key path for a message: its first keys when it is long."""
    keys = list(keys)
    return str(keys) if len(keys) <= 8 else str(keys[:8])[:-1] + f", … ({len(keys)} keys)]"


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _listify(v) for k, v in node.items()}
    if items and all(isinstance(k, int) and not isinstance(k, bool) for k in items) \
            and sorted(items) == list(range(len(items))):
        return [items[k] for k in range(len(items))]
    return items


def nested_rebuild(keys: Sequence[Sequence[str | int]]):
    keys = [tuple(k) for k in keys]
    return lambda values: nest(keys, values)


__all__ = ["MAX_KEY_DEPTH", "check_key_depth", "nest", "nested_rebuild", "path_keys"]
