"""Tidying a corpus directory after a build: killed writers' temporary files and earlier builds'
shards go, in one listing of the directory however many there are; nothing else does."""

from __future__ import annotations

import fcntl
import os

from pskd_jax._os import names
from pskd_jax.corpus import publisher


def _temporaries(directory, count):
    made = []
    for k in range(count):
        name = names.temporary_prefix(names.shard_name(k)) + f"{k:08d}"[-8:] + ".tmp"
        (directory / name).write_bytes(b"torn")
        made.append(str(directory / name))
    return made


def test_killed_writers_go_in_one_listing_and_a_live_writers_file_stays(tmp_path, monkeypatch):
    made = _temporaries(tmp_path, 40)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".notes.txt.abcdefgh.tmp").write_text("mine too: no shard's")
    live = os.open(made[7], os.O_RDONLY)
    fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (a writer running now holds its file's lock)
    listings = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": listings.append(path) or real(path))
    try:
        removed = publisher.remove_stale_shards(str(tmp_path), keep={names.shard_name(0)},
                                                owned={names.shard_name(k) for k in range(3)})
    finally:
        os.close(live)
    assert len(listings) == 1
    assert sorted(removed) == sorted(p for p in made if p != made[7])
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(made[7]), "notes.txt", ".notes.txt.abcdefgh.tmp"])


def test_stale_shards_owned_and_unlisted_go_others_stay(tmp_path):
    for k in range(4):
        (tmp_path / names.shard_name(k)).write_bytes(b"x")
    (tmp_path / names.shard_name(5)).mkdir()
    removed = publisher.remove_stale_shards(str(tmp_path), keep={names.shard_name(0)},
                                            owned={names.shard_name(k) for k in (0, 1, 2, 5)})
    assert sorted(os.path.basename(p) for p in removed) == [names.shard_name(1), names.shard_name(2)]
    assert sorted(os.listdir(tmp_path)) == [names.shard_name(k) for k in (0, 3, 5)]
