"""Text kernels: character vocabularies, encoding text to tokens and back, and language-model windows.

These are the kernels behind ``pskd chars``, ``pskd encode``, ``pskd decode`` and the token reading
of ``pskd lm-windows``. They stream: a file is read in blocks of :data:`CHUNK_SIZE` bytes, every
block is turned into numpy arrays at once, and no Python object is made per character or token.
Nothing here imports JAX.

Formats
-------
- **Text**: UTF-8, read as bytes; a character is a code point, not a byte, so an accented letter is
  one character. ``\\r\\n`` is two characters, a byte order mark is a character; nothing is
  normalised, which is what makes ``decode(encode(text))`` return the same bytes.
- **Vocabulary**: a JSON array of distinct non-empty strings; token ``i`` is entry ``i``.
  ``char_vocab`` makes one of single characters sorted by code point. Encoding needs every token to
  be one character: a sub-word token would need longest-match encoding, which is refused rather
  than guessed.
- **Tokens text**: non-negative decimal integers separated by ASCII whitespace (space, tab, line
  feed, carriage return, vertical tab, form feed). ``encode_file`` writes single spaces and one
  final line feed.

Errors name the file and the 1-based line; a line is only counted on the error path, by reading
the file again up to the offending byte.

- invalid UTF-8, a token that is not a non-negative integer or is ≥ 2**64, a token at or above the
  vocabulary size: E9004 (``BAD_VALUE``);
- a malformed vocabulary, a character the vocabulary does not hold: E9011 (``BAD_VOCAB``);
- a file that cannot be read or written: E9003 (``TRUNCATED``).

Outputs are written through :func:`pskd_jax.fileio.atomic_output`: after an error the destination
is untouched.
"""

from __future__ import annotations

import json
import os
import re
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence, Union

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from pskd_jax.encodings import index_dtype
from pskd_jax.errors import BAD_USAGE, BAD_VALUE, BAD_VOCAB, TRUNCATED, PskdError
from pskd_jax.fileio import atomic_output

PathLike = Union[str, "os.PathLike[str]"]

#: Bytes read at a time: 128 KiB keeps every array made from a block (up to 8 bytes a byte) inside
#: a 1 MiB L2 cache; measured here 1.5-2x faster than 1 MiB blocks for encode and token reading.
CHUNK_SIZE = 1 << 17

#: One past the largest code point.
CODE_POINTS = 0x110000

#: The bytes that separate tokens in a tokens text.
WHITESPACE = b" \t\n\r\x0b\x0c"

# A token of this many digits or more may not fit in 64 bits: such blocks take the exact slow path.
_LONG_DIGITS = 20

# Padding byte of the fixed-width rows below; never a digit, a space, or part of a token's UTF-8
# unless a vocabulary holds U+0000 (decode then takes the general path).
_PAD = b"\x00"

# ---------------------------------------------------------------------------------------------
# Reading blocks
# ---------------------------------------------------------------------------------------------


def _open(path: PathLike) -> BinaryIO:
    """Opens ``path`` for reading, turning an OS error into E9003."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise PskdError(TRUNCATED, f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e
    except ValueError:  # a path holding a NUL byte
        raise PskdError(TRUNCATED, f"{os.fspath(path)!r}: cannot read: a path holds no NUL byte") from None


def _read(f: BinaryIO, path: PathLike, size: int) -> bytes:
    """Reads up to ``size`` bytes, turning an OS error into E9003."""
    try:
        return f.read(size)
    except OSError as e:
        raise PskdError(TRUNCATED, f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e


def _line_at(path: PathLike, offset: int) -> int:
    """The 1-based line of byte ``offset`` of a file: one more than the line feeds before it.

    Used only when reporting an error, so the hot paths never count lines.
    """
    line = 1
    with _open(path) as f:
        while offset > 0:
            data = _read(f, path, min(offset, CHUNK_SIZE))
            if not data:
                break
            line += data.count(b"\n")
            offset -= len(data)
    return line


def _utf8_cut(data: bytes) -> int:
    """Where to cut ``data`` so that no character is split: before an incomplete trailing sequence.

    >>> _utf8_cut("aé".encode()[:2]), _utf8_cut("aé".encode()), _utf8_cut(b"a\\xf0\\x9f\\x98")
    (1, 3, 1)
    """
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead byte
            continue
        need = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 1
        return n - back if need > back else n
    return n  # no lead byte in reach: invalid, and decoding the block will say so


def _utf8_blocks(f: BinaryIO, path: PathLike, chunk_size: int) -> Iterator[tuple[int, bytes]]:
    """Yields ``(byte offset, block)``: the file in blocks that each hold whole characters.

    Cutting at character boundaries ourselves (rather than feeding an incremental decoder) gives
    every block an exact byte offset for error messages, and lets an ASCII block skip decoding.
    """
    offset, carry = 0, b""
    while True:
        data = _read(f, path, chunk_size)
        if not data:
            if carry:
                yield offset, carry
            return
        data = carry + data if carry else data
        cut = _utf8_cut(data)
        if cut:
            yield offset, data[:cut]
        offset, carry = offset + cut, data[cut:]


def _invalid_utf8(path: PathLike, offset: int, error: UnicodeDecodeError) -> PskdError:
    """The E9004 error for invalid UTF-8 found ``error.start`` bytes into a block at ``offset``."""
    at = offset + error.start
    bad = error.object[error.start : error.end].hex(" ")
    return PskdError(
        BAD_VALUE,
        f"{os.fspath(path)}:{_line_at(path, at)}: invalid UTF-8 at byte {at} (0x{bad}: {error.reason}); "
        "the text must be UTF-8",
    )


def _code_points(path: PathLike, offset: int, block: bytes) -> np.ndarray:
    """The code points of a block: a ``uint8`` view when it is ASCII, else decoded to ``uint32``."""
    if block.isascii():
        return np.frombuffer(block, np.uint8)
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _invalid_utf8(path, offset, e) from None
    return np.frombuffer(text.encode("utf-32-le"), "<u4")


def _byte_offset(offset: int, block: bytes, position: int) -> int:
    """The file offset of character ``position`` of a block that starts at byte ``offset``."""
    if block.isascii():
        return offset + position
    return offset + len(block.decode("utf-8")[:position].encode("utf-8"))


def _describe(ch: str) -> str:
    """A character as error messages show it: its repr and code point.

    >>> _describe("é")
    "'é' (U+00E9)"
    """
    return f"{ch!r} (U+{ord(ch):04X})"


# ---------------------------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------------------------


def char_vocab(path: PathLike, *, chunk_size: int = CHUNK_SIZE) -> tuple[list[str], int]:
    """Every distinct character of a UTF-8 text, sorted by code point, and the characters read.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.txt")
    >>> _ = open(p, "wb").write("bébé\\n".encode())
    >>> char_vocab(p)
    (['\\n', 'b', 'é'], 5)
    """
    seen = np.zeros(CODE_POINTS, dtype=bool)
    seen_ascii = b""  # the ASCII bytes already seen, deleted from ASCII blocks before looking
    count = 0
    with _open(path) as f:
        for offset, block in _utf8_blocks(f, path, chunk_size):
            if block.isascii():
                count += len(block)
                fresh = block.translate(None, seen_ascii)  # usually empty after the first block
                if fresh:
                    seen[np.frombuffer(fresh, np.uint8)] = True
                    seen_ascii = bytes(np.flatnonzero(seen[:128]).astype(np.uint8))
                continue
            points = _code_points(path, offset, block)
            count += len(points)
            if not seen.take(points).all():
                seen[points] = True
                seen_ascii = bytes(np.flatnonzero(seen[:128]).astype(np.uint8))
    return [chr(c) for c in np.flatnonzero(seen).tolist()], count


def write_vocab(path: PathLike, vocab: Sequence[str]) -> None:
    """Writes ``vocab`` as a JSON array (UTF-8, non-ASCII kept as is), atomically."""
    check_vocab(vocab, os.fspath(path))
    data = (json.dumps(list(vocab), ensure_ascii=False) + "\n").encode("utf-8")
    with atomic_output(os.fspath(path)) as f:
        f.write(data)


def read_vocab(path: PathLike) -> list[str]:
    """Reads a vocabulary file: a JSON array of distinct non-empty strings (E9011 otherwise)."""
    name = os.fspath(path)
    with _open(path) as f:
        data = _read(f, path, -1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PskdError(BAD_VOCAB, f"{name}: not UTF-8 at byte {e.start}; a vocabulary is a JSON file") from None
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as e:
        raise PskdError(
            BAD_VOCAB, f"{name}:{e.lineno}: not JSON ({e.msg}, column {e.colno}); expected a JSON array of strings"
        ) from None
    except (ValueError, RecursionError) as e:  # a number of over 4300 digits; arrays nested too deep
        raise PskdError(BAD_VOCAB, f"{name}: not a vocabulary ({e}); expected a JSON array of strings") from None
    check_vocab(vocab, name)
    return vocab


def check_vocab(vocab: object, name: str) -> None:
    """Checks that ``vocab`` is a list of distinct non-empty strings encodable as UTF-8 (E9011).

    >>> check_vocab(["a", "a"], "v.json")
    Traceback (most recent call last):
    ...
    pskd_jax.errors.PskdError: E9011: v.json: token 1 'a' repeats token 0; tokens must be distinct
    """
    if not isinstance(vocab, (list, tuple)):
        raise PskdError(BAD_VOCAB, f"{name}: expected a JSON array of strings, got {_json_kind(vocab)}")
    first: dict[str, int] = {}
    for i, token in enumerate(vocab):
        if not isinstance(token, str):
            raise PskdError(BAD_VOCAB, f"{name}: token {i} is {_json_kind(token)} {token!r}, not a string")
        if not token:
            raise PskdError(BAD_VOCAB, f"{name}: token {i} is the empty string; tokens must be non-empty")
        if token in first:
            raise PskdError(
                BAD_VOCAB, f"{name}: token {i} {token!r} repeats token {first[token]}; tokens must be distinct"
            )
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise PskdError(
                BAD_VOCAB, f"{name}: token {i} {token!r} holds a lone surrogate, which UTF-8 cannot encode"
            ) from None
        first[token] = i


def _json_kind(value: object) -> str:
    """What a JSON value is, in words, for error messages."""
    kinds = {
        dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number", type(None): "null"
    }
    return kinds.get(type(value), "a list" if isinstance(value, (list, tuple)) else type(value).__name__)


def _load_vocab(vocab: Union[Sequence[str], PathLike]) -> tuple[list[str], str]:
    """A vocabulary given as a list or a file, and the name its errors use."""
    if isinstance(vocab, (str, os.PathLike)):
        return read_vocab(vocab), os.fspath(vocab)
    check_vocab(vocab, "vocabulary")
    return list(vocab), "vocabulary"


# ---------------------------------------------------------------------------------------------
# Encoding text
# ---------------------------------------------------------------------------------------------


def _word_dtype(width: int) -> np.dtype:
    """The unsigned integer dtype whose items are ``width`` bytes or the next power of two above."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if width <= np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    raise ValueError(f"rows of {width} bytes are wider than 8")


def _rows(pieces: Sequence[bytes]) -> np.ndarray:
    """Each byte string zero-padded to one common width and viewed as one integer word per row.

    Gathering one word per token is a single ``take``; the padding is deleted afterwards.

    >>> _rows([b" 7", b" 12"]).dtype, _rows([b" 7", b" 12"]).view(np.uint8).tolist()
    (dtype('uint32'), [32, 55, 0, 0, 32, 49, 50, 0])
    """
    width = _word_dtype(max(len(p) for p in pieces)).itemsize
    table = b"".join(p.ljust(width, _PAD) for p in pieces)
    return np.frombuffer(table, _word_dtype(width)).copy()


def _encode_tables(vocab: Sequence[str], name: str) -> list[np.ndarray]:
    """Tables from code point to the output bytes of its token (``" " + decimal``) as one word,
    0 for "unknown"; narrowest first.

    Each table stops one past the largest code point of the vocabulary, and that last entry is 0,
    so ``take(mode="clip")`` sends every larger code point to "unknown" without a separate test.
    Deleting the padding costs by the byte, so when the vocabulary has 1000 tokens or more a
    4-byte table of tokens 0..999 comes first and the 8-byte table serves only the blocks that
    hold a higher token.
    """
    for i, token in enumerate(vocab):
        if len(token) != 1:
            raise PskdError(
                BAD_VOCAB,
                f"{name}: token {i} {token!r} has {len(token)} characters; encode maps one character to "
                "one token (a sub-word vocabulary needs longest-match encoding, which is not supported)",
            )
    if not vocab:
        return [np.zeros(1, np.uint16)]
    points = np.array([ord(t) for t in vocab], dtype=np.int64)
    size = int(points.max()) + 2
    tables = []
    for limit in ((1000, len(vocab)) if len(vocab) > 1000 else (len(vocab),)):
        words = _rows([b" %d" % i for i in range(limit)])
        table = np.zeros(size, dtype=words.dtype)
        table[points[:limit]] = words
        tables.append(table)
    return tables


def _encode_block(tables: Sequence[np.ndarray], points: np.ndarray) -> np.ndarray:
    """The output words of a block's code points from the narrowest table that knows them all;
    a 0 word remains where a character is not in the vocabulary."""
    for table in tables:
        words = table.take(points, mode="clip")
        if np.count_nonzero(words) == len(words):
            break
    return words


def encode_file(
    text_path: PathLike,
    vocab: Union[Sequence[str], PathLike],
    out_path: PathLike,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> int:
    """Encodes a UTF-8 text as token indices, one per character; returns how many were written.

    The output is the decimal indices separated by single spaces, with a final line feed (an empty
    text gives an empty file). ``vocab`` is a list of single characters or a vocabulary file.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p, q = os.path.join(d, "t.txt"), os.path.join(d, "t.tok")
    >>> _ = open(p, "wb").write(b"abba\\n")
    >>> encode_file(p, ["\\n", "a", "b"], q), open(q, "rb").read()
    (5, b'1 2 2 1 0\\n')
    """
    vocab, name = _load_vocab(vocab)
    tables = _encode_tables(vocab, name)
    count = 0
    with _open(text_path) as f, atomic_output(os.fspath(out_path)) as out:
        for offset, block in _utf8_blocks(f, text_path, chunk_size):
            words = _encode_block(tables, _code_points(text_path, offset, block))
            if np.count_nonzero(words) < len(words):
                raise _unknown_character(text_path, offset, block, words, name)
            data = words.tobytes().translate(None, _PAD)  # drop the padding: minimal decimal text
            out.write(data[1:] if count == 0 else data)  # every token brings its leading space
            count += len(words)
        if count:
            out.write(b"\n")
    return count


def _unknown_character(path: PathLike, offset: int, block: bytes, words: np.ndarray, name: str) -> PskdError:
    """The E9011 error for the first character of a block that the vocabulary does not hold."""
    position = int(np.argmin(words != 0))
    at = _byte_offset(offset, block, position)
    ch = block[at - offset :].decode("utf-8", errors="replace")[0]
    return PskdError(
        BAD_VOCAB,
        f"{os.fspath(path)}:{_line_at(path, at)}: character {_describe(ch)} is not in the vocabulary {name}",
    )


# ---------------------------------------------------------------------------------------------
# Reading tokens
# ---------------------------------------------------------------------------------------------


def _last_whitespace(data: bytes) -> int:
    """The index of the last whitespace byte of ``data``, or −1."""
    return max(data.rfind(c) for c in (b" ", b"\n", b"\t", b"\r", b"\x0b", b"\x0c"))


def _whitespace_blocks(f: BinaryIO, path: PathLike, chunk_size: int) -> Iterator[tuple[int, bytes]]:
    """Yields ``(byte offset, block)``: the file in blocks cut just after whitespace, so that no
    token straddles two blocks."""
    offset, carry = 0, b""
    while True:
        data = _read(f, path, chunk_size)
        if not data:
            if carry:
                yield offset, carry
            return
        data = carry + data if carry else data
        cut = _last_whitespace(data) + 1
        if cut:
            yield offset, data[:cut]
        offset, carry = offset + cut, data[cut:]


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
    value = planes[-1].astype(dtype, copy=False)  # one plane: the plane itself, no copy
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
    return PskdError(
        BAD_VALUE,
        f"{os.fspath(path)}:{_line_at(path, offset + start)}: {shown} is not a token index; "
        "expected non-negative decimal integers separated by whitespace",
    )


def _too_large(path: PathLike, offset: int, value: int, bound: int | None) -> PskdError:
    """The E9004 error for a token at or above ``bound`` (or 2**64) at byte ``offset``."""
    where = f"{os.fspath(path)}:{_line_at(path, offset)}"
    if bound is None or bound > 1 << 64:
        return PskdError(BAD_VALUE, f"{where}: token {value} does not fit in 64 bits (at most {(1 << 64) - 1})")
    return PskdError(BAD_VALUE, f"{where}: token {value} is not below the vocabulary size {bound}")


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
        value = int(match.group())
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
        raise PskdError(BAD_USAGE, f"the vocabulary size must be a non-negative integer, got {bound!r}")


def iter_tokens(path: PathLike, *, bound: int | None = None, chunk_size: int = CHUNK_SIZE) -> Iterator[np.ndarray]:
    """Yields the tokens of a tokens text block by block, as ``uint64`` arrays, or arrays of the
    smallest unsigned dtype that holds ``bound - 1`` (every token checked to be below ``bound``)."""
    _check_bound(bound)
    dtype = index_dtype(bound) if bound is not None else np.dtype(np.uint64)
    with _open(path) as f:
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
        size = 0  # _open below reports it
    # Every token takes at least two bytes but the last, so this never grows for a regular file;
    # untouched pages of the reservation cost no memory, and the final resize gives them back.
    out = np.empty(size // 2 + 1, dtype)
    count = 0
    for values in iter_tokens(path, bound=bound, chunk_size=chunk_size):
        if count + len(values) > len(out):
            out.resize(2 * (count + len(values)), refcheck=False)
        out[count : count + len(values)] = values
        count += len(values)
    out.resize(count, refcheck=False)
    return out


# ---------------------------------------------------------------------------------------------
# Decoding tokens
# ---------------------------------------------------------------------------------------------


def _decoder(vocab: Sequence[str]) -> Callable[[np.ndarray], bytes]:
    """A function from a block of token indices (each below ``len(vocab)``) to their UTF-8 bytes.

    Three ways, fastest first: every token one byte (a plain gather); tokens of at most 8 bytes
    and no U+0000 (gather zero-padded words, then delete the padding); anything else (offsets
    into the concatenated tokens, expanded with ``np.repeat``).
    """
    pieces = [t.encode("utf-8") for t in vocab] or [b"?"]  # an empty vocabulary is never indexed
    if all(len(p) == 1 for p in pieces):
        table = np.frombuffer(b"".join(pieces), np.uint8)
        return lambda ids: table.take(ids).tobytes()
    if max(len(p) for p in pieces) <= 8 and not any(_PAD in p for p in pieces):
        words = _rows(pieces)
        return lambda ids: words.take(ids).tobytes().translate(None, _PAD)
    blob = np.frombuffer(b"".join(pieces), np.uint8)
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths

    def gather(ids: np.ndarray) -> bytes:
        sizes = lengths.take(ids)
        total = int(sizes.sum())
        # Byte j of the output comes from blob[starts[id] + (j - first output byte of that token)].
        jump = starts.take(ids) - (np.cumsum(sizes) - sizes)
        return blob.take(np.repeat(jump, sizes) + np.arange(total)).tobytes()

    return gather


def decode_file(
    tokens_path: PathLike,
    vocab: Union[Sequence[str], PathLike],
    out_path: PathLike,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> int:
    """Writes the text of a tokens text: each token index replaced by its token; returns the count.

    The inverse of :func:`encode_file`. Tokens may be of any length here.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p, q = os.path.join(d, "t.tok"), os.path.join(d, "t.txt")
    >>> _ = open(p, "wb").write(b"1 2 2 1 0\\n")
    >>> decode_file(p, ["\\n", "a", "b"], q), open(q, "rb").read()
    (5, b'abba\\n')
    """
    vocab, _ = _load_vocab(vocab)
    decode = _decoder(vocab)
    count = 0
    with atomic_output(os.fspath(out_path)) as out:
        for ids in iter_tokens(tokens_path, bound=len(vocab), chunk_size=chunk_size):
            if len(ids):
                out.write(decode(ids))
            count += len(ids)
    return count


# ---------------------------------------------------------------------------------------------
# Language-model windows
# ---------------------------------------------------------------------------------------------


def _check_window(seq: int, stride: int) -> None:
    """Refuses a sequence length or a stride below 1."""
    if seq < 1 or stride < 1:
        raise PskdError(
            BAD_USAGE, f"the sequence length and the stride must be at least 1, got seq={seq} stride={stride}"
        )


def lm_window_count(n_tokens: int, seq: int, stride: int) -> int:
    """How many windows of ``seq`` tokens plus a shifted target fit in ``n_tokens`` at ``stride``.

    >>> lm_window_count(200, 8, 8), lm_window_count(1182121, 256, 256), lm_window_count(8, 8, 1)
    (24, 4617, 0)
    """
    _check_window(seq, stride)
    return (n_tokens - seq - 1) // stride + 1 if n_tokens >= seq + 1 else 0


def _default_chunk(seq: int, itemsize: int) -> int:
    """Windows per chunk so that a chunk's array is about a megabyte."""
    return max(1, (1 << 20) // (seq * itemsize))


def lm_window_chunks(
    tokens: np.ndarray, seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields ``(inputs, targets)``, each ``(k, seq)`` and contiguous, for consecutive windows:
    window ``w`` is ``tokens[w*stride : w*stride + seq]`` and its target the same shifted by one.

    >>> [(i.tolist(), t.tolist()) for i, t in lm_window_chunks(np.arange(7), 3, 2)]
    [([[0, 1, 2], [2, 3, 4]], [[1, 2, 3], [3, 4, 5]])]
    """
    tokens = np.asarray(tokens)
    count = lm_window_count(len(tokens), seq, stride)
    if count == 0:
        return
    windows = sliding_window_view(tokens, seq + 1)[::stride][:count]  # a view: nothing copied yet
    step = chunk_windows or _default_chunk(seq, tokens.itemsize)
    for first in range(0, count, step):
        block = windows[first : first + step]
        yield np.ascontiguousarray(block[:, :seq]), np.ascontiguousarray(block[:, 1:])


def lm_window_records(
    tokens: np.ndarray, seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[np.ndarray]:
    """Yields ``(k, 2, seq)`` contiguous arrays: each window's input then its target, which is the
    byte order of ``(idx[V][seq: T], idx[V][seq: T])`` samples, so a chunk can be written as is.

    >>> [r.tolist() for r in lm_window_records(np.arange(5), 2, 2)]
    [[[[0, 1], [1, 2]], [[2, 3], [3, 4]]]]
    """
    tokens = np.ascontiguousarray(tokens)
    count = lm_window_count(len(tokens), seq, stride)
    if count == 0:
        return
    item = tokens.itemsize
    records = as_strided(tokens, shape=(count, 2, seq), strides=(stride * item, item, item), writeable=False)
    step = chunk_windows or _default_chunk(2 * seq, item)
    for first in range(0, count, step):
        yield records[first : first + step].copy()


def lm_window_stream(
    blocks: Iterable[np.ndarray], seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[np.ndarray]:
    """:func:`lm_window_records` over the concatenation of ``blocks`` (such as :func:`iter_tokens`
    yields), holding only about one chunk of tokens instead of the whole stream.

    >>> blocks = [np.arange(0, 3), np.arange(3, 4), np.arange(4, 9)]
    >>> [r.tolist() for r in lm_window_stream(blocks, 2, 3)]
    [[[[0, 1], [1, 2]], [[3, 4], [4, 5]], [[6, 7], [7, 8]]]]
    """
    _check_window(seq, stride)
    parts: list[np.ndarray] = []  # tokens from the next window's start on
    held = 0  # tokens in parts
    skip = 0  # tokens still to pass over before the next window's start (when stride > seq + 1)
    step = chunk_windows
    for block in blocks:
        block = np.asarray(block)
        if skip:
            dropped = min(skip, len(block))
            block, skip = block[dropped:], skip - dropped
        if not len(block):
            continue
        parts.append(block)
        held += len(block)
        step = step or _default_chunk(2 * seq, block.itemsize)
        if lm_window_count(held, seq, stride) >= step:  # enough for a full chunk: emit what is there
            tokens = np.concatenate(parts)
            yield from lm_window_records(tokens, seq, stride, chunk_windows=step)
            parts, held, skip = _window_rest(tokens, seq, stride)
    if parts:
        yield from lm_window_records(np.concatenate(parts), seq, stride, chunk_windows=step)


def _window_rest(tokens: np.ndarray, seq: int, stride: int) -> tuple[list[np.ndarray], int, int]:
    """What stays after every complete window of ``tokens`` was emitted: the tokens from the next
    window's start on, and how many tokens to pass over first when that start lies beyond them."""
    start = lm_window_count(len(tokens), seq, stride) * stride
    if start >= len(tokens):
        return [], 0, start - len(tokens)
    rest = tokens[start:].copy()  # a copy, so that the emitted tokens can be freed
    return [rest], len(rest), 0


# ---------------------------------------------------------------------------------------------
# Public block reader (for the corpus builder)
# ---------------------------------------------------------------------------------------------


def iter_text_blocks(path: PathLike, *, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, bytes, np.ndarray]]:
    """Yields ``(byte offset, block, code points)`` for a UTF-8 file read in blocks of whole
    characters: the code points are a ``uint8`` view of an ASCII block, else ``uint32``.

    Invalid UTF-8 is E9004 naming the file and line; an unreadable file E9003.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.txt")
    >>> _ = open(p, "wb").write("aé".encode())
    >>> [(offset, block, points.tolist()) for offset, block, points in iter_text_blocks(p)]
    [(0, b'a\\xc3\\xa9', [97, 233])]
    """
    with _open(path) as f:
        for offset, block in _utf8_blocks(f, path, chunk_size):
            yield offset, block, _code_points(path, offset, block)
