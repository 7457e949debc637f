"""Groups of host batches moved to the default device (pskd_jax.loader.placing): the arrays
``jax.device_put`` gives — values, dtypes, device, commitment, the host buffer used in place or
not alike — by jaxlib's call where that is known to hold, by ``jax.device_put`` elsewhere."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pskd_jax.format.byte_sources import aligned_empty
from pskd_jax.loader import placing

jax = pytest.importorskip("jax")


@pytest.fixture
def fresh_check(monkeypatch):
    """The once-a-process comparison made anew in this test."""
    monkeypatch.setitem(placing._state, "checked", False)
    monkeypatch.setitem(placing._state, "usable", placing._batched_device_put is not None)


def group(dtype, count: int = 5, shape=(4, 3)) -> list[np.ndarray]:
    whole = aligned_empty((count * shape[0], *shape[1:]), dtype)
    whole[...] = np.arange(whole.size).reshape(whole.shape).astype(dtype)
    return [whole[k * shape[0] : (k + 1) * shape[0]] for k in range(count)]


def same_as_device_put(got, host) -> None:
    want = jax.device_put(host)
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w, h in zip(got_leaves, want_leaves, jax.tree_util.tree_leaves(host)):
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
        assert g.sharding == w.sharding and g.committed == w.committed
        assert np.array_equal(np.asarray(g), np.asarray(w), equal_nan=True)
        if np.asarray(h).dtype == g.dtype:
            assert np.array_equal(np.asarray(g).view(np.uint8), np.ascontiguousarray(h).view(np.uint8))  # (bit for bit)
        if isinstance(h, np.ndarray):
            assert placing._in_place(g, h) == placing._in_place(w, h)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.float32, np.bool_, ml_dtypes.bfloat16, np.complex64])
def test_a_group_is_what_device_put_gives(fresh_check, dtype):
    batches = group(dtype)
    placed = placing.put_on_default_device(batches)
    same_as_device_put(placed, batches)
    assert placing._state["usable"] == (placing._batched_device_put is not None)


def test_trees_of_several_leaves(fresh_check):
    a, b = group(np.uint16), group(np.float32, shape=(4,))
    trees = [{"inputs": x, "weights": (y, y[::-1].copy())} for x, y in zip(a, b)]
    same_as_device_put(placing.put_on_default_device(trees), trees)


def test_leaves_jax_would_change_go_through_device_put(fresh_check):
    """64-bit leaves under disabled x64 (narrowed by JAX), strided views and Python scalars: the
    whole group by jax.device_put, the same arrays as its."""
    assert not jax.config.jax_enable_x64
    for host in (group(np.int64), group(np.float64), [x[:, ::2] for x in group(np.uint16)], [1, 2.5]):
        same_as_device_put(placing.put_on_default_device(host), host)


def test_without_jaxlibs_call_everything_goes_through_device_put(fresh_check, monkeypatch):
    monkeypatch.setitem(placing._state, "usable", False)
    calls = []
    monkeypatch.setattr(placing, "_batched_device_put", lambda *a, **k: calls.append(a))
    batches = group(np.uint16)
    same_as_device_put(placing.put_on_default_device(batches), batches)
    assert calls == []


def test_a_call_that_gives_something_else_is_turned_off(fresh_check, monkeypatch):
    real = placing._batched_device_put

    def committed(aval, sharding, xs, devices, committed=True):
        return real(aval, sharding, xs, devices, committed=True)  # (not what device_put(x) gives)

    monkeypatch.setattr(placing, "_batched_device_put", committed)
    batches = group(np.float32)
    same_as_device_put(placing.put_on_default_device(batches), batches)
    assert placing._state == {"checked": True, "usable": False}
    same_as_device_put(placing.put_on_default_device(batches), batches)  # (and stays off)


def test_an_empty_group_and_empty_arrays(fresh_check):
    assert placing.put_on_default_device([]) == []
    empty = [np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)]
    same_as_device_put(placing.put_on_default_device(empty), empty)
