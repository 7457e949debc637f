"""The ``pskd`` command line run as a subprocess, the way a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from tests.helpers import ENV, ROOT, TESTDATA, pskd, run_python
from tests.helpers import pskd_fails as fails
from tests.helpers import pskd_ok as ok

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_lm_windows_and_info_reproduce_the_reference_session(tmp_path):
    out = tmp_path / "tokens.psk.d"
    lines = ok("lm-windows", "--vocab", "64", "--seq", "8", TESTDATA / "tokens.txt", "-o", out)
    assert lines == [
        f"pskd: wrote {out} (24 windows of type (idx[64][seq: 8], idx[64][seq: 8]) from 200 tokens)"
    ]
    assert ok("info", out, "--samples", "2") == [
        "type    (idx[64][seq: 8], idx[64][seq: 8])",
        "count   24",
        "version 1",
        "sample  16 bytes, 2 leaves",
        "[0] ([41, 19, 50, 6, 9, 12, 46, 7], [19, 50, 6, 9, 12, 46, 7, 27])",
        "[1] ([27, 4, 11, 55, 53, 8, 30, 11], [4, 11, 55, 53, 8, 30, 11, 54])",
    ]


@pytest.mark.slow
def test_a_million_tokens_at_seq_256_make_4617_windows(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 92, size=1182121)
    path = tmp_path / "civil_tokens.txt"
    path.write_text(" ".join(map(str, tokens.tolist())))
    out = tmp_path / "civil_T256.psk.d"
    lines = ok("lm-windows", "--vocab", "92", "--seq", "256", path, "-o", out)
    assert lines == [
        f"pskd: wrote {out} (4617 windows of type (idx[92][seq: 256], idx[92][seq: 256]) "
        "from 1182121 tokens)"
    ]
    with pskd_jax.Reader(out) as reader:
        inputs, targets = reader.gather([0, 4616])
    assert np.array_equal(inputs[1], tokens[4616 * 256 : 4617 * 256])
    assert np.array_equal(targets[1], tokens[4616 * 256 + 1 : 4617 * 256 + 1])


@pytest.mark.slow
def test_text_chain_round_trips(tmp_path):
    text = "Le Code civil — «article 1ᵉʳ».\nZ\u00e9ro, 𝔘nicode ✓\n" * 50
    source = tmp_path / "civil.md"
    source.write_text(text, encoding="utf-8")
    vocab, tokens, back = tmp_path / "vocab.json", tmp_path / "tokens.txt", tmp_path / "back.md"
    n_chars = len(set(text))
    assert ok("chars", source, "-o", vocab) == [
        f"pskd: wrote {vocab} ({n_chars} distinct characters over {len(text)} characters of text)"
    ]
    assert json.loads(vocab.read_text(encoding="utf-8")) == sorted(set(text))
    assert ok("encode", source, "--vocab", vocab, "-o", tokens) == [
        f"pskd: wrote {tokens} ({len(text)} tokens over a vocabulary of {n_chars} tokens)"
    ]
    ok("decode", tokens, "--vocab", vocab, "-o", back)
    assert back.read_text(encoding="utf-8") == text
    windows = tmp_path / "w.psk.d"
    ok("lm-windows", "--vocab", n_chars, "--seq", 16, "--stride", 4, tokens, "-o", windows)
    with pskd_jax.Reader(windows) as reader:
        assert len(reader) == (len(text) - 17) // 4 + 1


@pytest.mark.slow
def test_pack_info_export_diff(tmp_path):
    values = tmp_path / "values.txt"
    values.write_text("-- label, features\n1 0.5 0.25\n\n0 0.1 -3\n")
    a = tmp_path / "a.psk.d"
    assert ok("pack", "--type", "(idx[2][], R[2])", values, "-o", a) == [
        f"pskd: wrote {a} (2 samples of type (idx[2][], ℝ[2]))"
    ]
    export = tmp_path / "a.json"
    ok("export", a, "-o", export)
    document = json.loads(export.read_text(encoding="utf-8"))
    assert document["samples"] == [[1, [0.5, 0.25]], [0, [0.1, -3.0]]]
    values.write_text("1 0.5 0.25\n0 0.1 1\n")
    b = tmp_path / "b.psk.d"
    ok("pack", "--type", "(idx[2][], R[2])", values, "-o", b)
    line, exact = ok("diff", a, b)
    assert line.startswith("‖a − b‖₂ = 4.0  ‖a‖₂ = ")
    assert "over 4 real elements" in line
    assert exact == "idx leaves: 0 of 2 elements differ (integers, bools and bit patterns, compared exactly)"


def test_diff_reports_idx_and_bool_leaves_compared_exactly(tmp_path):
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    pskd_jax.write(a, "(idx[10][2], bool[], ℝ[])", (np.array([[1, 2], [3, 4]]), np.array([True, False]),
                                                    np.array([0.5, 1.5])))
    pskd_jax.write(b, "(idx[10][2], bool[], ℝ[])", (np.array([[1, 7], [3, 4]]), np.array([True, True]),
                                                    np.array([0.5, 1.5])))
    assert ok("diff", a, b) == [
        f"‖a − b‖₂ = 0.0  ‖a‖₂ = {2.5 ** 0.5!r}  relative 0.0  over 2 real elements",
        "idx leaves: 2 of 6 elements differ (integers, bools and bit patterns, compared exactly); first: leaf [0], "
        "sample 0, element 1: a holds 2, b holds 7",
    ]


@pytest.mark.slow
def test_pack_narrowing_is_refused_then_rounded_and_reported(tmp_path):
    values = tmp_path / "values.txt"
    values.write_text("0.1 0.5\n")
    out = tmp_path / "o.psk.d"
    message = fails("E9004", "pack", "--type", "R[2]", "--encoding", "f32", values, "-o", out)
    assert f"{values}:1" in message and "0.1" in message
    assert not out.exists()
    lines = ok("pack", "--type", "R[2]", "--encoding", "bf16", "--round", values, "-o", out)
    assert lines[0] == f"pskd: wrote {out} (1 sample of type ℝ[2], encodings bf16)"
    assert "largest error" in lines[1] and "0.1 → 0.10009765625" in lines[1]
    info = ok("info", out)
    assert "version 2" in info and "encodings (root)=bf16" in info


@pytest.mark.parametrize(
    "code, args",
    [
        ("E9001", ["pack", "--type", "R[model: D]", "{values}", "-o", "{out}"]),
        ("E9001", ["pack", "--type", "idx[0][]", "{values}", "-o", "{out}"]),
        ("E9002", ["info", "{garbage}"]),
        ("E9002", ["info", "{missing}"]),
        ("E9003", ["info", "{truncated}"]),
        ("E9004", ["pack", "--type", "idx[2][2]", "{values}", "-o", "{out}"]),
        ("E9004", ["lm-windows", "--vocab", "3", "--seq", "2", "{values}", "-o", "{out}"]),
        ("E9005", ["diff", "{good}", "{other_type}"]),
        ("E9011", ["encode", "{values}", "--vocab", "{bad_vocab}", "-o", "{out}"]),
        ("E9012", ["lm-windows", "--vocab", "3", "--seq", "0", "{values}", "-o", "{out}"]),
        ("E9012", ["info", "{good}", "--samples", "-1"]),  # not "show none"
    ],
)
def test_every_error_code_from_the_command_line(tmp_path, code, args):
    paths = {
        "values": tmp_path / "values.txt",
        "out": tmp_path / "out.psk.d",
        "garbage": tmp_path / "garbage.psk.d",
        "missing": tmp_path / "missing.psk.d",
        "truncated": tmp_path / "truncated.psk.d",
        "good": tmp_path / "good.psk.d",
        "other_type": tmp_path / "other.psk.d",
        "bad_vocab": tmp_path / "vocab.json",
    }
    paths["values"].write_text("1 7\n")
    paths["garbage"].write_bytes(b"NOPE" + bytes(20))
    pskd_jax.write(paths["good"], "R[2]", np.ones((3, 2)))
    pskd_jax.write(paths["other_type"], "R[3]", np.ones((3, 3)))
    data = paths["good"].read_bytes()
    paths["truncated"].write_bytes(data[:-1])
    paths["bad_vocab"].write_text('["a", "a"]')
    fails(code, *[a.format(**paths) for a in args])
    assert not paths["out"].exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_info_on_a_params_file_says_it_needs_its_layout(tmp_path):
    path = tmp_path / "ckpt.psk.d"
    template = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    batch = {k: v[None] for k, v in template.items()}
    pskd_jax.write(path, "params MiniGPT", batch, layout=template)
    lines = ok("info", path)
    assert lines[:3] == ["type    params MiniGPT", "count   1", "version 2"]
    assert any(line.startswith("layout  ") and "program" in line for line in lines)


def test_two_params_files_of_one_encoding_diff_without_their_layout(tmp_path):
    template = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    pskd_jax.write(a, "params M", {"w": np.full((1, 2, 3), 2.0, np.float32), "b": np.zeros((1, 3), np.float32)},
                   layout=template)
    pskd_jax.write(b, "params M", {"w": np.full((1, 2, 3), 2.0, np.float32), "b": np.ones((1, 3), np.float32)},
                   layout=template)
    (line,) = ok("diff", a, b)
    assert line.startswith(f"‖a − b‖₂ = {3 ** 0.5!r}  ‖a‖₂ = {24 ** 0.5!r}")
    assert line.endswith("(flat, without the layout)")


def test_pack_encoding_of_a_type_without_real_leaves(tmp_path):
    """A type of one idx leaf takes its own '-' (as in a comma list), and an encoding of reals for a
    type that has none is refused, not ignored."""
    values = tmp_path / "values.txt"
    values.write_text("1 2\n")
    out = tmp_path / "o.psk.d"
    assert ok("pack", "--type", "idx[10][2]", "--encoding", "-", values, "-o", out)[0].startswith(f"pskd: wrote {out}")
    message = fails("E9012", "pack", "--type", "idx[10][2]", "--encoding", "f32", values, "-o", tmp_path / "p.psk.d")
    assert "--encoding f32: the type has no real leaf to encode" in message
    assert not (tmp_path / "p.psk.d").exists()


def test_summaries_name_an_idx_leaf_idx_never_f64(tmp_path):
    values = tmp_path / "values.txt"
    values.write_text("1 2 0.5\n")
    out = tmp_path / "o.psk.d"
    assert ok("pack", "--type", "(idx[10][2], ℝ[])", "--encoding", "-,f32", values, "-o", out) == [
        f"pskd: wrote {out} (1 sample of type (idx[10][2], ℝ[]), encodings idx f32)"
    ]
    assert "encodings [0]=idx [1]=f32" in ok("info", out)
    # A params file read without its layout: byte 0 may be either, and info says so.
    template = {"w": np.zeros(2, np.float32), "n": np.zeros(3, np.uint8)}
    params = tmp_path / "p.psk.d"
    pskd_jax.write(params, "params M", {"w": np.zeros((1, 2), np.float32), "n": np.zeros((1, 3), np.uint8)},
                   layout=template)
    assert ok("info", params)[3] == (
        "leaves  2 (encodings in storage order: f32 f64|idx; f64|idx is byte 0, f64 for a real leaf and idx for "
        "an index leaf, which only the layout tells apart)")


def test_data_commands_never_import_jax():
    code = "import sys, pskd_jax.apps.pskd; sys.exit(1 if 'jax' in sys.modules else 0)"
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_usage_errors_go_through_argparse(tmp_path):
    result = pskd("lm-windows", "--vocab", "3")
    assert result.returncode == 2
    assert "required" in result.stderr


@pytest.mark.slow
def test_info_and_export_of_a_file_holding_an_index_beyond_its_bound(tmp_path):
    import struct

    from pskd_jax.format.header import encode_header

    tokens = np.arange(12, dtype=np.uint8).reshape(4, 3) % 10
    tokens[2, 1] = 12  # only a damaged or hand-made file holds it: every writer refuses it
    bad = tmp_path / "bad.psk.d"
    bad.write_bytes(encode_header("(idx[10][3], ℝ[])", 4, []) + b"".join(
        row.tobytes() + struct.pack("<d", 0.5) for row in tokens))
    run = pskd("info", bad, "--samples", "4")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stdout.splitlines()[:2] == ["type    (idx[10][3], ℝ[])", "count   4"]  # the header still shows
    assert run.stdout.splitlines()[-1].startswith("[1] ")
    assert run.stderr.startswith("pskd: E9004: ") and "sample 2" in run.stderr and "idx[10]" in run.stderr
    message = fails("E9004", "export", bad, "-o", tmp_path / "bad.json")
    assert "sample 2" in message
    assert not (tmp_path / "bad.json").exists()


@pytest.mark.parametrize("stdout", [
    pytest.param("full", marks=pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")),
    "closed"])
@pytest.mark.parametrize("command", [["info", "{data}"], ["export", "{data}", "-o", "-"], ["diff", "{data}", "{data}"]],
                         ids=lambda c: c[0] if isinstance(c, list) else c)
def test_a_standard_output_that_cannot_be_written_is_one_e9003_line(tmp_path, command, stdout):
    data = tmp_path / "d.psk.d"
    pskd_jax.write(data, "ℝ[2]", [[1.0, 2.0]])
    args = [a.format(data=data) for a in command]
    # A closed standard output: the shell closes descriptor 1 before it starts the command (no
    # preexec_fn, which would fork this multithreaded JAX process).
    closing = ["sh", "-c", 'exec "$0" "$@" >&-'] if stdout == "closed" else []
    with open("/dev/full" if stdout == "full" else os.devnull, "wb") as out:
        done = subprocess.run([*closing, sys.executable, "-m", "pskd_jax.apps.pskd", *args], stdout=out,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("pskd: E9003: -: cannot write the standard output") and \
        len(done.stderr.splitlines()) == 1, done.stderr
