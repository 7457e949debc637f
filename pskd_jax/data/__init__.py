"""The data kernels behind the data commands: text and tokens, windows, pack, info, diff, export.

They stream (a file is read in blocks, each turned into numpy arrays at once) and never import JAX.
A text output (a vocabulary, tokens, decoded text, export's JSON) given as :data:`STANDARD_STREAM`
(``-``) goes to the standard output. What each command does: ``docs/commands.md``; the rules it
keeps: ``docs/reference-rules.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pskd_jax._os.lazy import lazy_names

if TYPE_CHECKING:
    from pskd_jax._os.names import STANDARD_STREAM
    from pskd_jax.data.distance import Distance, Exact, diff
    from pskd_jax.data.export import export_json
    from pskd_jax.data.info import info_lines
    from pskd_jax.data.pack import pack_file, parse_encodings
    from pskd_jax.data.text import (
        char_vocab,
        char_vocab_file,
        decode,
        decode_file,
        encode,
        encode_file,
        read_vocab,
        write_vocab,
    )
    from pskd_jax.data.tokens import read_tokens
    from pskd_jax.data.windows import lm_windows_file, window_type
else:  # each name imported from its module when first asked for (see pskd_jax._os.lazy)
    __getattr__, __dir__ = lazy_names(__name__, {
        "pskd_jax._os.names": ("STANDARD_STREAM",),
        "pskd_jax.data.distance": ("Distance", "Exact", "diff"),
        "pskd_jax.data.export": ("export_json",),
        "pskd_jax.data.info": ("info_lines",),
        "pskd_jax.data.pack": ("pack_file", "parse_encodings"),
        "pskd_jax.data.text": (
            "char_vocab",
            "char_vocab_file",
            "decode",
            "decode_file",
            "encode",
            "encode_file",
            "read_vocab",
            "write_vocab",
        ),
        "pskd_jax.data.tokens": ("read_tokens",),
        "pskd_jax.data.windows": ("lm_windows_file", "window_type"),
    })

__all__ = [
    "STANDARD_STREAM",
    "Distance",
    "Exact",
    "char_vocab",
    "char_vocab_file",
    "decode",
    "decode_file",
    "diff",
    "encode",
    "encode_file",
    "export_json",
    "info_lines",
    "lm_windows_file",
    "pack_file",
    "parse_encodings",
    "read_tokens",
    "read_vocab",
    "window_type",
    "write_vocab",
]
