"""Real flax (nnx and linen) + optax train states: train, save, restore into an abstract target,
train on; the losses must equal an uninterrupted run's bit for bit.

``python flax_checkpoint_worker.py DIRECTORY`` runs every case on the devices JAX has (the test
starts it with ``--xla_force_host_platform_device_count=8``: the state then lives on a 2×4 mesh
with ``NamedSharding``s, and is restored into ``ShapeDtypeStruct``s carrying them). The functions
also run in-process on one device.
"""

from __future__ import annotations

import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pskd_jax import checkpoint as ck

STEPS = 3  # before the checkpoint, and again after it


def mesh_of_devices() -> Mesh | None:
    devices = jax.devices()
    if len(devices) < 8:
        return None
    return Mesh(np.array(devices[:8]).reshape(2, 4), ("data", "model"))


def sharding_for(mesh: Mesh | None, shape: tuple[int, ...]):
    """Spread the last axis over 'model' when it divides, the first over 'data' when it divides."""
    if mesh is None:
        return None
    spec = [None] * len(shape)
    if shape and shape[-1] % 4 == 0:
        spec[-1] = "model"
    if len(shape) >= 2 and shape[0] % 2 == 0:
        spec[0] = "data"
    return NamedSharding(mesh, P(*spec))


def bits(losses) -> list[int]:
    return [int(np.asarray(v, np.float32).view(np.uint32)) for v in losses]


def data(step: int):
    key = jax.random.fold_in(jax.random.key(42), step)
    x = jax.random.normal(key, (8, 4))
    return x, jnp.sin(x.sum(axis=1, keepdims=True))


# ------------------------------------------------------------------------------------------------
# nnx: a model with dropout (an RngState of typed keys), batch norm, and an optimizer chain


class NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(2)])
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        x = self.drop(nnx.relu(self.norm(self.l1(x))))
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.out(x)


def nnx_tx():
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.masked(optax.add_decayed_weights(1e-3), decay_mask),
        optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2),
    )


def nnx_make():
    model = NnxModel(nnx.Rngs(0, dropout=1))
    return model, nnx.Optimizer(model, nnx_tx(), wrt=nnx.Param)


@nnx.jit
def nnx_step(model, optimizer, x, y):
    def loss_fn(m):
        return ((m(x) - y) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def nnx_shardings(mesh, state):
    return jax.tree.map(lambda v: sharding_for(mesh, np.shape(v)) if mesh is not None else None, state)


def nnx_place(mesh, pair):
    """Puts the model's and the optimizer's state on the mesh (the same placement both runs)."""
    if mesh is None:
        return pair
    graphdef, state = nnx.split(pair)
    state = jax.tree.map(lambda v: jax.device_put(v, sharding_for(mesh, np.shape(v))), state)
    return nnx.merge(graphdef, state)


def nnx_case(directory: str, mesh) -> dict:
    model, optimizer = nnx_place(mesh, nnx_make())
    straight = [nnx_step(model, optimizer, *data(s)) for s in range(2 * STEPS)]

    model, optimizer = nnx_place(mesh, nnx_make())
    resumed = [nnx_step(model, optimizer, *data(s)) for s in range(STEPS)]
    path = f"{directory}/nnx.psk.d"
    ck.save(path, nnx.state((model, optimizer)))
    del model, optimizer

    graphdef, abstract = nnx.split(nnx.eval_shape(nnx_make))
    if mesh is not None:  # Variables wrapping ShapeDtypeStructs that carry their shardings
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding_for(mesh, s.shape)),
                                abstract)
    restored = ck.restore(path, abstract)
    leaves = jax.tree_util.tree_leaves_with_path(restored, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for key_path, variable in leaves:
        assert isinstance(variable, nnx.Variable), key_path
        assert isinstance(variable[...], jax.Array), key_path
        if mesh is not None:
            expected = sharding_for(mesh, variable[...].shape)
            assert variable[...].sharding == expected, (jax.tree_util.keystr(key_path), variable[...].sharding)
    model, optimizer = nnx.merge(graphdef, restored)
    assert isinstance(model.l1.kernel, nnx.Param)

    # without a target: the saved dtypes and plain containers, what nnx.replace_by_pure_dict takes
    plain = ck.restore(path)
    fresh_graphdef, fresh = nnx.split(nnx_make())
    nnx.replace_by_pure_dict(fresh, plain)
    model2, optimizer2 = nnx.merge(fresh_graphdef, fresh)
    for a, b in zip(jax.tree.leaves(nnx.state((model2, optimizer2))), jax.tree.leaves(nnx.state((model, optimizer)))):
        assert a.dtype == b.dtype
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    resumed += [nnx_step(model, optimizer, *data(s)) for s in range(STEPS, 2 * STEPS)]
    return {"straight": bits(straight), "resumed": bits(resumed)}


# ------------------------------------------------------------------------------------------------
# linen: variables (params and batch_stats) and an optax state with reduce_on_plateau


class LinenModel(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(8)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.Dropout(0.2, deterministic=not train)(nn.relu(x))
        return nn.Dense(1)(x)


LINEN_TX = optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau(patience=1, factor=0.5))


def linen_init():
    variables = LinenModel().init(jax.random.key(0), jnp.ones((8, 4)), train=False)
    return {"variables": variables, "opt_state": LINEN_TX.init(variables["params"]),
            "step": jnp.int32(0), "rng": jax.random.key(7)}


@jax.jit
def linen_step(state, x, y):
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(params):
        out, updates = LinenModel().apply({"params": params, "batch_stats": state["variables"]["batch_stats"]},
                                          x, train=True, rngs={"dropout": rng}, mutable=["batch_stats"])
        return ((out - y) ** 2).mean(), updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["variables"]["params"])
    changes, opt_state = LINEN_TX.update(grads, state["opt_state"], state["variables"]["params"], value=loss)
    params = optax.apply_updates(state["variables"]["params"], changes)
    new = {"variables": {"params": params, "batch_stats": updates["batch_stats"]}, "opt_state": opt_state,
           "step": state["step"] + 1, "rng": state["rng"]}
    return new, loss


def linen_place(mesh, state):
    return state if mesh is None else jax.tree.map(lambda v: jax.device_put(v, sharding_for(mesh, np.shape(v))), state)


def linen_case(directory: str, mesh) -> dict:
    state = linen_place(mesh, linen_init())
    straight = []
    for s in range(2 * STEPS):
        state, loss = linen_step(state, *data(s))
        straight.append(loss)

    state = linen_place(mesh, linen_init())
    resumed = []
    for s in range(STEPS):
        state, loss = linen_step(state, *data(s))
        resumed.append(loss)
    best = float(state["opt_state"][1].best_value)
    path = f"{directory}/linen.psk.d"
    ck.save(path, state)
    del state

    abstract = jax.eval_shape(linen_init)  # (its dicts in sorted key order, unlike the saved tree's)
    if mesh is not None:
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding_for(mesh, s.shape)),
                                abstract)
    state = ck.restore(path, abstract)
    assert float(state["opt_state"][1].best_value) == best
    assert jax.random.key_impl(state["rng"]) == "threefry2x32"
    if mesh is not None:
        for key_path, leaf in jax.tree_util.tree_leaves_with_path(state):
            assert leaf.sharding == sharding_for(mesh, leaf.shape), jax.tree_util.keystr(key_path)
    for s in range(STEPS, 2 * STEPS):
        state, loss = linen_step(state, *data(s))
        resumed.append(loss)

    # a partial restore: the params out of the whole train state
    params = ck.restore(path, {"variables": {"params": abstract["variables"]["params"]}}, partial=True)
    assert jax.tree.structure(params["variables"]["params"]) == jax.tree.structure(abstract["variables"]["params"])
    return {"straight": bits(straight), "resumed": bits(resumed)}


def optax_states_case(directory: str) -> dict:
    """The optax states of several transformations, saved and restored without and with a target."""
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    txs = {
        "sgd": optax.sgd(0.1),  # an empty state
        "adamw": optax.adamw(1e-3),
        "masked": optax.masked(optax.adam(1e-3), {"w": True, "b": False}),
        "chain": optax.chain(optax.clip(1.0), optax.scale_by_adam(), optax.scale(-1e-3)),
        "inject": optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9),
        "plateau": optax.contrib.reduce_on_plateau(),
    }
    out = {}
    for name, tx in txs.items():
        state = tx.init(params)
        path = f"{directory}/{name}.psk.d"
        ck.save(path, state)
        back = ck.restore(path, jax.eval_shape(lambda: tx.init(params)))
        assert jax.tree.structure(back) == jax.tree.structure(state), name
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
            assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), name
        plain = ck.restore(path)
        assert len(jax.tree.leaves(plain)) == len(jax.tree.leaves(state)), name
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(state)):
            assert np.asarray(a).dtype == np.asarray(b).dtype, name
        out[name] = type(plain).__name__
    return out


def sharded_dtypes_case(directory: str, mesh) -> dict:
    """Leaves of every kind restored shard by shard into NamedShardings (one device: unsharded)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    host = {"i8": rng.integers(-128, 128, (8, 4), dtype=np.int8),
            "f16": rng.standard_normal((8, 4)).astype(np.float16),
            "mask": rng.integers(0, 2, (8, 4)).astype(bool),
            "c": (rng.standard_normal((8, 4)) + 1j).astype(np.complex64),
            "f8": rng.standard_normal((8, 4)).astype(ml_dtypes.float8_e4m3fn),
            "keys": jax.random.split(jax.random.key(1), 8)}
    path = f"{directory}/dtypes.psk.d"
    ck.save(path, host)
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding_for(mesh, v.shape)) for k, v in host.items()}
    back = ck.restore(path, target)
    for key, value in host.items():
        got = back[key]
        if mesh is not None:
            assert got.sharding == target[key].sharding, (key, got.sharding)
        if key == "keys":
            got, value = jax.random.key_data(got), jax.random.key_data(value)
        assert np.asarray(got).dtype == np.asarray(value).dtype, key
        assert np.asarray(got).tobytes() == np.asarray(value).tobytes(), key
    return {"checked": sorted(host)}


def main() -> None:
    directory = sys.argv[1]
    mesh = mesh_of_devices()
    result = {"devices": len(jax.devices()), "nnx": nnx_case(directory, mesh), "linen": linen_case(directory, mesh),
              "optax": optax_states_case(directory), "dtypes": sharded_dtypes_case(directory, mesh)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
