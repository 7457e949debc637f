"""The kill harness of the fault tests (``tests/robustness/kill_points.py``): a recorded run lists
its file-system steps, a step plan kills just before that step, a byte plan inside a write at that
byte, and a run after a killed one counts the same steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import ENV, ROOT
from tests.robustness import kill_points

pytestmark = pytest.mark.subprocess

PAYLOAD = bytes(range(256)) * 20  # 5120 bytes

CHILD = """
import json, sys
from pskd_jax._os.atomic import atomic_output
from tests.robustness import kill_points
root, plan = sys.argv[1], json.loads(sys.argv[2])
kill_points.arm(root, plan)
with atomic_output(root + "/out.bin") as f:
    f.write(bytes(range(256)) * 20)
"""


def run(root, plan: dict) -> int:
    """Writes root/out.bin with atomic_output in a fresh interpreter armed with ``plan`` (a fork of
    this process, which has JAX's threads, could deadlock); its wait status."""
    child = subprocess.run([sys.executable, "-c", CHILD, str(root), json.dumps(plan)], env=ENV, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode <= 0, child.stderr
    if child.returncode < 0:
        return -child.returncode  # as os.waitpid reports a signal: its number in the low bits
    return child.returncode << 8


def temporaries(root) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.endswith(".tmp"))


def test_a_recorded_run_lists_its_steps_in_order(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    record = tmp_path / "steps"
    assert run(root, {"record": str(record)}) == 0
    kinds = [kind for kind, _ in kill_points.recorded(record)]
    assert kinds == ["os.listdir", "tempfile.mkstemp", "open", "os.chmod", "fcntl.flock", "os.fsync", "os.rename",
                     "open", "os.fsync"], kinds
    assert (root / "out.bin").read_bytes() == PAYLOAD


@pytest.mark.slow
def test_a_step_plan_kills_just_before_its_step(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    record = tmp_path / "steps"
    assert run(root, {"record": str(record)}) == 0
    steps = kill_points.recorded(record)
    rename = [kind for kind, _ in steps].index("os.rename")
    (root / "out.bin").write_bytes(b"old")
    for k in range(len(steps)):
        status = run(root, {"step": k})
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, status)
        assert (root / "out.bin").read_bytes() == (PAYLOAD if k > rename else b"old"), k
        if k > rename:
            (root / "out.bin").write_bytes(b"old")
    assert run(root, {"step": len(steps)}) == 0  # a step the run never reaches: it finishes
    assert temporaries(root) == []  # the killed runs' temporary files, removed by the last one


def test_a_byte_plan_dies_inside_the_write_at_its_byte(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    status = run(root, {"step": 0, "bytes": 1000})
    assert kill_points.killed(status) and os.WTERMSIG(status) == signal.SIGXFSZ, status
    [left] = temporaries(root)
    assert (root / left).read_bytes() == PAYLOAD[:1000] and not (root / "out.bin").exists()


@pytest.mark.slow
def test_steps_on_a_killed_runs_leftovers_are_not_counted(tmp_path):
    """A run that first removes the temporary file a killed run left does the same numbered
    steps as one after none: a plan drawn from a clean run lands at the same point."""
    root = tmp_path / "root"
    root.mkdir()
    clean, after = tmp_path / "clean", tmp_path / "after"
    assert run(root, {"record": str(clean)}) == 0
    run(root, {"step": 0, "bytes": 10})  # leaves a temporary file
    assert len(temporaries(root)) == 1
    assert run(root, {"record": str(after)}) == 0
    assert temporaries(root) == []  # removed ...
    strip = lambda steps: [(kind, name.split(".")[0]) for kind, name in steps]  # noqa: E731  (random names)
    assert strip(kill_points.recorded(after)) == strip(kill_points.recorded(clean))  # ... without a step counted


def test_an_occurrence_plan_kills_before_that_occurrence(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    status = run(root, {"at": ["os.fsync", "."], "occurrence": 1})  # the directory's sync, after the rename
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (root / "out.bin").read_bytes() == PAYLOAD
