"""A checkpoint's ``extra`` keeps every value exactly or is refused naming its key path (NumPy
scalars converted to the Python value equal to them; non-str keys, non-finite floats and other
types refused, E9014), and every entry records when its step was written (``started`` and
``committed``, UTC in ISO 8601), read back, shown by ``pskd verify``, absent from old indexes."""

from __future__ import annotations

import datetime
import json
import math

import numpy as np
import pytest

from pskd_jax.checkpoint import CheckpointEntry, CheckpointManager, read_index
from pskd_jax.checkpoint.index import MAX_EXTRA_DEPTH, extra_json, is_utc_time, utc_time
from pskd_jax.errors import PskdError
from tests.helpers import pskd_ok

# --- extra: kept exactly ---------------------------------------------------------------------------


@pytest.mark.parametrize("given, kept", [
    (np.float32(0.1), 0.10000000149011612),  # the float that is exactly the f32's value
    (np.float16(1 / 3), float(np.float16(1 / 3))),
    (np.float64(2.5), 2.5),
    (np.int64(-3), -3), (np.uint64(2**64 - 1), 2**64 - 1), (np.int8(7), 7),
    (np.bool_(True), True), (2**100, 2**100), (-0.0, -0.0),
    ((1, "a", None), [1, "a", None]),  # a tuple is an array
    ({"a": {"b": [np.float32(1.5), {"c": np.int32(2)}]}}, {"a": {"b": [1.5, {"c": 2}]}}),
    (np.longdouble(0.5), 0.5),  # a longdouble a float holds exactly
])
def test_numpy_scalars_and_python_values_are_kept_exactly(given, kept):
    result = extra_json(given)
    assert result == kept and type(result) is type(kept)
    if isinstance(kept, float):
        assert math.copysign(1, result) == math.copysign(1, kept)
        assert float(given) == result  # (no rounding on the way)
    assert json.loads(json.dumps(result)) == result


def test_types_come_back_as_python_types_not_numpy_ones():
    result = extra_json({"x": [np.float32(1), np.int16(2), np.bool_(False)]})
    assert [type(v) for v in result["x"]] == [float, int, bool]


# --- extra: refused, naming the key path -------------------------------------------------------------


@pytest.mark.parametrize("given, where, words", [
    ({1: 2}, "extra:", "the key 1 (int) is not a str"),
    ({"a": [0, {2.5: 1}]}, "extra['a'][1]:", "the key 2.5 (float)"),
    ({"a": {None: 1}}, "extra['a']:", "the key None"),
    ({"a": {True: 1}}, "extra['a']:", "the key True (bool)"),
    ({"a": {(1, 2): 1}}, "extra['a']:", "(tuple)"),
    ({"x": float("nan")}, "extra['x']:", "not a finite number"),
    ({"x": [1, float("-inf")]}, "extra['x'][1]:", "not a finite number"),
    ({"x": np.float32("inf")}, "extra['x']:", "not a finite number"),
    ({"x": object()}, "extra['x']:", "of type object"),
    ({"x": {1, 2}}, "extra['x']:", "of type set"),
    ({"x": b"bytes"}, "extra['x']:", "of type bytes"),
    ({"x": np.zeros(2)}, "extra['x']:", "of type ndarray"),
    ({"x": np.longdouble(1) / 3}, "extra['x']:", "not exactly a float"),
])
def test_what_json_cannot_keep_is_refused_naming_the_key_path(given, where, words):
    with pytest.raises(PskdError) as e:
        extra_json(given)
    assert e.value.code == "E9014"
    assert e.value.message.startswith(where) and words in e.value.message and "not JSON" in e.value.message


def test_a_container_inside_itself_and_deep_nesting_are_refused():
    looped: list = [1]
    looped.append(looped)
    with pytest.raises(PskdError, match=r"extra\[1\]: a container inside itself"):
        extra_json(looped)
    deep: list = []
    for _ in range(MAX_EXTRA_DEPTH + 1):
        deep = [deep]
    with pytest.raises(PskdError, match="nested deeper"):
        extra_json(deep)
    shared = [1, 2]
    assert extra_json({"a": shared, "b": shared}) == {"a": [1, 2], "b": [1, 2]}  # shared is not a loop


def test_the_manager_keeps_numpy_extra_and_refuses_before_writing_anything(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": np.ones(2)}, extra={"lr": np.float32(0.1), "step": np.int64(1)})
        assert manager.extra() == {"lr": float(np.float32(0.1)), "step": 1}
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(PskdError) as e:
            manager.save(2, {"w": np.ones(2)}, extra={"eval": {0: 1.0}})
        assert e.value.code == "E9014" and "extra['eval']" in e.value.message
        assert sorted(p.name for p in tmp_path.iterdir()) == before and manager.all_steps() == [1]
    with CheckpointManager(tmp_path, read_only=True) as again:
        assert again.extra(1) == {"lr": float(np.float32(0.1)), "step": 1}


# --- the times of writing -------------------------------------------------------------------------------


def test_utc_times_are_iso_8601_with_their_offset():
    now = utc_time()
    assert now.endswith("Z") and is_utc_time(now)
    assert datetime.datetime.fromisoformat(now).utcoffset() == datetime.timedelta(0)
    for bad in ("2026-12-02T03:04:05", "yesterday", 5, None, ""):  # (no offset: a local time, refused)
        assert not is_utc_time(bad)
    # UTC only: a time of another zone is not what the entry records (pskd verify shows it as UTC)
    assert is_utc_time("2026-12-02T03:04:05Z") and is_utc_time("2026-12-02T03:04:05+00:00")
    assert not is_utc_time("2026-12-02T08:04:05+05:00") and not is_utc_time("2026-12-01T22:04:05-05:00")


def test_every_saved_entry_records_when_it_was_written(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": np.ones(2)})
        manager.save_async(2, {"w": np.ones(2)})
        manager.wait()
    for entry in read_index(str(tmp_path)):
        started = datetime.datetime.fromisoformat(entry.started)
        committed = datetime.datetime.fromisoformat(entry.committed)
        assert started <= committed
    raw = json.loads((tmp_path / "checkpoints.json").read_text())["checkpoints"][0]
    assert is_utc_time(raw["started"]) and is_utc_time(raw["committed"])


@pytest.mark.subprocess
def test_pskd_verify_shows_the_times_and_an_old_index_without_them_still_reads(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(3, {"w": np.ones(2)})
    entry = read_index(str(tmp_path))[0]
    lines = pskd_ok("verify", tmp_path)
    assert lines[0].endswith(f"(started {entry.started}, committed {entry.committed})"), lines
    index = tmp_path / "checkpoints.json"
    content = json.loads(index.read_text())
    for raw in content["checkpoints"]:
        del raw["started"], raw["committed"]  # as written before the times were recorded
    index.write_text(json.dumps(content))
    old = read_index(str(tmp_path))[0]
    assert old.started is None and old.committed is None and old.more == {}
    lines = pskd_ok("verify", tmp_path)
    assert "started" not in lines[0] and lines[0].startswith("pskd: ok step 3 ")


@pytest.mark.parametrize("value", ["soon", 17, "2026-12-02T03:04:05", "2026-12-02T08:04:05+05:00"])
def test_a_malformed_time_is_refused_naming_the_entry(tmp_path, value):
    raw = CheckpointEntry(1, {"xxh3_128": "0" * 32}).to_json()
    raw["committed"] = value
    with pytest.raises(PskdError) as e:
        CheckpointEntry.from_json(raw, "checkpoints.json", 0)
    assert e.value.code == "E9014" and "malformed entry 0" in e.value.message and "committed" in e.value.message


# --- an index read back holds only what it can be written back with ------------------------------


@pytest.mark.parametrize("raw, where", [
    ('{"loss": 1e400}', "extra['loss']"),  # (json reads 1e400 as inf, which no index can be written with)
    ('[0, {"b": -1e400}]', "extra[1]['b']"),
    ("[" * (MAX_EXTRA_DEPTH + 1) + "]" * (MAX_EXTRA_DEPTH + 1), "nested deeper"),
])
def test_an_index_whose_extra_cannot_be_written_back_is_refused_on_reading(tmp_path, raw, where):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": np.ones(2)})
    index = tmp_path / "checkpoints.json"
    text = index.read_text()
    index.write_text(text.replace('"extra": null', '"extra": ' + raw, 1))
    for step in (lambda: read_index(str(tmp_path)), lambda: CheckpointManager(tmp_path).save(2, {"w": np.ones(2)})):
        with pytest.raises(PskdError) as e:  # (before: read, then a ValueError when the next save wrote it)
            step()
        assert e.value.code == "E9014" and "malformed entry 0" in e.value.message and where in e.value.message
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "checkpoints.json", "step-00000001.layout.json", "step-00000001.psk.d"]


def test_a_later_writers_key_is_kept_only_when_it_can_be_written_back(tmp_path):
    raw = CheckpointEntry(1, {"xxh3_128": "0" * 32}).to_json()
    kept = CheckpointEntry.from_json({**raw, "later": {"x": [1, "a"]}}, "checkpoints.json", 0)
    assert kept.more == {"later": {"x": [1, "a"]}}
    with pytest.raises(PskdError) as e:
        CheckpointEntry.from_json({**raw, "later": [math.inf]}, "checkpoints.json", 0)
    assert e.value.code == "E9014" and "later[0]" in e.value.message
    deep: list = []
    for _ in range(MAX_EXTRA_DEPTH - 1):
        deep = [deep]  # as deep as a save keeps: read back
    assert CheckpointEntry.from_json({**raw, "extra": deep}, "checkpoints.json", 0).extra == deep
