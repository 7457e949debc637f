"""Language-model windows over a token stream (``pskd lm-windows``; the rule is
``docs/reference-rules.md``, "Windows").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from pskd_jax.data.tokens import iter_tokens
from pskd_jax.errors import UsageError
from pskd_jax.format.writer import Writer


def _check_window(seq: int, stride: int) -> None:
    """Refuses a sequence length or a stride below 1."""
    if seq < 1 or stride < 1:
        raise UsageError(f"the sequence length and the stride must be at least 1, got seq={seq} stride={stride}")


def lm_window_count(n_tokens: int, seq: int, stride: int) -> int:
    """How many windows of ``seq`` tokens plus a shifted target fit in ``n_tokens`` at ``stride``.

    >>> lm_window_count(200, 8, 8), lm_window_count(1182121, 256, 256), lm_window_count(8, 8, 1)
    (24, 4617, 0)
    """
    _check_window(seq, stride)
    return (n_tokens - seq - 1) // stride + 1 if n_tokens >= seq + 1 else 0


def _default_chunk(seq: int, itemsize: int) -> int:
    """Windows per chunk so that a chunk's array is about a megabyte."""
    return max(1, (1 << 20) // (seq * itemsize))


def lm_window_chunks(
    tokens: np.ndarray, seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields ``(inputs, targets)``, each ``(k, seq)`` and contiguous, for consecutive windows:
    window ``w`` is ``tokens[w*stride : w*stride + seq]`` and its target the same shifted by one.

    >>> [(i.tolist(), t.tolist()) for i, t in lm_window_chunks(np.arange(7), 3, 2)]
    [([[0, 1, 2], [2, 3, 4]], [[1, 2, 3], [3, 4, 5]])]
    """
    tokens = np.asarray(tokens)
    count = lm_window_count(len(tokens), seq, stride)
    if count == 0:
        return
    windows = sliding_window_view(tokens, seq + 1)[::stride][:count]  # a view: nothing copied yet
    step = chunk_windows or _default_chunk(seq, tokens.itemsize)
    for first in range(0, count, step):
        block = windows[first : first + step]
        yield np.ascontiguousarray(block[:, :seq]), np.ascontiguousarray(block[:, 1:])


def lm_window_records(
    tokens: np.ndarray, seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[np.ndarray]:
    """Yields ``(k, 2, seq)`` contiguous arrays: each window's input then its target, which is the
    byte order of ``(idx[V][seq: T], idx[V][seq: T])`` samples, so a chunk can be written as is.

    >>> [r.tolist() for r in lm_window_records(np.arange(5), 2, 2)]
    [[[[0, 1], [1, 2]], [[2, 3], [3, 4]]]]
    """
    tokens = np.ascontiguousarray(tokens)
    count = lm_window_count(len(tokens), seq, stride)
    if count == 0:
        return
    item = tokens.itemsize
    # A stride beyond the tokens leaves one window, where it moves nothing: capped, it stays an
    # offset numpy holds (a C long) however large it was given (--stride 10^30).
    step_bytes = min(stride, len(tokens)) * item
    records = as_strided(tokens, shape=(count, 2, seq), strides=(step_bytes, item, item), writeable=False)
    step = chunk_windows or _default_chunk(2 * seq, item)
    for first in range(0, count, step):
        yield records[first : first + step].copy()


def lm_window_stream(
    blocks: Iterable[np.ndarray], seq: int, stride: int, *, chunk_windows: int | None = None
) -> Iterator[np.ndarray]:
    """:func:`lm_window_records` over the concatenation of ``blocks`` (such as :func:`iter_tokens`
    yields), holding only about one chunk of tokens instead of the whole stream.

    >>> blocks = [np.arange(0, 3), np.arange(3, 4), np.arange(4, 9)]
    >>> [r.tolist() for r in lm_window_stream(blocks, 2, 3)]
    [[[[0, 1], [1, 2]], [[3, 4], [4, 5]], [[6, 7], [7, 8]]]]
    """
    _check_window(seq, stride)
    parts: list[np.ndarray] = []  # tokens from the next window's start on
    held = 0  # tokens in parts
    skip = 0  # tokens still to pass over before the next window's start (when stride > seq + 1)
    step = chunk_windows
    for block in blocks:
        block = np.asarray(block)
        if skip:
            dropped = min(skip, len(block))
            block, skip = block[dropped:], skip - dropped
        if not len(block):
            continue
        parts.append(block)
        held += len(block)
        step = step or _default_chunk(2 * seq, block.itemsize)
        if lm_window_count(held, seq, stride) >= step:  # enough for a full chunk: emit what is there
            tokens = np.concatenate(parts)
            yield from lm_window_records(tokens, seq, stride, chunk_windows=step)
            parts, held, skip = _window_rest(tokens, seq, stride)
    if parts:
        yield from lm_window_records(np.concatenate(parts), seq, stride, chunk_windows=step)


def _window_rest(tokens: np.ndarray, seq: int, stride: int) -> tuple[list[np.ndarray], int, int]:
    """What stays after every complete window of ``tokens`` was emitted: the tokens from the next
    window's start on, and how many tokens to pass over first when that start lies beyond them."""
    start = lm_window_count(len(tokens), seq, stride) * stride
    if start >= len(tokens):
        return [], 0, start - len(tokens)
    rest = tokens[start:].copy()  # a copy, so that the emitted tokens can be freed
    return [rest], len(rest), 0


@dataclasses.dataclass(frozen=True)
class WindowsResult:
    path: str
    windows: int
    tokens: int
    type_text: str


def window_type(vocab: int, seq: int) -> str:
    """The sample type of windows over a vocabulary of ``vocab`` tokens, ``seq`` long."""
    return f"(idx[{vocab}][seq: {seq}], idx[{vocab}][seq: {seq}])"


def lm_windows_file(tokens_path: str, output: str, *, vocab: int, seq: int, stride: int | None = None
                    ) -> WindowsResult:
    """Cuts the whitespace-separated tokens of ``tokens_path`` into windows written to ``output``."""
    stride = seq if stride is None else stride
    for name, value in (("vocab", vocab), ("seq", seq), ("stride", stride)):
        if value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    counted = _Counted(iter_tokens(tokens_path, bound=vocab))
    with Writer(output, window_type(vocab, seq)) as writer:
        # Streamed: memory is a chunk of tokens and of windows, whatever the file's size.
        for records in lm_window_stream(counted, seq, stride):
            writer.append((records[:, 0], records[:, 1]))
    return WindowsResult(output, writer.count, counted.total, writer.type_text)


class _Counted:
    """Passes blocks of tokens through, counting them."""

    def __init__(self, blocks: Iterator[np.ndarray]):
        self.blocks = blocks
        self.total = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        for block in self.blocks:
            self.total += len(block)
            yield block


__all__ = [
    "WindowsResult",
    "lm_window_chunks",
    "lm_window_count",
    "lm_window_records",
    "lm_window_stream",
    "lm_windows_file",
    "window_type",
]
