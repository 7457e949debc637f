"""save_distributed (here in one JAX process, where it runs the same steps) follows the output
rules of every writer: a link at the destination is written through, a FIFO, device or directory
there is refused (E9012); its temporary file ``.NAME.distributed.tmp`` is opened without blocking
and must be a regular file (a FIFO, a directory or a link at its name is refused, left alone)."""

from __future__ import annotations

import os
import stat
import threading

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.names import distributed_temporary
from tests.helpers import raises

pytest.importorskip("jax")

TREE = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(-4)}


def finishes(call, timeout: float = 60):
    """Runs ``call`` on a thread; returns what it raised (None when it returned). A call still
    running after ``timeout`` seconds (blocked on a FIFO) fails the test."""
    outcome = {}

    def run():
        try:
            call()
            outcome["error"] = None
        except BaseException as e:  # handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the save blocked"
    return outcome["error"]


def test_the_file_equals_a_plain_saves(tmp_path):
    ck.save_distributed(tmp_path / "d.psk.d", TREE)
    ck.save(tmp_path / "s.psk.d", TREE)
    assert (tmp_path / "d.psk.d").read_bytes() == (tmp_path / "s.psk.d").read_bytes()
    assert not os.path.lexists(distributed_temporary(tmp_path / "d.psk.d"))


def test_a_fifo_at_the_temporary_name_is_refused_without_blocking(tmp_path):
    temporary = distributed_temporary(tmp_path / "c.psk.d")
    os.mkfifo(temporary)
    error = finishes(lambda: ck.save_distributed(tmp_path / "c.psk.d", TREE))
    with raises("E9012", temporary, "not a regular file"):
        raise error
    assert stat.S_ISFIFO(os.lstat(temporary).st_mode)  # left where it was
    assert not (tmp_path / "c.psk.d").exists() and not (tmp_path / "c.layout.json").exists()


def test_a_fifo_with_a_reader_at_the_temporary_name_is_refused_too(tmp_path):
    temporary = distributed_temporary(tmp_path / "c.psk.d")
    os.mkfifo(temporary)
    reader = os.open(temporary, os.O_RDONLY | os.O_NONBLOCK)
    try:
        error = finishes(lambda: ck.save_distributed(tmp_path / "c.psk.d", TREE))
    finally:
        os.close(reader)
    with raises("E9012", temporary):
        raise error
    assert not (tmp_path / "c.psk.d").exists()


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_directory_or_link_at_the_temporary_name_is_refused_and_kept(tmp_path, kind):
    temporary = distributed_temporary(tmp_path / "c.psk.d")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"mine")
    if kind == "directory":
        os.mkdir(temporary)
    else:
        os.symlink(target, temporary)
    with raises("E9012", temporary):
        ck.save_distributed(tmp_path / "c.psk.d", TREE)
    assert os.path.lexists(temporary) and target.read_bytes() == b"mine"
    assert not (tmp_path / "c.psk.d").exists()


def test_a_link_at_the_destination_is_written_through(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real" / "c.psk.d", tmp_path / "c.psk.d")
    ck.save_distributed(tmp_path / "c.psk.d", TREE)
    ck.save(tmp_path / "s.psk.d", TREE)
    assert os.path.islink(tmp_path / "c.psk.d")
    assert (tmp_path / "real" / "c.psk.d").read_bytes() == (tmp_path / "s.psk.d").read_bytes()
    assert not os.path.lexists(distributed_temporary(tmp_path / "real" / "c.psk.d"))
    back = ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert back["w"].tolist() == TREE["w"].tolist() and int(back["step"]) == -4


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_directory_or_fifo_at_the_destination_is_refused(tmp_path, kind):
    destination = tmp_path / "c.psk.d"
    if kind == "directory":
        destination.mkdir()
    else:
        os.mkfifo(destination)
    error = finishes(lambda: ck.save_distributed(destination, TREE))
    with raises("E9012", str(destination)):
        raise error
    assert (destination.is_dir() if kind == "directory" else stat.S_ISFIFO(os.lstat(destination).st_mode))
    assert sorted(os.listdir(tmp_path)) == ["c.psk.d"]
