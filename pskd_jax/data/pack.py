"""``pack``: text lines of values → a ``.psk.d`` file of any closed sample type.

One sample a line, its values separated by whitespace in leaf order (row-major within a leaf):
indices as non-negative decimal integers (ASCII digits, leading zeros allowed, up to 2^64 - 1 and
below the leaf's bound: the rule of a tokens text), reals as decimals (ASCII digits with an
optional sign, point and exponent, correctly rounded to f64 once, then held to the leaf's
encoding). Empty lines and lines starting with ``--`` are skipped.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from pskd_jax.format.writer import WriteResult, Writer
from pskd_jax.format.encodings import Encoding
from pskd_jax._os.files import read_whole
from pskd_jax.errors import BadValueError, UsageError
from pskd_jax.format.layout import Layout
from pskd_jax.format.sample_type import header_text

__all__ = ["pack_file", "parse_encodings", "read_value_lines"]


def read_value_lines(path: str) -> tuple[list[list[str]], list[int]]:
    """The value tokens of each sample line and its 1-based line number."""
    raw = read_whole(path, BadValueError)  # a regular file only: a FIFO is refused (E9002), never waited on
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    del raw
    if "\0" in text:  # never part of a value, and numpy's text arrays would drop it silently
        number = text.count("\n", 0, text.index("\0")) + 1
        raise BadValueError(f"{path}:{number}: a NUL character; values are decimal text")
    rows, numbers = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            rows.append(stripped.split())
            numbers.append(number)
    return rows, numbers


def parse_encodings(spec: str | None, layout: Layout) -> list[Encoding]:
    """``--encoding``: one name for every real leaf, or a comma list with one entry per leaf
    (``-`` or ``f64`` for an idx leaf)."""
    leaves = layout.leaves
    if spec is None:
        return [Encoding.F64] * len(leaves)
    names = [n.strip() for n in spec.split(",")]
    if len(names) == 1:
        encoding = Encoding.parse(names[0])
        return [encoding if leaf.is_real else Encoding.F64 for leaf in leaves]
    if len(names) != len(leaves):
        raise UsageError(f"--encoding lists {len(names)} encodings for a type of {len(leaves)} leaves"
        )
    encodings = []
    for leaf, name in zip(leaves, names):
        if not leaf.is_real and name not in ("-", "f64"):
            raise UsageError(f"--encoding: leaf {leaf.path or '(root)'} is an index; write '-' for it")
        encodings.append(Encoding.F64 if name == "-" else Encoding.parse(name))
    return encodings


def pack_file(
    input_path: str,
    sample_type: str,
    output_path: str,
    *,
    encodings: Sequence[Encoding] | None = None,
    round_to_encoding: bool = False,
) -> WriteResult:
    """Packs the value lines of ``input_path`` into ``output_path`` (replaced whole, or untouched
    on an error)."""
    layout = Layout.of_type(sample_type)
    rows, numbers = read_value_lines(input_path)
    width = layout.sample_elements
    for row, number in zip(rows, numbers):
        if len(row) != width:
            side = "few" if len(row) < width else "many"
            raise BadValueError(f"{input_path}:{number}: too {side} values: {len(row)} for a sample of {width} "
                f"elements of type {header_text(sample_type)}",
            )
    table = _value_table(rows, width)
    columns, start = [], 0
    for leaf in layout.leaves:
        column = table[:, start : start + leaf.size].reshape(len(rows), *leaf.shape)
        columns.append(_leaf_column(column, leaf.bound, input_path, numbers, start))
        start += leaf.size
    batch = layout.unflatten(columns)
    if encodings is None:
        encodings = [Encoding.F64] * len(layout.leaves)
    with Writer(output_path, sample_type, encodings=encodings, round_to_encoding=round_to_encoding) as writer:
        writer.append(batch, row_names=[f"{input_path}:{n}" for n in numbers])
    return writer.result


def _value_table(rows: list[list[str]], width: int) -> np.ndarray:
    """The value tokens as an array of shape (rows, width): fixed-width text (fast to convert)
    unless one long token would make that table far larger than the text itself (a hostile line
    of a megabyte among a million short values), then Python strings."""
    longest = max((len(token) for row in rows for token in row), default=0)
    characters = sum(len(token) for row in rows for token in row)
    if len(rows) * width * longest > 8 * characters + (1 << 20):
        table = np.empty((len(rows), width), dtype=object)
        for i, row in enumerate(rows):
            table[i] = row
        return table
    return np.array(rows, dtype=str).reshape(len(rows), width)


#: An index is ASCII decimal digits, leading zeros allowed (as a tokens text's tokens are).
_DIGITS = "0123456789"

#: A real is a decimal: ASCII digits with an optional sign, point and exponent. Not Python's
#: wider float syntax: no ``1_0``, no fullwidth or other Unicode digits, no ``inf`` or ``nan``.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_DECIMAL_CHARACTERS = "0123456789+-.eE"

#: Digits that always fit in a uint64 (numpy converts them at once); longer ones are exact ints.
_SHORT_DIGITS = 19


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _is_decimal(text: str) -> bool:
    return _DECIMAL.fullmatch(text) is not None


def _all_match(flat: np.ndarray, characters: str, ok) -> bool:
    """Whether every token is made of ``characters`` (ASCII) and, for an object table of long
    tokens, passes ``ok``.

    A text table is checked on its code points: a fixed-width ``<U`` array is UTF-32 with NUL
    padding (and no token holds a NUL: :func:`read_value_lines` refuses it), so one table lookup
    per code point answers for every token at once.
    """
    if flat.dtype == object:
        return all(ok(token) for token in flat.ravel())
    allowed = np.zeros(128, dtype=bool)
    allowed[[0, *map(ord, characters)]] = True
    points = np.ascontiguousarray(flat).view(np.uint32)
    return bool(allowed.take(points, mode="clip").all() and (points < 128).all())


def _leaf_column(column: np.ndarray, bound: int | None, path: str, numbers: list[int], first: int) -> np.ndarray:
    """Text of one leaf for every sample → numbers; a bad token names its line and value."""
    flat = column.reshape(len(column), math.prod(column.shape[1:]))  # (-1 fails when there are no rows)
    if bound is None:
        if _all_match(flat, _DECIMAL_CHARACTERS, _is_decimal):
            try:
                return column.astype(np.float64)  # str or, for an object table, float() of each
            except ValueError:
                pass  # made of the right characters, yet not a decimal ("1e", "+-1", "."): named below
        bad = _first_bad(flat, _is_decimal)
        kind = "a real number (a decimal: digits with an optional sign, point and exponent)"
    else:
        if _all_match(flat, _DIGITS, _is_index):
            return _indices(column, flat, bound, path, numbers, first)  # the writer checks the bound
        bad = _first_bad(flat, _is_index)
        kind = "an index (a non-negative integer)"
    row, col = bad
    raise BadValueError(f"{path}:{numbers[row]}: value {first + col + 1} {_shown(flat[row, col])} is not {kind}"
    )


def _indices(column: np.ndarray, flat: np.ndarray, bound: int, path: str, numbers: list[int], first: int) -> np.ndarray:
    """Digit tokens → uint64: at once when every token has at most 19 digits, else the long ones
    one by one, exactly (leading zeros allowed, values up to 2^64 - 1)."""
    lengths = np.char.str_len(flat.astype(str)) if flat.dtype == object else np.char.str_len(flat)
    if lengths.size == 0 or lengths.max() <= _SHORT_DIGITS:
        return column.astype(np.uint64)
    values = np.zeros(flat.shape, dtype=np.uint64)
    short = lengths <= _SHORT_DIGITS
    values[short] = flat[short].astype(np.uint64)
    for row, col in zip(*np.nonzero(~short)):
        token = str(flat[row, col])
        digits = token.lstrip("0")
        value = int(digits or "0") if len(digits) <= 20 else None  # more digits: at least 10^20, beyond u64
        if value is None or value >= min(bound, 1 << 64):
            raise BadValueError(f"{path}:{numbers[row]}: value {first + col + 1} is {_shown(token, quoted=False)}, "
                                f"not an index below {bound}")
        values[row, col] = value
    return values.reshape(column.shape)


def _shown(token: str, *, quoted: bool = True) -> str:
    """A value as messages quote it: at most 40 characters of it."""
    token = str(token)
    shown = repr(token[:40]) if quoted else token[:40]
    return shown if len(token) <= 40 else f"{shown}… ({len(token)} characters)"


def _first_bad(flat: np.ndarray, ok) -> tuple[int, int]:
    for row in range(flat.shape[0]):
        for col in range(flat.shape[1]):
            if not ok(str(flat[row, col])):
                return row, col
    raise AssertionError("no bad value found")  # the caller saw one


__all__ = ["pack_file", "parse_encodings", "read_value_lines"]
