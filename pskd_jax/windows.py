"""``lm-windows``: a token stream → language-modelling windows in a ``.psk.d`` file.

Window k is ``(tokens[kS : kS + T], tokens[kS + 1 : kS + T + 1])`` of type
``(idx[V][seq: T], idx[V][seq: T])``: the input and its target shifted by one, cut once here so
that training never shifts. The stride S defaults to T (windows that do not overlap).
"""

from __future__ import annotations

import dataclasses

from pskd_jax.container import Writer
from pskd_jax.errors import BAD_USAGE, PskdError
from pskd_jax.text import lm_window_chunks, lm_window_count, read_tokens


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
    tokens = read_tokens(tokens_path, bound=vocab)
    type_text = window_type(vocab, seq)
    with Writer(output, type_text) as writer:
        for inputs, targets in lm_window_chunks(tokens, seq, stride):
            writer.append((inputs, targets))
    return WindowsResult(output, writer.count, int(tokens.size), writer.type_text)


__all__ = ["WindowsResult", "lm_windows_file", "lm_window_count", "window_type"]
