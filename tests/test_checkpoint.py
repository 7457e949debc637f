"""save / restore: exact in every encoding, declaration order, refusals that name the leaf, atomic."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import fractions
import hashlib
import os
import typing

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import xxhash

from pskd_jax.checkpoint import encode, keypaths, restoring
from pskd_jax import checkpoint as ck
from pskd_jax.format.reader import Reader
from pskd_jax.errors import PskdError
from pskd_jax.data.export import export_json
from pskd_jax.data.info import info_lines

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(array: np.ndarray) -> np.ndarray:
    """An array's raw bits, to compare exactly (a -0.0 is not a 0.0 here)."""
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.itemsize in (1, 2, 4, 8) else array


def random_finite(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Random bit patterns of a float dtype, NaN and Inf replaced: subnormals, -0.0, extremes."""
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=f"u{dtype.itemsize}")
    values = raw.view(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(values.astype(np.float64))
    values[bad] = dtype.type(-0.0)
    return values


def all_files(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------------------------------------
# Exactness


@pytest.mark.parametrize("dtype", [BF16, np.float32, np.float64])
def test_every_bit_pattern_round_trips(tmp_path, rng, dtype):
    tree = {"w": random_finite(rng, dtype, (37, 5)), "b": random_finite(rng, dtype, (5,)),
            "s": random_finite(rng, dtype, ())}
    tree["w"][0, :3] = [dtype.type(-0.0) if hasattr(dtype, "type") else -0.0] * 3
    path = tmp_path / "c.psk.d"
    result = ck.save(path, tree)
    assert result.type_text == "params Params"
    for restored in (ck.restore(path, tree), ck.restore(path, as_numpy=True), ck.restore(path, zero_copy=True)):
        for key in tree:
            assert restored[key].dtype == np.dtype(dtype)
            assert restored[key].shape == tree[key].shape
            np.testing.assert_array_equal(bits(restored[key]), bits(tree[key]))


def test_encodings_follow_dtypes_and_float16_is_stored_as_f32(tmp_path):
    tree = {"a": np.ones(2, BF16), "b": np.ones(2, np.float32), "c": np.ones(2, np.float64),
            "d": np.array([0.1, -6e-8, 65504], np.float16)}
    result = ck.save(tmp_path / "c.psk.d", tree)
    assert [e.label for e in result.encodings] == ["bf16", "f32", "f64", "f32"]
    assert result.version == 2
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert back["d"].dtype == np.float16  # the layout file records the dtype: float16 again
    np.testing.assert_array_equal(bits(back["d"]), bits(tree["d"]))
    # the target asks for float16 again: an explicit cast, exact here
    again = ck.restore(tmp_path / "c.psk.d", tree)
    assert again["d"].dtype == np.float16
    np.testing.assert_array_equal(bits(again["d"]), bits(tree["d"]))


def test_all_f64_checkpoint_is_version_1(tmp_path):
    result = ck.save(tmp_path / "c.psk.d", {"w": np.arange(3.0)})
    assert result.version == 1
    assert (tmp_path / "c.psk.d").read_bytes()[4:6] == b"\x01\x00"


def test_golden_bytes(tmp_path):
    ck.save(tmp_path / "g.psk.d", {"w": np.array([1.0, -2.0], np.float32), "n": np.uint8(7)}, name="G")
    assert (tmp_path / "g.psk.d").read_bytes().hex(" ") == (
        "50 53 4b 44 02 00 08 00 00 00 70 61 72 61 6d 73 20 47 "  # PSKD v2 "params G"
        "01 00 00 00 00 00 00 00 02 00 00 00 01 00 "  # count 1, 2 leaves: f32, idx
        "00 00 80 3f 00 00 00 c0 07"  # 1.0f, -2.0f, 7
    )


def test_higher_precision_inputs_round_once_to_f64(tmp_path):
    third = fractions.Fraction(1, 3)
    tree = {
        "fraction": third,
        "decimal": decimal.Decimal("0.1000000000000000055511151231257827"),
        "longdouble": np.array([np.longdouble(1) / np.longdouble(3)]),
        "python": 0.5,
    }
    ck.save(tmp_path / "c.psk.d", tree)
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert back["fraction"].dtype == np.float64 and float(back["fraction"]) == float(third)
    assert float(back["decimal"]) == 0.1
    assert back["longdouble"][0] == np.float64(np.longdouble(1) / np.longdouble(3))
    assert float(back["python"]) == 0.5


def test_narrowing_is_refused_unless_asked_and_then_reported(tmp_path):
    tree = {"w": np.array([[1.0, 1.0 + 2**-20], [3.0, 0.1]])}
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "c.psk.d", tree, encodings="bf16")
    assert e.value.code == "E9004"
    assert "['w'] at index [0, 1]" in e.value.message and "round_to_encoding" in e.value.message
    assert not (tmp_path / "c.psk.d").exists()
    result = ck.save(tmp_path / "c.psk.d", tree, encodings={"['w']": "bf16"}, round_to_encoding=True)
    [report] = result.rounding
    assert report.encoding.label == "bf16" and report.where == (1, 1)
    assert report.max_error == pytest.approx(abs(0.1 - float(np.float64(0.1).astype(BF16))))
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)["w"]
    assert back.dtype == BF16
    np.testing.assert_array_equal(back.astype(np.float64), ck_round_bf16(tree["w"]))


def ck_round_bf16(values):
    from pskd_jax.format.encodings import round_f64_to_bf16

    return round_f64_to_bf16(values).astype(np.float64)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [BF16, np.float32, np.float64, np.float16])
def test_nan_and_inf_are_refused_naming_the_key_path(tmp_path, bad, dtype):
    w = np.zeros((3, 4), dtype)
    w[2, 1] = bad
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "c.psk.d", {"blocks": [{"w": np.zeros(2, dtype)}, {"w": w}]}, finite_only=True)
    assert e.value.code == "E9004"
    assert "['blocks'][1]['w'] at index [2, 1]" in e.value.message


def test_nan_deep_in_a_large_leaf_names_its_index(tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "CHUNK_BYTES", 64)  # many chunks: the index must be the leaf's own
    w = np.ones((10, 30), np.float32)
    w[7, 29] = np.nan
    with pytest.raises(PskdError, match=r"\['w'\] at index \[7, 29\]"):
        ck.save(tmp_path / "c.psk.d", {"w": w}, finite_only=True)
    big = np.ones((10, 30))
    big[8, 3] = 0.1
    with pytest.raises(PskdError, match=r"\['w'\] at index \[8, 3\]"):
        ck.save(tmp_path / "c.psk.d", {"w": big}, encodings="f32")
    result = ck.save(tmp_path / "c.psk.d", {"w": big}, encodings="f32", round_to_encoding=True)
    assert result.rounding[0].where == (8, 3)


def test_indices_bools_and_negative_ints(tmp_path):
    tree = {"u8": np.arange(5, dtype=np.uint8), "i32": np.int32(2**31 - 1), "mask": np.array([True, False]),
            "i64": np.array([0, 2**62], np.int64)}
    result = ck.save(tmp_path / "c.psk.d", tree)
    layout = ck.read_layout_file(tmp_path / "c.layout.json")
    assert [leaf.bound for leaf in layout.layout.leaves] == [256, 2**32, 2, 2**64]
    back = ck.restore(tmp_path / "c.psk.d", tree)
    for key in tree:
        assert back[key].dtype == tree[key].dtype
        np.testing.assert_array_equal(back[key], tree[key])
    plain = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert [plain[k].dtype for k in tree] == [np.uint8, np.int32, np.bool_, np.int64]
    # negative values are stored as their two's-complement pattern
    ck.save(tmp_path / "d.psk.d", {"step": np.array([3, -1], np.int32)})
    assert ck.restore(tmp_path / "d.psk.d", as_numpy=True)["step"].tolist() == [3, -1]
    assert result.encodings and all(e.label == "f64" for e in result.encodings)


# ------------------------------------------------------------------------------------------------
# Trees


class Pair(typing.NamedTuple):
    second: np.ndarray
    first: np.ndarray


@dataclasses.dataclass
class Block:
    w: np.ndarray
    b: np.ndarray


def test_declaration_order_not_sorted_order(tmp_path):
    tree = {"z": np.full(1, 1.0), "a": np.full(1, 2.0), "m": Pair(np.full(1, 3.0), np.full(1, 4.0)),
            "blocks": [Block(np.full(1, 5.0), np.full(1, 6.0))],
            "od": collections.OrderedDict([("y", np.full(1, 7.0)), ("b", np.full(1, 8.0))])}
    ck.save(tmp_path / "c.psk.d", tree)
    with Reader(tmp_path / "c.psk.d", layout=ck.read_layout(tmp_path / "c.layout.json")) as r:
        stored = np.frombuffer(r.raw_data(), np.float64)
    np.testing.assert_array_equal(stored, [1, 2, 3, 4, 5, 6, 7, 8])
    back = ck.restore(tmp_path / "c.psk.d", tree)
    assert list(back) == ["z", "a", "m", "blocks", "od"]
    assert isinstance(back["m"], Pair) and isinstance(back["blocks"][0], Block)
    assert isinstance(back["od"], collections.OrderedDict) and list(back["od"]) == ["y", "b"]
    assert float(back["blocks"][0].b[0]) == 6.0
    # a program that flattens in JAX's sorted order would read different leaves
    assert [float(x[0]) for x in jax.tree_util.tree_leaves({"z": tree["z"], "a": tree["a"]})] == [2, 1]


def test_the_callers_tree_is_not_modified(tmp_path):
    w = np.array([1.0, 0.1])
    tree = {"w": w, "n": [np.int32(3)], "f": fractions.Fraction(1, 3)}
    before = {"w": w.copy(), "ids": (id(tree["w"]), id(tree["n"])), "keys": list(tree)}
    ck.save(tmp_path / "c.psk.d", tree, encodings={"['w']": "bf16"}, round_to_encoding=True)
    assert list(tree) == before["keys"] and (id(tree["w"]), id(tree["n"])) == before["ids"]
    np.testing.assert_array_equal(bits(tree["w"]), bits(before["w"]))
    assert tree["w"].dtype == np.float64 and tree["f"] == fractions.Fraction(1, 3)


def test_tuple_of_arrays_is_a_closed_type_and_restores_to_a_tuple(tmp_path):
    tokens = np.arange(8, dtype=np.uint16).reshape(2, 4)
    result = ck.save(tmp_path / "t.psk.d", (np.ones((2, 3), np.float32), tokens, np.array([True, False])))
    assert result.type_text == "(ℝ[2, 3], idx[65536][2, 4], bool[2])"
    assert result.layout_path is None and not (tmp_path / "t.layout.json").exists()
    back = ck.restore(tmp_path / "t.psk.d", as_numpy=True)
    assert isinstance(back, tuple) and len(back) == 3
    np.testing.assert_array_equal(back[1], tokens)
    assert ck.save(tmp_path / "one.psk.d", np.zeros((2, 2))).type_text == "ℝ[2, 2]"


def test_params_without_target_or_layout_is_e9001(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(2)}, layout_file=False)
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9001" and "c.layout.json" in e.value.message
    # with a target, the target supplies the layout
    back = ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(2)})
    np.testing.assert_array_equal(back["w"], [1, 1])


# ------------------------------------------------------------------------------------------------
# Mismatches


def saved(tmp_path, **options):
    tree = {"embed": np.ones((4, 8), np.float32), "blocks": [{"w": np.ones((8, 8), np.float32)}]}
    ck.save(tmp_path / "c.psk.d", tree, **options)
    return tree


def test_shape_mismatch_names_key_path_expected_and_found(tmp_path):
    saved(tmp_path)
    target = {"embed": np.ones((4, 8), np.float32), "blocks": [{"w": np.ones((8, 4), np.float32)}]}
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", target)
    assert e.value.code == "E9005"
    assert "at ['blocks'][0]['w']: expected (8, 4) float32, found (8, 8) float32" in e.value.message


def test_structure_mismatch_names_the_key_path(tmp_path):
    saved(tmp_path)
    with pytest.raises(PskdError, match=r"target not in the checkpoint: \['blocks'\]\[1\]\['w'\]"):
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32),
                                          "blocks": [{"w": np.ones((8, 8), np.float32)}] * 2})
    # matched by key path through the layout file: another order is the same tree
    back = ck.restore(tmp_path / "c.psk.d", {"blocks": [{"w": np.ones((8, 8), np.float32)}],
                                             "embed": np.ones((4, 8), np.float32)})
    assert list(back) == ["blocks", "embed"]


def test_mismatch_without_the_layout_file_is_still_refused(tmp_path):
    saved(tmp_path, layout_file=False)
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32)})
    assert e.value.code == "E9005"
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32),
                                          "blocks": [{"w": np.ones((8, 9), np.float32)}]})
    assert e.value.code in ("E9003", "E9005")


def test_reals_into_an_integer_target_are_refused(tmp_path):
    saved(tmp_path)
    with pytest.raises(PskdError, match=r"at \['embed'\]: expected \(4, 8\) int32, found reals"):
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.int32),
                                          "blocks": [{"w": np.ones((8, 8), np.float32)}]})


def test_target_dtype_is_an_explicit_cast(tmp_path):
    tree = {"w": np.array([1.0, 1 + 2**-30, 0.1])}
    ck.save(tmp_path / "c.psk.d", tree)
    back = ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(3, np.float32)})
    assert back["w"].dtype == np.float32
    np.testing.assert_array_equal(back["w"], tree["w"].astype(np.float32))


# ------------------------------------------------------------------------------------------------
# JAX


def test_jax_targets_and_results(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (16, 8)), "b": random_finite(rng, np.float32, (8,)),
            "step": np.int32(11)}
    ck.save(tmp_path / "c.psk.d", tree)
    specs = {k: jax.ShapeDtypeStruct(np.shape(x), x.dtype) for k, x in tree.items()}
    back = ck.restore(tmp_path / "c.psk.d", specs)
    assert isinstance(back["w"], jax.Array) and back["w"].dtype == jnp.bfloat16
    for key in tree:
        np.testing.assert_array_equal(bits(np.asarray(back[key])), bits(np.asarray(tree[key])))
    # no target: the stored dtypes, as JAX arrays
    plain = ck.restore(tmp_path / "c.psk.d", layout=tmp_path / "c.layout.json")
    assert isinstance(plain["b"], jax.Array) and plain["step"].dtype == jnp.int32


def test_jax_arrays_save_to_the_same_bytes_as_numpy(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (16, 8)), "b": random_finite(rng, np.float32, (8,))}
    ck.save(tmp_path / "n.psk.d", tree)
    ck.save(tmp_path / "j.psk.d", {k: jnp.asarray(v) for k, v in tree.items()})  # tree_map would sort
    assert (tmp_path / "n.psk.d").read_bytes() == (tmp_path / "j.psk.d").read_bytes()


def test_f64_into_jax_with_x64_disabled(tmp_path):
    assert not jax.config.jax_enable_x64
    ck.save(tmp_path / "c.psk.d", {"w": np.array([0.1, 2.0])})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", layout=tmp_path / "c.layout.json")
    assert e.value.code == "E9005" and "at ['w']" in e.value.message and "x64" in e.value.message
    with pytest.raises(PskdError, match="x64"):
        ck.restore(tmp_path / "c.psk.d", {"w": jax.ShapeDtypeStruct((2,), np.float64)})
    back = ck.restore(tmp_path / "c.psk.d", {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    assert back["w"].dtype == jnp.float32 and float(back["w"][0]) == float(np.float32(0.1))
    # numpy results are not JAX's business
    assert ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(2)})["w"].dtype == np.float64


# ------------------------------------------------------------------------------------------------
# Views, layout files, atomicity, integrity


def test_zero_copy_views_are_read_only_and_outlive_everything(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (64, 4)), "h": random_finite(rng, BF16, (3,))}
    ck.save(tmp_path / "c.psk.d", tree)
    views = ck.restore(tmp_path / "c.psk.d", zero_copy=True)
    assert not views["w"].flags.writeable
    with pytest.raises(ValueError):
        views["w"][0, 0] = 1
    import gc

    gc.collect()
    np.testing.assert_array_equal(bits(views["w"]), bits(tree["w"]))
    np.testing.assert_array_equal(bits(views["h"]), bits(tree["h"]))


def test_layout_file_opens_params_checkpoints_for_info_and_export(tmp_path):
    tree = {"emb": np.arange(4, dtype=np.float32).reshape(2, 2), "layers": [{"w": np.float64(0.5)}],
            "count": np.uint16(9)}
    ck.save(tmp_path / "m.psk.d", tree, name="Mini")
    layout = ck.find_layout(tmp_path / "m.psk.d")
    assert [leaf.path for leaf in layout.leaves] == ["['emb']", "['layers'][0]['w']", "['count']"]
    lines = info_lines(str(tmp_path / "m.psk.d"), layout=layout)
    assert lines[0] == "type    params Mini"
    assert lines[-1] == "[0] {'emb': [[0.0, 1.0], [2.0, 3.0]], 'layers': [{'w': 0.5}], 'count': 9}"
    export_json(str(tmp_path / "m.psk.d"), str(tmp_path / "m.json"), layout=layout)
    import json

    content = json.loads((tmp_path / "m.json").read_text())
    assert content["samples"] == [{"emb": [[0.0, 1.0], [2.0, 3.0]], "layers": [{"w": 0.5}], "count": 9}]


def test_path_keys_and_nest():
    assert ck.path_keys("['blocks'][0]['w']") == ["blocks", 0, "w"]
    assert ck.path_keys(".params['a.b'][3]") == ["params", "a.b", 3]
    assert ck.path_keys("") == []
    assert ck.nest([["a", 1], ["a", 0], ["b"]], [1, 0, 2]) == {"a": [0, 1], "b": 2}
    assert ck.nest([["a", 2], ["a", 0]], [1, 2]) == {"a": {2: 1, 0: 2}}


def test_a_failed_save_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path):
    good = {"w": np.ones(3, np.float32), "v": np.ones(2, np.float32)}
    ck.save(tmp_path / "c.psk.d", good)
    before = (tmp_path / "c.psk.d").read_bytes()
    bad = {"w": np.full(3, 2.0, np.float32), "v": np.array([1.0, np.nan], np.float32)}
    with pytest.raises(PskdError):
        ck.save(tmp_path / "c.psk.d", bad, finite_only=True)
    assert (tmp_path / "c.psk.d").read_bytes() == before
    assert all_files(tmp_path) == ["c.layout.json", "c.psk.d"]


def test_a_refused_save_writes_no_file_not_even_the_layout(tmp_path):
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "new.psk.d", {"w": np.array([1.0, np.nan], np.float32)}, finite_only=True)
    assert e.value.code == "E9004"
    assert all_files(tmp_path) == []
    # over an older checkpoint of another structure, the old checkpoint and its layout stay a pair
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(3, np.float32)})
    layout = (tmp_path / "c.layout.json").read_bytes()
    with pytest.raises(PskdError):
        ck.save(tmp_path / "c.psk.d", {"a": [np.ones(2), np.array([2**70], dtype=object)], "b": np.zeros(4)})
    assert (tmp_path / "c.layout.json").read_bytes() == layout
    assert ck.restore(tmp_path / "c.psk.d", as_numpy=True)["w"].tolist() == [1.0, 1.0, 1.0]
    assert all_files(tmp_path) == ["c.layout.json", "c.psk.d"]


def nested(depth: int, leaf) -> dict:
    tree = leaf
    for _ in range(depth):
        tree = {"k": tree}
    return tree


def test_trees_nest_at_most_max_key_depth(tmp_path):
    assert keypaths.MAX_KEY_DEPTH == 64
    ck.save(tmp_path / "deep.psk.d", nested(64, np.ones(2)))
    back = ck.restore(tmp_path / "deep.psk.d", as_numpy=True)  # through its layout file
    for _ in range(64):
        back = back["k"]
    assert back.tolist() == [1.0, 1.0]
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "deeper.psk.d", nested(65, np.ones(2)))
    assert e.value.code == "E9005" and "65 keys deep" in e.value.message and "['k']['k']" in e.value.message
    assert not (tmp_path / "deeper.psk.d").exists() and not (tmp_path / "deeper.layout.json").exists()
    for depth in (65, 3000):
        with pytest.raises(PskdError) as e:
            ck.nest([["a"] * depth, ["b"]], [1, 2])
        assert e.value.code == "E9005" and f"({depth} keys)" in e.value.message


def layout_text(tmp_path, change) -> str:
    import json

    ck.save(tmp_path / "c.psk.d", {"w": np.ones((2, 3), np.float32), "k": np.uint8(7)})
    content = json.loads((tmp_path / "c.layout.json").read_text())
    change(content)
    return json.dumps(content)


@pytest.mark.parametrize("what, text", [
    ("nested 100000 deep", lambda tmp_path: "[" * 100000 + "]" * 100000),
    ("a bound of Infinity", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][1].update(bound=float("inf")))),
    ("a bound of 184467440737E551615 (infinite as a float)",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][1].update(bound=0)).replace('"bound": 0',
                                                                                            '"bound": 184467440737E551615')),
    ("a shape of -Infinity", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(shape=[2, float("-inf")]))),
    ("a key that is a list", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=[[1, 2]]))),
    ("a key that is an object", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=[{}]))),
    ("keys that are a string", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys="w"))),
    ("a key path 5000 keys deep", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=["k"] * 5000))),
    ("a key path 65 keys deep", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=["k"] * 65))),
])
def test_a_hostile_layout_file_is_e9001_naming_it(tmp_path, what, text):
    layout_text(tmp_path, lambda d: None)  # the checkpoint the layout is tried on
    path = tmp_path / "hostile.layout.json"
    path.write_text(text(tmp_path))
    with pytest.raises(PskdError) as e:
        ck.read_layout_file(path)
    assert e.value.code == "E9001" and str(path) in e.value.message, what
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", layout=str(path), as_numpy=True)
    assert e.value.code == "E9001"


def test_a_layout_key_path_64_keys_deep_is_read(tmp_path):
    path = tmp_path / "ok.layout.json"
    path.write_text(layout_text(tmp_path, lambda d: [d["leaves"][0].update(keys=["k"] * 63 + ["w"]),
                                                    d["leaves"][1].update(keys=["k"] * 63 + ["b"]),
                                                    d.pop("tree")]))  # (without a tree: built from keys)
    back = ck.restore(tmp_path / "c.psk.d", layout=str(path), as_numpy=True)
    for _ in range(63):
        back = back["k"]
    assert sorted(back) == ["b", "w"] and int(back["b"]) == 7


def test_sha256_checked_while_restoring(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (256, 64))}
    result = ck.save(tmp_path / "c.psk.d", tree, digest=True)
    assert result.sha256 == hashlib.sha256((tmp_path / "c.psk.d").read_bytes()).hexdigest()
    assert result.xxh3_128 is None and result.digest == {"sha256": result.sha256}
    assert ck.file_sha256(tmp_path / "c.psk.d") == result.sha256
    ck.restore(tmp_path / "c.psk.d", tree, sha256=result.sha256)
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-1000] ^= 0x01  # one flipped bit in the weights
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    for options in ({}, {"zero_copy": True}):
        with pytest.raises(PskdError) as e:
            ck.restore(tmp_path / "c.psk.d", tree, sha256=result.sha256, **options)
        assert e.value.code == "E9013" and "c.psk.d" in e.value.message and "sha256" in e.value.message
    # unverified, the damage goes unnoticed, as with any format without a digest
    ck.restore(tmp_path / "c.psk.d", tree)


def test_xxh3_128_is_the_digest_of_the_whole_file(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (64, 33)), "step": np.int32(3)}
    result = ck.save(tmp_path / "c.psk.d", tree, digest="xxh3_128")
    content = (tmp_path / "c.psk.d").read_bytes()
    assert ck.CHECKPOINT_DIGEST == "xxh3_128"
    assert result.xxh3_128 == xxhash.xxh3_128(content).hexdigest() == ck.file_digest(tmp_path / "c.psk.d")
    assert len(result.xxh3_128) == 32  # as `xxhsum -H2` prints it
    assert result.sha256 is None and result.digest == {"xxh3_128": result.xxh3_128}
    assert ck.file_digest(tmp_path / "c.psk.d", "sha256") == hashlib.sha256(content).hexdigest()
    assert ck.verify_file(tmp_path / "c.psk.d", xxh3_128=result.xxh3_128.upper()) == "xxh3_128"
    assert ck.verify_file(tmp_path / "c.psk.d", hashlib.sha256(content).hexdigest()) == "sha256"
    with pytest.raises(PskdError) as e:
        ck.verify_file(tmp_path / "c.psk.d", xxh3_128="0" * 32)
    assert e.value.code == "E9013" and "c.psk.d" in e.value.message and "xxh3_128" in e.value.message
    with pytest.raises(PskdError, match="E9012"):
        ck.verify_file(tmp_path / "c.psk.d")
    with pytest.raises(PskdError, match="E9012.*md5"):
        ck.save(tmp_path / "d.psk.d", tree, digest="md5")
    with pytest.raises(PskdError, match="E9003"):
        ck.file_digest(tmp_path / "missing.psk.d")


def test_both_digests_are_checked_when_both_are_given(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (16, 8))}
    xxh = ck.save(tmp_path / "c.psk.d", tree, digest="xxh3_128").xxh3_128
    sha = ck.file_sha256(tmp_path / "c.psk.d")
    back = ck.restore(tmp_path / "c.psk.d", tree, xxh3_128=xxh, sha256=sha)
    np.testing.assert_array_equal(bits(back["w"]), bits(tree["w"]))
    with pytest.raises(PskdError, match="E9013.*sha256"):
        ck.restore(tmp_path / "c.psk.d", tree, xxh3_128=xxh, sha256="0" * 64)
    with pytest.raises(PskdError, match="E9013.*xxh3_128"):
        ck.restore(tmp_path / "c.psk.d", tree, xxh3_128="0" * 32, sha256=sha)


@pytest.mark.parametrize("threaded", [False, True])
def test_a_flipped_byte_anywhere_fails_a_verified_restore(tmp_path, monkeypatch, rng, threaded):
    if threaded:  # pieces read on two threads, smaller than a leaf and not aligned to one
        monkeypatch.setattr(restoring, "PARALLEL_READ_BYTES", 1)
        monkeypatch.setattr(restoring, "HASH_PIECE", 40)
    tree = {"a": random_finite(rng, BF16, (7, 9)), "b": random_finite(rng, np.float32, (5,)),
            "c": np.arange(6, dtype=np.int32), "d": random_finite(rng, np.float64, (3, 2))}
    path = tmp_path / "c.psk.d"
    digest = ck.save(path, tree, digest="xxh3_128").xxh3_128
    back = ck.restore(path, tree, xxh3_128=digest)
    for key in tree:
        np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))
    good = path.read_bytes()
    with Reader(path, layout=ck.read_layout(ck.layout_path_for(path))) as reader:
        data_offset = reader.header.data_offset
        assert len(good) == data_offset + reader.placement.sample_bytes  # every byte is header or data
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(PskdError) as e:
            ck.restore(path, tree, xxh3_128=digest)
        if position >= data_offset:  # a data byte: the digest catches it, naming the file
            assert e.value.code == "E9013" and str(path) in e.value.message, (position, e.value)
    path.write_bytes(good + b"\0")  # a byte more at the end
    with pytest.raises(PskdError):
        ck.restore(path, tree, xxh3_128=digest)


def test_pieces_cover_the_leaves_in_order():
    assert restoring._pieces({0: 10, 1: 0, 2: 25}, None) == [(0, 0, 10), (1, 0, 0), (2, 0, 25)]
    assert restoring._pieces({0: 10, 1: 0, 2: 25}, 10) == [(0, 0, 10), (1, 0, 0), (2, 0, 10), (2, 10, 20), (2, 20, 25)]


def test_large_restore_reads_on_threads_and_hashes_in_order(tmp_path, monkeypatch, rng):
    monkeypatch.setattr(restoring, "PARALLEL_READ_BYTES", 1)
    monkeypatch.setattr(restoring, "HASH_PIECE", 1000)
    tree = {f"l{i}": random_finite(rng, np.float32, (50, 7 + i)) for i in range(6)}
    result = ck.save(tmp_path / "c.psk.d", tree, digest="xxh3_128")
    sha = ck.file_sha256(tmp_path / "c.psk.d")
    for digests in ({"xxh3_128": result.xxh3_128}, {"sha256": sha}, {"xxh3_128": result.xxh3_128, "sha256": sha}, {}):
        back = ck.restore(tmp_path / "c.psk.d", tree, **digests)
        for key in tree:
            np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))


def test_a_failed_verified_restore_leaves_no_thread_behind(tmp_path, rng):
    import threading

    tree = {"w": random_finite(rng, np.float32, (100,))}
    digest = ck.save(tmp_path / "c.psk.d", tree, digest="xxh3_128").xxh3_128
    data = (tmp_path / "c.psk.d").read_bytes()
    (tmp_path / "c.psk.d").write_bytes(data[:-1])
    with pytest.raises(PskdError, match="E9003"):
        ck.restore(tmp_path / "c.psk.d", tree, xxh3_128=digest)
    assert not [t for t in threading.enumerate() if t.name.startswith("pskd-")]


def test_non_contiguous_and_big_endian_leaves(tmp_path, rng):
    w = random_finite(rng, np.float32, (6, 5))
    tree = {"t": w.T, "be": w.astype(">f4"), "step": np.array([1, 2], ">i4")}
    result = ck.save(tmp_path / "c.psk.d", tree)
    assert [e.label for e in result.encodings] == ["f32", "f32", "f64"]
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    np.testing.assert_array_equal(bits(back["t"]), bits(np.ascontiguousarray(w.T)))
    np.testing.assert_array_equal(bits(back["be"]), bits(w))
    np.testing.assert_array_equal(back["step"], [1, 2])


def test_restore_refuses_a_file_that_is_not_one_sample(tmp_path):
    from pskd_jax.format.writer import write

    write(tmp_path / "d.psk.d", "ℝ[2]", np.ones((3, 2)))
    with pytest.raises(PskdError, match="one sample"):
        ck.restore(tmp_path / "d.psk.d", as_numpy=True)


def test_truncated_checkpoint_is_e9003(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(100, np.float32)})
    data = (tmp_path / "c.psk.d").read_bytes()
    (tmp_path / "c.psk.d").write_bytes(data[:-1])
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9003"
