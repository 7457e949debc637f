"""The manager's retention (keep, keep_period, best-N by a score), save intervals, verified restores
by default, and a manager made again for the same directory in the same process."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from pskd_jax._os.names import step_file
from pskd_jax.checkpoint import Retention, SaveOptions
from pskd_jax.checkpoint import manager as manager_module
from pskd_jax.checkpoint.index import INDEX, read_index
from pskd_jax.checkpoint.manager import CheckpointManager, ManagerState
from pskd_jax.errors import PskdError
from tests.helpers import HANG_GUARD_S, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]


def params(step: int) -> dict:
    return {"w": np.full((4, 3), step, np.float32), "step": np.int32(step)}


def files_of(directory) -> list[int]:
    """The steps whose checkpoint file is in the directory."""
    return sorted(int(name[5:-6]) for name in os.listdir(directory) if name.endswith(".psk.d"))


# -- retention -----------------------------------------------------------------------------------


def test_keep_period_also_keeps_every_multiple(tmp_path):
    with CheckpointManager(tmp_path, retention=Retention(keep=2, keep_period=3)) as manager:
        for step in range(11):
            manager.save(step, params(step))
        assert manager.all_steps() == [0, 3, 6, 9, 10]
    assert files_of(tmp_path) == [0, 3, 6, 9, 10]


def test_keep_period_alone_keeps_everything(tmp_path):
    with CheckpointManager(tmp_path, retention=Retention(keep_period=4)) as manager:
        for step in range(6):
            manager.save(step, params(step))
        assert manager.all_steps() == list(range(6))


LOSSES = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.3, 5: 0.8, 6: 0.6, 7: 0.95}


@pytest.mark.parametrize("mode, best", [("min", [4, 2]), ("max", [7, 1])])
def test_keep_best_by_a_score_of_the_metrics(tmp_path, mode, best):
    policy = Retention(keep=1, best_fn=lambda m: m["loss"], best_mode=mode, keep_best=2)
    with CheckpointManager(tmp_path, retention=policy) as manager:
        for step, loss in LOSSES.items():
            manager.save(step, params(step), metrics={"loss": np.float32(loss)})
        kept = sorted(set(best) | {7})
        assert manager.all_steps() == kept and files_of(tmp_path) == kept
        assert manager.best_step() == best[0]
        assert manager.score(best[0]) == pytest.approx(LOSSES[best[0]])
        assert manager.extra(best[0]) is None  # metrics are given to best_fn, not stored as extra


def test_keep_best_without_keep_keeps_the_best_and_the_newest(tmp_path):
    policy = Retention(best_fn=lambda m: m["loss"], best_mode="min", keep_best=1)
    with CheckpointManager(tmp_path, retention=policy) as manager:
        for step, loss in LOSSES.items():
            manager.save(step, params(step), metrics={"loss": loss})
            assert step in manager.all_steps(), "the newest complete checkpoint was removed"
        assert manager.all_steps() == [4, 7]


def test_the_score_comes_from_extra_when_no_metrics_are_given(tmp_path):
    policy = Retention(best_fn=lambda e: e["eval"]["loss"], best_mode="min", keep_best=1, keep=1)
    with CheckpointManager(tmp_path, retention=policy) as manager:
        for step, loss in LOSSES.items():
            manager.save(step, params(step), extra={"eval": {"loss": loss}, "batch": step})
        assert manager.all_steps() == [4, 7] and manager.extra(4)["batch"] == 4
    assert [e.score for e in read_index(str(tmp_path))] == [0.3, 0.95]


def test_steps_without_a_score_are_kept_by_the_other_rules_only(tmp_path):
    def best(metrics):
        return metrics.get("loss")  # None: no score

    with CheckpointManager(tmp_path, retention=Retention(keep=2, best_fn=best, best_mode="min", keep_best=1)) \
            as manager:
        manager.save(1, params(1), metrics={"loss": 0.1})
        manager.save(2, params(2), metrics={"loss": None})  # a diverged run's best_fn says: no score
        manager.save(3, params(3))  # no metrics, no extra
        manager.save(4, params(4), metrics={})
        manager.save(5, params(5), metrics={"loss": None})
        assert manager.all_steps() == [1, 4, 5]
        assert [manager.score(s) for s in (1, 4, 5)] == [0.1, None, None]
        assert manager.best_step() == 1


def test_equal_scores_prefer_the_newer_step(tmp_path):
    policy = Retention(keep=1, best_fn=lambda m: m, best_mode="max", keep_best=1)
    with CheckpointManager(tmp_path, retention=policy) as manager:
        for step in (1, 2, 3):
            manager.save(step, params(step), metrics=5)
        manager.save(4, params(4), metrics=1)
        assert manager.all_steps() == [3, 4] and manager.best_step() == 3


@pytest.mark.parametrize("best_fn, code, why", [
    (lambda m: m["missing"], "E9012", "KeyError"),  # best_fn failed
    (lambda m: "0.5", "E9014", "returned '0.5'"),  # a value the index cannot record as a score
    (lambda m: True, "E9014", "returned True"),
    (lambda m: [1.0], "E9014", "returned [1.0]"),
    (lambda m: 1j, "E9014", "returned 1j"),
])
def test_a_best_fn_that_fails_is_refused_naming_the_step_and_nothing_is_written(tmp_path, best_fn, code, why):
    with CheckpointManager(tmp_path, retention=Retention(best_fn=best_fn, best_mode="min", keep_best=1)) as manager:
        manager.save(1, params(1))  # no metrics, no extra: best_fn is not asked
        before = (tmp_path / INDEX).read_bytes()
        for attempt in (lambda: manager.save(2, params(2), metrics={"loss": 1}),
                        lambda: manager.save_async(2, params(2), metrics={"loss": 1})):
            with pytest.raises(PskdError) as e:
                attempt()
            assert e.value.code == code and "step 2" in e.value.message and why in e.value.message
        assert (tmp_path / INDEX).read_bytes() == before and files_of(tmp_path) == [1]


def test_a_best_fn_may_return_numpy_and_jax_scalars(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    policy = Retention(keep=1, best_fn=lambda m: m["loss"], best_mode="min", keep_best=1)
    with CheckpointManager(tmp_path, retention=policy) as manager:
        manager.save(1, params(1), metrics={"loss": jnp.float32(0.25)})
        manager.save(2, params(2), metrics={"loss": np.float64(0.5)})
        manager.save(3, params(3), metrics={"loss": np.array(0.75)})
        assert manager.all_steps() == [1, 3] and manager.score(1) == 0.25


@pytest.mark.parametrize("options, fragment", [
    ({"keep": 0}, "keep=0"),
    ({"keep": True}, "keep=True"),
    ({"keep_period": 0}, "keep_period=0"),
    ({"keep_period": 2.5}, "keep_period=2.5"),
    ({"keep_best": 2}, "keep_best needs best_fn"),
    ({"best_fn": len}, "best_fn and best_mode go together"),
    ({"best_mode": "min"}, "best_fn and best_mode go together"),
    ({"best_fn": len, "best_mode": "lowest"}, "best_mode='lowest'"),
    ({"best_fn": 3, "best_mode": "min"}, "best_fn=3"),
    ({"save_interval_steps": 0}, "save_interval_steps=0"),
    ({"save_interval_steps": "10"}, "save_interval_steps='10'"),
])
def test_bad_retention_options_are_e9014(tmp_path, options, fragment):
    with pytest.raises(PskdError) as e:
        if "save_interval_steps" in options:
            CheckpointManager(tmp_path, **options)
        else:
            CheckpointManager(tmp_path, retention=Retention(**options))
    assert e.value.code == "E9014" and fragment in e.value.message
    assert not os.path.exists(tmp_path / INDEX)


def test_retention_resumes_with_the_scores_recorded_before(tmp_path):
    policy = Retention(keep=1, best_fn=lambda m: m["loss"], best_mode="min", keep_best=1)
    with CheckpointManager(tmp_path, retention=policy) as first:
        first.save(1, params(1), metrics={"loss": 0.1})
        first.save(2, params(2), metrics={"loss": 0.5})
    with CheckpointManager(tmp_path, retention=policy) as second:  # a resumed run
        second.save(3, params(3), metrics={"loss": 0.4})
        assert second.all_steps() == [1, 3]


# -- save intervals ---------------------------------------------------------------------------------


def test_save_interval_steps_as_a_training_loop_uses_it(tmp_path):
    with CheckpointManager(tmp_path, save_interval_steps=3) as manager:
        results = [manager.save(step, params(step)) for step in range(10)]
        assert manager.all_steps() == [0, 3, 6, 9]
        assert [r is not None for r in results] == [s % 3 == 0 for s in range(10)]
        assert manager.save(10, params(10), force=True) is not None  # the last step of a run
        assert manager.all_steps() == [0, 3, 6, 9, 10]
        assert manager.save(9, params(9)) is None  # not beyond the latest
        assert [manager.should_save(s) for s in (10, 11, 12, 13, 15)] == [False, False, True, False, True]


def test_should_save_without_an_interval(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        assert manager.should_save(0) and manager.should_save(7)
        manager.save(5, params(5))
        assert not manager.should_save(5) and not manager.should_save(3) and manager.should_save(6)
        assert manager.save(3, params(3)) is not None  # without an interval, save saves what it is given
    assert not CheckpointManager(tmp_path, read_only=True).should_save(100)
    with pytest.raises(PskdError, match="E9014.*a step is an integer"):
        manager.should_save(-1)


def test_should_save_counts_a_save_still_running(tmp_path):
    with CheckpointManager(tmp_path, save_interval_steps=2) as manager:
        assert manager.save_async(4, params(4)) is True
        assert not manager.should_save(4) and manager.should_save(6)
        assert manager.save_async(5, params(5)) is False
        manager.wait()
        assert manager.all_steps() == [4]


# -- verified restores --------------------------------------------------------------------------------


def flip_a_byte(path) -> None:
    data = bytearray(pathlib.Path(path).read_bytes())
    data[-5] ^= 0x01
    pathlib.Path(path).write_bytes(bytes(data))


def test_restore_verifies_by_default(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params(1))
        manager.save(2, params(2))
        flip_a_byte(manager.path(2))
        for attempt in (lambda: manager.restore(), lambda: manager.restore(2, params(0)),
                        lambda: manager.restore(2, as_numpy=True), lambda: manager.restore(2, zero_copy=True)):
            with pytest.raises(PskdError) as e:
                attempt()
            assert e.value.code == "E9013" and step_file(2) in e.value.message
        damaged = manager.restore(2, params(0), verify=False)  # opted out: what the file holds now
        assert damaged["w"].shape == (4, 3)
        assert int(manager.restore(1, params(0))["step"]) == 1
        with pytest.raises(PskdError, match="E9012.*verify=False"):
            manager.restore(1, params(0), digests={"xxh3_128": "0" * 32})


# -- a manager made again in the same process --------------------------------------------------------


def test_a_second_manager_in_the_same_process_takes_over(tmp_path):
    first = CheckpointManager(tmp_path, retention=Retention(keep=3))
    first.save(1, params(1))
    second = CheckpointManager(tmp_path, retention=Retention(keep=3))  # the notebook cell run again
    second.save(2, params(2))
    with pytest.raises(PskdError) as e:
        first.save(3, params(3))
    assert e.value.code == "E9014" and "superseded" in e.value.message and str(tmp_path) in e.value.message
    with pytest.raises(PskdError, match="superseded"):
        first.save_async(3, params(3))
    assert first.all_steps() == [1, 2] and int(first.restore(2, params(0))["step"]) == 2  # it still reads
    assert not first.should_save(10)
    first.close()  # gives back nothing: the lock is the second one's now
    second.save(3, params(3))
    assert second.all_steps() == [1, 2, 3]
    second.close()
    with CheckpointManager(tmp_path) as third:  # after a close, a new manager simply opens it
        assert third.all_steps() == [1, 2, 3]


def test_a_cell_run_twice_rebinding_its_variable(tmp_path):
    kept = []
    for run in range(3):
        manager = CheckpointManager(tmp_path / "ckpt", retention=Retention(keep=2))
        kept.append(manager)  # (what a notebook's output history may hold on to)
        manager.save(run, params(run))
    assert manager.all_steps() == [1, 2]
    assert [m.state for m in kept] == [ManagerState.SUPERSEDED, ManagerState.SUPERSEDED, ManagerState.OPEN]


def test_a_take_over_waits_for_the_background_save(tmp_path, monkeypatch):
    real = manager_module.save
    started, go = threading.Event(), threading.Event()

    def slow_save(path, tree, **options):
        started.set()
        go.wait(HANG_GUARD_S)
        return real(path, tree, **options)

    monkeypatch.setattr(manager_module, "save", slow_save)
    first = CheckpointManager(tmp_path)
    first.save_async(1, params(1))
    assert started.wait(HANG_GUARD_S)
    made = []
    maker = threading.Thread(target=lambda: made.append(CheckpointManager(tmp_path)))
    maker.start()

    def joining() -> bool:  # the maker waits for a thread to end (the old manager's save)
        frame = sys._current_frames().get(maker.ident)
        while frame is not None:
            if frame.f_code.co_name == "join" and frame.f_code.co_filename == threading.__file__:
                return True
            frame = frame.f_back
        assert maker.is_alive() and not made, "the new manager did not wait for the old one's save"
        return False

    wait_until(joining, what="the new manager waiting for the old one's save")
    go.set()
    maker.join(HANG_GUARD_S)
    [second] = made
    assert second.all_steps() == [1]  # the old manager's save completed, and is listed
    first.wait()
    second.close()


def test_a_take_over_keeps_the_old_managers_error_for_its_wait(tmp_path):
    first = CheckpointManager(tmp_path)
    # refused: narrowing without rounding
    first.save_async(1, {"x": np.full(2, 0.1)}, options=SaveOptions(encodings="bf16"))
    second = CheckpointManager(tmp_path)
    with pytest.raises(PskdError) as e:
        first.wait()
    assert e.value.code == "E9004"
    assert second.all_steps() == []
    second.close()


def test_a_take_over_through_another_path_to_the_directory(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    first = CheckpointManager(tmp_path / "real")
    second = CheckpointManager(tmp_path / "alias")
    second.save(1, params(1))
    with pytest.raises(PskdError, match="superseded"):
        first.save(2, params(2))
    second.close()


OPENER = """
    import sys
    from pskd_jax.errors import PskdError
    from pskd_jax.checkpoint import CheckpointManager
    try:
        CheckpointManager(sys.argv[1]).close()
    except PskdError as e:
        print(e.code, e.message)
    else:
        print("opened")
"""


def open_in_another_process(directory) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(OPENER), str(directory)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.mark.slow
@pytest.mark.subprocess
def test_another_process_is_still_refused_after_a_take_over(tmp_path):
    first = CheckpointManager(tmp_path)
    first.save(1, params(1))
    second = CheckpointManager(tmp_path)  # takes the lock over, never letting it go
    refused = open_in_another_process(tmp_path)
    assert refused.startswith("E9014 ") and "another CheckpointManager" in refused
    first.close()
    del first
    gc.collect()  # the superseded manager, closed and collected, does not release the lock either
    assert open_in_another_process(tmp_path).startswith("E9014 ")
    second.close()
    assert open_in_another_process(tmp_path) == "opened"
    # and a manager collected without close() releases it
    third = CheckpointManager(tmp_path)
    assert open_in_another_process(tmp_path).startswith("E9014 ")
    del third
    gc.collect()
    assert open_in_another_process(tmp_path) == "opened"


def test_index_version_3_records_scores_and_claims(tmp_path):
    with CheckpointManager(tmp_path, retention=Retention(best_fn=lambda m: m, best_mode="min")) as manager:
        manager.save(1, params(1), metrics=2)
    content = json.loads((tmp_path / INDEX).read_text())
    assert content["version"] == 3 and content["leftovers"] == []
    assert content["checkpoints"][0]["score"] == 2.0


FORKER = """
    import os, sys
    import numpy as np
    from pskd_jax.errors import PskdError
    from pskd_jax.checkpoint import CheckpointManager
    parent = CheckpointManager(sys.argv[1])
    parent.save(1, {"w": np.ones(2)})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the registry names the parent's manager
        try:
            CheckpointManager(sys.argv[1])
            os.write(write, b"opened")
        except PskdError as e:
            os.write(write, e.code.encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    print(os.read(read, 100).decode())
    parent.save(2, {"w": np.ones(2)})  # the parent still has it
    parent.close()
    print(CheckpointManager(sys.argv[1], read_only=True).all_steps())
"""


@pytest.mark.subprocess
def test_a_forked_child_does_not_take_over_its_parents_manager(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(FORKER), str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["E9014", "[1, 2]"]
