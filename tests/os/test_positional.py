"""Positional reads and writes (pskd_jax._os.positional): short reads and writes are carried on until
the buffer is full or written; a file that ends first is E9003 naming it and saying where."""

from __future__ import annotations

import errno
import os

import pytest

from pskd_jax._os import positional
from pskd_jax.errors import TruncatedError
from tests.helpers import raises

DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture
def fd(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    descriptor = os.open(path, os.O_RDWR)
    yield descriptor
    os.close(descriptor)


def short_reads(monkeypatch, at_most: int) -> list[int]:
    """Makes every preadv move at most ``at_most`` bytes (as a signal or a huge read may); returns
    the list the offsets of the calls go to."""
    calls = []
    real = os.preadv

    def preadv(fd, buffers, offset):
        calls.append(offset)
        (buffer,) = buffers
        return real(fd, [memoryview(buffer)[:at_most]], offset)

    monkeypatch.setattr(os, "preadv", preadv)
    return calls


def test_read_into_carries_on_after_short_reads(fd, monkeypatch):
    calls = short_reads(monkeypatch, 1000)
    buffer = bytearray(5000)
    positional.read_into(fd, memoryview(buffer), 100, "data.bin")
    assert bytes(buffer) == DATA[100:5100]
    assert calls == [100, 1100, 2100, 3100, 4100]


def test_read_into_moves_at_most_a_piece_a_call(fd, monkeypatch):
    monkeypatch.setattr(positional, "PIECE", 3000)
    calls = short_reads(monkeypatch, 1 << 30)
    buffer = bytearray(len(DATA))
    positional.read_into(fd, memoryview(buffer), 0, "data.bin")
    assert bytes(buffer) == DATA and calls == [0, 3000, 6000, 9000]


@pytest.mark.parametrize("offset, size", [(10000, 241), (10240, 1), (20000, 5), (0, 10241)])
def test_a_read_past_the_end_is_e9003_saying_what_is_missing(fd, offset, size):
    buffer = bytearray(size)
    error = raises("E9003", positional.read_into, fd, memoryview(buffer), offset, "/data/x.bin")
    missing = max(0, offset + size - max(offset, len(DATA)))
    assert error.message.startswith("/data/x.bin: truncated: ")
    assert f"{min(missing, size)} bytes missing at offset {max(offset, len(DATA))}" in error.message


def test_a_read_that_fails_is_e9003_naming_the_file_and_chaining_the_cause(tmp_path):
    directory = os.open(tmp_path, os.O_RDONLY)
    try:
        error = raises("E9003", positional.read_into, directory, memoryview(bytearray(4)), 0, "a directory")
    finally:
        os.close(directory)
    assert error.message.startswith("a directory: cannot read: ")
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EISDIR


def test_pread_spans_fill_every_span_with_one_call_each(fd, monkeypatch):
    calls = short_reads(monkeypatch, 1 << 30)
    spans = [bytearray(n) for n in (10, 0, 300, 7)]
    offsets = [5, 100, 2000, 10233]
    positional.pread_spans(fd, [memoryview(s) for s in spans], offsets, "data.bin")
    assert [bytes(s) for s in spans] == [DATA[o:o + len(s)] for s, o in zip(spans, offsets)]
    assert calls == offsets


def test_pread_spans_carry_on_after_short_reads(fd, monkeypatch):
    short_reads(monkeypatch, 64)
    spans = [bytearray(1000), bytearray(500)]
    positional.pread_spans([fd, fd], [memoryview(s) for s in spans], [0, 9000], "data.bin")
    assert bytes(spans[0]) == DATA[:1000] and bytes(spans[1]) == DATA[9000:9500]


def test_pread_spans_of_a_file_cut_short_are_e9003_naming_the_end_of_the_span(fd):
    error = raises("E9003", positional.pread_spans, fd, [memoryview(bytearray(10)), memoryview(bytearray(100))],
                   [0, 10200], "data.bin")
    assert "data.bin: the file ends before byte 10300" in error.message and "cut short" in error.message


def test_write_at_carries_on_after_short_writes(fd, monkeypatch, tmp_path):
    calls = []
    real = os.pwrite

    def pwrite(fd, data, offset):
        calls.append(offset)
        return real(fd, memoryview(data)[:700], offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    positional.write_at(fd, b"y" * 2000, 50, "data.bin")
    assert calls == [50, 750, 1450]
    assert (tmp_path / "data.bin").read_bytes() == DATA[:50] + b"y" * 2000 + DATA[2050:]


def test_write_at_takes_any_buffer(fd, tmp_path):
    import numpy as np

    positional.write_at(fd, memoryview(np.arange(4, dtype="<u4")), len(DATA), "data.bin")
    assert (tmp_path / "data.bin").read_bytes()[len(DATA):] == np.arange(4, dtype="<u4").tobytes()


def test_a_write_that_writes_nothing_or_fails_is_e9003(fd, monkeypatch):
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    error = raises("E9003", positional.write_at, fd, b"abc", 7, "out.bin")
    assert error.message == "out.bin: write failed at offset 7"

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    error = raises("E9003", positional.write_at, fd, b"abc", 0, "out.bin")
    assert error.message == "out.bin: write failed: No space left on device"
    assert isinstance(error, TruncatedError) and error.__cause__.errno == errno.ENOSPC
