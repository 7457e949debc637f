"""safetensors ↔ .psk.d for every dtype safetensors has; metadata and names kept byte for byte."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import safetensors as convert
from pskd_jax.errors import PskdError

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
          "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "F32": np.float32, "F64": np.float64, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
          "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
          "F8_E8M0": ml_dtypes.float8_e8m0fnu, "C64": np.complex64}


def patterns(dtype, shape, rng) -> np.ndarray:
    """Every kind of bit pattern of a dtype: NaN payloads, infinities, negative ints, extremes."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    raw = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=f"u{dtype.itemsize}")
    return raw.view(dtype)


def raw_tensors(path) -> dict:
    """name → (safetensors dtype, shape, bytes): what the file holds, read by the library."""
    with open(path, "rb") as f:
        return {name: (entry["dtype"], list(entry["shape"]), bytes(entry["data"]))
                for name, entry in safetensors.deserialize(f.read())}


def metadata_of(path):
    with safetensors.safe_open(str(path), framework="np") as f:
        return f.metadata()


@pytest.mark.parametrize("label", list(DTYPES))
def test_every_safetensors_dtype_both_ways_bit_for_bit(tmp_path, label):
    rng = np.random.default_rng(7)
    tensors = {"layer.w": patterns(DTYPES[label], (5, 3), rng), "s": patterns(DTYPES[label], (), rng)}
    save_file(tensors, str(tmp_path / "in.safetensors"), metadata={"format": "pt"})
    convert.safetensors_to_pskd(tmp_path / "in.safetensors", tmp_path / "m.psk.d")
    back = ck.restore(tmp_path / "m.psk.d", as_numpy=True)
    for name, keys in (("layer.w", ("layer", "w")), ("s", ("s",))):
        value = back
        for key in keys:
            value = value[key]
        assert value.dtype == np.dtype(DTYPES[label]) and value.shape == tensors[name].shape
        assert np.asarray(value).tobytes() == tensors[name].tobytes()
    convert.pskd_to_safetensors(tmp_path / "m.psk.d", tmp_path / "out.safetensors")
    assert raw_tensors(tmp_path / "out.safetensors") == raw_tensors(tmp_path / "in.safetensors")
    assert metadata_of(tmp_path / "out.safetensors") == {"format": "pt"}
    # written by the same library: the very same bytes
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "in.safetensors").read_bytes()


def test_metadata_is_kept_as_it_was_and_none_stays_none(tmp_path):
    metadata = {"format": "pt", "note": "ünïcode ✓", "": ""}
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "in.safetensors"), metadata=metadata)
    convert.safetensors_to_pskd(tmp_path / "in.safetensors", tmp_path / "m.psk.d")
    convert.pskd_to_safetensors(tmp_path / "m.psk.d", tmp_path / "out.safetensors")
    assert metadata_of(tmp_path / "out.safetensors") == metadata
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "plain.safetensors"))
    convert.safetensors_to_pskd(tmp_path / "plain.safetensors", tmp_path / "p.psk.d")
    convert.pskd_to_safetensors(tmp_path / "p.psk.d", tmp_path / "p.safetensors")
    assert metadata_of(tmp_path / "p.safetensors") is None
    assert (tmp_path / "p.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()


@pytest.mark.parametrize("names", [
    ["layers.01.w", "layers.02.w"],
    ["a.01", "a.1"],
    ["a.", "b"],
    ["x.0", "x.1", "x.00"],
    ["", "e"],
    ["q.+1", "q.١", "q.-1"],
])
def test_names_come_back_byte_for_byte(tmp_path, names):
    save_file({n: np.full(2, i, np.float32) for i, n in enumerate(names)}, str(tmp_path / "in.safetensors"))
    convert.safetensors_to_pskd(tmp_path / "in.safetensors", tmp_path / "m.psk.d")
    convert.pskd_to_safetensors(tmp_path / "m.psk.d", tmp_path / "out.safetensors")
    assert raw_tensors(tmp_path / "out.safetensors") == raw_tensors(tmp_path / "in.safetensors")


def test_zero_padded_indices_are_string_keys(tmp_path):
    save_file({"layers.01.w": np.ones(1, np.float32), "layers.1.w": np.zeros(1, np.float32)},
              str(tmp_path / "in.safetensors"))
    convert.safetensors_to_pskd(tmp_path / "in.safetensors", tmp_path / "m.psk.d")
    tree = ck.restore(tmp_path / "m.psk.d", as_numpy=True)
    assert set(tree["layers"]) == {"01", 1}


def test_dtypes_safetensors_lacks_go_out_as_their_stored_form(tmp_path):
    tree = {"c": np.array([1 + 2j, -3j]), "q": np.array([-8, 7], ml_dtypes.int4), "key": jax.random.key(0),
            "n": 5, "f": 0.5, "b": True}
    ck.save(tmp_path / "m.psk.d", tree)
    convert.pskd_to_safetensors(tmp_path / "m.psk.d", tmp_path / "out.safetensors")
    raw = raw_tensors(tmp_path / "out.safetensors")
    assert raw["c"][:2] == ("F64", [2, 2]) and raw["q"][:2] == ("U8", [2]) and raw["q"][2] == bytes([8, 7])
    assert raw["key"][:2] == ("U32", [2]) and raw["n"][:2] == ("I64", []) and raw["b"][:2] == ("BOOL", [])
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "big.psk.d", {"n": 2**64})
        convert.pskd_to_safetensors(tmp_path / "big.psk.d", tmp_path / "big.safetensors")
    assert e.value.code == "E9004" and "['n']" in e.value.message


@pytest.mark.slow
@pytest.mark.subprocess
def test_pskd_convert_keeps_metadata_and_names(tmp_path):
    save_file({"layers.01.w": np.ones(2, ml_dtypes.float8_e4m3fn), "a.": np.array([-1], np.int8)},
              str(tmp_path / "in.safetensors"), metadata={"format": "pt"})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for source, destination in (("in.safetensors", "m.psk.d"), ("m.psk.d", "out.safetensors")):
        result = subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", "convert", str(tmp_path / source),
                                 "-o", str(tmp_path / destination)], capture_output=True, text=True, env=env,
                                timeout=120)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "in.safetensors").read_bytes()
