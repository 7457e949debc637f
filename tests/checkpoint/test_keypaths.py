"""Key paths (pskd_jax.format.keypaths): parsed back into keys, nested into trees, at most
MAX_KEY_DEPTH keys deep."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.errors import PskdError
from pskd_jax.format import keypaths
from pskd_jax.format.keypaths import nest, path_keys


def test_path_keys_and_nest():
    assert path_keys("['blocks'][0]['w']") == ["blocks", 0, "w"]
    assert path_keys(".params['a.b'][3]") == ["params", "a.b", 3]
    assert path_keys("") == []
    assert nest([["a", 1], ["a", 0], ["b"]], [1, 0, 2]) == {"a": [0, 1], "b": 2}
    assert nest([["a", 2], ["a", 0]], [1, 2]) == {"a": {2: 1, 0: 2}}


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
            nest([["a"] * depth, ["b"]], [1, 2])
        assert e.value.code == "E9005" and f"({depth} keys)" in e.value.message
