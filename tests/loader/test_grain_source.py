"""A Reader is a Grain random-access source (``__len__``, ``__getitem__``) and pickles by path.

Grain sends its source to worker processes by pickling it: a Reader pickles as its path, layout
and header, and the worker reopens the file. The pickling tests need no grain.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import pskd_jax
from pskd_jax.errors import PskdError
from pskd_jax.format import Layout
from tests.helpers import run_python

TYPE = "(idx[100][4], ℝ[])"
COUNT = 50


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "w.psk.d"
    rng = np.random.default_rng(5)
    pskd_jax.write(path, TYPE, (rng.integers(0, 100, size=(COUNT, 4)), rng.standard_normal(COUNT)))
    return path


@pytest.fixture
def grain():
    return pytest.importorskip("grain")


def assert_same_sample(got, want) -> None:
    assert len(got) == len(want)
    for got_leaf, want_leaf in zip(got, want):
        assert np.asarray(got_leaf).dtype == want_leaf.dtype
        assert np.array_equal(np.asarray(got_leaf), want_leaf)


# --- pickling (no grain) ----------------------------------------------------------------------


def test_a_pickled_reader_reopens_the_file_and_reads_the_same_samples(path):
    with pskd_jax.Reader(path) as reader:
        copy = pickle.loads(pickle.dumps(reader))
        try:
            assert copy.path == reader.path and len(copy) == len(reader) == COUNT
            assert copy.header == reader.header and copy.layout == reader.layout
            for i in (0, 17, COUNT - 1, -1):
                assert_same_sample(copy[i], reader[i])
            indices = np.array([3, 0, 49, 3])
            assert_same_sample(copy.gather(indices), reader.gather(indices))
        finally:
            copy.close()


def test_a_pickled_reader_keeps_a_layout_given_to_it(path):
    layout = Layout.of_type(TYPE)
    with pskd_jax.Reader(path, layout=layout) as reader:
        copy = pickle.loads(pickle.dumps(reader))
        with copy:
            assert copy.layout == layout
            assert_same_sample(copy[7], reader[7])


def test_a_reader_pickled_after_close_reopens(path):
    reader = pskd_jax.Reader(path)
    data = pickle.dumps(reader)
    reader.close()
    with pickle.loads(data) as copy:
        assert_same_sample(copy[1], pskd_jax.Reader(path)[1])


def test_unpickling_refuses_a_file_that_changed(path):
    with pskd_jax.Reader(path) as reader:
        data = pickle.dumps(reader)
    pskd_jax.write(path, TYPE, (np.zeros((COUNT + 1, 4), np.int64), np.zeros(COUNT + 1)))
    with pytest.raises(PskdError) as caught:
        pickle.loads(data)
    assert caught.value.code == "E9005"
    assert "changed since the reader was pickled" in caught.value.message


# --- grain ------------------------------------------------------------------------------------


def test_grain_map_dataset_over_a_reader_gives_the_readers_samples(grain, path):
    with pskd_jax.Reader(path) as reader:
        dataset = grain.MapDataset.source(reader)
        assert len(dataset) == COUNT
        for i in range(COUNT):
            assert_same_sample(dataset[i], reader[i])


def test_grain_shuffle_and_batch_over_a_reader_gather_the_shuffled_indices(grain, path):
    with pskd_jax.Reader(path) as reader:
        batches = grain.MapDataset.source(reader).shuffle(seed=3).batch(8, drop_remainder=True)
        orders = grain.MapDataset.range(COUNT).shuffle(seed=3).batch(8, drop_remainder=True)
        assert len(batches) == len(orders) == COUNT // 8
        seen = []
        for j in range(len(batches)):
            indices = np.asarray(orders[j])
            assert_same_sample(batches[j], reader.gather(indices))
            seen.extend(indices.tolist())
        assert len(set(seen)) == len(seen)  # a permutation, cut into batches


# Grain's worker processes read absl flags, which must be parsed first; a process of its own
# keeps that global state out of the test process.
WORKERS = """
import sys
import numpy as np
from absl import flags
import grain
import pskd_jax

flags.FLAGS.mark_as_parsed()
reader = pskd_jax.Reader(sys.argv[1])
dataset = grain.MapDataset.source(reader).shuffle(seed=3).batch(10, drop_remainder=True)
parallel = dataset.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
got = list(parallel)
assert len(got) == len(dataset) == 5, len(got)
for j, (tokens, values) in enumerate(got):
    want_tokens, want_values = dataset[j]
    assert np.array_equal(tokens, want_tokens) and np.array_equal(values, want_values), j
print("ok", len(got))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_grain_worker_processes_read_a_pickled_reader(grain, path):
    done = run_python(WORKERS, path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "5"]
