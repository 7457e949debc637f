"""Saving sharded arrays under two JAX processes on localhost (``jax.distributed.initialize`` on
CPU) into a bucket of the loopback S3 server, with no shared file system: each process uploads
only the bytes it owns as one part object, process 0 commits the parts index once every part is
up, and the checkpoint reads back — into the same shardings, into another mesh, into numpy —
as the single-process save of the same values does, digest included."""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import run_jax_processes

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

WORKER = textwrap.dedent(
    """
    import sys
    import jax
    process, port, bucket = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process,
                               initialization_timeout=120)
    import numpy as np, ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from pskd_jax import checkpoint as ck
    from pskd_jax.checkpoint.parts import PartsIndex
    from pskd_jax.errors import PskdError
    from pskd_jax.storage import resolve
    from jax.experimental import multihost_utils

    assert jax.process_count() == 2 and len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("hosts", "model"))
    rng = np.random.default_rng(0)  # the same values in every process
    host = {"embed": rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16),
            "w": rng.standard_normal((8, 12)).astype(np.float32),
            "scale": rng.standard_normal((4, 3, 8)).astype(np.float32),
            "step": np.int32(42), "note": np.arange(3, dtype=np.uint8)}
    specs = {"embed": P("hosts", "model"), "w": P(None, "model"), "scale": P("model", None, "hosts"), "step": P()}

    def global_array(value, spec):
        return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda index: value[index])

    tree = {k: global_array(np.asarray(v), specs[k]) if k in specs else v for k, v in host.items()}
    assert not tree["embed"].is_fully_addressable
    url = f"{bucket}/run/multi.psk.d"
    store, where = resolve(url)
    orphan = "run/multi.psk.d.part-00001-of-00002.0a0b0c0d0e0f"  # of a save cut off before its commit
    if process == 0:
        store.put(orphan, b"a cut-off save's part")
    for attempt in range(2):  # the second save replaces the first, and removes its parts
        result = ck.save(url, tree, ck.SaveOptions(digest="xxh3_128"))
    multihost_utils.sync_global_devices("saved")
    index = PartsIndex.parse(store.get(where.key)[0], url)
    assert len(index.keys) == 2 and sum(index.sizes) == index.size  # every byte once, in two parts
    listed = sorted(info.key for info in store.list("run"))
    # the first save's parts are gone; a plain save leaves a part no index references (it cannot
    # tell a cut-off save from another writer's save under way)
    assert [key for key in listed if ".part-" in key] == sorted([*index.keys, orphan]), listed
    if process == 0:
        single = ck.save(f"{bucket}/run/single.psk.d", host, ck.SaveOptions(digest="xxh3_128"))
        assert result.digests == single.digests  # the file the parts hold is the single-process file
        ck.verify_file(url, single.digests)
        back = ck.restore(url, as_numpy=True, digests=single.digests)
        for k, v in host.items():
            assert np.asarray(back[k]).tobytes() == np.asarray(v).tobytes(), k
        from pskd_jax.format.byte_sources import open_bytes  # what Reader, info, export, diff read
        source = open_bytes(url)
        whole = bytearray(source.size())
        source.read_at(memoryview(whole), 0)
        assert bytes(whole) == store.get(where.parent().child("single.psk.d").key)[0]
        assert ck.convert(url, f"{bucket}/run/multi.safetensors").endswith("(5 tensors)")
    multihost_utils.sync_global_devices("checked")

    def spec(a):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
    target = {k: spec(v) if k in specs else np.zeros(3, np.uint8) for k, v in tree.items()}
    back = ck.restore(url, target, digests=result.digests)  # each process reads its own boxes
    for shard in back["embed"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host["embed"][shard.index])
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))  # another mesh
    again = ck.restore(url, {"embed": jax.ShapeDtypeStruct((16, 8), ml_dtypes.bfloat16,
                                                            sharding=NamedSharding(other, P("b", "a"))),
                             "w": np.zeros((8, 12), np.float32), "scale": np.zeros((4, 3, 8), np.float32),
                             "step": np.int32(0), "note": np.zeros(3, np.uint8)})
    for shard in again["embed"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host["embed"][shard.index])
    assert int(again["step"]) == 42

    bad = host["w"].copy()
    bad[3, 11] = np.nan
    try:
        ck.save(f"{bucket}/run/broken.psk.d", dict(tree, w=global_array(bad, specs["w"])),
                ck.SaveOptions(finite_only=True))
    except PskdError as e:
        print(f"process {process} refused: {e.code}", flush=True)
    else:
        raise AssertionError("a NaN was saved")
    multihost_utils.sync_global_devices("refused")
    assert store.info("run/broken.psk.d") is None and store.info("run/broken.layout.json") is None
    assert not [info.key for info in store.list("run") if "broken" in info.key]  # no part left either
    print(f"process {process} ok", flush=True)
    """
)


def test_two_processes_save_parts_to_a_bucket_and_restore_into_any_mesh(s3_bucket):
    outputs = run_jax_processes(WORKER, s3_bucket.url, env=s3_bucket.env, timeout=300)
    for k, (code, out, err) in enumerate(outputs):
        assert code == 0, f"process {k}:\n{out}\n{err[-4000:]}"
        assert f"process {k} refused: E9004" in out and f"process {k} ok" in out
