"""``pskd pipeline`` run as a user runs it: the indices a pipeline feeds, and pipeline files that
stream outside their directory."""

from __future__ import annotations

import numpy as np
import pytest

import pskd_jax
from tests.helpers import pskd_fails as fails
from tests.helpers import pskd_ok as ok

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_pipeline_prints_the_indices_a_pipeline_feeds(tmp_path):
    data = tmp_path / "w.psk.d"
    pskd_jax.write(data, "ℝ[2]", np.zeros((10, 2)))
    text_file = tmp_path / "train.pipeline"
    text_file.write_text('stream "w.psk.d" |> shuffle(seed = 0) |> batch(B = 5) |> take(n = 1)\n')
    lines = ok("pipeline", text_file, "--epoch", "2", "--batches", "3")
    assert lines == [
        f'pipeline stream "{data}" |> shuffle(seed = 0) |> batch(B = 5) |> take(n = 1)',
        "samples  10 of type ℝ[2], 1 batches an epoch",
        "epoch 2 batch 0: 9 1 3 6 8",  # docs/pipeline.md: seed 0, epoch 2, n = 10 starts 9 1 3 6 8
    ]
    assert pskd_jax.shuffle_order(10, seed=0, epoch=2, start=0, stop=5).tolist() == [9, 1, 3, 6, 8]
    message = fails("E9010", "pipeline", 'stream "w.psk.d" |> batch(B = 0)')
    assert "TEXT:1:" in message


@pytest.mark.slow
def test_a_pipeline_file_streaming_outside_its_directory_is_refused(tmp_path):
    (tmp_path / "runs").mkdir()
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    text_file = tmp_path / "runs" / "train.pipeline"
    text_file.write_text('stream "../w.psk.d" |> batch(B = 5)\n')
    message = fails("E9010", "pipeline", text_file)
    assert str(text_file) in message and "outside" in message and "--root" in message
    lines = ok("pipeline", text_file, "--root", tmp_path, "--batches", "1")
    assert lines[-1] == "epoch 1 batch 0: 0 1 2 3 4"
