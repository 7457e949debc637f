"""``lm-windows``: a token stream → language-modelling windows in a ``.psk.d`` file.

Window k is ``(tokens[kS : kS + T], tokens[kS + 1 : kS + T + 1])`` of type
``(idx[V][seq: T], idx[V][seq: T])``: the input and its target shifted by one, cut once here so
that training never shifts. The stride S defaults to T (windows that do not overlap).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from pskd_jax.container import Writer
from pskd_jax.errors import BAD_USAGE, PskdError
from pskd_jax.text import iter_tokens, lm_window_count, lm_window_stream


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
            raise PskdError(BAD_USAGE, f"--{name} must be at least 1, got {value}")
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


__all__ = ["WindowsResult", "lm_windows_file", "lm_window_count", "window_type"]
