"""The ``.psk.d`` container: golden bytes both ways, round trips, truncation, malformed headers,
the reader's access paths and the writers' all-or-nothing output.

Golden bytes are written out by hand from SPEC §2 and reference/: magic "PSKD", u16 version,
u32 type length and the UTF-8 type, u64 count, [v2: u32 leaves, one encoding byte a leaf], samples.
"""

from __future__ import annotations

import math
import os
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import Writer, write, write_encoded, write_stream
from pskd_jax.format.header import encode_header
from pskd_jax.format.encodings import Encoding
from pskd_jax.errors import PskdError

BF16 = np.dtype(ml_dtypes.bfloat16)
SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def h(text: str) -> bytes:
    """Hex with spaces, '|' and newlines for readability."""
    return bytes.fromhex(text.replace("|", " "))


def raises(code: str, fn, *args, **kwargs) -> PskdError:
    with pytest.raises(PskdError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value


def bits(array: np.ndarray) -> list:
    array = np.asarray(array)
    if array.dtype.kind == "f" or array.dtype == BF16:
        return array.view(f"<u{array.dtype.itemsize}").tolist()
    return array.tolist()


# --------------------------------------------------------------------------------------------
# Golden files, by hand

# ℝ[2] (written R[2]), 2 samples: [1.0, -2.0], [0.5, 3.0]
REAL2_V1 = h(
    "50 53 4b 44 | 01 00 | 06 00 00 00 | e2 84 9d 5b 32 5d | 02 00 00 00 00 00 00 00"
    "| 00 00 00 00 00 00 f0 3f | 00 00 00 00 00 00 00 c0"
    "| 00 00 00 00 00 00 e0 3f | 00 00 00 00 00 00 08 40"
)

# (idx[64][seq: 3], ℝ[]), 2 samples: ([1, 2, 3], 0.25), ([61, 62, 63], -0.0)
WINDOWS_V1 = h(
    "50 53 4b 44 | 01 00 | 18 00 00 00"
    "| 28 69 64 78 5b 36 34 5d 5b 73 65 71 3a 20 33 5d 2c 20 e2 84 9d 5b 5d 29"
    "| 02 00 00 00 00 00 00 00"
    "| 01 02 03 | 00 00 00 00 00 00 d0 3f"
    "| 3d 3e 3f | 00 00 00 00 00 00 00 80"
)

# idx[300][2] (u16), 2 samples: [0, 299], [256, 1]
IDX300 = h(
    "50 53 4b 44 | 01 00 | 0b 00 00 00 | 69 64 78 5b 33 30 30 5d 5b 32 5d | 02 00 00 00 00 00 00 00"
    "| 00 00 2b 01 | 00 01 01 00"
)

# idx[4294967297][] (2^32 + 1: u64), 2 samples: 4294967296, 7
IDX2_32_PLUS_1 = h(
    "50 53 4b 44 | 01 00 | 11 00 00 00 | 69 64 78 5b 34 32 39 34 39 36 37 32 39 37 5d 5b 5d"
    "| 02 00 00 00 00 00 00 00"
    "| 00 00 00 00 01 00 00 00 | 07 00 00 00 00 00 00 00"
)

# (ℝ[2], ℝ[2], idx[3][]) in f32, bf16, f64 (version 2), 1 sample: ([1.5, -0.375], [3.140625, -0.375], 2)
# f32 1.5 = 3fc00000, -0.375 = bec00000; bf16 = the upper halves: 3.140625 = 4049(0000), -0.375 = bec0
V2_F32_BF16 = h(
    "50 53 4b 44 | 02 00 | 1a 00 00 00"
    "| 28 e2 84 9d 5b 32 5d 2c 20 e2 84 9d 5b 32 5d 2c 20 69 64 78 5b 33 5d 5b 5d 29"
    "| 01 00 00 00 00 00 00 00 | 03 00 00 00 | 01 02 00"
    "| 00 00 c0 3f 00 00 c0 be | 49 40 c0 be | 02"
)

# bool[2], 2 samples: [true, false], [false, true]: idx[2], u8
BOOL2 = h(
    "50 53 4b 44 | 01 00 | 07 00 00 00 | 62 6f 6f 6c 5b 32 5d | 02 00 00 00 00 00 00 00 | 01 00 | 00 01"
)


def test_golden_real_v1_written(tmp_path):
    path = tmp_path / "r.psk.d"
    result = write(path, "R[2]", np.array([[1.0, -2.0], [0.5, 3.0]]))
    assert path.read_bytes() == REAL2_V1
    assert (result.version, result.count, result.type_text) == (1, 2, "ℝ[2]")
    # The same bytes whichever writer writes them.
    write_encoded(tmp_path / "e.psk.d", "R[2]", np.array([[1.0, -2.0], [0.5, 3.0]]), ["f64"])
    assert (tmp_path / "e.psk.d").read_bytes() == REAL2_V1


def test_golden_windows_written(tmp_path):
    path = tmp_path / "w.psk.d"
    write(path, "(idx[64][seq: 3], ℝ[])", (np.array([[1, 2, 3], [61, 62, 63]]), np.array([0.25, -0.0])))
    assert path.read_bytes() == WINDOWS_V1


def test_golden_idx_widths_written(tmp_path):
    write(tmp_path / "a.psk.d", "idx[300][2]", np.array([[0, 299], [256, 1]]))
    assert (tmp_path / "a.psk.d").read_bytes() == IDX300
    write(tmp_path / "b.psk.d", "idx[4294967297][]", [4294967296, 7])
    assert (tmp_path / "b.psk.d").read_bytes() == IDX2_32_PLUS_1


def test_golden_v2_written_from_f64_values(tmp_path):
    path = tmp_path / "v2.psk.d"
    samples = (np.array([[1.5, -0.375]]), np.array([[3.140625, -0.375]]), np.array([2]))
    result = write_encoded(path, "(R[2], ℝ[2], idx[3][])", samples, ["f32", "bf16", "f64"])
    assert path.read_bytes() == V2_F32_BF16
    assert result.version == 2
    assert result.encodings == (Encoding.F32, Encoding.BF16, Encoding.F64)
    assert result.rounding == []


def test_golden_v2_written_from_dtypes(tmp_path):
    path = tmp_path / "v2.psk.d"
    samples = (np.array([[1.5, -0.375]], np.float32), np.array([[3.140625, -0.375]], BF16), np.array([2], np.uint8))
    write(path, "(ℝ[2], ℝ[2], idx[3][])", samples)
    assert path.read_bytes() == V2_F32_BF16


def test_golden_bool_written(tmp_path):
    path = tmp_path / "b.psk.d"
    write(path, "bool[2]", np.array([[True, False], [False, True]]))
    assert path.read_bytes() == BOOL2
    write(tmp_path / "i.psk.d", "bool[2]", [[1, 0], [0, 1]])
    assert (tmp_path / "i.psk.d").read_bytes() == BOOL2


def test_encode_header_by_hand():
    assert encode_header("ℝ[]", 3, [Encoding.F64]) == h(
        "50 53 4b 44 01 00 05 00 00 00 e2 84 9d 5b 5d 03 00 00 00 00 00 00 00")
    assert encode_header("(ℝ[], ℝ[])", 2**64 - 1, [Encoding.BF16, Encoding.F64]) == h(
        "50 53 4b 44 02 00 0e 00 00 00 28 e2 84 9d 5b 5d 2c 20 e2 84 9d 5b 5d 29"
        "ff ff ff ff ff ff ff ff 02 00 00 00 02 00")


def put(tmp_path, data: bytes, name: str = "x.psk.d"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_golden_real_v1_read(tmp_path):
    with Reader(put(tmp_path, REAL2_V1)) as reader:
        assert (reader.header.version, reader.header.type_text, len(reader)) == (1, "ℝ[2]", 2)
        assert reader.header.data_offset == 24 and reader.sample_bytes == 16
        assert reader[0].dtype == np.float64
        assert reader[0].tolist() == [1.0, -2.0]
        assert reader[1].tolist() == [0.5, 3.0]
        assert reader.trailing_bytes == 0


def test_golden_windows_read(tmp_path):
    with Reader(put(tmp_path, WINDOWS_V1)) as reader:
        tokens, value = reader[1]
        assert tokens.dtype == np.uint8 and tokens.tolist() == [61, 62, 63]
        assert value.dtype == np.float64 and value.shape == ()
        assert bits(value) == 0x8000000000000000  # -0.0 kept
        tokens, value = reader.samples()
        assert tokens.tolist() == [[1, 2, 3], [61, 62, 63]] and value.tolist() == [0.25, -0.0]


def test_golden_idx_widths_read(tmp_path):
    with Reader(put(tmp_path, IDX300, "a.psk.d")) as reader:
        assert reader.samples().dtype == np.uint16
        assert reader.samples().tolist() == [[0, 299], [256, 1]]
    with Reader(put(tmp_path, IDX2_32_PLUS_1, "b.psk.d")) as reader:
        assert reader.samples().dtype == np.uint64
        assert reader.samples().tolist() == [4294967296, 7]


@pytest.mark.parametrize(
    "bound, element, value, dtype",
    [
        (256, "ff", 255, np.uint8),
        (257, "00 01", 256, np.uint16),
        (65536, "ff ff", 65535, np.uint16),
        (65537, "00 00 01 00", 65536, np.uint32),
        (2**32, "ff ff ff ff", 2**32 - 1, np.uint32),
        (2**64, "ff ff ff ff ff ff ff ff", 2**64 - 1, np.uint64),
    ],
)
def test_idx_width_boundaries_both_ways(tmp_path, bound, element, value, dtype):
    type_bytes = f"idx[{bound}][]".encode()
    data = b"PSKD" + h("01 00") + struct.pack("<I", len(type_bytes)) + type_bytes + h("01 00 00 00 00 00 00 00") + h(element)
    with Reader(put(tmp_path, data, "hand.psk.d")) as reader:
        assert reader[0].dtype == dtype and int(reader[0]) == value
    write(tmp_path / "w.psk.d", f"idx[{bound}][]", [value])
    assert (tmp_path / "w.psk.d").read_bytes() == data


def test_golden_v2_read(tmp_path):
    with Reader(put(tmp_path, V2_F32_BF16)) as reader:
        assert reader.header.version == 2
        assert reader.header.encodings == (Encoding.F32, Encoding.BF16, Encoding.F64)
        a, b, i = reader[0]
        assert a.dtype == np.float32 and bits(a) == [0x3FC00000, 0xBEC00000]
        assert b.dtype == BF16 and bits(b) == [0x4049, 0xBEC0]
        assert b.astype(np.float64).tolist() == [3.140625, -0.375]
        assert i.dtype == np.uint8 and int(i) == 2


def test_version_2_with_all_f64_encodings_is_read(tmp_path):
    # No writer makes it, every reader reads it.
    data = h("50 53 4b 44 | 02 00 | 05 00 00 00 | e2 84 9d 5b 5d | 01 00 00 00 00 00 00 00"
             "| 01 00 00 00 | 00 | 00 00 00 00 00 00 f8 3f")
    with Reader(put(tmp_path, data)) as reader:
        assert reader[0].dtype == np.float64 and float(reader[0]) == 1.5


def test_golden_bool_read(tmp_path):
    with Reader(put(tmp_path, BOOL2)) as reader:
        assert reader.header.type_text == "bool[2]"
        assert reader.samples().dtype == np.uint8
        assert reader.samples().tolist() == [[1, 0], [0, 1]]


def test_golden_params_v1_read_with_template(tmp_path):
    # params P, one sample: {'w': [1.0, 2.0], 'n': idx (int16 → idx[2^15], u16) 513}
    data = h("50 53 4b 44 | 01 00 | 08 00 00 00 | 70 61 72 61 6d 73 20 50 | 01 00 00 00 00 00 00 00"
             "| 00 00 00 00 00 00 f0 3f 00 00 00 00 00 00 00 40 | 01 02")
    path = put(tmp_path, data)
    with Reader(path, layout={"w": np.zeros(2), "n": np.int16(0)}) as reader:
        sample = reader[0]
        assert list(sample) == ["w", "n"]
        assert sample["w"].tolist() == [1.0, 2.0]
        assert sample["n"].dtype == np.uint16 and int(sample["n"]) == 513
    write(tmp_path / "w.psk.d", "params P", {"w": np.array([[1.0, 2.0]]), "n": np.array([513], np.int16)},
          layout={"w": np.zeros(2), "n": np.int16(0)})
    assert (tmp_path / "w.psk.d").read_bytes() == data


# --------------------------------------------------------------------------------------------
# Round trips over random types and values

NAMES = ["seq", "model", "R", "d", "ℝ"]


def expected_uint(bound: int) -> np.dtype:
    for limit, dtype in ((2**8, "<u1"), (2**16, "<u2"), (2**32, "<u4")):
        if bound <= limit:
            return np.dtype(dtype)
    return np.dtype("<u8")


@st.composite
def leaf_types(draw):
    """(text, kind, shape, bound): kind 'real' | 'idx' | 'bool'."""
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    named = [draw(st.none() | st.sampled_from(NAMES)) for _ in shape]
    dims = "[" + ", ".join(f"{n}: {s}" if n else str(s) for n, s in zip(named, shape)) + "]"
    kind = draw(st.sampled_from(["real", "real", "idx", "bool"]))
    if kind == "real":
        return draw(st.sampled_from(["ℝ", "R"])) + dims, kind, shape, None
    if kind == "bool":
        return "bool" + dims, kind, shape, 2
    bound = draw(st.sampled_from([1, 2, 255, 256, 257, 2**16 - 1, 2**16, 2**16 + 1, 2**32 - 1, 2**32,
                                  2**32 + 1, 2**64 - 1, 2**64]) | st.integers(1, 2**64))
    return f"idx[{bound}]{dims}", kind, shape, bound


@st.composite
def sample_types(draw, depth=0):
    """(text, leaves in storage order, build(values) → the pytree of those values)."""
    if depth >= 2 or draw(st.booleans()):
        text, kind, shape, bound = draw(leaf_types())
        return text, [(kind, shape, bound)], lambda values: values[0]
    items = draw(st.lists(sample_types(depth + 1), min_size=2, max_size=3))
    leaves = [leaf for _, item_leaves, _ in items for leaf in item_leaves]

    def build(values):
        out, start = [], 0
        for _, item_leaves, item_build in items:
            out.append(item_build(values[start:start + len(item_leaves)]))
            start += len(item_leaves)
        return tuple(out)

    return "(" + ", ".join(text for text, _, _ in items) + ")", leaves, build


def bf16_values(draw, shape):
    raw = draw(st.lists(st.integers(0, 0xFFFF).filter(lambda b: b & 0x7F80 != 0x7F80),
                        min_size=math.prod(shape), max_size=math.prod(shape)))
    return np.array(raw, np.uint16).view(BF16).reshape(shape)


@st.composite
def leaf_values(draw, kind, shape, bound, encoding, n):
    shape = (n, *shape)
    size = math.prod(shape)
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), bool).reshape(shape)
    if kind == "idx":
        edge = st.sampled_from(sorted({0, bound - 1, max(bound - 2, 0), bound // 2}))
        ints = draw(st.lists(edge | st.integers(0, bound - 1), min_size=size, max_size=size))
        return np.array(ints, dtype=expected_uint(bound)).reshape(shape)
    if encoding == "bf16":
        return bf16_values(draw, shape)
    width = 32 if encoding == "f32" else 64
    floats = st.floats(allow_nan=False, allow_infinity=False, width=width) | st.sampled_from([-0.0, 0.0])
    dtype = np.float32 if encoding == "f32" else np.float64
    return np.array(draw(st.lists(floats, min_size=size, max_size=size)), dtype).reshape(shape)


def header_size(type_text: str, leaves: int, version: int) -> int:
    return 4 + 2 + 4 + len(type_text.encode()) + 8 + (4 + leaves if version == 2 else 0)


def element_size(kind, bound, encoding) -> int:
    if kind == "real":
        return {"f64": 8, "f32": 4, "bf16": 2}[encoding]
    return expected_uint(bound).itemsize


def check_leaf(got: np.ndarray, want: np.ndarray, kind, bound, encoding):
    if kind == "real":
        assert got.dtype == {"f64": np.float64, "f32": np.float32, "bf16": BF16}[encoding]
        assert bits(got) == bits(want.astype(got.dtype))
    else:
        assert got.dtype == expected_uint(bound)
        assert got.tolist() == np.asarray(want).astype(np.uint64).tolist()


@st.composite
def files(draw):
    text, leaves, build = draw(sample_types())
    encodings = [draw(st.sampled_from(["f64", "f32", "bf16"])) if kind == "real" else "f64"
                 for kind, _, _ in leaves]
    n = draw(st.integers(0, 4))
    values = [draw(leaf_values(kind, shape, bound, enc, n)) for (kind, shape, bound), enc in zip(leaves, encodings)]
    return text, leaves, build, encodings, n, values


@SETTINGS
@given(files(), st.data())
def test_round_trip_random_types(tmp_path_factory, file, data):
    text, leaves, build, encodings, n, values = file
    directory = tmp_path_factory.mktemp("rt")
    path = directory / "f.psk.d"
    how = data.draw(st.sampled_from(["write", "write_encoded", "write_encoded_f64_values", "write_stream"]))
    if how == "write":
        result = write(path, text, build(values))
    elif how == "write_encoded":
        result = write_encoded(path, text, build(values), encodings)
    elif how == "write_stream":  # two batches, split anywhere (either may be empty)
        k = data.draw(st.integers(0, n))
        batches = [build([v[:k] for v in values]), build([v[k:] for v in values])]
        result = write_stream(path, text, batches, encodings=encodings)
    else:  # f64 arrays whose values are exactly in each leaf's encoding
        widened = [v.astype(np.float64) if kind == "real" else v for v, (kind, _, _) in zip(values, leaves)]
        result = write_encoded(path, text, build(widened), encodings)
    version = 1 if all(e == "f64" for e in encodings) else 2
    stored_text = text.replace("R[", "ℝ[")
    assert (result.version, result.count, result.type_text) == (version, n, stored_text)
    assert [e.label for e in result.encodings] == encodings
    sample_bytes = sum(math.prod(shape) * element_size(kind, bound, enc)
                       for (kind, shape, bound), enc in zip(leaves, encodings))
    data_bytes = path.read_bytes()
    assert len(data_bytes) == header_size(stored_text, len(leaves), version) + n * sample_bytes
    assert data_bytes[:6] == b"PSKD" + struct.pack("<H", version)
    assert sorted(os.listdir(directory)) == ["f.psk.d"]

    with Reader(path) as reader:
        assert (reader.header.version, reader.header.type_text, len(reader)) == (version, stored_text, n)
        assert reader.sample_bytes == sample_bytes and reader.trailing_bytes == 0
        for got, want, (kind, _, bound), enc in zip(reader.leaves(), values, leaves, encodings):
            assert not got.flags.writeable
            check_leaf(got, want, kind, bound, enc)
        flat_samples = flat(reader.samples(), len(leaves))
        for got, want, (kind, _, bound), enc in zip(flat_samples, values, leaves, encodings):
            check_leaf(got, want, kind, bound, enc)
        for k in range(n):
            sample = flat(reader[k], len(leaves))
            for got, want, (kind, _, bound), enc in zip(sample, values, leaves, encodings):
                check_leaf(got, want[k], kind, bound, enc)
        if n:
            indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=8))
            gathered = flat(reader.gather(indices), len(leaves))
            for got, want, (kind, shape, bound), enc in zip(gathered, values, leaves, encodings):
                assert got.shape == (len(indices), *shape)
                check_leaf(got, want[np.array(indices, dtype=np.intp)], kind, bound, enc)

    with Reader(path, access="pread") as reader:  # the same samples read with preadv
        for k in range(n):
            sample = flat(reader[k], len(leaves))
            for got, want, (kind, _, bound), enc in zip(sample, values, leaves, encodings):
                check_leaf(got, want[k], kind, bound, enc)
        if n:  # random indices, then a run of consecutive ones (one preadv) and its reverse
            indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=8)) + list(range(n)) + list(range(n))[::-1]
            gathered = flat(reader.gather(indices), len(leaves))
            for got, want, (kind, shape, bound), enc in zip(gathered, values, leaves, encodings):
                assert got.shape == (len(indices), *shape)
                check_leaf(got, want[np.array(indices, dtype=np.intp)], kind, bound, enc)

    if version == 1 and how != "write":
        # An all-f64 file is the same bytes whichever writer wrote it.
        write(directory / "g.psk.d", text, build(values))
        assert (directory / "g.psk.d").read_bytes() == data_bytes


def flat(tree, count: int) -> list:
    """The leaves of a closed-type value in storage order (tuples only)."""
    if count == 1 and not isinstance(tree, tuple):
        return [tree]
    out = []
    for item in tree:
        out.extend(flat(item, 1) if not isinstance(item, tuple) else flat(item, 2))
    return out


# --------------------------------------------------------------------------------------------
# Truncation and trailing bytes

GOLDEN = {"real": REAL2_V1, "windows": WINDOWS_V1, "idx300": IDX300, "idx64": IDX2_32_PLUS_1,
          "v2": V2_F32_BF16, "bool": BOOL2}


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
    assert str(path) in error.message and f"the header lists {leaves} leaves, the layout has 3" in error.message


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


# --------------------------------------------------------------------------------------------
# Access: __getitem__, gather


@pytest.fixture
def windows_file(tmp_path):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 64, size=(50, 3))
    values = rng.standard_normal(50).astype(np.float32)
    path = tmp_path / "w.psk.d"
    write(path, "(idx[64][seq: 3], ℝ[])", (tokens, values))
    return path, tokens, values


def test_getitem_negative_and_numpy_indices(windows_file):
    path, tokens, values = windows_file
    with Reader(path) as reader:
        assert reader[-1][0].tolist() == tokens[-1].tolist()
        assert reader[-50][0].tolist() == tokens[0].tolist()
        assert reader[np.int64(7)][0].tolist() == tokens[7].tolist()
        assert bits(reader[np.uint8(3)][1]) == bits(values[3])
        sample = reader[4]
        sample[0][0] = 99  # a fresh array: the file is not touched
        assert reader[4][0].tolist() == tokens[4].tolist()


@pytest.mark.parametrize("index", [50, 51, -51, 2**63, 1.5, 1.0, "1", None])
def test_getitem_refuses_bad_indices(windows_file, index):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9003", reader.__getitem__, index)
        assert str(path) in error.message


def test_gather_equals_stacking_getitem(windows_file):
    path, tokens, values = windows_file
    rng = np.random.default_rng(1)
    indices = np.concatenate([rng.integers(-50, 50, size=300), [0, 0, 49, -1, 49]])
    with Reader(path) as reader:
        got_tokens, got_values = reader.gather(indices)
        assert got_tokens.shape == (305, 3) and got_tokens.dtype == np.uint8
        assert got_values.shape == (305,) and got_values.dtype == np.float32
        assert got_tokens.flags.writeable and got_tokens.flags.c_contiguous
        stacked = [reader[int(i)] for i in indices]
        assert got_tokens.tolist() == [s[0].tolist() for s in stacked]
        assert bits(got_values) == [bits(s[1]) for s in stacked]
        assert bits(got_values) == bits(values[indices])


def test_gather_is_vectorised(windows_file, monkeypatch):
    path, tokens, _ = windows_file
    with Reader(path) as reader:
        def per_sample(*args):
            raise AssertionError("gather went through a per-sample path")

        monkeypatch.setattr(Reader, "__getitem__", per_sample)
        monkeypatch.setattr(Reader, "_check_index", per_sample)
        got, _ = reader.gather(np.arange(50)[::-1])
        assert got.tolist() == tokens[::-1].tolist()


def test_gather_empty_and_dtypes(windows_file):
    path, _, _ = windows_file
    with Reader(path) as reader:
        for empty in ([], np.array([], np.int64), np.zeros(0)):
            got_tokens, got_values = reader.gather(empty)
            assert got_tokens.shape == (0, 3) and got_values.shape == (0,)
        got_tokens, _ = reader.gather(np.array([1, 2], np.uint16))
        assert got_tokens.shape == (2, 3)
        got_tokens, _ = reader.gather(range(3))
        assert got_tokens.shape == (3, 3)


@pytest.mark.parametrize("indices", [[0, 50], [-51], [2**40], [2**64 - 1], [0.5], [1.0], ["1"], [True, False],
                                     3, [[0, 1], [2, 3]]])
def test_gather_refuses_bad_indices(windows_file, indices):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9003", reader.gather, indices)
        assert str(path) in error.message


def test_samples_and_leaves_are_views_of_the_map(windows_file):
    path, tokens, _ = windows_file
    with Reader(path) as reader:
        leaves = reader.leaves()
        assert [leaf.shape for leaf in leaves] == [(50, 3), (50,)]
        assert not leaves[0].flags.writeable and not leaves[0].flags.owndata
        with pytest.raises(ValueError):
            leaves[0][0, 0] = 1
        assert reader.samples()[0].tolist() == tokens.tolist()


# --------------------------------------------------------------------------------------------
# Writing: values refused, structure refused, all or nothing


def test_narrowing_refused_on_write_names_file_leaf_index_value(tmp_path):
    path = tmp_path / "n.psk.d"
    error = raises("E9004", write_encoded, path, "(ℝ[], ℝ[2])",
                   (np.array([1.0, 2.0]), np.array([[0.5, 0.25], [1.0, 0.1]])), ["f64", "bf16"])
    assert f"{path}: leaf [1] at index [1, 1]" in error.message
    assert "0.1 is not a number of bf16" in error.message
    assert not path.exists() and os.listdir(tmp_path) == []


def test_round_to_encoding_on_write(tmp_path):
    path = tmp_path / "r.psk.d"
    values = np.array([[0.1, 1.0], [-(1.0 + 2.0**-8 + 2.0**-30), 2.0**-134]])
    result = write_encoded(path, "ℝ[2]", values, ["bf16"], round_to_encoding=True)
    (report,) = result.rounding
    assert report.leaf == f"{path}: leaf (root)"
    assert report.max_error == 2.0**-8 - 2.0**-30
    assert report.where == (1, 0)
    with Reader(path) as reader:
        assert bits(reader.samples()) == [[0x3DCD, 0x3F80], [0xBF81, 0x0000]]


def test_round_to_encoding_report_over_streamed_batches(tmp_path):
    path = tmp_path / "s.psk.d"
    batches = [np.array([[1.0]]), np.array([[1.0 + 2.0**-9], [1.0 + 3 * 2.0**-9]]), np.array([[2.0]])]
    result = write_stream(path, "ℝ[1]", batches, encodings=["bf16"], round_to_encoding=True)
    (report,) = result.rounding
    assert report.max_error == 2.0**-9 and report.where == (1, 0)  # the first of the two errors of 2^-9
    assert result.count == 4


@pytest.mark.parametrize("encoding, dtype", [("f64", np.float64), ("f32", np.float32), ("bf16", BF16)])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_refused_on_write(tmp_path, encoding, dtype, bad):
    path = tmp_path / "nan.psk.d"
    reals = np.array([[0.0, 1.0], [bad, 2.0]], dtype)
    error = raises("E9004", write_encoded, path, "(idx[2][], ℝ[2])", (np.array([0, 1]), reals),
                   ["f64", encoding])
    assert f"{path}: leaf [1] at index [1, 0]" in error.message
    assert not path.exists()


@pytest.mark.parametrize("value, shown", [(4, "4 is not an index below 4"), (-1, "-1 is not an index below 4"),
                                          (2**70, "is not an index below 4")])
def test_index_out_of_bound_on_write(tmp_path, value, shown):
    path = tmp_path / "i.psk.d"
    error = raises("E9004", write, path, "(ℝ[], idx[4][2])", ([0.0, 1.0, 2.0], [[0, 1], [2, 3], [value, 0]]))
    assert f"{path}: leaf [1] at index [2, 0]" in error.message and shown in error.message


def test_reals_for_an_idx_leaf(tmp_path):
    path = tmp_path / "i.psk.d"
    error = raises("E9005", write, path, "idx[4][2]", np.array([[0.0, 1.0]]))
    assert f"{path}: leaf (root)" in error.message and "idx[4]" in error.message


@pytest.mark.parametrize(
    "samples, words",
    [
        ((np.zeros((2, 2)),), "at (root): expected a tuple of 2, got a tuple of 1"),
        ((np.zeros((2, 2)), np.zeros(2), np.zeros(2)), "expected a tuple of 2, got a tuple of 3"),
        (np.zeros((2, 2)), "at (root): expected a tuple of 2, got ndarray"),
        ((np.zeros((2, 3)), np.zeros(2)), "at [0]: expected shape (2,), got (3,)"),
        ((np.zeros((2, 2)), np.zeros((2, 1))), "at [1]: expected shape (), got (1,)"),
        ((np.zeros((2, 2)), np.zeros(3)), "leaf [1] has 3 samples, the first leaf 2"),
        ((np.zeros((2, 2)), np.float64(1.0)), "leaf [1]: no batch axis"),
        ((np.zeros((2, 2)), (np.zeros(2), np.zeros(2))), "at [1]: expected an array, got a tuple"),
    ],
)
def test_structure_mismatch_names_the_key_path(tmp_path, samples, words):
    path = tmp_path / "m.psk.d"
    for writer in (write, lambda *a: write_encoded(*a, ["f64", "f64"])):
        error = raises("E9005", writer, path, "(ℝ[2], ℝ[])", samples)
        assert error.message.startswith(f"{path}: ")
        assert words in error.message
    assert os.listdir(tmp_path) == []


def test_nested_key_path(tmp_path):
    error = raises("E9005", write, tmp_path / "n.psk.d", "(ℝ[], (idx[3][2], ℝ[]))",
                   ([1.0], ([[0, 1, 2]], [1.0])))
    assert "at [1][0]: expected shape (2,), got (3,)" in error.message


def test_encodings_that_do_not_fit_the_type(tmp_path):
    error = raises("E9005", write_encoded, tmp_path / "e.psk.d", "(ℝ[], ℝ[])", ([1.0], [2.0]), ["f32"])
    assert "1 leaf encodings for a type of 2 leaves" in error.message
    raises("E9004", write_encoded, tmp_path / "e.psk.d", "ℝ[]", [1.0], ["f16"])
    error = raises("E9005", write_encoded, tmp_path / "e.psk.d", "idx[3][]", [1], ["bf16"])
    assert "leaf (root) is idx[3]" in error.message
    assert os.listdir(tmp_path) == []


def test_an_empty_encoding_list_means_every_leaf_f64(tmp_path):
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    write_encoded(a, "(ℝ[2], idx[3][])", (np.ones((2, 2)), np.array([1, 2])), [])
    write(b, "(ℝ[2], idx[3][])", (np.ones((2, 2)), np.array([1, 2])))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes()[4:6] == b"\x01\x00"


def test_a_params_file_read_with_the_wrong_template_is_refused(tmp_path):
    path = tmp_path / "p.psk.d"
    template = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    write(path, "params M", {k: v[None] for k, v in template.items()}, layout=template)
    smaller = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    error = raises("E9005", Reader, path, layout=smaller)
    assert "28 bytes" in error.message and "36 bytes" in error.message
    larger = {"w": np.zeros((2, 4), np.float32), "b": np.zeros(3, np.float32)}
    raises("E9003", Reader, path, layout=larger)
    with Reader(path, layout=template) as reader:
        assert reader[0]["w"].shape == (2, 3)


def test_writer_refuses_open_types(tmp_path):
    error = raises("E9001", write, tmp_path / "t.psk.d", "ℝ[model: D]", [[1.0]])
    assert "column 10" in error.message
    raises("E9001", Writer, tmp_path / "t.psk.d", "params M")
    assert os.listdir(tmp_path) == []


def test_streaming_writer_failing_in_the_second_batch_leaves_nothing(tmp_path):
    path = tmp_path / "s.psk.d"
    batches = [np.array([[1.0, 2.0]]), np.array([[3.0, math.nan]])]
    error = raises("E9004", write_stream, path, "ℝ[2]", batches)
    assert f"{path}: leaf (root) at index [1, 1]" in error.message  # sample 1 of the file
    assert os.listdir(tmp_path) == []


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "keep.psk.d"
    path.write_bytes(REAL2_V1)
    raises("E9004", write_stream, path, "ℝ[2]", [np.array([[1.0, 2.0]]), np.array([[3.0, 0.1]], np.float64)],
           encodings=["f32"])
    raises("E9005", write, path, "ℝ[2]", np.zeros((1, 3)))
    with pytest.raises(RuntimeError, match="boom"):
        with Writer(path, "ℝ[2]") as writer:
            writer.append(np.array([[5.0, 6.0]]))
            raise RuntimeError("boom")
    assert path.read_bytes() == REAL2_V1
    assert os.listdir(tmp_path) == ["keep.psk.d"]


def test_exception_inside_writer_leaves_nothing(tmp_path):
    path = tmp_path / "w.psk.d"
    with pytest.raises(KeyboardInterrupt):
        with Writer(path, "ℝ[2]") as writer:
            writer.append(np.array([[5.0, 6.0]]))
            writer.flush()
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_streaming_writer_appends_and_replaces(tmp_path):
    path = tmp_path / "s.psk.d"
    path.write_bytes(b"old")
    with Writer(path, "R[2]") as writer:
        writer.append(np.array([[1.0, -2.0]]))
        writer.flush()
        assert path.read_bytes() == b"old"  # nothing is visible before close
        writer.append(np.array([[0.5, 3.0]]))
    assert writer.result.count == 2
    assert path.read_bytes() == REAL2_V1
    assert os.listdir(tmp_path) == ["s.psk.d"]
    raises("E9003", writer.close)


# --------------------------------------------------------------------------------------------
# Values rounded once to f64 on the way in


def test_values_of_other_types_round_once_to_f64(tmp_path):
    from decimal import Decimal
    from fractions import Fraction

    class Precise:
        def __float__(self):
            return float.fromhex("0x1.5555555555555p-2")

    path = tmp_path / "x.psk.d"
    values = [[Fraction(1, 3), Decimal("0.1"), "1e23", 2**53 + 1, np.longdouble(1) / 3, Precise()]]
    write(path, "ℝ[6]", values)
    assert path.read_bytes()[-48:] == h(
        "55 55 55 55 55 55 d5 3f | 9a 99 99 99 99 99 b9 3f | f6 4a e1 c7 02 2d b5 44"
        "| 00 00 00 00 00 00 40 43 | 55 55 55 55 55 55 d5 3f | 55 55 55 55 55 55 d5 3f")


# --------------------------------------------------------------------------------------------
# Every code from the API


def test_every_error_code_is_reached(tmp_path):
    good = put(tmp_path, REAL2_V1, "good.psk.d")
    codes = {
        raises("E9001", write, tmp_path / "a.psk.d", "ℝ[D]", [[1.0]]).code,
        raises("E9002", Reader, put(tmp_path, b"PSKX" + REAL2_V1[4:], "b.psk.d")).code,
        raises("E9003", Reader(good).__getitem__, 2).code,
        raises("E9004", write, tmp_path / "c.psk.d", "idx[2][]", [2]).code,
        raises("E9005", write, tmp_path / "d.psk.d", "ℝ[2]", np.zeros((1, 3))).code,
    }
    assert codes == {"E9001", "E9002", "E9003", "E9004", "E9005"}
    assert sorted(os.listdir(tmp_path)) == ["b.psk.d", "good.psk.d"]


def test_views_outlive_the_reader_that_made_them(tmp_path):
    path = tmp_path / "v.psk.d"
    write(path, "(ℝ[3], idx[5][])", (np.ones((4, 3)), np.arange(4)))
    reader = Reader(path)
    reals, indices = reader.leaves()
    reader.close()
    assert reals.sum() == 12.0 and indices.tolist() == [0, 1, 2, 3]


def test_big_endian_float_arrays_keep_their_encoding(tmp_path):
    path = tmp_path / "be.psk.d"
    values = np.array([[1.5, -2.25]], dtype=">f4")
    result = write(path, "ℝ[2]", values)
    assert result.version == 2 and [e.label for e in result.encodings] == ["f32"]
    with Reader(path) as reader:
        assert reader[0].tolist() == [1.5, -2.25]


# --------------------------------------------------------------------------------------------
# access="pread" and bound checks of gathered idx values


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pread_gathers_what_the_map_gathers(windows_file):
    path, tokens, values = windows_file
    rng = np.random.default_rng(3)
    indices = np.concatenate([rng.integers(-50, 50, size=200), np.arange(10, 40), [49, 0, 1, 2, -1]])
    with Reader(path) as mapped, Reader(path, access="pread") as read:
        assert read.access == "pread" and mapped.access == "mmap"
        got_tokens, got_values = read.gather(indices)
        want_tokens, want_values = mapped.gather(indices)
        assert got_tokens.tolist() == want_tokens.tolist() == tokens[indices].tolist()
        assert bits(got_values) == bits(want_values) == bits(values[indices])
        assert got_tokens.flags.writeable and got_tokens.flags.c_contiguous
        assert [x.tolist() for x in read[-3]] == [x.tolist() for x in mapped[-3]]
        assert read[7][1].shape == ()  # a 0-d array, as from the map
        assert [len(x) for x in read.gather([])] == [0, 0]


def test_pread_reads_each_run_with_one_call(windows_file, monkeypatch):
    path, tokens, _ = windows_file
    calls = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: calls.append(offset) or real(fd, buffers, offset))
    with Reader(path, access="pread") as reader:
        got, _ = reader.gather([5, 6, 7, 8, 20, 21, 3])
    assert got.tolist() == tokens[[5, 6, 7, 8, 20, 21, 3]].tolist()
    assert len(calls) == 3


def test_pread_of_a_file_cut_short_after_opening(windows_file):
    path, _, _ = windows_file
    with Reader(path, access="pread") as reader:
        os.truncate(path, os.path.getsize(path) - 3)
        reader.gather([0, 1])  # still whole
        error = raises("E9003", reader.gather, [48, 49])
        assert str(path) in error.message and "cut short" in error.message


def test_pread_reader_pickles_with_its_access_and_closes_its_descriptor(windows_file):
    import pickle

    path, tokens, _ = windows_file
    before = open_descriptors()
    with Reader(path):
        mapped = open_descriptors() - before  # CPython's mmap keeps a descriptor of its own
    reader = Reader(path, access="pread")
    assert open_descriptors() == before + mapped  # both keep the file's descriptor (size checks, refresh)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.access == "pread" and copy.gather([2])[0].tolist() == tokens[[2]].tolist()
    copy.close()
    reader.close()
    assert open_descriptors() == before


def test_an_unknown_access_mode_is_refused(windows_file):
    path, _, _ = windows_file
    error = raises("E9012", Reader, path, access="read")
    assert "mmap, pread" in error.message


def bad_index_file(tmp_path):
    """idx[10] tokens stored in u8, one of them 12: only a hand-made or damaged file holds it."""
    path = tmp_path / "bad.psk.d"
    tokens = np.arange(12, dtype=np.uint8).reshape(4, 3) % 10
    tokens[2, 1] = 12
    put_bytes = encode_header("(idx[10][3], ℝ[])", 4, []) + b"".join(
        row.tobytes() + struct.pack("<d", 0.5) for row in tokens)
    path.write_bytes(put_bytes)
    return path


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_gathered_idx_values_are_checked_against_their_bound(tmp_path, access):
    path = bad_index_file(tmp_path)
    with Reader(path, access=access) as reader:
        assert reader.gather([0, 1, 3])[0].max() < 10  # the good samples read
        error = raises("E9004", reader.gather, [0, 2])
        assert str(path) in error.message and "sample 2" in error.message and "12" in error.message
        assert "idx[10]" in error.message and "[0]" in error.message  # the leaf's path
        raises("E9004", reader.__getitem__, -2)


def test_a_bound_that_fills_its_dtype_is_not_checked(tmp_path, monkeypatch):
    path = tmp_path / "full.psk.d"
    write(path, "idx[256][4]", np.full((3, 4), 255))
    with Reader(path) as reader:
        assert reader._bounded == []
        assert reader.gather([2, 1])[0].tolist() == [255] * 4


def resident_file_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_pread_keeps_the_file_out_of_the_resident_set(tmp_path):
    path = tmp_path / "big.psk.d"
    write(path, "idx[65536][seq: 1025]", np.zeros((32768, 1025), np.uint16))  # 64 MiB
    indices = np.random.default_rng(0).integers(0, 32768, size=(40, 64))
    grown = {}
    for access in ("pread", "mmap"):
        with Reader(path, access=access) as reader:
            before = resident_file_bytes()
            for batch in indices:
                reader.gather(batch)
            grown[access] = resident_file_bytes() - before
    assert grown["pread"] < 2 << 20, grown
    assert grown["mmap"] > grown["pread"] + (4 << 20), grown  # what pread saves: the map's pages
