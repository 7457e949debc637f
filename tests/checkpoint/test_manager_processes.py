"""A CheckpointManager of a bucket prefix used by two JAX processes on localhost (CPU,
``jax.distributed.initialize`` on loopback) against the loopback S3 server, with no shared file
system: every process calls ``save(step, state)``, each step is a parts index and one part object
a process, process 0 lists it; retention removes a dropped step's parts index, parts and layout
object; the latest step restores, verified, into another mesh in every process. A save cut off
between its parts and its commit (both processes gone) leaves the index as it was; the next
manager to open the prefix removes the cut-off parts, and the parts of a listed step that its
parts index does not reference, and nothing else: objects whose names only look like part names
stay."""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import run_jax_processes

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import jax
    process, port, bucket, phase = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process,
                               initialization_timeout=120)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jax.experimental import multihost_utils
    from pskd_jax import checkpoint as ck
    from pskd_jax.checkpoint import distributed
    from pskd_jax.checkpoint.parts import parts_named_for
    from pskd_jax.errors import PskdError
    from pskd_jax.storage import resolve

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("hosts", "model"))
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    url = f"{bucket}/run"
    store, _ = resolve(url)

    def host(step):
        rng = np.random.default_rng(step)  # the same values in every process
        return {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": np.full(8, step, np.float32),
                "step": np.int32(step)}

    def state(step):
        values = host(step)
        w = jax.make_array_from_callback((16, 8), NamedSharding(mesh, P("hosts", "model")),
                                         lambda index: values["w"][index])
        return {"w": w, "b": values["b"], "step": values["step"]}

    def names():
        return sorted(info.key.rpartition("/")[2] for info in store.list("run"))

    def parts(step):
        return parts_named_for(names(), f"step-{step:08d}.psk.d")

    def check_latest(manager, step):
        target = {"w": jax.ShapeDtypeStruct((16, 8), np.float32, sharding=NamedSharding(other, P("b", "a"))),
                  "b": np.zeros(8, np.float32), "step": np.int32(0)}
        back = manager.restore(target=target)  # verified against the recorded digest, by default
        for shard in back["w"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), host(step)["w"][shard.index])
        assert int(back["step"]) == step and back["b"][0] == step

    FOREIGN = ["step-00000003.psk.d.part-notes", "step-00000003.psk.d.part-00000-of-00002.NOTES1234567",
               "step-00000004.psk.d.part-00000-of-00002", "step-00000004.psk.d.part-00002-of-00002.0123456789ab"]
    if phase == "first":
        manager = ck.CheckpointManager(url, retention=ck.Retention(keep=2))
        for step in (1, 2, 3):
            result = manager.save(step, state(step), extra={"step": step})
        assert manager.all_steps() == [2, 3], manager.all_steps()
        multihost_utils.sync_global_devices("saved")
        listed = names()
        assert not [n for n in listed if n.startswith("step-00000001")], listed  # index, parts and layout gone
        assert len(parts(2)) == 2 and len(parts(3)) == 2, listed
        if process == 0:
            entry = ck.read_index(url)[-1]
            assert entry.step == 3 and entry.digest == result.digests and entry.extra == {"step": 3}
            single = ck.save(f"{bucket}/elsewhere/one.psk.d", host(3), ck.SaveOptions(digest="xxh3_128"))
            assert single.digests == entry.digest  # the parts hold the single-process file
            manager.verify()
            for name in FOREIGN:
                store.put(f"run/{name}", b"a user's file")
        check_latest(manager, 3)
        assert manager.save_async(4, state(4), force=True)  # (written before it returns, by all)
        manager.wait()
        assert manager.all_steps() == [3, 4]
        multihost_utils.sync_global_devices("four")
        assert not parts(2)

        def cut_off(*args):  # both parts of step 5 are up: both processes die before the commit
            multihost_utils.sync_global_devices("parts up")
            print(f"process {process} cut off", flush=True)
            os._exit(0)
        distributed._gathered = cut_off
        manager.save(5, state(5))
        raise AssertionError("not cut off")
    else:
        raw = json.loads(store.get("run/checkpoints.json")[0])
        assert [e["step"] for e in raw["checkpoints"]] == [3, 4] and 5 in raw["leftovers"], raw
        assert len(parts(5)) == 2 and "step-00000005.psk.d" not in names(), names()
        multihost_utils.sync_global_devices("looked")
        if process == 0:  # a part of listed step 4 that its parts index does not reference
            store.put("run/" + parts(4)[0][:-12] + "feedfacecafe", b"a cut-off re-save's part")
        multihost_utils.sync_global_devices("stray")
        assert len(parts(4)) == 3
        manager = ck.CheckpointManager(url, retention=ck.Retention(keep=2))  # process 0 cleans up
        listed = names()
        assert not parts(5) and len(parts(4)) == 2 and len(parts(3)) == 2, listed
        assert all(name in listed for name in FOREIGN), listed
        assert json.loads(store.get("run/checkpoints.json")[0])["leftovers"] == []
        check_latest(manager, 4)
        manager.save(5, state(5))
        assert manager.all_steps() == [4, 5] and len(parts(5)) == 2
        multihost_utils.sync_global_devices("five")
        check_latest(manager, 5)
        assert not [n for n in names() if n.startswith("step-00000003") and n not in FOREIGN], names()
        assert all(name in names() for name in FOREIGN)
        bad = state(6)
        bad["b"] = np.full(8, np.nan, np.float32)  # (process 0's leaf: process 1 learns at the barrier)
        try:
            manager.save(6, bad, options=manager.save_options.replace(finite_only=True))
        except PskdError as e:
            print(f"process {process} refused: {e.code}", flush=True)
        else:
            raise AssertionError("a NaN was saved")
        assert manager.all_steps() == [4, 5] and not [n for n in names() if n.startswith("step-00000006")]
    multihost_utils.sync_global_devices("done")
    print(f"process {process} ok", flush=True)
    """
)


def test_two_processes_share_a_manager_of_a_bucket_and_its_next_open_cleans_a_cut_off_save(s3_bucket):
    first = run_jax_processes(WORKER, s3_bucket.url, "first", env=s3_bucket.env, timeout=400)
    for k, (code, out, err) in enumerate(first):
        assert code == 0 and f"process {k} cut off" in out, f"process {k}:\n{out}\n{err[-4000:]}"
    again = run_jax_processes(WORKER, s3_bucket.url, "again", env=s3_bucket.env, timeout=400)
    for k, (code, out, err) in enumerate(again):
        assert code == 0 and f"process {k} ok" in out, f"process {k}:\n{out}\n{err[-4000:]}"
        assert f"process {k} refused: E9004" in out
