"""The source core (pskd_jax.format.source) as a Reader shows it: Python's sequence protocol (indices,
negatives, the two error pairs, iteration, numpy), the index rules as properties, and the byte-source
interface (runs of records, a byte source that only reads spans)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.errors import (
    IndexOutOfRangeError,
    IndexTypeError,
    PskdError,
    TruncatedError,
    UsageError,
    error_class,
)
from pskd_jax.format import source as source_module
from pskd_jax.format.byte_sources import ByteSource, FileBytes, Runs, read_runs
from pskd_jax.format.reader import Reader
from pskd_jax.format.source import checked_access, checked_index, checked_positions
from pskd_jax.format.writer import write
from tests.helpers import raises

COUNT = 23


@pytest.fixture
def pairs(tmp_path):
    """(idx[64][3], ℝ[]) samples, and the file they are in."""
    rng = np.random.default_rng(11)
    tokens, values = rng.integers(0, 64, size=(COUNT, 3)), rng.standard_normal(COUNT)
    path = tmp_path / "p.psk.d"
    write(path, "(idx[64][3], ℝ[])", (tokens, values))
    return path, tokens, values


@pytest.fixture
def rows(tmp_path):
    """A one-leaf file: each sample is one array, so a list of samples is one numpy array."""
    data = np.arange(COUNT * 4, dtype=np.float64).reshape(COUNT, 4)
    path = tmp_path / "r.psk.d"
    write(path, "ℝ[4]", data)
    return path, data


# --- the two error pairs ----------------------------------------------------------------------------


def test_the_error_pairs_are_both_kinds_and_keep_their_codes_and_classes_through_pickle():
    out, wrong = IndexOutOfRangeError("f: sample 9"), IndexTypeError("f: an index is an integer")
    assert isinstance(out, TruncatedError) and isinstance(out, IndexError) and out.code == "E9003"
    assert isinstance(wrong, UsageError) and isinstance(wrong, TypeError) and wrong.code == "E9012"
    for error in (out, wrong):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
    # The class a code names stays the plain one: PskdError("E9003", …) is not an IndexError.
    assert error_class("E9003") is TruncatedError and not isinstance(PskdError("E9003", "m"), IndexError)


# --- the sequence protocol ----------------------------------------------------------------------------


def test_a_for_loop_over_a_reader_stops_after_the_last_sample_and_gives_what_indexing_gives(pairs):
    path, tokens, values = pairs
    with Reader(path) as reader:
        seen = [sample for sample in reader]  # noqa: C416  # (the plain loop is what is tested)
        assert len(seen) == COUNT
        for k, (t, v) in enumerate(seen):
            assert t.tolist() == tokens[k].tolist() and v.shape == () and float(v) == values[k]
        assert [t.tolist() for t, _ in reversed(reader)] == tokens[::-1].tolist()  # __len__ + __getitem__
        with pytest.raises(IndexError):
            reader[len(reader)]
        it = iter(reader)
        assert len(list(it)) == COUNT and list(it) == []  # exhausted, not an error


def test_iteration_reads_in_blocks_of_one_gather_each(pairs, monkeypatch):
    path, tokens, _ = pairs
    monkeypatch.setattr(source_module, "ITERATION_BLOCK", 5)
    with Reader(path) as reader:
        calls = []
        original = reader.gather_leaves
        monkeypatch.setattr(reader, "gather_leaves", lambda indices: calls.append(len(indices)) or original(indices))
        assert [t.tolist() for t, _ in reader] == tokens.tolist()
        assert calls == [5, 5, 5, 5, 3]


def test_iterating_an_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "e.psk.d"
    write(path, "ℝ[2]", np.zeros((0, 2)))
    with Reader(path) as reader:
        assert list(reader) == [] and reader.gather([]).shape == (0, 2)
        raises("E9003", reader.__getitem__, 0)
        raises("E9003", reader.__getitem__, -1)


def test_numpy_takes_a_list_of_samples_and_the_reader_itself(rows):
    path, data = rows
    with Reader(path) as reader:
        assert np.array_equal(np.asarray([reader[k] for k in range(COUNT)]), data)
        assert np.array_equal(np.asarray(list(reader)), data)
        as_array = np.asarray(reader)  # numpy walks the sequence protocol
        assert as_array.shape == (COUNT, 4) and np.array_equal(as_array, data)
        assert np.array_equal(np.asarray(reader.__getitems__([3, 1])), data[[3, 1]])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                                   np.intp])
def test_every_numpy_integer_indexes_and_gathers(rows, dtype):
    path, data = rows
    with Reader(path) as reader:
        assert reader[dtype(7)].tolist() == data[7].tolist()
        assert reader.gather(np.array([7, 0, 22], dtype)).tolist() == data[[7, 0, 22]].tolist()
        if np.issubdtype(dtype, np.signedinteger):
            assert reader[dtype(-1)].tolist() == data[-1].tolist()
            assert reader.gather(np.array([-1, -23], dtype)).tolist() == data[[-1, -23]].tolist()


def test_an_index_with_dunder_index_is_an_integer(rows):
    class Three:
        def __index__(self) -> int:
            return 3

    path, data = rows
    with Reader(path) as reader:
        assert reader[Three()].tolist() == data[3].tolist()


def test_a_closed_reader_refuses_to_read_but_keeps_its_length(rows):
    path, _ = rows
    reader = Reader(path)
    reader.close()
    assert len(reader) == COUNT
    for read in (lambda: reader[0], lambda: reader.gather([0]), lambda: list(reader), lambda: reader.__getitems__([1])):
        error = raises("E9012", read)
        assert "closed" in error.message


# --- the index rules, as properties ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 40), index=st.integers(-2**70, 2**70) | st.integers(-45, 45))
def test_one_index_follows_pythons_rule(count, index):
    expected = list(range(count))
    try:
        want = expected[index]
    except IndexError:
        with pytest.raises(IndexOutOfRangeError):
            checked_index(index, count, "f", "sample")
        return
    assert checked_index(index, count, "f", "sample") == want


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 40), indices=st.lists(st.integers(-45, 45), max_size=12),
       dtype=st.sampled_from([np.int8, np.int16, np.int64]))
def test_an_array_of_indices_follows_numpys_rule(count, indices, dtype):
    array = np.array(indices, dtype)
    expected = np.arange(count)
    try:
        want = expected[array]
    except IndexError:
        with pytest.raises(IndexOutOfRangeError) as caught:
            checked_positions(array, count, "f", "sample")
        first = next(i for i in indices if not -count <= i < count)
        assert f"sample {first} is beyond" in caught.value.message  # the first bad one, named
        return
    got = checked_positions(array, count, "f", "sample")
    assert got.dtype == np.intp and got.tolist() == want.tolist()


def test_positions_never_write_into_the_callers_array():
    indices = np.array([-1, 2, -3])
    checked_positions(indices, 5, "f", "sample")
    assert indices.tolist() == [-1, 2, -3]


def test_an_access_mode_is_one_of_two():
    assert checked_access("pread", "f") == "pread"
    error = raises("E9012", checked_access, "read", "f")
    assert "mmap, pread" in error.message and "'read'" in error.message


# --- where the bytes come from -----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(positions=st.lists(st.integers(0, 30), max_size=20))
def test_runs_of_records_cover_each_position_once_in_order(positions):
    array = np.array(positions, np.int64)
    runs = Runs.of_records(array, 3, 100)
    assert runs.lengths.sum() == 3 * len(positions)
    covered = np.concatenate([np.arange(o, o + n) for o, n in zip(runs.offsets, runs.lengths)] or [np.zeros(0)])
    expected = np.concatenate([np.arange(100 + 3 * p, 103 + 3 * p) for p in positions] or [np.zeros(0)])
    assert covered.tolist() == expected.tolist()
    assert runs.starts.tolist() == np.concatenate(([0], np.cumsum(runs.lengths)[:-1])).tolist()[:len(runs.starts)]
    assert len(runs.offsets) == (0 if not positions else 1 + int(np.sum(np.diff(array) != 1)))


class MemoryBytes(ByteSource):
    """A byte source that only reads spans (what a ranged-read source implements): no map."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data, self.name, self.reads = data, name, 0

    def size(self) -> int:
        return len(self.data)

    def read_spans(self, spans, offsets) -> None:
        self.reads += 1
        for span, offset in zip(spans, offsets):
            if offset + len(span) > len(self.data):
                raise TruncatedError(f"{self.name}: ends before byte {offset + len(span)}")
            span[:] = self.data[offset : offset + len(span)]


def test_a_byte_source_that_only_reads_spans_serves_runs_over_several_sources():
    a, b = MemoryBytes(bytes(range(50)), "a"), MemoryBytes(bytes(range(100, 150)), "b")
    runs = Runs.of_rows(np.array([10, 0, 40, 3]), 4, sources=np.array([1, 0, 1, 0]))
    out = read_runs([a, b], runs, np.zeros((4, 4), np.uint8), "ab")
    assert out.tolist() == [[110, 111, 112, 113], [0, 1, 2, 3], [140, 141, 142, 143], [3, 4, 5, 6]]
    assert (a.reads, b.reads) == (1, 1)  # one call a source, its runs together
    assert a.mapped(50) is None
    raises("E9003", read_runs, [a], Runs.of_rows(np.array([48]), 4), np.zeros((1, 4), np.uint8), "a")


def test_file_bytes_read_runs_and_map_the_same_bytes(pairs):
    path, _, _ = pairs
    data = path.read_bytes()
    source = FileBytes(str(path))
    try:
        runs = Runs.of_records(np.array([2, 3, 4, 9, 0]), 8, 5)
        out = read_runs([source], runs, np.zeros(40, np.uint8), str(path))
        want = b"".join(data[5 + 8 * p : 13 + 8 * p] for p in (2, 3, 4, 9, 0))
        assert out.tobytes() == want and len(runs.offsets) == 3
        mapped = source.mapped(len(data))
        assert mapped is source.mapped(len(data)) and bytes(mapped[:4]) == b"PSKD"
        assert source.size() == len(data)
    finally:
        source.close()
    raises("E9003", source.size)
