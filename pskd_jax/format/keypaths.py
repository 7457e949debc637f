"""Key paths: the text ``jax.tree_util.keystr`` writes, the keys it stands for, and trees rebuilt from keys.

The one encoding of dict keys that save, restore, info, export and convert share:

- :func:`key_piece`: a dict key's piece of a key path, ``[{key!r}]`` (``['w']``, ``[3]``, ``[True]``);
- :func:`key_json` / :func:`key_of_json`: a dict key as a layout file's tree records it (a string or
  an int as itself, any other key as ``{"repr": text}``) and the key that record gives back (the
  Python literal the text is — ``True``, ``None``, ``1.5``, ``(1, 'a')`` — or else the text);
- :func:`check_dict_keys`: the keys of one dict that would come back as one key (a key whose text
  is not a literal and equals another key) are refused at save (E9005 naming both);
- :func:`json_object_key` and :func:`check_json_keys`: the JSON object key ``export`` writes for a
  dict key, and the refusal (E9005 naming both) of two keys of one dict that share it;
- :func:`shown_key`: a key for a message, a text that is not valid UTF-8 (a surrogate-escaped
  file name) escaped.
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


# A key text longer than this is never parsed as a literal (no parse of an unbounded text).
_MAX_LITERAL_TEXT = 1000
_LITERAL_TYPES = (bool, type(None), float, complex, bytes, tuple, int, str)


def key_piece(key: Any) -> str:
    """A dict key's piece of a key path, as ``jax.tree_util.keystr`` writes it.

    A str or an int key of a subclass (``numpy.str_``, an ``IntEnum``) is written by its plain
    value's repr: :func:`key_json` records it as that plain value, so the path must read as it does.

    >>> key_piece("w"), key_piece(3), key_piece(True), key_piece(None)
    ("['w']", '[3]', '[True]', '[None]')
    """
    if isinstance(key, str):
        return f"[{str.__repr__(key)}]"
    if isinstance(key, int) and not isinstance(key, bool):
        return f"[{int.__repr__(key)}]"
    return f"[{key!r}]"


def key_json(key: Any) -> Any:
    """A dict key as a layout file's tree records it: a str or an int as itself, any other key
    as ``{"repr": text}``.

    >>> key_json("a"), key_json(2), key_json(True), key_json(1.5)
    ('a', 2, {'repr': 'True'}, {'repr': '1.5'})
    """
    if isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
        return key
    return {"repr": repr(key)}


def _literal(text: str) -> Any:
    """The Python literal ``text`` is exactly (its repr is ``text``), or None when it is none."""
    if len(text) > _MAX_LITERAL_TEXT:
        return None
    if text in ("inf", "-inf", "nan"):  # (floats whose repr is no literal)
        return float(text)
    try:
        value = ast.literal_eval(text)
        # (a str or an int key is recorded as itself: a repr that reads as one is an object's)
        if (isinstance(value, (str, int)) and not isinstance(value, bool)) or not _is_literal(value) \
                or repr(value) != text:
            return None
        hash(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value


def _is_literal(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_literal(v) for v in value)
    return type(value) in _LITERAL_TYPES


def key_of_json(key: Any) -> Any:
    """The dict key a layout file's record gives back: a str or an int as itself; ``{"repr":
    text}`` as the Python literal ``text`` is (``True``, ``None``, ``1.5``, a tuple of those), or
    as ``text`` itself when it is none (an object's repr).

    >>> key_of_json("True"), key_of_json({"repr": "True"}), key_of_json({"repr": "<object>"})
    ('True', True, '<object>')
    """
    if not isinstance(key, dict):
        return key
    text = key["repr"]
    value = _literal(text)
    return text if value is None and text != "None" else value


def _restored(key: Any) -> Any:
    return key_of_json(key_json(key))


def check_dict_keys(keys: Sequence[Any], where: str) -> None:
    """Refuses (E9005 naming both) two keys of one dict that a restore would give back as one: a
    key whose text is no literal (an object's repr) and a string key of that text, or
    two such keys of one text. ``where``: the dict's key path."""
    seen: dict[Any, Any] = {}
    for key in keys:
        if isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
            back = key
        else:
            back = _restored(key)
        marker = (type(back), back) if not isinstance(back, float) or back == back else (float, repr(back))
        if marker in seen and seen[marker] is not key:
            raise MismatchError(f"at {shown_path(where) or '(root)'}: the keys {shown_key(seen[marker])} and "
                                f"{shown_key(key)} are written alike and would come back as one key "
                                f"({shown_key(back)}); give one of them another key")
        seen.setdefault(marker, key)


def json_object_key(key: Any) -> str:
    """The JSON object key ``export`` writes for a dict key: a string as itself, any other key
    as its text (``str``)."""
    return key if isinstance(key, str) else str(key)


def check_json_keys(keys: Sequence[Any], where: str) -> list[str]:
    """The JSON object keys of one dict's keys; E9005 naming both when two share one (``{1: …,
    '1': …}``: a JSON object would keep one of them)."""
    out: dict[str, Any] = {}
    for key in keys:
        text = json_object_key(key)
        if text in out:
            raise MismatchError(f"{where}: the keys {shown_key(out[text])} and {shown_key(key)} are both "
                                f"written {shown_key(text)} in JSON, which would keep one of them; "
                                "export refuses the tree rather than drop a leaf")
        out[text] = key
    return list(out)


def shown_key(key: Any) -> str:
    """A key for a message: its repr (a text that is not valid UTF-8, such as a surrogate-escaped
    file name, escaped), at most 80 characters.

    >>> shown_key(b"x\\xff".decode("utf-8", "surrogateescape")), shown_key(True)
    ("'x\\\\udcff'", 'True')
    """
    text = repr(key)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 80 else text[:77] + "…"


def shown_path(path: str) -> str:
    """A key path for a message: text that is not valid UTF-8 escaped, at most 200 characters."""
    text = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 200 else text[:197] + "…"


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


__all__ = [
    "MAX_KEY_DEPTH",
    "check_dict_keys",
    "check_json_keys",
    "check_key_depth",
    "json_object_key",
    "key_json",
    "key_of_json",
    "key_piece",
    "nest",
    "nested_rebuild",
    "path_keys",
    "shown_key",
    "shown_path",
]
