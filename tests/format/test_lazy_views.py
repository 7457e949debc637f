"""Reader's per-leaf views over the map are built on first use (leaves, samples, a gather of samples
too large for one record), never by opening or applying a layout: a restore never uses them."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, write


def test_applying_a_layout_builds_no_view_and_leaves_builds_them_once(tmp_path):
    path = tmp_path / "d.psk.d"
    write(path, "(idx[64][4], ℝ[])", (np.arange(8).reshape(2, 4), np.array([0.5, 1.5])))
    with Reader(path) as reader:
        assert reader._views is None
        assert reader.gather([1, 0])[1].tolist() == [1.5, 0.5]  # records: still no view
        assert reader._views is None
        first = reader.leaves()
        assert reader.leaves()[0] is first[0]
        assert first[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and first[1].tolist() == [0.5, 1.5]
        assert reader.samples()[1].tolist() == [0.5, 1.5]


def test_a_restore_builds_no_view(tmp_path, monkeypatch):
    tree = {f"l{i}": np.full(3, i, np.float32) for i in range(50)}
    ck.save(tmp_path / "c.psk.d", tree)
    built = []
    original = Reader._leaf_view
    monkeypatch.setattr(Reader, "_leaf_view", lambda self, i: built.append(i) or original(self, i))
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert built == [] and back["l7"].tolist() == [7.0] * 3


def test_views_follow_a_refresh_and_a_closed_reader_refuses_them(tmp_path):
    path = tmp_path / "d.psk.d"
    write(path, "ℝ[2]", np.array([[1.0, 2.0]]))
    reader = Reader(path)
    assert reader.leaves()[0].tolist() == [[1.0, 2.0]]
    write(path.with_name("e.psk.d"), "ℝ[2]", np.array([[1.0, 2.0], [3.0, 4.0]]))
    # append a sample in place: count 2, one more sample's bytes
    grown = path.with_name("e.psk.d").read_bytes()
    with open(path, "r+b") as f:
        f.write(grown)
    assert reader.refresh() == 2
    assert reader.leaves()[0].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    reader.close()
    with pytest.raises(PskdError) as e:
        reader.leaves()
    assert e.value.code == "E9012" and str(path) in e.value.message
