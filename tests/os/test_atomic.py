"""Atomic output (pskd_jax._os.atomic): the destination holds the old content until a clean exit and
the new content after it, never a part; a failure leaves no temporary file; a killed writer's
temporary file is removed by the next writer of the same destination, a live writer's never."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from pskd_jax._os import atomic, locks, names
from pskd_jax.errors import TruncatedError
from tests.helpers import raises


def test_the_destination_changes_only_on_a_clean_exit(tmp_path):
    destination = tmp_path / "out.bin"
    destination.write_bytes(b"old")
    with atomic.atomic_output(str(destination)) as f:
        f.write(b"new ")
        f.flush()
        assert destination.read_bytes() == b"old"
        temporaries = [n for n in os.listdir(tmp_path) if n != "out.bin"]
        assert len(temporaries) == 1 and names.temporary_pattern("out.bin").fullmatch(temporaries[0])
        f.write(b"content")
    assert destination.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_new_destination(tmp_path, durable):
    with atomic.atomic_output(str(tmp_path / "new.bin"), durable=durable) as f:
        f.write(b"x" * 100_000)
    assert (tmp_path / "new.bin").read_bytes() == b"x" * 100_000
    assert os.listdir(tmp_path) == ["new.bin"]


def test_an_exception_in_the_block_changes_nothing_and_goes_on(tmp_path):
    destination = tmp_path / "out.bin"
    destination.write_bytes(b"old")
    with pytest.raises(KeyError):
        with atomic.atomic_output(str(destination)) as f:
            f.write(b"half")
            raise KeyError("the caller's")
    assert destination.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_an_os_error_in_the_block_is_e9003_naming_the_destination(tmp_path):
    destination = tmp_path / "out.bin"
    cause = OSError(errno.ENOSPC, "No space left on device")
    with raises("E9003", str(destination), "No space left on device") as info:
        with atomic.atomic_output(str(destination)) as f:
            f.write(b"half")
            raise cause
    assert isinstance(info.value, TruncatedError) and info.value.__cause__ is cause
    assert os.listdir(tmp_path) == []


def test_the_temporary_file_is_held_locked_until_it_is_in_place(tmp_path):
    destination = tmp_path / "out.bin"
    with atomic.atomic_output(str(destination)) as f:
        (temporary,) = os.listdir(tmp_path)
        other = os.open(tmp_path / temporary, os.O_RDONLY)
        try:
            assert locks.flock(other, wait=False) is False
        finally:
            os.close(other)
        assert atomic.remove_stale_temporaries(str(destination)) == []  # a live writer's: kept
        f.write(b"done")
    assert destination.read_bytes() == b"done"


def test_outputs_get_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o077)
    try:
        with atomic.atomic_output(str(tmp_path / "a")) as f:
            f.write(b"a")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    old = os.umask(0o002)
    try:
        with atomic.atomic_output(str(tmp_path / "b")) as f:
            f.write(b"b")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o664


def test_stale_temporaries_of_the_destination_only_are_removed(tmp_path):
    destination = tmp_path / "d.bin"
    stale = [tmp_path / ".d.bin.abcd_123.tmp", tmp_path / ".d.bin.zzzzzzzz.tmp"]
    for path in stale:
        path.write_bytes(b"left by a killed writer")
    kept = [tmp_path / ".e.bin.abcd_123.tmp", tmp_path / "d.bin.abcd_123.tmp", tmp_path / ".d.bin.abcd_123.tmp.x"]
    for path in kept:
        path.write_bytes(b"not a temporary file of d.bin")
    (tmp_path / ".d.bin.dir_1234.tmp").mkdir()  # a directory of that name: not a file of ours
    os.symlink(kept[0], tmp_path / ".d.bin.link_123.tmp")  # a link of that name: never followed
    assert sorted(atomic.remove_stale_temporaries(str(destination))) == sorted(map(str, stale))
    assert all(path.exists() for path in kept)
    assert (tmp_path / ".d.bin.dir_1234.tmp").is_dir() and (tmp_path / ".d.bin.link_123.tmp").is_symlink()
    assert atomic.remove_stale_temporaries(str(tmp_path / "missing-directory" / "d.bin")) == []


def test_a_writer_removes_what_killed_writers_of_its_destination_left(tmp_path):
    destination = tmp_path / "d.bin"
    (tmp_path / ".d.bin.abcd_123.tmp").write_bytes(b"stale")
    with atomic.atomic_output(str(destination)) as f:
        f.write(b"new")
    assert os.listdir(tmp_path) == ["d.bin"]


def test_a_temporary_file_that_cannot_be_made_is_e9003_naming_the_destination(tmp_path):
    missing = tmp_path / "no-such-directory" / "out.bin"
    with raises("E9003", str(missing), "cannot create a file") as info:
        with atomic.atomic_output(str(missing)):
            pass
    assert isinstance(info.value.__cause__, OSError)
    raises("E9003", atomic.temporary_path_for, str(tmp_path / "a\0b"))
    assert os.listdir(tmp_path) == []


def test_without_flock_stale_temporaries_are_left_alone(tmp_path, monkeypatch):
    def refused(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", refused)
    stale = tmp_path / ".d.bin.abcd_123.tmp"
    stale.write_bytes(b"maybe another writer's")
    with atomic.atomic_output(str(tmp_path / "d.bin")) as f:
        f.write(b"whole")
    assert (tmp_path / "d.bin").read_bytes() == b"whole"
    assert sorted(os.listdir(tmp_path)) == [".d.bin.abcd_123.tmp", "d.bin"]  # no lock can say it is stale
