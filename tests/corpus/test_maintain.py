"""Verifying, describing and merging corpora (pskd_jax.corpus.maintain)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax.corpus.build import build_corpus
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError

from .helpers import edit_manifest, make_inputs, write_corpus


@pytest.mark.parametrize("workers", [0, -3, 2.5, "2", True])
def test_verify_and_windows_refuse_workers_that_are_no_count(built, workers):
    """0 or -3 ran with the default (or one thread), 2.5 as 2.5 threads, '2' was a TypeError: each
    is E9012 now, before any shard is read, as a build's workers are."""
    for action in (lambda: corpus.verify_corpus(built, workers=workers),
                   lambda: CorpusWindows(built, seq=2, verify=True, workers=workers)):
        with pytest.raises(PskdError, match=r"E9012: workers=.*: expected an integer >= 1"):
            action()


def test_verify_names_the_bad_shard(built):
    d = built.parent
    assert corpus.verify_corpus(built, workers=2).shards == 5
    shard = d / "shard-00002.psk.d"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(PskdError, match="E9017: .*shard 2 shard-00002.psk.d: sha256 [0-9a-f]+, the manifest records"):
        corpus.verify_corpus(built, workers=2)
    shard.write_bytes(data[:-2])
    with pytest.raises(PskdError, match="E9017: .*shard 2 shard-00002.psk.d: truncated"):
        corpus.verify_corpus(built)
    shard.write_bytes(data + b"\0\0")
    with pytest.raises(PskdError, match="E9017: .*shard 2 .*2 bytes after its"):
        corpus.verify_corpus(built)
    shard.unlink()
    (d / "shard-00004.psk.d").unlink()
    with pytest.raises(PskdError, match=r"E9017: .*shard 2 shard-00002.psk.d: missing .*\(and 1 more failing shard: "
                                        r"shard-00004.psk.d\)"):
        corpus.verify_corpus(built)


def test_count_mismatch(built):
    edit_manifest(built, lambda d: d["shards"][0].update(tokens=d["shards"][0]["tokens"] + 1))
    with pytest.raises(PskdError, match="E9017: .*shard 0 .*header count"):
        corpus.verify_corpus(built)
    with pytest.raises(PskdError, match="E9017: .*shard 0 .*header count"):
        CorpusWindows(built, seq=4)


def test_info(built):
    m = corpus.read_manifest(built)
    lines = corpus.info_lines(built, shards=True)
    assert lines[2:5] == ["shards     5", f"tokens     {m.tokens}", f"documents  {m.documents}"]
    assert lines[5] == f"boundary   {m.documents / m.tokens:.4%} of tokens"
    assert lines[6].startswith(f"per doc    {(m.tokens - m.documents) / m.documents:.1f} tokens")
    assert len(lines) == 7 + 5


def test_merge(tmp_path):
    inputs = make_inputs(tmp_path)
    build_corpus(inputs[:2], tmp_path / "all" / "a", BuildOptions(durable=False))
    build_corpus(inputs[2:], tmp_path / "all" / "b", BuildOptions(durable=False))
    merged = corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "b" / "shards.json"],
                                    tmp_path / "all" / "shards.json")
    assert [s.path for s in merged.shards] == ["a/shard-00000.psk.d", "a/shard-00001.psk.d", "b/shard-00000.psk.d",
                                               "b/shard-00001.psk.d", "b/shard-00002.psk.d"]
    corpus.verify_corpus(tmp_path / "all" / "shards.json")
    build_corpus(inputs, tmp_path / "whole", BuildOptions(durable=False))
    a = CorpusWindows(tmp_path / "all" / "shards.json", seq=7, stride=3)
    b = CorpusWindows(tmp_path / "whole" / "shards.json", seq=7, stride=3)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a.gather(np.arange(len(a))),
                                                                          b.gather(np.arange(len(b)))))
    with pytest.raises(PskdError, match="E9016.*outside"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json"], tmp_path / "all" / "b" / "m.json")
    with pytest.raises(PskdError, match="E9016: .*a/shards.json: shard 0 shard-00000.psk.d is .*a/shard-00000.psk.d, "
                                        "which .*a/shards.json lists already"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json"] * 2, tmp_path / "all" / "m.json")
    os.symlink("a", tmp_path / "all" / "alias")  # one shard file under two names
    with pytest.raises(PskdError, match="E9016: .*alias/shards.json: shard 0 .*lists already"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "alias" / "shards.json"],
                               tmp_path / "all" / "m.json")
    build_corpus(inputs[:1], tmp_path / "all" / "d", BuildOptions(skip_bad=True, durable=False))
    with pytest.raises(PskdError, match=r"E9016: .*d/shards.json: its build options differ from .*a/shards.json's "
                                        r"\(skip_bad True against False\)"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "d" / "shards.json"],
                               tmp_path / "all" / "m.json")
    assert not (tmp_path / "all" / "m.json").exists()
    build_corpus(inputs[:1], tmp_path / "all" / "c",
                 BuildOptions(tokenizer=Tokenizer.chars(list("abcdé \n")), durable=False))
    with pytest.raises(PskdError, match=r"E9016: .*c/shards.json: its tokenizer \(chars, 7 characters .*\) differs "
                                        r"from .*a/shards.json's \(bytes, a vocabulary of 257 tokens\)"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "c" / "shards.json"],
                               tmp_path / "all" / "m.json")


def test_a_merge_into_a_directory_where_a_build_runs_is_refused(tmp_path):
    from pskd_jax.corpus.lock import directory_lock

    part = write_corpus(tmp_path / "part", [np.arange(10)])
    output = tmp_path / "merged.json"
    with directory_lock(str(tmp_path)):  # what a running build holds
        with pytest.raises(PskdError, match="E9016.*another corpus build is running"):
            corpus.merge_manifests([part], output)
    assert not output.exists()
    assert corpus.merge_manifests([part], output).tokens == 10
