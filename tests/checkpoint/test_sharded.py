"""Restoring into sharded arrays: each device's shard read from its own region of the file.

JAX's device count is fixed when it starts, so the 8-device checks run in a subprocess with
``--xla_force_host_platform_device_count=8``; the other tests keep their one CPU device.
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint import restoring
from tests.helpers import ENV, run_python

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np, ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from pskd_jax import checkpoint as ck
    from pskd_jax.checkpoint import restoring

    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    host = {
        "rows": rng.standard_normal((16, 6)).astype(np.float32),
        "cols": rng.standard_normal((6, 8)).astype(ml_dtypes.bfloat16),
        "grid": rng.standard_normal((8, 4, 3)).astype(np.float32),
        "replicated": rng.standard_normal((5,)).astype(np.float32),
        "ids": rng.integers(0, 1000, size=(8, 2)).astype(np.int32),
        "scalar": np.float32(3.5),
    }
    specs = {"rows": P("x"), "cols": P(None, "y"), "grid": P("x", "y"), "replicated": P(),
             "ids": P(("x", "y")), "scalar": P()}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    arrays = {k: jax.device_put(v, shardings[k]) for k, v in host.items()}
    path = sys.argv[1]
    ck.save(path, arrays)  # sharded arrays save to the same bytes as their host values
    ck.save(path + ".host", host)
    assert open(path, "rb").read() == open(path + ".host", "rb").read()

    reads = []
    original = restoring.read_region
    def counting(fd, p, offset, shape, disk, value, index):
        out = original(fd, p, offset, shape, disk, value, index)
        reads.append(out.nbytes)
        return out
    restoring.read_region = counting

    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in host.items()}
    back = ck.restore(path, target)
    for k, v in host.items():
        assert back[k].sharding == shardings[k], (k, back[k].sharding)
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(np.asarray(back[k]).reshape(-1).view(np.uint8),
                                      np.asarray(v).reshape(-1).view(np.uint8))
        for shard in back[k].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(v)[shard.index])
    # Each distinct shard box is read once: row shards once each, column shards once per column
    # block, replicated leaves once — never the whole leaf per device.
    sizes = {k: np.asarray(v).nbytes for k, v in host.items()}
    assert sum(reads) == sum(sizes.values()), (reads, sizes)

    # targets that are arrays: their shardings are followed; a dtype change is an explicit cast
    like = {k: v for k, v in arrays.items()}
    like["rows"] = jax.device_put(np.zeros((16, 6), ml_dtypes.bfloat16), shardings["rows"])
    again = ck.restore(path, like)
    assert again["rows"].dtype == jnp.bfloat16 and again["rows"].sharding == shardings["rows"]
    np.testing.assert_array_equal(np.asarray(again["rows"]), host["rows"].astype(ml_dtypes.bfloat16))

    # verified restore into shards
    digest = ck.save(path, arrays, ck.SaveOptions(digest="sha256")).digests["sha256"]
    ck.restore(path, target, digests={"sha256": digest})
    print("ok")
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_restore_into_sharded_arrays_on_8_host_devices(tmp_path):
    env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = run_python(SCRIPT, tmp_path / "s.psk.d", env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.parametrize(
    "shape, index",
    [
        ((6, 4), (slice(2, 4), slice(None))),
        ((6, 4), (slice(None), slice(1, 3))),
        ((4, 3, 5), (slice(1, 3), slice(0, 2), slice(None))),
        ((4, 3, 5), (slice(None), slice(None), slice(2, 5))),
        ((4, 3, 5), ()),
        ((7,), (slice(3, 7),)),
        ((), ()),
        ((3, 0), (slice(1, 2), slice(None))),
    ],
)
def test_read_region_reads_exactly_the_box(tmp_path, shape, index):
    values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    path = tmp_path / "r.psk.d"
    ck.save(path, {"pad": np.zeros(3, np.uint8), "v": values})
    layout = ck.read_layout_file(layout_path_for(path)).layout
    from pskd_jax.format.reader import Reader

    with Reader(path, layout=layout) as reader:
        offset = reader.header.data_offset + reader.placement.offsets[1]
    fd = os.open(path, os.O_RDONLY)
    try:
        box = restoring.read_region(fd, str(path), offset, shape, np.dtype("<f4"), np.dtype("<f4"), index)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(box, values[index] if index else values)
