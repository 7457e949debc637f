"""Saving sharded arrays under two JAX processes on localhost (``jax.distributed.initialize`` on
CPU): each process writes only its shards into one file, which equals the single-process file."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.helpers import ENV, run_jax_processes

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

WORKER = textwrap.dedent(
    """
    import sys
    import jax
    process, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process,
                               initialization_timeout=120)
    import numpy as np, ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from pskd_jax import checkpoint as ck
    from pskd_jax.errors import PskdError

    assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("hosts", "model"))
    rng = np.random.default_rng(0)  # the same values in every process
    host = {
        "embed": rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16),
        "blocks": [{"w": rng.standard_normal((8, 12)).astype(np.float32),
                    "b": rng.standard_normal((12,)).astype(np.float32)}],
        "scale": rng.standard_normal((4, 3, 8)).astype(np.float32),
        "step": np.int32(42),
        "note": np.arange(3, dtype=np.uint8),  # a host array: process 0 writes it
    }
    specs = {"embed": P("hosts", "model"), "blocks": [{"w": P(None, "model"), "b": P()}],
             "scale": P("model", None, "hosts"), "step": P()}

    def global_array(value, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    tree = {
        "embed": global_array(host["embed"], specs["embed"]),
        "blocks": [{"w": global_array(host["blocks"][0]["w"], specs["blocks"][0]["w"]),
                    "b": global_array(host["blocks"][0]["b"], specs["blocks"][0]["b"])}],
        "scale": global_array(host["scale"], specs["scale"]),
        "step": global_array(np.asarray(host["step"]), specs["step"]),
        "note": host["note"],
    }
    assert not tree["embed"].is_fully_addressable
    result = ck.save(f"{directory}/multi.psk.d", tree, ck.SaveOptions(digest="sha256"))
    if process == 0:
        single = ck.save(f"{directory}/single.psk.d", host, ck.SaveOptions(digest="sha256"))
        assert open(f"{directory}/multi.psk.d", "rb").read() == open(f"{directory}/single.psk.d", "rb").read()
        assert result.digests == single.digests and list(result.digests) == ["sha256"]
        import json
        layouts = [json.load(open(f"{directory}/{name}.layout.json")) for name in ("multi", "single")]
        assert [layout["data"].pop("name") for layout in layouts] == ["multi.psk.d", "single.psk.d"]
        assert layouts[0] == layouts[1]  # (each records its own data file's name, and nothing else differs)

    # restoring into the same global shardings: each process reads its own shards
    def spec(a):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
    # (built by hand: jax.tree_util.tree_map would rebuild the dicts in sorted key order)
    target = {"embed": spec(tree["embed"]),
              "blocks": [{"w": spec(tree["blocks"][0]["w"]), "b": spec(tree["blocks"][0]["b"])}],
              "scale": spec(tree["scale"]), "step": spec(tree["step"]), "note": np.zeros(3, np.uint8)}
    back = ck.restore(f"{directory}/multi.psk.d", target)
    for shard in back["embed"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host["embed"][shard.index])

    # a NaN in one process's shard fails both processes, and nothing is committed
    bad = host["blocks"][0]["w"].copy()
    bad[3, 11] = np.nan  # column 11 lives on the last model device: process 1's... and 0's rows
    broken = dict(tree, blocks=[{"w": global_array(bad, specs["blocks"][0]["w"]), "b": tree["blocks"][0]["b"]}])
    try:
        ck.save(f"{directory}/broken.psk.d", broken, ck.SaveOptions(finite_only=True))
    except PskdError as e:
        print(f"process {process} refused: {e.code}", flush=True)
    else:
        raise AssertionError("a NaN was saved")
    import os
    assert not os.path.exists(f"{directory}/broken.psk.d")
    assert not os.path.exists(f"{directory}/broken.layout.json")  # the layout is written only at the commit
    print(f"process {process} ok", flush=True)
    """
)


def test_two_processes_write_one_file_equal_to_the_single_process_one(tmp_path):
    outputs = run_jax_processes(WORKER, str(tmp_path), env=ENV, timeout=240)
    for k, (code, out, err) in enumerate(outputs):
        assert code == 0, f"process {k}:\n{out}\n{err[-4000:]}"
        assert f"process {k} refused: E9004" in out and f"process {k} ok" in out
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".tmp", ".lock"))]
