"""The reference's binding form of a pipeline (``data = stream "…" |> …``), and one answer when
``batch(B = n)`` is larger than the file: E9010 from the API and from ``pskd pipeline`` alike."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax.errors import PskdError
from pskd_jax.pipeline import Pipeline, load_pipeline, parse_pipeline

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAIN = 'stream "w.psk.d" |> shuffle(seed = 3) |> batch(B = 4) |> take(n = 2)'


@pytest.mark.parametrize("binding", ["data = ", "train_data=", "d2 =\n  ", "stream = ", "_ = "])
def test_a_pipeline_bound_to_a_name_is_the_same_pipeline(binding):
    assert parse_pipeline(binding + PLAIN, base_dir="/d") == parse_pipeline(PLAIN, base_dir="/d")


def test_a_pipeline_file_may_bind_its_pipeline(tmp_path):
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    (tmp_path / "train.pipeline").write_text(f"data = {PLAIN}\n")
    pipeline = load_pipeline(tmp_path / "train.pipeline")
    assert pipeline.path == str(tmp_path / "w.psk.d") and pipeline.batch_size == 4 and pipeline.take == 2


@pytest.mark.parametrize("text, where, expected", [
    ('data stream "w" |> batch(B = 1)', "1:1", "expected 'stream' at the start of the pipeline, found 'data'"),
    ('data = = stream "w" |> batch(B = 1)', "1:8", "expected 'stream' after data ="),
    ('= stream "w" |> batch(B = 1)', "1:1", "expected 'stream'"),
    ('data =', "1:7", "expected 'stream' after data =, found the end of the text"),
    ('1data = stream "w" |> batch(B = 1)', "1:1", "expected 'stream'"),
])
def test_a_malformed_binding_is_refused_naming_where(text, where, expected):
    with pytest.raises(PskdError) as caught:
        parse_pipeline(text)
    assert caught.value.code == "E9010"
    assert f"pipeline:{where}: " in caught.value.message and expected in caught.value.message


def test_a_batch_larger_than_the_file_is_refused_by_the_api():
    pipeline = parse_pipeline('stream "w" |> batch(B = 11)')
    assert pipeline.batches_per_epoch(10) == 0  # the query answers plainly
    for attempt in (lambda: pipeline.check_batches(10), lambda: next(pipeline.iter_batches(10))):
        with pytest.raises(PskdError) as caught:
            attempt()
        assert caught.value.code == "E9010"
        assert "makes no batch of 11 from 10 samples" in caught.value.message
        assert caught.value.message.startswith("pipeline:1:15: "), caught.value.message  # where B is written
    assert pipeline.check_batches(11) == 1
    with pytest.raises(PskdError) as caught:  # (one sample, one asked for: each counted as it is)
        parse_pipeline('stream "w" |> batch(B = 1)').check_batches(0)
    assert "makes no batch of 1 from 0 samples: the source needs at least 1 sample, or" in caught.value.message
    with pytest.raises(PskdError) as caught:
        pipeline.check_batches(1)
    assert "from 1 sample: the source needs at least 11 samples" in caught.value.message
    text = 'data = stream "w"\n  |> shuffle(seed = 1)\n  |> batch(B = 11)'
    with pytest.raises(PskdError) as caught:
        parse_pipeline(text, source="train.pipeline").check_batches(3)
    assert caught.value.message.startswith("train.pipeline:3:6: stream \"w\" |> shuffle(seed = 1) |> batch(B = 11) "
                                           "makes no batch"), caught.value.message
    assert parse_pipeline(text) == Pipeline("w", 1, 11)  # (where it is written takes no part in equality)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_command_gives_the_same_answer_as_the_api(tmp_path):
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    run = lambda text: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "pskd_jax.apps.pskd", "pipeline", text], capture_output=True, text=True,
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    refused = run('data = stream "w.psk.d" |> batch(B = 11)')
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("pskd: E9010: TEXT:1:28: ") and "makes no batch of 11 from 10" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    accepted = run('data = stream "w.psk.d" |> batch(B = 10)')
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.splitlines()[-1] == "epoch 1 batch 0: 0 1 2 3 4 5 6 7 8 9"
