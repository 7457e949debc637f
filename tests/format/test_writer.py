"""The writers (write, write_encoded, write_stream, Writer): golden bytes, values and structures
refused naming file, leaf and index, rounding on request, and all-or-nothing output."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from pskd_jax.format.encodings import Encoding
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import Writer, write, write_encoded, write_stream
from tests.helpers import raises

from .golden import BF16, BOOL2, IDX2_32_PLUS_1, IDX300, REAL2_V1, V2_F32_BF16, WINDOWS_V1, bits, h, put


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
        ((np.zeros((2, 2)),), "at (root): expected a tuple of 2 values, got a tuple of 1 values"),
        ((np.zeros((2, 2)), np.zeros(2), np.zeros(2)), "expected a tuple of 2 values, got a tuple of 3 values"),
        (np.zeros((2, 2)), "at (root): expected a tuple of 2 values, got ndarray"),
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


def test_big_endian_float_arrays_keep_their_encoding(tmp_path):
    path = tmp_path / "be.psk.d"
    values = np.array([[1.5, -2.25]], dtype=">f4")
    result = write(path, "ℝ[2]", values)
    assert result.version == 2 and [e.label for e in result.encodings] == ["f32"]
    with Reader(path) as reader:
        assert reader[0].tolist() == [1.5, -2.25]
