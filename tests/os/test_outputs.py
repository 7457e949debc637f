"""What stands at an output path: a regular file or nothing is replaced, a link is written through
to its target, a directory, FIFO or device is refused (E9012) and left as it was; ``-`` is the
standard output for text outputs and refused for the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax import data
from pskd_jax._os.atomic import atomic_output, destination_for, text_output
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, Writer, write


def code_of(call, *args, **kwargs) -> str:
    with pytest.raises(PskdError) as caught:
        call(*args, **kwargs)
    return caught.value.code


def listing(directory) -> list[str]:
    return sorted(os.listdir(directory))


def test_a_regular_file_or_nothing_is_the_destination_itself(tmp_path):
    assert destination_for(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
    (tmp_path / "old.json").write_text("old")
    assert destination_for(str(tmp_path / "old.json")) == str(tmp_path / "old.json")


def test_a_link_is_written_through_to_its_target_in_the_targets_directory(tmp_path):
    target_dir = tmp_path / "elsewhere"
    target_dir.mkdir()
    (target_dir / "target.json").write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target_dir / "target.json")
    with atomic_output(str(link)) as f:
        f.write(b"new")
    assert link.is_symlink() and os.readlink(link) == str(target_dir / "target.json")
    assert (target_dir / "target.json").read_text() == "new"
    assert listing(target_dir) == ["target.json"] and listing(tmp_path) == ["elsewhere", "link.json"]


def test_a_chain_of_links_and_a_dangling_link_are_followed(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("c.json")  # dangling: the file is created where it points
    with atomic_output(str(tmp_path / "a")) as f:
        f.write(b"x")
    assert (tmp_path / "c.json").read_bytes() == b"x" and (tmp_path / "a").is_symlink()


def test_a_writer_writes_through_a_link(tmp_path):
    (tmp_path / "real.psk.d").write_bytes(b"old")
    (tmp_path / "data.psk.d").symlink_to("real.psk.d")
    write(tmp_path / "data.psk.d", "ℝ[]", np.arange(3.0), durable=False)
    assert (tmp_path / "data.psk.d").is_symlink()
    with Reader(tmp_path / "real.psk.d") as reader:
        assert reader.leaves()[0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "device-link", "loop", "proc-link"])
def test_what_is_not_a_regular_file_is_refused_and_left_as_it_was(tmp_path, kind):
    path = tmp_path / "out.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path = "/dev/null"
    elif kind == "device-link":
        path.symlink_to("/dev/null")
    elif kind == "loop":
        path.symlink_to("out.json")
    else:
        path.symlink_to("/proc/self/fd/1")
    before = listing(tmp_path)
    assert code_of(destination_for, str(path)) == "E9012"
    assert code_of(data.write_vocab, str(path), ["a"]) == "E9012"
    assert code_of(Writer, str(path), "ℝ[]") == "E9012"
    assert listing(tmp_path) == before
    if kind == "fifo":
        assert os.path.exists(path) and not os.path.isfile(path)
    if kind == "device":
        assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_dash_is_refused_for_a_file_writer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert code_of(atomic_output("-").__enter__) == "E9012"
    assert code_of(Writer, "-", "ℝ[]") == "E9012"
    assert listing(tmp_path) == []


def test_a_destination_that_becomes_a_fifo_before_the_rename_is_not_replaced(tmp_path):
    path = tmp_path / "out.bin"
    with pytest.raises(PskdError) as caught:
        with atomic_output(str(path)) as f:
            f.write(b"x")
            os.mkfifo(path)
    assert caught.value.code == "E9012"
    assert listing(tmp_path) == ["out.bin"] and not os.path.isfile(path)


def test_text_output_to_dash_writes_the_standard_output_once_complete(tmp_path, capfdbinary):
    with text_output("-") as f:
        f.write(b"abc")
    assert capfdbinary.readouterr().out == b"abc"
    with pytest.raises(RuntimeError):
        with text_output("-") as f:
            f.write(b"partial")
            raise RuntimeError("midway")
    assert capfdbinary.readouterr().out == b""


def pskd(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_commands_write_text_to_dash_and_refuse_it_for_binary_outputs(tmp_path):
    write(tmp_path / "a.psk.d", "ℝ[2]", np.arange(4.0).reshape(2, 2), durable=False)
    (tmp_path / "t.txt").write_text("abba\n")
    (tmp_path / "v.json").write_text('["\\n", "a", "b"]')
    run = pskd("export", "a.psk.d", "-o", "-", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == ""
    assert json.loads(run.stdout)["samples"] == [[0.0, 1.0], [2.0, 3.0]]
    run = pskd("chars", "t.txt", "-o", "-", cwd=tmp_path)
    assert (run.returncode, json.loads(run.stdout)) == (0, ["\n", "a", "b"])
    run = pskd("encode", "t.txt", "--vocab", "v.json", "-o", "-", cwd=tmp_path)
    assert (run.returncode, run.stdout) == (0, "1 2 2 1 0\n")
    (tmp_path / "t.tok").write_text(run.stdout)
    run = pskd("decode", "t.tok", "--vocab", "v.json", "-o", "-", cwd=tmp_path)
    assert (run.returncode, run.stdout) == (0, "abba\n")
    for command in (["pack", "t.txt", "--type", "ℝ[]"], ["lm-windows", "t.tok", "--vocab", "3", "--seq", "2"],
                    ["corpus", "build", "t.txt"], ["convert", "a.psk.d"]):
        run = pskd(*command, "-o", "-", cwd=tmp_path)
        assert run.returncode == 1 and run.stdout == "" and run.stderr.startswith("pskd: E9012: "), run.stderr
        assert "Traceback" not in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.psk.d", "t.tok", "t.txt", "v.json"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_export_to_dash_that_fails_writes_nothing(tmp_path):
    path = tmp_path / "bad.psk.d"
    from pskd_jax.format.encodings import Encoding
    from pskd_jax.format.header import encode_header
    path.write_bytes(encode_header("idx[10][]", 3, [Encoding.F64]) + bytes([1, 2, 12]))
    run = pskd("export", path, "-o", "-", cwd=tmp_path)
    assert run.returncode == 1 and run.stdout == "" and run.stderr.startswith("pskd: E9004: "), run.stderr


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_corpus_build_never_removes_what_stands_at_its_manifest_name(tmp_path, kind):
    from pskd_jax.corpus import build as corpus_build
    from pskd_jax.corpus.options import BuildOptions
    (tmp_path / "in.jsonl").write_text('{"text": "hi"}\n')
    out = tmp_path / "c"
    out.mkdir()
    manifest = out / "shards.json"
    manifest.mkdir() if kind == "directory" else os.mkfifo(manifest)
    inputs = [str(tmp_path / "in.jsonl")]
    assert code_of(corpus_build.build_corpus, inputs, str(out), BuildOptions(durable=False)) == "E9012"
    assert os.path.exists(manifest) and not os.path.isfile(manifest)
    assert not any(name.startswith("shard-") for name in os.listdir(out))


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_output_that_is_an_input_is_refused(tmp_path):
    from pskd_jax import checkpoint
    (tmp_path / "rows.txt").write_text("1\n2\n")
    checkpoint.save(tmp_path / "ck.psk.d", {"w": np.ones(2)}, SaveOptions(name="M", durable=False))
    os.link(tmp_path / "rows.txt", tmp_path / "hard.txt")
    layout = (tmp_path / "ck.layout.json").read_bytes()
    for command in (["pack", "rows.txt", "--type", "ℝ[]", "-o", "rows.txt"],
                    ["pack", "rows.txt", "--type", "ℝ[]", "-o", "hard.txt"],
                    ["export", "ck.psk.d", "-o", "ck.layout.json"],
                    ["export", "ck.psk.d", "-o", "ck.psk.d"]):
        run = pskd(*command, cwd=tmp_path)
        assert run.returncode == 1 and run.stderr.startswith("pskd: E9012: "), (command, run.stderr)
    assert (tmp_path / "rows.txt").read_text() == "1\n2\n" and (tmp_path / "ck.layout.json").read_bytes() == layout
