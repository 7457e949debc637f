"""pskd info of a checkpoint lists its leaves (values with --values or --samples N); the data
commands' --layout FILE is used only when it belongs to the file it reads (E9005 naming both)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.format import write
from tests.helpers import pskd, pskd_fails, pskd_ok, run_python

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_info_lists_a_checkpoints_leaves_and_shows_values_on_request(tmp_path):
    tree = {"w": np.linspace(-1, 1, 4000, dtype=np.float32).reshape(40, 100), "step": np.int32(-1),
            "q": np.array([-3, 4], np.int8)}
    ck.save(tmp_path / "c.psk.d", tree)
    plain = pskd_ok("info", tmp_path / "c.psk.d")
    assert plain[4:] == [f"layout  {tmp_path / 'c.layout.json'}",
                         "leaves  3: key path, dtype and shape as restored, stored as",
                         "  ['w']     float32[40, 100]  ℝ[40, 100] f32",
                         "  ['step']  int32[]           idx[4294967296][], two's complement",
                         "  ['q']     int8[2]           idx[256][2], two's complement",
                         "values  not shown (--values shows them)"]
    shown = pskd_ok("info", tmp_path / "c.psk.d", "--values")
    assert shown[:-1] == plain[:-1]
    assert shown[-1].startswith("[0] {'w': [-1.0, ") and shown[-1].endswith("'step': -1, 'q': [-3, 4]}")
    assert pskd_ok("info", tmp_path / "c.psk.d", "--samples", "1") == shown
    assert len("\n".join(plain)) < len("\n".join(shown))


@pytest.mark.slow
def test_a_data_files_info_is_as_before(tmp_path):
    write(tmp_path / "d.psk.d", "(idx[10][2], ℝ[])", (np.array([[1, 2], [3, 4], [5, 6]]), np.array([0.5, 1.5, 2.5])))
    lines = pskd_ok("info", tmp_path / "d.psk.d")
    assert lines[-2:] == ["[0] ([1, 2], 0.5)", "[1] ([3, 4], 1.5)"]
    assert pskd_ok("info", tmp_path / "d.psk.d", "--values") == lines
    assert pskd_ok("info", tmp_path / "d.psk.d", "--samples", "1")[-1] == "[0] ([1, 2], 0.5)"


def test_export_of_a_checkpoint_writes_restored_values(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"q": np.array([-3, 4], np.int8), "ok": np.array([True])})
    pskd_ok("export", tmp_path / "c.psk.d", "-o", tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["samples"] == [{"q": [-3, 4], "ok": [True]}]


def test_diff_of_checkpoints_compares_integer_and_bool_leaves_exactly(tmp_path):
    ck.save(tmp_path / "a.psk.d", {"w": np.ones(2, np.float32), "step": np.int32(-1), "ok": np.array([True]),
                                   "x": np.array([255], np.uint8)})
    ck.save(tmp_path / "b.psk.d", {"w": np.ones(2, np.float32), "step": np.int32(-2), "ok": np.array([False]),
                                   "x": np.array([-1], np.int8)})
    assert pskd_ok("diff", tmp_path / "a.psk.d", tmp_path / "b.psk.d") == [
        "‖a − b‖₂ = 0.0  ‖a‖₂ = 1.4142135623730951  relative 0.0  over 2 real elements",
        "idx leaves: 2 of 2 elements differ (integers, bools and bit patterns, compared exactly); first: leaf "
        "['step'], sample 0, element 0: a holds -1, b holds -2",
        "not compared (1 leaf of one key path stored as other dtypes): ['x'] (uint8 in a, int8 in b)",
    ]


def other_save(tmp_path):
    """A checkpoint, and the layout file of a save of another tree (the data file of another
    type, of the same size)."""
    ck.save(tmp_path / "c.psk.d", {"w": np.arange(4, dtype=np.float32)})
    ck.save(tmp_path / "o.psk.d", {"w": np.arange(2, dtype=np.float32), "k": np.arange(2, dtype=np.float32)},
            SaveOptions(name="Other"))
    write(tmp_path / "d.psk.d", "ℝ[4]", np.ones((1, 4)))
    return tmp_path / "o.layout.json"


@pytest.mark.parametrize("command", [
    ["info", "{c}", "--layout", "{layout}"],
    ["info", "{d}", "--layout", "{c_layout}"],  # a data file: its closed type read through a checkpoint's leaves
    ["export", "{c}", "-o", "{out}", "--layout", "{layout}"],
    ["diff", "{c}", "{c}", "--layout", "{layout}"],
    ["diff", "{c}", "{c}", "--layout-b", "{layout}"],
    ["convert", "{c}", "-o", "{out}.safetensors", "--layout", "{layout}"],
])
def test_a_layout_option_of_another_file_is_refused_naming_both(tmp_path, command):
    layout = other_save(tmp_path)
    names = {"c": tmp_path / "c.psk.d", "d": tmp_path / "d.psk.d", "layout": layout,
             "c_layout": tmp_path / "c.layout.json", "out": tmp_path / "out.json"}
    args = [part.format(**names) for part in command]
    message = pskd_fails("E9005", *args)
    used = names["c_layout"] if "{c_layout}" in command else layout
    read = names["d"] if "{d}" in command else names["c"]
    assert f"{used}: not the layout of {read}" in message
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.json.safetensors").exists()


@pytest.mark.slow
def test_diff_layout_for_a_b_without_one_must_belong_to_b_too(tmp_path):
    ck.save(tmp_path / "a.psk.d", {"w": np.arange(4, dtype=np.float32)})
    ck.save(tmp_path / "b.psk.d", {"w": np.arange(4, dtype=np.float32) + 1}, SaveOptions(layout_file=False))
    # other encodings
    ck.save(tmp_path / "x.psk.d", {"w": np.arange(2, dtype=np.float64)}, SaveOptions(layout_file=False))
    assert pskd_ok("diff", tmp_path / "a.psk.d", tmp_path / "b.psk.d", "--layout", tmp_path / "a.layout.json")[0] \
        .startswith("‖a − b‖₂ = 2.0")
    message = pskd_fails("E9005", "diff", tmp_path / "a.psk.d", tmp_path / "x.psk.d", "--layout",
                         tmp_path / "a.layout.json")
    assert f"{tmp_path / 'a.layout.json'}: not the layout of {tmp_path / 'x.psk.d'}" in message
    result = pskd("diff", tmp_path / "a.psk.d", tmp_path / "b.psk.d")  # (B's own: none; never A's found beside)
    assert result.returncode != 0


@pytest.mark.slow
def test_info_of_a_checkpoint_saved_again_while_its_layout_is_proven_shows_one_save_whole(tmp_path):
    # The save lands between the layout file's read and its proof against the data (by hook, in the
    # command's own process): the old layout (a, then b) passes against the new data (b, then a),
    # whose header and size are the same; the command reads the pair again and shows the new one.
    path = tmp_path / "c.psk.d"
    ck.save(path, {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)})
    result = run_python("""
        import os, sys
        import numpy as np
        import pskd_jax.format.layout_file as layout_file
        from pskd_jax import checkpoint as ck
        from pskd_jax.apps import pskd
        path, real, saved = sys.argv[1], layout_file.check_belongs, []

        def saved_again_first(found, data, **kwargs):
            if not saved and os.fspath(data) == path:
                saved.append(True)  # (first: the save's own checks come here too)
                ck.save(path, {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)})
            return real(found, data, **kwargs)

        layout_file.check_belongs = saved_again_first
        sys.argv = ["pskd", "info", path, "--values"]
        pskd.run()
    """, path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines()[-1] == "[0] {'b': [2.0, 2.0, 2.0], 'a': [3.0, 3.0, 3.0]}"


@pytest.mark.parametrize("command", ["info", "export", "diff"])
def test_a_save_between_the_commands_look_up_and_its_reads_gives_the_new_pair_whole(tmp_path, command):
    # The save lands right after the command found the layout file beside the data (by hook, in the
    # command's own process): the layout found is the old save's, proven against the old data; the
    # reads meet the new data (OtherVersion) and the command looks the pair up again.
    path, other = tmp_path / "c.psk.d", tmp_path / "other.psk.d"
    ck.save(path, {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)})
    ck.save(other, {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)})
    args = {"info": ["info", path, "--values"], "export": ["export", path, "-o", tmp_path / "out.json"],
            "diff": ["diff", path, other]}[command]
    result = run_python("""
        import os, sys
        import numpy as np
        from pskd_jax import checkpoint as ck
        from pskd_jax.apps import pskd
        path, real, saved = sys.argv[1], ck.find_layout_file, []

        def then_saved_again(data, *rest, **kwargs):
            found = real(data, *rest, **kwargs)
            if not saved and os.fspath(data) == path:
                saved.append(True)
                ck.save(path, {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)})
            return found

        ck.find_layout_file = then_saved_again
        sys.argv = ["pskd", *sys.argv[2:]]
        pskd.run()
    """, path, *args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    if command == "info":
        assert result.stdout.splitlines()[-1] == "[0] {'b': [2.0, 2.0, 2.0], 'a': [3.0, 3.0, 3.0]}"
    elif command == "export":
        assert json.loads((tmp_path / "out.json").read_text())["samples"] == [{"b": [2.0] * 3, "a": [3.0] * 3}]
    else:
        assert result.stdout.startswith("‖a − b‖₂ = 0.0 ")
