"""Language-model windows (pskd_jax.data.windows): counts, chunks, records and streams equal to
slicing the tokens."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax.data import tokens as TOK
from pskd_jax.data import windows as W
from tests.helpers import raises

from .files import write


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


@pytest.mark.parametrize("stride", [2**60, 2**63, 10**30])
def test_a_stride_beyond_the_tokens_gives_the_first_window(stride):
    # One window, whatever the stride (--stride 10^30): never an offset numpy cannot hold.
    tokens = np.arange(13, dtype=np.uint64)
    (records,) = W.lm_window_records(tokens, 4, stride)
    assert records.tolist() == [[[0, 1, 2, 3], [1, 2, 3, 4]]]
    assert np.array_equal(np.concatenate(list(W.lm_window_stream([tokens[:3], tokens[3:]], 4, stride))), records)
    (inputs, targets), = W.lm_window_chunks(tokens, 4, stride)
    assert inputs.tolist() == [[0, 1, 2, 3]] and targets.tolist() == [[1, 2, 3, 4]]
