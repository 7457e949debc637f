"""The training app on a corpus: verification at start by default (``--noverify_corpus`` skips
it), and ``--mask_boundary``, whose loss leaves boundary targets out."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from pskd_jax.corpus import BuildOptions

ROOT = pathlib.Path(__file__).resolve().parents[2]
B = 256


# ---------------------------------------------------------------------------------------------
# The loss, by hand


@pytest.fixture(scope="module")
def model():
    jax = pytest.importorskip("jax")
    from pskd_jax.apps import charlm

    config = charlm.ModelConfig(vocab=7, seq=5, width=8, layers=1, heads=2)
    params = charlm.init_params(config, seed=3)
    rng = np.random.default_rng(0)
    inputs = rng.integers(0, 7, (3, 5)).astype(np.uint8)
    targets = rng.integers(0, 6, (3, 5)).astype(np.uint8)
    targets[0, 1] = targets[1, 4] = targets[2, 0] = targets[2, 2] = 6  # the boundary, V - 1
    return jax, charlm, config, params, inputs, targets


@pytest.mark.slow
def test_without_the_mask_the_loss_is_the_plain_mean_bit_for_bit(model):
    jax, charlm, config, params, inputs, targets = model
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(charlm.logits(params, jnp.asarray(inputs, jnp.int32), config))
    picked = jnp.take_along_axis(logp, jnp.asarray(targets, jnp.int32)[..., None], axis=-1)
    plain = np.asarray(-jnp.mean(picked))  # the loss as it was before the mask existed
    assert np.asarray(charlm.loss_fn(params, inputs, targets, config)).tobytes() == plain.tobytes()
    assert np.asarray(charlm.loss_fn(params, inputs, targets, config, None)).tobytes() == plain.tobytes()


@pytest.mark.slow
def test_with_the_mask_boundary_targets_do_not_contribute(model):
    jax, charlm, config, params, inputs, targets = model
    logp = np.asarray(jax.nn.log_softmax(charlm.logits(params, inputs.astype(np.int32), config)), np.float64)
    # By hand: the mean of -log p(target) over the 11 targets that are not the boundary.
    terms = [-logp[b, t, targets[b, t]] for b in range(3) for t in range(5) if targets[b, t] != 6]
    assert len(terms) == 11
    masked = float(charlm.loss_fn(params, inputs, targets, config, 6))
    assert masked == pytest.approx(np.mean(terms), rel=1e-6)
    plain = float(charlm.loss_fn(params, inputs, targets, config))
    assert plain == pytest.approx(np.mean(terms + [-logp[b, t, 6] for b, t in ((0, 1), (1, 4), (2, 0), (2, 2))]),
                                  rel=1e-6)
    assert masked != pytest.approx(plain)
    # A batch whose every target is the boundary: nothing counts, no gradient.
    every = np.full_like(targets, 6)
    loss, grads = jax.value_and_grad(charlm.loss_fn)(params, inputs, every, config, 6)
    assert float(loss) == 0.0
    assert all(not np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads))
    # The jitted step trains on the masked loss.
    step = charlm.make_train_step(config, 1e-3, mask_token=6)
    _, _, loss = step(params, charlm.init_adam(params), inputs, targets)
    assert float(loss) == pytest.approx(masked, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# The app


def documents(path: pathlib.Path, n: int, seed: int) -> pathlib.Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"text": "".join(rng.choice(list("abcde fgh"), int(rng.integers(3, 40))))}) + "\n")
    return path


def train(manifest: pathlib.Path, *extra: str, env: dict | None = None, pipeline: str | None = None
          ) -> subprocess.CompletedProcess:
    pipeline = pipeline or f'stream "{manifest}" |> shuffle(seed = 1) |> batch(B = 4)'
    return subprocess.run(
        [sys.executable, "-m", "pskd_jax.apps.train_lm", f"--pipeline={pipeline}", "--width=16", "--layers=1",
         "--heads=2", "--steps=2", "--log_every=1", "--seq=16", *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env=dict(env or os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))


@pytest.fixture
def built(tmp_path) -> pathlib.Path:
    inputs = [documents(tmp_path / f"{i}.jsonl", 60, i) for i in range(2)]
    return pathlib.Path(corpus.build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False)).manifest.path)


def losses(stdout: str) -> list[str]:
    return [line.split()[3] for line in stdout.splitlines() if line.startswith("step ")]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_damaged_corpus_fails_at_start_by_default(built):
    shard = built.parent / "shard-00001.psk.d"
    data = bytearray(shard.read_bytes())
    data[-4] ^= 1  # the last letter becomes another (before the final boundary): in range, only a hash tells
    shard.write_bytes(bytes(data))
    result = train(built)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "E9017: " in result.stderr and "shard 1 shard-00001.psk.d: sha256" in result.stderr, result.stderr
    result = train(built, "--noverify_corpus")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: verified" not in result.stdout and len(losses(result.stdout)) == 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_verify_flag_and_mask_boundary(built, tmp_path):
    plain = train(built, "--verify_corpus")  # the absl boolean, as before
    assert plain.returncode == 0, plain.stderr[-3000:]
    m = corpus.read_manifest(built)
    assert f"train: verified 2 shards, {m.tokens} tokens, in " in plain.stdout
    masked = train(built, "--mask_boundary")
    assert masked.returncode == 0, masked.stderr[-3000:]
    assert "(targets 256, the boundary, left out of the loss)" in masked.stdout
    assert losses(masked.stdout) != losses(plain.stdout) and len(losses(masked.stdout)) == 2
    import pskd_jax

    windows = tmp_path / "w.psk.d"
    pskd_jax.write(windows, "(idx[10][seq: 4], idx[10][seq: 4])",
                   (np.zeros((8, 4), np.uint8), np.ones((8, 4), np.uint8)))
    result = subprocess.run(
        [sys.executable, "-m", "pskd_jax.apps.train_lm", f'--pipeline=stream "{windows}" |> batch(B = 2)',
         "--steps=1", "--mask_boundary"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))
    assert result.returncode == 1 and "E9012: --mask_boundary needs a corpus" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_linked_manifest_trains_on_the_shards_beside_its_target(built, tmp_path):
    """``shards.json`` linked from another directory, beside shards of the same names that are not
    its own: verified and trained on the target's shards (docs/corpus.md, the manifest's directory)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("shard-00000.psk.d", "shard-00001.psk.d"):
        (elsewhere / name).write_bytes(b"not this corpus's shard")
    (elsewhere / "shards.json").symlink_to(built)
    result = train(elsewhere / "shards.json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"train: verified 2 shards, {corpus.read_manifest(built).tokens} tokens, in " in result.stdout
    assert len(losses(result.stdout)) == 2


# ---------------------------------------------------------------------------------------------
# Refusals that cost little come before the corpus is verified (which reads every shard)


def damaged(manifest: pathlib.Path) -> pathlib.Path:
    """``manifest`` with a letter of shard 1 changed in range: verifying the corpus refuses it
    (E9017, its sha256), so a refusal of anything else shows the corpus was not verified first."""
    shard = manifest.parent / "shard-00001.psk.d"
    data = bytearray(shard.read_bytes())
    data[-4] ^= 1
    shard.write_bytes(bytes(data))
    return manifest


def refused_unverified(result: subprocess.CompletedProcess, code: str, fragment: str) -> None:
    assert (result.returncode, result.stdout) == (1, ""), result.stderr[-3000:]
    assert result.stderr.startswith(f"pskd: {code}: ") and fragment in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_checkpoint_dir_holding_another_run_is_refused_before_the_corpus_is_verified(built, tmp_path):
    checkpoints = tmp_path / "ckpt"
    with pskd_jax.CheckpointManager(checkpoints) as manager:
        manager.save(7, {"w": np.arange(3.0)}, extra={"step": 7, "loader": {"epoch": 1, "batch": 0}})
    result = train(damaged(built), f"--checkpoint_dir={checkpoints}")
    refused_unverified(result, "E9012", f"--checkpoint_dir {checkpoints}: holds the checkpoints of an earlier run")
    assert "E9017" in train(built, f"--checkpoint_dir={checkpoints}", "--resume").stderr  # (what verifying says)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_checkpoint_dir_in_a_bucket_that_is_not_there_is_refused_before_the_corpus_is_verified(built, s3_bucket):
    result = train(damaged(built), "--checkpoint_dir=s3://pskd-no-such-bucket-here/run", env=s3_bucket.env)
    refused_unverified(result, "E9018", "there is no bucket 'pskd-no-such-bucket-here'")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_flag_a_later_source_of_a_mix_cannot_take_is_refused_before_the_corpus_is_verified(built, tmp_path):
    windows = tmp_path / "w.psk.d"
    pskd_jax.write(windows, "(idx[257][seq: 16], idx[257][seq: 16])",
                   (np.zeros((8, 16), np.uint16), np.ones((8, 16), np.uint16)))
    text = f'mix(stream "{damaged(built)}" : 1, stream "{windows}" : 1) |> batch(B = 4)'
    result = train(built, "--segments", pipeline=text)
    refused_unverified(result, "E9012", f"--segments needs a corpus (its shards.json names the boundary token); "
                       f"{windows} is a .psk.d file")


@pytest.mark.slow
@pytest.mark.subprocess
def test_sources_of_a_mix_that_do_not_go_together_are_refused_before_the_corpus_is_verified(built, tmp_path):
    windows = tmp_path / "w.psk.d"  # windows over another vocabulary than the corpus's 257 tokens
    pskd_jax.write(windows, "(idx[300][seq: 16], idx[300][seq: 16])",
                   (np.zeros((8, 16), np.uint16), np.ones((8, 16), np.uint16)))
    text = f'mix(stream "{damaged(built)}" : 1, stream "{windows}" : 1) |> batch(B = 4)'
    result = train(built, pipeline=text)
    refused_unverified(result, "E9010", "idx[300][seq: 16]")
    assert "E9017" in train(built, pipeline=f'stream "{built}" |> batch(B = 4)').stderr  # (what verifying says)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_refused_while_its_data_is_opened_leaves_no_checkpoint_directory(built, tmp_path):
    # The manager opens (making its directories) before the corpus is verified; a run refused
    # there removes what it made, and leaves a directory that was there before as it was.
    fresh = tmp_path / "new" / "deeper" / "ckpt"
    result = train(damaged(built), f"--checkpoint_dir={fresh}")
    assert result.returncode == 1 and result.stderr.startswith("pskd: E9017: "), result.stderr[-3000:]
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    result = train(built, f"--checkpoint_dir={kept / 'ckpt'}")
    assert result.returncode == 1 and "E9017" in result.stderr, result.stderr[-3000:]
    assert sorted(os.listdir(kept)) == ["notes.txt"]
