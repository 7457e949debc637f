"""Pipeline text and its evaluation: parse errors with columns, batches, take, epochs, and the
iterator state saved and restored at every step."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from pskd_jax.errors import PskdError
from pskd_jax.pipeline.batches import IteratorState, Pipeline
from pskd_jax.pipeline.parse import load_pipeline, parse_pipeline
from pskd_jax.pipeline.shuffle import shuffle_order

FULL = 'stream "train.psk.d" |> shuffle(seed = 42) |> batch(B = 4) |> take(n = 3)'


def test_parse_the_full_pipeline():
    pipeline = parse_pipeline(FULL, base_dir="/data")
    assert pipeline == Pipeline(path="/data/train.psk.d", seed=42, batch_size=4, take=3)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('stream "a" |> batch(B = 1)', Pipeline("base/a", None, 1, None)),
        ('stream "a"|>shuffle(seed=0)|>batch(B=7)', Pipeline("base/a", 0, 7, None)),
        ('stream "a" |> batch(B = 2) |> take(n = 9)', Pipeline("base/a", None, 2, 9)),
        ('\n  stream "dir/a b.psk.d"\n  |> shuffle(seed = 18446744073709551615)\n  |> batch(B = 32)\n', Pipeline("base/dir/a b.psk.d", 2**64 - 1, 32, None)),
        ('stream "/abs/a" |> batch(B = 3)', Pipeline("/abs/a", None, 3, None)),
    ],
)
def test_parse_whitespace_is_free_and_stages_optional(text, expected):
    assert parse_pipeline(text, base_dir="base") == expected


def test_str_writes_the_canonical_text_back():
    pipeline = parse_pipeline(FULL, base_dir="/data")
    assert str(pipeline) == 'stream "/data/train.psk.d" |> shuffle(seed = 42) |> batch(B = 4) |> take(n = 3)'
    assert parse_pipeline(str(pipeline)) == pipeline


@pytest.mark.parametrize(
    "text, message",
    [
        ('stream "d" |> shuffle(seed = 42x) |> batch(B = 1)', "pipeline:1:32: expected ')' after seed = 42, found 'x'"),
        ('strem "d" |> batch(B = 1)', "pipeline:1:1: expected 'stream' at the start of the pipeline, found 'strem'"),
        ("stream d |> batch(B = 1)", "pipeline:1:8: expected a quoted path (\"…\") after stream, found 'd'"),
        ('stream "d |> batch(B = 1)', "pipeline:1:8: unterminated path"),
        ('stream "" |> batch(B = 1)', "pipeline:1:8: expected a non-empty path"),
        ('stream "d"', "pipeline:1:11: expected '|> batch(B = n)' after stream \"d\""),
        ('stream "d" |> shuffle(seed = 1)', "pipeline:1:32: expected '|> batch(B = n)' after shuffle(seed = 1)"),
        ('stream "d" batch(B = 1)', "pipeline:1:12: expected '|>' or the end of the pipeline after stream \"d\", found 'batch'"),
        ('stream "d" |> batch(B = 0)', "pipeline:1:25: B must be an integer >= 1, got B = 0"),
        ('stream "d" |> batch(B = -1)', "pipeline:1:25: expected an integer >= 1 after B =, found '-'"),
        ('stream "d" |> batch(B = 2) |> take(n = 0)', "pipeline:1:40: n must be an integer >= 1, got n = 0"),
        (
            'stream "d" |> shuffle(seed = 18446744073709551616) |> batch(B = 1)',
            "pipeline:1:30: seed must be an integer in [0, 2**64), got seed = 18446744073709551616",
        ),
        ('stream "d" |> batch(n = 3)', "pipeline:1:21: expected 'B' after batch(, found 'n'"),
        ('stream "d" |> batch B = 3', "pipeline:1:21: expected '(' after batch, found 'B'"),
        ('stream "d" |> batch(B 3)', "pipeline:1:23: expected '=' after batch(B, found '3'"),
        ('stream "d" |> repeat(n = 2) |> batch(B = 1)', "pipeline:1:15: expected a stage (shuffle, batch or take) after '|>', found 'repeat'"),
        ('stream "d" |> batch(B = 1) |>', "pipeline:1:30: expected a stage (shuffle, batch or take) after '|>', found the end of the text"),
        ('stream "d" |> batch(B = 1) |> batch(B = 2)', "pipeline:1:31: duplicate stage 'batch' (first at 1:15)"),
        ('stream "d" |> batch(B = 1) |> shuffle(seed = 2)', "pipeline:1:31: stage 'shuffle' must come before 'batch'"),
        ('stream "d" |> take(n = 1) |> batch(B = 2)', "pipeline:1:30: stage 'batch' must come before 'take'"),
        ('stream "d" |> batch(B = 1) ;', "pipeline:1:28: expected '|>' or the end of the pipeline after batch(B = 1), found ';'"),
        ('stream "d"\n |> batch(B = 1)\n |> take(n = x)', "pipeline:3:14: expected an integer >= 1 after n =, found 'x'"),
    ],
)
def test_parse_errors_name_line_column_and_what_was_expected(text, message):
    with pytest.raises(PskdError) as raised:
        parse_pipeline(text)
    assert raised.value.code == "E9010"
    assert message in raised.value.message, raised.value.message


def test_parse_refuses_what_is_not_text():
    with pytest.raises(PskdError) as raised:
        parse_pipeline(b'stream "d" |> batch(B = 1)')  # type: ignore[arg-type]
    assert raised.value.code == "E9010"


def test_load_resolves_the_path_against_the_file_directory(tmp_path, monkeypatch):
    (tmp_path / "runs" / "data").mkdir(parents=True)
    text_file = tmp_path / "runs" / "train.pipeline"
    text_file.write_text('stream "data/train.psk.d" |> shuffle(seed = 3) |> batch(B = 8)\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # a relative file path; the result must not depend on the cwd later
    pipeline = load_pipeline(os.path.join("runs", "train.pipeline"))
    assert pipeline.path == os.path.join(str(tmp_path), "runs", "data/train.psk.d")
    assert (pipeline.seed, pipeline.batch_size, pipeline.take) == (3, 8, None)


def test_a_pipeline_file_streams_only_inside_its_directory_or_root(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.psk.d").write_bytes(b"")
    os.symlink(tmp_path / "data", tmp_path / "runs" / "link-out")
    os.symlink("inside.psk.d", tmp_path / "runs" / "link-in.psk.d")
    text_file = tmp_path / "runs" / "train.pipeline"

    def load(path_text, **options):
        text_file.write_text(f'stream "{path_text}" |> batch(B = 8)\n', encoding="utf-8")
        return load_pipeline(text_file, **options)

    for outside in ["../data/train.psk.d", str(tmp_path / "data" / "train.psk.d"), "/etc/passwd",
                    "link-out/train.psk.d", "sub/../../data/train.psk.d", ".", "./"]:
        with pytest.raises(PskdError) as raised:
            load(outside)
        assert raised.value.code == "E9010", outside
        assert str(text_file) in raised.value.message and "outside" in raised.value.message
    assert load("link-in.psk.d").path == str(tmp_path / "runs" / "link-in.psk.d")  # a symlink that stays in
    assert load("sub/../x.psk.d").path.endswith("sub/../x.psk.d")
    assert os.path.normpath(load("../data/train.psk.d", root=tmp_path).path) == str(tmp_path / "data" / "train.psk.d")
    assert load("link-out/train.psk.d", root=tmp_path).path.endswith("link-out/train.psk.d")
    with pytest.raises(PskdError):
        load("/etc/passwd", root=tmp_path)
    # Text the caller gives directly is the caller's own argument: any path.
    assert parse_pipeline('stream "/etc/passwd" |> batch(B = 1)').path == "/etc/passwd"


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.pipeline"
    bad.write_text('stream "d"\n|> batch(B = 2x)', encoding="utf-8")
    with pytest.raises(PskdError) as raised:
        load_pipeline(bad)
    assert raised.value.code == "E9010"
    assert raised.value.message.startswith(f"{bad}:2:15: expected ')'")
    with pytest.raises(PskdError) as raised:
        load_pipeline(tmp_path / "missing.pipeline")
    assert raised.value.code == "E9010" and "cannot read the pipeline file" in raised.value.message


# --- evaluation -------------------------------------------------------------------------------


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
    for kwargs in (dict(n=100, epoch=0, j=0), dict(n=100, epoch=1, j=2), dict(n=100, epoch=1, j=-1), dict(n=-1, epoch=1, j=0)):
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
        IteratorState(1, 1), IteratorState(2, 0), IteratorState(2, 1), IteratorState(3, 0), IteratorState(3, 1), IteratorState(4, 0)
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


@pytest.mark.parametrize("pipeline", [Pipeline("d", 77, 3, None), Pipeline("d", None, 4, None), Pipeline("d", 2**64 - 1, 5, 3)])
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


@pytest.mark.parametrize("data", [{"epoch": 0, "batch": 0}, {"epoch": 1, "batch": -1}, {"epoch": 1}, {"epoch": "1", "batch": 0}, [1, 0], {"epoch": True, "batch": 0}])
def test_bad_states_are_refused(data):
    with pytest.raises(PskdError) as raised:
        IteratorState.from_json(data)
    assert raised.value.code == "E9004"


def test_state_accepts_numpy_integers_and_stays_json():
    state = IteratorState(np.int64(2), np.int32(3))
    assert json.dumps(state.to_json()) == '{"epoch": 2, "batch": 3}'
