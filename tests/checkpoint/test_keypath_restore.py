"""Restore matches a target's leaves by key path through the layout file: any dict order works."""

from __future__ import annotations

import collections
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.errors import PskdError
from pskd_jax.format.reader import Reader


class State(typing.NamedTuple):
    count: np.ndarray
    mu: dict


def tree():
    return {"z": np.arange(3, dtype=np.float32), "a": {"y": np.int32(-4), "b": np.ones((2, 2))},
            "m": State(np.int32(3), {"w": np.full(2, 0.5, np.float32)}), "list": [np.uint8(1), np.uint8(2)]}


def test_a_target_of_any_dict_order_is_matched_by_key_path(tmp_path):
    saved = tree()
    ck.save(tmp_path / "c.psk.d", saved)
    sorted_target = jax.tree.map(lambda x: x, saved)  # jax.tree.map rebuilds dicts in sorted key order
    assert list(sorted_target) == ["a", "list", "m", "z"]
    for target in (sorted_target, jax.eval_shape(lambda: saved), saved):
        back = ck.restore(tmp_path / "c.psk.d", target, as_numpy=True)
        assert list(back) == list(target)  # the target's containers, in its order
        assert back["a"]["y"].dtype == np.int32 and int(back["a"]["y"]) == -4
        np.testing.assert_array_equal(back["z"], saved["z"])
        assert isinstance(back["m"], State) and float(back["m"].mu["w"][1]) == 0.5


def test_a_jitted_function_output_is_a_target(tmp_path):
    saved = {"b": jnp.ones(2), "a": jnp.zeros(3)}
    ck.save(tmp_path / "c.psk.d", saved)
    target = jax.jit(lambda: {"b": jnp.zeros(2), "a": jnp.ones(3)})()
    back = ck.restore(tmp_path / "c.psk.d", target)
    assert back["b"].tolist() == [1.0, 1.0] and back["a"].tolist() == [0.0, 0.0, 0.0]


def test_a_mismatch_names_every_missing_and_extra_key_path(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"a": np.ones(1), "b": np.ones(1), "c": np.ones(1)})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"a": np.ones(1), "x": np.ones(1), "y": np.ones(1)})
    message = e.value.message
    assert e.value.code == "E9005"
    assert "2 key path(s) of the target not in the checkpoint: ['x'], ['y']" in message
    assert "2 key path(s) of the checkpoint not in the target: ['b'], ['c']" in message
    assert "partial=True" in message


def test_a_long_mismatch_is_abridged(tmp_path):
    ck.save(tmp_path / "c.psk.d", {f"k{i}": np.ones(1) for i in range(100)})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {f"j{i}": np.ones(1) for i in range(100)})
    assert "… and 80 more" in e.value.message and len(e.value.message) < 2000


def test_shapes_and_kinds_are_checked_at_the_key_path(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones((2, 3), np.float32), "n": np.int32(1)})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"n": np.int32(0), "w": np.ones((3, 2), np.float32)})
    assert e.value.code == "E9005" and "at ['w']: expected (3, 2) float32, found (2, 3) float32" in e.value.message
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"n": np.float32(0), "w": np.ones((2, 3), np.float32)})
    assert e.value.code == "E9005" and "at ['n']" in e.value.message


def test_without_a_layout_file_leaves_match_by_position_and_the_error_says_other_order(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"b": np.ones(2, np.float32), "a": np.zeros(3, np.float32)},
            SaveOptions(layout_file=False))
    back = ck.restore(tmp_path / "c.psk.d", {"b": np.zeros(2, np.float32), "a": np.zeros(3, np.float32)})
    assert back["b"].tolist() == [1.0, 1.0]
    saved_order = {"b": np.zeros(2, np.float32), "a": np.zeros(3, np.float32)}
    with pytest.raises(PskdError) as e:  # sorted (jax.tree.map): by position, the order differs
        ck.restore(tmp_path / "c.psk.d", {"a": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)},
                   layout=saved_order)
    assert e.value.code == "E9005" and "same leaves, other order" in e.value.message
    with pytest.raises(PskdError) as e:  # a target whose leaves do not fill the file's bytes
        ck.restore(tmp_path / "c.psk.d", {"a": np.zeros(3, np.float32)})
    assert e.value.code in ("E9003", "E9005")
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"b": np.zeros(2, np.float32)}, partial=True)
    assert e.value.code == "E9001" and "layout file" in e.value.message


def test_a_variable_value_path_matches_a_pure_dict_path(tmp_path):
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    ck.save(tmp_path / "s.psk.d", state)
    pure = nnx.to_pure_dict(state)
    back = ck.restore(tmp_path / "s.psk.d", pure)  # paths without .value
    np.testing.assert_array_equal(back["kernel"], model.kernel[...])
    ck.save(tmp_path / "p.psk.d", pure)
    again = ck.restore(tmp_path / "p.psk.d", nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(1))))
    assert isinstance(again["kernel"], nnx.Param)
    np.testing.assert_array_equal(again["kernel"][...], model.kernel[...])


def test_reader_checks_a_template_against_the_layout_file(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones((2, 3), np.float32), "b": np.ones(6, np.float32)})
    with pytest.raises(PskdError) as e:  # the same byte size, other shapes: no longer read silently wrong
        Reader(tmp_path / "c.psk.d", layout={"w": np.ones((3, 2), np.float32), "b": np.ones(6, np.float32)})
    assert e.value.code == "E9005" and "at ['w']" in e.value.message and "c.layout.json" in e.value.message
    with pytest.raises(PskdError) as e:
        Reader(tmp_path / "c.psk.d", layout={"b": np.ones(6, np.float32), "w": np.ones((2, 3), np.float32)})
    assert "same leaves, other order" in e.value.message
    with pytest.raises(PskdError) as e:
        Reader(tmp_path / "c.psk.d", layout={"w": np.ones((2, 3), np.float32), "x": np.ones(6, np.float32)})
    assert "['x']" in e.value.message and "['b']" in e.value.message
    with Reader(tmp_path / "c.psk.d", layout={"w": np.ones((2, 3), np.float32), "b": np.ones(6, np.float32)}) as r:
        assert r[0]["w"].shape == (2, 3)


def test_restore_without_a_target_keeps_key_types_and_containers(tmp_path):
    saved = {0: np.ones(1), 1: np.ones(1), "od": collections.OrderedDict(b=np.ones(1)), "t": (np.ones(1),),
             "m": State(np.int32(1), {3: np.ones(1)}), "e": {}, "n": None, "l": []}
    ck.save(tmp_path / "c.psk.d", saved)
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert list(back) == [0, 1, "od", "t", "m", "e", "n", "l"]  # int keys stay keys of a dict
    assert isinstance(back["t"], tuple) and back["e"] == {} and back["n"] is None and back["l"] == []
    assert type(back["m"]).__name__ == "State" and back["m"]._fields == ("count", "mu") and list(back["m"].mu) == [3]
    assert back["m"].count.dtype == np.int32
    # jax flattens the rebuilt namedtuple like the original: the same leaves
    assert len(jax.tree.leaves(back["m"])) == len(jax.tree.leaves(saved["m"])) == 2


def test_an_empty_tree_and_empty_subtrees_save_and_restore(tmp_path):
    for empty in ({}, [], (), None, {"a": {}, "b": []}):
        ck.save(tmp_path / "e.psk.d", empty)
        assert ck.restore(tmp_path / "e.psk.d") == empty
        assert ck.restore(tmp_path / "e.psk.d", empty) == empty


def test_a_layout_file_read_once_serves_several_restores(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"b": np.int8(-2), "a": np.zeros(2, np.float16)})
    layout_file = ck.read_layout_file(tmp_path / "c.layout.json")
    back = ck.restore(tmp_path / "c.psk.d", layout=layout_file, as_numpy=True)
    assert back["b"].dtype == np.int8 and int(back["b"]) == -2 and back["a"].dtype == np.float16
    stored_view = ck.restore(tmp_path / "c.psk.d", layout=layout_file.layout, as_numpy=True)  # a bare Layout
    assert stored_view["b"].dtype == np.uint8 and int(stored_view["b"]) == 254
    # another save: it no longer belongs
    ck.save(tmp_path / "c.psk.d", {"b": np.int8(-2)}, SaveOptions(layout_file=False))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", layout=layout_file)
    assert e.value.code == "E9005"
