"""A step's layout file must be its own: a manager adopting step files without an index, and
``verify_directory`` (``pskd verify DIR``), prove it by the header digest, the size and the whole
file's xxh3_128 the layout file records — a layout of leaves of other shapes with the same leaf
count, encodings and byte total is refused, naming both files."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointManager, SaveOptions, verify_directory
from pskd_jax.checkpoint.index import INDEX
from tests.helpers import pskd, raises


def other_shapes_layout(tmp_path, directory, step: int, *, digest="xxh3_128") -> None:
    """Puts beside step ``step`` the layout file of a save of {"w": (4, 2)}, where the step holds
    {"w": (2, 4)}: the same type, leaf count, encodings and size."""
    other = tmp_path / "other"
    with CheckpointManager(other, save_options=SaveOptions(digest=digest)) as manager:
        manager.save(step, {"w": np.arange(8, dtype=np.float32).reshape(4, 2) + 100})
    shutil.copyfile(other / step_layout(step), directory / step_layout(step))


def saved(directory, steps, *, digest="xxh3_128"):
    with CheckpointManager(directory, save_options=SaveOptions(digest=digest)) as manager:
        for step in steps:
            manager.save(step, {"w": np.arange(8, dtype=np.float32).reshape(2, 4) + step})


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
def test_a_layout_of_other_shapes_is_not_adopted(tmp_path, digest):
    # (a sha256 manager's step is hashed with sha256; its layout file records the xxh3_128 it
    # must match only when the save computed one: the default manager's saves do, the other
    # layout here is the default's)
    directory = tmp_path / "run"
    saved(directory, [1, 2], digest=digest)
    other_shapes_layout(tmp_path, directory, 2)
    (directory / INDEX).unlink()
    before = sorted(os.listdir(directory))
    with raises("E9014", "cannot be adopted", step_layout(2), "xxh3_128", "Nothing was changed") as e:
        CheckpointManager(directory, save_options=SaveOptions(digest=digest))
    assert step_file(1) not in e.value.message.split("adopted:")[1]
    assert sorted(os.listdir(directory)) == before and not (directory / INDEX).exists()


def test_its_own_layout_is_adopted(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1, 2])
    (directory / INDEX).unlink()
    with CheckpointManager(directory) as manager:
        assert manager.all_steps() == [1, 2]
        assert manager.restore(2, as_numpy=True)["w"].shape == (2, 4)


def test_verify_checks_each_steps_layout_file_belongs(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1, 2])
    assert [e.step for e in verify_directory(str(directory))] == [1, 2]
    other_shapes_layout(tmp_path, directory, 2)
    with raises("E9005", f"step 2 {directory / step_file(2)}", str(directory / step_layout(2)), "xxh3_128"):
        verify_directory(str(directory))
    assert [e.step for e in verify_directory(str(directory), step=1)] == [1]


def test_verify_names_a_listed_layout_file_that_is_missing_or_damaged(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1])
    (directory / step_layout(1)).write_text("{")
    with raises("E9001", str(directory / step_file(1)), str(directory / step_layout(1))):
        verify_directory(str(directory))
    (directory / step_layout(1)).unlink()
    with raises("E9001", str(directory / step_file(1)), str(directory / step_layout(1))):
        verify_directory(str(directory))


def test_verify_checks_a_layout_of_another_header(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1])
    ck.save(tmp_path / "x.psk.d", {"w": np.zeros(4, np.float64)})  # other encodings, same size
    shutil.copyfile(tmp_path / "x.layout.json", directory / step_layout(1))
    with raises("E9005", "another header"):
        verify_directory(str(directory))


@pytest.mark.subprocess
def test_pskd_verify_refuses_a_layout_of_another_save(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1, 2])
    other_shapes_layout(tmp_path, directory, 1)
    result = pskd("verify", directory)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("pskd: E9005: step 1 ") and str(directory / step_layout(1)) in result.stderr
    assert "Traceback" not in result.stderr
    content = json.loads((directory / INDEX).read_text())
    assert [e["step"] for e in content["checkpoints"]] == [1, 2]  # nothing changed


def edited_layout(directory, step: int | None, edit, *, path=None) -> None:
    """Edits step ``step``'s own layout file by hand (its ``data`` still records the step's file),
    or the layout file ``path``."""
    path = path or directory / step_layout(step)
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content))


def swap_shape(content) -> None:
    content["leaves"][0]["shape"] = [4, 2]  # (2, 4) saved: the same byte total


def rename_key(content) -> None:
    content["leaves"][0].update(keys=["v"], path="['v']")
    content["tree"]["dict"][0][0] = "v"


@pytest.mark.parametrize("digest", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("edit", [swap_shape, rename_key])
def test_a_hand_edited_layout_of_a_listed_step_is_e9013_when_verified(tmp_path, digest, edit):
    # The data file's digest does not cover its layout file: the index records the layout's too,
    # or a verified restore hands the recorded bytes back in another shape or under another key.
    directory = tmp_path / "run"
    saved(directory, [1, 2], digest=digest)
    assert set(ck.read_index(str(directory))[1].layout_digest) == {digest}
    edited_layout(directory, 2, edit)
    with CheckpointManager(directory, read_only=True) as manager:
        for read in (lambda: manager.restore(2, as_numpy=True), lambda: manager.verify(), lambda: manager.verify(2)):
            with raises("E9013", str(directory / step_file(2)), str(directory / step_layout(2))):
                read()
        assert manager.restore(1, as_numpy=True)["w"].shape == (2, 4)
        unchecked = manager.restore(2, as_numpy=True, verify=False)  # as the edited layout file says
        assert [leaf.size for leaf in unchecked.values()] == [8]


@pytest.mark.subprocess
@pytest.mark.parametrize("edit", [swap_shape, rename_key])
def test_verifying_one_step_file_of_a_manager_checks_its_layout_as_the_manager_does(tmp_path, edit):
    # `pskd verify DIR/step-N.psk.d` and verify_file of a listed step check what `pskd verify DIR`
    # and a verified restore check: an edited layout file is E9013 naming the step file and it.
    directory = tmp_path / "run"
    saved(directory, [1, 2])
    edited_layout(directory, 2, edit)
    path, recorded = directory / step_file(2), ck.read_index(str(directory))[1].checkable_digests()
    with raises("E9013", str(path), str(directory / step_layout(2))):
        ck.verify_file(path, recorded)
    result = pskd("verify", path)
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"pskd: E9013: step 2 {path}: its layout file: ")
    assert ck.verify_file(directory / step_file(1), ck.read_index(str(directory))[0].checkable_digests()) \
        == "xxh3_128"
    # a plain file outside a manager: no recorded layout digest, nothing to compare its layout with
    plain = tmp_path / "plain.psk.d"
    digests = ck.save(plain, {"w": np.arange(8, dtype=np.float32).reshape(2, 4)},
                      SaveOptions(digest="xxh3_128")).digests
    edited_layout(tmp_path, None, edit, path=tmp_path / "plain.layout.json")
    assert ck.verify_file(plain, digests) == "xxh3_128"


def test_an_adopted_step_records_its_layouts_digest_too(tmp_path):
    directory = tmp_path / "run"
    saved(directory, [1])
    recorded = ck.read_index(str(directory))[0].layout_digest
    (directory / INDEX).unlink()
    with CheckpointManager(directory) as manager:
        assert ck.read_index(str(directory))[0].layout_digest == recorded
        edited_layout(directory, 1, swap_shape)
        with raises("E9013", str(directory / step_layout(1))):
            manager.restore(1, as_numpy=True)


def test_an_entry_recording_no_layout_digest_restores_as_before(tmp_path):
    # (an index written before layout digests were recorded)
    directory = tmp_path / "run"
    saved(directory, [1])
    content = json.loads((directory / INDEX).read_text())
    del content["checkpoints"][0]["layout_digest"]
    (directory / INDEX).write_text(json.dumps(content))
    with CheckpointManager(directory) as manager:
        assert manager.restore(1, as_numpy=True)["w"].shape == (2, 4)
        assert [e.step for e in manager.verify()] == [1]


@pytest.mark.parametrize("value, why", [({"xxh3_128": 5}, "not a map"), ("00", "not a map"), ({}, "not a map")])
def test_a_malformed_layout_digest_is_refused(tmp_path, value, why):
    directory = tmp_path / "run"
    saved(directory, [1])
    content = json.loads((directory / INDEX).read_text())
    content["checkpoints"][0]["layout_digest"] = value
    (directory / INDEX).write_text(json.dumps(content))
    with raises("E9014", INDEX, "layout_digest", why):
        CheckpointManager(directory, read_only=True)
