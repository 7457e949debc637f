"""``pskd encode`` and ``pskd decode`` with any corpus tokenizer: a text file ↔ a tokens text.

The tokens text is that of :func:`pskd_jax.data.encode_file`: decimal ids separated by single
spaces, with a final line feed (an empty text gives an empty file). A text is encoded whole, as one
document (no boundary added), and ids decode whole: a ``tokenizer.json``'s ids for a part of a
text need not be the first ids of the whole. Both write their output atomically.
"""

from __future__ import annotations

import os

from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.data.text import iter_text_blocks
from pskd_jax.data.tokens import read_tokens
from pskd_jax.storage import whole_output


def encode_text_file(text_path: str | os.PathLike, tokenizer: Tokenizer, out_path: str | os.PathLike) -> int:
    """Writes the ids of a UTF-8 text (E9004 naming the line where it is not UTF-8); returns how many."""
    text = b"".join(block for _, block, _ in iter_text_blocks(text_path)).decode("utf-8")
    ids = tokenizer.encode(text)
    with whole_output(os.fspath(out_path)) as out:
        if len(ids):
            out.write(" ".join(map(str, ids.tolist())).encode("ascii") + b"\n")
    return len(ids)


def decode_tokens_file(tokens_path: str | os.PathLike, tokenizer: Tokenizer, out_path: str | os.PathLike
                       ) -> tuple[int, int]:
    """Writes the text of a tokens text (ids below the tokenizer's ``vocab_size``, E9004 else; a
    boundary that is not one of the tokenizer's tokens becomes a line feed); returns the ids read
    and the characters written."""
    ids = read_tokens(tokens_path, bound=tokenizer.vocab_size)
    text = tokenizer.decode(ids)
    with whole_output(os.fspath(out_path)) as out:
        out.write(text.encode("utf-8"))
    return len(ids), len(text)


__all__ = ["decode_tokens_file", "encode_text_file"]
