"""The data kernels behind the data commands: text and tokens, windows, pack, info, diff, export.

Everything here streams (a file is read in blocks and turned into numpy arrays a block at a time)
and never imports JAX. The text outputs (a vocabulary, tokens, decoded text, export's JSON) take
``STANDARD_STREAM`` (``-``) for the standard output.
"""

from pskd_jax._os.names import STANDARD_STREAM
from pskd_jax.data.distance import Distance, diff
from pskd_jax.data.export import export_json, non_finite_text
from pskd_jax.data.info import info_lines, iter_info_lines
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
from pskd_jax.data.tokens import iter_tokens, read_tokens
from pskd_jax.data.windows import lm_window_count, lm_windows_file, window_type

__all__ = [
    "Distance",
    "STANDARD_STREAM",
    "char_vocab",
    "char_vocab_file",
    "decode",
    "decode_file",
    "diff",
    "encode",
    "encode_file",
    "export_json",
    "info_lines",
    "iter_info_lines",
    "iter_tokens",
    "lm_window_count",
    "lm_windows_file",
    "non_finite_text",
    "pack_file",
    "parse_encodings",
    "read_tokens",
    "read_vocab",
    "window_type",
    "write_vocab",
]
