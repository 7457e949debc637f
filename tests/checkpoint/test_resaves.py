"""Re-saves and leftovers (issue class: a listed step must never be lost). A step the index lists is
never claimed under ``leftovers`` once a save is committed, whatever was saved before (another
type, a closed type, no layout file, older steps, steps retention drops); recovery never removes
a listed step — a damaged one is reported (E9013) and its files stay; and a score that is not a
finite real is E9014 naming the step, before anything is written. Run at every place a manager
keeps checkpoints: a local directory, ``memory://`` and a bucket of the loopback S3 server."""

from __future__ import annotations

import decimal
import fractions
import json

import numpy as np
import pytest

from pskd_jax._os.names import step_file, step_layout
from pskd_jax.checkpoint import CheckpointManager, Retention, SaveOptions
from pskd_jax.checkpoint import manager as manager_module
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, load_index, write_index
from pskd_jax.format import tree as tree_lib
from pskd_jax.storage import locate, resolve
from tests.helpers import raises


@pytest.fixture
def place(any_place) -> str:
    return locate(any_place).child("ckpts").url


def params(step: int) -> dict:
    return {"w": np.full((8, 3), step, np.float32), "step": np.int32(step)}


TREES = {  # what a step may be saved as, one after another
    "params": lambda s: params(s),
    "other leaves": lambda s: {"x": np.arange(s + 2, dtype=np.int16)},
    "closed tuple": lambda s: (np.full(3, float(s)), np.arange(2, dtype=np.uint8)),
    "closed array": lambda s: np.full(4, float(s)),
    "no layout file": lambda s: params(s),
}


def _values(tree) -> list[np.ndarray]:
    return [np.asarray(value) for _, value in tree_lib.flatten(tree)[0]]


def _index(place: str) -> dict:
    store, where = resolve(locate(place).child(INDEX))
    return json.loads(store.get(where.key)[0])


def _names(place: str) -> set[str]:
    store, where = resolve(place)
    return {info.key.rpartition("/")[2] for info in store.list(where.key)}


def _damage(place: str, name: str) -> None:
    store, where = resolve(locate(place).child(name))
    data = bytearray(store.get(where.key)[0])
    data[-1] ^= 0x21
    store.put(where.key, bytes(data))


def _no_listed_step_claimed(place: str) -> None:
    content = _index(place)
    listed = {entry["step"] for entry in content["checkpoints"]}
    assert not listed & set(content["leftovers"]), content


def _save(manager: CheckpointManager, step: int, kind: str):
    options = SaveOptions(layout_file=False) if kind == "no layout file" else None
    return manager.save(step, TREES[kind](step), options=options)


@pytest.mark.parametrize("first", list(TREES))
@pytest.mark.parametrize("then", list(TREES))
def test_a_resave_as_another_type_is_listed_and_unclaimed(place, first, then):
    with CheckpointManager(place) as manager:
        _save(manager, 1, first)
        _save(manager, 2, first)
        _save(manager, 1, then)  # an existing step again, after a newer one
        _no_listed_step_claimed(place)
        assert manager.all_steps() == [1, 2]
        expected = TREES[then](1)
        back = manager.restore(1, target=expected)
        for got, want in zip(_values(back), _values(expected), strict=True):
            np.testing.assert_array_equal(got, want)
        entry = next(e for e in load_index(CheckpointDirectory.of(place)).entries if e.step == 1)
        assert (step_layout(1) in _names(place)) == (entry.layout_name is not None)
    # later damage of the re-saved step is reported, never answered by deleting the step
    _damage(place, step_file(1))
    with CheckpointManager(place) as reopened:
        assert reopened.all_steps() == [1, 2]
        with raises("E9013", step_file(1)):
            reopened.restore(1, target=TREES[then](1))
    assert step_file(1) in _names(place)


def test_resaves_after_older_steps_and_with_pruning(place):
    with CheckpointManager(place, retention=Retention(keep=2)) as manager:
        for step in (1, 2, 3):
            manager.save(step, params(step))
            _no_listed_step_claimed(place)
        manager.save(3, params(30))  # the newest again
        manager.save(2, {"x": np.arange(3)})  # an older listed one, as another tree
        _no_listed_step_claimed(place)
        assert manager.all_steps() == [2, 3]
        manager.save(1, params(1))  # older than the kept ones: retention drops it at once
        _no_listed_step_claimed(place)
        assert manager.all_steps() == [2, 3] and step_file(1) not in _names(place)
        assert int(manager.restore(3, params(0))["step"]) == 30


def test_a_listed_step_claimed_and_damaged_is_reported_not_deleted(place):
    """What a re-save cut short after its file was replaced leaves — the entry, a claim on its
    step, a file whose digest is no longer the recorded one — is reported by restore and verify;
    the next open drops the claim and removes nothing of the step."""
    with CheckpointManager(place) as manager:
        manager.save(1, params(1))
        manager.save(2, params(2))
    directory = CheckpointDirectory.of(place)
    index = load_index(directory)
    write_index(directory, index.entries, leftovers=[1, 2], durable=False, over=index)
    _damage(place, step_file(2))
    before = _names(place)
    with CheckpointManager(place) as manager:
        assert manager.all_steps() == [1, 2]
        with raises("E9013", step_file(2)):
            manager.restore(2, params(0))
        with raises("E9013", step_file(2)):
            manager.verify()
        assert int(manager.restore(1, params(0))["step"]) == 1
    assert _names(place) == before and _index(place)["leftovers"] == []
    with CheckpointManager(place) as manager:  # the step can be saved again
        manager.save(2, params(22))
        assert int(manager.restore(2, params(0))["step"]) == 22


def test_a_resave_cut_short_keeps_the_step_listed(place, monkeypatch):
    with CheckpointManager(place) as manager:
        manager.save(1, params(1))
    real = manager_module.save

    def cut(path, tree, **options):
        real(path, tree, **options)
        raise KeyboardInterrupt  # after the file, before the index

    monkeypatch.setattr(manager_module, "save", cut)
    manager = CheckpointManager(place)
    with pytest.raises(KeyboardInterrupt):
        manager.save(1, {"x": np.arange(5)})
    manager.close()
    monkeypatch.setattr(manager_module, "save", real)
    with CheckpointManager(place) as reopened:
        assert reopened.all_steps() == [1]
        with raises("E9013", step_file(1)):
            reopened.restore(1, {"x": np.zeros(5, np.int64)})
        with raises("E9013", step_file(1)):
            reopened.verify()
        assert reopened.restore(1, {"x": np.zeros(5, np.int64)}, verify=False)["x"].tolist() == [0, 1, 2, 3, 4]
    assert step_file(1) in _names(place)


BAD_SCORES = [10**400, float("nan"), float("inf"), -float("inf"), np.float64("nan"), np.float32("inf"), "0.5", True,
              fractions.Fraction(10**400), decimal.Decimal("0.5"), [0.5], np.array([0.5]), complex(1, 0)]


@pytest.mark.parametrize("score", BAD_SCORES, ids=lambda v: type(v).__name__ + ":" + str(v)[:12])
def test_a_score_that_is_not_a_finite_real_is_e9014_naming_the_step(place, score):
    policy = Retention(keep=1, best_fn=lambda metrics: metrics["loss"], best_mode="min", keep_best=1)
    with CheckpointManager(place, retention=policy) as manager:
        manager.save(1, params(1), metrics={"loss": 0.5})
        with raises("E9014", "step 7", "best_fn"):
            manager.save(7, params(7), metrics={"loss": score})
        with raises("E9014", "step 8"):
            manager.save_async(8, params(8), metrics={"loss": score})
        assert manager.all_steps() == [1] and manager.best_step() == 1
    assert step_file(7) not in _names(place) and _index(place)["leftovers"] == []


def test_finite_scores_of_every_real_kind_are_kept():
    policy = Retention(best_fn=lambda metrics: metrics, best_mode="max")
    for value, expected in ((np.float32(0.25), 0.25), (np.int64(3), 3.0), (fractions.Fraction(1, 4), 0.25),
                            (10**300, 1e300), (np.array(0.5), 0.5), (None, None)):
        assert policy.score(1, value) == expected
