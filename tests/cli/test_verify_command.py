"""``pskd verify DIR`` refuses an index that names what is not its own step's files, an index that is
not a regular file, and step files without an index: one line ``pskd: E9014: …``, no traceback, exit
1, and the directory untouched."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointManager
from pskd_jax.checkpoint.index import INDEX
from pskd_jax.checkpoint.takeover import LOCK

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.subprocess


def pskd(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def listing(directory: pathlib.Path) -> dict:
    found = {}
    for name in sorted(os.listdir(directory)):
        path = directory / name
        found[name] = os.readlink(path) if path.is_symlink() else (path.read_bytes() if path.is_file() else "other")
    return found


def refused(directory: pathlib.Path, *fragments: str) -> str:
    before = listing(directory)
    result = pskd("verify", directory, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("pskd: E9014: "), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert listing(directory) == before
    return result.stderr


@pytest.fixture
def run(tmp_path) -> pathlib.Path:
    directory = tmp_path / "run"
    with CheckpointManager(directory) as manager:
        for step in (1, 2):
            manager.save(step, {"w": np.full(8, step, np.float32)}, extra={"step": step})
    return directory


def entries(directory: pathlib.Path) -> list[dict]:
    return json.loads((directory / INDEX).read_text())["checkpoints"]


def rewrite(directory: pathlib.Path, checkpoints: list) -> None:
    content = json.loads((directory / INDEX).read_text())
    content["checkpoints"] = checkpoints
    (directory / INDEX).write_text(json.dumps(content))


def test_a_healthy_directory_verifies(run):
    result = pskd("verify", run)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"pskd: 2 checkpoints verified in {run}"


@pytest.mark.parametrize("case", ["duplicate steps", "step true", "layout names the index", "two entries share a file",
                                  "file of another step", "negative step", "step beyond int64"])
@pytest.mark.slow
def test_verify_refuses_an_index_naming_what_is_not_its_own(run, case):
    one, two = entries(run)
    bad = {
        "duplicate steps": [one, one],
        "step true": [dict(one, step=True), two],
        "layout names the index": [dict(one, layout=INDEX), two],
        "two entries share a file": [one, dict(two, file=one["file"])],
        "file of another step": [dict(one, file=two["file"]), two],
        "negative step": [dict(one, step=-1), two],
        "step beyond int64": [dict(one, step=2**63), two],
    }[case]
    rewrite(run, bad)
    message = refused(run, INDEX, "malformed entry")
    if case == "duplicate steps":
        assert "listed twice" in message
    # `pskd verify FILE` reads the same index for the file's recorded digest
    result = pskd("verify", run / step_file(2))
    assert result.returncode == 1 and result.stderr.startswith("pskd: E9014: ")


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_verify_refuses_an_index_that_is_not_a_regular_file(run, kind):
    (run / INDEX).unlink()
    if kind == "directory":
        (run / INDEX).mkdir()
    elif kind == "fifo":
        os.mkfifo(run / INDEX)  # must not block
    else:
        os.symlink("/etc/passwd", run / INDEX)
    refused(run, INDEX, "not a regular file")


@pytest.mark.slow
def test_verify_refuses_step_files_without_an_index(run):
    (run / INDEX).unlink()
    refused(run, "no checkpoint index", step_file(1))
    # an empty directory has nothing to verify, and says so
    empty = run.parent / "empty"
    empty.mkdir()
    result = pskd("verify", empty)
    assert result.returncode == 0 and result.stdout == f"pskd: 0 checkpoints verified in {empty}\n"


def test_verify_refuses_a_listed_fifo_without_blocking(run):
    (run / step_file(2)).unlink()
    os.mkfifo(run / step_file(2))
    refused(run, step_file(2), "FIFO")


def test_verify_names_a_listed_file_that_is_missing(run):
    (run / step_file(2)).unlink()
    result = pskd("verify", run)
    assert result.returncode == 1 and result.stderr.startswith("pskd: E9003: ") and step_file(2) in result.stderr
    assert "missing" in result.stderr and "Traceback" not in result.stderr


def test_verify_of_an_adopted_directory(run):
    (run / INDEX).unlink()
    CheckpointManager(run).close()  # adopts steps 1 and 2
    result = pskd("verify", run)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == f"pskd: 2 checkpoints verified in {run}"
    assert sorted(os.listdir(run)) == [LOCK, INDEX, step_layout(1), step_file(1), step_layout(2), step_file(2)]
