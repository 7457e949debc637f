"""pack's text rules: indices up to 2^64 - 1 exactly, leading zeros as lm-windows takes them, reals
as decimals only (ASCII digits, sign, point, exponent), and ``--encoding -,…`` as written."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax.data import pack_file, read_tokens
from pskd_jax.errors import PskdError

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIG = 2**64


def packed(tmp_path, text: str, sample_type: str):
    source = tmp_path / "values.txt"
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "out.psk.d"
    pack_file(str(source), sample_type, str(out))
    with pskd_jax.Reader(out) as reader:
        return reader.gather(np.arange(len(reader)))


def refused(tmp_path, text: str, sample_type: str) -> str:
    source = tmp_path / "values.txt"
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "out.psk.d"
    with pytest.raises(PskdError) as caught:
        pack_file(str(source), sample_type, str(out))
    assert caught.value.code == "E9004"
    assert not out.exists()
    return caught.value.message


@pytest.mark.parametrize("value", [10**19, 10**19 + 1, BIG - 2, BIG - 1, 2**63, 12345678901234567890])
def test_indices_of_twenty_digits_below_2_64_are_packed_exactly(tmp_path, value):
    got = packed(tmp_path, f"{value} 3\n0 {value}\n", f"idx[{BIG}][2]")
    assert got.dtype == np.uint64
    assert [[int(v) for v in row] for row in got] == [[value, 3], [0, value]]


def test_an_index_at_or_beyond_2_64_is_refused_naming_line_and_value(tmp_path):
    message = refused(tmp_path, f"1 2\n3 {BIG}\n", f"idx[{BIG}][2]")
    assert f"values.txt:2: value 2 is {BIG}, not an index below {BIG}" in message
    message = refused(tmp_path, "-- a comment\n" + "9" * 5000 + " 1\n", f"idx[{BIG}][2]")
    assert "values.txt:2: value 1 is 9999" in message and "(5000 characters)" in message


@pytest.mark.parametrize("token, value", [("007", 7), ("0000000000000000000007", 7), ("0" * 30, 0),
                                          ("000" + str(BIG - 1), BIG - 1)])
def test_leading_zeros_are_accepted_as_lm_windows_accepts_them(tmp_path, token, value):
    bound = BIG if value >= 10 else 10
    got = packed(tmp_path, f"{token}\n", f"idx[{bound}][]")
    assert int(got[0]) == value
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{token} 1\n")
    assert read_tokens(tokens, bound=bound).tolist() == [value, 1]  # one rule for both


def test_a_zero_padded_index_is_still_held_to_its_bound(tmp_path):
    message = refused(tmp_path, "1 000000000000000000000010\n", "idx[10][2]")
    assert "values.txt:1: value 2 is 000000000000000000000010, not an index below 10" in message
    assert "not an index below 10" in refused(tmp_path, "1 010\n", "idx[10][2]")


@pytest.mark.parametrize("token", ["1_0", "１", "٣", "1.5", "-1", "+1", "0x10", "1e3", "²"])
def test_an_index_is_ascii_digits_only(tmp_path, token):
    message = refused(tmp_path, f"0 {token}\n", "idx[10][2]")
    assert "values.txt:1: value 2" in message and "is not an index" in message


@pytest.mark.parametrize("token", ["1_0", "1_000.5", "１", "٣.5", "1.５", "inf", "-inf", "nan", "Infinity",
                                   "0x10", "1e", "1e+", ".", "+-1", "1.2.3", "e5", "1,5", "½"])
def test_a_real_is_a_decimal_and_nothing_else(tmp_path, token):
    message = refused(tmp_path, f"-- header\n\n0.5 {token}\n", "ℝ[2]")
    assert f"values.txt:3: value 2 {token!r} is not a real number" in message


@pytest.mark.parametrize("token, value", [("1", 1.0), ("-0", -0.0), ("+3.", 3.0), ("-.5", -0.5), ("1E-3", 0.001),
                                          ("1e+2", 100.0), ("0.1", 0.1), ("00012.50", 12.5),
                                          ("2.2250738585072014e-308", 2.2250738585072014e-308)])
def test_decimals_are_read_correctly_rounded(tmp_path, token, value):
    got = packed(tmp_path, f"{token}\n", "ℝ[]")
    assert float(got[0]) == value and np.signbit(got[0]) == np.signbit(value)


def test_a_long_real_among_short_ones_is_checked_too(tmp_path):
    # One token far longer than the rest makes pack hold the values as Python strings.
    lines = ["0.5"] * 100 + ["1" * 5000 + "_0"]
    message = refused(tmp_path, "\n".join(lines) + "\n", "ℝ[]")
    assert "values.txt:101: value 1 '11111" in message and "is not a real number" in message
    lines[-1] = "0." + "1" * 5000
    got = packed(tmp_path, "\n".join(lines) + "\n", "ℝ[]")
    assert float(got[-1]) == float("0." + "1" * 5000)


def run_pskd(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)


@pytest.mark.slow
@pytest.mark.subprocess
def test_encoding_list_starting_with_a_dash_is_taken_as_written(tmp_path):
    (tmp_path / "v.txt").write_text("1 0.5 0.25\n0 1.5 -2\n")
    for spelling in (["--encoding", "-,f32,bf16"], ["--encoding=-,f32,bf16"]):
        out = tmp_path / "o.psk.d"
        done = run_pskd("pack", "--type", "(idx[2][], R[1], R[1])", *spelling, "v.txt", "-o", out, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("encodings idx f32 bf16)")  # (the idx leaf's byte 0 is no f64)
        with pskd_jax.Reader(out) as reader:
            assert [e.label for e in reader.header.encodings] == ["f64", "f32", "bf16"]
            index, first, second = reader.gather([0, 1])
        assert index.tolist() == [1, 0] and first.tolist() == [[0.5], [1.5]]
        assert second.astype(float).tolist() == [[0.25], [-2.0]]
        out.unlink()
    done = run_pskd("pack", "--type", "(idx[2][], R[1], R[1])", "--encoding", "-,f32", "v.txt", "-o",
                    tmp_path / "o.psk.d", cwd=tmp_path)
    assert done.returncode != 0 and done.stderr.startswith("pskd: E9012: --encoding lists 2 encodings")
    assert not (tmp_path / "o.psk.d").exists()


@pytest.mark.subprocess
def test_the_command_refuses_a_python_only_real_naming_line_and_value(tmp_path):
    (tmp_path / "v.txt").write_text("0.5 1\n0.25 1_0\n")
    done = run_pskd("pack", "--type", "R[2]", "v.txt", "-o", "o.psk.d", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("pskd: E9004: v.txt:2: value 2 '1_0' is not a real number")
    assert not (tmp_path / "o.psk.d").exists()
