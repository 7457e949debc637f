"""Layout files beside checkpoints (pskd_jax.format.layout_file): they open params files for info
and export, and a hostile one is E9001 naming it."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.data.export import export_json
from pskd_jax.data.info import info_lines
from pskd_jax.errors import PskdError


def test_layout_file_opens_params_checkpoints_for_info_and_export(tmp_path):
    tree = {"emb": np.arange(4, dtype=np.float32).reshape(2, 2), "layers": [{"w": np.float64(0.5)}],
            "count": np.uint16(9)}
    ck.save(tmp_path / "m.psk.d", tree, SaveOptions(name="Mini"))
    layout = ck.find_layout_file(tmp_path / "m.psk.d").layout
    assert [leaf.path for leaf in layout.leaves] == ["['emb']", "['layers'][0]['w']", "['count']"]
    lines = info_lines(str(tmp_path / "m.psk.d"), layout=layout, values=True)
    assert lines[0] == "type    params Mini"
    assert lines[-1] == "[0] {'emb': [[0.0, 1.0], [2.0, 3.0]], 'layers': [{'w': 0.5}], 'count': 9}"
    export_json(str(tmp_path / "m.psk.d"), str(tmp_path / "m.json"), layout=layout)
    import json

    content = json.loads((tmp_path / "m.json").read_text())
    assert content["samples"] == [{"emb": [[0.0, 1.0], [2.0, 3.0]], "layers": [{"w": 0.5}], "count": 9}]


def layout_text(tmp_path, change) -> str:
    import json

    ck.save(tmp_path / "c.psk.d", {"w": np.ones((2, 3), np.float32), "k": np.uint8(7)})
    content = json.loads((tmp_path / "c.layout.json").read_text())
    change(content)
    return json.dumps(content)


@pytest.mark.parametrize("what, text", [
    ("nested 100000 deep", lambda tmp_path: "[" * 100000 + "]" * 100000),
    ("a bound of Infinity",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][1].update(bound=float("inf")))),
    ("a bound of 184467440737E551615 (infinite as a float)",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][1].update(bound=0))
     .replace('"bound": 0', '"bound": 184467440737E551615')),
    ("a shape of -Infinity",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(shape=[2, float("-inf")]))),
    ("a key that is a list", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=[[1, 2]]))),
    ("a key that is an object", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=[{}]))),
    ("keys that are a string", lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys="w"))),
    ("a key path 5000 keys deep",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=["k"] * 5000))),
    ("a key path 65 keys deep",
     lambda tmp_path: layout_text(tmp_path, lambda d: d["leaves"][0].update(keys=["k"] * 65))),
    ("a version of 2.0 (a float, not the integer 2)",
     lambda tmp_path: layout_text(tmp_path, lambda d: d.update(version=2.0))),
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
