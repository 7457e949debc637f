"""A file that changes under a reader: cut short while read, it is E9003 naming it, never a SIGBUS,
and a command that fails so leaves nothing behind. The toolkit's own writers never rewrite a file
in place: a reader holding the old file keeps reading the old content.

The cut-short cases run in a child process: a SIGBUS there is a failed test, not a dead suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pskd_jax import checkpoint, data
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.format import Reader, write

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(script: str, *args, cwd) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode != -signal.SIGBUS, "killed by SIGBUS: " + run.stderr[-2000:]
    return run


def big_file(path, rows: int = 4096, width: int = 1024) -> None:
    write(path, f"ℝ[{width}]", np.arange(rows * width, dtype=np.float64).reshape(rows, width), durable=False)


GATHER_AFTER_CUT = """
    import os, sys
    from pskd_jax.format import Reader
    from pskd_jax.errors import PskdError
    path, access, how = sys.argv[1], sys.argv[2], sys.argv[3]
    with Reader(path, access=access) as reader:
        reader.gather([0, len(reader) - 1])
        os.truncate(path, 100)
        try:
            if how == "gather":
                reader.gather([len(reader) - 1, 0])
            elif how == "getitem":
                reader[len(reader) - 1]
            else:
                reader.leaf_range(len(reader) - 1, 0, 0, 8)
        except PskdError as e:
            print(e.code, path in e.message)
            sys.exit(0)
    print("no error")
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("access", ["mmap", "pread"])
@pytest.mark.parametrize("how", ["gather", "getitem", "leaf_range"])
def test_a_reader_of_a_file_cut_short_answers_E9003(tmp_path, access, how):
    path = tmp_path / "big.psk.d"
    big_file(path)
    run = run_child(GATHER_AFTER_CUT, path, access, how, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.split() == ["E9003", "True"], run.stdout + run.stderr


# A command whose input is cut short while it runs: the first read of the data cuts the file.
CUT_DURING = """
    import os, sys
    from pskd_jax.format import reader as reader_module
    path = sys.argv[1]
    real = reader_module.Reader.{method}
    calls = []
    def cutting(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.truncate(path, 200)
        return real(self, *args, **kwargs)
    reader_module.Reader.{method} = cutting
    from pskd_jax.apps import pskd
    sys.argv = ["pskd", *sys.argv[2:]]
    pskd.run()
"""


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("command, method", [
    (["export", "{file}", "-o", "out.json"], "gather_leaves"),
    (["export", "{file}", "-o", "-"], "gather_leaves"),
    (["info", "{file}", "--samples", "3"], "leaf_range"),
])
def test_a_command_whose_input_is_cut_short_fails_cleanly(tmp_path, command, method):
    from pskd_jax.data import export
    path = tmp_path / "big.psk.d"
    rows = 4 * (export.CHUNK_ELEMENTS // 1024)  # four chunks of export
    big_file(path, rows=rows)
    out = tmp_path / "out"
    out.mkdir()
    args = [a.format(file=path) for a in command]
    run = run_child(CUT_DURING.replace("{method}", method), path, *args, cwd=out)
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("pskd: E9003: ") and run.stderr.count("\n") == 1, run.stderr
    assert str(path) in run.stderr and "Traceback" not in run.stderr
    assert os.listdir(out) == []  # no output, no temporary file
    if "-" in command:
        assert run.stdout == ""


@pytest.mark.subprocess
@pytest.mark.slow
def test_convert_of_a_file_cut_short_fails_cleanly(tmp_path):
    pytest.importorskip("safetensors")
    path = tmp_path / "ck.psk.d"
    checkpoint.save(path, {"a": np.arange(1 << 16, dtype=np.float32), "b": np.ones(1 << 16)},
                    SaveOptions(name="M", durable=False))
    out = tmp_path / "out"
    out.mkdir()
    run = run_child(CUT_DURING.replace("{method}", "leaf_range"), path, "convert", path, "-o", out / "ck.safetensors",
                    cwd=out)
    assert run.returncode == 1 and run.stderr.startswith("pskd: E9003: "), run.stderr
    assert os.listdir(out) == []


def test_the_toolkits_writers_never_rewrite_a_file_a_reader_holds(tmp_path):
    """Each writer replaces its destination by a rename: a reader that opened the old file reads
    the old samples, whole, after the write (and its map is never cut short under it)."""
    path = tmp_path / "data.psk.d"
    write(path, "ℝ[]", np.arange(100.0), durable=False)
    (tmp_path / "rows.txt").write_text("1\n2\n")
    (tmp_path / "t.tok").write_text("1 2 3 1 2 3\n")
    (tmp_path / "t.txt").write_text("ab")
    with Reader(path) as reader, Reader(path, access="pread") as other:
        view = reader.leaves()[0]
        write(path, "ℝ[]", np.zeros(3), durable=False)
        data.pack_file(str(tmp_path / "rows.txt"), "ℝ[]", str(path))
        data.lm_windows_file(str(tmp_path / "t.tok"), str(path), vocab=4, seq=2)
        checkpoint.save(path, {"w": np.ones(2)}, SaveOptions(name="M", durable=False))
        assert view.tolist() == list(np.arange(100.0))
        assert reader.gather([99])[0] == 99.0 and other.gather([99])[0] == 99.0
        for writer in (lambda p: data.export_json(str(tmp_path / "x.psk.d"), p),
                       lambda p: data.write_vocab(p, ["a"])):
            held = tmp_path / "held.txt"
            held.write_text("old text")
            with open(held, "rb") as f:
                write(tmp_path / "x.psk.d", "ℝ[]", np.ones(1), durable=False)
                writer(str(held))
                assert f.read() == b"old text"


def test_a_growing_file_is_read_as_it_was_when_opened(tmp_path):
    """A file appended to while a reader holds it: the reader reads the samples of its count,
    whole, until refresh() takes in the rest."""
    path = tmp_path / "grow.psk.d"
    write(path, "idx[256][4]", np.arange(8).reshape(2, 4), durable=False)
    with Reader(path) as reader:
        with open(path, "ab") as f:
            f.write(bytes(range(8, 12)))
        assert len(reader) == 2 and reader.gather([1])[0].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("reader", ["tokens", "encode", "vocab", "pack"])
def test_a_text_input_cut_short_while_read_is_E9003(tmp_path, monkeypatch, reader):
    """A text input read in blocks (or whole) and cut short meanwhile ends before the size it had
    when opened: E9003 naming it, never a shorter input taken silently."""
    from pskd_jax._os import files
    path = tmp_path / "in.txt"
    path.write_text({"tokens": "1 2 3 " * 5000, "encode": "ab" * 20000, "vocab": '["a", "b", "c", "d"]',
                     "pack": "1.5\n" * 5000}[reader])
    real, calls = files.os.fstat, []

    def fstat_then_cut(fd):  # the size is taken at opening (open_fd, open_regular), then the file is cut short
        result = real(fd)
        calls.append(fd)
        if len(calls) == 2:
            os.truncate(path, result.st_size // 2)
        return result

    monkeypatch.setattr(files.os, "fstat", fstat_then_cut)
    call = {"tokens": lambda: data.read_tokens(str(path), chunk_size=1024),
            "encode": lambda: data.encode_file(str(path), ["a", "b"], str(tmp_path / "out.tok"), chunk_size=1024),
            "vocab": lambda: data.read_vocab(str(path)),
            "pack": lambda: data.pack_file(str(path), "ℝ[]", str(tmp_path / "out.psk.d"))}[reader]
    from pskd_jax.errors import PskdError
    with pytest.raises(PskdError) as caught:
        call()
    assert caught.value.code == "E9003" and str(path) in caught.value.message and "cut short" in caught.value.message
    assert not os.path.exists(tmp_path / "out.tok") and not os.path.exists(tmp_path / "out.psk.d")
