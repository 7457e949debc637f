"""The index's entries as records: CheckpointEntry round trips through JSON, keeps what a later
writer added, and names only its own step's files."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointEntry, CheckpointManager, read_index
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, MAX_STEP, load_index, parse_index, write_index
from pskd_jax.errors import PskdError

HEX = st.text("0123456789abcdef", min_size=32, max_size=32)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=8)
ENTRIES = st.builds(
    CheckpointEntry, st.integers(0, MAX_STEP),
    st.dictionaries(st.sampled_from(["xxh3_128", "sha256", "blake3"]), HEX, min_size=1),
    type_text=st.one_of(st.none(), st.just("params Params")), bytes=st.one_of(st.none(), st.integers(0, 2**40)),
    layout=st.booleans(), extra=JSON, score=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    adopted=st.booleans(), more=st.dictionaries(st.sampled_from(["written_at", "note"]), JSON, max_size=2))


@settings(max_examples=40, deadline=None)
@given(ENTRIES)
def test_an_entry_round_trips_through_json(entry):
    text = json.dumps(entry.to_json())
    assert CheckpointEntry.from_json(json.loads(text), "checkpoints.json", 0) == entry


def test_an_entry_names_its_own_files_only():
    entry = CheckpointEntry(7, {"xxh3_128": "0" * 32}, layout=True)
    assert entry.file == step_file(7) and entry.layout_name == step_layout(7)
    assert entry.names == (step_file(7), step_layout(7))
    bare = CheckpointEntry(7, {"xxh3_128": "0" * 32})
    assert bare.layout_name is None and bare.names == (step_file(7),)
    assert "layout" not in bare.to_json() and "adopted" not in bare.to_json() and "score" not in bare.to_json()


def test_a_version_1_entry_reads_its_sha256_as_a_digest():
    raw = {"step": 3, "file": step_file(3), "sha256": "ab" * 32, "extra": {"epoch": 1}}
    entry = CheckpointEntry.from_json(raw, "checkpoints.json", 0, version=1)
    assert entry.digest == {"sha256": "ab" * 32} and entry.extra == {"epoch": 1} and entry.more == {}
    assert "sha256" not in entry.to_json()


def test_checkable_digests_are_those_this_version_knows():
    entry = CheckpointEntry(1, {"blake3": "00", "sha256": "11", "xxh3_128": "22"})
    assert list(entry.checkable_digests()) == ["xxh3_128", "sha256"]
    with pytest.raises(PskdError) as e:
        CheckpointEntry(1, {"blake3": "00"}).checkable_digests()
    assert e.value.code == "E9014" and "blake3" in e.value.message and step_file(1) in e.value.message


def test_an_index_round_trips_and_keeps_unknown_keys_of_its_entries(tmp_path):
    place = CheckpointDirectory(str(tmp_path))
    entries = [CheckpointEntry(2, {"xxh3_128": "0" * 32}, more={"written_at": "2026-01-01T00:00:00Z"}),
               CheckpointEntry(1, {"sha256": "1" * 64}, layout=True, score=0.5)]
    write_index(place, entries, leftovers=[5, 3, 5], durable=False)
    index = load_index(place)
    assert index.exists and index.steps == [1, 2] and index.leftovers == (3, 5)
    assert index.entry(2).more == {"written_at": "2026-01-01T00:00:00Z"} and index.entry(9) is None
    assert index.listed_names() == {step_file(1), step_layout(1), step_file(2)}
    assert read_index(tmp_path) == sorted(entries, key=lambda e: e.step)
    content = json.loads((tmp_path / INDEX).read_text())
    assert content["version"] == 3 and content["checkpoints"][1]["written_at"] == "2026-01-01T00:00:00Z"
    assert parse_index(str(tmp_path / INDEX), content) == index


def test_the_manager_lists_records(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(4, {"w": [1.0, 2.0]}, extra={"batch": 4})
    [entry] = read_index(tmp_path)
    assert (entry.step, entry.type_text, entry.extra, entry.layout, entry.adopted) == (4, "params Params",
                                                                                       {"batch": 4}, True, False)
    assert entry.bytes == (tmp_path / step_file(4)).stat().st_size and list(entry.digest) == ["xxh3_128"]
