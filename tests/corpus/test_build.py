"""Building a corpus (pskd_jax.corpus.build): the manifest, reruns that keep what is whole, pools of
workers, one build a directory, stale shards, symlinks, and resuming from the journal."""

from __future__ import annotations

import json
import os

import pytest

from pskd_jax import corpus
from pskd_jax.corpus.build import build_corpus
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError

from .helpers import B, jsonl, make_inputs, sha256, shard_tokens


def test_build_corpus_manifest_and_rerun(tmp_path):
    inputs = make_inputs(tmp_path)
    out = tmp_path / "corpus"
    result = build_corpus(inputs, out, BuildOptions(chunk_tokens=50, durable=False))
    assert (result.built, result.kept) == (5, 0)
    data = json.loads((out / "shards.json").read_text())
    assert list(data) == ["format", "version", "tokenizer", "vocab_size", "boundary", "build", "shards"]
    assert (data["format"], data["version"], data["tokenizer"], data["vocab_size"], data["boundary"]) == \
        ("pskd-corpus", 1, {"kind": "bytes"}, 257, 256)
    assert [s["path"] for s in data["shards"]] == [f"shard-{i:05d}.psk.d" for i in range(5)]
    for s, source in zip(data["shards"], inputs):
        assert s["source"]["path"] == str(source)
        assert s["sha256"] == sha256(out / s["path"])
        assert shard_tokens(out / s["path"])[-1] == B and shard_tokens(out / s["path"]).count(B) == s["documents"]
    shards = [f"shard-{i:05d}.psk.d" for i in range(5)]
    assert sorted(os.listdir(out)) == [".pskd-corpus.lock", *shards, "shards.json"]
    first = (out / "shards.json").read_bytes()

    again = build_corpus(inputs, out, BuildOptions(chunk_tokens=50, durable=False))
    assert (again.built, again.kept) == (0, 5) and (out / "shards.json").read_bytes() == first

    inputs[2].write_text(inputs[2].read_text() + '{"text": "more"}\n')  # a changed input
    with open(out / "shard-00003.psk.d", "r+b") as f:  # a damaged shard
        f.seek(-2, 2)
        f.write(b"\x01")
    again = build_corpus(inputs, out, BuildOptions(chunk_tokens=50, durable=False))
    assert (again.built, again.kept) == (2, 3)
    corpus.verify_corpus(out / "shards.json")

    t = Tokenizer.chars(list(dict.fromkeys("abcdé \na plain text document more")))
    again = build_corpus(inputs, out, BuildOptions(tokenizer=t, durable=False))  # other options: every shard rebuilt
    assert (again.built, again.kept) == (5, 0) and again.manifest.vocab_size == len(t.vocab) + 1


@pytest.mark.slow
@pytest.mark.subprocess
def test_pool_build_is_byte_identical(tmp_path):
    """In a pool of spawned workers (the command's forked ones: tests/cli/test_corpus_commands.py)."""
    inputs = make_inputs(tmp_path)
    build_corpus(inputs, tmp_path / "one", BuildOptions(chunk_tokens=30, durable=False))
    calls = []
    build_corpus(inputs, tmp_path / "two", BuildOptions(workers=2, chunk_tokens=1000, durable=False),
                 progress=lambda *a: calls.append(a), start_method="spawn")
    for name in ["shards.json"] + [f"shard-{i:05d}.psk.d" for i in range(5)]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert calls[-1][2:] == (5, 5)


def test_a_bad_input_fails_the_build_and_writes_no_manifest(tmp_path):
    inputs = make_inputs(tmp_path, 2)
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\nnope\n')
    with pytest.raises(PskdError, match="E9015.*bad.jsonl:2: not JSON"):
        build_corpus(inputs + [tmp_path / "bad.jsonl"], tmp_path / "c", BuildOptions(durable=False))
    # The manifest of the failed build lists the shards it finished, marked in progress (read-while-write).
    partial = corpus.read_manifest(tmp_path / "c" / "shards.json")
    assert (partial.complete, partial.planned_shards, len(partial.shards)) == (False, 4, 3)
    assert not (tmp_path / "c" / "shard-00003.psk.d").exists()
    result = build_corpus(inputs + [tmp_path / "bad.jsonl"], tmp_path / "c", BuildOptions(skip_bad=True, durable=False))
    assert result.skipped == 1 and "bad.jsonl:2" in result.examples[0]


def test_an_input_given_twice_is_refused_before_anything_is_written(tmp_path):
    """Its documents would appear twice in the corpus: the same path, the file and a directory
    holding it, or a link and its target, are one input (a merge refuses one shard twice alike)."""
    (tmp_path / "d").mkdir()
    a = jsonl(tmp_path / "d" / "a.jsonl", ["one", "two"])
    os.symlink(a, tmp_path / "link.jsonl")
    os.link(a, tmp_path / "hard.jsonl")
    for twice in ([a, a], [tmp_path / "d", a], [tmp_path / "link.jsonl", a], [a, tmp_path / "hard.jsonl"]):
        out = tmp_path / "out"
        with pytest.raises(PskdError, match=r"E9015: .*\.jsonl: input 1 is the file of input 0 \(.*\.jsonl\)"):
            build_corpus(twice, out, BuildOptions(durable=False))
        assert not out.exists()


def test_a_second_build_of_a_directory_is_refused(tmp_path):
    inputs = make_inputs(tmp_path, 1)
    (tmp_path / "c").mkdir()
    with directory_lock(str(tmp_path / "c")):
        with pytest.raises(PskdError, match="E9016.*another corpus build is running"):
            build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))
    build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))


def test_a_smaller_rebuild_removes_the_stale_shards_and_nothing_else(tmp_path):
    inputs = make_inputs(tmp_path)
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    mine = ["notes.txt", "shard-00004.psk.d.bak", "shard-4.psk.d", "shard-000004.psk.d", ".shard-00004.psk.d",
            "shard-00004.psk.d.tmp", "shard-00008.psk.d"]  # (no manifest or journal lists shard 8: the user's)
    for name in mine:
        (out / name).write_text("the user's")
    (out / "shard-00007.psk.d").mkdir()  # a directory of that name: not a shard of ours
    os.symlink(tmp_path / "in0.jsonl", out / "shard-00009.psk.d")  # a link no record lists: the user's too
    os.unlink(out / "shard-00003.psk.d")
    os.symlink(tmp_path / "in0.jsonl", out / "shard-00003.psk.d")  # a listed shard swapped for a link: removed
    result = build_corpus(inputs[:2], out, BuildOptions(durable=False))
    assert (result.built, result.kept) == (0, 2)
    build_corpus(inputs[:2], tmp_path / "ref", BuildOptions(durable=False))
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "ref") + mine + ["shard-00007.psk.d",
                                                                                    "shard-00009.psk.d"])
    assert all((out / name).read_text() == "the user's" for name in mine) and (tmp_path / "in0.jsonl").exists()
    assert os.readlink(out / "shard-00009.psk.d") == str(tmp_path / "in0.jsonl")
    for name in os.listdir(tmp_path / "ref"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    corpus.verify_corpus(out / "shards.json")


def test_a_symlink_at_a_shard_name_is_replaced_not_written_through(tmp_path):
    inputs = make_inputs(tmp_path, 2)
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    outside = tmp_path / "precious.psk.d"
    outside.write_bytes(b"not to be overwritten")
    os.unlink(out / "shard-00000.psk.d")
    os.symlink(outside, out / "shard-00000.psk.d")  # at a name the manifest lists: the build's own
    build_corpus(inputs, out, BuildOptions(durable=False))
    assert outside.read_bytes() == b"not to be overwritten" and not (out / "shard-00000.psk.d").is_symlink()
    # A link to an outside copy of a shard that matches its entry is not kept either: it is rebuilt.
    outside.write_bytes((out / "shard-00001.psk.d").read_bytes())
    os.unlink(out / "shard-00001.psk.d")
    os.symlink(outside, out / "shard-00001.psk.d")
    copy = outside.read_bytes()
    assert build_corpus(inputs, out, BuildOptions(durable=False)).built == 1
    assert outside.read_bytes() == copy and not (out / "shard-00001.psk.d").is_symlink()
    corpus.verify_corpus(out / "shards.json")


def test_the_lock_file_stays_and_readers_ignore_it(built):
    """The lock is left in place (removing it races with a build about to open it); verify, info
    and windows never look at it, held or not."""
    lock = built.parent / ".pskd-corpus.lock"
    assert lock.exists() and lock.stat().st_size == 0
    with directory_lock(str(built.parent)):
        assert corpus.verify_corpus(built).shards == 5 and corpus.info_lines(built)[2] == "shards     5"
        CorpusWindows(built, seq=4).close()
    lock.unlink()
    corpus.verify_corpus(built)
    with pytest.raises(PskdError, match="E9016: .*cannot open the lock file"):
        with directory_lock(str(built.parent / "missing")):
            pass


def test_a_users_file_or_link_at_a_shard_name_of_a_first_build_is_refused(tmp_path):
    """No manifest or journal of the directory lists the name: the file (or link) there is the
    user's, and the build refuses before writing anything (E9012 naming it)."""
    inputs = make_inputs(tmp_path, 2)
    out = tmp_path / "c"
    out.mkdir()
    (out / "shard-00000.psk.d").write_bytes(b"the user's own bytes")
    with pytest.raises(PskdError, match=r"^E9012: .*c/shard-00000\.psk\.d: a file stands at a shard's name, and no "
                                        r"manifest or journal of this corpus lists it: the build will not replace it; "
                                        r"move it away or build into another directory$"):
        build_corpus(inputs, out, BuildOptions(durable=False))
    assert sorted(os.listdir(out)) == [".pskd-corpus.lock", "shard-00000.psk.d"]
    assert (out / "shard-00000.psk.d").read_bytes() == b"the user's own bytes"
    os.unlink(out / "shard-00000.psk.d")
    outside = tmp_path / "precious.psk.d"
    outside.write_bytes(b"not to be overwritten")
    os.symlink(outside, out / "shard-00001.psk.d")
    with pytest.raises(PskdError, match=r"^E9012: .*c/shard-00001\.psk\.d: a symbolic link stands at a shard's name"):
        build_corpus(inputs, out, BuildOptions(durable=False))
    assert sorted(os.listdir(out)) == [".pskd-corpus.lock", "shard-00001.psk.d"]
    assert (out / "shard-00001.psk.d").is_symlink()
    assert outside.read_bytes() == b"not to be overwritten"
    # A manifest that is no manifest proves nothing; a journal of another build of the directory does.
    (out / "shards.json").write_text('{"shards": [{"path": "shard-00001.psk.d"}]}')
    with pytest.raises(PskdError, match=r"^E9012: .*c/shard-00001\.psk\.d: a symbolic link"):
        build_corpus(inputs, out, BuildOptions(durable=False))
    header = {"format": "pskd-corpus-journal", "tokenizer": {"kind": "chars", "vocab": ["x"]}, "build": {}}
    (out / ".shards.journal").write_text(json.dumps(header) + '\n{"writes": ["shard-00001.psk.d"]}\n')
    build_corpus(inputs, out, BuildOptions(durable=False))
    assert not (out / "shard-00001.psk.d").is_symlink() and outside.read_bytes() == b"not to be overwritten"
    corpus.verify_corpus(out / "shards.json")


def test_resume_from_a_journal(tmp_path):
    inputs = make_inputs(tmp_path, 3)
    build_corpus(inputs, tmp_path / "ref", BuildOptions(durable=False))
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    manifest = corpus.read_manifest(out / "shards.json")
    # As a build killed after two shards leaves it: a journal of the names it writes and two
    # entries (the last line torn).
    header = {"format": "pskd-corpus-journal", "tokenizer": {"kind": "bytes"}, "build": manifest.build}
    writes = {"writes": [s.path for s in manifest.shards]}
    lines = [json.dumps(header), json.dumps(writes)] + [json.dumps(s.to_json()) for s in manifest.shards[:2]]
    (out / ".shards.journal").write_text("\n".join(lines) + '\n{"path": "shard-000')
    os.unlink(out / "shards.json")
    with open(out / "shard-00002.psk.d", "ab") as f:
        f.write(b"\x07\x00")  # trailing bytes of an interrupted append
    result = build_corpus(inputs, out, BuildOptions(durable=False))
    assert (result.built, result.kept) == (2, 2)
    for name in os.listdir(tmp_path / "ref"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert not (out / ".shards.journal").exists()


def test_an_input_whose_name_is_not_utf8(tmp_path):
    name = os.fsdecode(b"caf\xe9.jsonl")  # a Latin-1 file name: a lone surrogate in Python
    source = jsonl(tmp_path / name, ["caf\u00e9", "au lait"])
    result = build_corpus([source], tmp_path / "c", BuildOptions(durable=False))
    manifest = corpus.read_manifest(tmp_path / "c" / "shards.json")
    assert manifest.shards[0].source["path"] == str(source) and manifest.tokens == result.manifest.tokens == 14
    assert "\\udce9" in (tmp_path / "c" / "shards.json").read_text(encoding="utf-8")
    assert build_corpus([source], tmp_path / "c", BuildOptions(durable=False)).kept == 1  # read back equal: kept


def test_progress_counts_kept_shards_among_all_the_build_has(tmp_path):
    inputs = make_inputs(tmp_path)
    build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))
    jsonl(inputs[1], ["a changed input"])  # its shard is rebuilt, the other four kept
    seen = []
    build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False), progress=lambda *args: seen.append(args))
    total_bytes = sum(os.path.getsize(p) for p in inputs)
    assert seen[0] == (total_bytes - os.path.getsize(inputs[1]), total_bytes, 4, 5)  # the kept ones, of five
    assert seen[-1] == (total_bytes, total_bytes, 5, 5)
    assert all(done <= total for done, total, *_ in seen) and all(d <= t for *_, d, t in seen)
