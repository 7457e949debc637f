"""Pytrees in declaration order; params files written and read back through a template."""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest

from pskd_jax.errors import PskdError
from pskd_jax.format.layout import Leaf
from pskd_jax.format.reader import Reader
from pskd_jax.format.tree import flatten, layout_of_template, leaf_of_spec, template_dtypes
from pskd_jax.format.writer import write, write_encoded
from tests.helpers import ENV, run_python

BF16 = np.dtype(ml_dtypes.bfloat16)


class Pair(NamedTuple):
    second: float
    first: float


@dataclasses.dataclass
class Block:
    w: np.ndarray
    b: np.ndarray
    scale: float = 1.0


def paths(tree):
    return [p for p, _ in flatten(tree)[0]]


# --------------------------------------------------------------------------------------------
# Declaration order


def test_dict_keeps_insertion_order_not_sorted():
    pairs, rebuild = flatten({"b": 1, "a": 2, "c": {"z": 3, "y": 4}})
    assert pairs == [("['b']", 1), ("['a']", 2), ("['c']['z']", 3), ("['c']['y']", 4)]
    rebuilt = rebuild([10, 20, 30, 40])
    assert rebuilt == {"b": 10, "a": 20, "c": {"z": 30, "y": 40}}
    assert list(rebuilt) == ["b", "a", "c"]
    assert list(rebuilt["c"]) == ["z", "y"]


def test_non_string_keys_are_written_like_keystr():
    assert paths({1: "x", "k": "y"}) == ["[1]", "['k']"]


def test_lists_tuples_and_none():
    tree = [1, (2, None, [3]), None, 4]
    pairs, rebuild = flatten(tree)
    assert pairs == [("[0]", 1), ("[1][0]", 2), ("[1][2][0]", 3), ("[3]", 4)]
    rebuilt = rebuild(["a", "b", "c", "d"])
    assert rebuilt == ["a", ("b", None, ["c"]), None, "d"]
    assert type(rebuilt[1]) is tuple and type(rebuilt[1][2]) is list


def test_namedtuple_fields_in_declaration_order():
    pairs, rebuild = flatten({"p": Pair(second=2.0, first=1.0)})
    assert pairs == [("['p'].second", 2.0), ("['p'].first", 1.0)]
    rebuilt = rebuild([5.0, 6.0])
    assert type(rebuilt["p"]) is Pair
    assert rebuilt["p"] == Pair(5.0, 6.0)


def test_dataclass_fields_in_declaration_order():
    block = Block(w=np.zeros((2, 2)), b=np.ones(2), scale=0.5)
    pairs, rebuild = flatten([block])
    assert [p for p, _ in pairs] == ["[0].w", "[0].b", "[0].scale"]
    rebuilt = rebuild(["W", "B", "S"])
    assert type(rebuilt[0]) is Block
    assert (rebuilt[0].w, rebuilt[0].b, rebuilt[0].scale) == ("W", "B", "S")
    # The template is not touched.
    assert block.scale == 0.5 and block.w.shape == (2, 2)


def test_dict_subclasses_are_rebuilt_as_themselves():
    ordered = collections.OrderedDict([("z", 1), ("a", 2)])
    pairs, rebuild = flatten(ordered)
    assert [p for p, _ in pairs] == ["['z']", "['a']"]
    assert type(rebuild([3, 4])) is collections.OrderedDict
    counts = collections.defaultdict(list, [("z", 1), ("a", 2)])
    pairs, rebuild = flatten(counts)
    assert [p for p, _ in pairs] == ["['z']", "['a']"]
    rebuilt = rebuild([3, 4])
    assert type(rebuilt) is collections.defaultdict
    assert rebuilt == {"z": 3, "a": 4}
    assert rebuilt.default_factory is list


def test_a_bare_leaf_is_its_own_tree():
    array = np.arange(3)
    pairs, rebuild = flatten(array)
    assert len(pairs) == 1 and pairs[0][0] == "" and pairs[0][1] is array
    assert rebuild(["x"]) == "x"


def test_flatten_does_not_mutate_the_tree():
    tree = {"b": [1, 2], "a": {"x": 3}}
    _, rebuild = flatten(tree)
    rebuild([7, 8, 9])
    assert tree == {"b": [1, 2], "a": {"x": 3}}


# --------------------------------------------------------------------------------------------
# Leaves of a template


@pytest.mark.parametrize(
    "spec, shape, bound",
    [
        (np.zeros((2, 3), np.float64), (2, 3), None),
        (np.zeros(4, np.float32), (4,), None),
        (np.zeros(4, BF16), (4,), None),
        (np.zeros(4, np.float16), (4,), None),
        (np.zeros(2, bool), (2,), 2),
        (np.zeros(2, np.uint8), (2,), 2**8),
        (np.zeros(2, np.uint16), (2,), 2**16),
        (np.zeros(2, np.uint64), (2,), 2**64),
        (np.zeros((), np.int8), (), 2**7),
        (np.zeros((), np.int32), (), 2**31),
        (np.zeros((), np.int64), (), 2**63),
        (1.5, (), None),
        (3, (), 2**63),
    ],
)
def test_leaf_of_spec(spec, shape, bound):
    assert leaf_of_spec("['k']", spec) == Leaf("['k']", shape, bound)


def test_leaf_of_spec_refuses_other_dtypes():
    with pytest.raises(PskdError) as info:
        leaf_of_spec("['name']", np.array(["text"]))
    assert info.value.code == "E9005"
    assert "['name']" in info.value.message


def template():
    return {
        "embed": np.zeros((4, 3), BF16),
        "blocks": [
            Block(w=np.zeros((3, 3), np.float32), b=np.zeros(3, np.float64)),
            Block(w=np.zeros((3, 3), np.float32), b=np.zeros(3, np.float64)),
        ],
        "norm": Pair(second=np.zeros(3, np.float32), first=np.zeros((), np.float64)),
        "step": np.zeros((), np.int32),
        "mask": np.zeros(2, bool),
    }


def test_layout_of_template():
    layout = layout_of_template(template())
    assert [(leaf.path, leaf.shape, leaf.bound) for leaf in layout.leaves] == [
        ("['embed']", (4, 3), None),
        ("['blocks'][0].w", (3, 3), None),
        ("['blocks'][0].b", (3,), None),
        ("['blocks'][0].scale", (), None),
        ("['blocks'][1].w", (3, 3), None),
        ("['blocks'][1].b", (3,), None),
        ("['blocks'][1].scale", (), None),
        ("['norm'].second", (3,), None),
        ("['norm'].first", (), None),
        ("['step']", (), 2**31),
        ("['mask']", (2,), 2),
    ]
    assert template_dtypes(template()) == [BF16, np.float32, np.float64, np.float64, np.float32,
                                           np.float64, np.float64, np.float32, np.float64,
                                           np.int32, np.bool_]


# --------------------------------------------------------------------------------------------
# params files through a template


def random_params(rng):
    tree = template()

    def fill(x):
        if x.dtype == bool:
            return rng.integers(0, 2, x.shape).astype(bool)
        if x.dtype == np.int32:
            return np.array(rng.integers(0, 2**31, x.shape), np.int32)
        return rng.standard_normal(x.shape).astype(x.dtype)

    pairs, rebuild = flatten(tree)
    return rebuild([fill(np.asarray(v)) for _, v in pairs])


def batched(tree):
    pairs, rebuild = flatten(tree)
    return rebuild([np.asarray(v)[None] for _, v in pairs])


def bits(array):
    array = np.asarray(array)
    if array.dtype.kind == "f" or array.dtype == BF16:
        return array.view(f"<u{array.dtype.itemsize}").tolist()
    return array.tolist()


def test_params_round_trip_through_a_template(tmp_path):
    path = tmp_path / "ckpt.psk.d"
    params = random_params(np.random.default_rng(0))
    result = write(path, "params MiniGPT", batched(params), layout=template())
    assert result.version == 2
    assert [e.label for e in result.encodings] == [
        "bf16", "f32", "f64", "f64", "f32", "f64", "f64", "f32", "f64", "f64", "f64"]
    with Reader(path, layout=template()) as reader:
        assert reader.header.type_text == "params MiniGPT"
        assert len(reader) == 1
        restored = reader[0]
    assert list(restored) == ["embed", "blocks", "norm", "step", "mask"]
    assert type(restored["blocks"][0]) is Block and type(restored["norm"]) is Pair
    expected_pairs, _ = flatten(params)
    restored_pairs, _ = flatten(restored)
    assert [p for p, _ in restored_pairs] == [p for p, _ in expected_pairs]
    dtypes = [np.asarray(v).dtype for _, v in restored_pairs]
    assert dtypes == [BF16, np.float32, np.float64, np.float64, np.float32, np.float64,
                      np.float64, np.float32, np.float64, np.dtype(np.uint32), np.dtype(np.uint8)]
    for (p, want), (_, got) in zip(expected_pairs, restored_pairs):
        want = np.asarray(want)
        if want.dtype.kind in "iub":
            assert np.asarray(got).tolist() == want.astype(np.int64).tolist(), p
        else:
            assert bits(got) == bits(np.asarray(want, dtype=np.asarray(got).dtype)), p


def test_params_file_is_declaration_order_on_disk(tmp_path):
    # Two f64 scalars declared b then a: the bytes hold b first, whatever the key order says.
    path = tmp_path / "ba.psk.d"
    write(path, "params P", {"b": np.array([2.0]), "a": np.array([1.0])},
          layout={"b": np.zeros(()), "a": np.zeros(())})
    data = path.read_bytes()
    assert data[-16:] == bytes.fromhex("0000000000000040" "000000000000f03f")
    with Reader(path, layout={"b": np.zeros(()), "a": np.zeros(())}) as reader:
        assert reader[0] == {"b": 2.0, "a": 1.0}
    # A template in the other order reads the other way: the order is the template's, not sorted.
    with Reader(path, layout={"a": np.zeros(()), "b": np.zeros(())}) as reader:
        assert reader[0] == {"a": 2.0, "b": 1.0}


def test_params_file_needs_its_layout(tmp_path):
    path = tmp_path / "ckpt.psk.d"
    write(path, "params MiniGPT", batched(random_params(np.random.default_rng(1))), layout=template())
    with Reader(path) as reader:
        assert reader.header.is_params
        assert reader.header.count == 1
        with pytest.raises(PskdError) as info:
            reader[0]
        assert info.value.code == "E9001"
        assert str(path) in info.value.message and "layout" in info.value.message
        reader.with_layout(template())
        assert reader[0]["step"].dtype == np.uint32


def test_tree_that_differs_from_the_template_is_refused_naming_the_key_path(tmp_path):
    path = tmp_path / "ckpt.psk.d"
    params = batched(random_params(np.random.default_rng(2)))
    params["blocks"][1].w = np.zeros((1, 3, 2), np.float32)
    with pytest.raises(PskdError) as info:
        write(path, "params MiniGPT", params, layout=template())
    assert info.value.code == "E9005"
    assert "['blocks'][1].w" in info.value.message
    assert "(3, 3)" in info.value.message and "(3, 2)" in info.value.message
    assert str(path) in info.value.message

    params = batched(random_params(np.random.default_rng(2)))
    del params["mask"]
    with pytest.raises(PskdError) as info:
        write(path, "params MiniGPT", params, layout=template())
    assert info.value.code == "E9005"
    assert "['mask']" in info.value.message
    assert str(path) in info.value.message
    assert not path.exists()


def test_template_with_another_leaf_count_is_refused_on_read(tmp_path):
    path = tmp_path / "ckpt.psk.d"
    write(path, "params MiniGPT", batched(random_params(np.random.default_rng(3))), layout=template())
    smaller = template()
    del smaller["mask"]
    with pytest.raises(PskdError) as info:
        Reader(path, layout=smaller)
    assert info.value.code == "E9005"
    assert "11 leaves" in info.value.message and "10" in info.value.message
    assert str(path) in info.value.message


def test_template_asking_for_more_bytes_than_the_file_holds(tmp_path):
    path = tmp_path / "v1.psk.d"
    write(path, "params P", {"w": np.zeros((1, 2))}, layout={"w": np.zeros(2)})
    with pytest.raises(PskdError) as info:
        Reader(path, layout={"w": np.zeros(3)})
    assert info.value.code == "E9003"
    assert str(path) in info.value.message


def test_jax_shape_dtype_structs_and_custom_nodes(tmp_path):
    import jax
    import jax.numpy as jnp

    @jax.tree_util.register_pytree_with_keys_class
    class Scaled:
        def __init__(self, value, scale):
            self.value, self.scale = value, scale

        def tree_flatten_with_keys(self):
            key = jax.tree_util.GetAttrKey
            return [(key("value"), self.value), (key("scale"), self.scale)], "meta"

        @classmethod
        def tree_unflatten(cls, aux, children):
            assert aux == "meta"
            return cls(*children)

    tree = {"z": Scaled({"q": jax.ShapeDtypeStruct((2,), jnp.float32),
                         "p": jax.ShapeDtypeStruct((), jnp.bfloat16)},
                        jax.ShapeDtypeStruct((3,), jnp.float32)),
            "a": jax.ShapeDtypeStruct((2, 2), jnp.float32)}
    layout = layout_of_template(tree)
    assert [(leaf.path, leaf.shape) for leaf in layout.leaves] == [
        ("['z'].value['q']", (2,)), ("['z'].value['p']", ()), ("['z'].scale", (3,)), ("['a']", (2, 2))]
    # jax itself would sort the dict keys: the file keeps declaration order.
    assert next(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]) == "['a']"

    values = {"z": Scaled({"q": np.array([[1.5, -2.0]], np.float32),
                           "p": np.array([3.0], ml_dtypes.bfloat16)},
                          np.array([[0.25, 0.5, 0.75]], np.float32)),
              "a": np.arange(4, dtype=np.float32).reshape(1, 2, 2)}
    path = tmp_path / "custom.psk.d"
    write(path, "params Custom", values, layout=tree)
    with Reader(path, layout=tree) as reader:
        restored = reader[0]
    assert isinstance(restored["z"], Scaled)
    assert restored["z"].value["q"].tolist() == [1.5, -2.0]
    assert restored["z"].value["p"].dtype == BF16 and float(restored["z"].value["p"]) == 3.0
    assert restored["z"].scale.tolist() == [0.25, 0.5, 0.75]
    assert restored["a"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    # A jax array is a leaf, and a dict inside JAX's world is still in declaration order.
    assert paths({"y": jnp.zeros(2), "x": [jnp.ones(())]}) == ["['y']", "['x'][0]"]


def test_write_encoded_params_with_explicit_encodings(tmp_path):
    path = tmp_path / "p.psk.d"
    layout = {"w": np.zeros(2), "i": np.zeros((), np.uint16)}
    result = write_encoded(path, "params P", {"w": np.array([[1.0, 0.5]]), "i": np.array([65535], np.uint16)},
                           ["bf16", "f64"], layout=layout)
    assert result.version == 2
    with Reader(path, layout=layout) as reader:
        sample = reader[0]
    assert sample["w"].dtype == BF16 and sample["w"].astype(np.float64).tolist() == [1.0, 0.5]
    assert sample["i"].dtype == np.uint16 and int(sample["i"]) == 65535


@pytest.mark.subprocess
def test_data_modules_do_not_import_jax():
    code = (
        "import sys\n"
        "import pskd_jax.format, pskd_jax.data, pskd_jax.pipeline, pskd_jax.corpus, pskd_jax.checkpoint\n"
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))\n"
        "print('ok')\n"
    )
    completed = run_python(code, env=dict(ENV, PYTHONDONTWRITEBYTECODE="1"), timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_a_cyclic_or_very_deep_tree_is_refused_not_a_recursion_error():
    from pskd_jax.format.tree import MAX_TREE_DEPTH, flatten

    cyclic: list = [np.ones(2)]
    cyclic.append(cyclic)
    deep: object = np.ones(2)
    for _ in range(5000):
        deep = {"k": deep}
    for tree in (cyclic, deep):
        with pytest.raises(PskdError) as e:
            flatten(tree)
        assert e.value.code == "E9005" and f"deeper than {MAX_TREE_DEPTH}" in e.value.message
    fits: object = np.ones(2)
    for _ in range(MAX_TREE_DEPTH):
        fits = [fits]
    assert len(flatten(fits)[0]) == 1
