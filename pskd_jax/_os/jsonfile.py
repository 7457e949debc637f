"""Strict JSON for the toolkit's own files, and JSON values quoted in messages.

What is refused (NaN, a repeated key, nesting or integers beyond the parser) and with which error:
``docs/files.md`` ("Inputs").
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.checks import counted
from pskd_jax._os.files import read_whole
from pskd_jax.errors import PskdError

MAX_FILE_BYTES = 1 << 30  # a JSON file of the toolkit's larger than this is not one of its own


def json_kind(value: Any) -> str:
    """A JSON value in an error message: short, whatever its size or depth.

    >>> json_kind([1, 2]), json_kind(1.5), json_kind(None)
    ('a list of 2 entries', 'the real number 1.5', 'null')
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        n = len(value)
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {counted(n, 'entry', 'entries')}"
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"{value[:77]!r}…"
    if isinstance(value, float):
        return f"the real number {value!r}"
    return repr(value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps`` keeping non-ASCII characters as they are, except lone surrogates (a file name
    that is not UTF-8, as Python decodes it), written as ``\\uXXXX`` escapes: the text then always
    encodes as UTF-8, and decodes back to the same value. NaN and ±Inf are refused (ValueError).

    >>> json_text({"path": "caf" + chr(0xDCE9) + ".txt", "é": 1})
    '{"path": "caf\\\\udce9.txt", "é": 1}'
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, **options)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {json_kind(key)} appears twice in one object")
            seen.add(key)
    return data


def loads_strict(raw: bytes, what: str, error: type[PskdError], *, kind: str = "JSON") -> Any:
    """The JSON value of ``raw``, or ``error`` ("``what``: not ``kind`` (why)") for anything but
    strict JSON."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_constant, object_pairs_hook=_object)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise error(f"{what}: not {kind} ({reason[:200]})") from None


def read_strict(path: str | os.PathLike, error: type[PskdError], *, what: str = "", kind: str = "JSON") -> Any:
    """The JSON value of the file ``path`` (a regular file, strict JSON), or ``error`` naming it
    (and ``what`` it is)."""
    name = os.fspath(path)
    return loads_strict(read_whole(name, error, what=what, limit=MAX_FILE_BYTES), name, error, kind=kind)


def write_json(path: str | os.PathLike, value: Any, *, durable: bool = True, indent: int | None = 1) -> None:
    """Writes ``value`` as UTF-8 JSON (one final line feed), atomically."""
    data = (json_text(value, indent=indent) + "\n").encode("utf-8")
    with atomic_output(os.fspath(path), durable=durable) as f:
        f.write(data)


__all__ = ["MAX_FILE_BYTES", "json_kind", "json_text", "loads_strict", "read_strict", "write_json"]
