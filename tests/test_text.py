"""Tests of pskd_jax.text: vocabularies, encode/decode, token reading, language-model windows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.data import text as T
from pskd_jax.data import tokens as TOK
from pskd_jax.data import windows as W
from pskd_jax.errors import PskdError

# Characters of every UTF-8 length, and the ones that tend to go wrong: CR LF, tab, NUL, BOM.
MIXED = "Héllo, wörld!\r\n\tçà et là: 日本語テキスト 😀🎉\n\x00\ufeffß∑ — fin\n"
CHUNK_SIZES = [1, 2, 3, 5, 7, 64, T.CHUNK_SIZE]


def write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


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


def raises(code: str, *fragments: str):
    """A context manager asserting a PskdError with ``code`` whose message holds every fragment."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(PskdError)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            error = self.info.value
            assert error.code == code, str(error)
            for fragment in fragments:
                assert fragment in error.message, (fragment, error.message)
            return handled

    return Check()


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
    assert data == '["\\n", "é", "😀"]\n'.encode("utf-8")
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
    src = write(tmp_path / "t.txt", "b\nb".encode())
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


# ---------------------------------------------------------------------------------------------
# reading tokens
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 7, T.CHUNK_SIZE])
def test_read_tokens_odd_whitespace(tmp_path, chunk_size):
    path = write(tmp_path / "t.tok", b"   12\t3\n\n\n 0  \r\n7\x0b8\x0c9 100\n\t4")
    got = TOK.read_tokens(path, chunk_size=chunk_size)
    assert got.dtype == np.uint64 and got.tolist() == [12, 3, 0, 7, 8, 9, 100, 4]


@pytest.mark.parametrize("data", [b"", b"\n", b"  \t\n\n "])
def test_read_tokens_no_tokens(tmp_path, data):
    assert TOK.read_tokens(write(tmp_path / "t.tok", data), bound=5).tolist() == []


@pytest.mark.parametrize(
    "bound, dtype",
    [
        (None, np.uint64), (1, np.uint8), (256, np.uint8), (257, np.uint16), (65536, np.uint16),
        (65537, np.uint32), (2**32 + 1, np.uint64),
    ],
)
def test_read_tokens_dtype(tmp_path, bound, dtype):
    got = TOK.read_tokens(write(tmp_path / "t.tok", b"0 0\n"), bound=bound)
    assert got.dtype == dtype and got.tolist() == [0, 0]


def test_read_tokens_every_digit_count(tmp_path):
    values = [0, 9, 10, 99, 100, 12345, 10**8, 99999999, 123456789, 2**32, 2**53 + 1]
    values += [10**k - 1 for k in range(1, 20)] + [10**k for k in range(19)] + [2**64 - 1, 10**19]
    for chunk_size in (5, 64, T.CHUNK_SIZE):
        path = write(tmp_path / "t.tok", " ".join(map(str, values)).encode())
        assert TOK.read_tokens(path, chunk_size=chunk_size).tolist() == values


def test_read_tokens_random_values(tmp_path):
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.integers(0, 100, 5000),
            rng.integers(0, 10**6, 5000),
            rng.integers(0, 2**63, 5000, dtype=np.uint64) * 2 + 1,
        ]
    ).astype(np.uint64)
    rng.shuffle(values)
    seps = rng.choice([" ", "\n", "\t", "  ", "\r\n"], len(values))
    path = write(tmp_path / "t.tok", "".join(f"{v}{s}" for v, s in zip(values.tolist(), seps)).encode())
    assert np.array_equal(TOK.read_tokens(path, chunk_size=4096), values)


def test_read_tokens_leading_zeros(tmp_path):
    path = write(tmp_path / "t.tok", b"007 0000000000000000000000000042 00\n5")
    assert TOK.read_tokens(path).tolist() == [7, 42, 0, 5]
    assert TOK.read_tokens(path, bound=50).tolist() == [7, 42, 0, 5]


@pytest.mark.parametrize("chunk_size", [1, 3, T.CHUNK_SIZE])
@pytest.mark.parametrize(
    "bad, shown",
    [
        (b"-1", "'-1'"),
        (b"+1", "'+1'"),
        (b"1.5", "'1.5'"),
        (b"abc", "'abc'"),
        (b"1e3", "'1e3'"),
        (b"12a", "'12a'"),
        (b"0x1F", "'0x1F'"),
        ("１".encode(), "'１'"),  # a fullwidth digit is not an ASCII digit
        (b"1,2", "'1,2'"),
        (b"\xff7", "'\\\\xff7'"),
    ],
)
def test_read_tokens_bad_token(tmp_path, chunk_size, bad, shown):
    path = write(tmp_path / "t.tok", b"1 2\n3\n\n  4 " + bad + b" 5\n")
    with raises("E9004", f"t.tok:4: {shown} is not a token index"):
        TOK.read_tokens(path, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [1, 8, T.CHUNK_SIZE])
def test_read_tokens_beyond_64_bits(tmp_path, chunk_size):
    path = write(tmp_path / "t.tok", b"1\n18446744073709551615\n18446744073709551616\n")
    with raises("E9004", "t.tok:3: token 18446744073709551616 does not fit in 64 bits"):
        TOK.read_tokens(path, chunk_size=chunk_size)
    path = write(tmp_path / "t.tok", b"1\n\n123456789012345678901234567890")
    with raises("E9004", "t.tok:3: token 123456789012345678901234567890 does not fit"):
        TOK.read_tokens(path, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [1, 4, T.CHUNK_SIZE])
def test_read_tokens_bound(tmp_path, chunk_size):
    path = write(tmp_path / "t.tok", b"91 0\n5\n97 3\n")
    with raises("E9004", "t.tok:3: token 97 is not below the vocabulary size 92"):
        TOK.read_tokens(path, bound=92, chunk_size=chunk_size)
    assert TOK.read_tokens(path, bound=98, chunk_size=chunk_size).tolist() == [91, 0, 5, 97, 3]
    with raises("E9004", "t.tok:1: token 91 is not below the vocabulary size 1"):
        TOK.read_tokens(path, bound=1, chunk_size=chunk_size)
    with raises("E9004", "t.tok:1: token 91 is not below the vocabulary size 12"):
        TOK.read_tokens(write(tmp_path / "t.tok", b"5 91 0123456789012345678901"), bound=12, chunk_size=chunk_size)


def test_read_tokens_first_error_wins(tmp_path):
    path = write(tmp_path / "t.tok", b"1\n300\nx\n")
    with raises("E9004", "t.tok:2: token 300 is not below the vocabulary size 256"):
        TOK.read_tokens(path, bound=256)


def test_read_tokens_bad_usage(tmp_path):
    path = write(tmp_path / "t.tok", b"1")
    for bound in (-1, 2.0, True):
        with raises("E9012", "vocabulary size"):
            TOK.read_tokens(path, bound=bound)
    with raises("E9003", "missing.tok"):
        TOK.read_tokens(tmp_path / "missing.tok")


def test_iter_tokens_streams(tmp_path):
    path = write(tmp_path / "t.tok", (" ".join(str(i % 50) for i in range(1000))).encode())
    blocks = list(TOK.iter_tokens(path, bound=50, chunk_size=64))
    assert len(blocks) > 10 and all(b.dtype == np.uint8 for b in blocks)
    assert np.concatenate(blocks).tolist() == [i % 50 for i in range(1000)]


# ---------------------------------------------------------------------------------------------
# language-model windows
# ---------------------------------------------------------------------------------------------


def test_window_counts():
    assert W.lm_window_count(200, 8, 8) == 24
    assert W.lm_window_count(1182121, 256, 256) == 4617
    assert W.lm_window_count(9, 8, 8) == 1
    assert W.lm_window_count(8, 8, 1) == 0
    assert W.lm_window_count(0, 1, 1) == 0
    assert W.lm_window_count(10, 3, 1) == 7
    with raises("E9012", "seq=0"):
        W.lm_window_count(10, 0, 1)
    with raises("E9012", "stride=0"):
        W.lm_window_count(10, 2, 0)


def check_windows(tokens: np.ndarray, seq: int, stride: int, chunk_windows: int | None) -> int:
    chunks = list(W.lm_window_chunks(tokens, seq, stride, chunk_windows=chunk_windows))
    count = W.lm_window_count(len(tokens), seq, stride)
    if count == 0:
        assert chunks == [] and list(W.lm_window_stream([tokens], seq, stride)) == []
        return 0
    inputs = np.concatenate([i for i, _ in chunks])
    targets = np.concatenate([t for _, t in chunks])
    assert inputs.shape == targets.shape == (count, seq)
    assert inputs.dtype == targets.dtype == tokens.dtype
    assert all(i.flags.c_contiguous and t.flags.c_contiguous for i, t in chunks)
    starts = np.arange(count) * stride
    assert np.array_equal(inputs, tokens[starts[:, None] + np.arange(seq)])
    assert np.array_equal(targets, tokens[starts[:, None] + np.arange(seq) + 1])
    records = np.concatenate(list(W.lm_window_records(tokens, seq, stride, chunk_windows=chunk_windows)))
    assert np.array_equal(records, np.stack([inputs, targets], axis=1))
    for seed in range(3):  # the same windows from the tokens cut into random blocks
        cuts = np.sort(np.random.default_rng(seed).integers(0, len(tokens) + 1, 1 + seed * 5))
        blocks = np.split(tokens, cuts)
        streamed = list(W.lm_window_stream(iter(blocks), seq, stride, chunk_windows=chunk_windows))
        assert np.array_equal(np.concatenate(streamed), records)
        assert all(r.dtype == tokens.dtype and r.flags.c_contiguous for r in streamed)
    return count


def test_windows_of_200_tokens(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 64, 200).astype(np.uint8)
    path = write(tmp_path / "tokens.txt", (" ".join(map(str, tokens.tolist())) + "\n").encode())
    read = TOK.read_tokens(path, bound=64)
    assert np.array_equal(read, tokens)
    assert check_windows(read, 8, 8, None) == 24
    inputs, targets = next(W.lm_window_chunks(read, 8, 8))
    assert inputs[1].tolist() == tokens[8:16].tolist() and targets[1].tolist() == tokens[9:17].tolist()
    assert check_windows(read, 8, 8, 5) == 24
    assert check_windows(read, 8, 1, 7) == 192


def test_windows_of_the_civil_code_figure(tmp_path):
    tokens = (np.arange(1182121, dtype=np.uint64) * 7919 % 92).astype(np.uint8)
    path = tmp_path / "civil_tokens.txt"
    path.write_bytes((" ".join(map(str, tokens.tolist())) + "\n").encode())
    read = TOK.read_tokens(path, bound=92)
    assert read.dtype == np.uint8 and np.array_equal(read, tokens)
    assert check_windows(read, 256, 256, None) == 4617
    assert check_windows(read, 256, 256, 1000) == 4617


@pytest.mark.parametrize(
    "n, seq, stride",
    [(0, 4, 4), (4, 4, 1), (5, 4, 4), (6, 4, 4), (13, 4, 3), (100, 1, 1), (100, 3, 7), (1000, 5, 40)],
)
@pytest.mark.parametrize("chunk_windows", [None, 1, 2, 5])
def test_windows_edges(n, seq, stride, chunk_windows):
    check_windows(np.arange(n, dtype=np.uint16), seq, stride, chunk_windows)


def test_window_stream_from_a_tokens_file(tmp_path):
    tokens = np.random.default_rng(2).integers(0, 300, 5000).astype(np.uint16)
    path = write(tmp_path / "t.tok", (" ".join(map(str, tokens.tolist())) + "\n").encode())
    expected = np.concatenate(list(W.lm_window_records(tokens, 16, 16)))
    for chunk_windows in (None, 3):
        blocks = TOK.iter_tokens(path, bound=300, chunk_size=100)
        got = np.concatenate(list(W.lm_window_stream(blocks, 16, 16, chunk_windows=chunk_windows)))
        assert got.dtype == np.uint16 and np.array_equal(got, expected)


def test_text_module_does_not_import_jax():
    code = "import sys, pskd_jax.data; sys.exit('jax' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert result.returncode == 0
