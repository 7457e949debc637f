"""Reader.refresh: a reader takes in the samples appended to its file since it opened (a shard
being built, a file being appended to), and refuses a file that shrank or is no longer the one it
opened (E9003 / E9002 naming it)."""

from __future__ import annotations

import os
import pathlib
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, write
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import encode_header

TYPE = "(idx[1000][2], ℝ[])"
SAMPLE = 2 * 2 + 8  # idx[1000] is u16


def sample_bytes(k: int) -> bytes:
    return struct.pack("<HHd", k % 1000, (k + 1) % 1000, k / 2)


def start_file(path, count: int) -> None:
    with open(path, "wb") as f:
        f.write(encode_header(TYPE, count, [Encoding.F64, Encoding.F64]))
        for k in range(count):
            f.write(sample_bytes(k))


def append(path, first: int, count: int) -> None:
    """Appends samples the way a writer that appends in place does: data first, then the count."""
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        for k in range(first, first + count):
            f.write(sample_bytes(k))
        f.flush()
        head = encode_header(TYPE, first + count, [Encoding.F64, Encoding.F64])
        f.seek(len(head) - 8)
        f.write(struct.pack("<Q", first + count))


def check_samples(reader: Reader, count: int) -> None:
    tokens, reals = reader.gather(np.arange(count))
    assert tokens[:, 0].tolist() == [k % 1000 for k in range(count)]
    assert reals.tolist() == [k / 2 for k in range(count)]


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_refresh_takes_in_appended_samples(tmp_path, access):
    path = tmp_path / "grow.psk.d"
    start_file(path, 3)
    with Reader(path, access=access) as reader:
        early = reader.leaves()[1]  # a view taken before: stays valid over the old map
        assert reader.refresh() == 3  # nothing new
        append(path, 3, 5)
        assert len(reader) == 3
        assert reader.refresh() == 8 and len(reader) == 8
        check_samples(reader, 8)
        assert reader[-1][1] == 3.5 and reader.leaves()[1].shape == (8,)
        assert early.tolist() == [0.0, 0.5, 1.0]
        append(path, 8, 1)
        assert reader.refresh() == 9
        check_samples(reader, 9)


def test_refresh_of_an_empty_file(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 0)
    with Reader(path) as reader:
        assert len(reader) == 0
        append(path, 0, 2)
        assert reader.refresh() == 2
        check_samples(reader, 2)


def test_data_appended_before_its_count_is_not_taken_in(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 2)
    with Reader(path) as reader:
        with open(path, "ab") as f:
            f.write(sample_bytes(2))  # the count still says 2
        assert reader.refresh() == 2 and reader.trailing_bytes == SAMPLE


def refused(code: str, reader: Reader, path) -> None:
    with pytest.raises(PskdError) as caught:
        reader.refresh()
    assert caught.value.code == code and str(path) in caught.value.message, caught.value


def test_a_file_cut_short_is_E9003(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 4)
    with Reader(path) as reader:
        os.truncate(path, os.path.getsize(path) - SAMPLE)
        refused("E9003", reader, path)


def test_a_smaller_count_is_E9003(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 4)
    with Reader(path) as reader:
        head = encode_header(TYPE, 4, [Encoding.F64, Encoding.F64])
        with open(path, "r+b") as f:
            f.seek(len(head) - 8)
            f.write(struct.pack("<Q", 2))
        refused("E9003", reader, path)


def test_a_count_beyond_the_data_is_E9003(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 2)
    with Reader(path) as reader:
        head = encode_header(TYPE, 2, [Encoding.F64, Encoding.F64])
        with open(path, "r+b") as f:
            f.seek(len(head) - 8)
            f.write(struct.pack("<Q", 5))
        refused("E9003", reader, path)
        check_samples(reader, 2)  # the reader is as it was


def test_a_file_replaced_or_removed_is_E9002(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 2)
    with Reader(path) as reader:
        write(tmp_path / "other.psk.d", TYPE, (np.zeros((3, 2), np.uint16), np.zeros(3)), durable=False)
        os.replace(tmp_path / "other.psk.d", path)
        refused("E9002", reader, path)
        check_samples(reader, 2)  # still the file it opened
    with Reader(path) as reader:
        os.unlink(path)
        refused("E9002", reader, path)


def test_a_header_rewritten_as_another_type_is_E9002(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 2)
    with Reader(path) as reader:
        with open(path, "r+b") as f:
            f.write(encode_header("(idx[1001][2], ℝ[])", 2, [Encoding.F64, Encoding.F64]))
        refused("E9002", reader, path)


def test_refresh_of_a_closed_reader_is_refused(tmp_path):
    path = tmp_path / "grow.psk.d"
    start_file(path, 1)
    reader = Reader(path)
    reader.close()
    with pytest.raises(PskdError):
        reader.refresh()


APPENDER = textwrap.dedent("""
    import os, struct, sys, time
    sys.path.insert(0, sys.argv[3])
    from test_refresh import append
    path, total, pauses = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[4].split(",")]
    for first in range(1, total):
        append(path, first, 1)
        if first + 1 in pauses:  # holds still until the reader has seen this count
            guard = time.monotonic() + 600
            while not os.path.exists(f"{path}.seen{first + 1}") and time.monotonic() < guard:
                time.sleep(0.001)
""")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_refresh_while_another_process_appends(tmp_path, access):
    """Another process appends one sample at a time; each refresh sees a count that never goes
    down and samples that are all whole. The appender holds still at a few counts until the
    reader has seen them, so the reader sees the file grow however the two are scheduled."""
    path = tmp_path / "grow.psk.d"
    start_file(path, 1)
    total, pauses = 300, (60, 150, 240)
    appender = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(total),
                                 os.path.dirname(__file__), ",".join(map(str, pauses))])
    seen = [1]
    with Reader(path, access=access) as reader:
        while seen[-1] < total:
            count = reader.refresh()
            assert count >= seen[-1]
            check_samples(reader, count)
            seen.append(count)
            if count in pauses:
                pathlib.Path(f"{path}.seen{count}").touch()
            if appender.poll() is not None and count == seen[-2]:
                count = reader.refresh()
                assert count == total, appender.returncode
                seen.append(count)
    assert appender.wait(timeout=60) == 0
    assert seen[-1] == total and set(pauses) <= set(seen)  # it saw the file grow, not only its end
