"""checkpoint.save (pskd_jax.checkpoint.saving): exact in every encoding, declaration order, values
refused naming their key path, and a refused or failed save that changes nothing."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import fractions
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions, encode
from pskd_jax.errors import PskdError
from pskd_jax.format.reader import Reader

from .helpers import BF16, all_files, bits, random_finite

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
    ck.save(tmp_path / "g.psk.d", {"w": np.array([1.0, -2.0], np.float32), "n": np.uint8(7)}, SaveOptions(name="G"))
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
        ck.save(tmp_path / "c.psk.d", tree, SaveOptions(encodings="bf16"))
    assert e.value.code == "E9004"
    assert "['w'] at index [0, 1]" in e.value.message and "round_to_encoding" in e.value.message
    assert not (tmp_path / "c.psk.d").exists()
    result = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(encodings={"['w']": "bf16"}, round_to_encoding=True))
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
        ck.save(tmp_path / "c.psk.d", {"blocks": [{"w": np.zeros(2, dtype)}, {"w": w}]}, SaveOptions(finite_only=True))
    assert e.value.code == "E9004"
    assert "['blocks'][1]['w'] at index [2, 1]" in e.value.message


def test_nan_deep_in_a_large_leaf_names_its_index(tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "CHUNK_BYTES", 64)  # many chunks: the index must be the leaf's own
    w = np.ones((10, 30), np.float32)
    w[7, 29] = np.nan
    with pytest.raises(PskdError, match=r"\['w'\] at index \[7, 29\]"):
        ck.save(tmp_path / "c.psk.d", {"w": w}, SaveOptions(finite_only=True))
    big = np.ones((10, 30))
    big[8, 3] = 0.1
    with pytest.raises(PskdError, match=r"\['w'\] at index \[8, 3\]"):
        ck.save(tmp_path / "c.psk.d", {"w": big}, SaveOptions(encodings="f32"))
    result = ck.save(tmp_path / "c.psk.d", {"w": big}, SaveOptions(encodings="f32", round_to_encoding=True))
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
    assert result.encodings and all(e.label == "f64" for e in result.encodings)  # (the header's byte 0)
    assert result.labels == ("idx", "idx", "idx", "idx")  # what a summary names them: never f64


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
    with Reader(tmp_path / "c.psk.d", layout=ck.read_layout_file(tmp_path / "c.layout.json").layout) as r:
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
    ck.save(tmp_path / "c.psk.d", tree, SaveOptions(encodings={"['w']": "bf16"}, round_to_encoding=True))
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


def test_jax_arrays_save_to_the_same_bytes_as_numpy(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (16, 8)), "b": random_finite(rng, np.float32, (8,))}
    ck.save(tmp_path / "n.psk.d", tree)
    ck.save(tmp_path / "j.psk.d", {k: jnp.asarray(v) for k, v in tree.items()})  # tree_map would sort
    assert (tmp_path / "n.psk.d").read_bytes() == (tmp_path / "j.psk.d").read_bytes()


def test_a_failed_save_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path):
    good = {"w": np.ones(3, np.float32), "v": np.ones(2, np.float32)}
    ck.save(tmp_path / "c.psk.d", good)
    before = (tmp_path / "c.psk.d").read_bytes()
    bad = {"w": np.full(3, 2.0, np.float32), "v": np.array([1.0, np.nan], np.float32)}
    with pytest.raises(PskdError):
        ck.save(tmp_path / "c.psk.d", bad, SaveOptions(finite_only=True))
    assert (tmp_path / "c.psk.d").read_bytes() == before
    assert all_files(tmp_path) == ["c.layout.json", "c.psk.d"]


def test_a_refused_save_writes_no_file_not_even_the_layout(tmp_path):
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "new.psk.d", {"w": np.array([1.0, np.nan], np.float32)}, SaveOptions(finite_only=True))
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


def test_non_contiguous_and_big_endian_leaves(tmp_path, rng):
    w = random_finite(rng, np.float32, (6, 5))
    tree = {"t": w.T, "be": w.astype(">f4"), "step": np.array([1, 2], ">i4")}
    result = ck.save(tmp_path / "c.psk.d", tree)
    assert [e.label for e in result.encodings] == ["f32", "f32", "f64"]
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    np.testing.assert_array_equal(bits(back["t"]), bits(np.ascontiguousarray(w.T)))
    np.testing.assert_array_equal(bits(back["be"]), bits(w))
    np.testing.assert_array_equal(back["step"], [1, 2])


@pytest.mark.parametrize("durable", [False, True])
def test_preallocation_and_early_writeback_change_no_byte(tmp_path, rng, monkeypatch, durable):
    """A save large enough to be preallocated (and, durable, written back chunk by chunk) gives
    the bytes of one made without either system call, and a file exactly its plan's size."""
    from pskd_jax.checkpoint import saving

    tree = {"a": rng.standard_normal((700, 1024)).astype(np.float32),
            "b": rng.standard_normal((3, 5)), "c": np.arange(600_000, dtype=np.int64)}
    options = SaveOptions(durable=durable, digest="xxh3_128")
    fast = ck.save(tmp_path / "fast.psk.d", tree, options)
    monkeypatch.setattr(saving, "_SYSTEM_CALLS", [None, None, None])
    plain = ck.save(tmp_path / "plain.psk.d", tree, options)
    assert (tmp_path / "fast.psk.d").read_bytes() == (tmp_path / "plain.psk.d").read_bytes()
    assert fast.digests == plain.digests
    assert (tmp_path / "fast.psk.d").stat().st_size == fast.bytes
    back = ck.restore(tmp_path / "fast.psk.d", as_numpy=True)
    assert all(np.array_equal(back[k], tree[k]) for k in tree)
