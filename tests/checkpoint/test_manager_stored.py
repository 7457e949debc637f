"""The checkpoint manager at any place — a local directory, ``memory://`` and a key prefix of a
bucket of the loopback S3 server — by the same rules: the index written last (in a bucket with a
conditional put, so that of two writers the loser gets E9014 and its step is not listed),
retention, verify by default, adoption and recovery, and nothing removed that the index does not
prove the manager's own: every foreign object under the prefix stays as it was."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointManager, Retention
from pskd_jax.checkpoint import commit as commit_module
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, load_index, write_index
from pskd_jax.storage import locate, resolve
from tests.helpers import ROOT, raises


def pskd(*args, env: dict) -> subprocess.CompletedProcess:
    """``pskd ARGS`` in a fresh interpreter, from this tree's ``apps`` (an editable install may
    map ``pskd_jax.apps`` to another checkout)."""
    return subprocess.run([sys.executable, "-m", "apps.pskd", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def params(step: int) -> dict:
    return {"w": np.full((64, 3), step, np.float32), "step": np.int32(step)}


@pytest.fixture
def place(any_place) -> str:
    """The manager's directory, or key prefix."""
    return locate(any_place).child("ckpts").url


@pytest.fixture
def object_prefix(object_place) -> str:
    """The manager's key prefix in an object store (what only a store without a lock needs)."""
    return locate(object_place).child("ckpts").url


def _url(place: str, name: str) -> str:
    return locate(place).child(name).url


def _put(place: str, name: str, data: bytes) -> None:
    store, where = resolve(_url(place, name))
    if where.is_local:
        os.makedirs(os.path.dirname(where.path), exist_ok=True)
    store.put(where.key, data)


def _get(place: str, name: str) -> bytes | None:
    store, where = resolve(_url(place, name))
    return store.get(where.key)[0] if store.info(where.key) is not None else None


def _names(place: str) -> set[str]:
    store, where = resolve(place)
    return {info.key.rpartition("/")[2] for info in store.list(where.key)}


FOREIGN = {"notes.txt": b"mine", "step-1.psk.d": b"not a step name", "checkpoints.json.bak": b"{}",
           "step-00000007.layout.json.orig": b"x"}


def _foreign(place: str) -> None:
    for name, data in FOREIGN.items():
        _put(place, name, data)
    _put(place, "sub/step-00000001.psk.d", b"below the prefix")


def _foreign_intact(place: str) -> None:
    for name, data in FOREIGN.items():
        assert _get(place, name) == data, name
    assert _get(place, "sub/step-00000001.psk.d") == b"below the prefix"


def test_save_list_restore_retention_and_foreign_objects(place):
    _foreign(place)
    with CheckpointManager(place, retention=Retention(keep=2)) as manager:
        for step in (10, 20, 30):
            manager.save(step, params(step), extra={"step": step})
        assert manager.all_steps() == [20, 30] and manager.extra() == {"step": 30}
        back = manager.restore(target=params(0))  # verified against the recorded digest
        assert int(back["step"]) == 30 and np.asarray(back["w"])[0, 0] == 30
        assert manager.path(20) == _url(place, step_file(20))
        manager.verify()
    names = _names(place)
    assert step_file(10) not in names and step_layout(10) not in names  # pruned: the manager's own
    assert {step_file(20), step_file(30), INDEX} <= names
    _foreign_intact(place)
    with CheckpointManager(place, read_only=True) as reader:
        assert reader.all_steps() == [20, 30]
        assert ck.read_index(place)[-1].extra == {"step": 30}


def test_save_async_and_a_resave(place):
    with CheckpointManager(place) as manager:
        assert manager.save_async(1, params(1))
        manager.wait()
        manager.save(1, {"other": np.arange(3)})  # the step again, of another type
        assert manager.all_steps() == [1]
        assert manager.restore(as_numpy=True)["other"].tolist() == [0, 1, 2]
    assert json.loads(_get(place, INDEX))["leftovers"] == []


def test_damage_is_found_by_default(place):
    with CheckpointManager(place) as manager:
        manager.save(5, params(5))
        data = bytearray(_get(place, step_file(5)))
        data[-3] ^= 0x40
        _put(place, step_file(5), bytes(data))
        with raises("E9013", step_file(5)):
            manager.restore(target=params(0))
        with raises("E9013", step_file(5)):
            manager.verify()
        if locate(place).is_local:
            assert manager.restore(target=params(0), verify=False) is not None
        else:  # (an object is damaged by a put: another version than the one its layout records)
            with raises("E9005", step_file(5), "put again"):
                manager.restore(target=params(0), verify=False)


def test_a_foreign_object_at_a_step_name_is_never_replaced(place):
    _put(place, step_file(4), b"someone else's")
    with raises("E9014"):
        CheckpointManager(place)  # step files without an index: adopted, or refused
    assert _get(place, step_file(4)) == b"someone else's"


def test_adoption_of_step_objects_without_an_index(place):
    if locate(place).is_local:
        os.makedirs(locate(place).path, exist_ok=True)
    for step in (3, 6):
        ck.save(_url(place, step_file(step)), params(step))
    _put(place, "notes.txt", b"mine")
    with CheckpointManager(place) as manager:
        assert manager.all_steps() == [3, 6]
        assert all(e.adopted for e in ck.read_index(place))
        assert int(manager.restore(target=params(0))["step"]) == 6
    assert _get(place, "notes.txt") == b"mine"


def test_recovery_removes_only_a_claimed_unlisted_step(place):
    with CheckpointManager(place) as manager:
        manager.save(1, params(1))
    _foreign(place)
    # a save of step 2 cut short after its claim and its data object: the claim proves it the manager's
    directory = CheckpointDirectory.of(place)
    index = load_index(directory)
    write_index(directory, index.entries, leftovers=[2], durable=False, over=index)
    ck.save(_url(place, step_file(2)), params(2))
    with CheckpointManager(place) as manager:
        assert manager.all_steps() == [1]
    assert step_file(2) not in _names(place) and step_layout(2) not in _names(place)
    assert json.loads(_get(place, INDEX))["leftovers"] == []
    _foreign_intact(place)


def test_two_writers_the_loser_gets_e9014_and_is_not_listed(object_prefix, monkeypatch):
    """Writer A reads the index to commit step 2; writer B commits step 3 meanwhile; A's index put
    was conditional on the version it read, so it is refused and only B's step is listed. (On a
    local directory the directory's lock keeps the second writer out altogether.)"""
    a = CheckpointManager(object_prefix)
    b = CheckpointManager(object_prefix)
    a.save(1, params(1))
    original = commit_module.load_index
    raced = []

    def racing(directory):
        index = original(directory)
        if not raced and 2 in index.leftovers and index.entry(2) is None:
            raced.append(True)
            b.save(3, params(3))  # B commits between A's read and A's put
        return index

    monkeypatch.setattr(commit_module, "load_index", racing)
    with raises("E9014", INDEX, "another writer"):
        a.save(2, params(2))
    monkeypatch.setattr(commit_module, "load_index", original)
    assert ck.read_index(object_prefix)[-1].step == 3 and [e.step for e in ck.read_index(object_prefix)] == [1, 3]
    b.close()
    a.close()


def test_a_claim_recovered_by_another_manager_is_not_committed(object_prefix, monkeypatch):
    a = CheckpointManager(object_prefix)
    a.save(1, params(1))
    from pskd_jax.checkpoint import manager as manager_module

    original = manager_module.save

    def save_then_recovered(path, tree, options=None):
        result = original(path, tree, options=options)
        CheckpointManager(object_prefix).close()  # another manager opens the prefix: it recovers the claim
        return result

    monkeypatch.setattr(manager_module, "save", save_then_recovered)
    with raises("E9014", "no longer claimed"):
        a.save(2, params(2))
    assert [e.step for e in ck.read_index(object_prefix)] == [1]


def test_unknown_places_are_refused():
    with raises("E9018", "ftp"):
        CheckpointManager("ftp://host/ckpts")


@pytest.mark.subprocess
def test_pskd_verify_a_bucket_prefix_and_one_checkpoint(s3_bucket):
    place = f"{s3_bucket.url}/run"
    with CheckpointManager(place) as manager:
        for step in (1, 2):
            manager.save(step, params(step))
    done = pskd("verify", place, env=s3_bucket.env)
    assert done.returncode == 0, done.stderr
    assert "2 checkpoints verified" in done.stdout and "ok step 2" in done.stdout
    one = pskd("verify", f"{place}/{step_file(2)}", env=s3_bucket.env)
    assert one.returncode == 0 and "ok" in one.stdout, one.stderr
    store, where = resolve(f"{place}/{step_file(1)}")
    data = bytearray(store.get(where.key)[0])
    data[-1] ^= 1
    store.put(where.key, bytes(data))
    bad = pskd("verify", place, env=s3_bucket.env)
    assert bad.returncode != 0 and bad.stderr.startswith("pskd: E9013: ") and step_file(1) in bad.stderr
    assert "Traceback" not in bad.stderr


def _train(bucket_env: dict, windows, checkpoints: str, *extra: str) -> list[str]:
    pipeline = f'stream "{windows}" |> shuffle(seed = 4) |> batch(B = 8)'
    result = subprocess.run([sys.executable, "-m", "apps.train_lm", f"--pipeline={pipeline}", "--width=16",
                             "--layers=1", "--heads=2", "--log_every=2", f"--checkpoint_dir={checkpoints}", *extra],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env=dict(bucket_env, JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_lm_checkpoints_into_a_bucket_and_resumes_from_it(s3_bucket, tmp_path):
    import pskd_jax

    text = ("the quick brown fox jumps over the lazy dog. " * 40).encode()
    tokens = np.frombuffer(text, np.uint8) - 32
    windows = tmp_path / "w.psk.d"
    starts = np.arange(0, len(tokens) - 17, 16)
    pskd_jax.write(windows, "(idx[96][seq: 16], idx[96][seq: 16])",
                   (tokens[starts[:, None] + np.arange(16)], tokens[starts[:, None] + np.arange(1, 17)]))
    place = f"{s3_bucket.url}/train"
    _train(s3_bucket.env, windows, str(tmp_path / "whole"), "--steps=8", "--save_every=4")
    _train(s3_bucket.env, windows, place, "--steps=4", "--save_every=4")
    rest = _train(s3_bucket.env, windows, place, "--steps=8", "--save_every=4", "--resume")
    assert any(line.startswith("train: resumed at step 4") for line in rest)
    assert not (ROOT / "s3:").exists()
    ends = [CheckpointManager(p, read_only=True).path() for p in (str(tmp_path / "whole"), place)]
    assert pathlib.Path(ends[0]).read_bytes() == _get(place, step_file(8))  # the same bytes as the local run's
    assert ends[1] == _url(place, step_file(8))


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_lm_streams_a_corpus_in_a_bucket_and_refuses_a_checkpoint_url_it_cannot_serve(s3_bucket, tmp_path):
    import pskd_jax

    (tmp_path / "doc.txt").write_text("the quick brown fox jumps over the lazy dog. " * 20)
    pskd_jax.build_corpus([str(tmp_path / "doc.txt")], f"{s3_bucket.url}/corpus")
    here = tmp_path / "cwd"
    here.mkdir()

    def train(*extra: str) -> subprocess.CompletedProcess:
        pipeline = f'stream "{s3_bucket.url}/corpus/shards.json" |> shuffle(seed = 1) |> batch(B = 4)'
        return subprocess.run([sys.executable, "-m", "apps.train_lm", f"--pipeline={pipeline}", "--seq=8",
                               "--width=16", "--layers=1", "--heads=2", "--log_every=1", *extra],
                              capture_output=True, text=True, cwd=here, timeout=600,
                              env=dict(s3_bucket.env, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT)))

    done = train("--steps=2", "--save_every=2", f"--checkpoint_dir={s3_bucket.url}/run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert CheckpointManager(f"{s3_bucket.url}/run", read_only=True).all_steps() == [2]
    for bad in ("s3:/x/run", "gs:run"):
        refused = train("--steps=2", f"--checkpoint_dir={bad}")
        assert refused.returncode == 1 and f"E9018: {bad}: " in refused.stderr, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
    assert os.listdir(here) == []
