"""Strict JSON files (pskd_jax._os.jsonfile): UTF-8 JSON and nothing more. NaN, Infinity, a key twice,
nesting deeper than the parser goes, integers of more digits than Python converts, text that is
not UTF-8 and files that are not regular are refused with the caller's error class, naming the file;
never another exception."""

from __future__ import annotations

import json
import os

import pytest

from pskd_jax._os import jsonfile
from pskd_jax.errors import CheckpointDirectoryError, CorpusDirectoryError, PskdError, VocabularyError
from tests.helpers import raises

HOSTILE = [  # (text, what the reason says)
    (b"NaN", "NaN is not a JSON number"),
    (b'{"a": Infinity}', "Infinity is not a JSON number"),
    (b"[1, -Infinity]", "-Infinity is not a JSON number"),
    (b'{"a": 1, "b": 2, "a": 3}', "the key 'a' appears twice in one object"),
    (b'{"x": {"k": 1, "k": 1}}', "the key 'k' appears twice in one object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deep"),
    (b"1" + b"0" * 5000, "digits"),
    (b'{"n": -' + b"9" * 10_000 + b"}", "digits"),
    (b'"caf\xe9"', "utf-8"),
    (b"\xef\xbb\xbf{}", "BOM"),
    (b"{} {}", "Extra data"),
    (b"", "Expecting value"),
    (b"{'a': 1}", "property name"),
    (b"[1, 2,]", "Expecting value"),
]


@pytest.mark.parametrize("error", [CorpusDirectoryError, CheckpointDirectoryError, VocabularyError])
@pytest.mark.parametrize("text, why", HOSTILE, ids=[f"case{i}" for i in range(len(HOSTILE))])
def test_what_is_not_strict_json_is_the_callers_error(tmp_path, error, text, why):
    path = tmp_path / "f.json"
    path.write_bytes(text)
    for call in (lambda: jsonfile.read_strict(path, error), lambda: jsonfile.loads_strict(text, str(path), error)):
        with pytest.raises(PskdError) as info:
            call()
        assert type(info.value) is error
        assert info.value.message.startswith(f"{path}: not JSON (")
        assert why.lower() in info.value.message.lower(), info.value.message
        assert len(info.value.message) < 400  # the reason is cut short, whatever the input


def test_the_kind_of_file_is_named(tmp_path):
    error = raises("E9016", jsonfile.loads_strict, b"NaN", "m.json", CorpusDirectoryError, kind="a JSON manifest")
    assert error.message == "m.json: not a JSON manifest (NaN is not a JSON number)"


def test_strict_json_is_read_exactly(tmp_path):
    value = {"big": 2**64 + 1, "neg": -(10**40), "real": 0.1, "text": "é🙂\u0000", "list": [None, True, {}],
             "deep": [[[[[[[[[[1]]]]]]]]]]}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert jsonfile.read_strict(path, CorpusDirectoryError) == value
    assert type(jsonfile.read_strict(path, CorpusDirectoryError)["big"]) is int


def test_files_that_cannot_be_read_are_named_with_the_callers_error(tmp_path, monkeypatch):
    missing = tmp_path / "missing.json"
    error = raises("E9014", jsonfile.read_strict, missing, CheckpointDirectoryError, what="the index")
    assert error.message.startswith(f"{missing}: cannot read the index: ")
    raises("E9002", jsonfile.read_strict, tmp_path, CheckpointDirectoryError)  # a directory
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    raises("E9002", jsonfile.read_strict, fifo, CheckpointDirectoryError)  # at once, not waited on
    big = tmp_path / "big.json"
    big.write_text("[" + "0, " * 50 + "0]")
    monkeypatch.setattr(jsonfile, "MAX_FILE_BYTES", 100)
    error = raises("E9016", jsonfile.read_strict, big, CorpusDirectoryError)
    assert "more than the 100" in error.message


def test_write_json_round_trips_and_writes_whole_files(tmp_path):
    value = {"path": "caf" + chr(0xDCE9) + ".txt", "é": [1, 2.5, None], "n": 2**70}
    jsonfile.write_json(tmp_path / "v.json", value)
    raw = (tmp_path / "v.json").read_bytes()
    assert raw.endswith(b"}\n") and "é".encode() in raw and b"\\udce9" in raw
    raw.decode("utf-8")  # a lone surrogate is escaped, so the file is UTF-8
    assert jsonfile.read_strict(tmp_path / "v.json", CorpusDirectoryError) == value
    jsonfile.write_json(tmp_path / "v.json", [1], indent=None)
    assert (tmp_path / "v.json").read_bytes() == b"[1]\n"
    assert os.listdir(tmp_path) == ["v.json"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_write_json_refuses_non_finite_numbers_and_writes_nothing(tmp_path, bad):
    (tmp_path / "v.json").write_bytes(b"[0]\n")
    with pytest.raises(ValueError):
        jsonfile.write_json(tmp_path / "v.json", {"x": [bad]})
    assert (tmp_path / "v.json").read_bytes() == b"[0]\n" and os.listdir(tmp_path) == ["v.json"]


def test_json_kind_is_short_whatever_the_value():
    assert jsonfile.json_kind(None) == "null" and jsonfile.json_kind(True) == "true"
    assert jsonfile.json_kind({"a": 1}) == "an object of 1 entry"
    assert jsonfile.json_kind(list(range(10**6))) == "a list of 1000000 entries"
    assert jsonfile.json_kind(2.5) == "the real number 2.5" and jsonfile.json_kind(7) == "7"
    assert len(jsonfile.json_kind("x" * 10**6)) < 90
