"""The corpus manifest (pskd_jax.corpus.manifest): paths that may not leave its directory, malformed
and hostile texts and every field of a wrong type refused with E9016, and nothing written that a
reader would refuse."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from pskd_jax import corpus
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError

from .helpers import edit_manifest


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


@pytest.mark.parametrize("again", ["shard-00000.psk.d", "./shard-00000.psk.d", ".//shard-00000.psk.d"])
def test_a_shard_listed_twice_is_refused(built, again):
    """Its tokens would appear twice in the stream (a merge refuses the same)."""
    def list_twice(d):
        d["shards"][1].update(path=again, sha256=d["shards"][0]["sha256"], tokens=d["shards"][0]["tokens"],
                              documents=d["shards"][0]["documents"])
    edit_manifest(built, list_twice)
    for action in (corpus.read_manifest, corpus.verify_corpus, lambda p: list(corpus.info_lines(p)),
                   lambda p: CorpusWindows(p, seq=4)):
        with pytest.raises(PskdError, match="E9016: .*shards.json: shard 1: path .* lists already"):
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
        except Exception as e:
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


def test_is_manifest(built, tmp_path):
    assert corpus.is_manifest(built)
    assert not corpus.is_manifest(built.parent / "shard-00000.psk.d")
    (tmp_path / "x.json").write_text('{"format": "other"}')
    assert not corpus.is_manifest(tmp_path / "x.json") and not corpus.is_manifest(tmp_path / "none")


def test_a_build_into_a_store_records_its_writer_and_the_inputs_version_tags():
    """The two fields a build into a store adds: ``in_progress.writer`` (a manifest in progress
    only) and sources with a ``tag``; each checked as strictly as the others."""
    from pskd_jax.corpus.manifest import decode_manifest, manifest_bytes, object_shard, parse_manifest
    from pskd_jax.storage import locate

    t = Tokenizer.bytes()
    shard = Shard("shard-00000.psk.d", 3, 1, "0" * 64, 0, {"path": "s3://data/raw/a.jsonl", "size": 9, "tag": '"e1"'})
    text = manifest_bytes(t, [shard], {}, planned_shards=2, writer="a1b2")
    m = parse_manifest(decode_manifest(text, "m"), "m")
    assert (m.writer, m.planned_shards, m.shards[0].source["tag"]) == ("a1b2", 2, '"e1"')
    assert m.to_bytes() == text and b'"writer"' not in manifest_bytes(t, [shard], {})
    for bad, what in (('"writer": "a1b2"', '"writer": 7'), ('"writer": "a1b2"', '"writer": ""'),
                      ('"tag": "\\"e1\\""', '"tag": 5'), ('"tag": "\\"e1\\""', '"tag": "x", "mtime_ns": 1')):
        with pytest.raises(PskdError, match=r"^E9016: "):
            parse_manifest(decode_manifest(text.decode().replace(bad, what).encode(), "m"), "m")
    where = locate("s3://data/corpus/shards.json")
    assert object_shard(where, "part/shard-00000.psk.d", "m").url == "s3://data/corpus/part/shard-00000.psk.d"
    for bad in ("../x.psk.d", "/x.psk.d", "a//b.psk.d", "./x.psk.d", "a\\b.psk.d", "a\nb"):
        with pytest.raises(PskdError, match=r"^E9016: m: path .* is not a key below the manifest's prefix"):
            object_shard(where, bad, "m")
