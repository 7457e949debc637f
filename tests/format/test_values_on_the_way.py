"""Values that change on the way (issue 20, class 5): what is saved, converted or read comes back
as it was, or is refused.

- numbers beyond f64 (``Fraction``, ``Decimal``, long double, object arrays) are E9004 at save, as
  ``pack`` refuses 1e400; an infinity is kept;
- ``restore(layout=template)`` of a file with its layout file matches by key path;
- safetensors and back keeps string keys ``'0'``, ``'1'`` strings, and Python ints up to 2^64 − 1;
- a tree of no leaves is refused on the way out to safetensors as on the way back;
- ``Reader.with_layout(find_layout_file(p))`` shows values as restore, info and export do.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.checkpoint import SaveOptions, find_layout_file, restore, save
from pskd_jax.data import export_json
from pskd_jax.errors import BadValueError, MismatchError
from pskd_jax.format.reader import Reader
from tests.helpers import pskd_fails, pskd_ok

F64_MAX = np.finfo(np.float64).max
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _beyond(sign: int, extra: int) -> list:
    big = 10 ** (309 + extra)
    return [Fraction(sign * big), Fraction(sign * big, 3), Decimal(sign) * Decimal(10) ** (309 + extra),
            np.longdouble(sign) * np.longdouble(10) ** (400 + extra)]


@_SETTINGS
@given(sign=st.sampled_from([1, -1]), extra=st.integers(0, 1000), which=st.integers(0, 3),
       as_array=st.booleans())
def test_beyond_f64_is_refused_at_save(tmp_path, sign, extra, which, as_array):
    value = _beyond(sign, extra)[which]
    if isinstance(value, np.longdouble) and not np.isfinite(value):
        return  # (a platform whose long double is f64: the value is an infinity already)
    leaf = np.array([Fraction(1, 3), value], dtype=object) if as_array else value
    with pytest.raises(BadValueError, match=r"beyond the range of f64") as caught:
        save(tmp_path / "v.psk.d", {"w": leaf})
    assert "['w']" in caught.value.message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [float("inf"), -np.inf, Decimal("Infinity"), Decimal("-Infinity"),
                                   np.longdouble("inf"), Fraction(1, 3), Decimal("0.1"), F64_MAX,
                                   Fraction(int(F64_MAX))])
def test_infinities_and_values_in_range_are_kept(tmp_path, value):
    save(tmp_path / "v.psk.d", {"w": value})
    back = float(restore(tmp_path / "v.psk.d", as_numpy=True)["w"])
    assert back == float(value) or (math.isnan(back) and math.isnan(float(value)))


def test_long_double_arrays_beyond_f64_name_the_index(tmp_path):
    # Where long double is f64 itself (no wider values to hold), an object array of Fractions
    # stands in: both reach the same check, which must name the index.
    wider = np.finfo(np.longdouble).max > F64_MAX
    wide = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.longdouble if wider else object)
    wide[1, 0] = np.longdouble(10) ** 400 if wider else Fraction(10**400)
    with pytest.raises(BadValueError, match=r"index \[1, 0\]"):
        save(tmp_path / "v.psk.d", {"w": wide})


def test_restore_with_a_layout_template_matches_by_key_path(tmp_path):
    path = tmp_path / "m.psk.d"
    save(path, {"b": np.full(2, 1.0), "a": np.full(2, 2.0)})
    back = restore(path, layout={"a": np.zeros(2), "b": np.zeros(2)}, as_numpy=True)  # (sorted: another order)
    assert back["a"][0] == 2.0 and back["b"][0] == 1.0
    with pytest.raises(MismatchError):
        restore(path, layout={"a": np.zeros(3), "b": np.zeros(1)}, as_numpy=True)
    with pytest.raises(MismatchError):
        restore(path, layout={"a": np.zeros(2), "c": np.zeros(2)}, as_numpy=True)


@_SETTINGS
@given(keys=st.lists(st.one_of(st.integers(0, 12), st.sampled_from(["0", "1", "2", "01", "10", "x", ""])),
                     min_size=1, max_size=5, unique_by=lambda k: (type(k), k)))
def test_safetensors_and_back_keeps_key_types(tmp_path, keys):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    tree = {"t": {k: np.full((1,), float(n), np.float32) for n, k in enumerate(keys)}}
    if len({str(k) for k in keys}) != len(keys):  # (1 and '1' share one name: refused)
        save(tmp_path / "a.psk.d", tree)
        with pytest.raises(MismatchError):
            convert(tmp_path / "a.psk.d", tmp_path / "a.safetensors")
        return
    save(tmp_path / "a.psk.d", tree)
    convert(tmp_path / "a.psk.d", tmp_path / "a.safetensors")
    convert(tmp_path / "a.safetensors", tmp_path / "b.psk.d")
    back = restore(tmp_path / "b.psk.d", as_numpy=True)["t"]
    if isinstance(back, list):  # (the ints 0…n−1: a list, as a safetensors name always gave)
        assert sorted(keys) == list(range(len(keys)))
        back = dict(enumerate(back))
    assert sorted(map(repr, back)) == sorted(map(repr, keys))
    for n, k in enumerate(keys):
        assert back[k][0] == n
    assert (tmp_path / "a.psk.d").read_bytes() == (tmp_path / "b.psk.d").read_bytes() or \
        not all(isinstance(k, str) for k in keys)


@pytest.mark.parametrize("value", [2**64 - 1, 2**63, -(2**63), 0])
def test_python_ints_safetensors_holds(tmp_path, value):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    save(tmp_path / "a.psk.d", {"n": value})
    convert(tmp_path / "a.psk.d", tmp_path / "a.safetensors")
    convert(tmp_path / "a.safetensors", tmp_path / "b.psk.d")
    assert int(restore(tmp_path / "b.psk.d", as_numpy=True)["n"]) == value


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_python_ints_beyond_64_bits_are_refused_for_safetensors(tmp_path, value):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    save(tmp_path / "a.psk.d", {"n": value})
    with pytest.raises(BadValueError):
        convert(tmp_path / "a.psk.d", tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()


@pytest.mark.parametrize("tree", [{}, {"a": {}}, {"a": [], "b": None}])
def test_a_tree_of_no_leaves_is_refused_on_the_way_out(tmp_path, tree):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    save(tmp_path / "e.psk.d", tree)
    with pytest.raises(MismatchError, match="no leaves"):
        convert(tmp_path / "e.psk.d", tmp_path / "e.safetensors")
    assert not (tmp_path / "e.safetensors").exists()


_INTS = st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint16", "bool", "float16"])


@_SETTINGS
@given(dtype=_INTS, values=st.lists(st.integers(-128, 127), min_size=1, max_size=6))
def test_reader_with_the_layout_file_shows_what_restore_gives(tmp_path, dtype, values):
    array = np.array(values).astype(dtype)
    path = tmp_path / "m.psk.d"
    save(path, {"a": array, "n": -3})
    restored = restore(path, as_numpy=True)
    with Reader(path) as reader:
        reader.with_layout(find_layout_file(path))
        sample = reader[0]
        batch = reader.gather([0])
    assert sample["a"].dtype == restored["a"].dtype or dtype == "float16"
    assert np.array_equal(np.asarray(sample["a"], dtype=np.float64), np.asarray(restored["a"], dtype=np.float64))
    assert sample["n"] == -3 and batch["n"] == [-3]
    export_json(str(path), str(tmp_path / "o.json"), layout=find_layout_file(path))
    shown = json.loads((tmp_path / "o.json").read_text())["samples"][0]
    assert shown["a"] == np.asarray(sample["a"]).tolist()


def test_reader_refuses_a_layout_file_of_another_file(tmp_path):
    save(tmp_path / "a.psk.d", {"a": np.int8(-3)})
    save(tmp_path / "b.psk.d", {"a": np.zeros(5)})
    with Reader(tmp_path / "b.psk.d") as reader, pytest.raises(MismatchError):
        reader.with_layout(find_layout_file(tmp_path / "a.psk.d"))


@pytest.mark.subprocess
def test_cli_values_on_the_way(tmp_path):
    pytest.importorskip("safetensors")
    save(tmp_path / "k.psk.d", {"0": np.ones(1, np.float32), "1": np.zeros(1, np.float32), "big": 2**64 - 1})
    pskd_ok("convert", tmp_path / "k.psk.d", "-o", tmp_path / "k.safetensors")
    pskd_ok("convert", tmp_path / "k.safetensors", "-o", tmp_path / "back.psk.d")
    out = "\n".join(pskd_ok("info", tmp_path / "back.psk.d"))
    assert "['0']" in out and "['1']" in out
    assert list(restore(tmp_path / "back.psk.d", as_numpy=True)) == ["0", "1", "big"]
    save(tmp_path / "e.psk.d", {}, SaveOptions())
    pskd_fails("E9005", "convert", tmp_path / "e.psk.d", "-o", tmp_path / "e.safetensors")
    assert not (tmp_path / "e.safetensors").exists()
    save(tmp_path / "i.psk.d", {"a": np.array([-3, 4], np.int8)})
    assert "-3" in "\n".join(pskd_ok("info", tmp_path / "i.psk.d", "--values"))


@pytest.mark.parametrize("tree", [{0: np.ones(1)}, {"a": {}, "w": np.ones(2)}, {"t": (np.ones(1), np.zeros(1))},
                                  {True: np.ones(1), "True": np.zeros(1)}, {"l": [np.ones(1), {"x": np.zeros(1)}]}])
def test_safetensors_and_back_keeps_containers(tmp_path, tree):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    save(tmp_path / "a.psk.d", tree)
    convert(tmp_path / "a.psk.d", tmp_path / "a.safetensors")
    convert(tmp_path / "a.safetensors", tmp_path / "b.psk.d")
    first, back = restore(tmp_path / "a.psk.d", as_numpy=True), restore(tmp_path / "b.psk.d", as_numpy=True)
    assert repr(back) == repr(first)
