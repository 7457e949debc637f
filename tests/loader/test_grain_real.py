"""Reader and CorpusWindows as grain data sources, with grain's own objects: MapDataset, its
batched read (``_getitems``), and a DataLoader whose checkpointed iterator is restored over a NEW
source of the same file (grain compares ``repr(data_source)``), and refused over another file."""

from __future__ import annotations

import collections
import json
import operator
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax.corpus import BuildOptions

grain = pytest.importorskip("grain")

TYPE = "(idx[100][4], ℝ[])"
COUNT = 50


def write_windows(path, seed: int = 5, count: int = COUNT) -> pathlib.Path:
    rng = np.random.default_rng(seed)
    pskd_jax.write(path, TYPE, (rng.integers(0, 100, size=(count, 4)), rng.standard_normal(count)))
    return path


@pytest.fixture
def path(tmp_path):
    return write_windows(tmp_path / "w.psk.d")


@pytest.fixture
def corpus(tmp_path):
    inputs = []
    for k in range(3):
        source = tmp_path / "text" / f"part{k}.txt"
        source.parent.mkdir(exist_ok=True)
        source.write_text(f"document {k}: " + "the quick brown fox jumps over the lazy dog. " * (20 + 7 * k))
        inputs.append(source)
    pskd_jax.build_corpus(inputs, tmp_path / "corpus", BuildOptions(durable=False))
    return tmp_path / "corpus" / "shards.json"


def same_samples(got, want) -> bool:
    return len(got) == len(want) and all(
        np.asarray(g).dtype == np.asarray(w).dtype and np.array_equal(np.asarray(g), np.asarray(w))
        for g, w in zip(got, want))


def loader(source, *, seed: int = 7, batch: int = 4) -> grain.DataLoader:
    sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=2, seed=seed)
    return grain.DataLoader(data_source=source, sampler=sampler,
                            operations=[grain.transforms.Batch(batch_size=batch, drop_remainder=True)],
                            worker_count=0)


# --- the protocol ---------------------------------------------------------------------------------


def test_a_reader_is_a_grain_random_access_source_with_batched_reads(path):
    from grain._src.python.dataset import base

    with pskd_jax.Reader(path) as reader:
        assert isinstance(reader, grain.sources.RandomAccessDataSource)
        assert isinstance(reader, base.SupportsBatchedReadRandomAccessDataSource)


def test_a_batched_read_is_one_gather_and_gives_what_indexing_gives(path, monkeypatch):
    with pskd_jax.Reader(path) as reader:
        calls = []
        original = reader.gather_leaves
        monkeypatch.setattr(reader, "gather_leaves", lambda indices: calls.append(list(indices)) or original(indices))
        dataset = grain.MapDataset.source(reader)
        got = dataset._getitems([7, 0, 49, 7])
        assert calls == [[7, 0, 49, 7]]  # one read for the whole batch, through grain's own hook
        for sample, i in zip(got, [7, 0, 49, 7]):
            assert same_samples(sample, reader[i])
        assert reader.__getitems__([]) == [] and reader._getitems([-1])[0][1] == reader[COUNT - 1][1]


def test_corpus_windows_are_a_grain_source_with_batched_reads(corpus):
    from grain._src.python.dataset import base

    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        assert isinstance(windows, base.SupportsBatchedReadRandomAccessDataSource)
        dataset = grain.MapDataset.source(windows).shuffle(seed=1)
        order = grain.MapDataset.range(len(windows)).shuffle(seed=1)
        picked = [int(order[j]) for j in range(6)]
        got = dataset._getitems(list(range(6)))
        for (inputs, targets), w in zip(got, picked):
            want_inputs, want_targets = windows[w]
            assert np.array_equal(inputs, want_inputs) and np.array_equal(targets, want_targets)
            assert np.array_equal(inputs[1:], targets[:-1])


def test_grain_iterates_a_reader_and_windows_to_their_end_as_a_plain_loop_does(path, corpus):
    with pskd_jax.Reader(path) as reader, pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        for source in (reader, windows):
            plain = list(source)
            assert len(plain) == len(source)
            through_grain = list(grain.MapDataset.source(source).to_iter_dataset())
            assert len(through_grain) == len(plain)
            assert all(same_samples(g, w) for g, w in zip(through_grain, plain))


def test_grain_batches_stack_what_gather_reads(corpus):
    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        batches = grain.MapDataset.source(windows).batch(5, drop_remainder=True)
        assert len(batches) == len(windows) // 5
        for j in (0, len(batches) - 1):
            inputs, targets = batches[j]
            want_inputs, want_targets = windows.gather(np.arange(5 * j, 5 * j + 5))
            assert np.array_equal(inputs, want_inputs) and np.array_equal(targets, want_targets)


def test_one_epoch_of_a_data_loader_over_windows_ends_with_each_window_once(corpus):
    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        sampler = grain.samplers.IndexSampler(num_records=len(windows), shard_options=grain.sharding.NoSharding(),
                                              shuffle=True, num_epochs=1, seed=2)
        got = list(grain.DataLoader(data_source=windows, sampler=sampler, worker_count=0))
        assert len(got) == len(windows)
        seen = collections.Counter(tuple(inputs.tolist()) for inputs, _ in got)
        assert seen == collections.Counter(tuple(inputs.tolist()) for inputs, _ in windows)


# --- repr: the identity grain checks ---------------------------------------------------------------


def test_the_repr_is_the_content_s_identity_the_same_for_a_new_reader_wherever_the_file_lies(path, tmp_path,
                                                                                              monkeypatch):
    with pskd_jax.Reader(path) as first, pskd_jax.Reader(str(path)) as second:
        shown = repr(first)
        assert shown == repr(second) == repr(first)  # new object, same file: same repr
        assert shown.startswith(f"Reader(type={TYPE!r}, count={COUNT}, bytes=")
        assert "0x" not in shown and "object at" not in shown and str(tmp_path) not in shown
    monkeypatch.chdir(tmp_path)
    with pskd_jax.Reader("w.psk.d") as relative:
        assert repr(relative) == shown
    moved = tmp_path / "elsewhere" / "renamed.psk.d"
    moved.parent.mkdir()
    shutil.copyfile(path, moved)
    with pskd_jax.Reader(moved) as copy:
        assert repr(copy) == shown  # the same bytes in another place: the same data


def test_the_repr_equals_the_earlier_form_that_held_the_path_only_when_the_identity_matches(path, tmp_path):
    with pskd_jax.Reader(path) as reader:
        shown = repr(reader)
    identity = shown.removeprefix("Reader(").removesuffix(")")
    for earlier in (f"Reader({str(path.resolve())!r}, {identity})", f"Reader('/gone/w.psk.d', {identity})"):
        assert earlier == shown and shown == earlier  # (grain asks !=, which must then be False)
        assert not operator.ne(earlier, shown) and not operator.ne(shown, earlier)
    for other in (f"Reader('/x', {identity[:-1]}0)", f"CorpusWindows('/x', {identity})", f"Reader(3, {identity})",
                  f"Reader(, {identity})", shown + " "):
        assert other != shown and shown != other and not operator.eq(other, shown)


def test_the_repr_tells_another_content_of_the_same_size_apart(path):
    with pskd_jax.Reader(path) as reader:
        before = repr(reader)
    write_windows(path, seed=6)  # same type, count and size; other values
    with pskd_jax.Reader(path) as reader:
        assert repr(reader) != before
        assert repr(reader).split("sampled_xxh3=")[0] == before.split("sampled_xxh3=")[0]


def test_the_corpus_repr_names_the_manifest_and_window_shape(corpus):
    with pskd_jax.CorpusWindows(corpus, seq=16) as a, pskd_jax.CorpusWindows(corpus, seq=16) as b, \
            pskd_jax.CorpusWindows(corpus, seq=16, stride=8) as c:
        assert repr(a) == repr(b) != repr(c)
        assert repr(a).startswith(f"CorpusWindows(seq=16, stride=16, windows={len(a)}, ")


def test_the_corpus_repr_is_the_same_once_the_corpus_is_moved(corpus, tmp_path):
    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        shown = repr(windows)
    moved = tmp_path / "moved-corpus"
    shutil.move(corpus.parent, moved)
    with pskd_jax.CorpusWindows(moved / "shards.json", seq=16) as windows:
        assert repr(windows) == shown


# --- a DataLoader checkpoint restored over a new source -----------------------------------------


def test_a_data_loader_state_restores_over_a_new_reader_of_the_same_file(path):
    with pskd_jax.Reader(path) as reader:
        iterator = iter(loader(reader))
        seen = [next(iterator) for _ in range(5)]
        state = iterator.get_state()
        expected = [next(iterator) for _ in range(8)]  # crosses into the second epoch
    with pskd_jax.Reader(path) as new_reader:
        restored = iter(loader(new_reader))
        restored.set_state(state)
        for want in expected:
            got = next(restored)
            assert same_samples(got, want)
    assert len({tuple(np.asarray(b[1]).tolist()) for b in seen + expected}) == len(seen + expected)


def test_a_data_loader_state_restores_once_the_file_is_moved_and_from_a_state_that_named_its_path(path, tmp_path):
    with pskd_jax.Reader(path) as reader:
        iterator = iter(loader(reader))
        for _ in range(3):
            next(iterator)
        state = iterator.get_state()
        expected = [next(iterator) for _ in range(4)]
        identity = repr(reader).removeprefix("Reader(").removesuffix(")")
    moved = tmp_path / "data" / "moved.psk.d"
    moved.parent.mkdir()
    shutil.move(path, moved)
    saved = json.loads(state)
    earlier = json.dumps({**saved, "data_source": f"Reader({str(path.resolve())!r}, {identity})"}).encode()
    for given in (state, earlier):  # (earlier: as versions that put the path in the repr saved it)
        with pskd_jax.Reader(moved) as new_reader:
            restored = iter(loader(new_reader))
            restored.set_state(given)
            for want in expected:
                assert same_samples(next(restored), want)


def test_a_data_loader_state_is_refused_over_other_data(path, tmp_path):
    with pskd_jax.Reader(path) as reader:
        iterator = iter(loader(reader))
        next(iterator)
        state = iterator.get_state()
    other = write_windows(tmp_path / "other.psk.d", seed=8)  # another file, other values
    write_windows(path, seed=9)  # the same file rewritten with other values
    for source in (other, path):
        with pskd_jax.Reader(source) as new_reader:
            restored = iter(loader(new_reader))
            with pytest.raises(ValueError, match="DataSource in checkpoint does not match"):
                restored.set_state(state)


def test_a_data_loader_over_corpus_windows_restores_over_new_windows(corpus):
    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        iterator = iter(loader(windows, batch=3))
        for _ in range(4):
            next(iterator)
        state = iterator.get_state()
        expected = [next(iterator) for _ in range(4)]
    with pskd_jax.CorpusWindows(corpus, seq=16) as windows:
        restored = iter(loader(windows, batch=3))
        restored.set_state(state)
        for want in expected:
            assert same_samples(next(restored), want)


# Grain's worker processes read absl flags, which must be parsed first; a process of its own keeps
# that global state out of the test process.
WORKERS = """
import sys
import numpy as np
from absl import flags
import grain
import pskd_jax

flags.FLAGS.mark_as_parsed()

def make(reader):
    sampler = grain.samplers.IndexSampler(num_records=len(reader), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=3)
    return grain.DataLoader(data_source=reader, sampler=sampler, worker_count=2,
                            operations=[grain.transforms.Batch(batch_size=5, drop_remainder=True)])

iterator = iter(make(pskd_jax.Reader(sys.argv[1])))
first = [next(iterator) for _ in range(3)]
state = iterator.get_state()
expected = [next(iterator) for _ in range(4)]
restored = iter(make(pskd_jax.Reader(sys.argv[1])))
restored.set_state(state)
for want in expected:
    got = next(restored)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
print("ok", len(expected))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_worker_processes_restore_over_a_new_reader(path):
    done = subprocess.run([sys.executable, "-c", WORKERS, str(path)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2])))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "4"]
