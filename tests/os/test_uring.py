"""Batched positional reads through io_uring (pskd_jax._os.uring, positional.pread_runs): the same
bytes as one preadv a run, reads that end early finished or refused with E9003, errors from the
kernel named, a ring per thread and per process, and the fallback where io_uring is off."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax._os import positional, uring
from pskd_jax.format.byte_sources import FileBytes, Runs, read_runs
from tests.helpers import raises

DATA = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)

# The ring's own tests need a kernel that grants a ring; where it refuses (a sandbox, a seccomp
# profile), the preadv path serves every read, and the tests without this mark check that path.
needs_ring = pytest.mark.skipif(uring.ring() is None, reason="this kernel refuses io_uring (the preadv path serves)")


def test_without_a_ring_pread_runs_reads_nothing(fd, monkeypatch):
    """Where no ring is to be had, pread_runs declines (False) and leaves the buffer alone."""
    monkeypatch.setattr(uring, "ring", lambda: None)
    starts, lengths, offsets = runs_of([0, 10, 20, 30], [10, 10, 10, 10])
    out = np.full(40, 0xEE, np.uint8)
    assert not positional.pread_runs(np.full(4, fd, np.int64), out, starts, lengths, offsets, "f")
    assert (out == 0xEE).all()


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("uring") / "data.bin"
    DATA.tofile(path)
    return str(path)


@pytest.fixture
def fd(data_file):
    descriptor = os.open(data_file, os.O_RDONLY)
    yield descriptor
    os.close(descriptor)


def runs_of(offsets: list[int], lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, offsets) of runs placed one after another in the output."""
    lengths_ = np.array(lengths, np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths_)[:-1])).astype(np.int64)
    return starts, lengths_, np.array(offsets, np.int64)


def expected(offsets, lengths) -> np.ndarray:
    return np.concatenate([DATA[o : o + n] for o, n in zip(offsets, lengths)])


@needs_ring
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(1, 5000)), min_size=1, max_size=700))
def test_reads_equal_the_file(data_file, pieces):
    """Any runs inside the file, more of them than a ring's slots included, read the file's bytes."""
    pieces = [(o, min(n, len(DATA) - o)) for o, n in pieces]
    offsets, lengths = [o for o, _ in pieces], [n for _, n in pieces]
    starts, lengths_, offsets_ = runs_of(offsets, lengths)
    out = np.full(int(lengths_.sum()), 0xEE, np.uint8)
    descriptor = os.open(data_file, os.O_RDONLY)
    try:
        assert positional.pread_runs(np.full(len(pieces), descriptor, np.int64), out, starts, lengths_, offsets_, "f")
    finally:
        os.close(descriptor)
    assert np.array_equal(out, expected(offsets, lengths))


@needs_ring
def test_a_ring_reports_each_read(fd):
    ring = uring.ring()
    assert ring is not None
    out = np.zeros(300, np.uint8)
    results = ring.read(np.array([fd, fd, 999_999]), out.ctypes.data + np.array([0, 100, 200]),
                        np.array([100, 100, 100]), np.array([5, len(DATA) - 40, 0]))
    assert results.tolist() == [100, 40, -9]  # whole, cut by the end of the file, a bad descriptor (EBADF)
    assert np.array_equal(out[:100], DATA[5:105]) and np.array_equal(out[100:140], DATA[-40:])


@needs_ring
def test_a_read_past_the_end_is_e9003(fd):
    starts, lengths, offsets = runs_of([0, 10, len(DATA) - 50, 20], [10, 10, 100, 10])
    out = np.zeros(int(lengths.sum()), np.uint8)
    with raises("E9003", "data.bin", f"ends before byte {len(DATA) + 50}"):
        positional.pread_runs(np.full(4, fd, np.int64), out, starts, lengths, offsets, "data.bin")


@needs_ring
def test_a_short_read_is_finished(fd, monkeypatch):
    """A read the kernel cut short inside the file (as a signal may) is finished with preadv."""
    ring = uring.ring()
    real = ring.read

    def halved(fds, addresses, lengths, offsets):
        results = real(fds, addresses, lengths // 2, offsets)
        return results
    monkeypatch.setattr(ring, "read", halved)
    starts, lengths, offsets = runs_of([100, 5000, 70000, 9], [1000, 333, 4096, 7])
    out = np.zeros(int(lengths.sum()), np.uint8)
    assert positional.pread_runs(np.full(4, fd, np.int64), out, starts, lengths, offsets, "f")
    assert np.array_equal(out, expected([100, 5000, 70000, 9], [1000, 333, 4096, 7]))


@needs_ring
def test_a_kernel_error_is_e9003_with_its_reason(tmp_path):
    directory = os.open(tmp_path, os.O_RDONLY)  # (reading a directory: EISDIR)
    try:
        starts, lengths, offsets = runs_of([0, 0, 0, 0], [4, 4, 4, 4])
        with raises("E9003", "the/dir", "cannot read", os.strerror(21)):
            positional.pread_runs(np.full(4, directory, np.int64), np.zeros(16, np.uint8), starts, lengths, offsets,
                                  "the/dir")
    finally:
        os.close(directory)


@needs_ring
def test_runs_outside_the_buffer_are_refused_before_any_read(fd):
    starts, lengths, offsets = runs_of([0, 0, 0, 0], [4, 4, 4, 4])
    with pytest.raises(ValueError, match="outside the output buffer"):
        positional.pread_runs(np.full(4, fd, np.int64), np.zeros(15, np.uint8), starts, lengths, offsets, "f")
    with pytest.raises(ValueError, match="outside the output buffer"):
        positional.pread_runs(np.full(4, fd, np.int64), np.zeros(16, np.uint8), starts - 1, lengths, offsets, "f")


@needs_ring
def test_each_thread_reads_with_its_own_ring(data_file):
    rings, errors = [], []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            descriptor = os.open(data_file, os.O_RDONLY)
            for _ in range(50):
                offsets = rng.integers(0, len(DATA) - 2000, 64).tolist()
                starts, lengths, offsets_ = runs_of(offsets, [2000] * 64)
                out = np.empty(int(lengths.sum()), np.uint8)
                assert positional.pread_runs(np.full(64, descriptor, np.int64), out, starts, lengths, offsets_, "f")
                assert np.array_equal(out, expected(offsets, [2000] * 64))
            rings.append(uring.ring())
            os.close(descriptor)
        except BaseException as e:  # (reported below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len({id(ring) for ring in rings}) == 4 and uring.ring() not in rings


FORKED = """
import multiprocessing, os, sys
import numpy as np
from pskd_jax._os import positional, uring

def child(queue):
    descriptor = os.open(sys.argv[1], os.O_RDONLY)
    out = np.empty(40, np.uint8)
    starts, lengths = np.arange(0, 40, 10, dtype=np.int64), np.full(4, 10, np.int64)
    done = positional.pread_runs(np.full(4, descriptor, np.int64), out, starts, lengths,
                                 np.array([1, 2, 3, 4], np.int64), "f")
    queue.put((done, out.tobytes().hex(), uring.ring().pid == os.getpid()))

parent = uring.ring()
context = multiprocessing.get_context("fork")
queue = context.Queue()
process = context.Process(target=child, args=(queue,))
process.start()
done, got, own = queue.get(timeout=60)
process.join(60)
print(done, got, own, uring.ring() is parent)
"""


@needs_ring
@pytest.mark.subprocess
def test_a_forked_child_makes_its_own_ring(data_file, tmp_path):
    """(In a process of its own, without JAX's threads, which a fork would copy mid-flight.)"""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script), data_file], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    finished, got, own, kept = done.stdout.split()
    assert finished == own == kept == "True"
    assert bytes.fromhex(got) == expected([1, 2, 3, 4], [10] * 4).tobytes()


@pytest.mark.subprocess
def test_switched_off_the_reads_are_preadv_and_the_same(data_file, tmp_path):
    """PSKD_IO_URING=0: no ring, pread_runs declines, read_runs reads with preadv, same bytes."""
    script = tmp_path / "off.py"
    script.write_text(
        "import os, numpy as np\n"
        "from pskd_jax._os import uring, positional\n"
        "from pskd_jax.format.byte_sources import FileBytes, Runs, read_runs\n"
        "assert uring.ring() is None\n"
        f"source = FileBytes({data_file!r})\n"
        "runs = Runs.of_rows(np.array([0, 500, 9000, 77], np.int64), 100)\n"
        "out = read_runs([source], runs, np.empty((4, 100), np.uint8), 'f')\n"
        "assert not positional.pread_runs(np.full(4, source.fd), out, runs.starts, runs.lengths, runs.offsets, 'f')\n"
        "print(out.tobytes().hex())\n")
    env = {**os.environ, "PSKD_IO_URING": "0"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert bytes.fromhex(done.stdout.strip()) == expected([0, 500, 9000, 77], [100] * 4).tobytes()


def test_read_runs_of_several_files_and_a_closed_one(tmp_path):
    """Runs of several files in one call; a closed file among them is E9003 (the usual path)."""
    paths = []
    for k in range(3):
        path = tmp_path / f"f{k}.bin"
        DATA[k * 1000 :].tofile(path)
        paths.append(str(path))
    sources = [FileBytes(p) for p in paths]
    which = np.array([0, 1, 2, 1, 0], np.int64)
    offsets = np.array([0, 10, 20, 30, 40], np.int64)
    runs = Runs.of_rows(offsets, 64, which)
    out = read_runs(sources, runs, np.empty((5, 64), np.uint8), "corpus")
    for j in range(5):
        start = int(which[j]) * 1000 + int(offsets[j])
        assert np.array_equal(out[j], DATA[start : start + 64])
    sources[1].close()
    with raises("E9003", "corpus", "closed"):
        read_runs(sources, runs, np.empty((5, 64), np.uint8), "corpus")
    for source in sources:
        source.close()


@needs_ring
@pytest.mark.parametrize("helpers", [1, 3])
def test_a_large_batch_is_shared_with_helper_threads(fd, monkeypatch, helpers):
    """A batch of many reads is cut into pieces read at once by helper threads' rings: the same
    bytes; a piece that meets the file's end is E9003, after every piece is done."""
    monkeypatch.setattr(uring, "HELPERS", helpers)
    monkeypatch.setattr(uring, "_pool", [])
    rng = np.random.default_rng(3)
    offsets = rng.integers(0, len(DATA) - 3000, 2000).tolist()
    lengths = rng.integers(1, 3000, 2000).tolist()
    starts, lengths_, offsets_ = runs_of(offsets, lengths)
    out = np.empty(int(lengths_.sum()), np.uint8)
    assert positional.pread_runs(np.full(2000, fd, np.int64), out, starts, lengths_, offsets_, "f")
    assert np.array_equal(out, expected(offsets, lengths))
    names = {thread.name for thread in threading.enumerate()}
    assert any(name.startswith("pskd-read") for name in names)
    for at in (5, 1999):  # (a read past the end in the first piece, and in the last)
        broken = offsets_.copy()
        broken[at] = len(DATA) - 1
        with raises("E9003", "f", "ends before byte"):
            positional.pread_runs(np.full(2000, fd, np.int64), out, starts, lengths_, broken, "f")
    uring._pool[0].shutdown()


@needs_ring
def test_a_helper_refused_a_ring_reads_with_preadv(fd, monkeypatch):
    monkeypatch.setattr(uring, "HELPERS", 1)
    monkeypatch.setattr(uring, "_pool", [])
    caller = uring.ring()
    monkeypatch.setattr(uring, "ring", lambda: caller if threading.current_thread() is threading.main_thread()
                        else None)
    offsets, lengths = list(range(0, 2000 * 300, 300)), [200] * 2000
    starts, lengths_, offsets_ = runs_of(offsets, lengths)
    out = np.empty(int(lengths_.sum()), np.uint8)
    assert positional.pread_runs(np.full(2000, fd, np.int64), out, starts, lengths_, offsets_, "f")
    assert np.array_equal(out, expected(offsets, lengths))
    uring._pool[0].shutdown()
