"""A Hugging Face ``tokenizer.json`` as a corpus tokenizer: the tokens are the library's own
``encode_batch`` ids, the boundary its end-of-text token, the manifest records it, and a corpus
of another tokenizer is refused. The tokenizers are trained here on the repository's own text."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from pskd_jax import corpus
from pskd_jax.corpus import Tokenizer
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import CorpusDirectoryError, CorpusInputError, UsageError, VocabularyError
from pskd_jax.format import Reader

from .bpe import documents, library_ids, repository_texts, train_bpe, word_level, write_jsonl


@pytest.fixture(scope="session")
def tokenizers_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="session")
def bpe(tokenizers_dir) -> str:
    """A byte-level BPE of 800 ids whose end-of-text token is ``<|endoftext|>`` (id 0)."""
    return train_bpe(tokenizers_dir / "bpe.json")


@pytest.fixture(scope="session")
def bpe_other(tokenizers_dir) -> str:
    """Another BPE (a smaller vocabulary): another tokenizer."""
    return train_bpe(tokenizers_dir / "other.json", vocab_size=600)


@pytest.fixture(scope="session")
def bpe_plain(tokenizers_dir) -> str:
    """A BPE without any special token: the boundary lies past its ids."""
    return train_bpe(tokenizers_dir / "plain.json", special_tokens=())


@pytest.fixture(scope="session")
def docs() -> list[str]:
    return documents(repository_texts())


def shard_tokens(directory, i: int = 0) -> np.ndarray:
    return np.asarray(Reader(os.path.join(directory, f"shard-{i:05d}.psk.d")).leaves()[0])


def expected_stream(path, texts: list[str], boundary: int, limit: int | None = None) -> np.ndarray:
    """The library's ids of each non-empty text, cut to ``limit``, a boundary after each."""
    out: list[int] = []
    for ids in library_ids(path, [t for t in texts if t]):
        out += ids[:limit] if limit is not None else ids
        out.append(boundary)
    return np.array(out, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Tokens are the library's encode_batch ids


def test_jsonl_tokens_are_the_librarys_encode_batch_ids(tmp_path, bpe, docs):
    t = Tokenizer.from_file(bpe)
    half = len(docs) // 2
    a = write_jsonl(tmp_path / "a.jsonl", docs[:half])
    b = tmp_path / "b.jsonl.gz"
    with gzip.open(b, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[half:])
    result = corpus.build_corpus([a, b], tmp_path / "c", BuildOptions(tokenizer=t))
    for i, part in enumerate((docs[:half], docs[half:])):
        got = shard_tokens(tmp_path / "c", i)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, expected_stream(bpe, part, t.boundary))
        assert result.manifest.shards[i].documents == sum(1 for d in part if d)
        assert int((got == t.boundary).sum()) == result.manifest.shards[i].documents  # never one inside a text


def test_a_special_token_written_in_a_text_is_text(tmp_path, bpe):
    t = Tokenizer.from_file(bpe)
    text = "quoted: <|endoftext|> in the middle"
    ids = t.encode(text)
    assert t.boundary not in ids.tolist() and t.decode(ids) == text
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", [text])], tmp_path / "c", BuildOptions(tokenizer=t))
    np.testing.assert_array_equal(shard_tokens(tmp_path / "c"), [*ids.tolist(), t.boundary])


def test_txt_inputs_are_one_document_each(tmp_path, bpe, docs):
    t = Tokenizer.from_file(bpe)
    texts = ["\ufeff" + docs[0], docs[1] + docs[2], ""]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    result = corpus.build_corpus(paths, tmp_path / "c", BuildOptions(tokenizer=t))
    for i, text in enumerate(texts):
        np.testing.assert_array_equal(shard_tokens(tmp_path / "c", i), expected_stream(bpe, [text], t.boundary))
    assert [s.documents for s in result.manifest.shards] == [1, 1, 0]


@pytest.mark.parametrize("limit", [1, 7, 100])
def test_max_document_tokens_keeps_the_first_ids(tmp_path, bpe, docs, limit):
    t = Tokenizer.from_file(bpe)
    jsonl = write_jsonl(tmp_path / "a.jsonl", docs[:40])
    txt = tmp_path / "b.txt"
    txt.write_text(docs[41] + docs[42], encoding="utf-8")
    corpus.build_corpus([jsonl, txt], tmp_path / "c", BuildOptions(tokenizer=t, max_document_tokens=limit))
    np.testing.assert_array_equal(shard_tokens(tmp_path / "c", 0), expected_stream(bpe, docs[:40], t.boundary, limit))
    np.testing.assert_array_equal(shard_tokens(tmp_path / "c", 1),
                                  expected_stream(bpe, [docs[41] + docs[42]], t.boundary, limit))


def test_skip_bad_leaves_out_bad_documents_and_keeps_the_others_ids(tmp_path, bpe, docs):
    t = Tokenizer.from_file(bpe)
    good = docs[:6]
    path = tmp_path / "a.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": good[0]}) + "\n")
        f.write("not json\n")  # line 2
        f.write(json.dumps({"text": good[1]}) + "\n")
        f.write('{"text": "a \\ud800 lone surrogate"}\n')  # line 4
        f.writelines(json.dumps({"text": d}) + "\n" for d in good[2:])
        f.write(json.dumps({"body": "no text key"}) + "\n")
    with pytest.raises(CorpusInputError, match=r"a\.jsonl:2: not JSON"):
        corpus.build_corpus([path], tmp_path / "refused", BuildOptions(tokenizer=t))
    result = corpus.build_corpus([path], tmp_path / "c", BuildOptions(tokenizer=t, skip_bad=True))
    assert result.skipped == 3 and any(":4: the text holds a lone surrogate U+D800" in e for e in result.examples)
    np.testing.assert_array_equal(shard_tokens(tmp_path / "c"), expected_stream(bpe, good, t.boundary))


def test_bad_utf8_in_a_txt_input_is_bad_input(tmp_path, bpe):
    t = Tokenizer.from_file(bpe)
    path = tmp_path / "a.txt"
    path.write_bytes(b"fine\nthen \xff here")
    with pytest.raises(CorpusInputError, match=r"a\.txt:2"):
        corpus.build_corpus([path], tmp_path / "c", BuildOptions(tokenizer=t))
    result = corpus.build_corpus([path], tmp_path / "d", BuildOptions(tokenizer=t, skip_bad=True))
    assert result.skipped == 1 and result.manifest.shards[0].tokens == 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_workers_give_the_bytes_of_one(tmp_path, bpe, docs):
    """The pool's workers get the tokenizer pickled (special tokens still encoded as text)."""
    t = Tokenizer.from_file(bpe)
    inputs = [write_jsonl(tmp_path / f"{i}.jsonl", docs[i::3] + ["<|endoftext|>"]) for i in range(3)]
    corpus.build_corpus(inputs, tmp_path / "one", BuildOptions(tokenizer=t))
    corpus.build_corpus(inputs, tmp_path / "two", BuildOptions(tokenizer=t, workers=2))
    for name in ["shards.json"] + [f"shard-{i:05d}.psk.d" for i in range(3)]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    for i in range(3):
        np.testing.assert_array_equal(shard_tokens(tmp_path / "two", i),
                                      expected_stream(bpe, docs[i::3] + ["<|endoftext|>"], t.boundary))


# --------------------------------------------------------------------------------------------
# The boundary and the idx width


def test_the_boundary_is_the_end_of_text_token(bpe):
    t = Tokenizer.from_file(bpe)
    assert (t.boundary_token, t.boundary, t.size, t.vocab_size) == ("<|endoftext|>", 0, 800, 800)
    assert t.sample_type == "idx[800][]" and t.dtype == np.uint16


def test_without_an_end_of_text_token_the_boundary_lies_past_the_ids(bpe_plain):
    t = Tokenizer.from_file(bpe_plain)
    assert t.boundary_token is None and t.boundary == t.size and t.vocab_size == t.size + 1


def test_the_usual_names_in_order_and_a_named_token(tmp_path):
    path = word_level(tmp_path / "w.json", {"[UNK]": 0, "a": 1}, special=("[SEP]", "</s>"))
    assert (Tokenizer.from_file(path).boundary_token, Tokenizer.from_file(path).boundary) == ("</s>", 3)
    named = Tokenizer.from_file(path, boundary_token="[SEP]")
    assert (named.boundary_token, named.boundary, named.vocab_size) == ("[SEP]", 2, 4)
    past = Tokenizer.from_file(path, boundary_token="")
    assert (past.boundary_token, past.boundary, past.vocab_size) == (None, 4, 5)
    with pytest.raises(VocabularyError, match=r"no token '<\|endoftext\|>'.*it holds '</s>', '\[SEP\]'"):
        Tokenizer.from_file(path, boundary_token="<|endoftext|>")


def test_idx_width_follows_the_vocabulary(tmp_path):
    narrow = Tokenizer.from_file(word_level(tmp_path / "n.json", {"[UNK]": 0, "a": 1, "b": 65534}))
    assert (narrow.vocab_size, narrow.dtype) == (65536, np.uint16)
    wide = Tokenizer.from_file(word_level(tmp_path / "w.json", {"[UNK]": 0, "a": 1, "b": 65535}))
    assert (wide.vocab_size, wide.dtype) == (65537, np.uint32)
    text = tmp_path / "t.txt"
    text.write_text("a b a c", encoding="utf-8")
    corpus.build_corpus([text], tmp_path / "c", BuildOptions(tokenizer=wide))
    reader = Reader(tmp_path / "c" / "shard-00000.psk.d")
    assert reader.header.type_text == "idx[65537][]"
    np.testing.assert_array_equal(reader.leaves()[0], [1, 65535, 1, 0, 65536])


def test_ids_filling_32_bits_leave_no_room_for_a_boundary_past_them(tmp_path):
    """Ids up to 2**32 - 1 are 2**32 ids: the boundary past them would be a 2**32 + 1st token."""
    full = word_level(tmp_path / "full.json", {"[UNK]": 0, "a": 1, "b": 2})
    data = json.loads(pathlib.Path(full).read_text())
    data["model"]["vocab"]["b"] = 2**32 - 1
    pathlib.Path(full).write_text(json.dumps(data))
    with pytest.raises(VocabularyError, match=r"E9011: .*full\.json: 4294967296 token ids \(0 to 4294967295\) and "
                                              r"a boundary past them make 4294967297 tokens; .* at most 4294967296"):
        Tokenizer.from_file(full, boundary_token="")


# --------------------------------------------------------------------------------------------
# The manifest's record, and refusing another tokenizer


def test_the_manifest_records_kind_digest_vocabulary_and_boundary(tmp_path, bpe, docs):
    t = Tokenizer.from_file(bpe)
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", docs[:3])], tmp_path / "c", BuildOptions(tokenizer=t))
    data = json.loads((tmp_path / "c" / "shards.json").read_text())
    digest = hashlib.sha256(pathlib.Path(bpe).read_bytes()).hexdigest()
    assert data["tokenizer"] == {"kind": "hf", "path": bpe, "sha256": digest, "vocab_size": 800,
                                 "boundary_token": "<|endoftext|>", "boundary": 0}
    assert (data["vocab_size"], data["boundary"]) == (800, 0)
    read = corpus.read_manifest(tmp_path / "c" / "shards.json").tokenizer
    assert read == t and read.matches(t)
    assert "sha256 " + digest in "\n".join(corpus.info_lines(tmp_path / "c" / "shards.json"))


@pytest.mark.parametrize("change, message", [
    ({"sha256": "ABC"}, "'sha256' must be 64 lowercase hex digits"),
    ({"boundary": 800}, "'boundary' must be an id below 800"),
    ({"boundary_token": None}, "'boundary' must be 800"),
    ({"vocab_size": 2**32 + 1}, "'vocab_size' must be an integer from 1 to 2\\*\\*32"),
    ({"extra": 1}, "has exactly the keys"),
])
def test_a_malformed_hf_record_is_refused(tmp_path, bpe, change, message):
    t = Tokenizer.from_file(bpe)
    record = dict(t.to_json(), **change)
    with pytest.raises(CorpusDirectoryError, match=message):
        Tokenizer.from_json(record, "m")


def test_verify_and_windows_refuse_a_corpus_of_another_tokenizer(tmp_path, bpe, bpe_other, docs):
    t = Tokenizer.from_file(bpe)
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", docs[:30])], tmp_path / "c", BuildOptions(tokenizer=t))
    manifest = tmp_path / "c" / "shards.json"
    mine, theirs = (hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest() for p in (bpe, bpe_other))
    for attempt in (lambda: corpus.verify_corpus(manifest, tokenizer=bpe_other),
                    lambda: corpus.CorpusWindows(manifest, seq=8, tokenizer=Tokenizer.from_file(bpe_other)),
                    lambda: corpus.CorpusWindows(manifest, seq=8, tokenizer=Tokenizer.bytes())):
        with pytest.raises(CorpusDirectoryError, match="built with another tokenizer") as e:
            attempt()
        assert mine in str(e.value)
    with pytest.raises(CorpusDirectoryError) as e:
        corpus.verify_corpus(manifest, tokenizer=bpe_other)
    assert theirs in str(e.value)
    # The same file elsewhere is the same tokenizer; so is the same file with another boundary choice.
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copy(bpe, copy)
    assert corpus.verify_corpus(manifest, tokenizer=copy).shards == 1
    with corpus.CorpusWindows(manifest, seq=8, tokenizer=Tokenizer.from_file(copy, boundary_token="")) as w:
        assert w.vocab_size == 800


def test_a_manifests_tokenizer_loads_its_file_and_checks_its_digest(tmp_path, bpe, bpe_other, docs):
    copy = tmp_path / "tokenizer.json"
    shutil.copy(bpe, copy)
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", docs[:3])], tmp_path / "c",
                        BuildOptions(tokenizer=Tokenizer.from_file(copy)))
    read = corpus.read_manifest(tmp_path / "c" / "shards.json").tokenizer
    assert read.decode(read.encode("tökén window")) == "tökén window"
    shutil.copy(bpe_other, copy)
    with pytest.raises(CorpusDirectoryError, match="but the corpus was built with one of sha256"):
        corpus.read_manifest(tmp_path / "c" / "shards.json").tokenizer.encode("x")


# --------------------------------------------------------------------------------------------
# Without the tokenizers package


def test_without_the_package_a_tokenizer_json_is_e9012_naming_the_extra(tmp_path, bpe, docs, monkeypatch):
    t = Tokenizer.from_file(bpe)
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", docs[:20])], tmp_path / "c", BuildOptions(tokenizer=t))
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now fails
    with pytest.raises(UsageError, match=r"pip install 'pskd_jax\[tokenizers\]'"):
        Tokenizer.from_file(bpe)
    # What needs no tokenizing still works: reading, verifying, training windows.
    assert corpus.verify_corpus(tmp_path / "c" / "shards.json").tokens > 0
    with corpus.CorpusWindows(tmp_path / "c" / "shards.json", seq=4) as w:
        assert len(w) > 0
    # A character vocabulary given as a file needs no package either.
    vocab = tmp_path / "vocab.json"
    vocab.write_text('["a", "b"]')
    assert Tokenizer.from_file(vocab) == Tokenizer.chars(["a", "b"])


def test_a_file_that_is_not_a_tokenizer_is_e9011(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"model": "nothing"}')
    with pytest.raises(VocabularyError, match="not a tokenizer.json the tokenizers library reads"):
        Tokenizer.from_file(path)


# --------------------------------------------------------------------------------------------
# encode / decode / vocab_size for every kind


@pytest.mark.parametrize("kind", ["bytes", "chars", "hf"])
def test_encode_decode_round_trip(kind, bpe):
    text = "tökén window\ndonnées 🙂"
    t = {"bytes": Tokenizer.bytes(), "chars": Tokenizer.chars(sorted(set(text))), "hf": Tokenizer.from_file(bpe)}[kind]
    ids = t.encode(text)
    assert ids.dtype == t.dtype and t.decode(ids) == text
    assert t.decode(np.concatenate([ids, ids])) == text + text
    if kind == "hf":
        assert ids.tolist() == library_ids(bpe, [text])[0]
        assert t.decode([*ids, t.boundary, *ids]) == text + "<|endoftext|>" + text  # the library's own text
    else:
        assert t.decode([*ids, t.boundary, *ids]) == text + "\n" + text
        assert t.decode([*ids, t.boundary, *ids], boundary_text="|") == text + "|" + text
    with pytest.raises(VocabularyError, match=f"id 1 is {t.vocab_size}, outside the vocabulary"):
        t.decode([0, t.vocab_size])
    with pytest.raises(VocabularyError, match="lone surrogate U\\+D800"):
        t.encode("a\ud800")


def test_encode_refuses_a_character_outside_a_character_vocabulary():
    with pytest.raises(VocabularyError, match=r"character 2 of the text, 'c' \(U\+0063\)"):
        Tokenizer.chars(["a", "b"]).encode("abc")


def test_decode_bytes_cut_inside_a_character():
    ids = Tokenizer.bytes().encode("é")[:1]
    with pytest.raises(VocabularyError, match="not UTF-8"):
        Tokenizer.bytes().decode(ids)
    assert Tokenizer.bytes().decode(ids, errors="replace") == "\ufffd"


def test_parts_built_with_one_tokenizer_json_at_two_paths_merge(tmp_path, bpe, bpe_other, docs):
    copy = tmp_path / "elsewhere" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copy(bpe, copy)
    all_dir = tmp_path / "all"
    corpus.build_corpus([write_jsonl(tmp_path / "a.jsonl", docs[:5])], all_dir / "a",
                        BuildOptions(tokenizer=Tokenizer.from_file(bpe)))
    corpus.build_corpus([write_jsonl(tmp_path / "b.jsonl", docs[5:9])], all_dir / "b",
                        BuildOptions(tokenizer=Tokenizer.from_file(copy)))
    merged = corpus.merge_manifests([all_dir / "a" / "shards.json", all_dir / "b" / "shards.json"],
                                    all_dir / "shards.json")
    assert len(merged.shards) == 2 and merged.tokenizer.path == bpe
    corpus.build_corpus([write_jsonl(tmp_path / "c.jsonl", docs[:5])], all_dir / "c",
                        BuildOptions(tokenizer=Tokenizer.from_file(bpe, boundary_token="")))
    corpus.build_corpus([write_jsonl(tmp_path / "d.jsonl", docs[:5])], all_dir / "d",
                        BuildOptions(tokenizer=Tokenizer.from_file(bpe_other)))
    for other in ("c", "d"):  # another boundary, another tokenizer
        with pytest.raises(CorpusDirectoryError, match="only corpora of one vocabulary merge"):
            corpus.merge_manifests([all_dir / "a" / "shards.json", all_dir / other / "shards.json"],
                                   all_dir / "x.json")
