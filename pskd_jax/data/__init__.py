"""The data kernels behind the data commands: text and tokens, windows, pack, info, diff, export.

They stream (a file is read in blocks, each turned into numpy arrays at once) and never import JAX.
A text output (a vocabulary, tokens, decoded text, export's JSON) given as :data:`STANDARD_STREAM`
(``-``) goes to the standard output. What each command does: ``docs/commands.md``; the rules it
keeps: ``docs/reference-rules.md``.
"""

from pskd_jax._os.names import STANDARD_STREAM
from pskd_jax.data.distance import Distance, diff
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

__all__ = [
    "STANDARD_STREAM",
    "Distance",
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
