"""``pack``: text lines of values → a ``.psk.d`` file of any closed sample type.

One sample a line, its values separated by whitespace in leaf order (row-major within a leaf):
indices as non-negative integers, reals as decimals (correctly rounded to f64 once, then held to
the leaf's encoding). Empty lines and lines starting with ``--`` are skipped.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pskd_jax.format.writer import WriteResult, Writer
from pskd_jax.format.encodings import Encoding
from pskd_jax._os.files import read_whole
from pskd_jax.errors import BadValueError, UsageError
from pskd_jax.format.layout import Layout
from pskd_jax.format.sample_type import header_text


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


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 19


def _leaf_column(column: np.ndarray, bound: int | None, path: str, numbers: list[int], first: int) -> np.ndarray:
    """Text of one leaf for every sample → numbers; a bad token names its line and value."""
    flat = column.reshape(len(column), math.prod(column.shape[1:]))  # (-1 fails when there are no rows)
    if bound is None:
        try:
            return column.astype(np.float64)  # str or, for an object table, float() of each
        except ValueError:
            bad = _first_bad(flat, _is_decimal)
            kind = "a real number"
    else:
        if column.dtype == object:
            digits = np.array([_is_index(t) for t in flat.ravel()], dtype=bool)
        else:
            digits = (np.char.strip(flat, "0123456789") == "") & (np.char.str_len(flat) <= 19)
        if digits.all():
            return column.astype(np.uint64)  # the writer checks the bound, naming the line
        bad = _first_bad(flat, _is_index)
        row, col = bad
        if flat[row, col].isascii() and flat[row, col].isdigit():
            raise BadValueError(f"{path}:{numbers[row]}: value {first + col + 1} is {_shown(flat[row, col], quoted=False)}, "
                f"not an index below {bound}",
            )
        kind = "an index (a non-negative integer)"
    row, col = bad
    raise BadValueError(f"{path}:{numbers[row]}: value {first + col + 1} {_shown(flat[row, col])} is not {kind}"
    )


def _shown(token: str, *, quoted: bool = True) -> str:
    """A value as messages quote it: at most 40 characters of it."""
    token = str(token)
    shown = repr(token[:40]) if quoted else token[:40]
    return shown if len(token) <= 40 else f"{shown}… ({len(token)} characters)"


def _is_decimal(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_bad(flat: np.ndarray, ok) -> tuple[int, int]:
    for row in range(flat.shape[0]):
        for col in range(flat.shape[1]):
            if not ok(str(flat[row, col])):
                return row, col
    raise AssertionError("no bad value found")  # the caller saw one
