"""Every usage error of every subcommand is one line ``pskd: E9012: …`` on stderr and a non-zero
exit, never argparse's usage text; ``--help`` still shows the usage. Also: ``lm-windows --vocab``
takes a number or a vocabulary file, and messages name the vocabulary file."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest
from pskd_jax.apps import pskd as pskd_app

import pskd_jax
from pskd_jax import data
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command path (``("corpus", "build")`` …) of a parser, depth first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = subcommands(sub, (*prefix, name))
                found.extend(nested or [(*prefix, name)])
    return found


COMMANDS = subcommands(pskd_app.make_parser())


def parse(capsys, *args: str) -> tuple[int, str, str]:
    """Parses a command line in this process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exited:
        pskd_app.parse_flags(["pskd", *args])
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def assert_one_usage_line(status: int, out: str, err: str, *names: str) -> None:
    assert status == 2 and out == ""
    assert err.startswith("pskd: E9012: "), err
    assert len(err.splitlines()) == 1, err
    assert "usage:" not in err and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)


def test_the_commands_are_found():
    assert {("pack",), ("diff",), ("lm-windows",), ("pipeline",), ("corpus", "build")} <= set(COMMANDS)
    assert len(COMMANDS) >= 12


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_unknown_option_is_one_e9012_line(capsys, command):
    status, out, err = parse(capsys, *command, "--no-such-option", "x")
    # the unknown option first, named with its subcommand, even when required arguments are missing
    assert_one_usage_line(status, out, err, "--no-such-option", "pskd " + " ".join(command) + ":")
    assert "required" not in err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in {("corpus", "verify")}], ids=" ".join)
def test_missing_arguments_are_one_e9012_line_naming_the_command(capsys, command):
    status, out, err = parse(capsys, *command)
    if status == 0:  # a command without required arguments parses
        return
    assert_one_usage_line(status, out, err, "pskd " + " ".join(command), "required")


@pytest.mark.parametrize("args, names", [
    ((), ["required: COMMAND"]),
    (("nope",), ["invalid choice: 'nope'"]),
    (("corpus",), ["pskd corpus", "SUBCOMMAND"]),
    (("corpus", "nope"), ["invalid choice: 'nope'"]),
    (("info", "f.psk.d", "--samples", "many"), ["--samples", "invalid integer value: 'many'"]),
    # (numbers only as written in decimal digits: int() would read these as 10, 8 and 8)
    (("lm-windows", "--seq", "1_0", "t.txt", "-o", "w"), ["--seq", "invalid integer value: '1_0'"]),
    (("lm-windows", "--seq", " 8", "t.txt", "-o", "w"), ["--seq", "invalid integer value: ' 8'"]),
    (("pipeline", "text", "--start", "\u0668"), ["--start", "invalid integer value: '\u0668'"]),
    (("corpus", "build", "in", "-o", "c", "--workers", "0x2"), ["--workers", "invalid integer value: '0x2'"]),
    (("lm-windows", "--seq"), ["--seq", "expected one argument"]),
    (("info", "f.psk.d", "--no-such-option"), ["unrecognized arguments: --no-such-option"]),
    (("diff", "a", "b", "c"), ["unrecognized arguments: c"]),
    (("pipeline", "text", "--epoch", "1.5"), ["--epoch"]),
])
def test_malformed_command_lines(capsys, args, names):
    assert_one_usage_line(*parse(capsys, *args), *names)


@pytest.mark.parametrize("command", [(), ("pack",), ("corpus",), ("corpus", "build")], ids=repr)
def test_help_still_shows_the_usage(capsys, command):
    status, out, err = parse(capsys, *command, "--help")
    assert status == 0 and out.startswith("usage: pskd") and err == ""


def test_an_encoding_list_that_starts_with_a_dash_is_a_value():
    args = pskd_app.parse_flags(["pskd", "pack", "--type", "R[]", "--encoding", "-,f32", "in.txt", "-o", "o"])
    assert args.encoding == "-,f32" and args.input == "in.txt" and args.output == "o"
    # Only such a value is joined: a lone '-' and an option after --encoding keep their meaning.
    assert pskd_app.join_dash_values(["--encoding", "-,f32", "-o", "-"]) == ["--encoding=-,f32", "-o", "-"]
    assert pskd_app.join_dash_values(["--encoding", "--round"]) == ["--encoding", "--round"]
    assert pskd_app.join_dash_values(["--type", "-,x"]) == ["--type", "-,x"]


@pytest.mark.parametrize("option", ["--beam_options", "--beam-options"])
def test_beam_options_given_apart_from_their_flag_are_its_value(option):
    """``--beam_options "--runner=… --project=…"`` (the value a word of its own, as a shell passes it):
    Beam's flags, never taken for pskd's own --runner."""
    beam = "--runner=apache_beam.runners.dask.dask_runner.DaskRunner --dask_client_address=tcp://127.0.0.1:8786"
    args = pskd_app.parse_flags(["pskd", "corpus", "build", "in.txt", "-o", "c", "--runner", "beam", option, beam])
    assert args.runner == "beam" and args.beam_options == beam and args.inputs == ["in.txt"]


def pskd(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)


def test_a_flag_file_absl_could_not_use_is_one_e9012_line(capsys, tmp_path, monkeypatch):
    # Read by the toolkit before absl opens it: never waited on, never read without end, no traceback.
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe.flags")
    pathlib.Path("bytes.flags").write_bytes(b"--samples=1\xff\n")
    for k in range(40):  # a chain of flag files deeper than any a user writes
        pathlib.Path(f"c{k}.flags").write_text(f"# a comment\n--flagfile=c{k + 1}.flags\n")
    pathlib.Path("c40.flags").write_text("--samples=1\n")
    for flag_file, names in (("pipe.flags", ["pipe.flags", "named pipe"]), ("/dev/zero", ["/dev/zero", "device"]),
                             (".", ["directory"]), ("bytes.flags", ["bytes.flags", "not UTF-8"]),
                             ("c0.flags", ["nested deeper than 32"])):
        assert_one_usage_line(*parse(capsys, "info", "x.psk.d", f"--flagfile={flag_file}"), *names)
        assert_one_usage_line(*parse(capsys, "--flagfile", flag_file, "info", "x.psk.d"), *names)
    # A flag file that names itself is read once, as absl reads it; one after '--' is an argument.
    pathlib.Path("self.flags").write_text("--flagfile=self.flags\n--samples=3\n")
    assert pskd_app.parse_flags(["pskd", "info", "x.psk.d", "--flagfile=self.flags"]).samples == 3
    pskd_app.check_flag_files(pskd_app._flag_file_names(["info", "--", "--flagfile=pipe.flags"]))


def _output_check(*args: str):
    """Parses a command line and runs the output-is-no-input check on it: the error it raises, or None."""
    try:
        pskd_app.check_output_is_no_input(pskd_app.parse_flags(["pskd", *args]))
    except pskd_jax.PskdError as e:
        return e
    return None


def test_an_output_that_is_an_input_is_refused_however_either_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data.write_vocab("v.json", ["a", "\n"])
    pathlib.Path("in.txt").write_text("a\n")
    url = (tmp_path / "in.txt").as_uri()
    for args in (["encode", "in.txt", "--vocab", "v.json", "-o", "in.txt"],
                 ["encode", url, "--vocab", "v.json", "-o", "in.txt"],  # the input as a file:// URL
                 ["encode", "in.txt", "--vocab", "v.json", "-o", url],  # the output as one
                 ["encode", "in.txt", "--vocab", "v.json", "-o", "./v.json"],
                 ["export", "s3://bucket/k/a.psk.d", "-o", "s3://bucket/k/a.psk.d"],  # one object
                 ["export", "memory://m/a.psk.d", "-o", "memory://m/a.layout.json"]):  # the layout beside it
        error = _output_check(*args)
        assert error is not None and error.code == "E9012" and "the output is the input" in error.message, args
    # A checkpoint not named *.psk.d has its layout file beside it too (m.bin → m.bin.pskd-layout.json).
    pathlib.Path("m.bin").write_bytes(b"")
    pathlib.Path("m.bin.pskd-layout.json").write_text("{}")
    assert _output_check("export", "m.bin", "-o", "m.bin.pskd-layout.json") is not None


def test_an_output_named_like_an_option_value_is_no_input(tmp_path, monkeypatch):
    # Only the arguments that name files are inputs: not the command's name, a type or an encoding.
    monkeypatch.chdir(tmp_path)
    for name in ("export", "f32", "ℝ[]", "in.txt"):
        pathlib.Path(name).write_text("the output's old content\n")
    assert _output_check("export", "d.psk.d", "-o", "export") is None
    assert _output_check("pack", "in.txt", "--type", "ℝ[]", "--encoding", "f32", "-o", "f32") is None
    assert _output_check("pack", "in.txt", "--type", "ℝ[]", "-o", "ℝ[]") is None
    assert _output_check("export", "s3://bucket/a.psk.d", "-o", "gs://bucket/a.psk.d") is None  # two stores


@pytest.mark.subprocess
def test_an_input_given_as_a_file_url_is_not_replaced_by_the_output(tmp_path):
    data_file = tmp_path / "d.psk.d"
    pskd_jax.write(data_file, "ℝ[2]", [[1.0, 2.0]])
    before = data_file.read_bytes()
    done = pskd("export", data_file.as_uri(), "-o", str(data_file), cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("pskd: E9012: ") and "Traceback" not in done.stderr
    assert data_file.read_bytes() == before


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_usage_error_from_the_installed_command_is_one_line(tmp_path):
    done = pskd("lm-windows", "--vocab", "3", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "pskd: E9012: pskd lm-windows: the following arguments are required: TOKENS.txt, --seq, -o/--output "
        "(see pskd lm-windows --help)"]
    done = pskd("--flagfile=missing.flags", "info", "x", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("pskd: E9012: ") and len(done.stderr.splitlines()) == 1
    assert "missing.flags" in done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_lm_windows_takes_a_vocabulary_file_or_a_number(tmp_path):
    (tmp_path / "text.txt").write_text("abcab cab\n")
    assert pskd("chars", "text.txt", "-o", "vocab.json", cwd=tmp_path).returncode == 0
    assert pskd("encode", "text.txt", "--vocab", "vocab.json", "-o", "tokens.txt", cwd=tmp_path).returncode == 0
    size = len(json.loads((tmp_path / "vocab.json").read_text()))
    by_file = pskd("lm-windows", "--vocab", "vocab.json", "--seq", "3", "tokens.txt", "-o", "a.psk.d", cwd=tmp_path)
    by_number = pskd("lm-windows", "--vocab", str(size), "--seq", "3", "tokens.txt", "-o", "b.psk.d", cwd=tmp_path)
    assert by_file.returncode == 0 and by_number.returncode == 0, (by_file.stderr, by_number.stderr)
    assert f"idx[{size}][seq: 3]" in by_file.stdout
    assert (tmp_path / "a.psk.d").read_bytes() == (tmp_path / "b.psk.d").read_bytes()
    missing = pskd("lm-windows", "--vocab", "nope.json", "--seq", "3", "tokens.txt", "-o", "c.psk.d", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("pskd: E9003: nope.json")
    negative = pskd("lm-windows", "--vocab", "-3", "--seq", "3", "tokens.txt", "-o", "c.psk.d", cwd=tmp_path)
    assert negative.returncode == 1 and negative.stderr.startswith("pskd: E9012: --vocab must be at least 1")
    assert not (tmp_path / "c.psk.d").exists()


@pytest.mark.subprocess
def test_encode_names_the_vocabulary_file_of_a_missing_character(tmp_path):
    (tmp_path / "text.txt").write_text("ab\nc\n")
    data.write_vocab(tmp_path / "civil_vocab.json", ["a", "b", "\n"])
    done = pskd("encode", "text.txt", "--vocab", "civil_vocab.json", "-o", "t.txt", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("pskd: E9011: text.txt:2: character 'c' (U+0063) is not in the vocabulary "
                           "civil_vocab.json\n")
    assert not (tmp_path / "t.txt").exists()


def test_version_prints_the_package_version(capsys):
    status, out, err = parse(capsys, "--version")
    assert (status, out, err) == (0, f"pskd {pskd_jax.__version__}\n", "")
    assert pskd_jax.__version__ == importlib.metadata.version("pskd_jax")


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_installed_command_prints_its_version():
    done = helpers.pskd("--version", script=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"pskd {pskd_jax.__version__}\n", "")
