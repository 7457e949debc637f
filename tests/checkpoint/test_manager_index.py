"""The checkpoint manager trusts no index: every entry names only its own step's files, and the
manager removes only files it can prove are its own and no longer listed — never the index, the
lock, another program's file, or step files it finds without an index (it adopts those, or
refuses)."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.digests import file_digest, file_sha256
from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import Retention, SaveOptions, verify_directory
from pskd_jax.checkpoint import manager as manager_module
from pskd_jax.checkpoint.index import INDEX, MAX_STEP, read_index
from pskd_jax.checkpoint.manager import CheckpointManager
from pskd_jax.checkpoint.takeover import LOCK
from pskd_jax.errors import PskdError


def params(step: int) -> dict:
    return {"w": np.full((4, 3), step, np.float32), "step": np.int32(step)}


def snapshot(directory: pathlib.Path) -> dict:
    """Everything in a directory, as found: a file's bytes, a link's target, a directory's own
    snapshot, or the kind of anything else."""
    found = {}
    for entry in sorted(os.listdir(directory)):
        path = directory / entry
        if path.is_symlink():
            found[entry] = ("link", os.readlink(path))
        elif path.is_dir():
            found[entry] = ("directory", snapshot(path))
        elif path.is_file():
            found[entry] = ("file", path.read_bytes())
        else:
            found[entry] = ("other", os.stat(path).st_mode)
    return found


def saved(directory: pathlib.Path, steps, **options) -> None:
    with CheckpointManager(directory, **options) as manager:
        for step in steps:
            manager.save(step, params(step), extra={"step": step})


def index_of(directory: pathlib.Path) -> dict:
    return json.loads((directory / INDEX).read_text())


def write_index_json(directory: pathlib.Path, content: dict) -> None:
    (directory / INDEX).write_text(json.dumps(content))


def good_entry(directory: pathlib.Path, step: int) -> dict:
    return next(e for e in index_of(directory)["checkpoints"] if e["step"] == step)


def refused_everywhere(directory: pathlib.Path, *fragments: str) -> str:
    """read_index, verify_directory, a writable and a read-only manager all refuse with E9014
    naming the index; the directory is left exactly as it was."""
    before = snapshot(directory)
    message = ""
    for attempt in (lambda: read_index(str(directory)), lambda: verify_directory(str(directory)),
                    lambda: CheckpointManager(directory), lambda: CheckpointManager(directory, read_only=True)):
        with pytest.raises(PskdError) as e:
            attempt()
        assert e.value.code == "E9014", e.value
        assert INDEX in e.value.message
        for fragment in fragments:
            assert fragment in e.value.message, (fragment, e.value.message)
        message = e.value.message
    after = snapshot(directory)
    after.pop(LOCK, None)  # the refused writable manager may have made its (empty) lock file
    before.pop(LOCK, None)
    assert after == before, "a refused index changed the directory"
    return message


# -- entries that name what is not theirs ----------------------------------------------------------------


def hostile_entries(directory: pathlib.Path) -> dict[str, list]:
    one, two = good_entry(directory, 1), good_entry(directory, 2)
    return {
        "duplicate steps": [one, dict(one)],
        "step true": [dict(one, step=True)],
        "step false": [dict(one, step=False, file=step_file(0), layout=step_layout(0))],
        "step negative": [dict(one, step=-1)],
        "step a string": [dict(one, step="1")],
        "step a float": [dict(one, step=1.0)],
        "step beyond int64": [dict(one, step=MAX_STEP + 1, file=f"step-{MAX_STEP + 1}.psk.d")],
        "layout names the index": [dict(one, layout=INDEX), two],
        "layout names the lock": [dict(one, layout=LOCK), two],
        "file names the index": [dict(one, file=INDEX), two],
        "two entries share a file": [one, dict(two, file=one["file"])],
        "file of another step": [dict(one, file=two["file"], layout=two["layout"])],
        "layout of another step": [dict(one, layout=two["layout"]), dict(two, layout=None)],
        "file of another program": [dict(one, file="notes.txt"), two],
        "file unpadded": [dict(one, file="step-1.psk.d"), two],
        "file missing": [{k: v for k, v in one.items() if k != "file"}],
        "digest missing": [{k: v for k, v in one.items() if k != "digest"}],
        "digest a list": [dict(one, digest=["xxh3_128"])],
        "bytes negative": [dict(one, bytes=-1)],
        "type a number": [dict(one, type=3)],
        "score a string": [dict(one, score="0.5")],
        "score true": [dict(one, score=True)],
        "adopted a string": [dict(one, adopted="yes")],
        "entry a list": [[1, "step-00000001.psk.d"]],
    }


HOSTILE_NAMES = ["duplicate steps", "step true", "step false", "step negative", "step a string", "step a float",
                 "step beyond int64", "layout names the index", "layout names the lock", "file names the index",
                 "two entries share a file", "file of another step", "layout of another step",
                 "file of another program", "file unpadded", "file missing", "digest missing", "digest a list",
                 "bytes negative", "type a number", "score a string", "score true", "adopted a string",
                 "entry a list"]


@pytest.mark.parametrize("case", HOSTILE_NAMES)
def test_a_hostile_entry_is_refused_and_nothing_is_removed(tmp_path, case):
    saved(tmp_path, [1, 2])
    assert sorted(hostile_entries(tmp_path)) == sorted(HOSTILE_NAMES)
    entries = hostile_entries(tmp_path)[case]
    for version in (2, 3):
        write_index_json(tmp_path, {"format": "pskd-checkpoints", "version": version, "checkpoints": entries})
        message = refused_everywhere(tmp_path, "malformed entry")
        if case == "duplicate steps":
            assert "step 1 is listed twice (entries 0 and 1)" in message
    # the step files are all still there, whole: put a good index back and they verify
    write_index_json(tmp_path, {"format": "pskd-checkpoints", "version": 3,
                                "checkpoints": [good_entry_from(tmp_path, 1), good_entry_from(tmp_path, 2)]})
    assert [e.step for e in verify_directory(str(tmp_path))] == [1, 2]


def good_entry_from(directory: pathlib.Path, step: int) -> dict:
    return {"step": step, "file": step_file(step), "layout": step_layout(step),
            "digest": {"xxh3_128": file_digest(directory / step_file(step))}}


@pytest.mark.parametrize("leftovers", ["3", [True], [-1], [1.5], [MAX_STEP + 1], {"3": 1}])
def test_malformed_leftovers_are_refused(tmp_path, leftovers):
    saved(tmp_path, [1])
    content = index_of(tmp_path)
    content["leftovers"] = leftovers
    write_index_json(tmp_path, content)
    refused_everywhere(tmp_path, "leftovers")


@pytest.mark.parametrize("content", [
    {"format": "pskd-checkpoints", "version": True, "checkpoints": []},
    {"format": "pskd-checkpoints", "version": 4, "checkpoints": []},
    {"format": "pskd-checkpoints", "version": 3.0, "checkpoints": []},  # (a float equal to 3: not a version)
    {"format": "pskd-checkpoints", "version": 3, "checkpoints": {}},
    {"format": "pskd-checkpoints", "version": 3},
])
def test_a_malformed_index_is_refused(tmp_path, content):
    saved(tmp_path, [1])
    write_index_json(tmp_path, content)
    refused_everywhere(tmp_path, "not a checkpoint index")


def test_an_index_of_an_earlier_version_naming_its_own_files_is_read(tmp_path):
    saved(tmp_path, [1, 2])
    content = index_of(tmp_path)
    content["version"] = 2
    del content["leftovers"]
    write_index_json(tmp_path, content)
    with CheckpointManager(tmp_path, retention=Retention(keep=2)) as manager:
        assert manager.all_steps() == [1, 2]
        manager.save(3, params(3))
        assert manager.all_steps() == [2, 3]
    assert index_of(tmp_path)["version"] == 3
    assert not (tmp_path / step_file(1)).exists()


# -- the index itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink", "dangling symlink"])
def test_an_index_that_is_not_a_regular_file_is_refused_and_kept(tmp_path, kind):
    saved(tmp_path, [1])
    real = (tmp_path / INDEX).read_bytes()
    (tmp_path / INDEX).unlink()
    if kind == "directory":
        (tmp_path / INDEX).mkdir()
        (tmp_path / INDEX / "inside").write_bytes(real)
    elif kind == "fifo":
        os.mkfifo(tmp_path / INDEX)
    else:
        target = tmp_path.parent / f"{tmp_path.name}-index.json"
        if kind == "symlink":
            target.write_bytes(real)
        os.symlink(target, tmp_path / INDEX)
    message = refused_everywhere(tmp_path, "not a regular file")
    assert {"directory": "a directory", "fifo": "FIFO", "symlink": "symbolic link",
            "dangling symlink": "symbolic link"}[kind] in message


def test_pruning_never_removes_the_index_or_the_lock(tmp_path):
    with CheckpointManager(tmp_path, retention=Retention(keep=1)) as manager:
        for step in range(6):
            manager.save(step, params(step))
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, step_layout(5), step_file(5)]


# -- a directory without an index ------------------------------------------------------------------------


def test_complete_step_files_without_an_index_are_adopted(tmp_path):
    saved(tmp_path, [1, 2, 3])
    with CheckpointManager(tmp_path) as manager:  # a closed-type step: one array, no layout file
        manager.save(4, np.arange(5, dtype=np.float32))
    recorded = {e.step: e.digest for e in read_index(str(tmp_path))}
    (tmp_path / INDEX).unlink()
    files = snapshot(tmp_path)
    with pytest.raises(PskdError, match="E9014.*no checkpoint index.*adopts"):
        verify_directory(str(tmp_path))  # verify adopts nothing
    assert CheckpointManager(tmp_path, read_only=True).all_steps() == []  # nor does a reader
    with CheckpointManager(tmp_path, retention=Retention(keep=10)) as manager:
        assert manager.all_steps() == [1, 2, 3, 4]
        assert int(manager.restore(2, params(0))["step"]) == 2  # verified against the digest taken now
        assert manager.restore(4, as_numpy=True).tolist() == [0, 1, 2, 3, 4]
        assert manager.extra(3) is None
        entries = read_index(str(tmp_path))
        assert [e.digest for e in entries] == [recorded[s] for s in (1, 2, 3, 4)]
        assert all(e.adopted is True for e in entries)
        assert [e.layout_name for e in entries] == [step_layout(1), step_layout(2), step_layout(3), None]
        manager.save(5, params(5))
        assert manager.all_steps() == [1, 2, 3, 4, 5]
    after = snapshot(tmp_path)
    assert all(after[name] == files[name] for name in files), "an adopted step file changed"


def test_adoption_records_the_managers_digest(tmp_path):
    saved(tmp_path, [1])
    (tmp_path / INDEX).unlink()
    with CheckpointManager(tmp_path, save_options=SaveOptions(digest="sha256")) as manager:
        assert read_index(str(tmp_path))[0].digest == {"sha256": file_sha256(tmp_path / step_file(1))}
        manager.restore(1, params(0))


def damage(kind: str, directory: pathlib.Path) -> str:
    """Makes step 2 of a directory of steps 1-3 unadoptable; returns the file named in the error."""
    data, layout = directory / step_file(2), directory / step_layout(2)
    if kind == "truncated":
        data.write_bytes(data.read_bytes()[:-1])
    elif kind == "trailing bytes":
        data.write_bytes(data.read_bytes() + b"\0")
    elif kind == "not a checkpoint":
        data.write_bytes(b"not a psk.d file at all")
    elif kind == "two samples":
        ck.save(directory / "other.psk.d", params(2))
        raw = bytearray((directory / "other.psk.d").read_bytes())
        (directory / "other.psk.d").unlink()
        (directory / "other.layout.json").unlink()
        # the count field follows the type text; write 2 there and append a second sample
        header_end = raw.index(b"Params") + len(b"Params")
        raw[header_end:header_end + 8] = (2).to_bytes(8, "little")
        sample = raw[len(raw) - (4 * 3 * 4 + 8):]
        data.write_bytes(bytes(raw) + bytes(sample))
    elif kind == "layout missing":
        layout.unlink()
    elif kind == "layout of another type":
        ck.save(directory / "other.psk.d", {"v": np.zeros(7, np.float64)})
        os.replace(directory / "other.layout.json", layout)
        (directory / "other.psk.d").unlink()
        return step_layout(2)
    elif kind == "layout not JSON":
        layout.write_text("{")
        return step_layout(2)
    elif kind == "layout alone":
        data.unlink()
        return step_layout(2)
    elif kind == "symlink":
        moved = directory.parent / f"{directory.name}-moved.psk.d"
        os.replace(data, moved)
        os.symlink(moved, data)
    elif kind == "directory":
        data.unlink()
        data.mkdir()
    elif kind == "fifo":
        data.unlink()
        os.mkfifo(data)
    elif kind == "layout a directory":
        layout.unlink()
        layout.mkdir()
        return step_layout(2)
    else:
        raise AssertionError(kind)
    return step_file(2)


@pytest.mark.parametrize("kind", ["truncated", "trailing bytes", "not a checkpoint", "two samples", "layout missing",
                                  "layout of another type", "layout not JSON", "layout alone", "symlink", "directory",
                                  "fifo", "layout a directory"])
def test_step_files_that_do_not_prove_complete_are_refused_not_removed(tmp_path, kind):
    saved(tmp_path, [1, 2, 3])
    (tmp_path / INDEX).unlink()
    (tmp_path / "notes.txt").write_text("mine")
    named = damage(kind, tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(PskdError) as e:
        CheckpointManager(tmp_path)
    assert e.value.code == "E9014" and "cannot be adopted" in e.value.message
    assert "Nothing was changed" in e.value.message
    assert named in e.value.message and step_file(1) not in e.value.message
    assert snapshot(tmp_path) == before and not (tmp_path / INDEX).exists()


def test_an_adoption_refusal_lists_every_bad_file(tmp_path):
    saved(tmp_path, [1, 2, 3])
    (tmp_path / INDEX).unlink()
    for step in (1, 3):
        path = tmp_path / step_file(step)
        path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(PskdError, match="2 of its step files") as e:
        CheckpointManager(tmp_path)
    assert step_file(1) in e.value.message and step_file(3) in e.value.message and step_file(2) not in e.value.message


# -- what the manager removes, and what it leaves alone -------------------------------------------------


def foreign_files(directory: pathlib.Path) -> None:
    """Files of other programs, some named much like the manager's own."""
    (directory / "notes.txt").write_text("notes")
    (directory / "step-1.psk.d").write_bytes(b"PSKD not mine")
    (directory / "step-00000001.psk.d.bak").write_bytes(b"backup")
    (directory / "step-00000002.psk.d~").write_bytes(b"editor")
    (directory / ".hidden").write_bytes(b"")
    (directory / ".step-00000001.psk.d.tmp").write_bytes(b"a temporary of someone else's naming")
    (directory / "sub").mkdir()
    (directory / "sub" / step_file(1)).write_bytes(b"nested")
    os.symlink("/etc/passwd", directory / "passwd-link")


def test_files_of_other_programs_are_never_touched(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    foreign_files(tmp_path)
    foreign = snapshot(tmp_path)
    with CheckpointManager(tmp_path, retention=Retention(keep=2)) as manager:
        for step in (1, 2, 3, 4, 2):
            manager.save(step, params(step))
    CheckpointManager(tmp_path).close()
    after = snapshot(tmp_path)
    assert {name: after[name] for name in foreign} == foreign
    # (step 2 saved again is older than the newest two: dropped at once)
    assert sorted(set(after) - set(foreign)) == sorted([LOCK, INDEX, step_file(3), step_layout(3),
                                                        step_file(4), step_layout(4)])


def test_an_unlisted_step_file_not_claimed_is_kept_and_not_replaced(tmp_path):
    saved(tmp_path, [1])
    foreign = tmp_path / step_file(7)
    foreign.write_bytes(b"someone else's step 7")
    with CheckpointManager(tmp_path, retention=Retention(keep=1)) as manager:
        assert manager.all_steps() == [1]
        manager.save(8, params(8))
        with pytest.raises(PskdError) as e:
            manager.save(7, params(7))
        assert e.value.code == "E9014" and str(foreign) in e.value.message and "move it away" in e.value.message
        assert manager.all_steps() == [8]
    assert foreign.read_bytes() == b"someone else's step 7"


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_what_stands_at_a_step_name_and_is_no_file_is_never_removed(tmp_path, kind):
    saved(tmp_path, [1])
    path = tmp_path / step_file(5)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.psk.d"
    outside.write_bytes(b"outside")
    if kind == "symlink":
        os.symlink(outside, path)
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"inside")
    else:
        os.mkfifo(path)
    content = index_of(tmp_path)
    content["leftovers"] = [5]  # even where a save of step 5 is claimed
    write_index_json(tmp_path, content)
    before = snapshot(tmp_path)[step_file(5)]
    with CheckpointManager(tmp_path, retention=Retention(keep=1)) as manager:
        with pytest.raises(PskdError) as e:
            manager.save(5, params(5))
        assert e.value.code == "E9014" and "move it away" in e.value.message
        manager.save(6, params(6))
        assert manager.all_steps() == [6]
    CheckpointManager(tmp_path).close()
    assert snapshot(tmp_path)[step_file(5)] == before and outside.read_bytes() == b"outside"


def test_a_listed_step_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    saved(tmp_path, [1, 2])
    (tmp_path / step_file(2)).unlink()
    os.mkfifo(tmp_path / step_file(2))
    with CheckpointManager(tmp_path) as manager:
        for attempt in (lambda: manager.restore(2, params(0)), lambda: manager.restore(2, params(0), verify=False),
                        lambda: manager.verify(), lambda: manager.path(2)):
            with pytest.raises(PskdError) as e:
                attempt()
            assert e.value.code == "E9014" and "FIFO" in e.value.message and step_file(2) in e.value.message


def test_an_entry_whose_file_is_missing(tmp_path):
    saved(tmp_path, [1, 2, 3])
    (tmp_path / step_file(2)).unlink()
    with CheckpointManager(tmp_path, retention=Retention(keep=2)) as manager:  # opening does not read the files
        assert manager.all_steps() == [1, 2, 3]
        for attempt in (lambda: manager.restore(2, params(0)), lambda: manager.verify(2), lambda: manager.verify()):
            with pytest.raises(PskdError) as e:
                attempt()
            assert e.value.code == "E9003" and step_file(2) in e.value.message and "missing" in e.value.message
        manager.save(4, params(4))  # pruning steps 1 and 2 (whose file is gone) goes through
        assert manager.all_steps() == [3, 4]
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, step_layout(3), step_file(3), step_layout(4), step_file(4)]


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_lock_file_that_is_not_a_file_is_refused_and_kept(tmp_path, kind):
    saved(tmp_path, [1])
    (tmp_path / LOCK).unlink()
    if kind == "directory":
        (tmp_path / LOCK).mkdir()
    else:
        os.symlink(tmp_path.parent / "elsewhere.lock", tmp_path / LOCK)
    before = snapshot(tmp_path)
    with pytest.raises(PskdError) as e:
        CheckpointManager(tmp_path)
    assert e.value.code == "E9014" and LOCK in e.value.message
    assert snapshot(tmp_path) == before and not (tmp_path.parent / "elsewhere.lock").exists()
    assert CheckpointManager(tmp_path, read_only=True).all_steps() == [1]  # a reader takes no lock


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_save_lock_name_that_is_not_a_file_does_not_stop_the_manager(tmp_path, kind):
    saved(tmp_path, [1])
    lock = tmp_path / f".{step_file(1)}.lock"
    if kind == "directory":
        lock.mkdir()
    else:
        os.symlink("/nonexistent", lock)
    before = snapshot(tmp_path)[lock.name]
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [1]
        manager.save(2, params(2))
    assert snapshot(tmp_path)[lock.name] == before


def test_huge_steps(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(MAX_STEP, params(1))
        assert manager.all_steps() == [MAX_STEP] and manager.path().endswith(f"step-{MAX_STEP}.psk.d")
        for step in (MAX_STEP + 1, 10**30, -1, True, 1.0, "3"):
            with pytest.raises(PskdError) as e:
                manager.save(step, params(1))
            assert e.value.code == "E9014" and "a step is an integer from 0" in e.value.message
    text = (tmp_path / INDEX).read_text()
    (tmp_path / INDEX).write_text(text.replace(f'"step": {MAX_STEP}', '"step": ' + "9" * 5000, 1))
    assert "9" * 5000 in (tmp_path / INDEX).read_text()  # more digits than Python converts from text
    with pytest.raises(PskdError) as e:
        read_index(str(tmp_path))
    assert e.value.code == "E9014"


# -- a save cut short: the claim in the index ------------------------------------------------------------


class Cut(Exception):
    pass


def cut_after_writing(monkeypatch):
    """Makes the manager's next save write its file(s) whole and then stop, as a crash between the
    rename and the index would."""
    real = manager_module.save

    def save_then_cut(path, tree, **options):
        real(path, tree, **options)
        raise Cut()

    monkeypatch.setattr(manager_module, "save", save_then_cut)
    return real


def test_a_save_cut_short_is_claimed_then_removed(tmp_path, monkeypatch):
    saved(tmp_path, [1])
    real = cut_after_writing(monkeypatch)
    manager = CheckpointManager(tmp_path)
    with pytest.raises(Cut):
        manager.save(2, params(2), extra={"step": 2})
    assert (tmp_path / step_file(2)).exists() and manager.all_steps() == [1]
    assert index_of(tmp_path)["leftovers"] == [2]
    manager.close()
    monkeypatch.setattr(manager_module, "save", real)
    with CheckpointManager(tmp_path) as reopened:
        assert reopened.all_steps() == [1]
        assert index_of(tmp_path)["leftovers"] == []
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, step_layout(1), step_file(1)]


def test_a_resave_cut_short_keeps_the_step_and_reports_it(tmp_path, monkeypatch):
    saved(tmp_path, [1, 2])
    real = cut_after_writing(monkeypatch)
    manager = CheckpointManager(tmp_path)
    with pytest.raises(Cut):
        manager.save(2, params(20))  # step 2's file is now the new one, its entry the old one's
    manager.close()
    monkeypatch.setattr(manager_module, "save", real)
    with CheckpointManager(tmp_path) as reopened:
        assert reopened.all_steps() == [1, 2]  # a listed step is never removed by recovery
        with pytest.raises(PskdError) as damaged:
            reopened.verify()
        assert damaged.value.code == "E9013" and step_file(2) in damaged.value.message
        assert index_of(tmp_path)["leftovers"] == []
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, step_layout(1), step_file(1), step_layout(2), step_file(2)]


def test_a_resave_refused_before_writing_keeps_the_step(tmp_path):
    saved(tmp_path, [1, 2])
    manager = CheckpointManager(tmp_path)
    with pytest.raises(PskdError):
        manager.save(2, {"x": object()})  # refused: no file is written
    assert index_of(tmp_path)["leftovers"] == [2]
    manager.close()
    with CheckpointManager(tmp_path) as reopened:
        assert reopened.all_steps() == [1, 2] and int(reopened.restore(2, params(0))["step"]) == 2
        assert index_of(tmp_path)["leftovers"] == []


def test_a_step_saved_again_without_its_layout_loses_the_old_layout(tmp_path):
    saved(tmp_path, [1])
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params(1), options=SaveOptions(layout_file=False))
        assert read_index(str(tmp_path))[0].layout_name is None
    assert not (tmp_path / step_layout(1)).exists()


def test_pruning_a_step_whose_listed_file_is_a_link_removes_neither_link_nor_target(tmp_path):
    saved(tmp_path, [1, 2])
    os.replace(tmp_path / step_file(1), tmp_path / "copy-of-step-1.psk.d")
    os.symlink("copy-of-step-1.psk.d", tmp_path / step_file(1))  # inside the directory: restores
    with CheckpointManager(tmp_path, retention=Retention(keep=1)) as manager:
        assert int(manager.restore(1, params(0))["step"]) == 1
        manager.save(3, params(3))
        assert manager.all_steps() == [3]
    assert os.readlink(tmp_path / step_file(1)) == "copy-of-step-1.psk.d"
    assert (tmp_path / "copy-of-step-1.psk.d").exists() and not (tmp_path / step_layout(1)).exists()


def test_many_claims_cost_no_lock_files(tmp_path):
    saved(tmp_path, [1])
    content = index_of(tmp_path)
    content["leftovers"] = list(range(2, 20002))  # a hostile index claiming many steps, none present
    write_index_json(tmp_path, content)
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [1]
        assert index_of(tmp_path)["leftovers"] == []
    assert sorted(os.listdir(tmp_path)) == [LOCK, INDEX, step_layout(1), step_file(1)]
