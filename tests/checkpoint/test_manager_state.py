"""One lifecycle state a manager: open, read-only, superseded, closed — and what each allows."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax.checkpoint import CheckpointManager, ManagerState, Retention, SaveOptions
from pskd_jax.errors import PskdError


def tree(step: int) -> dict:
    return {"w": np.full(3, step, np.float32)}


def refused_to_save(manager: CheckpointManager, fragment: str) -> None:
    for attempt in (lambda: manager.save(9, tree(9)), lambda: manager.save_async(9, tree(9))):
        with pytest.raises(PskdError) as e:
            attempt()
        assert e.value.code == "E9014" and fragment in e.value.message
    assert not manager.should_save(10)


def test_open_then_closed(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.state is ManagerState.OPEN and manager.should_save(1)
    manager.save(1, tree(1))
    manager.close()
    assert manager.state is ManagerState.CLOSED
    refused_to_save(manager, "closed")
    assert manager.all_steps() == [1] and manager.restore(as_numpy=True)["w"].tolist() == [1, 1, 1]
    manager.close()  # twice is fine
    assert manager.state is ManagerState.CLOSED


def test_read_only_stays_read_only(tmp_path):
    CheckpointManager(tmp_path).close()
    reader = CheckpointManager(tmp_path, read_only=True)
    assert reader.state is ManagerState.READ_ONLY
    refused_to_save(reader, "read_only")
    reader.close()
    assert reader.state is ManagerState.READ_ONLY


def test_superseded_by_a_newer_manager_and_still_so_after_close(tmp_path):
    first = CheckpointManager(tmp_path)
    first.save(1, tree(1))
    second = CheckpointManager(tmp_path)
    assert first.state is ManagerState.SUPERSEDED and second.state is ManagerState.OPEN
    refused_to_save(first, "superseded")
    first.close()
    assert first.state is ManagerState.SUPERSEDED and second.state is ManagerState.OPEN
    second.save(2, tree(2))
    assert first.all_steps() == [1, 2]
    second.close()


def test_a_closed_manager_hands_nothing_over(tmp_path):
    first = CheckpointManager(tmp_path)
    first.close()
    second = CheckpointManager(tmp_path)
    assert first.state is ManagerState.CLOSED and second.state is ManagerState.OPEN
    second.close()


def test_the_managers_options_are_values(tmp_path):
    for bad, fragment in (({"retention": 3}, "retention=3: expected Retention"),
                          ({"save_options": {"durable": False}},
                           "save_options={'durable': False}: expected SaveOptions")):
        with pytest.raises(PskdError) as e:
            CheckpointManager(tmp_path / "x", **bad)
        assert e.value.code == "E9012" and fragment in e.value.message
    assert not (tmp_path / "x").exists()
    manager = CheckpointManager(tmp_path, retention=Retention(keep=1), save_options=SaveOptions(name="Net"))
    assert manager.save_options.digest == "xxh3_128" and manager.digest == "xxh3_128"  # the digest it records
    assert manager.save(1, tree(1)).type_text == "params Net"


def test_a_saves_options_keep_the_managers_durability_and_digest(tmp_path):
    manager = CheckpointManager(tmp_path, save_options=SaveOptions(durable=False))
    with pytest.raises(PskdError) as e:
        manager.save(1, tree(1), options=SaveOptions(finite_only=True))  # durable=True: not this manager's
    assert e.value.code == "E9012" and "durable" in e.value.message
    with pytest.raises(PskdError, match="E9012.*digest='sha256'"):
        manager.save(1, tree(1), options=manager.save_options.replace(digest="sha256"))
    with pytest.raises(PskdError, match="E9012.*expected SaveOptions"):
        manager.save(1, tree(1), options="bf16")  # type: ignore[arg-type]
    result = manager.save(1, tree(1), options=manager.save_options.replace(layout_file=False))
    assert result is not None and result.layout_path is None and list(result.digests) == ["xxh3_128"]
    assert manager.all_steps() == [1]
    manager.close()
