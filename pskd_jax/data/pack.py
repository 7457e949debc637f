"""``pack``: text lines of values → a ``.psk.d`` file of any closed sample type.

The lines, the values they may hold, the order errors are found in and the blocks the input is read
in (:data:`BLOCK_BYTES`, or one line when a line is longer) are defined in
``docs/reference-rules.md`` ("Packing text"). Each block is parsed leaf by leaf with numpy and
appended to the output before the next is read; the output is written whole or not at all.
"""

from __future__ import annotations

import array
import math
import re
from collections.abc import Iterator, Sequence

import numpy as np

from pskd_jax._os.files import open_regular, read_some
from pskd_jax.errors import BadValueError, UsageError
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.layout import Layout
from pskd_jax.format.sample_type import header_text
from pskd_jax.format.writer import Writer, WriteResult

__all__ = ["BLOCK_BYTES", "pack_file", "parse_encodings"]

BLOCK_BYTES = 1 << 16  # input text parsed and written at a time (whole lines)


def _line_blocks(path: str) -> Iterator[tuple[bytes, int]]:
    """The file's bytes in blocks of whole lines (each ending at a line feed, but the last), and
    the offset of each block's first byte. A regular file only: a FIFO is refused (E9002), never
    waited on; a file cut short while read is E9003. A line longer than a block is gathered in
    pieces and joined once (never copied again per piece)."""
    with open_regular(path, BadValueError, buffering=0) as f:
        pieces: list[bytes] = []
        offset = 0
        while True:
            data = read_some(f, path, BLOCK_BYTES, BadValueError)
            end = data.rfind(b"\n") + 1 if data else 0
            if data and end == 0:
                pieces.append(data)  # inside one long line: read on
                continue
            block = b"".join([*pieces, data[:end]]) if data else b"".join(pieces)
            pieces = [data[end:]] if data and end < len(data) else []
            if block:
                yield block, offset
                offset += len(block)
            if not data:
                return


def _value_blocks(path: str, width: int, sample_type: str) -> Iterator[tuple[list[str], np.ndarray]]:
    """The value tokens of the sample lines, a block of lines at a time: all of a block's tokens
    in one flat list (``width`` a line, checked here: E9004 naming the line otherwise) and each
    sample line's 1-based number (lines counted as ``str.splitlines`` counts them)."""
    line = 1
    for raw, offset in _line_blocks(path):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadValueError(f"{path}: not UTF-8 text (byte {offset + e.start})") from None
        del raw
        if "\0" in text:  # never part of a value, and numpy's text arrays would drop it silently
            number = line + len((text[: text.index("\0")] + "x").splitlines()) - 1
            raise BadValueError(f"{path}:{number}: a NUL character; values are decimal text")
        lines = text.splitlines()
        del text
        tokens: list[str] = []
        numbers = array.array("q")
        for number, content in enumerate(lines, start=line):
            stripped = content.strip()
            if stripped and not stripped.startswith("--"):
                parts = stripped.split()
                if len(parts) != width:
                    side = "few" if len(parts) < width else "many"
                    raise BadValueError(f"{path}:{number}: too {side} values: {len(parts)} for a sample of {width} "
                                        f"elements of type {header_text(sample_type)}")
                tokens += parts
                numbers.append(number)
        line += len(lines)
        del lines
        if numbers:
            yield tokens, np.frombuffer(numbers, dtype=np.int64)
        del tokens, numbers  # (not held while the next block is parsed)


class _LineNames:
    """``FILE:LINE`` of each sample of a block, made only for the one an error names."""

    def __init__(self, path: str, numbers: np.ndarray):
        self.path, self.numbers = path, numbers

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, row: int) -> str:
        return f"{self.path}:{int(self.numbers[row])}"


def parse_encodings(spec: str | None, layout: Layout) -> list[Encoding]:
    """``--encoding``: one name for every real leaf, or a comma list with one entry per leaf
    (``-`` or ``f64`` for an idx leaf)."""
    leaves = layout.leaves
    if spec is None:
        return [Encoding.F64] * len(leaves)
    names = [n.strip() for n in spec.split(",")]
    if len(names) == 1 and not (len(leaves) == 1 and names[0] == "-"):  # (a type of one leaf: its own '-')
        encoding = Encoding.parse(names[0])
        if encoding is not Encoding.F64 and not any(leaf.is_real for leaf in leaves):
            raise UsageError(f"--encoding {names[0]}: the type has no real leaf to encode (its leaves are indices)")
        return [encoding if leaf.is_real else Encoding.F64 for leaf in leaves]
    if len(names) != len(leaves):
        raise UsageError(f"--encoding lists {len(names)} encodings for a type of {len(leaves)} leaves")
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
    on an error), a block of lines at a time."""
    layout = Layout.of_type(sample_type)
    if encodings is None:
        encodings = [Encoding.F64] * len(layout.leaves)
    width = layout.sample_elements
    blocks = _value_blocks(input_path, width, sample_type)
    first = next(blocks, None)  # the input opened and its first block read before the output is made
    with Writer(output_path, sample_type, encodings=encodings, round_to_encoding=round_to_encoding) as writer:
        for tokens, numbers in _chained(first, blocks):
            batch = _batch(layout, tokens, numbers, input_path)
            del tokens  # (the batch holds what it needs)
            writer.append(batch, row_names=_LineNames(input_path, numbers))
            del batch, numbers
        first = None
    return writer.result


def _chained(first, rest: Iterator) -> Iterator:
    if first is not None:
        yield first
        del first
        yield from rest


def _batch(layout: Layout, tokens: list[str], numbers: np.ndarray, path: str):
    """One block's value tokens (whole sample lines) → the batch of its samples, each leaf's text
    converted on its own."""
    rows, width = len(numbers), layout.sample_elements
    table = _value_table(tokens, rows, width)
    columns, start = [], 0
    for leaf in layout.leaves:
        column = table[:, start : start + leaf.size].reshape(rows, *leaf.shape)
        columns.append(_leaf_column(column, leaf.bound, path, numbers, start))
        start += leaf.size
    return layout.unflatten(columns)


def _value_table(tokens: list[str], rows: int, width: int) -> np.ndarray:
    """The value tokens as an array of shape (rows, width): fixed-width text (fast to convert)
    unless one long token would make that table far larger than the text itself (a hostile line
    of a megabyte among a million short values), then Python strings."""
    longest = max(map(len, tokens), default=0)
    characters = sum(map(len, tokens))
    if rows * width * longest > 8 * characters + (1 << 20):
        table = np.empty(len(tokens), dtype=object)
        table[:] = tokens
        return table.reshape(rows, width)
    return np.array(tokens, dtype=str).reshape(rows, width)


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
    padding (and no token holds a NUL: :func:`_value_blocks` refuses it), so one table lookup
    per code point answers for every token at once.
    """
    if flat.dtype == object:
        return all(ok(token) for token in flat.ravel())
    allowed = np.zeros(128, dtype=bool)
    allowed[[0, *map(ord, characters)]] = True
    points = np.ascontiguousarray(flat).view(np.uint32)
    return bool(allowed.take(points, mode="clip").all() and (points < 128).all())


def _leaf_column(column: np.ndarray, bound: int | None, path: str, numbers: np.ndarray, first: int) -> np.ndarray:
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
    raise BadValueError(f"{path}:{numbers[row]}: value {first + col + 1} {_shown(flat[row, col])} is not {kind}")


def _indices(column: np.ndarray, flat: np.ndarray, bound: int, path: str, numbers: np.ndarray,
             first: int) -> np.ndarray:
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


