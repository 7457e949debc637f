"""diff compares types by structure, pairs checkpoint leaves by key path through each file's own
layout, reports leaves found in one file only, and keeps its numbers and its work in bounds:
scaled before subtracting, one rule for non-finite values, no numpy warning, reads in proportion
to the bytes present and chunked inside a sample."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import pskd_jax
from pskd_jax.data import distance as D
from pskd_jax.errors import PskdError
from pskd_jax.format import Layout
from pskd_jax.format.header import encode_header
from pskd_jax.format.layout_file import find_layout_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def raw_file(path, sample_type: str, data: np.ndarray, count: int | None = None, encodings=()) -> pathlib.Path:
    """A file written byte by byte: any values, NaN and infinities included (as another tool may)."""
    data = np.ascontiguousarray(data)
    count = len(data) if count is None else count
    path.write_bytes(encode_header(sample_type, count, list(encodings)) + data.tobytes())
    return path


@pytest.fixture
def strict_numbers():
    """Any numpy floating-point warning or error fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            yield


def expected(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.linalg.norm(a - b)), float(np.linalg.norm(a))


# --- types by structure ---------------------------------------------------------------------------


@pytest.mark.parametrize("type_a, type_b", [
    ("(idx[64][seq: 8], ℝ[model: 3])", "(idx[64][8], R[3])"),
    ("(idx[64][seq: 8], ℝ[model: 3])", "( idx[64] [ time:8 ] ,ℝ[ d : 3 ] )"),
    ("(bool[seq: 8], ℝ[3])", "(idx[2][8], ℝ[3])"),
])
def test_types_that_differ_in_axis_names_or_spacing_compare(tmp_path, type_a, type_b):
    rng = np.random.default_rng(0)
    bound = 2 if "bool" in type_a else 64
    tokens, reals_a, reals_b = rng.integers(0, bound, (5, 8)), rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    pskd_jax.write(tmp_path / "a.psk.d", type_a, (tokens, reals_a))
    pskd_jax.write(tmp_path / "b.psk.d", type_b, (tokens, reals_b))
    got = pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    diff_norm, a_norm = expected(reals_a, reals_b)
    assert got.elements == 15 and got.only_a == got.only_b == ()
    assert got.diff_norm == pytest.approx(diff_norm, rel=1e-15) and got.a_norm == pytest.approx(a_norm, rel=1e-15)


@pytest.mark.parametrize("type_a, type_b", [
    ("ℝ[3]", "ℝ[4]"), ("ℝ[2, 3]", "ℝ[3, 2]"), ("(ℝ[2], idx[3][])", "(ℝ[2], idx[4][])"),
    ("(ℝ[2], ℝ[1])", "(ℝ[1], ℝ[2])"), ("ℝ[3]", "(ℝ[3], ℝ[])"),
])
def test_types_of_another_structure_are_refused(tmp_path, type_a, type_b):
    for path, text in ((tmp_path / "a.psk.d", type_a), (tmp_path / "b.psk.d", type_b)):
        layout = Layout.of_type(text)
        arrays = [np.zeros((2, *leaf.shape), np.float64 if leaf.is_real else np.uint8) for leaf in layout.leaves]
        pskd_jax.write(path, text, layout.unflatten(arrays))
    with pytest.raises(PskdError) as caught:
        pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    assert caught.value.code == "E9005" and "differ in structure" in caught.value.message


def test_different_counts_are_refused(tmp_path):
    pskd_jax.write(tmp_path / "a.psk.d", "ℝ[2]", np.zeros((3, 2)))
    pskd_jax.write(tmp_path / "b.psk.d", "ℝ[2]", np.zeros((4, 2)))
    with pytest.raises(PskdError, match="E9005.*3 samples.*4"):
        pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")


# --- checkpoints by key path ------------------------------------------------------------------------


def checkpoint(path, tree) -> tuple[pathlib.Path, Layout]:
    pskd_jax.save(path, tree)
    return path, find_layout_file(path).layout


def test_checkpoints_with_their_leaves_in_another_order_pair_by_key_path(tmp_path):
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.0, -2.0], np.float64)
    a_path, a_layout = checkpoint(tmp_path / "a.psk.d", {"w": w, "b": b, "step": np.int32(3)})
    b_path, b_layout = checkpoint(tmp_path / "b.psk.d", {"step": np.int32(4), "b": b + 1, "w": w * 2})
    assert [leaf.path for leaf in a_layout.leaves] != [leaf.path for leaf in b_layout.leaves]
    got = pskd_jax.diff(a_path, b_path, layout_a=a_layout, layout_b=b_layout)
    diff_norm, a_norm = expected(np.concatenate([w.ravel(), b]), np.concatenate([(w * 2).ravel(), b + 1]))
    assert got.elements == 8 and got.only_a == got.only_b == ()
    assert got.diff_norm == pytest.approx(diff_norm, rel=1e-15) and got.a_norm == pytest.approx(a_norm, rel=1e-15)


def test_leaves_found_in_one_file_only_are_reported_and_the_rest_compared(tmp_path):
    shared = np.array([3.0, 4.0])
    a_path, a_layout = checkpoint(tmp_path / "a.psk.d", {"x": shared, "old": np.ones(5), "n": np.int64(1)})
    b_path, b_layout = checkpoint(tmp_path / "b.psk.d", {"new": np.ones(2, np.float32), "x": shared * 0})
    got = pskd_jax.diff(a_path, b_path, layout_a=a_layout, layout_b=b_layout)
    assert got.only_a == ("['old']", "['n']") and got.only_b == ("['new']",)
    assert (got.diff_norm, got.a_norm, got.relative, got.elements) == (5.0, 5.0, 1.0, 2)


def test_a_key_path_of_another_shape_is_refused_naming_it(tmp_path):
    a_path, a_layout = checkpoint(tmp_path / "a.psk.d", {"w": np.zeros((2, 3))})
    b_path, b_layout = checkpoint(tmp_path / "b.psk.d", {"w": np.zeros((3, 2))})
    with pytest.raises(PskdError) as caught:
        pskd_jax.diff(a_path, b_path, layout_a=a_layout, layout_b=b_layout)
    assert caught.value.code == "E9005" and "['w']" in caught.value.message and "[2, 3]" in caught.value.message


def test_params_files_without_layouts_compare_flat(tmp_path):
    template = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    pskd_jax.write(a, "params M", {"w": np.full((1, 2, 3), 2.0, np.float32), "b": np.zeros((1, 3), np.float32)},
                   layout=template)
    pskd_jax.write(b, "params M", {"w": np.full((1, 2, 3), 2.0, np.float32), "b": np.ones((1, 3), np.float32)},
                   layout=template)
    got = pskd_jax.diff(a, b)
    assert got.without_layout and (got.diff_norm, got.a_norm, got.elements) == (3 ** 0.5, 24 ** 0.5, 9)
    with pytest.raises(PskdError, match="E9001.*b.psk.d.*needs its own layout"):
        pskd_jax.diff(a, b, layout_a=template)


# --- idx leaves, exactly -----------------------------------------------------------------------------


def test_idx_and_bool_leaves_are_compared_exactly_and_their_differences_counted(tmp_path):
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    reals = np.array([0.5, 1.5])
    pskd_jax.write(a, "(idx[10][2], bool[], ℝ[])", (np.array([[1, 2], [3, 4]]), np.array([True, False]), reals))
    pskd_jax.write(b, "(idx[10][2], bool[], ℝ[])", (np.array([[1, 7], [3, 4]]), np.array([True, True]), reals))
    got = pskd_jax.diff(a, b)
    assert (got.diff_norm, got.elements) == (0.0, 2)  # the reals agree
    assert (got.exact.elements, got.exact.differing) == (6, 2)
    assert got.exact.first == "leaf [0], sample 0, element 1: a holds 2, b holds 7"
    assert got.exact.not_compared == ()
    same = pskd_jax.diff(a, a)
    assert (same.exact.elements, same.exact.differing, same.exact.first) == (6, 0, None)


def test_a_checkpoints_integer_leaves_are_compared_exactly_and_shown_as_restored(tmp_path):
    a_path, _ = checkpoint(tmp_path / "a.psk.d", {"w": np.ones(2, np.float32), "q": np.array([-3, 4], np.int8),
                                                  "ok": np.array([True, False]), "n": 10**30})
    b_path, _ = checkpoint(tmp_path / "b.psk.d", {"w": np.ones(2, np.float32), "q": np.array([-3, -4], np.int8),
                                                  "ok": np.array([True, True]), "n": 10**30 + 1})
    got = pskd_jax.diff(a_path, b_path, layout_a=find_layout_file(a_path), layout_b=find_layout_file(b_path))
    assert (got.diff_norm, got.elements) == (0.0, 2)
    # q's second element, ok's second, and the low limb of n's two
    assert (got.exact.elements, got.exact.differing) == (6, 3)
    assert got.exact.first == "leaf ['q'], sample 0, element 1: a holds 4, b holds -4"
    c_path, _ = checkpoint(tmp_path / "c.psk.d", {"n": 10**30})
    d_path, _ = checkpoint(tmp_path / "d.psk.d", {"n": 10**30 + 1})
    got = pskd_jax.diff(c_path, d_path, layout_a=find_layout_file(c_path), layout_b=find_layout_file(d_path))
    assert got.exact.first == f"leaf ['n'], sample 0, element 0: a holds {10**30}, b holds {10**30 + 1}"


def test_a_narrow_float_leaf_is_compared_bit_for_bit(tmp_path):
    a_path, _ = checkpoint(tmp_path / "a.psk.d", {"f": np.array([1.0, 0.0], ml_dtypes.float8_e4m3fn)})
    b_path, _ = checkpoint(tmp_path / "b.psk.d", {"f": np.array([1.0, -0.0], ml_dtypes.float8_e4m3fn)})
    got = pskd_jax.diff(a_path, b_path, layout_a=find_layout_file(a_path), layout_b=find_layout_file(b_path))
    assert (got.exact.elements, got.exact.differing) == (2, 1)
    assert got.exact.first == "leaf ['f'], sample 0, element 1: a holds 0.0, b holds -0.0"


def test_leaves_of_one_key_path_and_other_dtypes_are_named_as_not_compared(tmp_path):
    # uint8 255 and int8 -1 are both stored as idx[256] 255: equal patterns, other values.
    a_path, _ = checkpoint(tmp_path / "a.psk.d", {"x": np.array([255], np.uint8), "y": np.int16(1)})
    b_path, _ = checkpoint(tmp_path / "b.psk.d", {"x": np.array([-1], np.int8), "y": np.int32(1)})
    got = pskd_jax.diff(a_path, b_path, layout_a=find_layout_file(a_path), layout_b=find_layout_file(b_path))
    assert got.exact.not_compared == ("['x'] (uint8 in a, int8 in b)", "['y'] (int16 in a, int32 in b)")
    assert (got.exact.elements, got.exact.differing) == (0, 0)


def test_an_idx_value_beyond_its_bound_is_refused_even_where_both_files_hold_it(tmp_path):
    # Two copies of one damaged file: every reader refuses the value, so must diff (never "equal").
    a = raw_file(tmp_path / "a.psk.d", "(ℝ[], bool[2])", np.frombuffer(np.float64(0.5).tobytes() + bytes([1, 2]), "u1"),
                 count=1)
    b = raw_file(tmp_path / "b.psk.d", "(ℝ[], bool[2])", np.frombuffer(np.float64(0.5).tobytes() + bytes([1, 2]), "u1"),
                 count=1)
    with pytest.raises(PskdError) as caught:
        pskd_jax.diff(a, b)
    assert caught.value.code == "E9004"
    assert caught.value.message == f"{a}: leaf [1], sample 0, element 1: stored value 2 is not below its bound idx[2]"


def test_python_ints_of_other_widths_are_named_with_how_each_is_stored(tmp_path):
    a_path, _ = checkpoint(tmp_path / "a.psk.d", {"n": -5})
    b_path, _ = checkpoint(tmp_path / "b.psk.d", {"n": 300})
    got = pskd_jax.diff(a_path, b_path, layout_a=find_layout_file(a_path), layout_b=find_layout_file(b_path))
    assert got.exact.not_compared == ("['n'] (int as idx[256][] in a, int as idx[65536][] in b)",)


def test_flat_f64_comparison_says_an_idx_leaf_would_be_read_as_reals(tmp_path):
    template = {"w": np.zeros(2), "n": np.zeros(8, np.uint8)}
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    pskd_jax.write(a, "params M", {"w": np.zeros((1, 2)), "n": np.zeros((1, 8), np.uint8)}, layout=template)
    pskd_jax.write(b, "params M", {"w": np.zeros((1, 2)), "n": np.ones((1, 8), np.uint8)}, layout=template)
    got = pskd_jax.diff(a, b)
    assert got.without_layout and got.elements == 3  # the idx leaf's 8 bytes read as one f64
    assert any("every leaf was read as f64" in note for note in got.notes)


# --- numbers ----------------------------------------------------------------------------------------


def test_opposite_extremes_are_scaled_before_subtracting(tmp_path, strict_numbers):
    a = raw_file(tmp_path / "a.psk.d", "ℝ[1]", np.array([[1e308]]))
    b = raw_file(tmp_path / "b.psk.d", "ℝ[1]", np.array([[-1e308]]))
    got = pskd_jax.diff(a, b)
    assert got.diff_norm == math.inf and got.a_norm == 1e308 and got.relative == 2.0
    assert any("beyond the largest f64" in note for note in got.notes)


def test_squares_beyond_f64_and_below_it_give_the_exact_norm(tmp_path, strict_numbers):
    values = np.array([[1e300, -1e300, 3e-300, 1e-310]])
    a = raw_file(tmp_path / "a.psk.d", "ℝ[4]", values)
    b = raw_file(tmp_path / "b.psk.d", "ℝ[4]", np.zeros_like(values))
    got = pskd_jax.diff(a, b)
    assert got.diff_norm == got.a_norm == math.hypot(1e300, 1e300) and got.relative == 1.0 and got.notes == ()


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_a_file_holding_an_infinity_against_itself_is_at_distance_zero(tmp_path, strict_numbers, value):
    a = raw_file(tmp_path / "a.psk.d", "ℝ[3]", np.array([[1.0, value, 2.0], [value, 0.0, 0.0]]))
    got = pskd_jax.diff(a, a)
    assert (got.diff_norm, got.a_norm, got.relative) == (0.0, math.inf, 0.0)
    assert got.notes == (f"a holds {value!r}, so ‖a‖₂ is inf (leaf (root), sample 0, element 1)",)


def test_unequal_infinities_make_the_distance_infinite(tmp_path, strict_numbers):
    a = raw_file(tmp_path / "a.psk.d", "ℝ[2]", np.array([[1.0, math.inf], [2.0, 5.0]]))
    b = raw_file(tmp_path / "b.psk.d", "ℝ[2]", np.array([[1.0, -math.inf], [2.0, 5.0]]))
    got = pskd_jax.diff(a, b)
    assert (got.diff_norm, got.a_norm) == (math.inf, math.inf) and math.isnan(got.relative)
    assert "a holds inf where b holds -inf, so ‖a − b‖₂ is inf (leaf (root), sample 0, element 1)" in got.notes
    c = raw_file(tmp_path / "c.psk.d", "ℝ[2]", np.array([[1.0, 3.0], [2.0, -math.inf]]))
    got = pskd_jax.diff(c, a)  # an infinity in b against a finite value in a
    assert got.diff_norm == math.inf and got.a_norm == math.inf and math.isnan(got.relative)
    assert any("b holds inf" in note and "sample 0, element 1" in note for note in got.notes)


def test_nan_makes_the_distance_nan_and_says_where(tmp_path, strict_numbers):
    a = raw_file(tmp_path / "a.psk.d", "(idx[3][], ℝ[2])", np.array(
        [(1, (0.5, 1.0)), (2, (math.nan, 0.0))], dtype=[("i", "u1"), ("r", "<f8", (2,))]))
    b = raw_file(tmp_path / "b.psk.d", "(idx[3][], ℝ[2])", np.array(
        [(1, (0.5, 1.0)), (2, (1.0, 0.0))], dtype=[("i", "u1"), ("r", "<f8", (2,))]))
    got = pskd_jax.diff(a, b)
    assert math.isnan(got.diff_norm) and math.isnan(got.a_norm) and math.isnan(got.relative)
    assert got.notes == ("a holds NaN, so ‖a − b‖₂ is nan (leaf [1], sample 1, element 0)",)
    got = pskd_jax.diff(b, a)
    assert math.isnan(got.diff_norm) and got.a_norm == pytest.approx(math.sqrt(2.25))


def test_mixed_encodings_compare_as_the_numbers_they_hold(tmp_path):
    rng = np.random.default_rng(3)
    values = rng.standard_normal((40, 7))
    pskd_jax.write_encoded(tmp_path / "a.psk.d", "ℝ[7]", values, ["f64"])
    rounded = values.astype(ml_dtypes.bfloat16)
    pskd_jax.write_encoded(tmp_path / "b.psk.d", "ℝ[7]", rounded.astype(np.float64), ["bf16"])
    got = pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    diff_norm, a_norm = expected(values, rounded.astype(np.float64))
    assert got.diff_norm == pytest.approx(diff_norm, rel=1e-14) and got.a_norm == pytest.approx(a_norm, rel=1e-14)


# --- work and memory ----------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch):
    """Every positional read diff makes, as (offset, size)."""
    made = []
    original = D._DataFile.read

    def counting(self, offset, size):
        made.append((offset, size))
        return original(self, offset, size)

    monkeypatch.setattr(D._DataFile, "read", counting)
    return made


@pytest.mark.parametrize("sample_type", ["ℝ[0]", "(ℝ[2, 0], idx[5][0])", "(ℝ[0], ℝ[3, 0])"])
def test_two_to_the_forty_empty_samples_cost_no_reads(tmp_path, reads, sample_type):
    a = raw_file(tmp_path / "a.psk.d", sample_type, np.zeros(0), count=2**40)
    got = pskd_jax.diff(a, a)
    assert (got.diff_norm, got.a_norm, got.elements) == (0.0, 0.0, 0) and reads == []


def test_a_sample_larger_than_a_block_is_read_in_chunks_inside_it(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(D, "BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(D, "CHUNK_ELEMENTS", 100)
    rng = np.random.default_rng(1)
    a_values, b_values = rng.standard_normal((2, 1000)), rng.standard_normal((2, 1000))
    tokens = rng.integers(0, 9, (2, 3))
    pskd_jax.write(tmp_path / "a.psk.d", "(ℝ[1000], idx[9][3], ℝ[])", (a_values, tokens, np.array([1.0, 2.0])))
    pskd_jax.write(tmp_path / "b.psk.d", "(ℝ[1000], idx[9][3], ℝ[])", (b_values, tokens, np.array([1.0, 5.0])))
    got = pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    diff_norm, a_norm = expected(np.concatenate([a_values, [[1.0], [2.0]]], axis=1),
                                 np.concatenate([b_values, [[1.0], [5.0]]], axis=1))
    assert got.diff_norm == pytest.approx(diff_norm, rel=1e-14) and got.a_norm == pytest.approx(a_norm, rel=1e-14)
    assert got.elements == 2002
    assert max(size for _, size in reads) <= 100 * 8  # never more than a chunk, whatever the sample
    assert (got.exact.elements, got.exact.differing) == (6, 0)
    # two files, two samples, ten chunks of ℝ[1000], one of idx[9][3] (compared exactly) and one of ℝ[]
    assert len(reads) == 2 * 2 * (10 + 1 + 1)


def test_many_small_samples_are_read_in_blocks(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(D, "BLOCK_BYTES", 1 << 12)
    rng = np.random.default_rng(2)
    a_values, b_values = rng.standard_normal((3000, 4)), rng.standard_normal((3000, 4))
    pskd_jax.write(tmp_path / "a.psk.d", "ℝ[4]", a_values)
    pskd_jax.write(tmp_path / "b.psk.d", "ℝ[4]", b_values)
    got = pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    diff_norm, a_norm = expected(a_values, b_values)
    assert got.diff_norm == pytest.approx(diff_norm, rel=1e-14) and got.a_norm == pytest.approx(a_norm, rel=1e-14)
    assert max(size for _, size in reads) <= 1 << 12
    assert len(reads) == 2 * math.ceil(3000 * 32 / (1 << 12))


def test_a_file_cut_short_while_it_is_read_is_e9003(tmp_path, monkeypatch):
    pskd_jax.write(tmp_path / "a.psk.d", "ℝ[4]", np.ones((100, 4)))
    pskd_jax.write(tmp_path / "b.psk.d", "ℝ[4]", np.ones((100, 4)))
    original = D._DataFile.__init__

    def open_then_cut(self, reader, *forms):
        original(self, reader, *forms)
        if reader.path.endswith("b.psk.d"):
            os.truncate(reader.path, reader.header.data_offset + 8)

    monkeypatch.setattr(D._DataFile, "__init__", open_then_cut)
    with pytest.raises(PskdError) as caught:
        pskd_jax.diff(tmp_path / "a.psk.d", tmp_path / "b.psk.d", layout=None)
    assert caught.value.code == "E9003" and "b.psk.d" in caught.value.message


# --- the command ----------------------------------------------------------------------------------


def pskd(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)


@pytest.mark.subprocess
def test_the_command_pairs_checkpoints_through_their_own_layouts(tmp_path):
    checkpoint(tmp_path / "a.psk.d", {"w": np.ones(4, np.float32), "b": np.zeros(2), "extra": np.ones(1)})
    checkpoint(tmp_path / "b.psk.d", {"b": np.ones(2), "w": np.ones(4, np.float32)})
    done = pskd("diff", "a.psk.d", "b.psk.d", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        f"‖a − b‖₂ = {2 ** 0.5!r}  ‖a‖₂ = 2.0  relative {2 ** 0.5 / 2!r}  over 6 real elements",
        "only in a (1 leaf, not compared): ['extra']",
    ]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_command_states_non_finite_values_plainly_without_warnings(tmp_path):
    raw_file(tmp_path / "a.psk.d", "ℝ[model: 2]", np.array([[math.inf, 1.0]]))
    raw_file(tmp_path / "b.psk.d", "R[2]", np.array([[-math.inf, 1.0]]))
    done = pskd("diff", "a.psk.d", "a.psk.d", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        "‖a − b‖₂ = 0.0  ‖a‖₂ = inf  relative 0.0  over 2 real elements",
        "note: a holds inf, so ‖a‖₂ is inf (leaf (root), sample 0, element 0)",
    ]
    done = pskd("diff", "a.psk.d", "b.psk.d", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == "‖a − b‖₂ = inf  ‖a‖₂ = inf  relative nan  over 2 real elements"
    assert "note: a holds inf where b holds -inf, so ‖a − b‖₂ is inf (leaf (root), sample 0, element 0)" in done.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_file_without_a_layout_of_its_own_is_never_read_with_the_others_found_beside_it(tmp_path):
    # The same leaves in another order, and every leaf f64: a's layout would misread b silently.
    checkpoint(tmp_path / "a.psk.d", {"w": np.arange(2.0), "b": np.ones(2)})
    checkpoint(tmp_path / "c.psk.d", {"b": np.ones(2) * 3, "w": np.arange(2.0)})
    (tmp_path / "b.psk.d").write_bytes((tmp_path / "c.psk.d").read_bytes())  # c's data, no layout beside it
    done = pskd("diff", "a.psk.d", "b.psk.d", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("pskd: E9001: b.psk.d: type 'params Params' needs its own layout")
    done = pskd("diff", "a.psk.d", "b.psk.d", "--layout-b", "c.layout.json", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        f"‖a − b‖₂ = {8 ** 0.5!r}  ‖a‖₂ = {3 ** 0.5!r}  relative {math.sqrt(8 / 3)!r}  over 4 real elements"]
    # A layout named with --layout reads a B that has none: the user said so.
    (tmp_path / "d.psk.d").write_bytes((tmp_path / "a.psk.d").read_bytes())
    done = pskd("diff", "d.psk.d", "a.psk.d", "--layout", "a.layout.json", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("‖a − b‖₂ = 0.0  ‖a‖₂ = "), done.stderr
