"""Checkpoints through the fault proxy in front of the S3 server: throttling, dropped connections,
bodies cut midway and lost answers are retried and leave the save, the restore and the manager's
index whole; a fault that persists is E9018 naming the URL, a restore returns nothing, a save
leaves nothing the index lists, and a rerun completes. Every check counts what the proxy saw;
none depends on time."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import textwrap

import numpy as np
import pytest

import pskd_jax.storage as storage
from pskd_jax import checkpoint as ck
from pskd_jax._os.names import step_file
from pskd_jax.checkpoint import CheckpointManager, Retention
from pskd_jax.checkpoint.index import INDEX
from pskd_jax.storage import StorageOptions, resolve
from tests.faultproxy import Rule, answer, cut, drop, lost_answer
from tests.helpers import raises, run_python

OPTIONS = StorageOptions(retries=2, backoff_seconds=0.001, part_bytes=1 << 16, concurrency=4)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """The stores the toolkit makes for itself retry twice, with a short backoff."""
    monkeypatch.setattr(storage, "DEFAULT_OPTIONS", OPTIONS)


def tree(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((300, 256)).astype(np.float32),  # 300 KiB: several ranged reads
            "b": rng.standard_normal(17).astype(np.float32), "step": np.int64(seed)}


def _key(bucket, name: str) -> str:
    return re.escape(f"/{bucket.name}/{name}") + r"(\?|$)"


def _same(a: dict, b: dict) -> None:
    for key in a:
        assert np.asarray(a[key]).tobytes() == np.asarray(b[key]).tobytes(), key


TRANSIENT = {"503": answer(503), "429": answer(429), "reset": drop(reset=True)}
CUTS = {"cut": cut(), "cut reset": cut(reset=True)}


@pytest.mark.parametrize("fault", [*TRANSIENT.values(), *CUTS.values()], ids=[*TRANSIENT, *CUTS])
def test_a_restore_survives_transient_faults_on_its_ranged_reads(faulty_bucket, fault_proxy, fault):
    url = f"{faulty_bucket.url}/r.psk.d"
    values = tree(1)
    digests = ck.save(url, values, ck.SaveOptions(digest="xxh3_128")).digests
    fault_proxy.plan(Rule(fault, method="GET", path=_key(faulty_bucket, "r.psk.d"), ranged=True, skip=1, times=2))
    _same(ck.restore(url, values, digests=digests), values)
    assert fault_proxy.faults_done() == 2
    fault_proxy.plan(Rule(fault, method="GET", path=_key(faulty_bucket, "r.psk.d"), ranged=True, times=1))
    _same(ck.restore(url, values), values)  # unverified: only the ranges asked for
    assert fault_proxy.faults_done() == 1


@pytest.mark.parametrize("fault", [answer(503), drop(reset=True)], ids=["503", "reset"])
def test_a_persistent_read_fault_is_e9018_naming_the_url_and_returns_nothing(faulty_bucket, fault_proxy, fault):
    url = f"{faulty_bucket.url}/p.psk.d"
    values = tree(2)
    ck.save(url, values)
    fault_proxy.plan(Rule(fault, method="GET", path=_key(faulty_bucket, "p.psk.d"), ranged=True, skip=1, times=None))
    with raises("E9018", url):
        ck.restore(url, values)
    fault_proxy.plan()
    _same(ck.restore(url, values), values)


@pytest.mark.parametrize("fault", [answer(503), drop(reset=True), lost_answer()], ids=["503", "reset", "lost"])
def test_a_save_survives_a_transient_fault_on_its_puts(faulty_bucket, fault_proxy, fault):
    url = f"{faulty_bucket.url}/s.psk.d"
    values = tree(3)
    fault_proxy.plan(Rule(fault, method="PUT", times=2))  # the data object, then its layout object
    result = ck.save(url, values, ck.SaveOptions(digest="xxh3_128"))
    assert fault_proxy.faults_done() == 2
    fault_proxy.plan()
    _same(ck.restore(url, values, digests=result.digests), values)


def test_a_large_save_survives_a_fault_on_a_part(faulty_bucket, fault_proxy):
    url = f"{faulty_bucket.url}/big.psk.d"
    values = {"w": np.random.default_rng(4).standard_normal((3 << 20) // 4 * 4).astype(np.float32)}  # 12 MiB
    fault_proxy.plan(Rule(answer(503), method="PUT", path=r"partNumber=2", times=1))
    result = ck.save(url, values, ck.SaveOptions(digest="xxh3_128"))
    assert fault_proxy.faults_done() == 1 and fault_proxy.count("POST", r"\?uploads") == 1
    fault_proxy.plan()
    _same(ck.restore(url, values, digests=result.digests), values)


def test_a_persistent_write_fault_is_e9018_and_leaves_nothing(faulty_bucket, fault_proxy):
    url = f"{faulty_bucket.url}/w.psk.d"
    fault_proxy.plan(Rule(answer(503), method="PUT", times=None))
    with raises("E9018", url):
        ck.save(url, tree(5))
    fault_proxy.plan()
    store, where = resolve(url)
    assert store.list("") == []


def test_a_manager_commits_through_lost_answers_and_a_rerun_completes(faulty_bucket, fault_proxy):
    place = f"{faulty_bucket.url}/run"
    index = _key(faulty_bucket, f"run/{INDEX}")
    with CheckpointManager(place) as manager:
        manager.save(1, tree(1))
        # the index's conditional put lands and its answer is lost: read back, it is this one
        fault_proxy.plan(Rule(lost_answer(), method="PUT", path=index, times=2))
        manager.save(2, tree(2))
        assert fault_proxy.faults_done() == 2 and manager.all_steps() == [1, 2]
        # the index cannot be written at all: E9018, and step 3 is not listed
        fault_proxy.plan(Rule(answer(503), method="PUT", path=index, skip=1, times=None))
        with raises("E9018", INDEX):
            manager.save(3, tree(3))
        fault_proxy.plan()
        assert manager.all_steps() == [1, 2]
    with CheckpointManager(place) as rerun:  # the claim of step 3 recovered, then saved again
        assert rerun.all_steps() == [1, 2]
        rerun.save(3, tree(3))
        assert rerun.all_steps() == [1, 2, 3]
        _same(rerun.restore(target=tree(0)), tree(3))
        rerun.verify()
    store, where = resolve(f"{place}/{step_file(3)}")
    assert store.info(where.key) is not None


KILLED_SAVE = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from pskd_jax.checkpoint import CheckpointManager, Retention
    from pskd_jax.storage import ObjectStore

    place, step, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    done = [0]

    def point(mid):
        if plan.get("at") == done[0] and plan.get("mid", False) == mid:
            os.kill(os.getpid(), signal.SIGKILL)

    real_put, real_delete = ObjectStore.put, ObjectStore.delete

    def put(self, key, data, **options):
        point(False)
        if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
            pieces = data

            def watched():
                for k, piece in enumerate(pieces):
                    if k == 2:
                        point(True)  # inside the upload: some parts sent, not completed
                    yield piece
            data = watched()
        try:
            return real_put(self, key, data, **options)
        finally:
            done[0] += 1

    def delete(self, key):
        point(False)
        try:
            return real_delete(self, key)
        finally:
            done[0] += 1

    ObjectStore.put, ObjectStore.delete = put, delete
    values = {"w": np.full((1 << 20) + 7, step, np.float32), "step": np.int64(step)}  # 4 MiB: a multipart put
    with CheckpointManager(place, retention=Retention(keep=2)) as manager:
        manager.save(step, values, extra={"step": step})
    print(json.dumps({"operations": done[0]}))
    """
)


def _save_in_child(bucket, place: str, step: int, plan: dict) -> subprocess.CompletedProcess:
    return run_python(KILLED_SAVE, place, step, json.dumps(plan), env=bucket.env)


def _index_steps(place: str) -> list[int] | None:
    store, where = resolve(f"{place}/{INDEX}")
    if store.info(where.key) is None:
        return None
    return [entry["step"] for entry in json.loads(store.get(where.key)[0])["checkpoints"]]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_manager_killed_while_saving_to_a_bucket_leaves_the_old_or_new_index(s3_bucket):
    """SIGKILL of a manager saving to the bucket before one of its writes and deletes (drawn), and
    inside its data upload: the index is the old one or the new one, every
    listed step verifies, no foreign object is removed, and a rerun of the save completes."""
    place = f"{s3_bucket.url}/killed"
    foreign = {"notes.txt": b"mine", "step-1.psk.d": b"not a step's name", "sub/step-00000002.psk.d": b"below"}
    for name, data in foreign.items():
        store, where = resolve(f"{place}/{name}")
        store.put(where.key, data)
    for step in (1, 2):
        done = _save_in_child(s3_bucket, place, step, {})
        assert done.returncode == 0, done.stderr[-3000:]
    recorded = _save_in_child(s3_bucket, f"{s3_bucket.url}/recorded", 1, {})
    assert json.loads(recorded.stdout.strip().splitlines()[-1])["operations"] == 4  # claim, data, layout, commit
    rng = random.Random(20)
    step, kills = 3, 0
    # A save with pruning: (the open's recovery of an earlier claim: an index put), the claim (an
    # index put), the data, its layout, the commit (an index put), then the pruned step's deletes.
    plans = [{"at": 0}, {"at": 2, "mid": True}, *({"at": k} for k in sorted(rng.sample(range(1, 7), 4)))]
    for plan in plans:
        before = _index_steps(place)
        killed = _save_in_child(s3_bucket, place, step, plan)
        after = _index_steps(place)
        if killed.returncode == 0:  # a drawn point past this run's last write: it completed
            assert after[-1] == step
        else:
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
            kills += 1
            assert after in (before, sorted(set(before) | {step})[-2:]), (plan, before, after)
        for name, data in foreign.items():
            store, where = resolve(f"{place}/{name}")
            assert store.get(where.key)[0] == data, (plan, name)
        with CheckpointManager(place, retention=Retention(keep=2)) as manager:
            listed = manager.all_steps()
            for listed_step in listed:
                assert int(manager.restore(listed_step, as_numpy=True)["step"]) == listed_step
            manager.verify()
            manager.save(step, {"w": np.full((1 << 20) + 7, step, np.float32), "step": np.int64(step)},
                         extra={"step": step})  # the rerun completes
            assert manager.latest_step() == step and manager.extra() == {"step": step}
        step += 1
    assert kills == len(plans), kills  # (every point drawn is one the run reaches)
    store, where = resolve(place)
    names = {info.key.rpartition("/")[2] for info in store.list(where.key)}
    assert {n for n in names if n.startswith("step-0")} == {step_file(step - 2), step_file(step - 1),
                                                           step_file(step - 2).replace(".psk.d", ".layout.json"),
                                                           step_file(step - 1).replace(".psk.d", ".layout.json")}
