"""flax (nnx and linen) and optax train states: saved, restored into abstract targets, trained on."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pskd_jax import checkpoint as ck

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "workers" / "flax_checkpoint_worker.py"


@pytest.mark.slow
@pytest.mark.subprocess
def test_training_resumed_from_a_checkpoint_on_8_devices_equals_an_uninterrupted_run(tmp_path):
    """nnx (dropout keys, batch norm, an nnx.List, clip + masked weight decay + inject_hyperparams
    adamw) and linen (params, batch_stats, adam + reduce_on_plateau, a typed key, an int32 step):
    3 steps, save, restore into nnx.eval_shape / jax.eval_shape targets carrying NamedShardings on
    a 2×4 mesh of host devices, 3 more steps. The 6 losses equal an uninterrupted run's, bit for bit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(WORKER), str(tmp_path)], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    for case in ("nnx", "linen"):
        assert len(out[case]["straight"]) == 6
        assert out[case]["resumed"] == out[case]["straight"], case
    assert out["optax"]["masked"] == "MaskedState" and out["optax"]["plateau"] == "ReduceLROnPlateauState"
    assert out["dtypes"]["checked"] == ["c", "f16", "f8", "i8", "keys", "mask"]  # sharded leaves of every kind


def test_optax_states_round_trip_with_and_without_a_target(tmp_path):
    from tests.workers import flax_checkpoint_worker as worker

    out = worker.optax_states_case(str(tmp_path))
    assert out["sgd"] == "tuple" and out["inject"] == "InjectStatefulHyperparamsState"


def test_nnx_variables_come_back_as_variables_of_the_targets_types(tmp_path):
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(2, 4, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)
            self.count = nnx.BatchStat(jnp.int32(-2))

    model = Model(nnx.Rngs(0, dropout=3))
    ck.save(tmp_path / "m.psk.d", nnx.state(model))
    abstract = nnx.state(nnx.eval_shape(lambda: Model(nnx.Rngs(1, dropout=1))))
    back = ck.restore(tmp_path / "m.psk.d", abstract)
    assert type(back["linear"]["kernel"]) is nnx.Param and type(back["count"]) is nnx.BatchStat
    assert isinstance(back["linear"]["kernel"][...], jax.Array) and int(back["count"][...]) == -2
    key = back["drop"]["rngs"]["key"][...]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(model.drop.rngs.key[...]))
    restored = nnx.merge(nnx.graphdef(model), back)
    np.testing.assert_array_equal(restored.linear.kernel[...], model.linear.kernel[...])
    # without a target: a pure dict of the saved dtypes (int32 stays int32, the key a key)
    plain = ck.restore(tmp_path / "m.psk.d")
    assert plain["count"].dtype == jnp.int32 and jax.dtypes.issubdtype(plain["drop"]["rngs"]["key"].dtype,
                                                                        jax.dtypes.prng_key)
    assert plain["drop"]["rngs"]["count"].dtype == jnp.uint32
    state = nnx.state(Model(nnx.Rngs(5, dropout=5)))
    nnx.replace_by_pure_dict(state, plain)
    np.testing.assert_array_equal(state["linear"]["bias"][...], model.linear.bias[...])


@pytest.mark.slow
def test_linen_variables_in_any_key_order(tmp_path):
    nn = pytest.importorskip("flax.linen")

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.BatchNorm(use_running_average=True)(nn.Dense(4)(x)))

    variables = Net().init(jax.random.key(0), jnp.ones((1, 2)))
    ck.save(tmp_path / "v.psk.d", {"batch_stats": variables["batch_stats"], "params": variables["params"]})
    back = ck.restore(tmp_path / "v.psk.d", jax.eval_shape(lambda: Net().init(jax.random.key(0), jnp.ones((1, 2)))))
    out = Net().apply(back, jnp.ones((1, 2)))
    np.testing.assert_array_equal(out, Net().apply(variables, jnp.ones((1, 2))))
