"""Two processes saving into one checkpoint directory at once: a second CheckpointManager is refused
(E9014 naming the directory) while the first has it open, and plain saves of one destination take
turns, so that a checkpoint and its layout file always come from the same save."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.names import save_lock
from pskd_jax.checkpoint import CheckpointManager, read_index, verify_directory
from pskd_jax.checkpoint.index import INDEX
from pskd_jax.checkpoint.takeover import LOCK
from tests.helpers import pskd, python, wait_until, wait_until_waiting_for_lock

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def finish(child: subprocess.Popen, timeout: float = 120) -> str:
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, err
    return out


HOLDER = """
    import sys, numpy as np
    from pskd_jax.checkpoint import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    manager.save(1, {"w": np.ones(4, np.float32)})
    print("ready", flush=True)
    sys.stdin.readline()
    manager.close()
    print("closed", flush=True)
    sys.stdin.readline()  # alive until told: the close, not the exit, released the directory
"""

OPENER = """
    import sys, numpy as np
    from pskd_jax.errors import PskdError
    from pskd_jax.checkpoint import CheckpointManager
    try:
        manager = CheckpointManager(sys.argv[1])
    except PskdError as e:
        print(e.code, e.message)
    else:
        manager.save(2, {"w": np.full(4, 2, np.float32)})
        manager.close()
        print("saved")
"""


def test_a_second_manager_is_refused_until_the_first_closes(tmp_path):
    directory = tmp_path / "run"
    holder = python(HOLDER, directory, stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        refused = finish(python(OPENER, directory))
        assert refused.startswith("E9014 ") and str(directory) in refused and "another CheckpointManager" in refused
        # the lock file upsets neither listing nor `pskd verify`, which takes no lock
        assert (directory / LOCK).exists()
        assert [e.step for e in verify_directory(str(directory))] == [1]
        verify = pskd("verify", directory)
        assert verify.returncode == 0 and verify.stdout.endswith(f"1 checkpoint verified in {directory}\n"), \
            verify.stderr
        with CheckpointManager(directory, read_only=True) as reader:
            assert reader.all_steps() == [1]
        holder.stdin.write("close\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert finish(python(OPENER, directory)).strip() == "saved"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert [e.step for e in verify_directory(str(directory))] == [1, 2]


RACER = """
    import os, sys, time, numpy as np
    from pskd_jax.errors import PskdError
    from pskd_jax.checkpoint import CheckpointManager, Retention, SaveOptions
    directory, go, me = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)  # imported: both try at once once told
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        manager = CheckpointManager(directory, retention=Retention(keep=3), save_options=SaveOptions(durable=False))
    except PskdError as e:
        open(f"{go}.refused", "w").close()
        print(e.code, e.message)
        sys.exit(0)
    for i in range(12):
        manager.save(me * 100 + i, {"w": np.full(256, i, np.float32), "who": np.int32(me)}, extra={"me": me})
    guard = time.monotonic() + 600
    while not os.path.exists(f"{go}.refused") and time.monotonic() < guard:
        time.sleep(0.001)  # still open until the other one has tried
    manager.close()
    print("saved")
"""


def test_two_processes_opening_one_directory_at_once(tmp_path):
    directory, go = tmp_path / "run", tmp_path / "go"
    directory.mkdir()
    racers = [python(RACER, directory, go, me) for me in (1, 2)]
    assert [racer.stdout.readline().strip() for racer in racers] == ["ready", "ready"]
    go.write_text("")
    outcomes = [finish(racer) for racer in racers]
    assert sorted(o.split(" ")[0].strip() for o in outcomes) == ["E9014", "saved"], outcomes
    winner = 1 + [o.strip() for o in outcomes].index("saved")
    entries = read_index(str(directory))
    assert [e.step for e in entries] == [winner * 100 + i for i in (9, 10, 11)]
    assert all(e.extra == {"me": winner} for e in entries)
    verify_directory(str(directory))
    names = sorted(os.listdir(directory))
    assert names == sorted([LOCK, INDEX] + [name for e in entries for name in e.names])


SAVER = """
    import os, sys, time, numpy as np
    from pskd_jax import checkpoint as ck
    path, go, stop, me = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    i = 0
    while not os.path.exists(stop) or i < 5:
        if me == 1:
            tree = {"a": np.full(20000, i, np.float32)}
        else:
            tree = {"b": [np.full(3000, i, np.float64), np.full(7, i, np.float64)], "c": np.int64(i)}
        ck.save(path, tree, ck.SaveOptions(durable=False))
        i += 1
    print("saved", i, flush=True)
"""


def check_pair(path) -> None:
    """The checkpoint restores through its layout file, to the values of one save."""
    back = ck.restore(path, as_numpy=True)
    if "a" in back:
        assert list(back) == ["a"] and back["a"].shape == (20000,) and (back["a"] == back["a"][0]).all()
    else:
        assert list(back) == ["b", "c"] and [leaf.shape for leaf in back["b"]] == [(3000,), (7,)]
        assert all((leaf == int(back["c"])).all() for leaf in back["b"])


def test_plain_saves_of_one_destination_take_turns(tmp_path):
    path, go, stop = tmp_path / "c.psk.d", tmp_path / "go", tmp_path / "stop"
    savers = [python(SAVER, path, go, stop, me) for me in (1, 2)]
    try:
        assert [saver.stdout.readline().strip() for saver in savers] == ["ready", "ready"]
        go.write_text("")
        seen: set = set()  # (the tree's keys, the file's mtime): the saves looked at

        def looked_enough() -> bool:
            # between two saves (holding the lock they take), the pair on disk is always one save's
            with destination_lock(path):
                if path.exists():
                    check_pair(path)
                    seen.add((tuple(ck.restore(path, as_numpy=True)), os.stat(path).st_mtime_ns))
            return len(seen) >= 40 and len({k for k, _ in seen}) == 2

        for saver in savers:  # (both keep saving until told to stop)
            wait_until(looked_enough, alive=saver, what="40 saves of both savers looked at")
    finally:
        stop.write_text("")
    assert [finish(saver).split()[0] for saver in savers] == ["saved", "saved"]
    assert {keys for keys, _ in seen} == {("a",), ("b", "c")}
    check_pair(path)
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d", "go", "stop"]


def test_a_save_waits_for_another_save_of_its_destination(tmp_path):
    path = tmp_path / "c.psk.d"
    code = """
        import sys, numpy as np
        from pskd_jax import checkpoint as ck
        ck.save(sys.argv[1], {"w": np.arange(5, dtype=np.float32)})
        print("saved", flush=True)
    """
    with destination_lock(path) as held:
        assert held
        with destination_lock(path, wait=False) as again:  # (another holder, even in this process)
            assert not again
        child = python(code, path)
        wait_until_waiting_for_lock(child, save_lock(path))  # the save reached the lock and waits
        assert not path.exists(), "the save did not wait for the lock"
    assert finish(child).strip() == "saved"
    assert ck.restore(path, as_numpy=True)["w"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d"]  # the lock file went with the save


def test_a_lock_file_left_by_a_killed_save_is_reused_and_removed(tmp_path):
    path = tmp_path / "c.psk.d"
    pathlib.Path(save_lock(path)).write_bytes(b"")
    ck.save(path, {"w": np.ones(2)})
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
