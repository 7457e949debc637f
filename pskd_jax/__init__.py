"""pskd_jax: exact, fast ``.psk.d`` data and checkpoints for JAX.

The data side (this package's top level) imports numpy and ml_dtypes, never JAX, so the command
line answers at once; JAX enters only in the modules that make device arrays.
"""

from pskd_jax.checkpoint import SaveResult, file_sha256, find_layout, read_layout, restore, save, verify_file
from pskd_jax.container import (
    MAGIC,
    Header,
    Reader,
    WriteResult,
    Writer,
    encode_header,
    read_header,
    write,
    write_encoded,
    write_stream,
)
from pskd_jax.corpus import CorpusWindows, Tokenizer, merge_manifests, read_manifest, verify_corpus, write_manifest
from pskd_jax.corpus_build import build_corpus, build_shard
from pskd_jax.encodings import Encoding, Rounding, index_dtype, round_f64_to_bf16, to_f64
from pskd_jax.errors import CODES, PskdError
from pskd_jax.inspection import Distance, diff, export_json, info_lines, iter_info_lines
from pskd_jax.manager import CheckpointManager
from pskd_jax.pack import pack_file
from pskd_jax.sample_type import Layout, Leaf, format_type, header_text, parse_type
from pskd_jax.shuffle import shuffle_order
from pskd_jax.text import char_vocab, decode_file, encode_file, read_tokens, read_vocab, write_vocab
from pskd_jax.tree import flatten, layout_of_template
from pskd_jax.windows import lm_windows_file, window_type

__version__ = "0.1.0"

__all__ = [
    "CODES",
    "CheckpointManager",
    "CorpusWindows",
    "SaveResult",
    "file_sha256",
    "find_layout",
    "read_layout",
    "read_manifest",
    "restore",
    "save",
    "verify_file",
    "Distance",
    "Encoding",
    "Header",
    "Layout",
    "Leaf",
    "MAGIC",
    "PskdError",
    "Reader",
    "Rounding",
    "Tokenizer",
    "WriteResult",
    "Writer",
    "build_corpus",
    "build_shard",
    "char_vocab",
    "decode_file",
    "diff",
    "encode_file",
    "encode_header",
    "export_json",
    "flatten",
    "format_type",
    "header_text",
    "index_dtype",
    "info_lines",
    "iter_info_lines",
    "layout_of_template",
    "lm_windows_file",
    "merge_manifests",
    "pack_file",
    "parse_type",
    "read_header",
    "read_tokens",
    "read_vocab",
    "round_f64_to_bf16",
    "shuffle_order",
    "to_f64",
    "verify_corpus",
    "window_type",
    "write",
    "write_encoded",
    "write_manifest",
    "write_stream",
    "write_vocab",
]
