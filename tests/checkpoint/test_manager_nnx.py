"""CheckpointManager.save and save_async of a real flax nnx state with Dropout and Rngs (typed
PRNG keys): the background save works from a snapshot the caller's later changes and donations
never reach."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pskd_jax.checkpoint import CheckpointManager
from tests.helpers import raises

nnx = pytest.importorskip("flax.nnx")


class Model(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.linear(x))


def leaves_of(state) -> dict:
    """Each leaf of an nnx state by key path: key arrays as their key data (numpy)."""
    out = {}
    for path, value in jax.tree_util.tree_leaves_with_path(state):
        if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        out[jax.tree_util.keystr(path)] = np.asarray(value)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("how", ["save", "save_async"])
def test_an_nnx_state_with_dropout_keys_saves_through_the_manager(tmp_path, how):
    model = Model(nnx.Rngs(0, dropout=7))
    model.train()
    model(jnp.ones((2, 3)))  # a dropout call: the rng count moves on
    state = nnx.state(model)
    expected = leaves_of(state)
    with CheckpointManager(tmp_path / "run") as manager:
        getattr(manager, how)(5, state)
        if how == "save_async":
            # The caller goes on: its parameters change, its key's buffer is donated (deleted).
            model.linear.kernel[...] = model.linear.kernel[...] + 1
            state["drop"]["rngs"]["key"][...].delete()
        manager.wait()
        abstract = nnx.state(nnx.eval_shape(lambda: Model(nnx.Rngs(1, dropout=1))))
        back = manager.restore(5, abstract)
    assert isinstance(back["drop"]["rngs"]["key"], nnx.RngKey)
    assert jnp.issubdtype(back["drop"]["rngs"]["key"][...].dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(back["drop"]["rngs"]["key"][...]) == jax.random.key_impl(jax.random.key(0))
    got = leaves_of(back)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    restored = Model(nnx.Rngs(2, dropout=2))
    nnx.update(restored, back)
    restored.train()
    fresh = Model(nnx.Rngs(0, dropout=7))
    fresh.train()
    fresh(jnp.ones((2, 3)))
    np.testing.assert_array_equal(restored(jnp.ones((2, 3))), fresh(jnp.ones((2, 3))))  # the same dropout mask


def test_a_leaf_that_cannot_be_copied_is_named_not_a_raw_error(tmp_path):
    value = jnp.arange(3.0)
    value.delete()
    with CheckpointManager(tmp_path / "run") as manager:
        for how in (manager.save_async, manager.save):
            with raises("E9005", "['w']", "deleted"):
                how(1, {"w": value, "k": jax.random.key(1)})
        assert manager.all_steps() == []
