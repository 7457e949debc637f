"""Every entry point that takes a path takes a URL, and refuses one it cannot serve (E9018 naming
it) without ever making a local file or directory named after its scheme (``s3:``, ``gs:``, …).

The hostile inputs: a scheme the toolkit does not serve (``hdfs://``), and a served scheme written
without its ``//`` (``s3:/x``, ``s3:bucket/x``, ``gs:relative``), which once read as local paths:
a manager or a corpus build made a directory ``s3:`` in the working directory. Each entry point
runs in an empty working directory that must stay empty.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus, data, pipeline
from pskd_jax.errors import StorageError
from pskd_jax.storage import resolve

BAD = ["hdfs://x/y", "s3:/bkt/y", "s3:bkt/y", "gs:relative", "memory:m/y"]
TREE = {"w": np.arange(6, dtype=np.float32)}


def _entry_points(base: str, inputs: str) -> dict:
    """What each entry point does with places under ``base``; ``inputs`` is a directory of local
    inputs (outside the working directory)."""
    doc = os.path.join(inputs, "doc.txt")
    return {
        "save": lambda: pskd_jax.save(f"{base}/c.psk.d", TREE),
        "restore": lambda: pskd_jax.restore(f"{base}/c.psk.d", as_numpy=True),
        "CheckpointManager": lambda: pskd_jax.CheckpointManager(f"{base}/run").save(1, TREE),
        "Reader": lambda: pskd_jax.Reader(f"{base}/w.psk.d"),
        "write": lambda: pskd_jax.write(f"{base}/w.psk.d", "idx[4][]", np.zeros(3, np.int64)),
        "CorpusWindows": lambda: pskd_jax.CorpusWindows(f"{base}/c/shards.json", seq=4),
        "build_corpus -o": lambda: pskd_jax.build_corpus([doc], f"{base}/c"),
        "build_corpus input": lambda: pskd_jax.build_corpus([f"{base}/doc.txt"], os.path.join(inputs, "out")),
        "verify_corpus": lambda: pskd_jax.verify_corpus(f"{base}/c/shards.json"),
        "merge_manifests": lambda: corpus.merge_manifests([f"{base}/a/shards.json"], f"{base}/shards.json"),
        "merge_manifests -o": lambda: corpus.merge_manifests([os.path.join(inputs, "corpus", "shards.json")],
                                                             f"{base}/shards.json"),
        "export_json -o": lambda: data.export_json(os.path.join(inputs, "w.psk.d"), f"{base}/w.json"),
        "stream_facts": lambda: pipeline.stream_facts(f"{base}/c/shards.json", seq=4),
        "is_manifest": lambda: corpus.is_manifest(f"{base}/c/shards.json"),
    }


@pytest.fixture
def inputs(tmp_path):
    place = tmp_path / "inputs"
    place.mkdir()
    (place / "doc.txt").write_text("a small document\n" * 20)
    pskd_jax.build_corpus([str(place / "doc.txt")], str(place / "corpus"))
    pskd_jax.write(str(place / "w.psk.d"), "idx[4][]", np.zeros(3, np.int64))
    return str(place)


@pytest.mark.parametrize("bad", BAD)
def test_a_url_the_toolkit_cannot_serve_is_refused_and_makes_nothing(bad, inputs, tmp_path, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    for name, call in _entry_points(bad, inputs).items():
        with pytest.raises(StorageError, match="E9018") as refused:
            call()
        assert bad in str(refused.value), (name, str(refused.value))
        assert os.listdir(here) == [], name
    assert sorted(os.listdir(inputs)) == ["corpus", "doc.txt", "w.psk.d"]


@pytest.mark.parametrize("bad", [*BAD, "s3://bkt/cache"])
def test_a_shard_cache_is_a_local_directory(bad, inputs, tmp_path, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    manifest = f"memory://cache-{tmp_path.name}/c/shards.json"
    pskd_jax.build_corpus([os.path.join(inputs, "doc.txt")], manifest.rpartition("/")[0])
    with pytest.raises(StorageError, match="E9018") as refused:
        pskd_jax.CorpusWindows(manifest, seq=4, cache_dir=bad)
    assert bad in str(refused.value)
    assert os.listdir(here) == []


def test_without_the_client_an_object_url_names_the_extra(inputs, tmp_path, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setitem(sys.modules, "obstore", None)  # as if the extra were not installed
    for name, call in _entry_points("s3://pskd-no-client/p", inputs).items():
        if name == "merge_manifests -o":  # (a local part and a merged manifest in a bucket: E9012 first)
            continue
        with pytest.raises(StorageError, match="E9018") as refused:
            call()
        message = str(refused.value)
        assert "s3://pskd-no-client/p" in message and "pip install 'pskd_jax[storage]'" in message, (name, message)
        assert os.listdir(here) == [], name


def test_outputs_and_streams_at_object_urls(object_place, inputs):
    """What used to take a local path only: a .psk.d written to an object, a text output put as an
    object, a stream of a corpus manifest in a store read as a corpus."""
    pskd_jax.write(f"{object_place}/w.psk.d", "idx[4][]", np.arange(3) % 4)
    with pskd_jax.Reader(f"{object_place}/w.psk.d") as reader:
        assert reader.header.count == 3
    assert data.export_json(f"{object_place}/w.psk.d", f"{object_place}/w.json") == 3
    store, where = resolve(f"{object_place}/w.json")
    local = os.path.join(inputs, "w.json")
    pskd_jax.write(os.path.join(inputs, "w3.psk.d"), "idx[4][]", np.arange(3) % 4)
    data.export_json(os.path.join(inputs, "w3.psk.d"), local)
    with open(local, "rb") as f:
        assert store.get(where.key)[0] == f.read()  # the same bytes as the local export
    pskd_jax.build_corpus([os.path.join(inputs, "doc.txt")], f"{object_place}/c")
    manifest = f"{object_place}/c/shards.json"
    assert corpus.is_manifest(manifest) and not corpus.is_manifest(f"{object_place}/w.psk.d")
    facts = pipeline.stream_facts(manifest, seq=4)
    assert facts.corpus and facts.count == len(pskd_jax.CorpusWindows(manifest, seq=4))
    here = pipeline.stream_facts(os.path.join(inputs, "corpus", "shards.json"), seq=4)
    assert facts == dataclasses.replace(here, path=manifest)  # the same corpus, in a store
