"""A restore of a checkpoint that another writer saves again meanwhile gives back the old checkpoint
whole or the new one whole (or E9005 saying it was saved again while read), never the key paths of
one save with the values of the other. The two saves have the same header and size (the same
leaves in another order), so nothing in the files themselves tells them apart: each test stops a
restore at the moment a save changes the pair under it, by hooks, so that the interleaving is the
same on every run (no timing)."""

from __future__ import annotations

import numpy as np
import pytest

import pskd_jax.checkpoint.read_plan as read_plan
from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint.restoring import read_saved_leaves
from pskd_jax.errors import MismatchError
from tests.checkpoint.commit_window import read_inside_a_commit_window

OLD = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
NEW = {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)}  # (its leaves stored b first)
TEMPLATE = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}

RESTORES = {
    "as saved": lambda path: ck.restore(path, as_numpy=True),
    "into a target": lambda path: ck.restore(path, TEMPLATE, as_numpy=True),
    "zero copy": lambda path: ck.restore(path, zero_copy=True),
    "for a conversion": lambda path: {p[2:-2]: v for p, v in read_saved_leaves(path)[0]},  # (p: "['a']")
}


def as_lists(tree) -> dict:
    return {key: np.asarray(value).tolist() for key, value in tree.items()}


def assert_one_save(back) -> None:
    """The old checkpoint or the new one, each leaf under its own key path."""
    assert as_lists(back) in (as_lists(OLD), as_lists(NEW)), as_lists(back)


@pytest.mark.parametrize("how", list(RESTORES))
def test_a_save_between_the_layout_read_and_the_data_read_is_never_mixed_in(tmp_path, monkeypatch, how):
    # The restore has read the old layout file (a, then b); a whole save of the new tree (b, then a)
    # lands before it reads a byte of data. Reading the data again by its path would give the old
    # key paths the new values ({'a': [2, 2, 2], 'b': [3, 3, 3]}).
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    real = read_plan.layout_beside
    saved = []

    def then_saved_again(*args, **kwargs):
        found = real(*args, **kwargs)
        if not saved:
            saved.append(ck.save(path, NEW))
        return found

    monkeypatch.setattr(read_plan, "layout_beside", then_saved_again)
    back = RESTORES[how](path)
    assert saved  # (the hook ran: the save did land inside the restore)
    assert_one_save(back)
    monkeypatch.undo()
    assert as_lists(RESTORES[how](path)) == as_lists(NEW)


@pytest.mark.parametrize("how", list(RESTORES))
def test_a_restore_inside_a_commit_window_never_pairs_the_new_layout_with_the_old_data(tmp_path, monkeypatch,
                                                                                      how):
    # A writer in another thread commits the new save: its layout file is renamed into place, its
    # data not yet. The restore looked for a cut-short commit just before the writer marked its
    # lock file, so it finds none, and reads the new layout file, which passes every check against
    # the old data (same header and size). Reading that data would give the new key paths the old
    # values ({'b': [0, 0, 0], 'a': [1, 1, 1]}). The writer finishes once the restore has returned,
    # or as soon as the restore looks at the commit again, by either name (it then waits for the
    # writer, whose lock is held).
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    back = read_inside_a_commit_window(monkeypatch, path, NEW, lambda: RESTORES[how](path))
    assert_one_save(back)
    monkeypatch.undo()
    assert as_lists(RESTORES[how](path)) == as_lists(NEW)


def test_a_checkpoint_saved_again_at_every_attempt_is_e9005_never_a_mix(tmp_path, monkeypatch):
    # A writer that lands a save inside every attempt: the restore gives up, saying so.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    real = read_plan.layout_beside
    trees = [OLD, NEW]

    def saved_again_every_time(*args, **kwargs):
        found = real(*args, **kwargs)
        trees.reverse()
        ck.save(path, trees[0])
        return found

    monkeypatch.setattr(read_plan, "layout_beside", saved_again_every_time)
    with pytest.raises(MismatchError) as e:
        ck.restore(path, as_numpy=True)
    assert e.value.code == "E9005" and str(path) in e.value.message and "saved again" in e.value.message
