"""The Reader: golden files read, indexing and gather through the map and through pread, views,
bound checks of gathered indices, and what pread keeps out of memory."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from pskd_jax.errors import TruncatedError, UsageError
from pskd_jax.format import source as source_module
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import encode_header
from pskd_jax.format.reader import Reader
from pskd_jax.format.source import RandomAccessSource
from pskd_jax.format.writer import write
from tests.helpers import raises

from .golden import BF16, BOOL2, IDX2_32_PLUS_1, IDX300, REAL2_V1, V2_F32_BF16, WINDOWS_V1, bits, h, put


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
    data = (b"PSKD" + h("01 00") + struct.pack("<I", len(type_bytes)) + type_bytes + h("01 00 00 00 00 00 00 00")
            + h(element))
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


@pytest.mark.parametrize("index", [50, 51, -51, 2**63, -2**70, np.uint64(2**64 - 1)])
def test_getitem_past_the_end_is_E9003_and_an_IndexError(windows_file, index):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9003", reader.__getitem__, index)
        assert isinstance(error, IndexError) and isinstance(error, TruncatedError)
        assert str(path) in error.message and "beyond the 50 samples (indices from -50 to 49)" in error.message


@pytest.mark.parametrize("index", [1.5, 1.0, "1", None, True, np.bool_(False), slice(0, 2), np.array([1, 2])])
def test_getitem_of_a_non_integer_is_E9012_and_a_TypeError(windows_file, index):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9012", reader.__getitem__, index)
        assert isinstance(error, TypeError) and isinstance(error, UsageError)
        assert str(path) in error.message and "index is an integer" in error.message


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

        monkeypatch.setattr(RandomAccessSource, "__getitem__", per_sample)
        monkeypatch.setattr(source_module, "checked_index", per_sample)
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


@pytest.mark.parametrize("indices", [[0, 50], [-51], [2**40], [2**64 - 1], [2**64], [-2**63 - 1],
                                     np.array([3, 50], np.uint8)])
def test_gather_past_the_end_is_E9003_and_an_IndexError(windows_file, indices):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9003", reader.gather, indices)
        assert isinstance(error, IndexError) and str(path) in error.message and "beyond the 50 samples" in error.message


@pytest.mark.parametrize("indices", [[0.5], [1.0], ["1"], [True, False], 3, [[0, 1], [2, 3]], [1, "a"], [None]])
def test_gather_of_non_integers_is_E9012_and_a_TypeError(windows_file, indices):
    path, _, _ = windows_file
    with Reader(path) as reader:
        error = raises("E9012", reader.gather, indices)
        assert isinstance(error, TypeError) and str(path) in error.message


def test_samples_and_leaves_are_views_of_the_map(windows_file):
    path, tokens, _ = windows_file
    with Reader(path) as reader:
        leaves = reader.leaves()
        assert [leaf.shape for leaf in leaves] == [(50, 3), (50,)]
        assert not leaves[0].flags.writeable and not leaves[0].flags.owndata
        with pytest.raises(ValueError):
            leaves[0][0, 0] = 1
        assert reader.samples()[0].tolist() == tokens.tolist()


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


def test_views_outlive_the_reader_that_made_them(tmp_path):
    path = tmp_path / "v.psk.d"
    write(path, "(ℝ[3], idx[5][])", (np.ones((4, 3)), np.arange(4)))
    reader = Reader(path)
    reals, indices = reader.leaves()
    reader.close()
    assert reals.sum() == 12.0 and indices.tolist() == [0, 1, 2, 3]


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
    assert mapped == 2 and open_descriptors() == before + 1  # the file's descriptor, no map (and its own)
    reader.leaves()  # a view asked of a pread reader maps the file
    assert open_descriptors() == before + mapped
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
