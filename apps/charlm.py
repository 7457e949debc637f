"""A small character-level language model in pure JAX: the demo's training job.

A decoder-only transformer (token and position embeddings, pre-norm blocks of causal multi-head
attention and an MLP, tied nothing) with a hand-written Adam, sized to train on a CPU in a
minute. With packed segments (windows cut across documents, ``CorpusWindows(…, segments=True)``)
a token attends only to the earlier tokens of its own segment and takes the position embedding of
its place in that segment; without them the model is the plain causal one, unchanged. Parameters
are a plain dict in declaration order, so a checkpoint stores them in the order
written here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int
    seq: int
    width: int = 64
    layers: int = 2
    heads: int = 4


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random initial parameters (f32), scaled so activations start near unit variance."""
    rng = np.random.default_rng(seed)
    d = config.width

    def dense(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)).astype(np.float32)

    params: dict[str, Any] = {
        "embed": (rng.standard_normal((config.vocab, d)) * 0.1).astype(np.float32),
        "position": (rng.standard_normal((config.seq, d)) * 0.01).astype(np.float32),
        "blocks": [
            {
                "norm1": np.ones(d, np.float32),
                "qkv": dense(d, 3 * d),
                "proj": dense(d, d) * np.float32(0.5 / math.sqrt(config.layers)),
                "norm2": np.ones(d, np.float32),
                "up": dense(d, 4 * d),
                "down": dense(4 * d, d) * np.float32(0.5 / math.sqrt(config.layers)),
            }
            for _ in range(config.layers)
        ],
        "norm": np.ones(d, np.float32),
        "unembed": dense(d, config.vocab),
    }
    return jax.tree_util.tree_map(jnp.asarray, params)  # (sorted key order, as the step returns)


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _attention(x: jax.Array, block: dict, heads: int, segment_ids: jax.Array | None = None) -> jax.Array:
    batch, seq, width = x.shape
    q, k, v = jnp.split(x @ block["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(batch, seq, heads, width // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // heads)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    if segment_ids is not None:  # (batch, 1, seq, seq): the same segment, and not later
        causal = causal & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    scores = jnp.where(causal, scores, -1e9)
    mixed = jax.nn.softmax(scores, axis=-1) @ v
    return mixed.transpose(0, 2, 1, 3).reshape(batch, seq, width) @ block["proj"]


def logits(params: dict, tokens: jax.Array, config: ModelConfig, segment_ids: jax.Array | None = None,
           positions: jax.Array | None = None) -> jax.Array:
    """Next-token logits for every position of a batch of token windows (batch, seq, vocab); with
    ``segment_ids`` and ``positions`` (each (batch, seq)) attention stays inside a segment and the
    position embedding restarts at each segment's first token."""
    if positions is None:
        x = params["embed"][tokens] + params["position"][: tokens.shape[1]]
    else:
        x = params["embed"][tokens] + params["position"][positions.astype(jnp.int32)]
    for block in params["blocks"]:
        x = x + _attention(_norm(x, block["norm1"]), block, config.heads, segment_ids)
        x = x + jax.nn.gelu(_norm(x, block["norm2"]) @ block["up"]) @ block["down"]
    return _norm(x, params["norm"]) @ params["unembed"]


def loss_fn(params: dict, inputs: jax.Array, targets: jax.Array, config: ModelConfig,
            mask_token: int | None = None, segment_ids: jax.Array | None = None,
            positions: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy of the targets (the inputs shifted by one) in nats per token.

    With ``mask_token`` (a corpus's boundary token), targets equal to it do not count: the mean is
    over the other targets (0 when there is none). Without it the computation is the plain mean,
    unchanged. ``segment_ids`` and ``positions`` as :func:`logits` takes them."""
    logp = jax.nn.log_softmax(logits(params, inputs.astype(jnp.int32), config, segment_ids, positions))
    picked = jnp.take_along_axis(logp, targets.astype(jnp.int32)[..., None], axis=-1)
    if mask_token is None:
        return -jnp.mean(picked)
    keep = (targets != mask_token)[..., None]
    return -jnp.sum(jnp.where(keep, picked, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def init_adam(params: dict) -> dict:
    """Adam's state. Passed through ``tree_map`` so that its dicts have the key order that the
    jitted step's outputs have (JAX rebuilds dicts in sorted key order): a checkpoint saved after
    any step then restores into a freshly initialised state, leaf for leaf."""
    state = {"mu": jax.tree_util.tree_map(jnp.zeros_like, params),
             "nu": jax.tree_util.tree_map(jnp.zeros_like, params),
             "count": jnp.zeros((), jnp.int32)}
    return jax.tree_util.tree_map(lambda x: x, state)


def make_train_step(config: ModelConfig, learning_rate: float = 3e-3, mask_token: int | None = None):
    """A jit-compiled step: (params, adam state, inputs, targets[, segment_ids, positions]) →
    (params, adam state, loss); ``mask_token`` as :func:`loss_fn` takes it."""
    b1, b2, eps = 0.9, 0.99, 1e-8

    @jax.jit
    def step(params: dict, opt: dict, inputs: jax.Array, targets: jax.Array, segment_ids: jax.Array | None = None,
             positions: jax.Array | None = None):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, config, mask_token, segment_ids, positions)
        count = opt["count"] + 1
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, opt["mu"], grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["nu"], grads)
        correction = jnp.sqrt(1 - b2 ** count) / (1 - b1 ** count)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - learning_rate * correction * m / (jnp.sqrt(v) + eps), params, mu, nu
        )
        return params, {"mu": mu, "nu": nu, "count": count}, loss

    return step


__all__ = ["ModelConfig", "init_adam", "init_params", "logits", "loss_fn", "make_train_step"]
