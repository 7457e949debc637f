"""Processes killed at points they reach for sure (see :mod:`tests.robustness.kill_points`), each a
fresh interpreter. A process saving a checkpoint: the path then holds the old checkpoint or the
new one, whole; a manager's latest step is complete and verifies. A ``pskd corpus build`` with a
pool of workers, killed once some shards are journaled: run again, it finishes a corpus
byte-identical to an uninterrupted build."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax import corpus
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint import CheckpointManager, Retention
from pskd_jax.format.layout_file import find_layout_file
from tests.helpers import ENV, ROOT, documents
from tests.robustness import kill_points

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

KILLS = 4

CHILD = textwrap.dedent(
    """
    import json, sys, numpy as np
    from pskd_jax import checkpoint as ck
    from pskd_jax.checkpoint import CheckpointManager, Retention
    from tests.robustness import kill_points

    def tree(k):
        return {"w": np.full((256, 1024), k, np.float32), "b": np.full(4096, k, np.float64),
                "k": np.int64(k)}

    mode, path, k, root, plan = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
    kill_points.arm(root, plan)
    if mode == "file":
        ck.save(path, tree(k))
    else:
        with CheckpointManager(path, retention=Retention(keep=2)) as manager:
            manager.save(k, tree(k), extra={"k": k})
    """
)


def expected(k: int) -> dict:
    return {"w": np.full((256, 1024), k, np.float32), "b": np.full(4096, k, np.float64), "k": np.int64(k)}


def save_in_child(mode: str, path: pathlib.Path, k: int, root: pathlib.Path, plan: dict) -> int:
    """Saves ``expected(k)`` at ``path`` in a fresh interpreter armed with ``plan``; its return code."""
    child = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(k), str(root), json.dumps(plan)],
                           env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode <= 0, child.stderr
    return child.returncode


def plans(mode: str, path: pathlib.Path, root: pathlib.Path, rng: random.Random, size) -> list[dict]:
    """Kills spread over a save's steps and inside its writes, from a recorded save (step 1 over 0)."""
    record = root.parent / f"{mode}.steps"
    assert save_in_child(mode, path, 0, root, {"step": -1}) == 0  # (a plan that never fires)
    assert save_in_child(mode, path, 1, root, {"record": str(record)}) == 0
    steps = len(kill_points.recorded(record))
    return kill_points.step_plans(steps, KILLS // 2, rng) + kill_points.byte_plans(size(), KILLS - KILLS // 2, rng)


def test_a_killed_save_leaves_the_old_or_the_new_checkpoint_whole(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "root"
    root.mkdir()
    path = root / "c.psk.d"
    for k, plan in enumerate(plans("file", path, root, rng, lambda: path.stat().st_size), start=2):
        assert save_in_child("file", path, k, root, plan) in (-signal.SIGKILL, -signal.SIGXFSZ), plan
        back = ck.restore(path, expected(0))
        got = int(back["k"])
        assert got <= k, (got, k)
        for key, value in expected(got).items():
            np.testing.assert_array_equal(back[key], value)
        assert ck.read_layout_file(layout_path_for(path)).layout.leaves[0].path == "['w']"
    assert save_in_child("file", path, 99, root, {"step": -1}) == 0
    assert sorted(os.listdir(root)) == ["c.layout.json", "c.psk.d"]  # the killed saves' leftovers removed


SAME_HEADER_CHILD = textwrap.dedent(
    """
    import json, sys, numpy as np
    from pskd_jax import checkpoint as ck
    from tests.robustness import kill_points

    path, k, root, plan, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
    kill_points.arm(root, plan)
    a, b = np.full(1024, k, np.float32), np.full(1024, k + 0.5, np.float32)
    ck.save(path, {"a": a, "b": b} if k % 2 == 0 else {"b": b, "a": a}, ck.SaveOptions(layout_file=layout == "1"))
    """
)


@pytest.mark.parametrize("before", ["a layout", "no layout", "nothing"])
def test_a_save_killed_between_its_layout_and_its_data_never_mixes_them(tmp_path, before):
    # Two trees of the same header (the same leaf shapes and encodings, other key order): the
    # layout's identity cannot tell their data apart, so a save killed between putting its layout
    # in place and its data would give one save's keys to the other's values. Killed at every
    # step of its run, a save leaves the old tree or the new one whole: over a save with a layout
    # file, over one saved without any (read then as it was, without a layout), and as the first
    # save of its path (nothing then, or the new tree). The next save leaves no trace of the kill.
    root = tmp_path / "root"
    root.mkdir()
    path = root / "c.psk.d"

    def run(k: int, plan: dict, layout: bool = True) -> int:
        child = subprocess.run([sys.executable, "-c", SAME_HEADER_CHILD, str(path), str(k), str(root),
                                json.dumps(plan), "1" if layout else "0"], env=ENV, cwd=ROOT, capture_output=True,
                               text=True, timeout=300)
        assert child.returncode <= 0, child.stderr
        return child.returncode

    def reset() -> None:
        for name in os.listdir(root):
            os.unlink(root / name)
        if before != "nothing":
            assert run(0, {"step": -1}, layout=before == "a layout") == 0

    reset()
    assert run(1, {"record": str(tmp_path / "steps")}) == 0
    steps = len(kill_points.recorded(tmp_path / "steps"))
    template = {"a": np.zeros(1024, np.float32), "b": np.zeros(1024, np.float32)}
    new = {"b": 1.5, "a": 1.0}
    states = []
    for step in range(steps):
        reset()
        assert run(1, {"step": step}) == -signal.SIGKILL, step
        left = sorted(os.listdir(root))
        if before == "nothing" and "c.psk.d" not in left:
            states.append("nothing")
            continue
        if before == "no layout" and find_layout_file(path) is None:
            back = ck.restore(path, template, as_numpy=True)  # (no layout: the old save's data, read as it was)
            assert {k: float(v[0]) for k, v in back.items()} == {"a": 0.0, "b": 0.5}, (step, left)
            states.append("old")
        else:
            back = ck.restore(path, as_numpy=True)
            got = {key: float(value[0]) for key, value in back.items()}
            assert got in ({"a": 0.0, "b": 0.5}, new), (step, got, left)
            assert list(got) == (["b", "a"] if got == new else ["a", "b"]), (step, got)
            states.append("new" if got == new else "old")
        assert sorted(os.listdir(root)) == left, step  # (reading changed nothing)
    # the old pair up to the data's rename, the new one from then on
    assert states == sorted(states, key=lambda s: s == "new") and "new" in states and states[0] != "new", states
    assert run(2, {"step": -1}) == 0
    assert sorted(os.listdir(root)) == ["c.layout.json", "c.psk.d"]
    assert list(ck.restore(path, as_numpy=True)) == ["a", "b"]


def test_a_killed_manager_keeps_a_complete_latest_step(tmp_path):
    rng = random.Random(11)
    root = tmp_path / "root"
    root.mkdir()
    directory = root / "run"
    step_file = lambda: (directory / "step-00000000.psk.d").stat().st_size  # noqa: E731
    for k, plan in enumerate(plans("manager", directory, root, rng, step_file), start=2):
        assert save_in_child("manager", directory, k, root, plan) in (-signal.SIGKILL, -signal.SIGXFSZ), plan
        # (closed: the next child opens the directory)
        with CheckpointManager(directory, retention=Retention(keep=2)) as manager:
            latest = manager.latest_step()
            assert latest is not None
            back = manager.restore(target=expected(0), verify=True)
            assert int(back["k"]) == latest and manager.extra() == {"k": latest}
            np.testing.assert_array_equal(back["w"], expected(latest)["w"])
            manager.verify()
            # the reopened manager removed what the killed save left behind
            names = set(os.listdir(directory))
            assert all(not name.endswith(".tmp") and not name.endswith(".psk.d.lock") for name in names)
            assert {f"step-{s:08d}.psk.d" for s in manager.all_steps()} == {n for n in names if n.endswith(".psk.d")}


# ---------------------------------------------------------------------------------------------
# ``pskd corpus build`` killed and resumed


CORPUS_KILLS = 3
JOURNAL_SYNC = "os.fsync"  # one a finished shard, once its journal line is written


def build(inputs, out, workers, plan: dict | None = None, root=None) -> subprocess.CompletedProcess:
    """``pskd corpus build`` in a fresh interpreter, armed with ``plan`` when given."""
    args = ["corpus", "build", *map(str, inputs), "-o", str(out), "--workers", str(workers), "--chunk-tokens", "1000"]
    command = [sys.executable, "-m", "pskd_jax.apps.pskd", *args] if plan is None else \
        [sys.executable, "-m", "tests.robustness.kill_points", json.dumps(plan), str(root), "--", *args]
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def finished_shards(out: pathlib.Path) -> int:
    """Shards the journal of a build in progress lists (its first two lines are a header and the
    names the build writes)."""
    try:
        return max(0, (out / ".shards.journal").read_bytes().count(b"\n") - 2)
    except OSError:
        return 0


@pytest.mark.parametrize("workers", [2])  # one worker: the kill series of tests/robustness/test_faults.py
def test_a_killed_build_finishes_byte_identical(tmp_path, workers):
    inputs = [documents(tmp_path / f"in{i}.jsonl", 1500 + 300 * i, i, width=40) for i in range(5)]
    assert build(inputs, tmp_path / "ref", workers).returncode == 0
    out = tmp_path / "out"
    rng = random.Random(workers)
    # Killed once 0..4 shards are journaled (in increasing order, since a rerun keeps what is done):
    # just before the journal line of the next one is synced, the pool's workers mid-shard.
    for target in sorted(rng.sample(range(len(inputs)), CORPUS_KILLS)):
        done = finished_shards(out)
        if done > target:
            continue  # (the last kill left more journaled than this one aims at)
        plan = {"at": [JOURNAL_SYNC, "out/.shards.journal"], "occurrence": target - done + 1}
        killed = build(inputs, out, workers, plan, tmp_path)
        assert killed.returncode == -signal.SIGKILL, (plan, killed.stderr)
        assert finished_shards(out) >= target
    assert build(inputs, out, workers).returncode == 0
    names = sorted(os.listdir(tmp_path / "ref"))
    assert sorted(os.listdir(out)) == names
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    corpus.verify_corpus(out / "shards.json")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
