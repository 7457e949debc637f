"""Lock files (pskd_jax._os.locks): one holder at a time, in this process or another; a busy lock is
False or None at once when not waited for; a removed lock file is never shared by two holders; and
where flock is refused every lock is granted without excluding anyone."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import threading

import pytest

from pskd_jax._os import locks, names
from pskd_jax.errors import CheckpointDirectoryError, TruncatedError
from tests.helpers import HANG_GUARD_S, python, raises, wait_until, waiting_for_lock


def test_acquire_and_release_keep_or_remove_the_file(tmp_path):
    path = str(tmp_path / "x.lock")
    fd = locks.acquire(path, wait=False)
    assert fd is not None and os.path.exists(path)
    assert os.stat(path).st_ino == os.fstat(fd).st_ino
    locks.release(fd)
    assert os.path.exists(path)  # kept: released without a path
    fd = locks.acquire(path, wait=True)
    locks.release(fd, path)
    assert not os.path.exists(path)


def test_a_held_lock_is_busy_for_every_other_opener(tmp_path):
    path = str(tmp_path / "x.lock")
    fd = locks.acquire(path, wait=False)
    try:
        assert locks.acquire(path, wait=False) is None
        other = os.open(path, os.O_RDONLY)
        try:
            assert locks.flock(other, wait=False) is False
        finally:
            os.close(other)
        with locks.holding(path, wait=False) as held:
            assert held is False  # the block runs, knowing it does not hold the lock
        with pytest.raises(CheckpointDirectoryError, match="busy"):
            with locks.holding(path, wait=False, busy=lambda: CheckpointDirectoryError("busy")):
                pass
    finally:
        locks.release(fd)
    with locks.holding(path, wait=False) as held:
        assert held is True


def test_holding_removes_the_file_only_when_asked(tmp_path):
    path = str(tmp_path / "x.lock")
    with locks.holding(path) as held:
        assert held and os.path.exists(path)
    assert os.path.exists(path)
    with locks.holding(path, remove=True) as held:
        assert held
    assert not os.path.exists(path)
    with pytest.raises(RuntimeError):
        with locks.holding(path, remove=True):
            raise RuntimeError("the block fails")
    assert not os.path.exists(path)  # removed on the way out all the same
    assert locks.acquire(path, wait=False) is not None  # and released


def test_destination_lock_is_a_hidden_file_beside_the_destination(tmp_path):
    destination = tmp_path / "c.psk.d"
    lock = names.save_lock(destination)
    assert lock == str(tmp_path / ".c.psk.d.lock")
    with locks.destination_lock(destination) as held:
        assert held is True and os.path.exists(lock)
        with locks.destination_lock(destination, wait=False) as again:
            assert again is False
        with locks.destination_lock(tmp_path / "other.psk.d", wait=False) as other:
            assert other is True  # another destination, another lock
    assert os.listdir(tmp_path) == []  # the last holder removed its lock file


def test_a_lock_file_left_by_a_killed_writer_is_reused_and_removed(tmp_path):
    destination = tmp_path / "c.psk.d"
    with open(names.save_lock(destination), "wb"):
        pass  # nobody holds it: its writer died
    with locks.destination_lock(destination, wait=False) as held:
        assert held is True
    assert os.listdir(tmp_path) == []


def test_a_waiter_never_shares_a_lock_file_its_holder_removed(tmp_path, monkeypatch):
    """The holder removes the file while another waits on it: the waiter then locks a new file
    under the name, never the removed one (which a third opener could not see)."""
    path = str(tmp_path / "x.lock")
    first = locks.acquire(path, wait=True)
    waiting = threading.Event()
    flock = locks.flock

    def signalling_flock(fd, *, wait):
        if wait and threading.current_thread() is not threading.main_thread():
            waiting.set()  # the waiter has the old file open and is about to block on it
        return flock(fd, wait=wait)

    monkeypatch.setattr(locks, "flock", signalling_flock)
    got = []
    waiter = threading.Thread(target=lambda: got.append(locks.acquire(path, wait=True)))
    waiter.start()
    assert waiting.wait(HANG_GUARD_S)
    wait_until(lambda: waiting_for_lock(os.getpid(), path), what="the waiter blocked on the holder's lock")
    assert waiter.is_alive()
    locks.release(first, path)
    waiter.join(HANG_GUARD_S)
    assert not waiter.is_alive() and got[0] is not None
    try:
        assert os.fstat(got[0]).st_ino == os.stat(path).st_ino  # the file under the name now
        assert locks.acquire(path, wait=False) is None  # which excludes the next opener
        assert os.fstat(got[0]).st_nlink == 1  # linked: not the removed file
    finally:
        locks.release(got[0], path)


def test_a_lock_file_that_cannot_be_opened_raises_the_callers_error_naming_it(tmp_path):
    missing = tmp_path / "no-such-directory" / "x.lock"
    error = raises("E9003", locks.acquire, str(missing), wait=False)
    assert str(missing) in error.message
    assert isinstance(error, TruncatedError)
    error = raises("E9014", locks.acquire, str(missing), wait=False, error=CheckpointDirectoryError, what="run")
    assert error.message.startswith("run: cannot open the lock file") and isinstance(error.__cause__, OSError)
    raises("E9014", locks.acquire, str(tmp_path / "a\0b.lock"), wait=False, error=CheckpointDirectoryError)
    with pytest.raises(CheckpointDirectoryError):
        with locks.holding(str(missing), error=CheckpointDirectoryError):
            pass


def test_a_symlink_at_a_lock_name_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    os.symlink(target, tmp_path / "x.lock")
    raises("E9003", locks.acquire, str(tmp_path / "x.lock"), wait=False)
    assert target.read_bytes() == b"keep"


def test_without_flock_every_lock_is_granted_and_excludes_no_one(tmp_path, monkeypatch):
    def refused(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")  # as some network file systems answer

    monkeypatch.setattr(locks.fcntl, "flock", refused)
    path = str(tmp_path / "x.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert locks.flock(fd, wait=False) is None and locks.flock(fd, wait=True) is None
    finally:
        os.close(fd)
    first = locks.acquire(path, wait=False)
    second = locks.acquire(path, wait=True)  # granted at once: nothing waits forever
    assert first is not None and second is not None
    locks.release(second)
    locks.release(first, path)
    with locks.holding(path, wait=False) as a, locks.holding(path, wait=False) as b:
        assert (a, b) == (True, True)
    with locks.destination_lock(tmp_path / "d.psk.d", wait=False) as a:
        with locks.destination_lock(tmp_path / "d.psk.d", wait=False) as b:
            assert (a, b) == (True, True)


def test_without_fcntl_flock_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "fcntl", None)
    fd = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT)
    try:
        assert locks.flock(fd, wait=False) is None
    finally:
        os.close(fd)
    with locks.holding(str(tmp_path / "x.lock"), wait=False) as held:
        assert held is True


HOLDER = """
    import sys
    from pskd_jax._os import locks

    with locks.destination_lock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
"""


@pytest.mark.subprocess
def test_a_lock_held_by_another_process(tmp_path):
    destination = tmp_path / "c.psk.d"
    holder = python(HOLDER, destination, stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        with locks.destination_lock(destination, wait=False) as held:
            assert held is False
        assert locks.acquire(names.save_lock(destination), wait=False) is None
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0, holder.stderr.read()
    with locks.destination_lock(destination, wait=False) as held:
        assert held is True
    assert os.listdir(tmp_path) == []


def _marked(path, data: str | None, *, before: bool, layout: bool, whole: bool = True) -> None:
    """A lock file as a writer killed while committing leaves it (``data``: the new data file)."""
    line = b""
    if data is not None:
        st = os.stat(data)
        line = json.dumps({"data": [st.st_dev, st.st_ino, st.st_size], "before": before, "layout": layout}).encode()
        line = line + b"\n" if whole else line[:10]
    pathlib.Path(names.save_lock(path)).write_bytes(locks.COMMITTING + line)


def test_a_commit_mark_says_which_data_file_is_the_new_one(tmp_path):
    path, new = tmp_path / "c.psk.d", tmp_path / "new"
    path.write_bytes(b"old data")
    new.write_bytes(b"new data!")
    _marked(path, str(new), before=True, layout=True)
    cut = locks.commit_cut_short(path)
    assert cut is not None and cut.before and cut.layout and not cut.committed(path)
    os.replace(new, path)  # (the data's rename keeps the file's identity)
    assert locks.commit_cut_short(path).committed(path)
    _marked(path, str(path), before=False, layout=True, whole=False)  # (cut off while written)
    assert locks.commit_cut_short(path) is None
    _marked(path, None, before=False, layout=False)  # (a mark that says nothing more)
    assert locks.commit_cut_short(path) == locks.CutShort(None)
    os.unlink(names.save_lock(path))
    assert locks.commit_cut_short(path) is None and not os.path.exists(names.save_lock(path))


def test_the_commit_witness_changes_at_every_step_of_a_commit(tmp_path):
    # What a reader compares before and after reading a layout file: the mark, then the data's rename.
    path, new = tmp_path / "c.psk.d", tmp_path / "new"
    path.write_bytes(b"old data")
    new.write_bytes(b"new data")  # (the same size)
    idle = locks.commit_witness(path)
    assert idle == (None, (os.stat(path).st_dev, os.stat(path).st_ino, 8))
    assert locks.commit_witness(path) == idle and not os.path.exists(names.save_lock(path))  # (creates nothing)
    _marked(path, str(new), before=True, layout=True)
    marked = locks.commit_witness(path)
    assert marked[0] == locks.commit_cut_short(path) and marked[1] == idle[1]
    os.replace(new, path)
    renamed = locks.commit_witness(path)
    assert renamed[0] == marked[0] and renamed[1] not in (None, idle[1])
    locks.clear_committing(path)
    assert locks.commit_witness(path) == (None, renamed[1])
    os.unlink(path)
    assert locks.commit_witness(path) == (None, None)


@pytest.mark.parametrize("data_is_new", [False, True])
def test_the_next_holder_puts_a_commit_cut_short_back_in_order(tmp_path, data_is_new):
    path, new = tmp_path / "c.psk.d", tmp_path / ".c.psk.d.abcdefgh.tmp"
    layout, kept = pathlib.Path(names.layout_path_for(path)), pathlib.Path(names.layout_before(path))
    path.write_bytes(b"old data")
    layout.write_text("old layout")
    new.write_bytes(b"new data!")
    os.link(layout, kept)
    _marked(path, str(new), before=True, layout=True)
    layout.write_text("new layout")  # (a rename in the real commit; the kept name still the old file)
    kept.unlink()
    kept.write_text("old layout")
    if data_is_new:
        os.replace(new, path)
    with locks.destination_lock(path):
        assert not kept.exists() and locks.commit_cut_short(path) is None
        assert layout.read_text() == ("new layout" if data_is_new else "old layout")
    assert sorted(os.listdir(tmp_path)) == sorted(["c.layout.json", "c.psk.d"] + ([] if data_is_new else [new.name]))
    # a first save cut short: its layout goes, nothing else (the old save had none there)
    layout.write_text("new layout")
    (tmp_path / "other").write_bytes(b"a new save's data, never renamed")
    _marked(path, str(tmp_path / "other"), before=False, layout=True)
    with locks.destination_lock(path):
        assert not layout.exists()
    # a mark that does not say which data is new: left for readers (E9005 from them)
    _marked(path, None, before=False, layout=False)
    with locks.destination_lock(path):
        pass
    assert locks.commit_cut_short(path) == locks.CutShort(None)
    with locks.destination_lock(path, keep_committing=False):  # (a manager's step file)
        pass
    assert not os.path.exists(names.save_lock(path))
