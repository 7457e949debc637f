"""The ``.psk.d`` container: its byte layout, a reader over a memory map, and writers.

Byte layout
===========

A ``.psk.d`` file holds ``count`` samples of one sample type, all little-endian::

    offset  size       field
    0       4          magic, the bytes b"PSKD"
    4       2          version, u16: 1 or 2
    6       4          type_len, u32: length in bytes of the type text
    10      type_len   the sample type, UTF-8 (see pskd_jax.sample_type)
    ..      8          count, u64: the number of samples
    -- version 2 only --
    ..      4          leaves, u32: the number of leaves of the type
    ..      leaves     one encoding byte per leaf in storage order:
                       0 = f64 (and every idx leaf), 1 = f32, 2 = bf16
    -- then --
    data_offset        the samples, back to back, each ``sample_bytes`` long

A sample is its leaves in storage order (tuple elements left to right; a parameter tree's fields
in declaration order), each leaf a row-major tensor of:

- ``idx[N]``: the smallest of u8, u16, u32, u64 that holds N − 1;
- ``ℝ``: f64 in version 1; in version 2 the leaf's encoding (bf16 being the upper sixteen bits of
  the f32 of the same value).

Rules:

- A writer MUST write version 1 when every real leaf is f64, so that an all-f64 file is the same
  bytes whichever writer wrote it, and version 2 otherwise. A reader MUST read both.
- Sample k starts at ``data_offset + k * sample_bytes``.
- A file longer than ``count`` samples has trailing bytes (an interrupted append): readers read
  ``count`` samples and MAY report the trailing bytes. A file shorter than ``count`` samples is
  truncated (E9003).
- An idx leaf MUST carry encoding 0 in a version 2 header.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import BinaryIO, Sequence

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
