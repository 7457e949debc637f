"""Processes killed with SIGKILL at random points. A process saving checkpoints: the path then holds
the old checkpoint or the new one, whole; a manager's latest step is complete and verifies. A
``pskd corpus build``: run again, it finishes a corpus byte-identical to an uninterrupted build."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax import corpus
from pskd_jax.checkpoint.manager import CheckpointManager
from tests.helpers import ENV, documents, start_pskd

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

KILLS = 4

CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from pskd_jax import checkpoint as ck
    from pskd_jax.checkpoint import CheckpointManager

    def tree(k):
        return {"w": np.full((256, 1024), k, np.float32), "b": np.full(4096, k, np.float64),
                "k": np.int64(k)}

    mode, path = sys.argv[1], sys.argv[2]
    manager = CheckpointManager(path, keep=2) if mode == "manager" else None
    k = 0
    while k < 100000:
        if manager is None:
            ck.save(path, tree(k))
        else:
            manager.save(k, tree(k), extra={"k": k})
        if k == 0:
            print("ready", flush=True)
        k += 1
    """
)


def expected(k: int) -> dict:
    return {"w": np.full((256, 1024), k, np.float32), "b": np.full(4096, k, np.float64), "k": np.int64(k)}


def run_and_kill(mode: str, path: pathlib.Path, rng: random.Random) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(path)], stdout=subprocess.PIPE, env=ENV)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.25))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_a_killed_save_leaves_the_old_or_the_new_checkpoint_whole(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "c.psk.d"
    size = None
    for _ in range(KILLS):
        run_and_kill("file", path, rng)
        back = ck.restore(path, expected(0))
        k = int(back["k"])
        for key, value in expected(k).items():
            np.testing.assert_array_equal(back[key], value)
        size = size or path.stat().st_size
        assert path.stat().st_size == size
        assert ck.read_layout(ck.layout_path_for(path)).leaves[0].path == "['w']"


def test_a_killed_manager_keeps_a_complete_latest_step(tmp_path):
    rng = random.Random(11)
    directory = tmp_path / "run"
    for _ in range(KILLS):
        run_and_kill("manager", directory, rng)
        with CheckpointManager(directory, keep=2) as manager:  # (closed: the next child opens the directory)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---------------------------------------------------------------------------------------------
# ``pskd corpus build`` killed and resumed


CORPUS_KILLS = 3


def start_build(inputs, out, workers) -> subprocess.Popen:
    return start_pskd("corpus", "build", *inputs, "-o", out, "--workers", workers, "--chunk-tokens", "1000",
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finished_shards(out: pathlib.Path) -> int:
    """Shards the journal of a build in progress lists (its first line is a header)."""
    try:
        return max(0, (out / ".shards.journal").read_bytes().count(b"\n") - 1)
    except OSError:
        return 0


@pytest.mark.parametrize("workers", [2])  # one worker: the kill series of tests/robustness/test_faults.py
def test_a_killed_build_finishes_byte_identical(tmp_path, workers):
    inputs = [documents(tmp_path / f"in{i}.jsonl", 1500 + 300 * i, i, width=40) for i in range(5)]
    assert start_build(inputs, tmp_path / "ref", workers).wait(timeout=120) == 0
    out = tmp_path / "out"
    rng = random.Random(workers)
    running = []
    # Killed at random points: once 0..4 shards are done (in increasing order, since a rerun keeps
    # what is done), plus a random delay that lands in start-up, a shard's chunks, or the journal.
    for target in sorted(rng.sample(range(len(inputs)), CORPUS_KILLS)):
        child = start_build(inputs, out, workers)
        deadline = time.monotonic() + 60
        while child.poll() is None and finished_shards(out) < target and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.15))
        running.append(child.poll() is None)
        child.send_signal(signal.SIGKILL)  # a no-op when poll() above already reaped it
        child.wait()
    assert any(running)
    child = start_build(inputs, out, workers)
    assert child.wait(timeout=120) == 0
    names = sorted(os.listdir(tmp_path / "ref"))
    assert sorted(os.listdir(out)) == names
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    corpus.verify_corpus(out / "shards.json")
