"""train_lm over a mix(…) of two corpora with packed segments: the model's segment mask, and a run
killed with SIGKILL mid-save that resumes to the very losses and parameters of an uninterrupted one."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from tests.helpers import ENV, ROOT, documents, train_lm
from tests.helpers import pskd_ok as ok

pytestmark = [pytest.mark.slow]

KILLED = ROOT / "tests" / "workers" / "train_lm_killed.py"


def test_segments_keep_attention_inside_a_document_and_change_nothing_without_them():
    jax = pytest.importorskip("jax")
    from pskd_jax.apps import charlm

    from pskd_jax.corpus.segments import segment_ids_and_positions

    config = charlm.ModelConfig(vocab=9, seq=8, width=8, layers=1, heads=2)
    params = charlm.init_params(config, seed=1)
    inputs = np.array([[1, 2, 8, 3, 4, 5, 8, 6], [2, 2, 2, 2, 2, 2, 2, 2]], np.uint8)
    ids, positions = segment_ids_and_positions(inputs, 8)
    plain = np.asarray(charlm.logits(params, inputs.astype(np.int32), config))
    # One segment a window, positions 0 … T-1: the plain model, bit for bit.
    ones, counting = np.ones_like(ids), np.tile(np.arange(8, dtype=np.int16), (2, 1))
    same = np.asarray(charlm.logits(params, inputs.astype(np.int32), config, ones, counting))
    assert same.tobytes() == plain.tobytes()
    packed = np.asarray(charlm.logits(params, inputs.astype(np.int32), config, ids, positions))
    # The second document (tokens 3 …) sees nothing of the first: its logits are those of the
    # document alone, at positions from 0.
    alone = np.asarray(charlm.logits(params, inputs[:1, 3:7].astype(np.int32), config))
    np.testing.assert_allclose(packed[0, 3:7], alone[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(packed[0, 3:7], plain[0, 3:7])
    np.testing.assert_array_equal(packed[1], plain[1])  # (a window of one segment: as before)
    targets = np.roll(inputs, -1, axis=1)
    step = charlm.make_train_step(config, 1e-3)
    _, _, loss = step(params, charlm.init_adam(params), inputs, targets)
    _, _, again = step(params, charlm.init_adam(params), inputs, targets, ones, counting)
    assert np.asarray(loss).tobytes() == np.asarray(again).tobytes()
    assert jax.numpy.isfinite(step(params, charlm.init_adam(params), inputs, targets, ids, positions)[2])


@pytest.fixture
def mixture(tmp_path) -> str:
    for name, seed in (("web", 1), ("code", 2)):
        documents(tmp_path / f"{name}.jsonl", 120, seed, width=12)
        ok("corpus", "build", tmp_path / f"{name}.jsonl", "-o", tmp_path / name)
    return (f'mix(stream "{tmp_path / "web" / "shards.json"}" |> shuffle(seed = 1) : 3, '
            f'stream "{tmp_path / "code" / "shards.json"}" |> shuffle(seed = 2) : 1) |> batch(B = 4)')


ARGS = ["--width=16", "--layers=1", "--heads=2", "--log_every=1", "--seq=16", "--segments", "--save_every=2",
        "--steps=10"]


def losses(stdout: str) -> dict[int, str]:
    return {int(line.split()[1]): line.split()[3] for line in stdout.splitlines() if line.startswith("step ")}


def leaves(directory: pathlib.Path) -> list[bytes]:
    import jax

    with pskd_jax.CheckpointManager(directory) as manager:
        assert manager.latest_step() == 10
        tree = manager.restore()
    return [np.asarray(leaf).tobytes() for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.mark.subprocess
@pytest.mark.parametrize("access", ["pread", "mmap"])  # (mapped corpora are read through one view)
def test_a_mixture_with_segments_killed_mid_run_resumes_bit_for_bit(mixture, tmp_path, access):
    args = [*ARGS, f"--access={access}"]
    whole = train_lm(f"--pipeline={mixture}", *args, f"--checkpoint_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "(packed segments: attention inside each document)" in whole.stdout
    assert "mix(stream" in whole.stdout and len(losses(whole.stdout)) == 10
    killed = subprocess.run([sys.executable, str(KILLED), "6", f"--pipeline={mixture}", *args,
                             f"--checkpoint_dir={tmp_path / 'split'}"], capture_output=True, text=True, cwd=ROOT,
                            timeout=300, env=dict(ENV, JAX_PLATFORMS="cpu"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = losses(killed.stdout)
    assert max(first) == 6
    rest = train_lm(f"--pipeline={mixture}", *args, f"--checkpoint_dir={tmp_path / 'split'}", "--resume")
    assert rest.returncode == 0, rest.stderr[-3000:]
    resumed = [line for line in rest.stdout.splitlines() if line.startswith("train: resumed at step ")]
    assert resumed, rest.stdout
    at = int(resumed[0].split()[4])
    assert at in (4, 6) and f"(next batch: epoch 1, batch {at})" in resumed[0]
    again = losses(rest.stdout)
    assert min(again) == at + 1 and max(again) == 10
    assert {**first, **again} == losses(whole.stdout)
    assert leaves(tmp_path / "split") == leaves(tmp_path / "whole")


@pytest.mark.subprocess
def test_segments_need_corpora_and_a_mix_of_two_types_is_refused(mixture, tmp_path):
    path = tmp_path / "w.psk.d"
    pskd_jax.write(path, "(idx[10][seq: 4], idx[10][seq: 4])", (np.zeros((8, 4), np.uint8), np.ones((8, 4), np.uint8)))
    result = train_lm(f'--pipeline=stream "{path}" |> batch(B = 2)', "--steps=1", "--segments")
    assert result.returncode == 1 and "E9012: --segments needs a corpus" in result.stderr
    web = mixture.split('"')[1]
    result = train_lm(f'--pipeline=mix(stream "{web}" : 1, stream "{path}" : 1) |> batch(B = 2)', "--steps=1",
                      "--seq=4")
    assert result.returncode == 1 and "E9010: " in result.stderr and "has samples of type" in result.stderr
    assert "Traceback" not in result.stderr
