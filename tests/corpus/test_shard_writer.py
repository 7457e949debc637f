"""Shards written chunk by chunk (pskd_jax.corpus.shard_writer): whole chunks only, the same bytes
whatever the chunk."""

from __future__ import annotations

import numpy as np
import pytest

import pskd_jax
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.build import build_shard
from .helpers import build, jsonl, shard_tokens


def test_shard_writer_counts_whole_chunks_only(tmp_path):
    p = tmp_path / "s.psk.d"
    w = ShardWriter(str(p), Tokenizer.bytes(), chunk_tokens=4, durable=False)
    w.append(np.arange(10, dtype=np.uint16))
    assert w.count == 8
    with pskd_jax.Reader(p) as r:
        assert len(r) == 8 and r.leaves()[0].tolist() == list(range(8))
    w.append(np.arange(10, 12, dtype=np.uint16))
    assert w.count == 12
    w.append(np.array([1], np.uint16))
    assert w.close() == 13
    assert shard_tokens(p) == list(range(12)) + [1]


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_shard_bytes_do_not_depend_on_the_chunk(tmp_path, chunk):
    texts = [f"doc {i} ü" * (i % 5) for i in range(60)]
    p = jsonl(tmp_path / "a.jsonl", texts)
    reference = tmp_path / "ref.psk.d"
    build_shard(str(p), str(reference), tokenizer=Tokenizer.bytes(), durable=False)
    _, out = build(tmp_path, p, chunk_tokens=chunk)
    assert out.read_bytes() == reference.read_bytes()
