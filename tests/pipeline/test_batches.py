"""Batches of a pipeline (pskd_jax.pipeline.batches): epochs as slices of the shuffle, take, and
iterator states that resume the exact stream."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from pskd_jax.errors import PskdError
from pskd_jax.pipeline.batches import IteratorState, Pipeline
from pskd_jax.pipeline.shuffle import shuffle_order


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=0), dict(batch_size=2.0), dict(take=0), dict(seed=-1), dict(seed=2**64), dict(seed=True)]
)
def test_a_pipeline_built_directly_is_checked_too(kwargs):
    fields = dict(path="d", seed=None, batch_size=2, take=None) | kwargs
    with pytest.raises(PskdError) as raised:
        Pipeline(**fields)
    assert raised.value.code == "E9010"


def test_batches_per_epoch_drops_the_incomplete_group_and_caps_at_take():
    assert Pipeline("d", None, 4, None).batches_per_epoch(10) == 2
    assert Pipeline("d", None, 4, None).batches_per_epoch(12) == 3
    assert Pipeline("d", None, 4, None).batches_per_epoch(3) == 0
    assert Pipeline("d", 1, 4, 2).batches_per_epoch(100) == 2
    assert Pipeline("d", 1, 4, 50).batches_per_epoch(100) == 25


def test_batch_indices_follow_the_shuffle_order():
    pipeline = Pipeline("d", 42, 4, None)
    order = shuffle_order(1000, seed=42, epoch=1)
    for j in range(4):
        assert np.array_equal(pipeline.batch_indices(1000, 1, j), order[4 * j : 4 * j + 4])
    assert pipeline.batch_indices(1000, 1, 0).tolist() == [156, 421, 538, 754]
    assert pipeline.batch_indices(1000, 1, 0).dtype == np.int64


def test_batch_indices_without_shuffle_are_consecutive():
    pipeline = Pipeline("d", None, 3, None)
    assert pipeline.batch_indices(10, 5, 2).tolist() == [6, 7, 8]


def test_batch_indices_argument_errors():
    pipeline = Pipeline("d", 1, 4, 2)
    for kwargs in (dict(n=100, epoch=0, j=0), dict(n=100, epoch=1, j=2), dict(n=100, epoch=1, j=-1),
                   dict(n=-1, epoch=1, j=0)):
        with pytest.raises(PskdError) as raised:
            pipeline.batch_indices(**kwargs)
        assert raised.value.code == "E9004"


def test_one_epoch_without_shuffle_is_file_order_minus_the_last_group():
    batches = [b.tolist() for _, b in Pipeline("d", None, 3, None).iter_batches(10, epochs=1)]
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_an_epoch_is_a_slice_of_the_permutation():
    n, size = 103, 10
    batches = [b for _, b in Pipeline("d", 9, size, None).iter_batches(n, epochs=1)]
    assert len(batches) == 10
    joined = np.concatenate(batches)
    assert np.array_equal(joined, shuffle_order(n, seed=9, epoch=1)[:100])
    assert len(set(joined.tolist())) == 100  # no sample twice within an epoch


def test_take_applies_to_each_epoch():
    stream = list(Pipeline("d", 5, 4, 2).iter_batches(100, epochs=3))
    assert [state for state, _ in stream] == [
        IteratorState(1, 1), IteratorState(2, 0), IteratorState(2, 1), IteratorState(3, 0), IteratorState(3, 1),
        IteratorState(4, 0),
    ]
    for k, (_, indices) in enumerate(stream):
        epoch, j = k // 2 + 1, k % 2
        assert np.array_equal(indices, shuffle_order(100, seed=5, epoch=epoch)[4 * j : 4 * j + 4])


def test_epochs_differ_and_repeat_deterministically():
    pipeline = Pipeline("d", 5, 10, None)
    first = [b.tolist() for _, b in pipeline.iter_batches(50, epochs=2)]
    assert first[:5] != first[5:]
    assert first == [b.tolist() for _, b in pipeline.iter_batches(50, epochs=2)]


def test_the_stream_runs_on_without_an_epoch_limit():
    stream = Pipeline("d", 1, 2, None).iter_batches(5)
    states = [state for state, _ in itertools.islice(stream, 9)]
    assert states[-1] == IteratorState(5, 1)


@pytest.mark.parametrize("pipeline",
                         [Pipeline("d", 77, 3, None), Pipeline("d", None, 4, None), Pipeline("d", 2**64 - 1, 5, 3)])
def test_state_saved_at_every_step_resumes_the_exact_stream(pipeline):
    n = 23
    reference = [(state, batch.tolist()) for state, batch in pipeline.iter_batches(n, epochs=3)]
    saved = [IteratorState()] + [state for state, _ in reference]
    for k, state in enumerate(saved):
        restored = IteratorState.from_json(json.loads(json.dumps(state.to_json())))
        assert restored == state
        rest = [(s, b.tolist()) for s, b in pipeline.iter_batches(n, restored, epochs=3)]
        assert rest == reference[k:], k


def test_the_stream_after_a_restore_equals_batch_indices():
    pipeline = Pipeline("d", 3, 4, None)
    stream = pipeline.iter_batches(30, IteratorState(2, 5))
    state, indices = next(stream)
    assert state == IteratorState(2, 6)
    assert np.array_equal(indices, pipeline.batch_indices(30, 2, 5))
    state, _ = next(stream)
    assert state == IteratorState(3, 0)  # 7 batches an epoch: batch 6 was the last of epoch 2


def test_a_state_at_the_end_of_an_epoch_continues_with_the_next():
    pipeline = Pipeline("d", 3, 4, None)
    first = next(pipeline.iter_batches(30, IteratorState(1, 7)))
    assert first[0] == IteratorState(2, 1)
    assert np.array_equal(first[1], pipeline.batch_indices(30, 2, 0))


def test_iterator_errors():
    pipeline = Pipeline("d", 3, 4, None)
    with pytest.raises(PskdError) as raised:
        pipeline.iter_batches(3)
    assert raised.value.code == "E9010" and "no batch of 4 from 3 samples" in raised.value.message
    with pytest.raises(PskdError) as raised:
        pipeline.iter_batches(30, IteratorState(1, 8))
    assert raised.value.code == "E9004" and "beyond the 7 batches" in raised.value.message
    with pytest.raises(PskdError):
        pipeline.iter_batches(30, {"epoch": 1, "batch": 0})  # type: ignore[arg-type]
    with pytest.raises(PskdError):
        pipeline.iter_batches(30, epochs=-1)


@pytest.mark.parametrize("data", [{"epoch": 0, "batch": 0}, {"epoch": 1, "batch": -1}, {"epoch": 1},
                                  {"epoch": "1", "batch": 0}, [1, 0], {"epoch": True, "batch": 0}])
def test_bad_states_are_refused(data):
    with pytest.raises(PskdError) as raised:
        IteratorState.from_json(data)
    assert raised.value.code == "E9004"


def test_state_accepts_numpy_integers_and_stays_json():
    state = IteratorState(np.int64(2), np.int32(3))
    assert json.dumps(state.to_json()) == '{"epoch": 2, "batch": 3}'
