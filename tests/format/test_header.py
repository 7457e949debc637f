"""The header: encoded by hand, and every way a header can be cut short or malformed (refused with
the code that says so, naming the file)."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import encode_header
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import write
from tests.helpers import raises

from .golden import GOLDEN, REAL2_V1, V2_F32_BF16, WINDOWS_V1, h, put


def test_encode_header_by_hand():
    assert encode_header("ℝ[]", 3, [Encoding.F64]) == h(
        "50 53 4b 44 01 00 05 00 00 00 e2 84 9d 5b 5d 03 00 00 00 00 00 00 00")
    assert encode_header("(ℝ[], ℝ[])", 2**64 - 1, [Encoding.BF16, Encoding.F64]) == h(
        "50 53 4b 44 02 00 0e 00 00 00 28 e2 84 9d 5b 5d 2c 20 e2 84 9d 5b 5d 29"
        "ff ff ff ff ff ff ff ff 02 00 00 00 02 00")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_every_strict_prefix_is_refused(tmp_path, name):
    data = GOLDEN[name]
    for length in range(len(data)):
        path = put(tmp_path, data[:length], f"cut{length}.psk.d")
        error = raises("E9002" if length < 4 else "E9003", Reader, path)
        assert str(path) in error.message


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_one_byte_short_of_the_data(tmp_path, name):
    path = put(tmp_path, GOLDEN[name][:-1])
    error = raises("E9003", Reader, path)
    assert str(path) in error.message
    assert "truncated" in error.message


def test_truncation_message_says_what_is_present(tmp_path):
    path = put(tmp_path, REAL2_V1[:-16])
    error = raises("E9003", Reader, path)
    assert "2 samples of 16 bytes announced, 1 present" in error.message


@pytest.mark.parametrize(
    "length, what",
    [(5, "the version"), (8, "the type length"), (12, "the type"), (20, "the count")],
)
def test_header_cut_messages(tmp_path, length, what):
    error = raises("E9003", Reader, put(tmp_path, REAL2_V1[:length]))
    assert what in error.message


def test_v2_leaf_table_cut(tmp_path):
    table = V2_F32_BF16.index(h("03 00 00 00 01 02 00"))
    for length in range(table, table + 7):
        error = raises("E9003", Reader, put(tmp_path, V2_F32_BF16[:length]))
        assert "leaf" in error.message


@pytest.mark.parametrize("extra", [b"\x00", b"abc", bytes(15)])
def test_trailing_bytes_are_tolerated(tmp_path, extra):
    with Reader(put(tmp_path, WINDOWS_V1 + extra)) as reader:
        assert len(reader) == 2
        assert reader.trailing_bytes == len(extra)
        assert reader[1][0].tolist() == [61, 62, 63]
        assert reader.samples()[0].shape == (2, 3)
        assert bytes(reader.raw_data()) == WINDOWS_V1[-22:]


def test_count_zero_and_empty_data(tmp_path):
    path = tmp_path / "empty.psk.d"
    write(path, "(ℝ[2], idx[5][])", (np.zeros((0, 2)), np.zeros(0, np.uint8)))
    assert path.read_bytes() == h("50 53 4b 44 01 00 12 00 00 00 28 e2 84 9d 5b 32 5d 2c 20 69 64 78 5b 35 5d 5b 5d 29"
                                  "00 00 00 00 00 00 00 00")
    with Reader(path) as reader:
        assert len(reader) == 0
        assert reader.leaves()[0].shape == (0, 2) and reader.leaves()[1].dtype == np.uint8
        raises("E9003", reader.__getitem__, 0)


# --------------------------------------------------------------------------------------------
# Malformed headers


@pytest.mark.parametrize("magic", [b"PSKX", b"pskd", b"\0\0\0\0", b"DKSP"])
def test_bad_magic(tmp_path, magic):
    path = put(tmp_path, magic + REAL2_V1[4:])
    error = raises("E9002", Reader, path)
    assert str(path) in error.message and "magic" in error.message


@pytest.mark.parametrize("content", [b"", b"P", b"PS", b"PSK"])
def test_shorter_than_the_magic(tmp_path, content):
    error = raises("E9002", Reader, put(tmp_path, content))
    assert "not a .psk.d file" in error.message


@pytest.mark.parametrize("version", [0, 3, 65535])
def test_unsupported_versions(tmp_path, version):
    path = put(tmp_path, b"PSKD" + struct.pack("<H", version) + REAL2_V1[6:])
    error = raises("E9002", Reader, path)
    assert f"version {version}" in error.message and str(path) in error.message


def test_huge_type_length_is_refused_without_allocating_it(tmp_path):
    path = put(tmp_path, b"PSKD" + h("01 00 ff ff ff ff") + b"\x00" * 64)
    tracemalloc.start()
    try:
        error = raises("E9003", Reader, path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert "4294967295" in error.message


def test_huge_leaf_count_is_refused_without_allocating_it(tmp_path):
    data = V2_F32_BF16.replace(h("03 00 00 00 01 02 00"), h("ff ff ff ff 01 02 00"))
    tracemalloc.start()
    try:
        raises("E9003", Reader, put(tmp_path, data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_type_text_not_utf8(tmp_path):
    data = REAL2_V1.replace(h("e2 84 9d"), h("e2 84 ff"))
    error = raises("E9002", Reader, put(tmp_path, data))
    assert "UTF-8" in error.message


@pytest.mark.parametrize("byte", [3, 255])
def test_unknown_encoding_byte(tmp_path, byte):
    data = V2_F32_BF16.replace(h("03 00 00 00 01 02 00"), h("03 00 00 00 01") + bytes([byte]) + h("00"))
    error = raises("E9002", Reader, put(tmp_path, data))
    assert f"encoding byte {byte}" in error.message


@pytest.mark.parametrize("leaves, table", [(2, "01 02"), (4, "01 02 00 00")])
def test_leaf_count_disagreeing_with_the_type(tmp_path, leaves, table):
    data = V2_F32_BF16.replace(h("03 00 00 00 01 02 00"), struct.pack("<I", leaves) + h(table))
    if leaves == 2:
        data += b"\x00"  # keep the data region the same length
    path = put(tmp_path, data)
    error = raises("E9005", Reader, path)
    assert str(path) in error.message and f"the header lists {leaves} leaves, the layout has 3 leaves" in error.message


@pytest.mark.parametrize("encoding", [1, 2])
def test_narrow_encoding_on_an_idx_leaf(tmp_path, encoding):
    data = V2_F32_BF16.replace(h("03 00 00 00 01 02 00"), h("03 00 00 00 01 02") + bytes([encoding]))
    error = raises("E9002", Reader, put(tmp_path, data))
    assert "leaf [2] is idx[3]" in error.message


@pytest.mark.parametrize("type_text", ["ℝ[D]", "Foo", "idx[0][]", "ℝ[2", "(ℝ[])"])
def test_a_type_that_does_not_parse(tmp_path, type_text):
    encoded = type_text.encode()
    data = b"PSKD" + h("01 00") + struct.pack("<I", len(encoded)) + encoded + bytes(8)
    path = put(tmp_path, data)
    error = raises("E9001", Reader, path)
    assert str(path) in error.message and "column" in error.message


def test_unreadable_paths(tmp_path):
    missing = tmp_path / "missing.psk.d"
    error = raises("E9002", Reader, missing)
    assert str(missing) in error.message
    error = raises("E9002", Reader, tmp_path)
    assert str(tmp_path) in error.message
