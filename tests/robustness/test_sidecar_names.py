"""Sidecar names (issue 20, class 1): the layout file's name follows from its data file's whole
name, no two data files share one, and a save replaces or removes only the toolkit's own layout of
that very data file; old-name layouts still read when they prove to belong; a refused save leaves
nothing behind.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pskd_jax._os import names
from pskd_jax.checkpoint import SaveOptions, find_layout_file, restore, save
from pskd_jax.errors import PskdError, UsageError
from pskd_jax.format.layout_file import is_own_layout
from tests.helpers import pskd_fails, pskd_ok

_NAME = st.sampled_from(["a", "b", ".", "-", "_", "psk", ".psk.d", ".layout.json", "pskd-layout", "json"])


@given(st.lists(st.lists(_NAME, min_size=1, max_size=4).map("".join), min_size=2, max_size=6, unique=True))
def test_no_two_data_files_share_a_layout_name(data_names):
    layouts = [names.layout_path_for("d/" + n) for n in data_names]
    assert len(set(layouts)) == len(layouts)
    for n, layout in zip(data_names, layouts):
        assert names.is_layout_name(layout)
        assert names.data_path_for(layout) == "d/" + n
        assert layout != "d/" + n


def _tree(k: float) -> dict:
    return {"w": np.full((3,), k)}


def _listing(d) -> list[str]:
    return sorted(os.listdir(d))


def test_m_and_m_psk_d_have_layouts_of_their_own(tmp_path):
    save(tmp_path / "m", {"a": np.ones(2)})
    save(tmp_path / "m.psk.d", {"b": np.zeros((2, 2), np.float32)})
    assert list(restore(tmp_path / "m", as_numpy=True)) == ["a"]
    assert list(restore(tmp_path / "m.psk.d", as_numpy=True)) == ["b"]
    assert _listing(tmp_path) == ["m", "m.layout.json", "m.psk.d", "m.pskd-layout.json"]


@pytest.mark.parametrize("closed", [False, True])
def test_a_users_notes_are_never_removed(tmp_path, closed):
    notes = tmp_path / "m.layout.json"
    notes.write_text("my notes about m\n")
    if closed:  # a closed type: a tuple of arrays, which needs no layout
        save(tmp_path / "m.psk.d", np.ones(3, np.float32))
    else:
        save(tmp_path / "m.psk.d", _tree(1.0), SaveOptions(layout_file=False))
    assert notes.read_text() == "my notes about m\n"


def test_a_save_that_writes_its_layout_over_a_users_file_is_refused_whole(tmp_path):
    notes = tmp_path / "m.layout.json"
    notes.write_text("my notes\n")
    with pytest.raises(UsageError, match="m.layout.json"):
        save(tmp_path / "m.psk.d", _tree(1.0))
    assert _listing(tmp_path) == ["m.layout.json"] and notes.read_text() == "my notes\n"


def test_a_data_file_named_like_a_layout_file_is_never_overwritten(tmp_path):
    save(tmp_path / "q.layout.json", _tree(1.0))  # a checkpoint, named as a layout file is
    before = (tmp_path / "q.layout.json").read_bytes()
    with pytest.raises(UsageError):
        save(tmp_path / "q.psk.d", _tree(2.0))
    assert (tmp_path / "q.layout.json").read_bytes() == before
    assert restore(tmp_path / "q.layout.json", as_numpy=True)["w"][0] == 1.0


def test_a_checkpoint_is_never_written_over_a_layout_file(tmp_path):
    save(tmp_path / "m.psk.d", _tree(1.0))
    with pytest.raises(UsageError, match="a layout file stands there"):
        save(tmp_path / "m.layout.json", _tree(2.0))
    assert restore(tmp_path / "m.psk.d", as_numpy=True)["w"][0] == 1.0


def test_another_checkpoints_layout_is_not_replaced(tmp_path):
    save(tmp_path / "a.psk.d", _tree(1.0))
    os.replace(tmp_path / "a.layout.json", tmp_path / "b.layout.json")  # a's layout, under b's name
    save(tmp_path / "b.psk.d", np.ones(2, np.float32))
    assert (tmp_path / "b.layout.json").exists()  # not b's: left as it is
    with pytest.raises(UsageError):
        save(tmp_path / "b.psk.d", _tree(3.0))


def test_own_layout_is_replaced_and_removed(tmp_path):
    path = tmp_path / "m.psk.d"
    save(path, _tree(1.0))
    save(path, {"other": np.zeros((4,), np.int32)})  # its own layout: replaced
    assert list(restore(path, as_numpy=True)) == ["other"]
    save(path, _tree(2.0), SaveOptions(layout_file=False))  # its own: removed with the data it described
    assert not (tmp_path / "m.layout.json").exists()


def test_a_layout_recording_its_data_files_name_is_its_own_after_a_save_cut_short(tmp_path):
    path = tmp_path / "m.psk.d"
    save(path, _tree(1.0))
    first = path.read_bytes()
    save(path, {"x": np.zeros((7,))})
    path.write_bytes(first)  # (the data of one save, the layout of another: a save cut short)
    with pytest.raises(PskdError):
        restore(path, as_numpy=True)
    assert is_own_layout(tmp_path / "m.layout.json", path)
    save(path, _tree(5.0))  # not refused: the layout records this file's name
    assert restore(path, as_numpy=True)["w"][0] == 5.0


def test_old_name_layouts_still_read_when_they_belong(tmp_path):
    save(tmp_path / "m", _tree(4.0))
    os.replace(tmp_path / "m.pskd-layout.json", tmp_path / "m.layout.json")  # as an older version named it
    assert restore(tmp_path / "m", as_numpy=True)["w"][0] == 4.0
    assert find_layout_file(tmp_path / "m").path.endswith("m.layout.json")
    # the layout of another file under that name is passed over, never taken for m's
    save(tmp_path / "m", {"v": np.ones(9, np.float32)}, SaveOptions(layout_file=False))
    assert find_layout_file(tmp_path / "m") is None
    assert (tmp_path / "m.layout.json").exists()


def test_a_moved_pair_still_reads_and_saves(tmp_path):
    save(tmp_path / "a.psk.d", _tree(1.0))
    os.replace(tmp_path / "a.psk.d", tmp_path / "b.psk.d")
    os.replace(tmp_path / "a.layout.json", tmp_path / "b.layout.json")
    assert restore(tmp_path / "b.psk.d", as_numpy=True)["w"][0] == 1.0
    save(tmp_path / "b.psk.d", _tree(2.0))  # proves to belong to b.psk.d: its own to replace
    assert json.loads((tmp_path / "b.layout.json").read_text())["data"]["name"] == "b.psk.d"


def test_a_refused_save_leaves_nothing_behind(tmp_path):
    (tmp_path / "m.psk.d").mkdir()
    with pytest.raises(UsageError):
        save(tmp_path / "m.psk.d", _tree(1.0))
    assert _listing(tmp_path) == ["m.psk.d"]
    (tmp_path / "n.layout.json").mkdir()
    with pytest.raises(UsageError):
        save(tmp_path / "n.psk.d", _tree(1.0))
    assert _listing(tmp_path) == ["m.psk.d", "n.layout.json"]


@pytest.mark.subprocess
def test_cli_convert_keeps_a_users_file_and_reads_old_names(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    source = tmp_path / "w.safetensors"
    save_file({"w": np.ones((2,), np.float32)}, str(source))
    (tmp_path / "m.layout.json").write_text("notes\n")
    pskd_fails("E9012", "convert", source, "-o", tmp_path / "m.psk.d")
    assert _listing(tmp_path) == ["m.layout.json", "w.safetensors"]
    save(tmp_path / "plain", {"w": np.ones((2,), np.float32)})
    os.replace(tmp_path / "plain.pskd-layout.json", tmp_path / "plain.layout.json")
    assert any("plain.layout.json" in line for line in pskd_ok("info", tmp_path / "plain"))


def test_a_layouts_recorded_name_is_read_from_its_first_bytes(tmp_path):
    from pskd_jax.format import layout_file

    save(tmp_path / "m.psk.d", {f"l{i}": np.ones(2) for i in range(50)})
    assert layout_file._recorded_name(str(tmp_path / "m.layout.json")) == "m.psk.d"
    assert is_own_layout(tmp_path / "m.layout.json", tmp_path / "m.psk.d")
    os.replace(tmp_path / "m.layout.json", tmp_path / "n.layout.json")  # (its name, beside another file)
    assert not is_own_layout(tmp_path / "n.layout.json", tmp_path / "n.psk.d")
    (tmp_path / "odd.layout.json").write_text('{"format": "pskd-layout", "data": {"name": "odd.psk.d"}}')
    assert layout_file._recorded_name(str(tmp_path / "odd.layout.json")) is None  # (not as the toolkit writes)
    assert not is_own_layout(tmp_path / "odd.layout.json", tmp_path / "odd.psk.d")


def test_a_save_to_a_store_replaces_only_its_own_layout():
    import uuid

    from pskd_jax.storage import resolve

    base = f"memory://sidecars-{uuid.uuid4().hex[:12]}"
    store, where = resolve(f"{base}/m.psk.d")
    save(f"{base}/m.psk.d", _tree(1.0))
    layout_key = names.layout_path_for(where.key)
    assert json.loads(store.get(layout_key)[0])["data"]["name"] == "m.psk.d"
    save(f"{base}/m.psk.d", _tree(2.0))  # its own: replaced
    assert restore(f"{base}/m.psk.d", as_numpy=True)["w"][0] == 2.0
    store.put(layout_key, b"my notes\n")
    data = store.get(where.key)[0]
    with pytest.raises(UsageError, match="another object stands there"):
        save(f"{base}/m.psk.d", _tree(3.0))
    assert store.get(layout_key)[0] == b"my notes\n" and store.get(where.key)[0] == data  # (nothing was put)
    save(f"{base}/m.psk.d", np.ones(2, np.float32))  # a closed type: the notes are left alone
    assert store.get(layout_key)[0] == b"my notes\n"
