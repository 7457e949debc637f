"""Characters, vocabularies, encode and decode (pskd_jax.data.text): exact round trips across chunk
boundaries, and refusals that name the file, line and character."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.data import text as T
from pskd_jax.data import tokens as TOK
from tests.helpers import raises, run_python

from .files import write

# Characters of every UTF-8 length, and the ones that tend to go wrong: CR LF, tab, NUL, BOM.
MIXED = "Héllo, wörld!\r\n\tçà et là: 日本語テキスト 😀🎉\n\x00\ufeffß∑ — fin\n"


CHUNK_SIZES = [1, 2, 3, 5, 7, 64, T.CHUNK_SIZE]


def round_trip(tmp_path, text: str, chunk_size: int = T.CHUNK_SIZE) -> tuple[list[str], bytes]:
    """text → vocab file → encode → decode; returns the vocabulary and the tokens file."""
    src = write(tmp_path / "in.txt", text.encode("utf-8"))
    vocab, count = T.char_vocab_file(src, chunk_size=chunk_size)
    assert vocab == sorted(set(text)) and count == len(text)
    T.write_vocab(tmp_path / "v.json", vocab)
    assert T.read_vocab(tmp_path / "v.json") == vocab
    n = T.encode_file(src, str(tmp_path / "v.json"), tmp_path / "t.tok", chunk_size=chunk_size)
    assert n == len(text)
    m = T.decode_file(tmp_path / "t.tok", vocab, tmp_path / "out.txt", chunk_size=chunk_size)
    assert m == len(text)
    assert (tmp_path / "out.txt").read_bytes() == text.encode("utf-8")
    return vocab, (tmp_path / "t.tok").read_bytes()


def only_files(directory) -> list[str]:
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------------------------------------
# encode / decode
# ---------------------------------------------------------------------------------------------


def test_tiny_text_exact_output(tmp_path):
    src = write(tmp_path / "t.txt", b"abba\nab a\n")
    vocab, count = T.char_vocab_file(src)
    assert vocab == ["\n", " ", "a", "b"] and count == 10
    assert T.encode_file(src, vocab, tmp_path / "t.tok") == 10
    assert (tmp_path / "t.tok").read_bytes() == b"2 3 3 2 0 2 3 1 2 0\n"
    assert TOK.read_tokens(tmp_path / "t.tok", bound=4).tolist() == [2, 3, 3, 2, 0, 2, 3, 1, 2, 0]


def test_vocab_file_is_plain_utf8_json(tmp_path):
    T.write_vocab(tmp_path / "v.json", ["\n", "é", "😀"])
    data = (tmp_path / "v.json").read_bytes()
    assert data == '["\\n", "é", "😀"]\n'.encode()
    assert T.read_vocab(str(tmp_path / "v.json")) == ["\n", "é", "😀"]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_round_trip_non_ascii_across_chunk_boundaries(tmp_path, chunk_size):
    vocab, tokens = round_trip(tmp_path, MIXED * 3, chunk_size)
    assert tokens.endswith(b"\n") and b"  " not in tokens and not tokens.startswith(b" ")
    assert TOK.read_tokens(tmp_path / "t.tok").tolist() == [vocab.index(c) for c in MIXED * 3]


def test_round_trip_multidigit_indices(tmp_path):
    # More than 1000 distinct characters: indices of 1 to 4 digits, and the wide encode table.
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 1500)) + "abc\n" + "".join(chr(c) for c in range(32, 127))
    text = text * 2 + "a" * 5000
    vocab, tokens = round_trip(tmp_path, text, 1000)
    assert len(vocab) > 1000
    assert tokens == (" ".join(str(vocab.index(c)) for c in text) + "\n").encode()


def test_round_trip_emoji_only_and_single_character(tmp_path):
    round_trip(tmp_path, "😀" * 1000, 3)
    round_trip(tmp_path, "x", 1)


def test_empty_text(tmp_path):
    src = write(tmp_path / "e.txt", b"")
    assert T.char_vocab_file(src) == ([], 0)
    assert T.encode_file(src, [], tmp_path / "e.tok") == 0
    assert (tmp_path / "e.tok").read_bytes() == b""
    assert TOK.read_tokens(tmp_path / "e.tok").tolist() == []
    assert T.decode_file(tmp_path / "e.tok", ["a"], tmp_path / "e.out") == 0
    assert (tmp_path / "e.out").read_bytes() == b""


@pytest.mark.slow
@settings(max_examples=150, deadline=None, database=None)  # no .hypothesis in the working directory
@given(text=st.text(min_size=0, max_size=300), chunk_size=st.integers(1, 17))
def test_round_trip_property(tmp_path_factory, text, chunk_size):
    tmp_path = tmp_path_factory.mktemp("prop")
    if text:
        vocab, tokens = round_trip(tmp_path, text, chunk_size)
        expected = [vocab.index(c) for c in text]
        assert TOK.read_tokens(tmp_path / "t.tok", bound=len(vocab), chunk_size=chunk_size).tolist() == expected
    else:
        src = write(tmp_path / "in.txt", b"")
        assert T.char_vocab_file(src, chunk_size=chunk_size) == ([], 0)


def test_encode_with_a_larger_vocabulary(tmp_path):
    src = write(tmp_path / "t.txt", b"b\nb")
    vocab = ["\n", "a", "b", "é", "z"]
    assert T.encode_file(src, vocab, tmp_path / "t.tok") == 3
    assert (tmp_path / "t.tok").read_bytes() == b"2 0 2\n"


@pytest.mark.parametrize("chunk_size", [1, 4, T.CHUNK_SIZE])
@pytest.mark.parametrize(
    "text, vocab, line, shown",
    [
        ("ab\nba\nbé\n", ["\n", "a", "b"], 3, "'é' (U+00E9)"),  # non-ASCII block
        ("ab\nb\n\nbq", ["\n", "a", "b"], 4, "'q' (U+0071)"),  # ASCII block
        ("a😀", ["a"], 1, "'😀' (U+1F600)"),  # beyond the table's last code point
        ("\n\n\x00", ["\n"], 3, "'\\x00' (U+0000)"),
    ],
)
def test_unknown_character_names_line_and_code_point(tmp_path, chunk_size, text, vocab, line, shown):
    src = write(tmp_path / "t.txt", text.encode())
    with raises("E9011", f"t.txt:{line}: character {shown} is not in the vocabulary"):
        T.encode_file(src, vocab, tmp_path / "t.tok", chunk_size=chunk_size)
    assert only_files(tmp_path) == ["t.txt"]  # no output, no temporary file


def test_unknown_character_with_wide_vocabulary(tmp_path):
    vocab = [chr(c) for c in range(0x4E00, 0x4E00 + 1200)] + ["\n"]
    src = write(tmp_path / "t.txt", ("\n" + chr(0x4E00 + 1100) + "\n" + chr(0x4E00) + "Z").encode())
    with raises("E9011", "t.txt:3: character 'Z' (U+005A)"):
        T.encode_file(src, vocab, tmp_path / "t.tok")


def test_failed_encode_leaves_existing_destination_untouched(tmp_path):
    src = write(tmp_path / "t.txt", b"abc")
    write(tmp_path / "t.tok", b"old")
    with raises("E9011", "'c' (U+0063)"):
        T.encode_file(src, ["a", "b"], tmp_path / "t.tok")
    assert (tmp_path / "t.tok").read_bytes() == b"old"
    assert only_files(tmp_path) == ["t.tok", "t.txt"]


def test_encode_refuses_multicharacter_tokens(tmp_path):
    src = write(tmp_path / "t.txt", b"ab")
    vocab = write(tmp_path / "v.json", json.dumps(["a", "ab", "b"]).encode())
    with raises("E9011", "v.json", "token 1 'ab' has 2 characters", "sub-word"):
        T.encode_file(src, vocab, tmp_path / "t.tok")
    assert not (tmp_path / "t.tok").exists()


def test_decode_multicharacter_and_nul_tokens(tmp_path):
    # Sub-word tokens, a NUL token and a long token take decode's general path.
    tok = write(tmp_path / "t.tok", b"0 1 2\n3 0\t1")
    vocab = ["ab", "\x00", "é😀", "a much longer token"]
    assert T.decode_file(tok, vocab, tmp_path / "out.txt", chunk_size=3) == 6
    assert (tmp_path / "out.txt").read_bytes() == "ab\x00é😀a much longer tokenab\x00".encode()


def test_empty_vocabulary_admits_no_token(tmp_path):
    assert TOK.read_tokens(write(tmp_path / "e.tok", b" \n"), bound=0).tolist() == []
    tok = write(tmp_path / "t.tok", b"\n\n0\n")
    with raises("E9004", "t.tok:3: token 0 is not below the vocabulary size 0"):
        T.decode_file(tok, [], tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()


def test_decode_index_out_of_range(tmp_path):
    tok = write(tmp_path / "t.tok", b"0 1\n2\n3 1\n")
    with raises("E9004", "t.tok:3: token 3 is not below the vocabulary size 3"):
        T.decode_file(tok, ["a", "b", "c"], tmp_path / "out.txt")
    assert only_files(tmp_path) == ["t.tok"]


# ---------------------------------------------------------------------------------------------
# invalid UTF-8
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 2, 3, T.CHUNK_SIZE])
@pytest.mark.parametrize(
    "data, line, offset",
    [
        (b"ab\ncd\xff\n", 2, 5),  # a byte that never starts a character
        (b"a\n\nb\x80", 3, 4),  # a lone continuation byte
        (b"\xc3\xa9\xc3", 1, 2),  # a sequence cut by the end of the file
        (b"x\n\xe6\x97z", 2, 2),  # a sequence cut by an ASCII byte
        (b"\xc0\xaf", 1, 0),  # an overlong encoding
        (b"\xed\xa0\x80", 1, 0),  # a surrogate
    ],
)
def test_invalid_utf8(tmp_path, chunk_size, data, line, offset):
    src = write(tmp_path / "t.txt", data)
    with raises("E9004", f"t.txt:{line}: invalid UTF-8 at byte {offset}"):
        T.char_vocab_file(src, chunk_size=chunk_size)
    with raises("E9004", f"t.txt:{line}: invalid UTF-8 at byte {offset}"):
        T.encode_file(src, [chr(c) for c in range(256)], tmp_path / "t.tok", chunk_size=chunk_size)
    assert only_files(tmp_path) == ["t.txt"]


def test_missing_text_file(tmp_path):
    with raises("E9003", "nope.txt", "cannot read"):
        T.char_vocab_file(tmp_path / "nope.txt")
    with raises("E9003", "nope.txt"):
        T.encode_file(tmp_path / "nope.txt", ["a"], tmp_path / "t.tok")
    assert only_files(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# vocabularies
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, fragments",
    [
        (b'["a", "b"', ["v.json:1: not JSON"]),
        (b'\n\n["a",, "b"]', ["v.json:3: not JSON"]),
        (b'{"a": 0}', ["expected a JSON array of strings, got an object"]),
        (b'"abc"', ["got a string"]),
        (b'["a", 5]', ["token 1 is a number 5, not a string"]),
        (b'["a", null]', ["token 1 is null"]),
        (b'["a", ["b"]]', ["token 1 is a list"]),
        (b'["a", ""]', ["token 1 is the empty string"]),
        (b'["a", "b", "a"]', ["token 2 'a' repeats token 0"]),
        (b'["a", "\\ud800"]', ["token 1", "lone surrogate"]),
        (b'["\xff"]', ["not UTF-8 at byte 2"]),
    ],
)
def test_malformed_vocab(tmp_path, data, fragments):
    path = write(tmp_path / "v.json", data)
    with raises("E9011", "v.json", *fragments):
        T.read_vocab(path)
    src = write(tmp_path / "t.txt", b"a")
    with raises("E9011", "v.json"):
        T.encode_file(src, path, tmp_path / "t.tok")
    assert not (tmp_path / "t.tok").exists()


def test_missing_vocab_file(tmp_path):
    with raises("E9003", "absent.json"):
        T.read_vocab(tmp_path / "absent.json")


def test_vocab_list_is_checked(tmp_path):
    src = write(tmp_path / "t.txt", b"a")
    with raises("E9011", "token 1 'a' repeats token 0"):
        T.encode_file(src, ["a", "a"], tmp_path / "t.tok")
    with raises("E9011", "token 0 is the empty string"):
        T.write_vocab(tmp_path / "v.json", [""])
    assert only_files(tmp_path) == ["t.txt"]


@pytest.mark.subprocess
def test_text_module_does_not_import_jax():
    code = "import sys, pskd_jax.data; sys.exit('jax' in sys.modules)"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
