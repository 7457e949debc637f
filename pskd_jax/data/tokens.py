"""Tokens text: non-negative decimal integers separated by ASCII whitespace, parsed a block at a time
(the format: ``docs/reference-rules.md``, "Text, vocabularies and tokens").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import BinaryIO, Union

import numpy as np

from pskd_jax._os.files import line_at, open_regular, read_some
from pskd_jax.errors import BadValueError, PskdError, UsageError
from pskd_jax.format.encodings import index_dtype

PathLike = Union[str, "os.PathLike[str]"]

#: Bytes read at a time: a block's arrays (up to 8 bytes a byte) then stay inside the L2 cache.
CHUNK_SIZE = 1 << 17

#: Tokens read_tokens makes room for before reading any (it doubles as they come).
INITIAL_TOKENS = 1 << 16


#: The bytes that separate tokens in a tokens text.
WHITESPACE = b" \t\n\r\x0b\x0c"

# A token of this many digits or more may not fit in 64 bits: such blocks take the exact slow path.
_LONG_DIGITS = 20


def _last_whitespace(data: bytes) -> int:
    """The index of the last whitespace byte of ``data``, or −1."""
    return max(data.rfind(c) for c in (b" ", b"\n", b"\t", b"\r", b"\x0b", b"\x0c"))


#: A word (bytes between whitespace) longer than this is read on its own by :func:`_long_word`, a
#: block at a time, never kept whole: no token of 64 bits takes this much text but zero padding.
LONG_WORD = 1 << 16

_SPACE = re.compile(rb"[ \t\n\r\x0b\x0c]")


def cut_blocks(f: BinaryIO, path: PathLike, chunk_size: int, cut: Callable[[bytes], int], *,
               long_carry: Callable[[BinaryIO, PathLike, int, bytes, int], tuple[int, bytes]] | None = None
               ) -> Iterator[tuple[int, bytes]]:
    """Yields ``(byte offset, block)``: the file read ``chunk_size`` bytes at a time and cut where
    ``cut(data)`` says (what follows the cut is carried on to the next block), so that no unit a
    block holds (a token, a character) straddles two blocks. A carry longer than
    :data:`LONG_WORD` is handed to ``long_carry``, which reads it on and returns the new
    ``(offset, carry)``."""
    offset, carry = 0, b""
    while True:
        data = read_some(f, path, chunk_size)
        if not data:
            if carry:
                yield offset, carry
            return
        data = carry + data if carry else data
        at = cut(data)
        if at:
            yield offset, data[:at]
        offset, carry = offset + at, data[at:]
        if long_carry is not None and len(carry) > LONG_WORD:
            offset, carry = long_carry(f, path, offset, carry, chunk_size)


def _whitespace_blocks(f: BinaryIO, path: PathLike, chunk_size: int) -> Iterator[tuple[int, bytes]]:
    """The file in blocks cut just after whitespace, so that no token straddles two blocks. A word
    longer than :data:`LONG_WORD` is read on by :func:`_long_word` (linear time and bounded memory
    however long it is)."""
    return cut_blocks(f, path, chunk_size, lambda data: _last_whitespace(data) + 1, long_carry=_long_word)


def _long_word(f: BinaryIO, path: PathLike, offset: int, word: bytes, chunk_size: int) -> tuple[int, bytes]:
    """Reads the rest of a long word that starts at byte ``offset`` (``word`` holds its start, no
    whitespace), a block at a time. A word of digits that is a token of at most 40 significant
    digits (zero padding of any length) comes back short: ``(offset of its significant digits,
    those digits + the bytes read after the word)``; anything else is the E9004 of its token."""
    zeros = digits = 0
    significant = b""
    piece, rest = word, None
    while rest is None:
        space = _SPACE.search(piece)
        part, rest = (piece[: space.start()], piece[space.start():]) if space else (piece, None)
        if part and not part.isdigit():  # (bytes.isdigit: ASCII digits only)
            shown = (word[:40].decode("utf-8", errors="backslashreplace") + "…")
            raise BadValueError(f"{os.fspath(path)}:{line_at(path, offset)}: {shown!r} is not a token index; "
                                "expected non-negative decimal integers separated by whitespace")
        if not significant:
            stripped = part.lstrip(b"0")
            zeros += len(part) - len(stripped)
            part = stripped
        significant += part[: max(0, 64 - len(significant))]
        digits += len(part)
        if rest is None:
            piece = read_some(f, path, chunk_size)
            if not piece:
                rest = b""
    if digits > 40:
        raise _too_large(path, offset + zeros, f"{significant[:20].decode()}… ({digits} digits)", None)
    if not significant:  # all zeros: the token 0
        return offset + zeros - 1, b"0" + rest
    return offset + zeros, significant + rest


def _shifted_product(values: np.ndarray, mask: np.ndarray, shift: int, out: np.ndarray) -> np.ndarray:
    """``out[i] = values[i - shift] * mask[i]``, 0 where ``i < shift``."""
    shift = min(shift, len(values))
    out[:shift] = 0
    np.multiply(values[: len(values) - shift], mask[shift:], out=out[shift:])
    return out


def _extend_runs(run: np.ndarray, is_digit: np.ndarray, k: int) -> None:
    """Turns ``run_{k-1}`` into ``run_k`` in place: ``run_k[i]`` iff bytes ``i-k .. i`` are digits."""
    k = min(k, len(run))
    run[k:] &= is_digit[: len(run) - k]
    run[:k] = False


def _digit_planes(digits: np.ndarray, is_digit: np.ndarray) -> list[np.ndarray] | None:
    """Base-100 digits, one ``uint8`` array per digit pair (least significant first), read at each
    token's last byte; ``None`` when a token has 20 digits or more (it may not fit in 64 bits).

    Horner over digit positions, done on whole blocks: ``run_k`` marks the bytes whose previous
    ``k`` bytes are digits too, so at a token's last byte ``i`` its digit of weight 10^k is
    ``digits[i - k]`` while ``run_k[i]`` holds. Pairs of digits keep the arithmetic in bytes.
    """
    n = len(digits)
    masked = digits * is_digit
    run = is_digit.copy()  # run_0
    scratch = np.empty(n, np.uint8)
    planes, k = [], 0
    while True:
        plane = _shifted_product(masked, run, k, np.empty(n, np.uint8))  # weight 10^k
        _extend_runs(run, is_digit, k + 1)
        if run.any():
            if k + 1 >= _LONG_DIGITS - 1:  # a token of 20 digits or more
                return None
            plane += _shifted_product(masked, run, k + 1, scratch) * np.uint8(10)  # weight 10^(k+1)
            _extend_runs(run, is_digit, k + 2)
        planes.append(plane)
        if not run.any():
            return planes
        k += 2


def _combine_planes(planes: list[np.ndarray]) -> np.ndarray:
    """Values from base-100 digit planes (Horner, most significant plane first), in the narrowest
    dtype that holds them: 2 digits fit a byte, 4 a ``uint16``, 8 a ``uint32``, 19 a ``uint64``."""
    dtype = (np.uint8, np.uint16, np.uint32, np.uint32, *(np.uint64,) * 6)[len(planes) - 1]
    value: np.ndarray = planes[-1].astype(dtype, copy=False)  # one plane: the plane itself, no copy
    for plane in reversed(planes[:-1]):
        value *= dtype(100)
        value += plane
    return value


def _bad_token(path: PathLike, offset: int, block: bytes, position: int) -> PskdError:
    """The E9004 error for the whitespace-delimited word around byte ``position`` of a block."""
    start = _last_whitespace(block[:position]) + 1
    ends = [i for i in (block.find(c, position) for c in WHITESPACE) if i >= 0]
    word = block[start : min(ends, default=len(block))].decode("utf-8", errors="backslashreplace")
    shown = repr(word if len(word) <= 40 else word[:40] + "…")
    return BadValueError(f"{os.fspath(path)}:{line_at(path, offset + start)}: {shown} is not a token index; "
                         "expected non-negative decimal integers separated by whitespace")


def _too_large(path: PathLike, offset: int, value: int | str, bound: int | None) -> PskdError:
    """The E9004 error for a token at or above ``bound`` (or 2**64) at byte ``offset``."""
    where = f"{os.fspath(path)}:{line_at(path, offset)}"
    if bound is None or bound > 1 << 64:
        return BadValueError(f"{where}: token {value} does not fit in 64 bits (at most {(1 << 64) - 1})")
    return BadValueError(f"{where}: token {value} is not below the vocabulary size {bound}")


def _parse_long(path: PathLike, offset: int, block: bytes, bound: int | None) -> np.ndarray:
    """The exact path for a block holding a token of 20 digits or more: Python integers.

    Only such rare blocks come here (a value near 2**64, or zero-padded tokens).
    """
    limit = min(bound, 1 << 64) if bound is not None else 1 << 64
    values = []
    for match in re.finditer(rb"[0-9]+", block):
        digits = match.group().lstrip(b"0")
        if len(digits) > 40:  # far beyond 64 bits (and int() refuses over 4300 digits): shown cut
            raise _too_large(path, offset + match.start(), f"{digits[:20].decode()}… ({len(digits)} digits)", bound)
        value = int(digits) if digits else 0  # (never the padded text: int() refuses over 4300 digits)
        if value >= limit:
            raise _too_large(path, offset + match.start(), value, bound)
        values.append(value)
    return np.array(values, dtype=np.uint64)


def _parse_block(path: PathLike, offset: int, block: bytes, bound: int | None) -> np.ndarray:
    """The tokens of one block (cut at whitespace) as unsigned integers of the smallest width."""
    a = np.frombuffer(block, np.uint8)
    digits = a - np.uint8(48)
    is_digit = digits < 10
    valid = is_digit | (a == 32)
    valid |= (a - np.uint8(9)) < 5  # tab, line feed, vertical tab, form feed, carriage return
    if not valid.all():
        bad = int(np.argmin(valid))
        start = _last_whitespace(block[:bad]) + 1
        _parse_block(path, offset, block[:start], bound)  # an earlier token may be the first error
        raise _bad_token(path, offset, block, bad)
    ends = np.empty_like(is_digit)
    np.greater(is_digit[:-1], is_digit[1:], out=ends[:-1])
    ends[-1:] = is_digit[-1:]
    last = np.flatnonzero(ends)  # the last byte of every token
    if not len(last):
        return np.zeros(0, np.uint8)
    planes = _digit_planes(digits, is_digit)
    if planes is None:
        return _parse_long(path, offset, block, bound)
    values = _combine_planes(planes).take(last)
    if bound is not None and bound <= np.iinfo(values.dtype).max and values.max() >= bound:
        t = int(np.argmax(values >= bound))
        raise _too_large(path, offset + int(last[t]), int(values[t]), bound)
    return values


def _check_bound(bound: int | None) -> None:
    """Refuses a bound that is not a non-negative integer (0 admits no token: an empty vocabulary)."""
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0):
        raise UsageError(f"the vocabulary size must be a non-negative integer, got {bound!r}")


def iter_tokens(path: PathLike, *, bound: int | None = None, chunk_size: int = CHUNK_SIZE) -> Iterator[np.ndarray]:
    """Yields the tokens of a tokens text block by block, as ``uint64`` arrays, or arrays of the
    smallest unsigned dtype that holds ``bound - 1`` (every token checked to be below ``bound``)."""
    _check_bound(bound)
    dtype = index_dtype(bound) if bound is not None else np.dtype(np.uint64)
    with open_regular(path, buffering=-1) as f:
        for offset, block in _whitespace_blocks(f, path, chunk_size):
            values = _parse_block(path, offset, block, bound)
            yield values.astype(dtype, copy=False)


def read_tokens(path: PathLike, *, bound: int | None = None, chunk_size: int = CHUNK_SIZE) -> np.ndarray:
    """Reads a tokens text (non-negative decimal integers separated by whitespace) into one array.

    The array is ``uint64``, or the smallest unsigned dtype that holds ``bound - 1`` when ``bound``
    is given. Memory is that array plus a few blocks.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.tok")
    >>> _ = open(p, "wb").write(b" 3\\t14\\n\\n159 2")
    >>> read_tokens(p, bound=200)
    array([  3,  14, 159,   2], dtype=uint8)
    """
    _check_bound(bound)
    dtype = index_dtype(bound) if bound is not None else np.dtype(np.uint64)
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0  # opening it below reports it
    # Every token takes at least two bytes but the last, so size // 2 + 1 is the most a file can
    # hold; the array starts at no more than INITIAL_TOKENS and doubles as the tokens come (a sparse
    # file of 100 GiB claims nothing before its tokens are read).
    out = np.empty(min(size // 2 + 1, INITIAL_TOKENS), dtype)
    count = 0
    for values in iter_tokens(path, bound=bound, chunk_size=chunk_size):
        if count + len(values) > len(out):
            out.resize(max(2 * len(out), count + len(values)), refcheck=False)
        out[count : count + len(values)] = values
        count += len(values)
    out.resize(count, refcheck=False)
    return out


__all__ = ["CHUNK_SIZE", "WHITESPACE", "PathLike", "cut_blocks", "iter_tokens", "read_tokens"]
