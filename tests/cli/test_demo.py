"""The demo's own promises, checked without running its minutes of training: each demo writes in
a directory of its own and removes only one it made; the command line it echoes is the one it
runs. (``make demo`` itself runs the whole of it, and fails when the resumed run differs.)"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

import pytest

from tests.helpers import ROOT


def load_demo(monkeypatch, *argv: str):
    monkeypatch.setattr(sys, "argv", ["demo.py", *argv])
    spec = importlib.util.spec_from_file_location(f"pskd_demo_{len(argv)}", ROOT / "demo" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_two_demos_write_in_directories_of_their_own(monkeypatch):
    plain, corpus = load_demo(monkeypatch), load_demo(monkeypatch, "--corpus")
    assert plain.OUT != corpus.OUT
    assert plain.OUT not in corpus.OUT.parents and corpus.OUT not in plain.OUT.parents
    assert (plain.OUT.name, corpus.OUT.name) == ("demo", "demo-corpus")


def test_a_demo_removes_only_a_directory_it_made(monkeypatch, tmp_path):
    demo = load_demo(monkeypatch)
    monkeypatch.setattr(demo, "OUT", tmp_path / "out" / "demo")
    demo.fresh_output()
    (demo.OUT / "old.txt").write_text("from the last run")
    demo.fresh_output()  # its own: emptied
    assert sorted(p.name for p in demo.OUT.iterdir()) == [demo.MARKER]
    other = tmp_path / "out" / "demo-corpus"  # the other demo's output stands beside it, untouched
    other.mkdir()
    (other / "keep.txt").write_text("x")
    demo.fresh_output()
    assert (other / "keep.txt").read_text() == "x"
    mine = tmp_path / "mine"  # a directory the demo did not make is refused, nothing removed
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    monkeypatch.setattr(demo, "OUT", mine)
    with pytest.raises(SystemExit, match="not made by the demo"):
        demo.fresh_output()
    assert (mine / "notes.txt").read_text() == "mine"


def test_the_training_command_echoed_is_the_one_run(monkeypatch, capsys):
    demo = load_demo(monkeypatch)
    ran = []
    monkeypatch.setattr(demo.subprocess, "run", lambda args, **options: ran.append((args, options)))
    demo.train('stream "out/demo/windows.psk.d" |> shuffle(seed = 1) |> batch(B = 32)', "out/demo/ckpt", 150,
               "--resume", "--seq=64")
    echoed = capsys.readouterr().out.splitlines()
    assert len(echoed) == 1 and echoed[0].startswith("$ ")
    words = shlex.split(echoed[0][2:])
    assert words[0] == "JAX_PLATFORMS=cpu" and words[1] == "python"
    (args, options), = ran
    assert args[0] == sys.executable and args[1:] == words[2:]  # the same list, word for word
    assert options["env"]["JAX_PLATFORMS"] == "cpu" and options["env"].get("PATH") == os.environ.get("PATH")
    assert "--resume" in args and "--seq=64" in args and "--steps=150" in args
