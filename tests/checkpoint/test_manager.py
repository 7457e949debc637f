"""CheckpointManager: steps, extra JSON, async saves, pruning, half-written steps, digests."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from pskd_jax._os.digests import file_digest, file_sha256
from pskd_jax._os.names import step_file
from pskd_jax.checkpoint import Retention, SaveOptions
from pskd_jax.checkpoint.index import INDEX, read_index
from pskd_jax.checkpoint.manager import CheckpointManager
from pskd_jax.checkpoint.takeover import LOCK
from pskd_jax.errors import PskdError
from tests.helpers import pskd


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
    assert index["version"] == 3
    assert all(list(e["digest"]) == ["xxh3_128"] and len(e["digest"]["xxh3_128"]) == 32 for e in index["checkpoints"])
    assert index["checkpoints"][0]["digest"]["xxh3_128"] == file_digest(tmp_path / step_file(1), "xxh3_128")


def test_keep_prunes_oldest_and_never_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, retention=Retention(keep=2))
    for step in range(1, 6):
        manager.save(step, params(step))
    assert manager.all_steps() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, "step-00000004.layout.json", "step-00000004.psk.d",
                                            "step-00000005.layout.json", "step-00000005.psk.d"]
    manager.close()
    one = CheckpointManager(tmp_path, retention=Retention(keep=1))
    one.save(6, params(6))
    assert one.all_steps() == [6]
    with pytest.raises(PskdError) as e:
        CheckpointManager(tmp_path, retention=Retention(keep=0))
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
    manager.save_async(2, bad, options=SaveOptions(finite_only=True))  # (checkpoints keep ±inf unless asked)
    with pytest.raises(PskdError) as e:
        manager.wait()
    assert e.value.code == "E9004" and "['w'] at index [1, 2]" in e.value.message
    assert manager.all_steps() == [1]
    manager.wait()  # the error was handed over once


def test_several_async_saves_in_a_row(tmp_path):
    with CheckpointManager(tmp_path, retention=Retention(keep=3)) as manager:
        for step in range(6):
            manager.save_async(step, params(step), extra={"step": step})
    assert manager.all_steps() == [3, 4, 5]
    assert manager.extra() == {"step": 5}


def claim(directory, *steps) -> None:
    """Records ``steps`` under the index's ``leftovers``, as a save of each does before writing it."""
    index = json.loads((directory / INDEX).read_text())
    index["leftovers"] = sorted(set(index.get("leftovers", [])) | set(steps))
    (directory / INDEX).write_text(json.dumps(index))


def test_half_written_steps_are_not_complete_and_are_cleaned(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    claim(tmp_path, 2)  # (a save of step 2 began)
    # a crash between the rename of step 2 and the index: the file is whole but not indexed
    (tmp_path / step_file(2)).write_bytes((tmp_path / step_file(1)).read_bytes())
    # a crash in the middle of writing step 3: a temporary file (named as fileio names them)
    (tmp_path / ".step-00000003.psk.d.abc123_z.tmp").write_bytes(b"PSKD\x02")
    # a save of step 4 killed while it held its lock (checkpoint.destination_lock)
    (tmp_path / ".step-00000004.psk.d.lock").write_bytes(b"")
    assert manager.all_steps() == [1] and manager.latest_step() == 1
    manager.close()
    reopened = CheckpointManager(tmp_path)
    assert reopened.latest_step() == 1
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, "step-00000001.layout.json", "step-00000001.psk.d"]
    with pytest.raises(PskdError) as e:
        reopened.restore(2)
    assert e.value.code == "E9014" and "step 2" in e.value.message


def test_verify_names_the_damaged_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    manager.save(2, params(2))
    assert [e.step for e in manager.verify()] == [1, 2]
    path = tmp_path / step_file(2)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(PskdError) as e:
        manager.restore(2, params(0), verify=True)
    assert e.value.code == "E9013" and "step-00000002.psk.d" in e.value.message and "xxh3_128" in e.value.message
    with pytest.raises(PskdError, match="E9013.*step-00000002.psk.d"):
        manager.restore(2, verify=True)  # to JAX arrays, too
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


def write_version_1_index(directory, steps) -> None:
    """The index as versions before xxh3_128 wrote it: each entry's sha256 beside its file."""
    entries = [{"step": step, "file": step_file(step), "layout": f"step-{step:08d}.layout.json",
                "type": "params Params", "bytes": os.path.getsize(directory / step_file(step)),
                "sha256": file_sha256(directory / step_file(step)), "extra": {"step": step}} for step in steps]
    (directory / INDEX).write_text(json.dumps({"format": "pskd-checkpoints", "version": 1, "checkpoints": entries}))


def test_a_version_1_index_recording_sha256_still_verifies(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    manager.save(2, params(2))
    write_version_1_index(tmp_path, [1, 2])
    manager.close()
    old = CheckpointManager(tmp_path)
    assert old.all_steps() == [1, 2] and old.extra(2) == {"step": 2}
    assert read_index(str(tmp_path))[0].digest == {"sha256": file_sha256(tmp_path / step_file(1))}
    assert [e.step for e in old.verify()] == [1, 2]
    assert int(old.restore(2, params(0), verify=True)["step"]) == 2
    path = tmp_path / step_file(2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(PskdError) as e:
        old.restore(2, params(0), verify=True)
    assert e.value.code == "E9013" and "step-00000002.psk.d" in e.value.message and "sha256" in e.value.message
    with pytest.raises(PskdError, match="E9013.*step-00000002.psk.d"):
        old.verify()
    # a new save rewrites the index as version 2: the old entry keeps its sha256, the new one has xxh3_128
    old.save(3, params(3))
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["version"] == 3
    digests = {e["step"]: e["digest"] for e in index["checkpoints"]}
    assert digests[1] == {"sha256": file_sha256(tmp_path / step_file(1))} and list(digests[3]) == ["xxh3_128"]
    assert all("sha256" not in e for e in index["checkpoints"])
    assert [e.step for e in old.verify(1)] == [1] and old.verify(3)[0].step == 3
    old.restore(1, params(0), verify=True)


def test_an_entry_with_only_unknown_digests_is_e9014(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    index = json.loads((tmp_path / INDEX).read_text())
    index["checkpoints"][0]["digest"] = {"sha3_512": "00"}
    (tmp_path / INDEX).write_text(json.dumps(index))
    with pytest.raises(PskdError, match="E9014.*sha3_512"):
        manager.restore(1, params(0), verify=True)
    assert int(manager.restore(1, params(0), verify=False)["step"]) == 1  # unverified, it restores
    # a recorded xxh3_128 beside an unknown one is checked
    index["checkpoints"][0]["digest"] = {"sha3_512": "00", "xxh3_128": file_digest(tmp_path / step_file(1))}
    (tmp_path / INDEX).write_text(json.dumps(index))
    manager.restore(1, params(0), verify=True)
    for bad in ({}, "abc", {"xxh3_128": 3}):
        index["checkpoints"][0]["digest"] = bad
        (tmp_path / INDEX).write_text(json.dumps(index))
        with pytest.raises(PskdError, match="E9014.*malformed entry"):
            read_index(str(tmp_path))
    index["version"] = 4
    (tmp_path / INDEX).write_text(json.dumps(index))
    with pytest.raises(PskdError, match="E9014.*version 4"):
        read_index(str(tmp_path))


def test_a_manager_may_record_sha256_instead(tmp_path):
    manager = CheckpointManager(tmp_path, save_options=SaveOptions(digest="sha256"))
    manager.save(1, params(1))
    entry = json.loads((tmp_path / INDEX).read_text())["checkpoints"][0]
    assert entry["digest"] == {"sha256": file_sha256(tmp_path / step_file(1))}
    assert int(manager.restore(1, params(0), verify=True)["step"]) == 1
    # the default manager on the same directory keeps reading it, and records xxh3_128 for its own saves
    manager.close()
    mixed = CheckpointManager(tmp_path)
    mixed.save(2, params(2))
    assert [list(e.digest) for e in read_index(str(tmp_path))] == [["sha256"], ["xxh3_128"]]
    assert [e.step for e in mixed.verify()] == [1, 2]
    with pytest.raises(PskdError, match="E9012.*md5"):
        CheckpointManager(tmp_path, save_options=SaveOptions(digest="md5"))


@pytest.mark.parametrize("what, text", [
    ("nested 100000 deep", "[" * 100000 + "]" * 100000),
    ("a NUL in a file name", json.dumps({"format": "pskd-checkpoints", "version": 1, "checkpoints": [
        {"step": 1, "file": "a\u0000b", "sha256": "0" * 64}]})),
    ("a file name of '..'", json.dumps({"format": "pskd-checkpoints", "version": 1, "checkpoints": [
        {"step": 1, "file": "..", "sha256": "0" * 64}]})),
    ("a NUL in a layout file name", json.dumps({"format": "pskd-checkpoints", "version": 2, "checkpoints": [
        {"step": 1, "file": "a.psk.d", "layout": "a\u0000b", "digest": {"xxh3_128": "0" * 32}}]})),
])
def test_a_hostile_index_is_e9014_naming_it(tmp_path, what, text):
    (tmp_path / INDEX).write_text(text)
    for attempt in (lambda: read_index(str(tmp_path)), lambda: CheckpointManager(tmp_path),
                    lambda: CheckpointManager(tmp_path, read_only=True)):
        with pytest.raises(PskdError) as e:
            attempt()
        assert e.value.code == "E9014" and INDEX in e.value.message, what
    if "NUL" in what:
        assert "malformed entry" in e.value.message and "\\x00" in e.value.message
    # a manager refused for its index has released the directory
    (tmp_path / INDEX).unlink()
    CheckpointManager(tmp_path).close()


def test_one_manager_at_a_time_has_a_directory(tmp_path):
    first = CheckpointManager(tmp_path)
    first.save(1, params(1))
    # (another process is refused: test_checkpoint_concurrent.py; a second manager in this process
    # takes over: tests/checkpoint/test_manager_retention.py)
    # a read-only manager reads beside it, and does not save
    reader = CheckpointManager(tmp_path, read_only=True)
    assert reader.all_steps() == [1] and int(reader.restore(1, params(0))["step"]) == 1
    with pytest.raises(PskdError, match="E9014.*read_only"):
        reader.save(2, params(2))
    # the lock file is not a checkpoint
    assert (tmp_path / LOCK).exists() and first.all_steps() == [1] and [e.step for e in first.verify()] == [1]
    first.close()
    with pytest.raises(PskdError, match="E9014.*closed"):
        first.save(2, params(2))
    with CheckpointManager(tmp_path) as second:
        second.save(2, params(2))
    with CheckpointManager(tmp_path) as third:  # after a with block, too
        assert third.all_steps() == [1, 2]
    # a manager dropped without close() releases the directory when it is collected
    CheckpointManager(tmp_path)
    CheckpointManager(tmp_path).close()


def test_leftovers_are_removed_only_when_no_live_writer_holds_them(tmp_path):
    from pskd_jax._os.atomic import atomic_output
    from pskd_jax._os.locks import destination_lock

    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params(1))
    claim(tmp_path, 3, 5)  # saves of steps 3 and 5 began
    stale = tmp_path / ".step-00000002.psk.d.stale_01.tmp"  # a killed writer's: nobody holds it
    stale.write_bytes(b"PSKD")
    unnamed = tmp_path / step_file(5)  # renamed into place by a save still running (not indexed yet)
    unnamed.write_bytes(b"PSKD")
    distributed = tmp_path / ".step-00000005.psk.d.distributed.tmp"
    distributed.write_bytes(b"PSKD")
    with destination_lock(str(tmp_path / step_file(3))), atomic_output(str(tmp_path / step_file(3))) as live, \
            destination_lock(str(tmp_path / step_file(5))):
        live.write(b"PSKD")
        [live_name] = [n for n in os.listdir(tmp_path) if n.startswith(".step-00000003.psk.d.") and n.endswith(".tmp")]
        CheckpointManager(tmp_path).close()
        names = os.listdir(tmp_path)
        assert live_name in names, "a live writer's temporary file was removed"
        assert step_file(5) in names and distributed.name in names, "a running save's files were removed"
        assert stale.name not in names
    # once nobody holds them, they are leftovers (as is step 3, renamed into place but never indexed)
    assert step_file(3) in os.listdir(tmp_path)
    CheckpointManager(tmp_path).close()
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, "step-00000001.layout.json", "step-00000001.psk.d"]


@pytest.mark.subprocess
@pytest.mark.parametrize("which", ["file", "layout"])
def test_an_index_entry_leading_outside_through_a_symlink_is_refused(tmp_path, which):
    import shutil

    from pskd_jax.checkpoint import verify_directory

    directory = tmp_path / "ckpts"
    with CheckpointManager(directory) as manager:
        manager.save(1, params(1))
    name = step_file(1) if which == "file" else step_file(1).replace(".psk.d", ".layout.json")
    outside = tmp_path / ("elsewhere-" + name)
    shutil.move(directory / name, outside)
    os.symlink(outside, directory / name)  # the same bytes, but outside the directory
    reader = CheckpointManager(directory, read_only=True)
    for attempt in (lambda: reader.restore(), lambda: reader.path(1), lambda: verify_directory(str(directory))):
        with pytest.raises(PskdError) as e:
            attempt()
        assert e.value.code == "E9014" and "outside the checkpoint directory" in e.value.message
        assert str(outside) in e.value.message
    run = pskd("verify", directory)
    assert run.returncode == 1 and run.stderr.startswith("pskd: E9014: ") and "Traceback" not in run.stderr
    os.unlink(directory / name)  # a symlink that stays inside is fine
    shutil.move(outside, directory / ("copy-" + name))
    os.symlink("copy-" + name, directory / name)
    assert reader.restore(as_numpy=True)["w"].tolist() == params(1)["w"].tolist()


@pytest.mark.parametrize("step", [True, 1.0, np.float64(1.0), "1"])
def test_a_step_that_is_no_integer_is_refused_when_read_too(tmp_path, step):
    # True == 1 == 1.0 in Python: a lookup by equality would hand back step 1 for any of them
    manager = CheckpointManager(tmp_path)
    manager.save(1, params(1))
    for read in (manager.restore, manager.extra, manager.path, manager.score, manager.verify):
        with pytest.raises(PskdError, match="E9014.*a step is an integer"):
            read(step)
    assert manager.extra(np.int64(1)) is None  # a numpy integer is a step
