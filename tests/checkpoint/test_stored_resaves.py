"""A restore of a checkpoint in a bucket that another writer saves again meanwhile gives back the old
checkpoint whole or the new one whole (or E9005 saying it was saved again while read), never the key
paths of one save with the values of the other. The two saves have the same header and size (the
same leaves in another order), so only the version tag the layout object records of its data tells
them apart. Each test stops the second save between its data put and its layout put, by hooks, so
that the interleaving is the same on every run (no timing). A save by several processes (a parts
index at the key, its layout beside it) is held the same way, between the first of those two puts
and the second: whichever order they come in, a restore there sees one save whole or E9005. (A
local file: test_restore_during_save.)"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import pskd_jax.checkpoint.restoring as restoring
from pskd_jax import checkpoint as ck
from pskd_jax import data
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.parts import parts_index_at
from pskd_jax.checkpoint.restoring import read_saved_leaves
from pskd_jax.errors import MismatchError
from pskd_jax.storage import locate, resolve
from tests.helpers import raises

OLD = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32)}
NEW = {"b": np.full(3, 2, np.float32), "a": np.full(3, 3, np.float32)}  # (its leaves stored b first)
TEMPLATE = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
WAIT = 60  # seconds a hook waits for the other side before letting go (a guard against a hang only)

RESTORES = {
    "as saved": lambda url: ck.restore(url, as_numpy=True),
    "into a target": lambda url: ck.restore(url, TEMPLATE, as_numpy=True),
    "for a conversion": lambda url: {p[2:-2]: v for p, v in read_saved_leaves(url)[0]},  # (p: "['a']")
}
# What each restore opens the checkpoint with, once an attempt: the hook counts the attempts
OPENERS = {"as saved": "StoredFile", "into a target": "StoredFile", "for a conversion": "Reader"}
# One object and its layout, or (one JAX process of a multi-process save) a part, the parts index
# at the key and the layout: what a save by several processes to a bucket writes
SAVERS = {"one object": ck.save, "parts": save_distributed}


def saved_old(url: str, saver: str) -> None:
    """OLD saved at ``url`` by ``saver``: a parts index at the key for "parts", else the object."""
    SAVERS[saver](url, OLD)
    store, where = resolve(url)
    assert (parts_index_at(store, where.key, url) is not None) == (saver == "parts")


def as_lists(tree) -> dict:
    return {key: np.asarray(value).tolist() for key, value in tree.items()}


class HeldSave:
    """A save of NEW at ``url`` on a thread of its own (by ``save``), held between its data put and
    its layout put until :meth:`finish` (or forever, for a save cut off there: never finished): after
    the first of its puts at the checkpoint's key and at its layout's, whichever comes first."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch, save=ck.save):
        store, where = resolve(url)
        self.save = save
        self.data_put, self.go_on, self.done = threading.Event(), threading.Event(), threading.Event()
        real_put = type(store).put
        held = {where.key, layout_path_for(where.key)}

        def held_put(this, key, *args, **kwargs):
            info = real_put(this, key, *args, **kwargs)
            if key in held and threading.current_thread() is self.thread and not self.data_put.is_set():
                self.data_put.set()
                assert self.go_on.wait(WAIT)
            return info

        monkeypatch.setattr(type(store), "put", held_put)
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._save, args=(url,))
        self.thread.start()
        assert self.data_put.wait(WAIT)  # (the new data is there, the old layout still beside it)

    def _save(self, url: str) -> None:
        try:
            self.save(url, NEW)
        except BaseException as e:
            self.errors.append(e)
        finally:
            self.done.set()

    def finish(self) -> None:
        self.go_on.set()
        self.thread.join(WAIT)
        assert not self.errors, self.errors


def finished_on_retry(monkeypatch: pytest.MonkeyPatch, opener: str, save: HeldSave) -> list[int]:
    """Lets the held save put its layout when the restore opens the checkpoint a second time (it
    found the old layout beside the new data, and reads the pair again); the attempts counted."""
    real = getattr(restoring, opener)
    attempts = [0]

    def counted(*args, **kwargs):
        attempts[0] += 1
        if attempts[0] == 2:
            save.finish()
        return real(*args, **kwargs)

    monkeypatch.setattr(restoring, opener, counted)
    return attempts


@pytest.mark.parametrize("saver", list(SAVERS))
@pytest.mark.parametrize("how", list(RESTORES))
def test_a_restore_between_a_saves_data_and_its_layout_reads_the_new_pair_whole(object_place, monkeypatch, how,
                                                                                saver):
    # The old layout (a, then b) beside the new data (b, then a): the same header and size, so
    # without the version the layout records, the old key paths get the new values
    # ({'a': [2, 2, 2], 'b': [3, 3, 3]}). (A parts save that put its layout before its index: the
    # new layout beside the old index, the new key paths with the old values.)
    url = locate(object_place).child("c.psk.d").url
    saved_old(url, saver)
    save = HeldSave(url, monkeypatch, SAVERS[saver])
    try:
        attempts = finished_on_retry(monkeypatch, OPENERS[how], save)
        back = RESTORES[how](url)
    finally:
        save.finish()
    assert as_lists(back) == as_lists(NEW)
    assert attempts[0] == 2  # (the old layout was found, and refused, once)


@pytest.mark.parametrize("saver", list(SAVERS))
@pytest.mark.parametrize("how", list(RESTORES))
def test_a_save_cut_off_between_its_data_and_its_layout_is_never_read_as_a_mix(object_place, monkeypatch, how,
                                                                              saver):
    url = locate(object_place).child("c.psk.d").url
    saved_old(url, saver)
    save = HeldSave(url, monkeypatch, SAVERS[saver])  # (never let go while the restore runs: as if cut off)
    try:
        with raises("E9005", url, "saved again while this restore read it", "cut off"):
            RESTORES[how](url)
    finally:
        save.finish()
    assert as_lists(RESTORES[how](url)) == as_lists(NEW)  # (its layout put: the new pair, whole)


def test_the_read_only_commands_never_show_the_old_layout_with_the_new_data(object_place, monkeypatch, tmp_path):
    # `pskd info`, `export` and `diff` look the layout up (find_layout_file) and read the data
    # through a reader of their own: each proves the layout is of the version it reads.
    url = locate(object_place).child("c.psk.d").url
    ck.save(url, OLD)
    other = locate(object_place).child("other.psk.d").url
    ck.save(other, OLD)
    old_layout = ck.find_layout_file(url)
    save = HeldSave(url, monkeypatch)
    try:  # (the look-up is made again, and meets the held save each time: E9005, never a mix)
        with raises("E9005", url, "saved again while its layout file was read"):
            ck.find_layout_file(url)
        for show in (lambda: data.info_lines(url, layout=old_layout, values=True),
                     lambda: data.export_json(url, str(tmp_path / "out.json"), layout=old_layout),
                     lambda: data.diff(other, url, layout_a=ck.find_layout_file(other), layout_b=old_layout)):
            with pytest.raises(MismatchError, match="saved again while"):
                show()
        assert not (tmp_path / "out.json").exists()
    finally:
        save.finish()
    assert data.diff(other, url, layout_a=ck.find_layout_file(other), layout_b=ck.find_layout_file(url)).diff_norm > 0


def test_a_layout_of_an_earlier_version_without_a_recorded_tag_still_restores(object_place):
    # (layouts written before the version was recorded: the header and size check, as before)
    url = locate(object_place).child("c.psk.d").url
    ck.save(url, OLD)
    store, where = resolve(url)
    layout_key = layout_path_for(where.key)
    content = json.loads(store.get(layout_key)[0])
    assert content["data"]["url"] == url and content["data"]["tag"] == store.info(where.key).tag
    del content["data"]["url"], content["data"]["tag"]
    store.put(layout_key, json.dumps(content).encode())
    assert as_lists(ck.restore(url, as_numpy=True)) == as_lists(OLD)
    store.put(where.key, store.get(where.key)[0])  # (put again: another version, the same bytes)
    assert as_lists(ck.restore(url, TEMPLATE, as_numpy=True)) == as_lists(OLD)


def test_a_store_that_answers_a_put_with_no_tag_records_none(object_place, monkeypatch):
    """A put answered without an ETag or version: no made-up tag is recorded (it would match no
    read, and refuse every restore); the layout keeps the header and size check."""
    url = locate(object_place).child("c.psk.d").url
    store, where = resolve(url)
    real_put = type(store).put

    def tagless_put(self, key, data, **options):
        info = real_put(self, key, data, **options)
        return type(info)(info.key, info.size, "")

    monkeypatch.setattr(type(store), "put", tagless_put)
    ck.save(url, OLD)
    monkeypatch.undo()
    content = json.loads(store.get(layout_path_for(where.key))[0])
    assert "tag" not in content["data"] and "url" not in content["data"]
    assert as_lists(ck.restore(url, as_numpy=True)) == as_lists(OLD)


def test_a_layout_given_is_looked_up_again_inside_the_readers_one_loop(object_place, monkeypatch, tmp_path):
    # A reader given a layout it looked up (a restore, export) that meets a save reads the pair
    # again in its own loop; the look-up made again there is one look-up, not a loop of its own
    # (which multiplied the reads and the pauses: up to 8 × 8 and seconds before E9005).
    import pskd_jax.data.export as export
    import pskd_jax.format.layout_file as layout_file
    import pskd_jax.format.one_save as one_save

    url = locate(object_place).child("c.psk.d").url
    ck.save(url, OLD)
    old_layout = ck.find_layout_file(url)
    depth, deepest, pauses = [0], [0], []

    def counted_loop(*args, **kwargs):
        depth[0] += 1
        deepest[0] = max(deepest[0], depth[0])
        try:
            return one_save.until_one_save(*args, **kwargs)
        finally:
            depth[0] -= 1

    for module in (export, restoring, layout_file):
        monkeypatch.setattr(module, "until_one_save", counted_loop)
    monkeypatch.setattr(one_save.time, "sleep", pauses.append)
    save = HeldSave(url, monkeypatch)
    try:
        for read in (lambda: data.export_json(url, str(tmp_path / "out.json"), layout=old_layout),
                     lambda: ck.restore(url, layout=old_layout, as_numpy=True)):
            deepest[0], pauses[:] = 0, []
            with pytest.raises(MismatchError, match="saved again while"):
                read()
            assert deepest[0] == 1
            assert len(pauses) == one_save.ATTEMPTS - 1
    finally:
        save.finish()
    assert as_lists(ck.restore(url, layout=old_layout, as_numpy=True)) == as_lists(NEW)
