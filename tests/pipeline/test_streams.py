"""What a stream holds (pskd_jax.pipeline.streams): a .psk.d file's header, a corpus manifest's
windows from its token counts alone, the same length and type as the corpus's own windows."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from pskd_jax.errors import PskdError
from pskd_jax.pipeline import stream_facts
from pskd_jax.pipeline.streams import is_corpus_manifest
from tests.corpus.helpers import write_corpus


def test_a_psk_d_file_answers_from_its_header(tmp_path):
    path = tmp_path / "w.psk.d"
    pskd_jax.write(path, "ℝ[2]", np.zeros((7, 2)))
    facts = stream_facts(path, seq=99)  # seq is for corpora only
    assert (facts.count, facts.sample_type, facts.corpus) == (7, "ℝ[2]", False)
    assert not is_corpus_manifest(path)


@pytest.mark.parametrize("seq, stride", [(8, None), (8, 3), (1, 1), (500, None)])
def test_a_corpus_answers_as_its_windows_do(tmp_path, seq, stride):
    manifest = write_corpus(tmp_path / "c", [np.arange(100) % 256, np.arange(37) % 256, np.array([], np.uint16)])
    facts = stream_facts(manifest, seq=seq, stride=stride)
    windows = corpus.CorpusWindows(manifest, seq=seq, stride=stride)
    try:
        assert facts.count == len(windows)
        assert facts.sample_type == windows.type_text
    finally:
        windows.close()
    assert facts.corpus and facts.seq == seq and facts.stride == (stride or seq)


@pytest.mark.parametrize("seq, stride", [(2**63, None), (4, 2**63), (2**70, 1)])
def test_a_window_or_a_step_past_int64_is_refused_as_the_windows_refuse_it(tmp_path, seq, stride):
    # (stream positions are int64: both answer E9012 with the same words, not 0 windows here)
    manifest = write_corpus(tmp_path / "c", [np.arange(50) % 256])
    with pytest.raises(PskdError) as facts:
        stream_facts(manifest, seq=seq, stride=stride)
    with pytest.raises(PskdError) as windows:
        corpus.CorpusWindows(manifest, seq=seq, stride=stride)
    assert facts.value.code == windows.value.code == "E9012"
    assert facts.value.message.split(": ")[-1] == windows.value.message.split(": ")[-1]


def test_no_shard_is_opened(tmp_path):
    manifest = write_corpus(tmp_path / "c", [np.arange(50) % 256])
    os.remove(tmp_path / "c" / "s0.psk.d")  # the counts are the manifest's
    assert stream_facts(manifest, seq=4).count == (50 - 5) // 4 + 1


def test_a_corpus_needs_seq_and_a_manifest_must_be_one(tmp_path):
    manifest = write_corpus(tmp_path / "c", [np.arange(50) % 256])
    with pytest.raises(PskdError) as raised:
        stream_facts(manifest)
    assert raised.value.code == "E9012" and "--seq" in raised.value.message
    with pytest.raises(PskdError) as raised:
        stream_facts(manifest, seq=0)
    assert raised.value.code == "E9012"
    for bad in ({"format": "other"}, {"format": "pskd-corpus", "vocab_size": 0, "shards": []},
                {"format": "pskd-corpus", "vocab_size": 257, "shards": [{"tokens": -1}]},
                {"format": "pskd-corpus", "vocab_size": 257, "shards": {}}, {"format": "pskd-corpus"}):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(PskdError) as raised:
            stream_facts(path, seq=4)
        assert raised.value.code == "E9016" and str(path) in raised.value.message
    with pytest.raises(PskdError) as raised:
        stream_facts(tmp_path / "missing.psk.d")
    assert raised.value.code == "E9002"


def test_a_store_that_fails_to_answer_is_its_e9018_not_not_a_corpus(faulty_bucket, fault_proxy):
    """A refusal (403) or a fault that outlasts the retries on the request that asks whether an
    object is a manifest is the store's E9018 naming the URL: it answered False, and the manifest
    was then opened as a .psk.d file ("bad magic")."""
    from pskd_jax.storage import resolve
    from tests.faultproxy import Rule, answer

    url = f"{faulty_bucket.url}/c/shards.json"
    store, where = resolve(url)
    store.put(where.key, json.dumps({"format": "pskd-corpus", "version": 1, "vocab_size": 257, "shards": []}).encode())
    assert is_corpus_manifest(url) and corpus.is_manifest(url)
    for skip, ask in ((0, is_corpus_manifest), (1, is_corpus_manifest), (0, corpus.is_manifest),
                      (1, corpus.is_manifest)):
        # (skip 1: the first request, which finds JSON, is answered; the read of the whole is refused)
        fault_proxy.plan(Rule(answer(403), method="GET", path=r"c/shards\.json", skip=skip, times=None))
        with pytest.raises(PskdError) as failed:
            ask(url)
        assert failed.value.code == "E9018" and url in failed.value.message, failed.value
        assert fault_proxy.faults_done() >= 1


@pytest.mark.parametrize("case", ["a/../s0.psk.d", "./s0.psk.d", "/s0.psk.d", "a\\s0.psk.d", "dup"])
def test_a_manifest_in_a_store_is_refused_as_its_windows_refuse_it(tmp_path, case):
    # stream_facts counted a store's manifest with checks of its own: a shard path that is no key
    # below the manifest's prefix, or a shard listed twice, passed.
    from pskd_jax.storage import resolve

    url = f"memory://facts-{tmp_path.name}/c/shards.json"
    store, where = resolve(url)
    entry = {"path": "s0.psk.d", "tokens": 5, "documents": 1, "sha256": "0" * 64}
    shards = [entry, dict(entry, path="s0.psk.d")] if case == "dup" else [dict(entry, path=case)]
    store.put(where.key, json.dumps({"format": "pskd-corpus", "version": 1, "tokenizer": {"kind": "bytes"},
                                     "vocab_size": 257, "boundary": 256, "shards": shards}).encode())
    heard = []
    for entry_point in (lambda: stream_facts(url, seq=4), lambda: corpus.CorpusWindows(url, seq=4)):
        with pytest.raises(PskdError) as raised:
            entry_point()
        heard.append((raised.value.code, raised.value.message))
    assert heard[0] == heard[1] and heard[0][0] == "E9016" and heard[0][1].startswith(f"{url}: shard "), heard
