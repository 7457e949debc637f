"""``info``, ``export`` and ``diff`` of a checkpoint that another writer saves again meanwhile show
the old checkpoint whole or the new one whole (or E9005 saying it was saved again), never the key
paths of one save with the values of the other. The two saves have the same header and size (the
same leaves in another order), so nothing in the files themselves tells them apart: each test stops
the layout look-up (``find_layout_file``, as the commands do it) at the moment a save changes the
pair under it, by hooks, so that the interleaving is the same on every run (no timing). (Restore:
tests/checkpoint/test_restore_during_save.py; a bucket: tests/checkpoint/test_stored_resaves.py.)"""

from __future__ import annotations

import ast
import dataclasses
import json
import os

import numpy as np
import pytest

import pskd_jax.format.layout_file as layout_file
from pskd_jax import checkpoint as ck
from pskd_jax import data
from pskd_jax.format.reader import Reader
from tests.checkpoint.commit_window import read_inside_a_commit_window
from tests.helpers import raises

OLD = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
NEW = {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)}  # (its leaves stored b first)


def as_lists(tree) -> dict:
    return {key: np.asarray(value).tolist() for key, value in tree.items()}


def shown_by_info(path) -> dict:
    last = data.info_lines(str(path), layout=ck.find_layout_file(path), values=True)[-1]
    assert last.startswith("[0] ")
    return ast.literal_eval(last[4:])


def shown_by_export(path) -> dict:
    out = os.path.join(os.path.dirname(path), "out.json")
    data.export_json(str(path), out, layout=ck.find_layout_file(path))
    with open(out, encoding="utf-8") as f:
        return json.load(f)["samples"][0]


def shown_by_diff(path) -> dict:
    # Compared with a copy of OLD: 0 for the old checkpoint whole, 30 (3² · 3 + 1² · 3) for the new
    # one whole; a mix (old key paths, new values) would be 24.
    reference = os.path.join(os.path.dirname(path), "reference.psk.d")
    if not os.path.exists(reference):
        ck.save(reference, OLD)
    distance = data.diff(reference, str(path), layout_a=ck.find_layout_file(reference),
                         layout_b=ck.find_layout_file(path))
    squared = round(distance.diff_norm ** 2, 6)
    assert squared in (0, 30), squared
    return as_lists(OLD) if squared == 0 else as_lists(NEW)


SHOWS = {"info": shown_by_info, "export": shown_by_export, "diff": shown_by_diff}


def assert_one_save(shown) -> None:
    """The old checkpoint or the new one, each leaf under its own key path."""
    assert as_lists(shown) in (as_lists(OLD), as_lists(NEW)), as_lists(shown)


@pytest.mark.parametrize("how", list(SHOWS))
def test_a_save_while_the_layout_is_proven_is_never_mixed_in(tmp_path, monkeypatch, how):
    # The look-up has read the old layout file (a, then b) and proves it against the data file by
    # its path: a whole save of the new tree (b, then a) lands just before. The proof passes (same
    # header and size), and the reader then opens the new data: old key paths, new values.
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    real = layout_file.check_belongs
    saved = []

    def saved_again_first(found, data_path, **kwargs):
        if not saved and os.fspath(data_path) == str(path):
            saved.append(True)  # (first: the save's own checks come here too)
            ck.save(path, NEW)
        return real(found, data_path, **kwargs)

    monkeypatch.setattr(layout_file, "check_belongs", saved_again_first)
    shown = SHOWS[how](path)
    assert saved  # (the hook ran: the save did land inside the look-up)
    assert_one_save(shown)
    monkeypatch.undo()
    assert as_lists(SHOWS[how](path)) == as_lists(NEW)


@pytest.mark.parametrize("how", list(SHOWS))
def test_a_look_up_inside_a_commit_window_never_pairs_the_new_layout_with_the_old_data(tmp_path, monkeypatch, how):
    # A writer in another thread commits the new save: its layout file is renamed into place, its
    # data not yet. The look-up found no cut-short commit just before the writer marked its lock
    # file, and reads the new layout file, which passes every check against the old data (same
    # header and size): new key paths, old values. The writer finishes once the command has
    # returned, or as soon as the look-up looks at the commit again (it then waits for the writer).
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    if how == "diff":
        shown_by_diff(path)  # (its reference saved before the hooks)
    shown = read_inside_a_commit_window(monkeypatch, path, NEW, lambda: SHOWS[how](path))
    assert_one_save(shown)
    monkeypatch.undo()
    assert as_lists(SHOWS[how](path)) == as_lists(NEW)


def exported_through(path, layout) -> dict:
    out = os.path.join(os.path.dirname(path), "out.json")
    data.export_json(str(path), out, layout=layout)
    with open(out, encoding="utf-8") as f:
        return json.load(f)["samples"][0]


def diffed_through(path, layout) -> dict:
    # Compared with a copy of NEW: 0 for the new checkpoint whole (the old one: 30; a mix: 6)
    reference = os.path.join(os.path.dirname(path), "new.psk.d")
    distance = data.diff(reference, str(path), layout_a=ck.find_layout_file(reference), layout_b=layout)
    assert distance.diff_norm == 0, distance
    return as_lists(NEW)


SHOWN_THROUGH = {  # each read-only function through the layout it is given, what it shows
    "info": lambda path, layout: ast.literal_eval(data.info_lines(str(path), layout=layout, values=True)[-1][4:]),
    "export": exported_through,
    "diff": diffed_through,
}


@pytest.mark.parametrize("how", list(SHOWN_THROUGH))
def test_a_layout_looked_up_before_a_save_is_looked_up_again_for_the_new_data(tmp_path, how):
    # The layout was proven to belong to the old data file; the new save's data has the same header
    # and size, but is another file: the library looks the pair up again, as the commands do, and
    # shows the new checkpoint whole. The look-up is what is made again: a layout file that does not
    # remember one is refused (E9005, as for an object of another version), as a reader refuses it.
    path = tmp_path / "c.psk.d"
    ck.save(tmp_path / "new.psk.d", NEW)
    ck.save(path, OLD)
    old_layout = ck.find_layout_file(path)
    ck.save(path, NEW)
    assert as_lists(SHOWN_THROUGH[how](path, old_layout)) == as_lists(NEW)
    with Reader(path) as reader, raises("E9005", str(path), "saved again"):
        reader.with_layout(old_layout)
    (tmp_path / "out.json").unlink(missing_ok=True)
    with raises("E9005", str(path), "saved again"):
        SHOWN_THROUGH[how](path, dataclasses.replace(old_layout, looked_up=None))
    assert not (tmp_path / "out.json").exists()


def test_a_checkpoint_saved_again_at_every_look_up_is_e9005_never_a_mix(tmp_path, monkeypatch):
    path = tmp_path / "c.psk.d"
    ck.save(path, OLD)
    real = layout_file.check_belongs
    trees, saving = [OLD, NEW], []

    def saved_again_every_time(found, data_path, **kwargs):
        if not saving:  # (the save's own checks come here too)
            saving.append(True)
            trees.reverse()
            ck.save(path, trees[0])
            saving.clear()
        return real(found, data_path, **kwargs)

    monkeypatch.setattr(layout_file, "check_belongs", saved_again_every_time)
    with raises("E9005", str(path), "saved again while its layout file was read"):
        shown_by_info(path)
