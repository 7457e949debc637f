"""A restore of a checkpoint that another writer saves again meanwhile gives back the old checkpoint
whole or the new one whole (or E9005 saying it was saved again while read), never the key paths of
one save with the values of the other. The two saves have the same header and size (the same
leaves in another order), so nothing in the files themselves tells them apart: each test stops a
restore at the moment a save changes the pair under it, by hooks, so that the interleaving is the
same on every run (no timing)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pskd_jax.checkpoint.read_plan as read_plan
import pskd_jax.format.layout_file as layout_file
from pskd_jax import checkpoint as ck
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.restoring import read_saved_leaves
from pskd_jax.errors import MismatchError
from pskd_jax.format.one_save import ATTEMPTS
from tests.checkpoint.commit_window import read_inside_a_commit_window
from tests.helpers import raises

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


# --- a layout file the caller gives: looked up by it, or made by hand -----------------------------------


def test_a_layout_the_caller_found_is_found_again_after_a_save_as_the_restores_own(tmp_path):
    # find_layout_file proved the layout to belong to the old data file; a save of the new tree
    # (same header and size, another file) lands before the restore. The restore looked the pair
    # up again only for a layout it found itself (E9005 for the caller's); a layout made or read
    # by hand is still used as given, and refused.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    found = ck.find_layout_file(path)
    assert found is not None and found.looked_up is not None
    ck.save(path, NEW)
    for restore in (lambda layout: ck.restore(path, layout=layout, as_numpy=True),
                    lambda layout: ck.restore(path, TEMPLATE, layout=layout, as_numpy=True),
                    lambda layout: {p[2:-2]: v for p, v in read_saved_leaves(path, layout=layout)[0]}):
        assert as_lists(restore(found)) == as_lists(NEW)
        with raises("E9005", str(path), "saved again"):
            restore(dataclasses.replace(found, looked_up=None))


THROUGH = {  # each restore through the layout file it is given
    "as saved": lambda path, layout: ck.restore(path, layout=layout, as_numpy=True),
    "into a target": lambda path, layout: ck.restore(path, TEMPLATE, layout=layout, as_numpy=True),
    "zero copy": lambda path, layout: ck.restore(path, layout=layout, zero_copy=True),
    "for a conversion": lambda path, layout: {p[2:-2]: v for p, v in read_saved_leaves(path, layout=layout)[0]},
}


@pytest.mark.parametrize("how", list(THROUGH))
def test_a_save_inside_a_restore_through_the_callers_layout_has_it_found_again(tmp_path, monkeypatch, how):
    # The restore has opened the old data and checks the caller's layout (found for the old data)
    # against it when a whole save of the new tree lands; its next attempt opens the new data, for
    # which the caller's layout is another save's: it is looked up again (it was E9005), and the
    # new checkpoint restored whole.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    found = ck.find_layout_file(path)
    real = read_plan._check
    saved = []

    def then_saved_again(reader, layout):
        if not saved:
            saved.append(ck.save(path, NEW))
        return real(reader, layout)

    monkeypatch.setattr(read_plan, "_check", then_saved_again)
    back = THROUGH[how](path, found)
    assert saved  # (the hook ran: the save did land inside the restore)
    assert as_lists(back) == as_lists(NEW)


def test_a_layout_the_caller_found_for_an_object_is_found_again_after_a_save():
    # The same for an object of a store: the caller's layout records the version it was put for.
    url = "memory://restore-during-save/found-again/c.psk.d"
    ck.save(url, OLD)
    found = ck.find_layout_file(url)
    ck.save(url, NEW)
    assert as_lists(ck.restore(url, layout=found, as_numpy=True)) == as_lists(NEW)
    with raises("E9005", url, "saved again"):
        ck.restore(url, layout=dataclasses.replace(found, looked_up=None), as_numpy=True)


def test_a_layout_read_for_its_data_with_a_digest_is_read_again_with_that_digest(tmp_path):
    # read_layout_file(…, data=, xxh3_128=) remembers its look-up, digest included: the same bytes
    # saved again (another file) are restored through the layout read again; another save's data,
    # whose layout records another digest, is refused, naming both digests.
    path = tmp_path / "c.psk.d"
    digest = ck.save(path, OLD, ck.SaveOptions(digest="xxh3_128")).digests["xxh3_128"]
    given = ck.read_layout_file(layout_path_for(str(path)), data=path, xxh3_128=digest)
    assert given.looked_up == (str(path), layout_path_for(str(path)), digest)
    ck.save(path, OLD, ck.SaveOptions(digest="xxh3_128"))  # (the same bytes, another file)
    assert as_lists(ck.restore(path, layout=given, as_numpy=True)) == as_lists(OLD)
    new_digest = ck.save(path, NEW, ck.SaveOptions(digest="xxh3_128")).digests["xxh3_128"]
    with raises("E9005", str(path), digest, new_digest):
        ck.restore(path, layout=given, as_numpy=True)


def test_a_restore_through_a_layout_found_inside_a_commit_window_gives_one_save(tmp_path, monkeypatch):
    # The caller's find_layout_file runs inside a writer's commit window (its layout renamed into
    # place, its data not yet); the writer commits before the restore reads a byte. The restore
    # gives the old checkpoint whole or the new one whole, never E9005 for a layout of the old data.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)

    def found_then_restored():
        found = ck.find_layout_file(path)
        return found, lambda: ck.restore(path, layout=found, as_numpy=True)

    found, restore = read_inside_a_commit_window(monkeypatch, path, NEW, found_then_restored)
    assert_one_save(restore())  # (the writer has committed: the data there is the new save's)
    monkeypatch.undo()
    assert as_lists(restore()) == as_lists(NEW)


def test_a_layout_the_caller_found_and_saved_again_at_every_look_up_is_e9005(tmp_path, monkeypatch):
    # A writer that lands a save after every look-up of the caller's layout: the restore gives up
    # after one_save's ATTEMPTS, saying so, as for a layout it looks up itself.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    found = ck.find_layout_file(path)
    ck.save(path, NEW)
    real = layout_file.layout_beside  # (the look-up made again: one look-up, inside the restore's loop)
    trees, looks = [OLD, NEW], []

    def saved_again_after_each(*args, **kwargs):
        got = real(*args, **kwargs)
        looks.append(got)
        trees.reverse()
        ck.save(path, trees[0])
        return got

    monkeypatch.setattr(layout_file, "layout_beside", saved_again_after_each)
    with raises("E9005", str(path), "saved again", f"{ATTEMPTS} times running"):
        ck.restore(path, layout=found, as_numpy=True)
    assert len(looks) == ATTEMPTS  # (looked up again after each attempt, the first through the caller's)


@pytest.mark.parametrize("spelling", ["absolute", "dot", "link", "hard link"])
def test_a_layout_found_for_one_spelling_of_the_path_is_never_mixed_with_a_save_read_by_another(
        tmp_path, monkeypatch, spelling):
    # The layout was proven against the file at "c.psk.d"; the restore names the same place
    # another way. A save between the two lands a new file there: the restore gives the new save
    # whole (the layout looked up again) or, for a layout not looked up, E9005; never the old key
    # paths with the new values.
    monkeypatch.chdir(tmp_path)
    ck.save("c.psk.d", OLD)
    found = ck.find_layout_file("c.psk.d")
    assert found is not None
    ck.save("c.psk.d", NEW)
    if spelling == "link":
        (tmp_path / "l.psk.d").symlink_to(tmp_path / "c.psk.d")
    elif spelling == "hard link":
        (tmp_path / "h.psk.d").hardlink_to(tmp_path / "c.psk.d")
    other = {"absolute": str(tmp_path / "c.psk.d"), "dot": "./c.psk.d", "link": "l.psk.d",
             "hard link": "h.psk.d"}[spelling]
    for layout in (found, dataclasses.replace(found, looked_up=None)):
        try:
            back = ck.restore(other, layout=layout, as_numpy=True)
        except MismatchError as e:
            assert e.code == "E9005", e
            continue
        assert as_lists(back) == as_lists(NEW)
