"""Shards written chunk by chunk (pskd_jax.corpus.shard_writer): whole chunks only, the same bytes
whatever the chunk, and a reader in another process sees whole chunks only."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pskd_jax
from pskd_jax.corpus import shard_writer
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_build import build_shard
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from tests.helpers import ENV, documents

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


@pytest.mark.parametrize("chunk", [6, 10**30])
def test_a_chunk_larger_than_the_default_holds_only_the_tokens_given(tmp_path, monkeypatch, chunk):
    """chunk_tokens=10**30 (one header update a shard) was an allocation of that many tokens up
    front: numpy's ValueError, with a traceback, from the CLI's --chunk-tokens. The buffer now
    starts at the default chunk (here made 2) and grows up to a chunk as tokens come."""
    monkeypatch.setattr(shard_writer, "DEFAULT_CHUNK_TOKENS", 2)
    p = tmp_path / "s.psk.d"
    w = ShardWriter(str(p), Tokenizer.bytes(), chunk_tokens=chunk, durable=False)
    w.append(np.arange(3, dtype=np.uint16))
    w.append(np.arange(3, 8, dtype=np.uint16))
    assert w.count == (6 if chunk == 6 else 0)
    w.append(np.array([9], np.uint16))
    assert w.close() == 9
    assert shard_tokens(p) == [0, 1, 2, 3, 4, 5, 6, 7, 9]


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_shard_bytes_do_not_depend_on_the_chunk(tmp_path, chunk):
    texts = [f"doc {i} ü" * (i % 5) for i in range(60)]
    p = jsonl(tmp_path / "a.jsonl", texts)
    reference = tmp_path / "ref.psk.d"
    build_shard(str(p), str(reference), BuildOptions(tokenizer=Tokenizer.bytes(), durable=False))
    _, out = build(tmp_path, p, chunk_tokens=chunk)
    assert out.read_bytes() == reference.read_bytes()


# ---------------------------------------------------------------------------------------------
# A reader beside the writer


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pskd_jax.corpus import BuildOptions, build_shard
    from pskd_jax.corpus import shard_writer
    source, shard, chunk, pauses = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(p) for p in sys.argv[4].split(",")]
    commit = shard_writer.ShardWriter._commit

    def commit_then_pause(self, tokens):
        commit(self, tokens)
        if self.count in pauses:  # holds still until the reader has seen this count
            guard = time.monotonic() + 600
            while not os.path.exists(f"{shard}.seen{self.count}") and time.monotonic() < guard:
                time.sleep(0.001)

    shard_writer.ShardWriter._commit = commit_then_pause
    print("start", flush=True)
    build_shard(source, shard, BuildOptions(chunk_tokens=chunk))
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_concurrent_reader_sees_whole_chunks_only(tmp_path):
    """The writer holds still after a few chunks until the reader has seen them (in between both
    run freely), so the reader sees shards in the middle of being written however the two
    processes are scheduled."""
    chunk = 997
    source = documents(tmp_path / "a.jsonl", 6000, 3, width=30)
    reference = tmp_path / "ref.psk.d"
    build_shard(str(source), str(reference), BuildOptions(tokenizer=Tokenizer.bytes(), durable=False))
    with pskd_jax.Reader(reference) as r:
        expected = np.array(r.leaves()[0])
    header = len(Tokenizer.bytes().header(0))
    shard = tmp_path / "s.psk.d"
    pauses = [chunk * k for k in (2, 5, 9)]
    assert pauses[-1] < len(expected)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(shard), str(chunk),
                               ",".join(map(str, pauses))], env=ENV, stdout=subprocess.PIPE)
    assert writer.stdout.readline().strip() == b"start"
    seen = set()
    while True:
        done = writer.poll() is not None
        if shard.exists() and shard.stat().st_size >= header:
            with pskd_jax.Reader(shard) as r:
                n = len(r)
                assert n % chunk == 0 or n == len(expected), n
                np.testing.assert_array_equal(r.leaves()[0], expected[:n])
                seen.add(n)
                if n in pauses:
                    (tmp_path / f"s.psk.d.seen{n}").touch()
        if done:
            break
    assert writer.returncode == 0
    assert max(seen) == len(expected) and set(pauses) <= seen, sorted(seen)
