"""Keys that differ but are written alike (issue 20, class 2): one encoding of dict keys
(``pskd_jax.format.keypaths``) for save, restore, info, export and convert.

What save accepts, restore gives back with the same keys; a dict whose keys a restore would give
back as one is refused at save (E9005 naming both); what JSON cannot hold apart (``{1: …, '1': …}``)
``export`` refuses (E9005 naming both) rather than drop a leaf; a key that is not UTF-8 text is
shown escaped, never a traceback.
"""

from __future__ import annotations

import enum
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.checkpoint import find_layout_file, restore, save
from pskd_jax.data import export_json
from pskd_jax.data.info import info_lines
from pskd_jax.errors import MismatchError
from pskd_jax.format import keypaths
from tests.helpers import pskd, pskd_fails, pskd_ok

SURROGATE = b"name-\xff".decode("utf-8", "surrogateescape")

# Keys of every kind a dict of a tree may have, some of them printing alike.
_KEYS = st.one_of(
    st.booleans(), st.none(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False), st.text(max_size=6),
    st.sampled_from(["True", "False", "None", "1.5", "-0.0", "inf", "nan", "1", "0", "(1, 'a')", SURROGATE]),
    st.tuples(st.integers(0, 3), st.sampled_from(["a", "b"])),
)


def _leaf(k: int) -> np.ndarray:
    return np.full((1,), float(k))


def _same_tree(a, b) -> bool:
    if isinstance(a, dict):
        return (isinstance(b, dict) and [(type(k), repr(k)) for k in a] == [(type(k), repr(k)) for k in b]
                and all(_same_tree(a[k], b[k]) for k in a))
    return np.array_equal(np.asarray(a), np.asarray(b))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(_KEYS, min_size=1, max_size=6, unique_by=lambda k: (type(k), repr(k))))
def test_what_save_accepts_restore_gives_back(tmp_path, keys):
    tree: dict = {}
    for k, key in enumerate(keys):
        tree.setdefault(key, _leaf(k))  # (1 and True, 0.0 and 0 are one key in Python)
    path = tmp_path / "keys.psk.d"
    try:
        save(path, tree)
    except MismatchError as e:  # refused: only keys a restore could not tell apart
        assert "written alike" in e.message
        return
    back = restore(path, as_numpy=True)
    assert _same_tree(back, tree)
    template = {key: np.zeros((1,)) for key in tree}
    assert _same_tree(restore(path, template, as_numpy=True), tree)


@pytest.mark.parametrize("pair", [(True, "True"), (1.5, "1.5"), (None, "None"), (False, "False"),
                                  ((1, "a"), "(1, 'a')"), (-0.0, "-0.0"), (b"x", "b'x'")])
def test_keys_printing_alike_round_trip(tmp_path, pair):
    tree = {pair[0]: _leaf(1), pair[1]: _leaf(2)}
    path = tmp_path / "m.psk.d"
    save(path, tree)
    back = restore(path, as_numpy=True)
    assert [type(k) for k in back] == [type(pair[0]), str] and back[pair[0]][0] == 1 and back[pair[1]][0] == 2
    assert len(info_lines(str(path), layout=find_layout_file(path))) > 0


@pytest.mark.parametrize("key", [object(), type("Odd", (), {"__repr__": lambda self: "'x'"})()])
def test_keys_a_restore_cannot_tell_apart_are_refused_at_save(tmp_path, key):
    path = tmp_path / "m.psk.d"
    with pytest.raises(MismatchError, match="written alike") as caught:
        save(path, {"a": {key: _leaf(1), repr(key): _leaf(2)}})
    assert "['a']" in caught.value.message and repr(key)[:20] in caught.value.message
    assert list(tmp_path.iterdir()) == []  # (a refused save leaves nothing)


class _Level(enum.IntEnum):
    HIGH = 5


@pytest.mark.parametrize("key, plain", [(np.str_("w"), "w"), (_Level.HIGH, 5)])
def test_a_str_or_int_key_of_a_subclass_restores(tmp_path, key, plain):
    # (numpy.str_ and IntEnum keys have their own repr, but are recorded as the plain str or int:
    # the path written must be the plain key's, or the layout file would not read back)
    path = tmp_path / "m.psk.d"
    save(path, {"outer": {key: _leaf(1), "b": _leaf(2)}})
    back = restore(path, as_numpy=True)
    assert list(back["outer"]) == [plain, "b"] and back["outer"][plain][0] == 1
    back = restore(path, {"outer": {key: np.zeros(1), "b": np.zeros(1)}}, as_numpy=True)
    assert back["outer"][key][0] == 1
    assert keypaths.key_piece(key) == keypaths.key_piece(plain)


@pytest.mark.parametrize("pair", [(1, "1"), (True, "True"), (None, "None"), (1.5, "1.5")])
def test_export_refuses_keys_json_writes_alike(tmp_path, pair):
    path = tmp_path / "m.psk.d"
    save(path, {"outer": {pair[0]: _leaf(1), pair[1]: _leaf(2)}})
    with pytest.raises(MismatchError) as caught:
        export_json(str(path), str(tmp_path / "out.json"), layout=find_layout_file(path))
    assert repr(pair[0]) in caught.value.message and repr(pair[1]) in caught.value.message
    assert str(path) in caught.value.message
    assert not (tmp_path / "out.json").exists()


def test_a_key_that_is_not_utf8_is_shown_escaped(tmp_path):
    path = tmp_path / "m.psk.d"
    save(path, {SURROGATE: _leaf(1), "w": _leaf(2)})
    assert list(restore(path, as_numpy=True)) == [SURROGATE, "w"]
    export_json(str(path), str(tmp_path / "out.json"), layout=find_layout_file(path))
    text = (tmp_path / "out.json").read_bytes().decode("utf-8")  # valid UTF-8: the key escaped
    assert "\\udcff" in text and list(json.loads(text)["samples"][0]) == [SURROGATE, "w"]
    assert any("\\udcff" in line for line in info_lines(str(path), layout=find_layout_file(path)))


def test_keypaths_one_encoding():
    for key in [True, None, 1.5, (1, "a"), -3, "x", b"\xff", 1e300, -0.0]:
        assert keypaths.key_of_json(keypaths.key_json(key)) == key
        assert keypaths.path_keys(keypaths.key_piece(key))  # (a piece always reads as keys)
    assert keypaths.key_of_json({"repr": "<object at 0x1>"}) == "<object at 0x1>"
    assert keypaths.key_of_json({"repr": "-inf"}) == float("-inf")
    assert keypaths.key_of_json({"repr": "(" * 5000}) == "(" * 5000  # (long texts: never parsed)
    with pytest.raises(MismatchError, match=r"1 and '1'"):
        keypaths.check_json_keys([1, "1"], "here")


@pytest.mark.subprocess
def test_cli_export_info_of_keys_alike(tmp_path):
    path = tmp_path / "m.psk.d"
    save(path, {1: _leaf(1), "1": _leaf(2)})
    line = pskd_fails("E9005", "export", path, "-o", tmp_path / "out.json")
    assert "1 and '1'" in line
    assert not (tmp_path / "out.json").exists()
    out = pskd_ok("info", path)
    assert any("[1]" in o for o in out) and any("['1']" in o for o in out)
    odd = tmp_path / "odd.psk.d"
    save(odd, {SURROGATE: _leaf(1)})
    result = pskd("export", odd, "-o", "-")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert list(json.loads(result.stdout)["samples"][0]) == [SURROGATE]
    assert "\\udcff" in "\n".join(pskd_ok("info", odd))
    fine = tmp_path / "fine.psk.d"
    save(fine, {True: _leaf(1), "True": _leaf(2)})
    assert "[True]" in "\n".join(pskd_ok("info", fine))


def test_convert_names_a_key_that_is_not_utf8(tmp_path):
    pytest.importorskip("safetensors")
    from pskd_jax.checkpoint.safetensors import convert

    save(tmp_path / "m.psk.d", {SURROGATE: _leaf(1)})
    with pytest.raises(MismatchError, match="not UTF-8") as caught:
        convert(tmp_path / "m.psk.d", tmp_path / "m.safetensors")
    assert str(tmp_path / "m.psk.d") in caught.value.message and "\\udcff" in caught.value.message
    assert not (tmp_path / "m.safetensors").exists()
