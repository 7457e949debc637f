"""The ``.psk.d`` header: its magic, version, sample type, count and (in version 2) the encoding of
each leaf, read from a file and built for a writer.

The byte layout, the versions and the rules every reader and writer keep are defined in
``docs/format.md`` ("Bytes", "Versions and encodings", "Short and long files").
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import BinaryIO

from pskd_jax.errors import NotPskdError, TruncatedError
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.sample_type import ParamsType, parse_type

MAGIC = b"PSKD"

VERSION_F64 = 1  # every real leaf f64

VERSION_ENCODED = 2  # per-leaf encodings in the header

VERSIONS = (VERSION_F64, VERSION_ENCODED)
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")

MAX_TYPE_BYTES = 1 << 20  # far more than any real type; bounds what a hostile header can ask for

MAX_COUNT = 2**63 - 1  # numpy's largest axis: the most samples a reader can index


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed header. ``encodings`` has one entry per leaf (all F64 in a version 1 file whose
    layout is known; ``None`` for a version 1 ``params`` file before its layout is supplied)."""

    version: int
    type_text: str
    count: int
    encodings: tuple[Encoding, ...] | None
    data_offset: int

    @property
    def is_params(self) -> bool:
        return isinstance(parse_type(self.type_text), ParamsType)


def encode_header(type_text: str, count: int, encodings: Sequence[Encoding]) -> bytes:
    """The header bytes; version 1 when every encoding is f64, else version 2.

    >>> encode_header("ℝ[]", 3, [Encoding.F64]).hex(" ")
    '50 53 4b 44 01 00 05 00 00 00 e2 84 9d 5b 5d 03 00 00 00 00 00 00 00'
    """
    type_bytes = type_text.encode("utf-8")
    narrower = any(e != Encoding.F64 for e in encodings)
    version = VERSION_ENCODED if narrower else VERSION_F64
    parts = [MAGIC, _U16.pack(version), _U32.pack(len(type_bytes)), type_bytes, _U64.pack(count)]
    if narrower:
        parts += [_U32.pack(len(encodings)), bytes(int(e) for e in encodings)]
    return b"".join(parts)


_ENCODING_OF_BYTE = tuple(sorted(Encoding, key=int))  # (an encoding byte is its index here)


def _read_exact(f: BinaryIO, n: int, what: str, path: str) -> bytes:
    """Reads exactly n bytes or fails saying what was expected and what was found (E9003)."""
    data = f.read(n)
    if len(data) != n:
        raise TruncatedError(f"{path}: truncated in the header: {what} needs {n} bytes, {len(data)} remain")
    return data


def read_header(f: BinaryIO, path: str, file_size: int) -> Header:
    """Reads and checks the header at the start of ``f``."""
    if file_size < len(MAGIC):
        raise NotPskdError(f"{path}: not a .psk.d file ({file_size} bytes, no magic)")
    magic = f.read(4)
    if magic != MAGIC:
        raise NotPskdError(f"{path}: not a .psk.d file (magic {magic!r}, expected b'PSKD')")
    (version,) = _U16.unpack(_read_exact(f, 2, "the version", path))
    if version not in VERSIONS:
        raise NotPskdError(f"{path}: unsupported version {version} (this reader reads 1 and 2)")
    (type_len,) = _U32.unpack(_read_exact(f, 4, "the type length", path))
    if type_len > min(MAX_TYPE_BYTES, file_size):
        raise TruncatedError(f"{path}: a type of {type_len} bytes announced in a file of {file_size} bytes")
    raw_type = _read_exact(f, type_len, "the type", path)
    try:
        type_text = raw_type.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotPskdError(f"{path}: the type text is not UTF-8 (byte {e.start})") from None
    (count,) = _U64.unpack(_read_exact(f, 8, "the count", path))
    encodings = None
    offset = 4 + 2 + 4 + type_len + 8
    if version == VERSION_ENCODED:
        (n_leaves,) = _U32.unpack(_read_exact(f, 4, "the leaf count", path))
        if n_leaves > file_size:
            raise TruncatedError(f"{path}: {n_leaves} leaf encodings announced in a file of {file_size} bytes")
        raw = _read_exact(f, n_leaves, "the leaf encodings", path)
        bad = [b for b in raw if b >= len(_ENCODING_OF_BYTE)]
        if bad:
            raise NotPskdError(f"{path}: encoding byte {bad[0]} (expected 0 f64, 1 f32 or 2 bf16)")
        encodings = tuple(_ENCODING_OF_BYTE[b] for b in raw)
        offset += 4 + n_leaves
    return Header(version, type_text, count, encodings, offset)


__all__ = [
    "MAGIC",
    "MAX_COUNT",
    "MAX_TYPE_BYTES",
    "VERSIONS",
    "VERSION_ENCODED",
    "VERSION_F64",
    "Header",
    "encode_header",
    "read_header",
]
