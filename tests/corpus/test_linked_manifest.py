"""A ``shards.json`` reached through a symbolic link names the shards beside its target, where its
build wrote them, at every entry point: ``verify_corpus``, ``corpus info``/``verify``,
``CorpusWindows``, ``merge_manifests`` (its inputs, and an ``-o`` link written through). The
Loader and ``train_lm`` are tested with their own (tests/loader, tests/cli)."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax.corpus.windows import CorpusWindows
from tests.helpers import pskd_ok

from .helpers import jsonl


@pytest.fixture()
def linked(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    """``real/shards.json`` (a corpus of two shards) and ``elsewhere/shards.json``, a link to it,
    beside a decoy corpus's shards of the same names (other tokens): a reader that looks beside
    the link reads the decoy's."""
    real = [jsonl(tmp_path / f"r{i}.jsonl", [f"the real document {i}", "and one more"]) for i in range(2)]
    decoy = [jsonl(tmp_path / f"d{i}.jsonl", [f"a decoy {i}"]) for i in range(2)]
    corpus.build_corpus(real, tmp_path / "real", corpus.BuildOptions(durable=False))
    corpus.build_corpus(decoy, tmp_path / "elsewhere", corpus.BuildOptions(durable=False))
    link = tmp_path / "elsewhere" / "shards.json"
    link.unlink()
    link.symlink_to(os.path.join("..", "real", "shards.json"))
    return tmp_path / "real" / "shards.json", link


def manifests(real: pathlib.Path, link: pathlib.Path) -> list[pathlib.Path]:
    """The link, a link to the link, and the real file through a linked directory."""
    chain = real.parent.parent / "chain.json"
    chain.symlink_to(link)
    alias = real.parent.parent / "alias"
    alias.symlink_to("real")
    return [link, chain, alias / "shards.json"]


def test_the_directory_is_the_one_holding_the_real_file(linked):
    real, link = linked
    for path in manifests(real, link):
        assert corpus.read_manifest(path).directory == os.path.realpath(real.parent)
        assert corpus.read_manifest(path).shard_path(1) == os.path.join(os.path.realpath(real.parent),
                                                                         "shard-00001.psk.d")


@pytest.mark.subprocess
def test_verify_and_info_read_the_shards_beside_the_target(linked):
    real, link = linked
    want = corpus.verify_corpus(real)
    for path in manifests(real, link):
        got = corpus.verify_corpus(path)
        assert (got.shards, got.tokens, got.bytes) == (want.shards, want.tokens, want.bytes)
    for given in (link, link.parent):  # the link, and the directory it stands in
        (line,) = pskd_ok("corpus", "verify", given)
        assert line.startswith(f"pskd: ok {link}: 2 shards, {want.tokens} tokens;"), line
        info = pskd_ok("corpus", "info", given, "--shards")
        assert info[1:] == pskd_ok("corpus", "info", real, "--shards")[1:]


def test_windows_serve_the_targets_shards(linked):
    real, link = linked
    with CorpusWindows(real, seq=4, verify=True) as want:
        expected = want.gather(np.arange(len(want)))
    for path in manifests(real, link):
        with CorpusWindows(path, seq=4, verify=True) as windows:
            got = windows.gather(np.arange(len(windows)))
            assert all(np.array_equal(g, e) for g, e in zip(got, expected)) and len(windows) == len(want)
            assert windows.refresh() is False


def test_merge_of_a_linked_manifest_lists_the_targets_shards(linked, tmp_path):
    real, link = linked
    merged = corpus.merge_manifests([link], tmp_path / "merged.json")
    assert [s.path for s in merged.shards] == ["real/shard-00000.psk.d", "real/shard-00001.psk.d"]
    assert corpus.verify_corpus(tmp_path / "merged.json").tokens == corpus.verify_corpus(real).tokens


def test_merge_through_a_link_at_the_output_is_relative_to_where_the_file_lands(linked, tmp_path):
    real, link = linked
    out = tmp_path / "out"
    out.mkdir()
    (out / "all.json").symlink_to(os.path.join("..", "real", "all.json"))  # a dangling link: written through
    merged = corpus.merge_manifests([real], out / "all.json")
    assert (out / "all.json").is_symlink()
    assert [s["path"] for s in json.loads((real.parent / "all.json").read_text())["shards"]] == \
        ["shard-00000.psk.d", "shard-00001.psk.d"] == [s.path for s in merged.shards]
    assert corpus.verify_corpus(out / "all.json").tokens == corpus.verify_corpus(real).tokens
