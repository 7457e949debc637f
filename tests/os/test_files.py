"""Opening inputs (pskd_jax._os.files): regular files only; a FIFO, a device or a directory is E9002
at once, without blocking and before a byte is read; a file that cannot be opened is the caller's
error naming it."""

from __future__ import annotations

import errno
import io
import os
import threading

import pytest

from pskd_jax._os import files
from pskd_jax.errors import CorpusInputError, NotPskdError, TruncatedError
from tests.helpers import raises


def within(seconds: float, function, *args, **kwargs):
    """``function(*args)``'s result or exception, failing the test if it does not return in time
    (a blocked open stays blocked on a daemon thread instead of hanging the run)."""
    outcome = {}

    def call():
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function.__name__} blocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    error = within(10, raises, "E9002", files.open_fd, fifo)
    assert isinstance(error, NotPskdError)
    assert error.message == f"{fifo}: a named pipe (FIFO), not a regular file; give a file"
    with pytest.raises(NotPskdError):
        within(10, files.read_whole, fifo, CorpusInputError)  # whatever error the caller names
    with pytest.raises(NotPskdError):
        within(10, files.line_at, fifo, 10)


def test_a_directory_is_refused(tmp_path):
    error = raises("E9002", files.open_fd, tmp_path)
    assert error.message == f"{tmp_path}: a directory, not a regular file; give a file"
    raises("E9002", files.read_whole, tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_before_it_is_read():
    error = within(10, raises, "E9002", files.read_whole, "/dev/zero")  # would read without end
    assert "a character device" in error.message and "/dev/zero" in error.message


def test_a_missing_file_is_the_callers_error_naming_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    error = raises("E9003", files.open_fd, missing)
    assert error.message == f"{missing}: cannot read: No such file or directory"
    assert isinstance(error, TruncatedError) and error.__cause__.errno == errno.ENOENT
    error = raises("E9015", files.read_whole, missing, CorpusInputError, what="the input")
    assert error.message == f"{missing}: cannot read the input: No such file or directory"
    error = raises("E9003", files.open_fd, str(tmp_path / "a\0b"))
    assert "a path holds no NUL byte" in error.message


def test_a_regular_file_is_read_whole_and_closed(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"abc\ndef\n")
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    assert files.read_whole(path) == b"abc\ndef\n"
    with files.open_regular(path) as f:
        assert f.read(2) == b"ab"
    assert before is None or len(os.listdir("/proc/self/fd")) == before


def test_a_file_larger_than_the_limit_is_refused_naming_it(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 101)
    assert files.read_whole(path, limit=101) == b"x" * 101
    error = raises("E9015", files.read_whole, path, CorpusInputError, limit=100)
    assert error.message == f"{path}: 101 bytes, more than the 100 such a file may have"


def test_read_some_turns_an_os_error_into_the_callers_error():
    class Failing(io.RawIOBase):
        def read(self, size=-1):
            raise OSError(errno.EIO, "Input/output error")

    error = raises("E9015", files.read_some, Failing(), "disk.txt", 10, CorpusInputError)
    assert error.message == "disk.txt: cannot read: Input/output error" and error.__cause__.errno == errno.EIO


@pytest.mark.parametrize("offset, line", [(0, 1), (1, 1), (3, 1), (4, 2), (6, 2), (7, 3), (8, 4), (1000, 4)])
def test_line_at_counts_the_line_feeds_before_an_offset(tmp_path, offset, line):
    path = tmp_path / "t.txt"
    path.write_bytes(b"abc\nde\n\nlast")
    assert files.line_at(path, offset) == line
    assert files.line_at(path, offset, block=2) == line  # across blocks


def test_same_place_by_string_real_path_or_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").write_bytes(b"1")
    os.link(tmp_path / "x", tmp_path / "hard")
    os.symlink(tmp_path / "x", tmp_path / "soft")
    assert files.same_place("x", "./x") and files.same_place(str(tmp_path / "x"), "x")
    assert files.same_place("soft", "x") and files.same_place("hard", "x")
    assert files.same_place("gone", "./sub/../gone")  # (no file there: by its real path)
    assert not files.same_place("x", "y") and not files.same_place("gone", "other")


def test_same_place_of_urls_only_when_equal():
    assert files.same_place("s3://b/k", "s3://b/k")
    assert not files.same_place("s3://b//k", "s3://b/k")  # (a normalised path would say yes)
    assert not files.same_place("s3://b/k", "s3:/b/k")


def test_the_descriptor_limit_is_the_soft_limit(monkeypatch):
    import resource

    assert files.descriptor_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0] or \
        resource.getrlimit(resource.RLIMIT_NOFILE)[0] == resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert files.descriptor_limit() == files.UNLIMITED_DESCRIPTORS
