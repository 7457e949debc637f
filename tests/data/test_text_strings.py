"""The in-memory text API: char_vocab, encode and decode of strings, and their agreement with the
file functions (chars, encode and decode of files)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pskd_jax
from pskd_jax import data
from pskd_jax.errors import PskdError

MIXED = "Héllo, wörld!\r\n\tçà et là: 日本語 😀🎉\n\x00\ufeffß∑ — fin\n"


def test_the_string_functions_are_exported_at_the_top_and_in_data_the_file_functions_in_data():
    for name in ("char_vocab", "encode", "decode"):
        assert getattr(pskd_jax, name) is getattr(data, name)
    for name in ("char_vocab_file", "encode_file", "decode_file"):
        assert callable(getattr(data, name)) and not hasattr(pskd_jax, name)


def test_char_vocab_of_a_string_is_its_distinct_characters_sorted_by_code_point():
    assert pskd_jax.char_vocab("bébé\n") == ["\n", "b", "é"]
    assert pskd_jax.char_vocab(MIXED) == sorted(set(MIXED))
    assert pskd_jax.char_vocab("") == []


def test_encode_and_decode_round_trip_a_string():
    vocab = pskd_jax.char_vocab(MIXED)
    ids = pskd_jax.encode(MIXED, vocab)
    assert ids.dtype == np.uint8 and len(ids) == len(MIXED)
    assert [vocab[i] for i in ids.tolist()] == list(MIXED)
    assert pskd_jax.decode(ids, vocab) == MIXED
    assert pskd_jax.decode(ids.tolist(), vocab) == MIXED  # a plain list of ints too


def test_encode_ids_take_the_dtype_an_idx_leaf_of_the_vocabulary_stores():
    vocab = [chr(0x4E00 + i) for i in range(300)]
    ids = pskd_jax.encode("".join(reversed(vocab)), vocab)
    assert ids.dtype == np.uint16
    assert ids.tolist() == list(range(299, -1, -1))


def test_the_string_functions_agree_with_the_file_functions(tmp_path):
    source = tmp_path / "t.txt"
    source.write_bytes(MIXED.encode("utf-8"))
    vocab, count = data.char_vocab_file(source)
    assert vocab == data.char_vocab(MIXED) and count == len(MIXED)
    data.write_vocab(tmp_path / "v.json", vocab)
    data.encode_file(source, tmp_path / "v.json", tmp_path / "t.tok")
    from_file = [int(t) for t in (tmp_path / "t.tok").read_text().split()]
    assert data.encode(MIXED, tmp_path / "v.json").tolist() == from_file  # a vocabulary file works too
    assert data.decode(np.array(from_file), str(tmp_path / "v.json")) == MIXED


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200))
def test_any_text_round_trips(text):
    vocab = data.char_vocab(text)
    assert data.decode(data.encode(text, vocab), vocab) == text


def test_decode_accepts_tokens_of_several_characters():
    assert data.decode(np.array([0, 1, 0], np.uint32), ["ab", "é😀"]) == "abé😀ab"
    assert data.decode([], ["a"]) == ""


def test_a_character_outside_the_vocabulary_is_named_with_its_code_point_and_place():
    with pytest.raises(PskdError) as caught:
        data.encode("ab\ncaé", ["a", "b", "c", "\n"])
    assert caught.value.code == "E9011"
    message = caught.value.message
    assert "'é' (U+00E9)" in message and "character 5" in message and "line 2" in message
    assert "the vocabulary vocabulary" not in message


def test_an_unknown_character_names_the_vocabulary_file(tmp_path):
    vocab_file = tmp_path / "civil_vocab.json"
    data.write_vocab(vocab_file, ["a"])
    with pytest.raises(PskdError, match="is not in the vocabulary .*civil_vocab.json"):
        data.encode("ab", vocab_file)


def test_encode_refuses_a_sub_word_vocabulary():
    with pytest.raises(PskdError) as caught:
        data.encode("ab", ["ab"])
    assert caught.value.code == "E9011" and "longest-match" in caught.value.message


def test_decode_refuses_ids_outside_the_vocabulary_naming_position_and_value():
    for ids, shown in (([0, 3], "token id 1 is 3"), (np.array([0, -1]), "token id 1 is -1")):
        with pytest.raises(PskdError) as caught:
            data.decode(ids, ["a", "b"])
        assert caught.value.code == "E9004" and shown in caught.value.message
    with pytest.raises(PskdError, match="E9004"):
        data.decode(np.array([0.0, 1.0]), ["a", "b"])


def test_a_lone_surrogate_is_refused_not_encoded():
    with pytest.raises(PskdError) as caught:
        data.char_vocab("a\ud800")
    assert caught.value.code == "E9004" and "U+D800" in caught.value.message
    with pytest.raises(PskdError, match="E9004"):
        data.encode("\udfff", ["a"])


def test_a_text_that_is_not_a_string_is_refused():
    with pytest.raises(PskdError, match="E9004"):
        data.char_vocab(b"bytes")
