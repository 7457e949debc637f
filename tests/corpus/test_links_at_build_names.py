"""A symbolic link at one of a corpus build's own names (``shards.json``, the journal, a shard) is
replaced by the build's file, never written through, and its target is left as it was; a link at
a path the user names (``corpus merge -o``) is written through, as every output is."""

from __future__ import annotations

import json
import os

import pytest

from pskd_jax import corpus
from pskd_jax._os import atomic
from pskd_jax.corpus import build as corpus_build
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import PskdError


def inputs(tmp_path, n: int = 2) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"in{i}.jsonl"
        path.write_text("".join(json.dumps({"text": f"document {k} of {i}"}) + "\n" for k in range(5)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("target", ["outside", "inside", "dangling"])
def test_a_link_at_shards_json_is_replaced_and_its_target_left_alone(tmp_path, target):
    out = tmp_path / "c"
    (out / "versions").mkdir(parents=True)
    aimed = {"outside": tmp_path / "elsewhere.json", "inside": out / "versions" / "v1.json",
             "dangling": tmp_path / "nothing-yet.json"}[target]
    if target != "dangling":
        aimed.write_text('{"the user\'s": "file"}\n')
    (out / "shards.json").symlink_to(aimed)
    built = corpus_build.build_corpus(inputs(tmp_path), out, BuildOptions(durable=False))
    assert not (out / "shards.json").is_symlink()
    assert corpus.verify_corpus(out / "shards.json").manifest == built.manifest
    if target == "dangling":
        assert not aimed.exists()
    else:
        assert aimed.read_text() == '{"the user\'s": "file"}\n'


def test_a_link_at_the_journal_is_replaced_and_its_target_left_alone(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("not a journal\n")
    (out / ".shards.journal").symlink_to(precious)
    corpus_build.build_corpus(inputs(tmp_path), out, BuildOptions(durable=False))
    assert precious.read_text() == "not a journal\n"
    assert not os.path.lexists(out / ".shards.journal")  # (the build's own journal, removed once done)


def test_a_manifest_in_progress_replaces_a_link_too(tmp_path):
    """A rebuild that fails midway publishes what it finished: over the link, not through it."""
    sources = inputs(tmp_path, 3)
    out = tmp_path / "c"
    corpus_build.build_corpus(sources, out, BuildOptions(durable=False))
    (out / "shards.json").rename(tmp_path / "old.json")
    (out / "shards.json").symlink_to(tmp_path / "old.json")
    with open(sources[1], "a") as f:
        f.write("not json\n")  # shard 1 changes and its input is bad: the build stops there
    with pytest.raises(PskdError) as caught:
        corpus_build.build_corpus(sources, out, BuildOptions(durable=False))
    assert caught.value.code == "E9015"
    assert json.loads((tmp_path / "old.json").read_text())["shards"][1]["path"] == "shard-00001.psk.d"
    assert "in_progress" not in json.loads((tmp_path / "old.json").read_text())
    assert not (out / "shards.json").is_symlink()
    assert json.loads((out / "shards.json").read_text())["in_progress"] == {"planned_shards": 3}


def test_a_link_at_a_shard_name_is_replaced_as_well(tmp_path):
    """At a name an earlier build of the directory listed (a shard swapped for a link): the
    build's own, replaced. At a name no manifest or journal lists, a link is the user's: refused."""
    out = tmp_path / "c"
    corpus_build.build_corpus(inputs(tmp_path), out, BuildOptions(durable=False))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"someone else's")
    (out / "shard-00000.psk.d").unlink()
    (out / "shard-00000.psk.d").symlink_to(outside)
    corpus_build.build_corpus(inputs(tmp_path), out, BuildOptions(durable=False))
    assert outside.read_bytes() == b"someone else's" and not (out / "shard-00000.psk.d").is_symlink()
    (out / "shard-00002.psk.d").symlink_to(outside)
    with pytest.raises(PskdError) as caught:
        corpus_build.build_corpus(inputs(tmp_path, 3), out, BuildOptions(durable=False))
    assert caught.value.code == "E9012" and "shard-00002.psk.d: a symbolic link stands" in caught.value.message
    assert outside.read_bytes() == b"someone else's" and (out / "shard-00002.psk.d").is_symlink()


def test_merge_writes_through_a_link_the_user_names(tmp_path):
    out = tmp_path / "c"
    corpus_build.build_corpus(inputs(tmp_path), out, BuildOptions(durable=False))
    (out / "merged-target.json").write_text("old\n")
    (out / "merged.json").symlink_to("merged-target.json")
    corpus.merge_manifests([out / "shards.json"], out / "merged.json")
    assert (out / "merged.json").is_symlink()
    assert json.loads((out / "merged-target.json").read_text())["shards"][0]["path"] == "shard-00000.psk.d"


def test_atomic_output_replaces_a_link_when_told(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("kept")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with atomic.atomic_output(str(link), links="replace") as f:
        f.write(b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new" and target.read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "target.txt"]
    (tmp_path / "a-directory").mkdir()
    with pytest.raises(PskdError) as caught:  # what is not a file or a link is still refused
        with atomic.atomic_output(str(tmp_path / "a-directory"), links="replace") as f:
            f.write(b"x")
    assert caught.value.code == "E9012" and (tmp_path / "a-directory").is_dir()
