"""Every dtype a train state holds, saved and restored bit for bit (the checkpoint dtype table)."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.errors import PskdError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import write, write_encoded

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "checkpoint_golden")

FLOATS = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
NARROW = [getattr(ml_dtypes, n) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4",
    "float8_e4m3", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4", "int2",
    "uint2") if hasattr(ml_dtypes, n)]
COMPLEX = [np.complex64, np.complex128]


def bits(array) -> np.ndarray:
    """Raw bits to compare exactly (-0.0 differs from 0.0, each NaN payload is its own)."""
    array = np.asarray(array)
    if array.dtype.kind == "c":
        part = np.float32 if array.dtype.itemsize == 8 else np.float64
        array = np.ascontiguousarray(array).reshape(-1).view(part)
    array = np.ascontiguousarray(array).reshape(-1)
    return array.view(f"u{array.dtype.itemsize}")


def every_pattern(dtype, count: int, rng) -> np.ndarray:
    """Random bit patterns of a dtype (NaNs with payloads, infinities, subnormals, -0.0), plus the
    extremes of its integers; narrow types through their canonical low bits."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dtype in map(np.dtype, NARROW):
        width = sd.narrow_bits(dtype)
        return rng.integers(0, 2**width, count, dtype=np.uint8).view(dtype)
    if dtype.kind == "c":
        part = np.float32 if dtype.itemsize == 8 else np.float64
        return every_pattern(part, 2 * count, rng).view(dtype)
    raw = rng.integers(0, 2 ** (8 * dtype.itemsize), count, dtype=f"u{dtype.itemsize}").view(dtype).copy()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        raw[:4] = [info.min, info.max, 0, info.min + 1 if info.min else 1]
    else:
        specials = np.array([0.0, -0.0, np.inf, -np.inf], dtype=dtype)
        raw[:4] = specials
    return raw


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


# ------------------------------------------------------------------------------------------------
# A checkpoint using none of the new mappings is byte-identical to one written before them


def test_golden_checkpoints_are_byte_identical(tmp_path):
    spec = importlib.util.spec_from_file_location("make_golden", os.path.join(GOLDEN, "make_golden.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, tree in module.golden_trees().items():
        ck.save(tmp_path / f"{name}.psk.d", tree)
        with open(os.path.join(GOLDEN, f"{name}.psk.d"), "rb") as f:
            assert (tmp_path / f"{name}.psk.d").read_bytes() == f.read(), name


def test_golden_checkpoints_of_before_still_restore_with_their_old_layout_files():
    back = ck.restore(os.path.join(GOLDEN, "plain.psk.d"), as_numpy=True)  # a version 1 layout beside it
    assert back["w"].dtype == np.float32 and back["count"].dtype == np.uint32 and back["mask"].dtype == np.bool_
    assert back["mask"].tolist() == [True, False, True] and back["big"].tolist() == [0, 2**64 - 1]
    assert back["lr"].dtype == np.float64 and float(back["lr"]) == 0.001  # (version 1: a 0-d array)
    tup = ck.restore(os.path.join(GOLDEN, "bools.psk.d"), as_numpy=True)
    assert tup[0].dtype == np.bool_ and tup[0].tolist() == [[True, False]]  # the type text says bool


# ------------------------------------------------------------------------------------------------
# Every dtype, bit for bit


@pytest.mark.parametrize("dtype", FLOATS + INTS + NARROW + COMPLEX + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_for_bit(tmp_path, rng, dtype):
    values = every_pattern(dtype, 257, rng).reshape(257, 1)
    tree = {"x": values, "scalar": values[5, 0], "empty": values[:0]}
    ck.save(tmp_path / "c.psk.d", tree)
    for back in (ck.restore(tmp_path / "c.psk.d", as_numpy=True), ck.restore(tmp_path / "c.psk.d", tree),
                 ck.restore(tmp_path / "c.psk.d", zero_copy=True)):
        for key in tree:
            assert back[key].dtype == np.dtype(dtype), key
            assert back[key].shape == np.shape(tree[key]), key
            np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))


def _jax_holds(dtype) -> bool:
    try:
        jax.device_put(np.zeros(1, dtype))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: np.dtype(d).name)
def test_every_narrow_dtype_restores_into_jax_or_is_refused_by_name(tmp_path, rng, dtype):
    # (a numpy leaf may be of a dtype JAX cannot put on a device, float6 in JAX 0.10: an E9005
    # naming the key path and as_numpy=True, never a JAX runtime error)
    tree = {"x": every_pattern(dtype, 33, rng)}
    ck.save(tmp_path / "c.psk.d", tree)
    for target in (None, {"x": jax.ShapeDtypeStruct((33,), dtype)}):
        if _jax_holds(dtype):
            back = ck.restore(tmp_path / "c.psk.d", target)
            assert isinstance(back["x"], jax.Array) and back["x"].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(bits(np.asarray(back["x"])), bits(tree["x"]))
        else:
            with pytest.raises(PskdError) as e:
                ck.restore(tmp_path / "c.psk.d", target)
            assert e.value.code == "E9005" and "['x']" in e.value.message and "as_numpy=True" in e.value.message


@pytest.mark.parametrize("dtype, kind, bound", [
    (np.int8, "bits", 2**8), (np.int64, "bits", 2**64), (np.uint16, None, 2**16), (np.float16, None, None),
    (ml_dtypes.float8_e4m3fn, "bits", 2**8), (ml_dtypes.int4, "bits", 2**4), (np.complex64, "complex", None),
    (np.bool_, None, 2)])
def test_the_layout_file_records_what_restore_needs(tmp_path, dtype, kind, bound):
    ck.save(tmp_path / "c.psk.d", {"x": np.zeros(3, dtype)})
    [entry] = json.loads((tmp_path / "c.layout.json").read_text())["leaves"]
    assert entry["dtype"] == sd.dtype_name(np.dtype(dtype)) and entry.get("kind") == kind
    assert entry.get("bound") == bound
    assert entry["shape"] == ([3, 2] if kind == "complex" else [3])


def test_a_reader_without_the_layout_sees_the_stored_view(tmp_path):
    tree = {"i": np.array([-1, 5], np.int16), "c": np.array([1 + 2j], np.complex64), "h": np.array([0.5], np.float16)}
    ck.save(tmp_path / "c.psk.d", tree)
    layout = ck.read_layout_file(tmp_path / "c.layout.json").layout
    with Reader(tmp_path / "c.psk.d", layout=layout) as reader:
        i, c, h = reader.leaves()
    assert i[0].tolist() == [65535, 5] and i.dtype == np.uint16  # the two's-complement pattern
    assert c[0].tolist() == [[1.0, 2.0]] and h.dtype == np.float32


def test_nan_payloads_and_infinities_are_kept_unless_finite_only(tmp_path):
    f32 = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)
    f32.view(np.uint32)[0] = 0x7F800001  # a signalling NaN
    f64 = np.array([np.nan, -0.0]).copy()
    f64.view(np.uint64)[0] = 0xFFF0000000000ABC
    bf = np.array([np.nan, np.inf], ml_dtypes.bfloat16)
    bf.view(np.uint16)[0] = 0x7F81
    f16 = np.array([np.nan, -np.inf], np.float16)
    f16.view(np.uint16)[0] = 0x7C01
    tree = {"f32": f32, "f64": f64, "bf": bf, "f16": f16, "best": float("inf"),
            "c": np.array([complex(np.nan, -np.inf)])}
    ck.save(tmp_path / "c.psk.d", tree)
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    for key in ("f32", "f64", "bf", "f16", "c"):
        np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))
    assert back["best"] == float("inf") and type(back["best"]) is float
    for key in ("f32", "f64", "bf", "f16", "best", "c"):
        with pytest.raises(PskdError) as e:
            ck.save(tmp_path / "d.psk.d", {key: tree[key]}, SaveOptions(finite_only=True))
        assert e.value.code == "E9004" and f"['{key}']" in e.value.message
    assert not (tmp_path / "d.psk.d").exists()


def test_data_files_keep_refusing_nan(tmp_path):
    for writer in (lambda p: write(p, "ℝ[2]", np.array([[1.0, np.nan]])),
                   lambda p: write_encoded(p, "ℝ[2]", np.array([[1.0, np.inf]], np.float32), ["f32"])):
        with pytest.raises(PskdError) as e:
            writer(tmp_path / "d.psk.d")
        assert e.value.code == "E9004"


def test_float16_from_an_f32_that_is_no_float16_is_refused(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"h": np.array([0.5, 1.0], np.float16)})
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-4:] = np.float32(0.1).tobytes()  # damaged: f32 0.1 is not a float16 value
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9004" and "['h'] at index [1]" in e.value.message and "float16" in e.value.message


# ------------------------------------------------------------------------------------------------
# Python scalars, typed keys


def test_python_scalars_come_back_as_python_scalars(tmp_path):
    tree = {"i": 7, "neg": -300, "f": 0.1, "b": True, "big": 2**64 + 5, "huge": -(3**100), "zero": 0,
            "u64": 2**64 - 1, "i64": -(2**63)}
    ck.save(tmp_path / "c.psk.d", tree)
    back = ck.restore(tmp_path / "c.psk.d")
    assert back == tree and all(type(back[k]) is type(tree[k]) for k in tree)
    entries = {e["path"]: e for e in json.loads((tmp_path / "c.layout.json").read_text())["leaves"]}
    assert entries["['i']"]["bound"] == 2**8 and entries["['neg']"]["bound"] == 2**16  # the smallest fitting
    assert entries["['big']"]["shape"] == [2] and entries["['f']"]["encoding"] == "f64"
    # into a target: Python scalars for Python scalars, arrays for arrays
    again = ck.restore(tmp_path / "c.psk.d", dict(tree, i=np.int16(0), f=np.float64(0)))
    assert again["i"].dtype == np.int16 and int(again["i"]) == 7 and again["f"].dtype == np.float64
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", dict(tree, neg=np.int8(0)))
    assert e.value.code == "E9004" and "['neg']" in e.value.message and "int8" in e.value.message


def test_a_python_int_beyond_int64_is_never_a_float(tmp_path):
    value = 2**63 + 1  # float64 would make it 9223372036854775808
    ck.save(tmp_path / "c.psk.d", {"n": value})
    assert ck.restore(tmp_path / "c.psk.d")["n"] == value
    entry = json.loads((tmp_path / "c.layout.json").read_text())["leaves"][0]
    assert "encoding" not in entry and entry["kind"] == "python"
    with pytest.raises(PskdError) as e:  # in an array, beyond 64 bits is refused, naming the leaf
        ck.save(tmp_path / "d.psk.d", {"a": np.array([1, 2**70], dtype=object)})
    assert e.value.code == "E9004" and "['a']" in e.value.message


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_typed_prng_keys_round_trip_with_their_implementation(tmp_path, impl):
    keys = jax.random.split(jax.random.key(3, impl=impl), 4)
    tree = {"key": keys[0], "keys": keys, "raw": jax.random.PRNGKey(1)}
    ck.save(tmp_path / "c.psk.d", tree)
    for back in (ck.restore(tmp_path / "c.psk.d"), ck.restore(tmp_path / "c.psk.d", tree),
                 ck.restore(tmp_path / "c.psk.d", jax.eval_shape(lambda: tree))):
        assert back["key"].dtype == keys.dtype and jax.random.key_impl(back["key"]) == impl
        np.testing.assert_array_equal(jax.random.key_data(back["keys"]), jax.random.key_data(keys))
        np.testing.assert_array_equal(jax.random.uniform(back["key"], (3,)), jax.random.uniform(keys[0], (3,)))
        assert back["raw"].dtype == jnp.uint32  # an old-style raw key is a uint32 array
    data = ck.restore(tmp_path / "c.psk.d", as_numpy=True)["keys"]  # numpy: the key data
    assert data.dtype == np.uint32 and data.shape == (4,) + jax.random.key_data(keys).shape[1:]
    other = {"key": jax.random.key(0, impl="rbg" if impl != "rbg" else "threefry2x32")}
    ck.save(tmp_path / "k.psk.d", {"key": keys[0]})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "k.psk.d", other)
    assert e.value.code == "E9005" and "['key']" in e.value.message


# ------------------------------------------------------------------------------------------------
# Casts a target asks for: nothing changes a value unnoticed


def test_casts_that_would_change_a_value_are_refused(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"big": np.array([1.0, 1e300]), "n": np.array([3, 300], np.int32),
                                   "flag": np.array([0, 1, 2], np.uint8), "neg": np.array([-1], np.int64)})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"big": np.zeros(2, np.float32)}, partial=True)
    assert e.value.code == "E9004" and "['big'] at index [1]" in e.value.message and "allow_overflow" in e.value.message
    back = ck.restore(tmp_path / "c.psk.d", {"big": np.zeros(2, np.float32)}, partial=True, allow_overflow=True)
    assert back["big"].tolist() == [1.0, float("inf")]
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"n": np.zeros(2, np.int8)}, partial=True)
    assert e.value.code == "E9004" and "['n'] at index [1]" in e.value.message
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"flag": np.zeros(3, bool)}, partial=True)
    assert e.value.code == "E9004" and "['flag'] at index [2]" in e.value.message and "not a bool" in e.value.message
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"neg": np.zeros(1, np.uint64)}, partial=True)
    assert e.value.code == "E9004" and "['neg'] at index [0]" in e.value.message
    widened = ck.restore(tmp_path / "c.psk.d", {"n": np.zeros(2, np.int64), "neg": np.zeros(1, np.int32)}, partial=True)
    assert widened["n"].tolist() == [3, 300] and widened["neg"].tolist() == [-1]


def test_a_stored_bool_other_than_0_or_1_is_refused(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"mask": np.array([True, False, True])})
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-1] = 7
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    for restore in (lambda: ck.restore(tmp_path / "c.psk.d", as_numpy=True),
                    lambda: ck.restore(tmp_path / "c.psk.d", {"mask": np.zeros(3, bool)}),
                    lambda: ck.restore(tmp_path / "c.psk.d", zero_copy=True)):
        with pytest.raises(PskdError) as e:
            restore()
        assert e.value.code == "E9004" and "['mask'] at index [2]" in e.value.message


def test_x64_rules_hold_for_the_new_dtypes(tmp_path):
    assert not jax.config.jax_enable_x64
    ck.save(tmp_path / "c.psk.d", {"i": np.array([-5], np.int64), "c": np.array([1j], np.complex128),
                                   "c64": np.array([2j], np.complex64)})
    with pytest.raises(PskdError, match="x64"):
        ck.restore(tmp_path / "c.psk.d")
    back = ck.restore(tmp_path / "c.psk.d", {"i": jax.ShapeDtypeStruct((1,), jnp.int32),
                                             "c": jax.ShapeDtypeStruct((1,), jnp.complex64),
                                             "c64": jax.ShapeDtypeStruct((1,), jnp.complex64)})
    assert back["i"].tolist() == [-5] and back["c"].dtype == jnp.complex64 and complex(back["c64"][0]) == 2j


# ------------------------------------------------------------------------------------------------
# Property tests


def arrays_of(dtype):
    dtype = np.dtype(dtype)
    width = sd.narrow_bits(dtype) if dtype in map(np.dtype, NARROW) else 8 * dtype.itemsize
    if dtype.kind == "b":
        return st.lists(st.booleans(), max_size=20).map(lambda v: np.array(v, dtype=bool))
    if dtype.kind == "c":
        part = np.float32 if dtype.itemsize == 8 else np.float64
        return arrays_of(part).map(lambda a: a[: len(a) // 2 * 2].view(dtype) if len(a) >= 2 else np.zeros(0, dtype))
    patterns = st.lists(st.integers(0, 2**width - 1), max_size=20)
    container = np.uint8 if width <= 8 else f"u{dtype.itemsize}"
    return patterns.map(lambda v: np.array(v, dtype=container).view(dtype))


ALL = FLOATS + INTS + NARROW + COMPLEX + [np.bool_]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_any_patterns_of_any_dtypes_round_trip(tmp_path_factory, data):
    chosen = data.draw(st.lists(st.sampled_from(ALL), min_size=1, max_size=5))
    tree = {f"k{i}": data.draw(arrays_of(dtype)) for i, dtype in enumerate(chosen)}
    tree["py"] = data.draw(st.one_of(st.integers(-(2**200), 2**200), st.floats(allow_nan=True), st.booleans()))
    path = tmp_path_factory.mktemp("prop") / "c.psk.d"
    ck.save(path, tree)
    back = ck.restore(path, as_numpy=True)
    for key, value in tree.items():
        if key == "py":
            assert type(back[key]) is type(value)
            if isinstance(value, float):  # the same bits: -0.0 and NaN included
                assert np.float64(back[key]).view(np.uint64) == np.float64(value).view(np.uint64)
            else:
                assert back[key] == value
            continue
        assert back[key].dtype == value.dtype and back[key].shape == value.shape
        np.testing.assert_array_equal(bits(back[key]), bits(value))
