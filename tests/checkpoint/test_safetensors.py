"""safetensors ↔ .psk.d, bit for bit, with the library (an optional extra)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.checkpoint import safetensors as convert
from pskd_jax.errors import PskdError

safetensors_numpy = pytest.importorskip("safetensors.numpy")

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(array):
    array = np.ascontiguousarray(array).reshape(-1)
    return array.view(f"u{array.dtype.itemsize}")


def random_bits(rng, dtype, shape):
    dtype = np.dtype(dtype)
    values = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=f"u{dtype.itemsize}").view(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        values[~np.isfinite(values.astype(np.float64))] = dtype.type(-0.0)
    return values


@pytest.fixture
def tensors():
    rng = np.random.default_rng(3)
    return {
        "embed.weight": random_bits(rng, BF16, (16, 8)),
        "layers.0.attn.w": random_bits(rng, np.float32, (8, 8)),
        "layers.0.mlp.b": random_bits(rng, np.float64, (8,)),
        "layers.1.attn.w": random_bits(rng, np.float32, (8, 8)),
        "layers.1.mlp.b": random_bits(rng, np.float64, (8,)),
        "layers.10.attn.w": random_bits(rng, np.float32, (8, 8)),
        "head": random_bits(rng, BF16, (8,)),
        "step": np.array(12, np.int64),
    }


def test_name_keys_and_back():
    assert convert.name_keys("a.b.0.c") == ["a", "b", 0, "c"]
    assert convert.keys_name(["a", "b", 0, "c"], "") == "a.b.0.c"
    with pytest.raises(PskdError, match="cannot be part of a safetensors name"):
        convert.keys_name(["a.b"], "['a.b']")


def test_safetensors_to_pskd_is_bit_for_bit_and_back(tmp_path, tensors):
    source = tmp_path / "m.safetensors"
    safetensors_numpy.save_file(tensors, str(source))
    result = convert.safetensors_to_pskd(source, tmp_path / "m.psk.d")
    assert result.type_text == "params Params"
    tree = ck.restore(tmp_path / "m.psk.d", as_numpy=True)  # the layout file beside it
    assert isinstance(tree["layers"], dict)  # indices 0, 1, 10: not a list 0..n-1
    tree_list = ck.restore(tmp_path / "m.psk.d", zero_copy=True)
    np.testing.assert_array_equal(bits(tree_list["embed"]["weight"]), bits(tensors["embed.weight"]))
    np.testing.assert_array_equal(bits(tree["layers"][10]["attn"]["w"]), bits(tensors["layers.10.attn.w"]))
    # and back: the same tensors, the same dtypes, the same bits
    convert.pskd_to_safetensors(tmp_path / "m.psk.d", tmp_path / "back.safetensors")
    back = safetensors_numpy.load_file(str(tmp_path / "back.safetensors"))
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(bits(back[name]), bits(value))


def test_names_give_nested_dicts_and_lists_in_file_order(tmp_path):
    tensors = {"b.0": np.ones(1, np.float32), "b.1": np.full(1, 2, np.float32), "a.x": np.zeros(1, np.float32)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "s.safetensors"))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "s.safetensors"), framework="np") as f:
        file_order = list(f.offset_keys())
    convert.safetensors_to_pskd(tmp_path / "s.safetensors", tmp_path / "s.psk.d")
    tree = ck.restore(tmp_path / "s.psk.d", as_numpy=True)
    assert isinstance(tree["b"], list) and [float(v[0]) for v in tree["b"]] == [1.0, 2.0]
    firsts = list(dict.fromkeys(name.split(".")[0] for name in file_order))
    assert list(tree) == firsts


def test_pskd_to_safetensors_to_pskd_gives_the_same_bytes(tmp_path):
    rng = np.random.default_rng(5)
    tree = {"z": random_bits(rng, np.float32, (3, 4)), "a": [random_bits(rng, BF16, (5,)),
            random_bits(rng, np.float64, (2,))], "half": np.array([0.5, -2.0], np.float16),
            "mask": np.array([True, False, True])}
    ck.save(tmp_path / "orig.psk.d", tree, SaveOptions(name="Net"))
    convert.pskd_to_safetensors(tmp_path / "orig.psk.d", tmp_path / "x.safetensors")
    loaded = safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))
    assert loaded["half"].dtype == np.float16 and loaded["mask"].dtype == np.bool_
    convert.safetensors_to_pskd(tmp_path / "x.safetensors", tmp_path / "again.psk.d")
    assert (tmp_path / "again.psk.d").read_bytes() == (tmp_path / "orig.psk.d").read_bytes()


def test_params_without_a_layout_cannot_be_converted(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(2, np.float32)}, SaveOptions(layout_file=False))
    with pytest.raises(PskdError) as e:
        convert.pskd_to_safetensors(tmp_path / "c.psk.d", tmp_path / "c.safetensors")
    assert e.value.code == "E9001"
    assert not (tmp_path / "c.safetensors").exists()


def test_nan_in_a_safetensors_file_is_kept_bit_for_bit(tmp_path):
    values = np.array([1.0, np.nan, -np.inf], np.float32)
    values.view(np.uint32)[1] = 0x7F800123  # a signalling NaN with a payload
    safetensors_numpy.save_file({"a.w": values}, str(tmp_path / "n.safetensors"))
    convert.safetensors_to_pskd(tmp_path / "n.safetensors", tmp_path / "n.psk.d")
    back = ck.restore(tmp_path / "n.psk.d", as_numpy=True)["a"]["w"]
    np.testing.assert_array_equal(bits(back), bits(values))


def test_wrong_extensions_are_bad_usage(tmp_path):
    with pytest.raises(PskdError) as e:
        convert.convert(tmp_path / "a.bin", tmp_path / "b.psk.d")
    assert e.value.code == "E9012"


def write_safetensors(path, header: dict, data: bytes) -> None:
    import json

    write_header_text(path, json.dumps(header), data)


def write_header_text(path, text: str, data: bytes) -> None:
    """A safetensors file of the header ``text`` as it is (a name given twice, which a dict cannot hold)."""
    import struct

    raw = text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("recorded", ['[1, "a"]', '[["a"], "b"]', '{"a": 1}', '["a", "a"]', "not json"])
def test_a_recorded_order_that_is_not_the_names_is_ignored(tmp_path, recorded):
    header = {"__metadata__": {"pskd.order": recorded},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
    write_safetensors(tmp_path / "o.safetensors", header, np.array([1, 2, 3], np.float32).tobytes())
    convert.safetensors_to_pskd(tmp_path / "o.safetensors", tmp_path / "o.psk.d")
    back = ck.restore(tmp_path / "o.psk.d", as_numpy=True)
    assert back["a"].tolist() == [3.0] and back["b"].tolist() == [1.0, 2.0]


def test_a_name_deeper_than_a_tree_nests_is_e9005_naming_the_tensor(tmp_path):
    for depth in (3000, 65):
        name = ".".join(["a"] * depth)
        write_safetensors(tmp_path / "d.safetensors", {name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                          bytes(8))
        with pytest.raises(PskdError) as e:
            convert.safetensors_to_pskd(tmp_path / "d.safetensors", tmp_path / "d.psk.d")
        assert e.value.code == "E9005" and f"a name of {depth} keys" in e.value.message
        assert "d.safetensors: tensor 'a.a.a" in e.value.message
    name = ".".join(["a"] * 64)
    write_safetensors(tmp_path / "d.safetensors", {name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                      bytes(8))
    convert.safetensors_to_pskd(tmp_path / "d.safetensors", tmp_path / "d.psk.d")
    convert.pskd_to_safetensors(tmp_path / "d.psk.d", tmp_path / "back.safetensors")
    assert list(safetensors_numpy.load_file(str(tmp_path / "back.safetensors"))) == [name]


@pytest.mark.parametrize("dtype, values", [("BOOL", np.array([1, 2], np.uint8)),
                                           ("BOOL", np.array([0, 255], np.uint8))])
def test_a_refused_import_writes_no_file(tmp_path, dtype, values):
    write_safetensors(tmp_path / "in.safetensors",
                      {"a": {"dtype": dtype, "shape": [2], "data_offsets": [0, values.nbytes]}}, values.tobytes())
    (tmp_path / "out").mkdir()
    with pytest.raises(PskdError) as e:
        convert.convert(tmp_path / "in.safetensors", tmp_path / "out" / "o.psk.d")
    assert e.value.code == "E9004"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_an_export_keeps_its_temporary_file_locked_until_it_is_in_place(tmp_path, monkeypatch):
    """Another writer of the same destination removes the temporary files nobody holds (a killed
    writer's): the export's own must be held from its creation to its rename."""
    import contextlib

    import safetensors.numpy

    from pskd_jax._os.atomic import remove_stale_temporaries

    ck.save(tmp_path / "c.psk.d", {"w": np.arange(6, dtype=np.float32)})
    destination = str(tmp_path / "c.safetensors")
    removed = []
    real_save_file, real_atomic_output = safetensors.numpy.save_file, getattr(convert, "atomic_output", None)

    def save_file_then_cleanup(tensors, filename, metadata=None):  # (what the export used before)
        real_save_file(tensors, filename, metadata=metadata)
        removed.extend(remove_stale_temporaries(destination))

    @contextlib.contextmanager
    def atomic_output_then_cleanup(path, **options):
        with real_atomic_output(path, **options) as f:
            yield f
            removed.extend(remove_stale_temporaries(destination))

    monkeypatch.setattr(safetensors.numpy, "save_file", save_file_then_cleanup)
    monkeypatch.setattr(convert, "atomic_output", atomic_output_then_cleanup, raising=False)
    assert convert.pskd_to_safetensors(tmp_path / "c.psk.d", destination) == 1
    assert removed == []
    assert safetensors_numpy.load_file(destination)["w"].tolist() == list(range(6))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.layout.json", "c.psk.d", "c.safetensors"]



def f32(length: int, start: int, end: int) -> str:
    """A header entry of an F32 tensor, as JSON text."""
    return f'{{"dtype": "F32", "shape": [{length}], "data_offsets": [{start}, {end}]}}'


@pytest.mark.parametrize("text, twice", [
    # the library keeps one entry of the name (here the last, which covers the data) and reads the file
    (f'{{"a": {f32(1, 0, 4)}, "a": {f32(2, 0, 8)}}}', "'a'"),
    (f'{{"a": {f32(2, 0, 8)}, "b": {f32(1, 4, 8)}, "a": {f32(1, 0, 4)}}}', "'a'"),
    (f'{{"__metadata__": {{"format": "pt", "format": "np"}}, "a": {f32(2, 0, 8)}}}', "'format'"),
])
def test_a_name_given_twice_in_the_header_is_e9002_naming_the_file_and_the_name(tmp_path, text, twice):
    write_header_text(tmp_path / "twice.safetensors", text, np.array([1, 2], np.float32).tobytes())
    (tmp_path / "out").mkdir()
    with pytest.raises(PskdError) as e:
        convert.convert(tmp_path / "twice.safetensors", tmp_path / "out" / "o.psk.d")
    assert e.value.code == "E9002"
    assert str(tmp_path / "twice.safetensors") in e.value.message and f"{twice} appears twice" in e.value.message
    assert list((tmp_path / "out").iterdir()) == []


def test_recorded_keys_that_give_a_name_twice_are_ignored(tmp_path):
    # (the last of the two would make the key the string '0'; which one was meant is unknown)
    metadata = '{"pskd.keys": "{\\"0\\": [0], \\"0\\": [\\"0\\"]}"}'
    write_header_text(tmp_path / "k.safetensors", f'{{"__metadata__": {metadata}, "0": {f32(1, 0, 4)}}}',
                      np.array([5], np.float32).tobytes())
    convert.safetensors_to_pskd(tmp_path / "k.safetensors", tmp_path / "k.psk.d")
    back = ck.restore(tmp_path / "k.psk.d", as_numpy=True)
    assert isinstance(back, list) and back[0].tolist() == [5.0]  # the name's own part: the index 0


@pytest.mark.parametrize("tree", [{"__metadata__": np.ones(2, np.float32)},
                                  {"w": np.ones(1, np.float32), "__metadata__": np.zeros(1, np.int32)}])
def test_a_leaf_named_like_the_metadata_is_refused_before_anything_is_written(tmp_path, tree):
    ck.save(tmp_path / "c.psk.d", tree)
    with pytest.raises(PskdError) as e:
        convert.convert(tmp_path / "c.psk.d", tmp_path / "c.safetensors")
    assert e.value.code == "E9005"
    assert str(tmp_path / "c.psk.d") in e.value.message and "leaf ['__metadata__']" in e.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.layout.json", "c.psk.d"]
    with pytest.raises(PskdError, match="reserves"):
        convert.keys_name(["__metadata__"], "['__metadata__']")
    assert convert.keys_name(["__metadata__", "w"], "") == "__metadata__.w"  # (a name of its own)


@pytest.mark.parametrize("recorded, type_text", [
    ("params Net", "params Net"),
    ("params 1bad name!", "params Params"), ("params ", "params Params"), ("params x y", "params Params"),
    ("params params", "params Params"), ("(f32[2],)", "params Params"),
])
def test_a_recorded_type_names_the_params_only_when_it_can(tmp_path, recorded, type_text):
    """``pskd.type`` is advisory (the tensors are the data): one that names no params type is ignored."""
    safetensors_numpy.save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "t.safetensors"),
                                metadata={"pskd.type": recorded})
    assert convert.safetensors_to_pskd(tmp_path / "t.safetensors", tmp_path / "t.psk.d").type_text == type_text
    assert ck.restore(tmp_path / "t.psk.d", as_numpy=True)["w"].tolist() == [1.0, 1.0]
    # the metadata goes back as it was, the unusable type too
    convert.pskd_to_safetensors(tmp_path / "t.psk.d", tmp_path / "back.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "back.safetensors"), framework="np") as f:
        assert f.metadata() == {"pskd.type": recorded}
    # a name the caller gives is the caller's: checked, never ignored
    with pytest.raises(PskdError) as e:
        convert.safetensors_to_pskd(tmp_path / "t.safetensors", tmp_path / "u.psk.d", SaveOptions(name="1bad"))
    assert e.value.code == "E9001"


@pytest.mark.parametrize("dtype, shape", [
    ("F32", [0, 2**62]), ("F32", [0, 2**63]), ("F32", [0] * 70), ("F32", [0] * 64), ("F32", [0, 2**40, 2**40]),
    ("F64", [0, 2**60]),  # (2^60 elements, but 2^63 bytes: more than numpy counts)
])
def test_an_empty_tensor_of_a_shape_no_leaf_has_is_e9005_naming_the_file(tmp_path, dtype, shape):
    """The library checks the bytes (none, for an empty tensor), not the other axes."""
    write_safetensors(tmp_path / "e.safetensors", {"a.w": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}},
                      b"")
    (tmp_path / "out").mkdir()
    with pytest.raises(PskdError) as e:
        convert.convert(tmp_path / "e.safetensors", tmp_path / "out" / "e.psk.d")
    assert e.value.code == "E9005"
    assert f"{tmp_path / 'e.safetensors'}: tensor 'a.w': shape [" in e.value.message
    assert list((tmp_path / "out").iterdir()) == []


def test_an_empty_tensor_of_long_axes_converts_both_ways(tmp_path):
    shape = [0, 2**40, 3]
    write_safetensors(tmp_path / "e.safetensors", {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}, b"")
    convert.convert(tmp_path / "e.safetensors", tmp_path / "e.psk.d")
    assert ck.restore(tmp_path / "e.psk.d", as_numpy=True)["w"].shape == tuple(shape)
    convert.convert(tmp_path / "e.psk.d", tmp_path / "back.safetensors")
    assert safetensors_numpy.load_file(str(tmp_path / "back.safetensors"))["w"].shape == tuple(shape)
