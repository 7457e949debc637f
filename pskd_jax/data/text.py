"""Text kernels: character vocabularies, and encoding text to tokens and back.

The file functions (``char_vocab_file``, ``encode_file``, ``decode_file``) are ``pskd chars``,
``encode`` and ``decode``; they stream, a block of :data:`CHUNK_SIZE` bytes at a time turned into
numpy arrays at once, with no Python object per character or token. :func:`char_vocab`,
:func:`encode` and :func:`decode` are their in-memory twins for strings. The formats (UTF-8 text,
vocabularies, tokens text) and the errors are defined in ``docs/reference-rules.md`` ("Text,
vocabularies and tokens"); a line number is counted only on the error path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import numpy as np

from pskd_jax._os.files import line_at, open_regular, read_some
from pskd_jax.data.tokens import CHUNK_SIZE, PathLike, cut_blocks, iter_tokens
from pskd_jax.errors import BadValueError, PskdError, VocabularyError
from pskd_jax.format.encodings import index_dtype
from pskd_jax.storage import whole_output

__all__ = [
    "CODE_POINTS",
    "char_vocab",
    "char_vocab_file",
    "check_vocab",
    "decode",
    "decode_file",
    "encode",
    "encode_file",
    "iter_text_blocks",
    "read_vocab",
    "write_vocab",
]

#: One past the largest code point.
CODE_POINTS = 0x110000

# Padding byte of the fixed-width rows below; never a digit, a space, or part of a token's UTF-8
# unless a vocabulary holds U+0000 (decode then takes the general path).
_PAD = b"\x00"


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
    """The file in blocks that each hold whole characters.

    Cutting at character boundaries ourselves (rather than feeding an incremental decoder) gives
    every block an exact byte offset for error messages, and lets an ASCII block skip decoding.
    """
    return cut_blocks(f, path, chunk_size, _utf8_cut)


def _invalid_utf8(path: PathLike, offset: int, error: UnicodeDecodeError) -> PskdError:
    """The E9004 error for invalid UTF-8 found ``error.start`` bytes into a block at ``offset``."""
    at = offset + error.start
    bad = error.object[error.start : error.end].hex(" ")
    return BadValueError(f"{os.fspath(path)}:{line_at(path, at)}: invalid UTF-8 at byte {at} (0x{bad}: "
                         f"{error.reason}); "
                         "the text must be UTF-8")


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


def char_vocab_file(path: PathLike, *, chunk_size: int = CHUNK_SIZE) -> tuple[list[str], int]:
    """Every distinct character of a UTF-8 text file, sorted by code point, and the characters read.

    :func:`char_vocab` does the same for a string in memory.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.txt")
    >>> _ = open(p, "wb").write("bébé\\n".encode())
    >>> char_vocab_file(p)
    (['\\n', 'b', 'é'], 5)
    """
    seen = np.zeros(CODE_POINTS, dtype=bool)
    seen_ascii = b""  # the ASCII bytes already seen, deleted from ASCII blocks before looking
    count = 0
    with open_regular(path, buffering=-1) as f:
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
    with whole_output(os.fspath(path)) as f:
        f.write(data)


def read_vocab(path: PathLike) -> list[str]:
    """Reads a vocabulary file: a JSON array of distinct non-empty strings (E9011 otherwise)."""
    name = os.fspath(path)
    with open_regular(path, buffering=-1) as f:
        data = read_some(f, path, -1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VocabularyError(f"{name}: not UTF-8 at byte {e.start}; a vocabulary is a JSON file") from None
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as e:
        raise VocabularyError(f"{name}:{e.lineno}: not JSON ({e.msg}, column {e.colno}); expected a JSON array of "
                              f"strings") from None
    except (ValueError, RecursionError) as e:  # a number of over 4300 digits; arrays nested too deep
        raise VocabularyError(f"{name}: not a vocabulary ({e}); expected a JSON array of strings") from None
    check_vocab(vocab, name)
    return vocab


def check_vocab(vocab: object, name: str) -> None:
    """Checks that ``vocab`` is a list of distinct non-empty strings encodable as UTF-8 (E9011).

    >>> check_vocab(["a", "a"], "v.json")
    Traceback (most recent call last):
    ...
    pskd_jax.errors.VocabularyError: E9011: v.json: token 1 'a' repeats token 0; tokens must be distinct
    """
    if not isinstance(vocab, (list, tuple)):
        raise VocabularyError(f"{name}: expected a JSON array of strings, got {_json_kind(vocab)}")
    first: dict[str, int] = {}
    for i, token in enumerate(vocab):
        if not isinstance(token, str):
            raise VocabularyError(f"{name}: token {i} is {_json_kind(token)} {token!r}, not a string")
        if not token:
            raise VocabularyError(f"{name}: token {i} is the empty string; tokens must be non-empty")
        if token in first:
            raise VocabularyError(f"{name}: token {i} {token!r} repeats token {first[token]}; tokens must be distinct")
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise VocabularyError(f"{name}: token {i} {token!r} holds a lone surrogate, which UTF-8 cannot encode"
            ) from None
        first[token] = i


def _json_kind(value: object) -> str:
    """What a JSON value is, in words, for error messages."""
    kinds = {
        dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number", type(None): "null"
    }
    return kinds.get(type(value), "a list" if isinstance(value, (list, tuple)) else type(value).__name__)


def _load_vocab(vocab: Sequence[str] | PathLike) -> tuple[list[str], str | None]:
    """A vocabulary given as a list or a file, and its file's name (None for a list)."""
    if isinstance(vocab, (str, os.PathLike)):
        return read_vocab(vocab), os.fspath(vocab)
    check_vocab(vocab, "vocabulary")
    return list(vocab), None


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
            raise VocabularyError(f"{name}: token {i} {token!r} has {len(token)} characters; encode maps one "
                                  f"character to "
                                  "one token (a sub-word vocabulary needs longest-match encoding, which is not "
                                  "supported)")
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
    vocab: Sequence[str] | PathLike,
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
    tables = _encode_tables(vocab, name or "vocabulary")
    count = 0
    with open_regular(text_path, buffering=-1) as f, whole_output(os.fspath(out_path)) as out:
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


def _unknown_character(path: PathLike, offset: int, block: bytes, words: np.ndarray, name: str | None) -> PskdError:
    """The E9011 error for the first character of a block that the vocabulary does not hold."""
    position = int(np.argmin(words != 0))
    at = _byte_offset(offset, block, position)
    ch = block[at - offset :].decode("utf-8", errors="replace")[0]
    return VocabularyError(f"{os.fspath(path)}:{line_at(path, at)}: character {_describe(ch)} is not in "
                           f"{_vocabulary_named(name)}")


def _vocabulary_named(name: str | None) -> str:
    """How messages name a vocabulary: by its file, or plainly when it was given as a list."""
    return "the vocabulary" if name is None else f"the vocabulary {name}"


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
    vocab: Sequence[str] | PathLike,
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
    lengths = np.array([len(t.encode("utf-8")) for t in vocab] or [1], dtype=np.int64)
    with whole_output(os.fspath(out_path)) as out:
        for ids in iter_tokens(tokens_path, bound=len(vocab), chunk_size=chunk_size):
            for part in _output_parts(ids, lengths):
                out.write(decode(part))
            count += len(ids)
    return count


#: The most bytes of text decode makes at once: a block of tokens whose text is longer (long
#: tokens, many times over) is decoded in parts, so memory follows the block, not its text.
DECODE_PART_BYTES = 1 << 24


def _output_parts(ids: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """``ids`` in consecutive parts whose text takes at most DECODE_PART_BYTES (or one token)."""
    if not len(ids):
        return
    ends = np.cumsum(lengths.take(ids))
    if ends[-1] <= DECODE_PART_BYTES:
        yield ids
        return
    first = 0
    while first < len(ids):
        base = ends[first - 1] if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + DECODE_PART_BYTES, side="right")))
        yield ids[first:last]
        first = last


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
    with open_regular(path, buffering=-1) as f:
        for offset, block in _utf8_blocks(f, path, chunk_size):
            yield offset, block, _code_points(path, offset, block)

# --- strings in memory --------------------------------------------------------------------------


def _string_code_points(text: str, what: str) -> np.ndarray:
    """The code points of a string as ``uint32``; a lone surrogate (which UTF-8 cannot encode, so
    no vocabulary file or text file can hold it) is refused with E9004 naming its position."""
    if not isinstance(text, str):
        raise BadValueError(f"{what} is a str, got {type(text).__name__}")
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), np.uint8).astype(np.uint32)
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), "<u4")
    surrogate = (points >= 0xD800) & (points <= 0xDFFF)
    if surrogate.any():
        at = int(np.argmax(surrogate))
        raise BadValueError(f"{what}: character {at} is a lone surrogate U+{int(points[at]):04X}, which UTF-8 "
                            "cannot encode")
    return points


def char_vocab(text: str) -> list[str]:
    """The character vocabulary of a string: every distinct character, sorted by code point.

    The in-memory twin of :func:`char_vocab_file`; token ``i`` is entry ``i``.

    >>> char_vocab("bébé\\n")
    ['\\n', 'b', 'é']
    """
    points = _string_code_points(text, "the text")
    return [chr(c) for c in np.unique(points).tolist()]


def encode(text: str, vocab: Sequence[str] | PathLike) -> np.ndarray:
    """The token ids of a string, one per character, against a vocabulary of single characters
    (a list, or a vocabulary file).

    The ids come in the smallest unsigned dtype that holds ``len(vocab) - 1``, the dtype an
    ``idx[len(vocab)]`` leaf stores. A character the vocabulary does not hold is E9011 naming it,
    its code point, and its position (character offset and line) in the text.

    >>> encode("abba\\n", ["\\n", "a", "b"])
    array([1, 2, 2, 1, 0], dtype=uint8)
    """
    vocab, name = _load_vocab(vocab)
    _encode_tables(vocab, name or "vocabulary")  # refuses a token of several characters
    points = _string_code_points(text, "the text")
    dtype = index_dtype(max(len(vocab), 1))
    if not vocab:
        table = np.zeros(1, dtype=np.int64)
    else:
        table = np.zeros(max(ord(t) for t in vocab) + 2, dtype=np.int64)  # 0: unknown; the last entry stays 0
        table[[ord(t) for t in vocab]] = np.arange(1, len(vocab) + 1)
    ids = table.take(points, mode="clip")  # any code point beyond the table lands on its 0
    if len(ids) and not ids.all():
        at = int(np.argmin(ids != 0))
        line = text.count("\n", 0, at) + 1
        raise VocabularyError(f"the text, character {at} (line {line}): character {_describe(text[at])} is not in "
                              f"{_vocabulary_named(name)}")
    return (ids - 1).astype(dtype)


def decode(ids: Sequence[int] | np.ndarray, vocab: Sequence[str] | PathLike) -> str:
    """The text of token ids (an integer array or sequence): each id replaced by its token.

    The inverse of :func:`encode`; tokens may be of any length here. An id that is not an
    integer in ``[0, len(vocab))`` is E9004 naming its position and value.

    >>> decode([1, 2, 2, 1, 0], ["\\n", "a", "b"])
    'abba\\n'
    """
    vocab, _ = _load_vocab(vocab)
    array = np.asarray(ids)
    if array.size == 0:
        return ""
    if array.dtype.kind not in "iu":
        raise BadValueError(f"token ids are integers, got an array of {array.dtype}")
    flat = array.reshape(-1)
    bad = (flat < 0) | (flat >= len(vocab)) if array.dtype.kind == "i" else flat >= len(vocab)
    if bad.any():
        at = int(np.argmax(bad))
        raise BadValueError(f"token id {at} is {int(flat[at])}, not below the vocabulary size {len(vocab)}"
                            if flat[at] >= 0 else f"token id {at} is {int(flat[at])}, a negative id")
    return _decoder(vocab)(flat.astype(np.intp)).decode("utf-8")
