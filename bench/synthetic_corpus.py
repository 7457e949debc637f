"""A synthetic corpus for the benchmarks (imported by them; not a benchmark itself): shards of
random byte tokens with documents of random lengths, written straight with the shard writer."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from pskd_jax.corpus import Shard, Tokenizer, write_manifest
from pskd_jax.corpus.shard_writer import ShardWriter


def synthetic_corpus(directory: str, *, tokens: int, shards: int = 4, mean_document: int = 500,
                     seed: int = 0) -> str:
    """Writes a corpus of about ``tokens`` tokens (the bytes tokenizer: 0..255 and the boundary
    256) in ``shards`` shards under ``directory``, documents of ``mean_document`` tokens on
    average; returns its manifest's path."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = Tokenizer.bytes()
    rng = np.random.default_rng(seed)
    entries = []
    for k in range(shards):
        data = rng.integers(0, 256, tokens // shards).astype(tokenizer.dtype)
        ends = rng.random(len(data)) < 1 / mean_document
        data[ends] = tokenizer.boundary
        path = os.path.join(directory, f"shard-{k:05d}.psk.d")
        writer = ShardWriter(path, tokenizer, durable=False)
        writer.append(data)
        writer.close()
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        entries.append(Shard(os.path.basename(path), len(data), int(ends.sum()), digest))
    return write_manifest(os.path.join(directory, "shards.json"), tokenizer, entries).path


__all__ = ["synthetic_corpus"]
