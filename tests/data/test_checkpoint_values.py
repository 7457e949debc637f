"""info and export of a checkpoint: by default info lists the leaves (key path, dtype and shape as
restored, how each is stored), values only on request; values — in info and in export — are shown
through the layout file as a restore gives them back (an int8 −3 as -3, not the stored 253)."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.data import export as export_module
from pskd_jax.data.export import export_json
from pskd_jax.data.info import info_lines
from pskd_jax.format import write
from tests.helpers import raises

jax = pytest.importorskip("jax")


def every_kind() -> dict:
    return {"i8": np.array([-3, 5, -128], np.int8), "b": np.array([True, False]),
            "f16": np.array([1.5, np.nan, -np.inf], np.float16), "c": np.array([1 + 2j, 3 - 4j], np.complex64),
            "key": jax.random.key(3), "f8": np.array([1.5, -2, np.nan], ml_dtypes.float8_e4m3fn),
            "i4": np.array([-8, 7], ml_dtypes.int4), "n": -7, "big": 2**70 + 1, "flag": True,
            "lr": float("inf"), "step": np.int32(-1), "u": np.uint16(65535)}


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "c.psk.d"
    ck.save(path, every_kind())
    return str(path), ck.find_layout_file(path)


def test_info_of_a_checkpoint_lists_its_leaves_and_no_value(checkpoint):
    path, layout = checkpoint
    lines = info_lines(path, layout=layout)
    assert lines[:4] == ["type    params Params", "count   1", "version 2", "sample  78 bytes, 13 leaves"]
    assert lines[4] == f"layout  {layout.path}"
    assert lines[5].startswith("leaves  13: key path, dtype and shape as restored")
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[6:19])}
    assert rows["['i8']"] == ["int8[3]", "idx[256][3], two's complement"]
    assert rows["['b']"] == ["bool[2]", "idx[2][2]"]
    assert rows["['f16']"] == ["float16[3]", "ℝ[3] f32, float16 values, exact in f32"]
    assert rows["['c']"] == ["complex64[2]", "ℝ[2, 2] f32, (real, imaginary) pairs"]
    assert rows["['key']"] == ["key<threefry2x32>[]", "idx[4294967296][2], key data of threefry2x32"]
    assert rows["['f8']"] == ["float8_e4m3fn[3]", "idx[256][3], bit pattern"]
    assert rows["['big']"][0] == "int (Python)" and "in 2 64-bit limbs" in rows["['big']"][1]
    assert rows["['lr']"] == ["float (Python)", "ℝ[] f64"]
    assert lines[19:] == ["values  not shown (--values shows them)"]
    assert not any(line.startswith("[0]") for line in lines)


def test_values_on_request_are_those_a_restore_gives(checkpoint):
    path, layout = checkpoint
    shown = info_lines(path, layout=layout, values=True)[-1]
    assert shown == ("[0] {'i8': [-3, 5, -128], 'b': [True, False], 'f16': [1.5, NaN, -Infinity], "
                     "'c': [[1.0, 2.0], [3.0, -4.0]], 'key': [0, 3], 'f8': [1.5, -2.0, NaN:0x7f], 'i4': [-8, 7], "
                     "'n': -7, 'big': 1180591620717411303425, 'flag': True, 'lr': Infinity, 'step': -1, "
                     "'u': 65535}")
    assert info_lines(path, layout=layout, samples=1)[-1] == shown  # samples given: values shown
    assert info_lines(path, layout=layout, samples=0)[-1].startswith("  ['u']")


def test_export_writes_the_values_a_restore_gives(checkpoint, tmp_path):
    path, layout = checkpoint
    export_json(path, str(tmp_path / "c.json"), layout=layout)
    content = json.loads((tmp_path / "c.json").read_text())
    assert list(content) == ["type", "version", "encodings", "count", "samples"]  # the shape stays
    assert content["samples"] == [{
        "i8": [-3, 5, -128], "b": [True, False], "f16": [1.5, "NaN", "-Infinity"], "c": [[1.0, 2.0], [3.0, -4.0]],
        "key": [0, 3], "f8": [1.5, -2.0, "NaN:0x7f"], "i4": [-8, 7], "n": -7, "big": 2**70 + 1, "flag": True,
        "lr": "Infinity", "step": -1, "u": 65535}]
    back = ck.restore(path, as_numpy=True)
    assert content["samples"][0]["i8"] == back["i8"].tolist() and content["samples"][0]["big"] == back["big"]


def test_a_bare_layout_shows_the_stored_values(checkpoint, tmp_path):
    path, layout = checkpoint
    assert "'i8': [253, 5, 128]" in info_lines(path, layout=layout.layout, values=True)[-1]


def test_large_leaves_are_decoded_in_blocks(tmp_path, monkeypatch):
    tree = {"rows": (np.arange(20, dtype=np.int8) - 10).reshape(4, 5), "flat": -np.arange(20, dtype=np.int16),
            "big": -(2**100)}
    ck.save(tmp_path / "l.psk.d", tree)
    layout = ck.find_layout_file(tmp_path / "l.psk.d")
    monkeypatch.setattr(export_module, "CHUNK_ELEMENTS", 8)  # a sample larger than a chunk: block by block
    export_json(str(tmp_path / "l.psk.d"), str(tmp_path / "l.json"), layout=layout)
    sample = json.loads((tmp_path / "l.json").read_text())["samples"][0]
    assert sample == {"rows": tree["rows"].tolist(), "flat": tree["flat"].tolist(), "big": -(2**100)}
    monkeypatch.setattr("pskd_jax.data.info.INFO_ELEMENTS", 4)
    assert "'flat': [0, -1, -2, -3, … (20 elements, shape [20])]" in info_lines(
        str(tmp_path / "l.psk.d"), layout=layout, values=True)[-1]


def test_a_float16_leaf_whose_f32_is_no_float16_is_e9004_naming_it(tmp_path):
    ck.save(tmp_path / "h.psk.d", {"h": np.array([0.1], np.float32)})
    content = json.loads((tmp_path / "h.layout.json").read_text())
    content["leaves"][0]["dtype"] = "float16"  # (the same data: its identity still holds)
    (tmp_path / "h.layout.json").write_text(json.dumps(content))
    layout = ck.find_layout_file(tmp_path / "h.psk.d")
    with raises("E9004", "['h']", "not a float16 value"):
        info_lines(str(tmp_path / "h.psk.d"), layout=layout, values=True)
    with raises("E9004", "['h']"):
        export_json(str(tmp_path / "h.psk.d"), str(tmp_path / "h.json"), layout=layout)
    assert not (tmp_path / "h.json").exists()


def test_a_python_int_beyond_decimal_text_is_e9004_not_a_traceback(tmp_path):
    ck.save(tmp_path / "p.psk.d", {"huge": 3**40000})
    layout = ck.find_layout_file(tmp_path / "p.psk.d")
    with raises("E9004", "['huge']", "decimal"):
        export_json(str(tmp_path / "p.psk.d"), str(tmp_path / "p.json"), layout=layout)
    with raises("E9004", "['huge']"):
        info_lines(str(tmp_path / "p.psk.d"), layout=layout, values=True)
    assert "int (Python)" in "\n".join(info_lines(str(tmp_path / "p.psk.d"), layout=layout))


def test_a_layout_file_of_another_file_is_refused_naming_both(tmp_path):
    ck.save(tmp_path / "a.psk.d", {"w": np.ones(3, np.float32)})
    write(tmp_path / "d.psk.d", "ℝ[3]", np.ones((1, 3)))  # a data file of the same size, other type
    layout = ck.find_layout_file(tmp_path / "a.psk.d")
    for call in (lambda: info_lines(str(tmp_path / "d.psk.d"), layout=layout),
                 lambda: export_json(str(tmp_path / "d.psk.d"), str(tmp_path / "d.json"), layout=layout)):
        with raises("E9005", str(tmp_path / "a.layout.json"), str(tmp_path / "d.psk.d")):
            call()


def test_a_data_file_still_shows_its_first_samples_by_default(tmp_path):
    write(tmp_path / "d.psk.d", "(idx[10][2], ℝ[])", (np.array([[1, 2], [3, 4], [5, 6]]), np.array([0.5, 1.5, 2.5])))
    lines = info_lines(str(tmp_path / "d.psk.d"))
    assert lines[-2:] == ["[0] ([1, 2], 0.5)", "[1] ([3, 4], 1.5)"]
    assert info_lines(str(tmp_path / "d.psk.d"), samples=3)[-1] == "[2] ([5, 6], 2.5)"
    assert info_lines(str(tmp_path / "d.psk.d"), values=False)[-1] == "values  not shown (--values shows them)"
