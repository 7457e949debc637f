"""A manager of a key prefix whose steps are parts checkpoints (a parts index at the step's name
and its part objects, as several processes save one; here made in one process by cutting a saved
step into parts): restore and verify by default, retention removing a dropped step's parts index,
part objects and layout object, recovery removing the parts of a cut-off save and the parts a
listed step's index does not reference, adoption of a parts checkpoint found without an index —
and no object whose name only looks like a part name is ever removed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointManager, Retention
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, load_index, write_index
from pskd_jax.checkpoint.parts import PartsIndex, part_key, part_of, parts_named_for
from pskd_jax.storage import locate, resolve
from tests.checkpoint.helpers import as_saved_in_parts
from tests.helpers import raises

# Names that look like part names of step 1 but are not the toolkit's: never removed.
LOOKALIKES = [
    "step-00000001.psk.d.part-notes",
    "step-00000001.psk.d.part-00000-of-00002",  # no token
    "step-00000001.psk.d.part-00000-of-00002.0123456789AB",  # an upper-case token
    "step-00000001.psk.d.part-00002-of-00002.0123456789ab",  # process 2 of 2
    "step-00000001.psk.d.part-0000-of-00002.0123456789ab",  # not the toolkit's padding
    "step-00000001.psk.d.part-00000-of-00002.0123456789ab.bak",
    "step-1.psk.d.part-00000-of-00002.0123456789ab",  # not a step name
]


def params(step: int) -> dict:
    return {"w": np.full((64, 3), step, np.float32), "step": np.int32(step)}


@pytest.fixture
def prefix(object_place) -> str:
    return locate(object_place).child("ckpts").url


def _store(prefix: str):
    store, where = resolve(prefix)
    return store, where.key


def _names(prefix: str) -> list[str]:
    store, key = _store(prefix)
    return sorted(info.key.rpartition("/")[2] for info in store.list(key))


def _parts(prefix: str, step: int) -> list[str]:
    return parts_named_for(_names(prefix), step_file(step))


def _into_parts(prefix: str, step: int, token: str = "00112233aabb", count: int = 2) -> list[str]:
    """Rewrites the step object as a parts index over ``count`` parts (as ``count`` processes
    save it: each part one contiguous piece here); returns the parts' names."""
    store, key = _store(prefix)
    file_key = f"{key}/{step_file(step)}"
    data = store.get(file_key)[0]
    bounds = np.linspace(0, len(data), count + 1).astype(int)
    keys = [f"{part_key(file_key, p, count)}.{token}" for p in range(count)]
    for p, part in enumerate(keys):
        store.put(part, data[bounds[p]:bounds[p + 1]])
    extents = [np.asarray([[bounds[p], bounds[p + 1] - bounds[p], 0]], np.int64) for p in range(count)]
    index = PartsIndex.of(len(data), keys, [int(bounds[p + 1] - bounds[p]) for p in range(count)], extents, file_key)
    store.put(file_key, index.encoded())
    as_saved_in_parts(store.url(file_key))
    _relist_layout(prefix, step)
    return [k.rpartition("/")[2] for k in keys]


def _relist_layout(prefix: str, step: int) -> None:
    """The index entry of ``step`` (if listed) recording the digest of its layout object as just
    rewritten: a save of parts commits the digest of the layout it put."""
    store, key = _store(prefix)
    if store.info(f"{key}/{INDEX}") is None:
        return
    content = json.loads(store.get(f"{key}/{INDEX}")[0])
    layout = store.get(f"{key}/{step_layout(step)}")[0]
    for entry in content["checkpoints"]:
        if entry["step"] == step and "layout_digest" in entry:
            entry["layout_digest"] = {"xxh3_128": DIGESTS["xxh3_128"](layout).hexdigest()}
    store.put(f"{key}/{INDEX}", json.dumps(content).encode())


def _leftovers(prefix: str) -> list[int]:
    store, key = _store(prefix)
    return json.loads(store.get(f"{key}/{INDEX}")[0])["leftovers"]


def _put(prefix: str, name: str, data: bytes = b"a user's file") -> None:
    store, key = _store(prefix)
    store.put(f"{key}/{name}", data)


@pytest.mark.parametrize("name, found", [
    ("a/b.psk.d.part-00001-of-00002.0123456789ab", ("a/b.psk.d", 1, 2, "0123456789ab")),
    ("b.part-00000-of-00001.ffffffffffff", ("b", 0, 1, "ffffffffffff")),
    ("b.part-123456-of-123457.ffffffffffff", ("b", 123456, 123457, "ffffffffffff")),
    *[(name, None) for name in LOOKALIKES[:-1]],
])
def test_part_names_are_recognised_exactly(name, found):
    assert part_of(name) == found


def test_retention_removes_a_parts_step_with_its_parts_and_layout(prefix):
    with CheckpointManager(prefix, retention=Retention(keep=2)) as manager:
        manager.save(1, params(1))
        parts = _into_parts(prefix, 1)
        for name in LOOKALIKES:
            _put(prefix, name)
        back = manager.restore(1, target=params(0))  # verified through the parts, by default
        assert float(back["w"][0, 0]) == 1 and [e.step for e in manager.verify()] == [1]
        manager.save(2, params(2))
        assert _parts(prefix, 1) == parts  # kept: referenced by listed step 1
        manager.save(3, params(3))
        assert manager.all_steps() == [2, 3]
    names = _names(prefix)
    assert not [n for n in names if n.startswith(step_file(1)) and n not in LOOKALIKES], names
    assert step_layout(1) not in names and all(name in names for name in LOOKALIKES)
    assert 1 in _leftovers(prefix)  # (claimed until its objects are gone: the next open drops the claim)
    CheckpointManager(prefix).close()
    assert _leftovers(prefix) == []


def test_a_damaged_part_is_found_by_the_verified_restore(prefix):
    with CheckpointManager(prefix) as manager:
        manager.save(1, params(1))
        parts = _into_parts(prefix, 1)
        store, key = _store(prefix)
        raw = bytearray(store.get(f"{key}/{parts[1]}")[0])
        raw[-1] ^= 1
        store.put(f"{key}/{parts[1]}", bytes(raw))
        with raises("E9013", step_file(1)):
            manager.restore(target=params(0))


def test_the_next_open_removes_a_cut_off_save_and_unreferenced_parts_only(prefix):
    with CheckpointManager(prefix) as manager:
        manager.save(1, params(1))
    referenced = _into_parts(prefix, 1)
    stray = [f"{part_key(step_file(1), p, 2)}.cafecafecafe" for p in range(2)]  # a cut-off re-save of 1
    cut_off = [f"{part_key(step_file(2), p, 2)}.0a0b0c0d0e0f" for p in range(2)]  # a cut-off save of 2
    for name in stray + cut_off + LOOKALIKES + ["step-00000002.psk.d.part-notes"]:
        _put(prefix, name)
    directory = CheckpointDirectory.of(prefix)
    index = load_index(directory)
    write_index(directory, index.entries, leftovers=[2], durable=False, over=index)  # step 2 was claimed
    with CheckpointManager(prefix) as manager:
        assert manager.all_steps() == [1]
        names = _names(prefix)
        assert _parts(prefix, 1) == referenced and not _parts(prefix, 2), names
        assert all(name in names for name in LOOKALIKES + ["step-00000002.psk.d.part-notes"]), names
        assert float(manager.restore(target=params(0))["w"][0, 0]) == 1
        assert _leftovers(prefix) == []


def test_parts_of_a_step_neither_listed_nor_claimed_stay(prefix):
    with CheckpointManager(prefix) as manager:
        manager.save(1, params(1))
    unclaimed = f"{part_key(step_file(7), 0, 2)}.0a0b0c0d0e0f"
    _put(prefix, unclaimed)
    with CheckpointManager(prefix) as manager:
        assert unclaimed in _names(prefix)
        manager.save(2, params(2))
    assert unclaimed in _names(prefix)


def test_a_parts_checkpoint_found_without_an_index_is_adopted(prefix):
    for step in (3, 6):
        ck.save(locate(prefix).child(step_file(step)).url, params(step))
    _into_parts(prefix, 6)
    with CheckpointManager(prefix) as manager:
        assert manager.all_steps() == [3, 6] and all(e.adopted for e in ck.read_index(prefix))
        assert int(manager.restore(target=params(0))["step"]) == 6
        assert len(_parts(prefix, 6)) == 2
