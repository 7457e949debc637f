"""What a new user meets first, run as a user runs it: ``--help`` of every command exits 0 and
prints its usage; an unknown option is what is reported, before missing arguments; ``train_lm``
refuses to start a new run among another run's checkpoints; counts in messages carry their unit;
text outputs end with one newline, to the standard output as to a file."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from pskd_jax.apps import pskd as pskd_app

import pskd_jax
from tests.cli.test_usage_errors import COMMANDS
from tests.helpers import ENV, ROOT, documents, pskd, pskd_fails, pskd_ok, train_lm

pytestmark = pytest.mark.subprocess

GROUPS = sorted({command[:1] for command in COMMANDS if len(command) > 1})


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(ENV, JAX_PLATFORMS="cpu"), timeout=300)


# --- --help -------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [(), *GROUPS, *COMMANDS], ids=lambda c: " ".join(c) or "pskd")
def test_help_of_every_command_exits_0_and_prints_its_usage(command):
    result = pskd(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {' '.join(('pskd', *command))} ") and result.stderr == ""


@pytest.mark.parametrize("command", [(), ("corpus", "build"), ("verify",)], ids=lambda c: " ".join(c) or "pskd")
def test_helpfull_and_h_exit_0_too(command):
    for flag in ("--helpfull", "-h"):
        result = pskd(*command, flag)
        assert result.returncode == 0 and result.stdout.startswith("usage: "), (flag, result.stderr)


@pytest.mark.parametrize("flag", ["--help", "-?", "--helpshort", "--helpfull"])
def test_train_lm_help_exits_0_and_prints_its_usage_and_flags(flag):
    result = run_module("pskd_jax.apps.train_lm", flag)
    assert result.returncode == 0, result.stderr
    assert "python -m pskd_jax.apps.train_lm" in result.stdout and "--checkpoint_dir" in result.stdout
    assert "--resume" in result.stdout


def test_train_lm_usage_errors_still_fail():
    for args in (["--no_such_flag"], ["--help=false"]):  # (--help=false asks for no help: --pipeline is missing)
        result = run_module("pskd_jax.apps.train_lm", *args)
        assert result.returncode == 1 and "Flags parsing error" in result.stderr, result.stderr


# --- the unknown option first ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("corpus", "build", "--bad"),
    ("corpus", "build", "docs", "--bad"),  # (-o missing too)
    ("encode", "--bad", "t.txt"),  # (-o and one of --vocab/--tokenizer missing too)
    ("verify", "--bad"),
])
def test_an_unknown_option_is_reported_before_missing_arguments(args):
    line = pskd_fails("E9012", *args, status=2)
    assert "unrecognized arguments: --bad" in line and "required" not in line
    command = " ".join(a for a in args if a in {"corpus", "build", "encode", "verify"})
    assert line.startswith(f"pskd: E9012: pskd {command}: "), line


def test_missing_arguments_are_still_named_when_every_option_is_known(capsys):
    with pytest.raises(SystemExit) as exited:
        pskd_app.parse_flags(["pskd", "corpus", "build", "--workers", "2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pskd: E9012: pskd corpus build: the following arguments are required: INPUT, -o/--output")


# --- train_lm among another run's checkpoints ---------------------------------------------------------


def windows_file(path):
    tokens = (np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 20, np.uint8) - 32).astype(np.int64)
    starts = np.arange(0, len(tokens) - 17, 16)
    pskd_jax.write(path, "(idx[96][seq: 16], idx[96][seq: 16])",
                   (tokens[starts[:, None] + np.arange(16)], tokens[starts[:, None] + np.arange(1, 17)]))
    return path


def test_train_lm_refuses_a_new_run_among_another_runs_checkpoints(tmp_path):
    windows = windows_file(tmp_path / "w.psk.d")
    checkpoints = tmp_path / "ckpt"
    with pskd_jax.CheckpointManager(checkpoints) as manager:
        manager.save(7, {"w": np.arange(3.0)}, extra={"step": 7})
    before = sorted(p.name for p in checkpoints.iterdir())
    result = train_lm(f'--pipeline=stream "{windows}" |> batch(B = 4)', "--steps=2", "--width=16", "--layers=1",
                      "--heads=2", f"--checkpoint_dir={checkpoints}")
    assert result.returncode == 1, result.stdout
    assert "E9012" in result.stderr and "Traceback" not in result.stderr
    assert "--resume" in result.stderr and "another --checkpoint_dir" in result.stderr and "steps 7" in result.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == before  # nothing written, nothing removed
    assert pskd_jax.CheckpointManager(checkpoints, read_only=True).all_steps() == [7]


# --- units ------------------------------------------------------------------------------------------


def test_the_vocabulary_lines_say_what_they_count(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcab\n", encoding="utf-8")
    vocab, tokens = tmp_path / "v.json", tmp_path / "t.tok"
    assert pskd_ok("chars", text, "-o", vocab) == \
        [f"pskd: wrote {vocab} (4 distinct characters over 6 characters of text)"]
    assert pskd_ok("encode", text, "--vocab", vocab, "-o", tokens) == \
        [f"pskd: wrote {tokens} (6 tokens over a vocabulary of 4 tokens)"]
    assert pskd_ok("decode", tokens, "--vocab", vocab, "-o", tmp_path / "back.txt") == \
        [f"pskd: wrote {tmp_path / 'back.txt'} (6 characters from a vocabulary of 4 tokens)"]


# --- text outputs end with one newline -------------------------------------------------------------


def test_text_outputs_end_with_one_newline_to_the_standard_output_as_to_a_file(tmp_path):
    data = tmp_path / "d.psk.d"
    pskd_jax.write(data, "ℝ[2]", np.arange(4.0).reshape(2, 2))
    checkpoint = tmp_path / "c.psk.d"
    pskd_jax.save(checkpoint, {"a": np.ones(2, np.float32), "b": 3})
    empty = tmp_path / "e.psk.d"
    pskd_jax.write(empty, "ℝ[2]", np.zeros((0, 2)))
    text = tmp_path / "t.txt"
    text.write_text("ab", encoding="utf-8")  # (no newline of its own)
    vocab = tmp_path / "v.json"
    pskd_ok("chars", text, "-o", vocab)
    for args in (("export", data), ("export", checkpoint), ("export", empty), ("chars", text),
                 ("encode", text, "--vocab", vocab)):
        out = tmp_path / "out.txt"
        pskd_ok(*args, "-o", out)
        streamed = subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args), "-o", "-"],
                                  capture_output=True, cwd=ROOT, env=ENV, timeout=300)
        assert streamed.returncode == 0, streamed.stderr
        assert streamed.stdout == out.read_bytes(), args
        assert streamed.stdout.endswith(b"\n") and not streamed.stdout.endswith(b"\n\n"), args


def test_the_corpus_lines_say_what_they_count(tmp_path):
    documents(tmp_path / "a.jsonl", 20, 1)
    built = pskd_ok("corpus", "build", tmp_path / "a.jsonl", "-o", tmp_path / "c")
    assert "a vocabulary of 257 tokens with boundary 256" in built[0]
    info = pskd_ok("corpus", "info", tmp_path / "c" / "shards.json")
    assert any(line.startswith("tokenizer  bytes; a vocabulary of 257 tokens with boundary 256;") for line in info)
    pipeline = f'stream "{tmp_path / "c" / "shards.json"}" |> batch(B = 2) |> take(n = 1)'
    shown = pskd_ok("pipeline", pipeline, "--seq", "8", "--stride", "4")
    assert any("(windows of 8 tokens every 4 tokens)" in line for line in shown), shown
