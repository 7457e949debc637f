"""Sharded corpora: tokenizing documents, shards written chunk by chunk, the manifest, verification,
merging, and windows over the global token stream."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import pickle

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from pskd_jax.corpus import inputs as corpus_tokens
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.build import build_corpus, build_shard
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.inputs import find_inputs
from pskd_jax.errors import PskdError
from pskd_jax.data.windows import lm_windows_file

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
    result = build_shard(str(source), str(out), tokenizer=tokenizer or Tokenizer.bytes(), durable=False, **options)
    return result, out


# ---------------------------------------------------------------------------------------------
# Tokenizers and documents


def test_tokenizers():
    assert (Tokenizer.bytes().boundary, Tokenizer.bytes().vocab_size, Tokenizer.bytes().dtype) == (256, 257, np.uint16)
    t = Tokenizer.chars(["\n", "a", "é"])
    assert (t.boundary, t.vocab_size, t.sample_type, t.dtype) == (3, 4, "idx[4][]", np.uint8)
    assert Tokenizer.from_json(t.to_json(), "m") == t
    with pytest.raises(PskdError, match="E9011.*2 characters"):
        Tokenizer.chars(["a", "bc"])
    with pytest.raises(PskdError, match="E9011.*repeats"):
        Tokenizer.chars(["a", "a"])


def test_jsonl_bytes_one_boundary_after_every_document(tmp_path):
    texts = ["hello", "héllo wörld 🙂", "", "x" * 5000]
    result, out = build(tmp_path, jsonl(tmp_path / "a.jsonl", texts))
    assert shard_tokens(out) == byte_stream(texts)
    entry = result.entry
    assert (entry.path, entry.tokens, entry.documents, entry.skipped) == ("s.psk.d", len(byte_stream(texts)), 3, 0)
    assert entry.sha256 == sha256(out)
    assert entry.source == {"path": str(tmp_path / "a.jsonl"), "size": os.path.getsize(tmp_path / "a.jsonl"),
                            "mtime_ns": os.stat(tmp_path / "a.jsonl").st_mtime_ns}
    with pskd_jax.Reader(out) as r:
        assert r.header.type_text == "idx[257][]"


def test_blank_lines_crlf_bom_and_other_keys(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"body": "one"}\r\n\n   \n{"body": "two", "text": 3}\n{"body": "three"}')
    _, out = build(tmp_path, p, text_key="body")
    assert shard_tokens(out) == byte_stream(["one", "two", "three"])


def test_gzip_gives_the_same_tokens(tmp_path):
    texts = [f"document {i} " * (i % 7 + 1) for i in range(300)]
    plain = jsonl(tmp_path / "a.jsonl", texts)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    _, out = build(tmp_path, plain)
    first = out.read_bytes()
    _, out = build(tmp_path, gz)
    assert out.read_bytes() == first


def test_long_lines_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_tokens, "BLOCK_BYTES", 64)
    texts = ["a" * 300, "b", "c" * 65, "d" * 10]
    _, out = build(tmp_path, jsonl(tmp_path / "a.jsonl", texts))
    assert shard_tokens(out) == byte_stream(texts)


def test_txt_is_one_document(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_tokens, "BLOCK_BYTES", 16)
    text = "line one\nlïne twö\n" * 5
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    result, out = build(tmp_path, tmp_path / "a.txt")
    assert shard_tokens(out) == byte_stream([text])
    assert result.entry.documents == 1
    (tmp_path / "e.txt").write_bytes(b"")
    result, out = build(tmp_path, tmp_path / "e.txt")
    assert (result.entry.tokens, result.entry.documents, shard_tokens(out)) == (0, 0, [])


def test_chars_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_tokens, "BLOCK_BYTES", 8)
    vocab = ["\n", " ", "a", "b", "é"]
    t = Tokenizer.chars(vocab)
    _, out = build(tmp_path, jsonl(tmp_path / "a.jsonl", ["ab a", "", "éé\n"]), t)
    assert shard_tokens(out) == [2, 3, 1, 2, 5, 4, 4, 0, 5]
    (tmp_path / "a.txt").write_text("ab\né" * 3, encoding="utf-8")
    _, out = build(tmp_path, tmp_path / "a.txt", t)
    assert shard_tokens(out) == [2, 3, 0, 4] * 3 + [5]


def test_max_document_tokens(tmp_path):
    texts = ["héllo", "ab", "wörld!"]
    _, out = build(tmp_path, jsonl(tmp_path / "a.jsonl", texts), max_document_tokens=2)
    assert shard_tokens(out) == byte_stream(texts, 2)  # bytes: may cut a character in two
    t = Tokenizer.chars(sorted(set("".join(texts))))
    _, out = build(tmp_path, jsonl(tmp_path / "a.jsonl", texts), t, max_document_tokens=2)
    assert shard_tokens(out) == [t.vocab.index(c) for c in "hé"] + [t.boundary] + \
        [t.vocab.index(c) for c in "ab"] + [t.boundary] + [t.vocab.index(c) for c in "wö"] + [t.boundary]
    (tmp_path / "a.txt").write_text("0123456789" * 100, encoding="utf-8")
    _, out = build(tmp_path, tmp_path / "a.txt", max_document_tokens=15)
    assert shard_tokens(out) == list(b"012345678901234") + [B]


BAD_LINES = [
    (b'{"text": "fine"}\n{"text": "unterminated\n', 2, "not JSON"),
    (b'{"text": "fine"}\n\n[1, 2]\n', 3, "a JSON list, not an object"),
    (b'{"body": "x"}\n', 1, "no 'text' key"),
    (b'{"text": "a"}\n{"text": 12}\n', 2, "the 'text' value is int, not a string"),
    (b'{"text": "a"}\n{"text": "caf\xe9"}\n', 2, "invalid UTF-8"),
    (b'{"text": "a"}\n{"text": "x\\ud800y"}\n', 2, "lone surrogate U\\+D800"),
]


@pytest.mark.parametrize("data,line,what", BAD_LINES)
def test_bad_jsonl_names_file_and_line_and_leaves_no_shard(tmp_path, data, line, what):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(data)
    with pytest.raises(PskdError, match=f"E9015: {p}:{line}: .*{what}"):
        build(tmp_path, p)
    assert not (tmp_path / "s.psk.d").exists()
    result, out = build(tmp_path, p, skip_bad=True)
    assert result.entry.skipped == 1 and len(result.examples) == 1 and f"{p}:{line}" in result.examples[0]
    good = [json.loads(x)["text"] for x in data.split(b"\n") if x.startswith(b'{"text": "') and x.endswith(b'"}')
            and b"\\u" not in x and b"\xe9" not in x]
    assert shard_tokens(out) == byte_stream(good)


def test_unknown_characters_for_a_vocabulary(tmp_path):
    t = Tokenizer.chars(["a", "b", "\n"])
    p = jsonl(tmp_path / "a.jsonl", ["ab", "abc", "ba", "zz"])
    with pytest.raises(PskdError, match=rf"E9015: {p}:2: character 'c' \(U\+0063\) is not in the vocabulary"):
        build(tmp_path, p, t)
    result, out = build(tmp_path, p, t, skip_bad=True)
    assert (result.entry.skipped, result.entry.documents) == (2, 2)
    assert shard_tokens(out) == [0, 1, 3, 1, 0, 3]
    (tmp_path / "a.txt").write_text("ab\nab\nxa", encoding="utf-8")
    with pytest.raises(PskdError, match=rf"E9015: {tmp_path / 'a.txt'}:3: character 'x'"):
        build(tmp_path, tmp_path / "a.txt", t)
    result, out = build(tmp_path, tmp_path / "a.txt", t, skip_bad=True)
    assert (result.entry.tokens, result.entry.documents, result.entry.skipped) == (0, 0, 1)


def test_invalid_utf8_in_txt(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"ok\nok\nbad \xff here")
    with pytest.raises(PskdError, match=f"E9015: {p}:3: invalid UTF-8"):
        build(tmp_path, p)
    assert not (tmp_path / "s.psk.d").exists()


def test_inputs_in_sorted_order(tmp_path):
    for name in ("d/b.txt", "d/a/z.jsonl", "d/a/y.jsonl.gz", "d/c.md", "d/.h.txt", "d/.git/x.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    found = find_inputs([tmp_path / "d", tmp_path / "d" / "b.txt"])
    assert [os.path.relpath(p, tmp_path) for p in found] == ["d/a/y.jsonl.gz", "d/a/z.jsonl", "d/b.txt", "d/b.txt"]
    with pytest.raises(PskdError, match="E9015.*c.md: not a .jsonl"):
        find_inputs([tmp_path / "d" / "c.md"])
    with pytest.raises(PskdError, match="E9015.*no such file"):
        find_inputs([tmp_path / "nope.txt"])


# ---------------------------------------------------------------------------------------------
# Writing in chunks


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


# ---------------------------------------------------------------------------------------------
# Whole corpora


def make_inputs(tmp_path: pathlib.Path, n: int = 4) -> list[pathlib.Path]:
    rng = np.random.default_rng(1)
    paths = []
    for i in range(n):
        texts = ["".join(rng.choice(list("abcdé \n"), int(rng.integers(0, 40)))) for _ in range(20 + 10 * i)]
        paths.append(jsonl(tmp_path / f"in{i}.jsonl", texts))
    (tmp_path / "in9.txt").write_text("a plain text document\n", encoding="utf-8")
    return paths + [tmp_path / "in9.txt"]


def test_build_corpus_manifest_and_rerun(tmp_path):
    inputs = make_inputs(tmp_path)
    out = tmp_path / "corpus"
    result = build_corpus(inputs, out, chunk_tokens=50, durable=False)
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
    assert sorted(os.listdir(out)) == [".pskd-corpus.lock"] + [f"shard-{i:05d}.psk.d" for i in range(5)] + ["shards.json"]
    first = (out / "shards.json").read_bytes()

    again = build_corpus(inputs, out, chunk_tokens=50, durable=False)
    assert (again.built, again.kept) == (0, 5) and (out / "shards.json").read_bytes() == first

    inputs[2].write_text(inputs[2].read_text() + '{"text": "more"}\n')  # a changed input
    with open(out / "shard-00003.psk.d", "r+b") as f:  # a damaged shard
        f.seek(-2, 2)
        f.write(b"\x01")
    again = build_corpus(inputs, out, chunk_tokens=50, durable=False)
    assert (again.built, again.kept) == (2, 3)
    corpus.verify_corpus(out / "shards.json")

    t = Tokenizer.chars(list(dict.fromkeys("abcdé \na plain text document more")))
    again = build_corpus(inputs, out, tokenizer=t, durable=False)  # other options: every shard rebuilt
    assert (again.built, again.kept) == (5, 0) and again.manifest.vocab_size == len(t.vocab) + 1


def test_pool_build_is_byte_identical(tmp_path):
    """In a pool of spawned workers (the command line's forked ones are tested in test_corpus_cli)."""
    inputs = make_inputs(tmp_path)
    build_corpus(inputs, tmp_path / "one", chunk_tokens=30, durable=False)
    calls = []
    build_corpus(inputs, tmp_path / "two", workers=2, chunk_tokens=1000, durable=False,
                 progress=lambda *a: calls.append(a), start_method="spawn")
    for name in ["shards.json"] + [f"shard-{i:05d}.psk.d" for i in range(5)]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert calls[-1][2:] == (5, 5)


def test_a_bad_input_fails_the_build_and_writes_no_manifest(tmp_path):
    inputs = make_inputs(tmp_path, 2)
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\nnope\n')
    with pytest.raises(PskdError, match="E9015.*bad.jsonl:2: not JSON"):
        build_corpus(inputs + [tmp_path / "bad.jsonl"], tmp_path / "c", durable=False)
    # The manifest of the failed build lists the shards it finished, marked in progress (read-while-write).
    partial = corpus.read_manifest(tmp_path / "c" / "shards.json")
    assert (partial.complete, partial.planned_shards, len(partial.shards)) == (False, 4, 3)
    assert not (tmp_path / "c" / "shard-00003.psk.d").exists()
    result = build_corpus(inputs + [tmp_path / "bad.jsonl"], tmp_path / "c", skip_bad=True, durable=False)
    assert result.skipped == 1 and "bad.jsonl:2" in result.examples[0]


def test_a_second_build_of_a_directory_is_refused(tmp_path):
    inputs = make_inputs(tmp_path, 1)
    (tmp_path / "c").mkdir()
    with directory_lock(str(tmp_path / "c")):
        with pytest.raises(PskdError, match="E9016.*another corpus build is running"):
            build_corpus(inputs, tmp_path / "c", durable=False)
    build_corpus(inputs, tmp_path / "c", durable=False)


def test_a_smaller_rebuild_removes_the_stale_shards_and_nothing_else(tmp_path):
    inputs = make_inputs(tmp_path)
    out = tmp_path / "c"
    build_corpus(inputs, out, durable=False)
    mine = ["notes.txt", "shard-00004.psk.d.bak", "shard-4.psk.d", "shard-000004.psk.d", ".shard-00004.psk.d",
            "shard-00004.psk.d.tmp"]
    for name in mine:
        (out / name).write_text("the user's")
    (out / "shard-00007.psk.d").mkdir()  # a directory of that name: not a shard of ours
    os.symlink(tmp_path / "in0.jsonl", out / "shard-00009.psk.d")  # a link of that name: removed, not its target
    result = build_corpus(inputs[:2], out, durable=False)
    assert (result.built, result.kept) == (0, 2)
    build_corpus(inputs[:2], tmp_path / "ref", durable=False)
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "ref") + mine + ["shard-00007.psk.d"])
    assert all((out / name).read_text() == "the user's" for name in mine) and (tmp_path / "in0.jsonl").exists()
    for name in os.listdir(tmp_path / "ref"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    corpus.verify_corpus(out / "shards.json")


def test_a_symlink_at_a_shard_name_is_replaced_not_written_through(tmp_path):
    inputs = make_inputs(tmp_path, 2)
    out = tmp_path / "c"
    out.mkdir()
    outside = tmp_path / "precious.psk.d"
    outside.write_bytes(b"not to be overwritten")
    os.symlink(outside, out / "shard-00000.psk.d")
    build_corpus(inputs, out, durable=False)
    assert outside.read_bytes() == b"not to be overwritten" and not (out / "shard-00000.psk.d").is_symlink()
    # A link to an outside copy of a shard that matches its entry is not kept either: it is rebuilt.
    outside.write_bytes((out / "shard-00001.psk.d").read_bytes())
    os.unlink(out / "shard-00001.psk.d")
    os.symlink(outside, out / "shard-00001.psk.d")
    copy = outside.read_bytes()
    assert build_corpus(inputs, out, durable=False).built == 1
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


def test_resume_from_a_journal(tmp_path):
    inputs = make_inputs(tmp_path, 3)
    build_corpus(inputs, tmp_path / "ref", durable=False)
    out = tmp_path / "c"
    build_corpus(inputs, out, durable=False)
    manifest = corpus.read_manifest(out / "shards.json")
    # As a build killed after two shards leaves it: a journal of two entries (the last line torn).
    header = {"format": "pskd-corpus-journal", "tokenizer": {"kind": "bytes"}, "build": manifest.build}
    lines = [json.dumps(header)] + [json.dumps(s.to_json()) for s in manifest.shards[:2]]
    (out / ".shards.journal").write_text("\n".join(lines) + '\n{"path": "shard-000')
    os.unlink(out / "shards.json")
    with open(out / "shard-00002.psk.d", "ab") as f:
        f.write(b"\x07\x00")  # trailing bytes of an interrupted append
    result = build_corpus(inputs, out, durable=False)
    assert (result.built, result.kept) == (2, 2)
    for name in os.listdir(tmp_path / "ref"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert not (out / ".shards.journal").exists()


# ---------------------------------------------------------------------------------------------
# Verification, inspection, merging


@pytest.fixture()
def built(tmp_path):
    inputs = make_inputs(tmp_path)
    build_corpus(inputs, tmp_path / "c", durable=False)
    return tmp_path / "c" / "shards.json"


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


def edit_manifest(path: pathlib.Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("bad_path,what", [("/etc/passwd", "is absolute"), ("../x.psk.d", "holds '..'"),
                                           ("sub/../../x.psk.d", "holds '..'"), ("out", "through a symlink"),
                                           ("outdir/elsewhere.psk.d", "through a symlink"),
                                           ("a\0b.psk.d", "holds a NUL byte"), ("\ud800.psk.d", "lone surrogate"),
                                           ("sub/", "names a directory"), (".", "names a directory"),
                                           ("x" * 5000, "longer than a path may be")])
def test_paths_that_leave_the_directory_are_refused(built, tmp_path, bad_path, what):
    (tmp_path / "elsewhere.psk.d").write_bytes((built.parent / "shard-00000.psk.d").read_bytes())
    os.symlink(tmp_path / "elsewhere.psk.d", built.parent / "out")
    os.symlink(tmp_path, built.parent / "outdir")
    edit_manifest(built, lambda d: d["shards"][1].update(path=bad_path))
    for action in (corpus.read_manifest, corpus.verify_corpus, lambda p: CorpusWindows(p, seq=4)):
        with pytest.raises(PskdError, match=f"E9016: .*shard 1: path .*{what}"):
            action(built)


def test_a_symlink_inside_the_directory_is_fine(built):
    os.symlink("shard-00000.psk.d", built.parent / "alias.psk.d")
    edit_manifest(built, lambda d: d["shards"][0].update(path="alias.psk.d"))
    corpus.verify_corpus(built)


@pytest.mark.parametrize("change,what", [
    (lambda d: d.update(format="x"), "format is 'x'"),
    (lambda d: d.update(version=2), "version 2"),
    (lambda d: d.update(vocab_size=256), "vocab_size is 256"),
    (lambda d: d.update(tokenizer={"kind": "bpe"}), "tokenizer must be"),
    (lambda d: d["shards"][0].update(tokens=-1), "'tokens' must be an integer"),
    (lambda d: d["shards"][0].update(sha256="xyz"), "'sha256' must be 64"),
    (lambda d: d.update(shards={}), "'shards' must be a list"),
])
def test_malformed_manifests(built, change, what):
    edit_manifest(built, change)
    with pytest.raises(PskdError, match=f"E9016: .*{what}"):
        corpus.read_manifest(built)


def _replace_field(text: str, key: str, value: str) -> str:
    """The manifest's text with the first ``"key": …`` value replaced by raw JSON text."""
    import re

    return re.sub(rf'"{key}": ("[^"]*"|[^,}}\]]*)', lambda m: f'"{key}": {value}', text, count=1)


HOSTILE_TEXTS = [  # (how the manifest's text changes, what the message says)
    (lambda t: "[" * 100000 + "]" * 100000, "not a JSON manifest \\(nested too deep\\)"),
    (lambda t: '{"format": ' + "{" * 50000 + "}" * 50000 + "}", "not a JSON manifest"),
    (lambda t: _replace_field(t, "shards", "[" + "[" * 100000 + "]" * 100000 + "]"), "nested too deep"),
    (lambda t: _replace_field(t, "tokens", "Infinity"), "Infinity is not a JSON number"),
    (lambda t: _replace_field(t, "documents", "NaN"), "NaN is not a JSON number"),
    (lambda t: _replace_field(t, "tokens", "-Infinity"), "-Infinity is not a JSON number"),
    (lambda t: _replace_field(t, "tokens", "1e400"), "'tokens' must be an integer .* got the real number inf"),
    (lambda t: _replace_field(t, "tokens", "1" + "0" * 30), "'tokens' must be an integer from 0 to 2\\*\\*63 - 1"),
    (lambda t: _replace_field(t, "tokens", "1" + "0" * 5000), "not a JSON manifest .*digits"),
    (lambda t: _replace_field(t, "skipped", str(2**63)), "'skipped' must be an integer"),
    (lambda t: _replace_field(t, "documents", "12.0"), "'documents' must be an integer"),
    (lambda t: _replace_field(t, "version", "1.0"), "version the real number 1.0"),
    (lambda t: _replace_field(t, "version", "true"), "version true"),
    (lambda t: _replace_field(t, "vocab_size", "257.0"), "vocab_size is the real number 257.0"),
    (lambda t: _replace_field(t, "boundary", "1e999"), "boundary is the real number inf"),
    (lambda t: t.rstrip().rstrip("}") + ', "shards": []}', "the key 'shards' appears twice"),
    (lambda t: t.replace('"tokens"', '"tokens": 1, "tokens"', 1), "the key 'tokens' appears twice"),
    (lambda t: "\ufeff" + t, "not a JSON manifest"),
    (lambda t: t[: len(t) // 2], "not a JSON manifest"),
]


def expect_e9016(path: pathlib.Path, what: str, actions) -> list[str]:
    """What went otherwise than an E9016 naming ``path`` and matching ``what``, for each action."""
    import re

    wrong = []
    for action in actions:
        try:
            action(path)
            wrong.append(f"{what}: accepted")
        except PskdError as e:
            if not re.search(f"E9016: {re.escape(str(path))}: .*{what}", str(e)):
                wrong.append(f"{what}: {e}"[:300])
        except Exception as e:  # noqa: BLE001 - the point: nothing but a PskdError
            wrong.append(f"{what}: {type(e).__name__}: {e}"[:300])
    return wrong


def test_hostile_manifest_texts_are_e9016_and_nothing_else(built):
    text = built.read_text(encoding="utf-8")
    actions = (corpus.read_manifest, corpus.verify_corpus, corpus.info_lines, lambda p: CorpusWindows(p, seq=4),
               lambda p: corpus.merge_manifests([p], p.parent / "merged.json"))
    wrong = []
    for change, what in HOSTILE_TEXTS:
        built.write_text(change(text), encoding="utf-8")
        wrong += expect_e9016(built, what, actions)
        corpus.is_manifest(built)  # True or False (a pipeline then opens it as a corpus: E9016), never raises
    assert wrong == []


WRONG = [None, True, 1, 1.5, -1, "x", "", [], [1], {}, {"kind": None}]
FIELDS = {
    "format": None, "version": None, "tokenizer": None, "vocab_size": None, "boundary": None, "shards": None,
    "build": [{"text_key": v} for v in WRONG if not (isinstance(v, str) and v)]
    + [{"max_document_tokens": v} for v in (True, 0, -1, 1.5, "x", [], 2**63)]
    + [{"skip_bad": v} for v in (None, 0, 1, "yes", [])] + [{"other": 1}] + [v for v in WRONG if v != {}],
}
SHARD_FIELDS = {
    "path": [None, True, 1, 1.5, "", [], {}],
    "tokens": [None, True, 1.5, -1, "x", [], {}, 2**63],
    "documents": [None, True, 1.5, -1, "x", [], {}, 10**9],  # 10**9: more documents than tokens
    "sha256": [None, 1, "x", "A" * 64, "g" * 64, [], {}],
    "skipped": [None, True, 1.5, -1, "x", [], {}],
    "source": [True, 1, "x", [], {}, {"path": "a"}, {"path": 1, "size": 1, "mtime_ns": 1},
               {"path": "a", "size": -1, "mtime_ns": 1}, {"path": "a", "size": 1, "mtime_ns": 1.5},
               {"path": "a", "size": 1, "mtime_ns": 1, "more": {}}],
}
VALID = {"version": [1], "shards": [[]]}
WRONG_TYPES = [(key, value) for key, values in FIELDS.items() for value in (values or WRONG)
               if value not in VALID.get(key, [])] + \
    [(f"shards[1].{key}", value) for key, values in SHARD_FIELDS.items() for value in values] + \
    [("tokenizer", {"kind": "chars", "vocab": v}) for v in (None, "ab", {"a": 0}, [1], ["ab"], [["a"]], ["a", "a"],
                                                            ["\ud800"], [])] + \
    [("shards", [1]), ("shards", [None]), ("shards", [[]]), ("shards", {"0": {}})]


def test_every_field_of_a_wrong_type_is_e9016(built):
    good = json.loads(built.read_text())
    wrong = []
    for key, value in WRONG_TYPES:
        data = json.loads(json.dumps(good))
        if key.startswith("shards[1]."):
            data["shards"][1][key.split(".", 1)[1]] = value
        else:
            data[key] = value
        built.write_text(json.dumps(data))
        wrong += [f"{key} = {value!r:.60}: {w}" for w in expect_e9016(built, "", (corpus.read_manifest,
                                                                                 corpus.info_lines))]
    assert wrong == [] and len(WRONG_TYPES) > 100


def test_a_manifest_path_holding_a_nul_byte(tmp_path):
    with pytest.raises(PskdError, match="E9016: .*a path holds no NUL byte"):
        corpus.read_manifest(str(tmp_path / "a\0b" / "shards.json"))


def test_write_manifest_refuses_what_a_reader_would_refuse(tmp_path):
    shard = Shard("s.psk.d", 1, 1, "0" * 64)
    for build_options, what in (({"other": 1}, "'build' holds 'other'"),
                                ({"skip_bad": "yes"}, "'skip_bad' must be true or false")):
        with pytest.raises(PskdError, match=f"E9016: .*{what}"):
            corpus.write_manifest(tmp_path / "shards.json", Tokenizer.bytes(), [shard], build_options)
    with pytest.raises(PskdError, match="E9016: .*'documents' must be an integer"):
        corpus.write_manifest(tmp_path / "shards.json", Tokenizer.bytes(), [Shard("s.psk.d", 1, 1.0, "0" * 64)])
    with pytest.raises(PskdError, match="E9016: .*holds a NUL byte"):
        corpus.write_manifest(tmp_path / "shards.json", Tokenizer.bytes(), [Shard("s\0.psk.d", 1, 1, "0" * 64)])
    assert os.listdir(tmp_path) == []


def test_an_input_whose_name_is_not_utf8(tmp_path):
    name = os.fsdecode(b"caf\xe9.jsonl")  # a Latin-1 file name: a lone surrogate in Python
    source = jsonl(tmp_path / name, ["caf\u00e9", "au lait"])
    result = build_corpus([source], tmp_path / "c", durable=False)
    manifest = corpus.read_manifest(tmp_path / "c" / "shards.json")
    assert manifest.shards[0].source["path"] == str(source) and manifest.tokens == result.manifest.tokens == 14
    assert "\\udce9" in (tmp_path / "c" / "shards.json").read_text(encoding="utf-8")
    assert build_corpus([source], tmp_path / "c", durable=False).kept == 1  # read back equal: kept


def test_count_mismatch(built):
    edit_manifest(built, lambda d: d["shards"][0].update(tokens=d["shards"][0]["tokens"] + 1))
    with pytest.raises(PskdError, match="E9017: .*shard 0 .*header count"):
        corpus.verify_corpus(built)
    with pytest.raises(PskdError, match="E9017: .*shard 0 .*header count"):
        CorpusWindows(built, seq=4)


def test_info(built):
    m = corpus.read_manifest(built)
    lines = corpus.info_lines(built, shards=True)
    assert lines[2:5] == [f"shards     5", f"tokens     {m.tokens}", f"documents  {m.documents}"]
    assert lines[5] == f"boundary   {m.documents / m.tokens:.4%} of tokens"
    assert lines[6].startswith(f"per doc    {(m.tokens - m.documents) / m.documents:.1f} tokens")
    assert len(lines) == 7 + 5


def test_merge(tmp_path):
    inputs = make_inputs(tmp_path)
    build_corpus(inputs[:2], tmp_path / "all" / "a", durable=False)
    build_corpus(inputs[2:], tmp_path / "all" / "b", durable=False)
    merged = corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "b" / "shards.json"],
                                    tmp_path / "all" / "shards.json")
    assert [s.path for s in merged.shards] == ["a/shard-00000.psk.d", "a/shard-00001.psk.d", "b/shard-00000.psk.d",
                                               "b/shard-00001.psk.d", "b/shard-00002.psk.d"]
    corpus.verify_corpus(tmp_path / "all" / "shards.json")
    build_corpus(inputs, tmp_path / "whole", durable=False)
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
    build_corpus(inputs[:1], tmp_path / "all" / "d", skip_bad=True, durable=False)
    with pytest.raises(PskdError, match=r"E9016: .*d/shards.json: its build options differ from .*a/shards.json's "
                                        r"\(skip_bad True against False\)"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "d" / "shards.json"],
                               tmp_path / "all" / "m.json")
    assert not (tmp_path / "all" / "m.json").exists()
    build_corpus(inputs[:1], tmp_path / "all" / "c", tokenizer=Tokenizer.chars(list("abcdé \n")), durable=False)
    with pytest.raises(PskdError, match=r"E9016: .*c/shards.json: its tokenizer \(chars, 7 characters .*\) differs "
                                        r"from .*a/shards.json's \(bytes, vocabulary 257\)"):
        corpus.merge_manifests([tmp_path / "all" / "a" / "shards.json", tmp_path / "all" / "c" / "shards.json"],
                               tmp_path / "all" / "m.json")


# ---------------------------------------------------------------------------------------------
# Windows over the global stream


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


PIECES = [[5, 6, 7], [], [8], list(range(20, 60)), [9, 10], list(range(100, 131))]


@pytest.mark.parametrize("access", ["mmap", "pread"])
@pytest.mark.parametrize("seq,stride", [(4, 4), (4, 1), (3, 2), (8, 5), (1, 1), (30, 7), (76, 1), (10, 200)])
def test_windows_equal_lm_windows_of_the_concatenation(tmp_path, seq, stride, access):
    path = write_corpus(tmp_path / "c", [np.array(p) for p in PIECES])
    stream = np.concatenate([np.array(p, np.uint16) for p in PIECES])
    tokens_text = tmp_path / "tokens.txt"
    tokens_text.write_text(" ".join(map(str, stream.tolist())) + "\n")
    result = lm_windows_file(str(tokens_text), str(tmp_path / "w.psk.d"), vocab=257, seq=seq, stride=stride)
    with CorpusWindows(path, seq=seq, stride=stride, access=access) as windows, \
            pskd_jax.Reader(tmp_path / "w.psk.d") as reader:
        assert len(windows) == len(reader) == result.windows
        assert windows.type_text == reader.header.type_text
        if not len(windows):
            return
        order = np.random.default_rng(seq).permutation(len(windows))
        for idx in (np.arange(len(windows)), order, order[:3], np.array([-1, 0, -len(windows)])):
            inputs, targets = windows.gather(idx)
            want_in, want_tg = reader.gather(idx)
            assert inputs.dtype == want_in.dtype and inputs.flags.c_contiguous and targets.flags.c_contiguous
            np.testing.assert_array_equal(inputs, want_in)
            np.testing.assert_array_equal(targets, want_tg)
        i, t = windows[len(windows) - 1]
        np.testing.assert_array_equal(i, reader[len(windows) - 1][0])
        np.testing.assert_array_equal(windows.stream(0, windows.total_tokens), stream)
        assert windows.gather(np.array([], np.int64))[0].shape == (0, seq)


def test_windows_refuse_bad_indices(tmp_path):
    with CorpusWindows(write_corpus(tmp_path / "c", [np.arange(10)]), seq=4) as w:
        assert len(w) == 2
        with pytest.raises(PskdError, match="E9003.*window 2 is beyond the 2 windows"):
            w.gather([0, 2])
        with pytest.raises(PskdError, match="E9012"):
            w.gather(np.zeros((2, 2), np.int64))
        with pytest.raises(PskdError, match="E9012"):
            CorpusWindows(w.path, seq=0)
        with pytest.raises(PskdError, match="E9012.*an integer"):
            w[1.5]
        np.testing.assert_array_equal(w[np.int64(1)][1], np.arange(5, 9))
    with pytest.raises(PskdError, match="E9012.*closed"):
        w.gather([0])


def test_windows_pickle_and_verify(tmp_path):
    path = write_corpus(tmp_path / "c", [np.arange(50), np.arange(30)])
    w = CorpusWindows(path, seq=6, stride=5, verify=True)
    copy = pickle.loads(pickle.dumps(w))
    pread_copy = pickle.loads(pickle.dumps(CorpusWindows(path, seq=6, stride=5, access="pread")))
    assert pread_copy.access == "pread"
    for a, b in zip(w.gather(np.arange(len(w))), pread_copy.gather(np.arange(len(w)))):
        np.testing.assert_array_equal(a, b)
    pread_copy.close()
    with pytest.raises(PskdError, match="E9012.*access is one of mmap, pread"):
        CorpusWindows(path, seq=6, access="read")
    for a, b in zip(w.gather(np.arange(len(w))), copy.gather(np.arange(len(w)))):
        np.testing.assert_array_equal(a, b)
    copy.close()
    shard = tmp_path / "c" / "s1.psk.d"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + b"\x09")
    CorpusWindows(path, seq=6)  # the size and count match: only hashing finds it
    with pytest.raises(PskdError, match="E9017.*s1.psk.d: sha256"):
        CorpusWindows(path, seq=6, verify=True)
    with pytest.raises(PskdError, match="E9017: .*manifest changed"):
        write_corpus(tmp_path / "c", [np.arange(51), np.arange(30)])
        pickle.loads(pickle.dumps(w))


def test_windows_through_the_pipeline_and_loader(tmp_path):
    jax = pytest.importorskip("jax")
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline.batches import IteratorState, Pipeline

    path = write_corpus(tmp_path / "c", [np.arange(250) % 257, np.arange(123) % 257, np.arange(301) % 257])
    windows = CorpusWindows(path, seq=16, stride=9)
    pipeline = Pipeline(str(path), seed=3, batch_size=8)
    pipeline.check_batch_type(windows.type_text, "(idx[257][B, seq: 16], idx[257][B, seq: 16])")
    expected = [windows.gather(idx) for _, idx in pipeline.iter_batches(len(windows), epochs=2)]
    got = []
    with Loader(windows, pipeline, epochs=2) as loader:
        for inputs, targets in loader:
            assert isinstance(inputs, jax.Array)
            got.append((np.asarray(inputs), np.asarray(targets)))
    assert len(got) == len(expected) == 2 * (len(windows) // 8)
    for (a, b), (c, d) in zip(got, expected):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    resumed = Loader(windows, pipeline, state=IteratorState(2, 1), epochs=2)
    np.testing.assert_array_equal(np.asarray(next(iter(resumed))[0]), expected[len(expected) // 2 + 1][0])
    resumed.close()


def test_is_manifest(built, tmp_path):
    assert corpus.is_manifest(built)
    assert not corpus.is_manifest(built.parent / "shard-00000.psk.d")
    (tmp_path / "x.json").write_text('{"format": "other"}')
    assert not corpus.is_manifest(tmp_path / "x.json") and not corpus.is_manifest(tmp_path / "none")


def test_deeply_nested_or_huge_json_is_bad_input(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "ok"}\n' + "[" * 100000 + "]" * 100000 + "\n" + '{"text": 1' + "0" * 5000 + "}\n")
    with pytest.raises(PskdError, match=f"E9015: {p}:2: not JSON"):
        build(tmp_path, p)
    result, out = build(tmp_path, p, skip_bad=True)
    assert result.entry.skipped == 2 and shard_tokens(out) == byte_stream(["ok"])


def test_a_block_of_documents_bad_in_two_ways(tmp_path):
    """A lone surrogate and a character outside the vocabulary in one block (found by fuzzing,
    fuzz/regressions/jsonl-surrogate-and-unknown-char.bin): under skip_bad both are left out (the
    second used to escape as an internal exception), and either way the first bad line is named first."""
    t = Tokenizer.chars(["a", "b", "\n"])
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "ab"}\n{"text": "abc"}\n{"text": "a\\ud800"}\n{"text": "ba"}\n', encoding="utf-8")
    with pytest.raises(PskdError, match=rf"E9015: {p}:2: character 'c'"):
        build(tmp_path, p, t)
    result, out = build(tmp_path, p, t, skip_bad=True)
    assert (result.entry.documents, result.entry.skipped) == (2, 2)
    assert f"{p}:2: character 'c'" in result.examples[0] and f"{p}:3: the text holds a lone surrogate" in result.examples[1]
    assert shard_tokens(out) == [0, 1, 3, 1, 0, 3]
    p.write_text('{"text": "a\\ud800"}\n{"text": "abc"}\n', encoding="utf-8")
    with pytest.raises(PskdError, match=rf"E9015: {p}:1: the text holds a lone surrogate U\+D800"):
        build(tmp_path, p, t)


def test_a_merge_into_a_directory_where_a_build_runs_is_refused(tmp_path):
    from pskd_jax.corpus.lock import directory_lock

    part = write_corpus(tmp_path / "part", [np.arange(10)])
    output = tmp_path / "merged.json"
    with directory_lock(str(tmp_path)):  # what a running build holds
        with pytest.raises(PskdError, match="E9016.*another corpus build is running"):
            corpus.merge_manifests([part], output)
    assert not output.exists()
    assert corpus.merge_manifests([part], output).tokens == 10
