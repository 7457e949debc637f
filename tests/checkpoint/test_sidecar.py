"""A layout file proves it belongs to its data file, or is not used; data and layout come from one save."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.data.export import export_json
from pskd_jax.data.info import info_lines
from pskd_jax.errors import PskdError
from pskd_jax.format.writer import write

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pskd(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def stale_beside(tmp_path) -> pathlib.Path:
    """A params checkpoint's layout left beside a new file of another kind written at its name."""
    ck.save(tmp_path / "m.psk.d", {"w": np.arange(4, dtype=np.float32), "k": np.uint8(3)})
    write(tmp_path / "m.psk.d", "ℝ[2]", np.array([[1e10, 2.0], [3.0, 4.0]]))  # a data tool's file
    assert (tmp_path / "m.layout.json").exists()
    return tmp_path / "m.psk.d"


def test_a_layout_left_by_another_save_is_refused_naming_both_files(tmp_path):
    path = stale_beside(tmp_path)
    with pytest.raises(PskdError) as e:
        ck.find_layout_file(path).layout
    assert e.value.code == "E9005"
    assert str(tmp_path / "m.layout.json") in e.value.message and str(path) in e.value.message
    with pytest.raises(PskdError) as e:
        ck.restore(path, as_numpy=True)
    assert e.value.code == "E9005"


def stale_params(tmp_path) -> pathlib.Path:
    """A params checkpoint with the layout of an earlier save of another tree put back beside it."""
    ck.save(tmp_path / "m.psk.d", {"w": np.arange(4, dtype=np.float32), "k": np.uint8(200)})
    old = (tmp_path / "m.layout.json").read_bytes()
    ck.save(tmp_path / "m.psk.d", {"w": np.arange(5, dtype=np.float32)})
    (tmp_path / "m.layout.json").write_bytes(old)
    return tmp_path / "m.psk.d"


COMMANDS = {
    "info": lambda p, out: ["info", p],
    "export": lambda p, out: ["export", p, "-o", out / "e.json"],
    "diff": lambda p, out: ["diff", p, p],
    "convert": lambda p, out: ["convert", p, "-o", out / "c.safetensors"],
}


@pytest.mark.subprocess
@pytest.mark.parametrize("command, make", [(c, m) for c in COMMANDS for m in ("data-file", "params")
                                           if (c, m) != ("convert", "data-file")])  # (a closed type reads none)
def test_the_commands_refuse_a_layout_of_another_save(tmp_path, command, make):
    path = (stale_beside if make == "data-file" else stale_params)(tmp_path)
    command = COMMANDS[command]
    out = tmp_path / "out"
    out.mkdir()
    result = pskd(*command(path, out))
    assert result.returncode != 0 and result.stderr.startswith("pskd: E9005: "), result.stderr
    assert "m.layout.json" in result.stderr and "Traceback" not in result.stderr
    assert list(out.iterdir()) == []


def test_a_save_that_writes_no_layout_removes_the_one_of_the_data_it_replaces(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(3, np.float32)})
    ck.save(tmp_path / "c.psk.d", {"v": np.ones(3, np.float32)}, SaveOptions(layout_file=False))
    assert not (tmp_path / "c.layout.json").exists()
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(3, np.float32)})
    ck.save(tmp_path / "c.psk.d", (np.ones(2), np.ones(3)))  # a closed type: no layout file
    assert sorted(os.listdir(tmp_path)) == ["c.psk.d"]
    assert ck.restore(tmp_path / "c.psk.d", as_numpy=True)[1].tolist() == [1.0, 1.0, 1.0]


def test_a_layout_written_before_a_failed_rename_is_not_applied_to_the_old_data(tmp_path, monkeypatch):
    ck.save(tmp_path / "c.psk.d", {"w": np.arange(3, dtype=np.float32)})
    import pskd_jax._os.atomic as atomic

    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append(dst)
        if str(dst).endswith(".psk.d"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    with pytest.raises((PskdError, OSError)):
        ck.save(tmp_path / "c.psk.d", {"w": np.arange(5, dtype=np.float32), "b": np.int8(-1)})
    monkeypatch.setattr(atomic.os, "replace", real)
    assert any(str(d).endswith(".layout.json") for d in calls)  # the new layout went in first
    # …and the failed save put the old one back before giving up its lock: the old pair, whole
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert list(back) == ["w"] and back["w"].tolist() == [0.0, 1.0, 2.0]
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d"]


def _cut_short(monkeypatch, path, tree, *, after_data: bool) -> None:
    """A save of ``tree`` at ``path`` left as a kill leaves it: between its layout's rename and its
    data's (or, ``after_data``, just after the data's), its mark and the old layout kept."""
    import pskd_jax._os.atomic as atomic
    import pskd_jax._os.locks as locks
    import pskd_jax.checkpoint.saving as saving

    real = os.replace

    def failing(src, dst):  # (the layout goes in, then the data's rename fails)
        if str(dst).endswith(".psk.d"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(locks, "_settle_held", lambda path, fd: None)  # (a killed writer settles nothing)
        if after_data:
            m.setattr(saving, "clear_committing", lambda path: None)
            ck.save(path, tree)
        else:
            m.setattr(atomic.os, "replace", failing)
            with pytest.raises((PskdError, OSError)):
                ck.save(path, tree)


@pytest.mark.parametrize("after_data", [False, True])
def test_a_commit_cut_short_reads_as_the_old_pair_or_the_new_one_until_a_save_puts_it_in_order(
        tmp_path, monkeypatch, after_data):
    # The same header both times (keys in another order): only the mark in the save's lock file
    # tells which save's data stands, and the old layout it kept is that data's own when the data
    # is the old one. A reader writes nothing; the next save, refused or not, puts it in order.
    path = tmp_path / "c.psk.d"
    old = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
    new = {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)}
    ck.save(path, old)
    _cut_short(monkeypatch, path, new, after_data=after_data)
    left = sorted(os.listdir(tmp_path))
    assert left == [".c.psk.d.layout-before", ".c.psk.d.lock", "c.layout.json", "c.psk.d"], left
    assert (tmp_path / ".c.psk.d.lock").read_bytes().startswith(b"pskd: committing")
    expected = new if after_data else old
    for _ in range(2):
        back = ck.restore(path, as_numpy=True)  # (never {'b': [0, 0, 0], 'a': [1, 1, 1]})
        assert list(back) == list(expected), back
        assert all(back[k].tolist() == v.tolist() for k, v in expected.items())
        assert ck.restore(path, {k: np.zeros(3, np.float32) for k in expected}, as_numpy=True)["a"].tolist() \
            == expected["a"].tolist()
        assert sorted(os.listdir(tmp_path)) == left  # (a reader changes nothing)
    with pytest.raises(PskdError):  # a save refused before its commit still puts the pair in order
        ck.save(path, {"a": np.full(3, np.nan, np.float32)}, SaveOptions(finite_only=True))
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d"]
    back = ck.restore(path, as_numpy=True)
    assert list(back) == list(expected) and back["a"].tolist() == expected["a"].tolist()
    ck.save(path, {"b": np.full(3, 4, np.float32), "a": np.full(3, 5, np.float32)})
    back = ck.restore(path, as_numpy=True)
    assert list(back) == ["b", "a"] and back["a"].tolist() == [5.0] * 3
    assert sorted(os.listdir(tmp_path)) == ["c.layout.json", "c.psk.d"]


def test_a_first_save_cut_short_reads_as_no_layout_and_the_next_save_removes_its_layout(tmp_path, monkeypatch):
    # The old data had no layout file beside it (saved without one): a save cut off after putting
    # its layout in place leaves the old data read as it was, without a layout.
    path = tmp_path / "c.psk.d"
    old = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
    ck.save(path, old, SaveOptions(layout_file=False))
    assert not (tmp_path / "c.layout.json").exists()
    template = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
    _cut_short(monkeypatch, path, {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)},
               after_data=False)
    assert sorted(os.listdir(tmp_path)) == [".c.psk.d.lock", "c.layout.json", "c.psk.d"]
    from pskd_jax.format.layout_file import find_layout_file

    assert find_layout_file(path) is None  # (the layout in place is the cut-off save's)
    back = ck.restore(path, template, as_numpy=True)
    assert back["a"].tolist() == [0.0] * 3 and back["b"].tolist() == [1.0] * 3
    with pytest.raises(PskdError):
        ck.save(path, {"a": np.full(3, np.nan, np.float32)}, SaveOptions(finite_only=True))
    assert sorted(os.listdir(tmp_path)) == ["c.psk.d"]  # (its layout removed: the old pair had none)


def test_identity_size_and_header(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(8, np.float32)})
    data = (tmp_path / "c.psk.d").read_bytes()
    (tmp_path / "c.psk.d").write_bytes(data[:-4])
    with pytest.raises(PskdError) as e:  # the same save's data cut short: truncated
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9003"
    (tmp_path / "c.psk.d").write_bytes(data + b"\0" * 4)
    with pytest.raises(PskdError) as e:
        ck.find_layout_file(tmp_path / "c.psk.d")
    assert e.value.code == "E9005"
    ck.save(tmp_path / "d.psk.d", {"w": np.ones(8, np.float32)}, SaveOptions(name="Other"))  # same size, another header
    os.replace(tmp_path / "d.psk.d", tmp_path / "c.psk.d")
    with pytest.raises(PskdError) as e:
        ck.find_layout_file(tmp_path / "c.psk.d").layout
    assert e.value.code == "E9005" and "another header" in e.value.message


def test_a_version_1_layout_is_used_when_it_agrees_with_its_data(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(4, np.float32), "n": np.uint16(7)})
    content = json.loads((tmp_path / "c.layout.json").read_text())
    v1 = {"format": "pskd-layout", "version": 1, "type": content["type"],
          "leaves": [{k: v for k, v in leaf.items() if k != "kind"} for leaf in content["leaves"]]}
    (tmp_path / "c.layout.json").write_text(json.dumps(v1))
    assert ck.restore(tmp_path / "c.psk.d", as_numpy=True)["n"].tolist() == 7
    v1["type"] = "params Other"
    (tmp_path / "c.layout.json").write_text(json.dumps(v1))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9005" and "params Other" in e.value.message


@pytest.mark.parametrize("change, reason", [
    (lambda d: d["leaves"][0].update(shape=[2.7]), "lengths"),
    (lambda d: d["leaves"][0].update(shape=[True]), "lengths"),
    (lambda d: d["leaves"][1].update(bound=True), "bound"),
    (lambda d: d["leaves"][1].update(dtype="int8", kind="value"), "dtype int8"),
    (lambda d: d["leaves"][1].update(kind="bits"), "dtype uint8 kind bits"),
    (lambda d: d["data"].update(header_xxh3_128="xyz"), "hex"),
])
def test_layout_values_that_disagree_with_their_leaf_are_refused(tmp_path, change, reason):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(4, np.float32), "k": np.uint8(200)})
    content = json.loads((tmp_path / "c.layout.json").read_text())
    change(content)
    (tmp_path / "c.layout.json").write_text(json.dumps(content))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9001" and reason in e.value.message and "c.layout.json" in e.value.message


def test_convert_gives_the_stored_values_never_a_dtype_they_do_not_hold(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    ck.save(tmp_path / "c.psk.d", {"x": np.array([1e10, 0.5])})
    content = json.loads((tmp_path / "c.layout.json").read_text())
    content["leaves"][0]["dtype"] = "float16"  # a float16 leaf stored in f64: given back as stored
    (tmp_path / "c.layout.json").write_text(json.dumps(content))
    ck.convert(tmp_path / "c.psk.d", tmp_path / "c.safetensors")
    back = load_file(str(tmp_path / "c.safetensors"))["x"]
    assert back.dtype == np.float64 and back.tolist() == [1e10, 0.5]


def test_info_and_export_use_a_layout_that_belongs(tmp_path):
    ck.save(tmp_path / "m.psk.d", {"w": np.arange(2, dtype=np.float32), "s": np.int16(-2)})
    layout = ck.find_layout_file(tmp_path / "m.psk.d").layout
    assert info_lines(str(tmp_path / "m.psk.d"), layout=layout)[0] == "type    params Params"
    export_json(str(tmp_path / "m.psk.d"), str(tmp_path / "m.json"), layout=layout)
    assert json.loads((tmp_path / "m.json").read_text())["samples"][0]["w"] == [0.0, 1.0]


def test_a_layout_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(2)}, SaveOptions(layout_file=False))
    os.mkfifo(tmp_path / "c.layout.json")
    with pytest.raises(PskdError) as e:
        ck.find_layout_file(tmp_path / "c.psk.d").layout
    assert e.value.code in ("E9001", "E9002")
