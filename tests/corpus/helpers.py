"""Documents, shards and corpora made for the corpus tests."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import numpy as np

import pskd_jax
from pskd_jax import corpus
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_build import build_shard
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.storage import resolve

B = 256  # the byte tokenizer's boundary


def jsonl(path: pathlib.Path, texts: list, key: str = "text") -> pathlib.Path:
    path.write_text("".join(json.dumps({key: t, "id": i}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    return path


def byte_stream(texts: list[str], limit: int | None = None) -> list[int]:
    out = []
    for t in texts:
        if t:
            out += list(t.encode("utf-8")[:limit]) + [B]
    return out


def sha256(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def shard_tokens(path) -> list[int]:
    with pskd_jax.Reader(path) as r:
        assert r.trailing_bytes == 0
        return r.leaves()[0].tolist()


def build(tmp_path, source, tokenizer=None, **options):
    out = tmp_path / "s.psk.d"
    options = BuildOptions(tokenizer=tokenizer or Tokenizer.bytes(), durable=False, **options)
    result = build_shard(str(source), str(out), options)
    return result, out


def make_inputs(tmp_path: pathlib.Path, n: int = 4) -> list[pathlib.Path]:
    rng = np.random.default_rng(1)
    paths = []
    for i in range(n):
        texts = ["".join(rng.choice(list("abcdé \n"), int(rng.integers(0, 40)))) for _ in range(20 + 10 * i)]
        paths.append(jsonl(tmp_path / f"in{i}.jsonl", texts))
    (tmp_path / "in9.txt").write_text("a plain text document\n", encoding="utf-8")
    return paths + [tmp_path / "in9.txt"]


def edit_manifest(path: pathlib.Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def write_corpus(d: pathlib.Path, pieces: list[np.ndarray], tokenizer: Tokenizer = Tokenizer.bytes()) -> pathlib.Path:
    """A corpus whose shards hold exactly ``pieces`` (tiny and empty shards included)."""
    d.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, tokens in enumerate(pieces):
        p = d / f"s{i}.psk.d"
        w = ShardWriter(str(p), tokenizer, chunk_tokens=1000, durable=False)
        w.append(np.asarray(tokens, tokenizer.dtype))
        w.close()
        shards.append(Shard(p.name, len(tokens), 0, sha256(p)))
    return corpus.write_manifest(d / "shards.json", tokenizer, shards).path


def put(place: str, name: str, data: bytes) -> None:
    """A file (or an object) of the user's at ``name`` in a place."""
    store, where = resolve(place)
    if where.is_local:
        os.makedirs(where.path, exist_ok=True)
        with open(os.path.join(where.path, name), "wb") as f:
            f.write(data)
    else:
        store.put(where.child(name).key, data)
