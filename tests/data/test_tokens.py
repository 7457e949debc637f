"""Tokens text files (pskd_jax.data.tokens): whitespace, widths, bounds and bad tokens, read whole or
streamed in blocks."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax.data import text as T
from pskd_jax.data import tokens as TOK
from tests.helpers import raises

from .files import write


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
