"""The boundary id never comes out of a document's text (issue 20, class 6), whatever the
tokenizer: a token that a text can be encoded to is refused as the boundary when named and passed
over by default, and a document that reaches the boundary anyway is bad input, never a corpus cut
in two. Every kind is built from documents that quote the usual end-of-text strings, and the
corpus verifies with one document per text."""

from __future__ import annotations

import json

import pytest

from pskd_jax import corpus
from pskd_jax.corpus import Tokenizer
from pskd_jax.corpus import tokenizer as tokenizer_module
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import CorpusInputError, VocabularyError

from .bpe import library_ids, train_bpe, unigram, word_level

QUOTED = ["a </s> b", "</s>", "a</s>b", "<|endoftext|> and [SEP]", "a b a", "</s></s>", "<eos>"]


def built(tmp_path, tokenizer: Tokenizer, texts: list[str] = QUOTED, **options) -> corpus.VerifyResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    corpus.build_corpus([source], tmp_path / "c", BuildOptions(tokenizer=tokenizer, durable=False, **options))
    return corpus.verify_corpus(tmp_path / "c" / "shards.json")


def ids_between_boundaries(result: corpus.VerifyResult) -> list[list[int]]:
    from pskd_jax.format import Reader

    m = result.manifest
    tokens = Reader(m.shard_path(0)).leaves()[0].tolist()
    documents, current = [], []
    for token in tokens:
        if token == m.boundary:
            documents.append(current)
            current = []
        else:
            current.append(token)
    assert current == []
    return documents


# --------------------------------------------------------------------------------------------
# Tokenizers whose model reaches the string


@pytest.fixture
def words(tmp_path) -> str:
    """WordLevel, "</s>" an ordinary word of it: the text "</s>" is encoded to its id."""
    pytest.importorskip("tokenizers")
    return word_level(tmp_path / "words.json", {"[UNK]": 0, "</s>": 1, "a": 2, "b": 3})


@pytest.fixture
def words_special(tmp_path) -> str:
    """WordLevel with "</s>" a special token *and* a word of its model: still reached by the text."""
    pytest.importorskip("tokenizers")
    return word_level(tmp_path / "words-special.json", {"[UNK]": 0, "</s>": 1, "a": 2, "b": 3}, special=("</s>",))


@pytest.fixture
def words_apart(tmp_path) -> str:
    """WordLevel with "</s>" a special token its model does not know: the text "</s>" is [UNK]."""
    pytest.importorskip("tokenizers")
    return word_level(tmp_path / "words-apart.json", {"[UNK]": 0, "a": 1, "b": 2}, special=("</s>",))


@pytest.fixture
def pieces(tmp_path) -> str:
    """Unigram (SentencePiece's kind) whose pieces hold "</s>", which is also its special token."""
    pytest.importorskip("tokenizers")
    return unigram(tmp_path / "unigram.json", ["</s>", "▁", "a", "b", "<", "/", "s", ">", "|", "e", "o", "[", "]"],
                   special=("</s>",))


@pytest.mark.parametrize("fixture", ["words", "words_special", "pieces"])
def test_a_boundary_the_text_reaches_is_passed_over_by_default(request, tmp_path, fixture):
    t = Tokenizer.from_file(request.getfixturevalue(fixture))
    assert t.boundary_token is None and t.boundary == t.size  # an id past the vocabulary instead
    result = built(tmp_path, t)
    assert result.manifest.documents == len(QUOTED)
    assert len(ids_between_boundaries(result)) == len(QUOTED)


@pytest.mark.parametrize("fixture, why", [("words", "an ordinary entry of the vocabulary"),
                                          ("words_special", "the tokenizer's model encodes the text '</s>'"),
                                          ("pieces", "the tokenizer's model encodes the text '</s>'")])
def test_a_named_boundary_the_text_reaches_is_refused_naming_why(request, fixture, why):
    path = request.getfixturevalue(fixture)
    with pytest.raises(VocabularyError, match=r"^E9011: .*" + why.replace("(", r"\(") + ".*cannot be the boundary"):
        Tokenizer.from_file(path, boundary_token="</s>")


def test_an_ordinary_word_named_as_the_boundary_is_refused(words, pieces):
    for path in (words, pieces):
        with pytest.raises(VocabularyError, match="'a' .* is an ordinary entry of the vocabulary"):
            Tokenizer.from_file(path, boundary_token="a")


def test_a_special_token_the_model_does_not_know_is_the_boundary(tmp_path, words_apart):
    t = Tokenizer.from_file(words_apart)
    assert (t.boundary_token, t.boundary, t.vocab_size) == ("</s>", 3, 4)
    result = built(tmp_path, t)
    assert result.manifest.documents == len(QUOTED)
    assert ids_between_boundaries(result)[1] == [0]  # the text "</s>" is an unknown word, not the boundary


@pytest.mark.parametrize("fixture", ["words", "pieces"])
def test_a_document_that_reaches_the_boundary_anyway_is_bad_input(request, tmp_path, monkeypatch, fixture):
    """The guard behind the tokenizer's check: were a reached boundary let through, the document
    that reaches it is E9015 naming its line (or left out with skip_bad), never cut in two."""
    monkeypatch.setattr(tokenizer_module, "boundary_problem", lambda *args: None)
    path = request.getfixturevalue(fixture)
    t = Tokenizer.from_file(path, boundary_token="</s>")
    with pytest.raises(CorpusInputError, match=r"in\.jsonl:1: the text encodes to the boundary token '</s>'"):
        built(tmp_path, t)
    result = built(tmp_path / "skip", t, skip_bad=True)
    reached = [text for text, ids in zip(QUOTED, library_ids(path, QUOTED)) if t.boundary in ids]
    assert "</s>" in reached and "a b a" not in reached
    assert result.manifest.shards[0].skipped == len(reached)
    assert result.manifest.documents == len(QUOTED) - len(reached)


# --------------------------------------------------------------------------------------------
# Tokenizers whose boundary no text reaches


def test_byte_level_bpe_keeps_its_end_of_text_token_and_documents_whole(tmp_path):
    pytest.importorskip("tokenizers")
    t = Tokenizer.from_file(train_bpe(tmp_path / "bpe.json", vocab_size=300))
    assert t.boundary_token == "<|endoftext|>"
    result = built(tmp_path, t, QUOTED + ["x<|endoftext|>y" * 3])
    assert result.manifest.documents == len(QUOTED) + 1


@pytest.mark.parametrize("kind", ["bytes", "chars"])
def test_bytes_and_chars_never_reach_their_boundary(tmp_path, kind):
    texts = QUOTED + ["\u0100 is one past the bytes", "\x00\x01"]
    t = Tokenizer.bytes() if kind == "bytes" else Tokenizer.chars(sorted(set("".join(texts))))
    result = built(tmp_path, t, texts)
    assert result.manifest.documents == len(texts) and len(ids_between_boundaries(result)) == len(texts)
