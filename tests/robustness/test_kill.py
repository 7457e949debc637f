"""A process saving checkpoints is killed with SIGKILL at random points: the path then holds the
old checkpoint or the new one, whole; a manager's latest step is complete and verifies."""

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
from pskd_jax.checkpoint.manager import CheckpointManager

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(path)], stdout=subprocess.PIPE, env=env)
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
