"""CheckpointManager: steps, extra JSON, async saves, pruning, half-written steps, digests."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from pskd_jax.errors import PskdError
from pskd_jax.manager import INDEX, CheckpointManager, read_index, step_file


def params(step: int) -> dict:
    return {"w": np.full((4, 3), step, np.float32), "h": np.full(2, step, ml_dtypes.bfloat16),
            "step": np.int32(step)}


def test_save_list_restore_and_extra(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.all_steps() == [] and manager.latest_step() is None
    for step in (5, 1, 3):
        manager.save(step, params(step), extra={"epoch": 1, "batch": step})
    assert manager.all_steps() == [1, 3, 5] and manager.latest_step() == 5
    back = manager.restore(target=params(0))
    assert int(back["step"]) == 5 and back["w"].dtype == np.float32
    assert manager.restore(3, params(0))["w"][0, 0] == 3
    assert manager.extra() == {"epoch": 1, "batch": 5} and manager.extra(1)["batch"] == 1
    # the layout beside each step lets it be read without a target
    assert float(manager.restore(1, as_numpy=True)["h"][0]) == 1.0
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["format"] == "pskd-checkpoints" and [e["step"] for e in index["checkpoints"]] == [1, 3, 5]
    assert all(len(e["sha256"]) == 64 for e in index["checkpoints"])


def test_keep_prunes_oldest_and_never_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 6):
        manager.save(step, params(step))
    assert manager.all_steps() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == [INDEX, "step-00000004.layout.json", "step-00000004.psk.d",
                                            "step-00000005.layout.json", "step-00000005.psk.d"]
    one = CheckpointManager(tmp_path, keep=1)
    one.save(6, params(6))
    assert one.all_steps() == [6]
    with pytest.raises(PskdError) as e:
        CheckpointManager(tmp_path, keep=0)
    assert e.value.code == "E9014"


def test_resaving_a_step_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1), extra={"v": 1})
    manager.save(1, params(7), extra={"v": 2})
    assert manager.all_steps() == [1] and manager.extra(1) == {"v": 2}
    assert int(manager.restore(1, params(0))["step"]) == 7


def test_async_save_snapshots_the_arrays_first(tmp_path):
    manager = CheckpointManager(tmp_path)
    tree = params(1)
    manager.save_async(1, tree, extra={"step": 1})
    tree["w"][:] = 99  # training goes on and overwrites its buffers
    manager.wait()
    np.testing.assert_array_equal(manager.restore(1, params(0))["w"], np.full((4, 3), 1, np.float32))
    assert tree["w"][0, 0] == 99


def test_async_errors_surface_in_wait(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    bad = params(2)
    bad["w"][1, 2] = np.inf
    manager.save_async(2, bad)
    with pytest.raises(PskdError) as e:
        manager.wait()
    assert e.value.code == "E9004" and "['w'] at index [1, 2]" in e.value.message
    assert manager.all_steps() == [1]
    manager.wait()  # the error was handed over once


def test_several_async_saves_in_a_row(tmp_path):
    with CheckpointManager(tmp_path, keep=3) as manager:
        for step in range(6):
            manager.save_async(step, params(step), extra={"step": step})
    assert manager.all_steps() == [3, 4, 5]
    assert manager.extra() == {"step": 5}


def test_half_written_steps_are_not_complete_and_are_cleaned(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    # a crash between the rename of step 2 and the index: the file is whole but not indexed
    (tmp_path / step_file(2)).write_bytes((tmp_path / step_file(1)).read_bytes())
    # a crash in the middle of writing step 3: a temporary file
    (tmp_path / ".step-00000003.psk.d.abc123.tmp").write_bytes(b"PSKD\x02")
    assert manager.all_steps() == [1] and manager.latest_step() == 1
    reopened = CheckpointManager(tmp_path)
    assert reopened.latest_step() == 1
    assert sorted(os.listdir(tmp_path)) == [INDEX, "step-00000001.layout.json", "step-00000001.psk.d"]
    with pytest.raises(PskdError) as e:
        reopened.restore(2)
    assert e.value.code == "E9014" and "step 2" in e.value.message


def test_verify_names_the_damaged_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    manager.save(2, params(2))
    assert [e["step"] for e in manager.verify()] == [1, 2]
    path = tmp_path / step_file(2)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(PskdError) as e:
        manager.restore(2, params(0), verify=True)
    assert e.value.code == "E9013" and "step-00000002.psk.d" in e.value.message
    with pytest.raises(PskdError, match="step-00000002.psk.d"):
        manager.verify()
    manager.verify(1)
    manager.restore(1, params(0), verify=True)


def test_a_malformed_index_is_e9014(tmp_path):
    (tmp_path / INDEX).write_text('{"format": "something else"}')
    with pytest.raises(PskdError) as e:
        CheckpointManager(tmp_path)
    assert e.value.code == "E9014" and INDEX in e.value.message
    (tmp_path / INDEX).write_text('{"format": "pskd-checkpoints", "version": 1, "checkpoints": '
                                  '[{"step": 1, "file": "../x.psk.d", "sha256": ""}]}')
    with pytest.raises(PskdError, match="malformed entry"):
        read_index(str(tmp_path))


def test_extra_must_be_json_and_steps_integers(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(PskdError, match="not JSON"):
        manager.save(1, params(1), extra={"x": object()})
    with pytest.raises(PskdError, match="step"):
        manager.save(-1, params(1))
    assert manager.all_steps() == []
