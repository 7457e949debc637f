"""Sharded token corpora: tokenizers, the ``shards.json`` manifest, building (a local process pool,
or Apache Beam), looking after, and training windows over the global token stream."""

from pskd_jax.corpus.beam import build_corpus_beam
from pskd_jax.corpus.build import BuildResult, build_corpus
from pskd_jax.corpus.inputs import find_inputs
from pskd_jax.corpus.maintain import VerifyResult, check_tokenizer, info_lines, verify_corpus
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard, is_manifest, read_manifest, write_manifest
from pskd_jax.corpus.merge import merge_manifests
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_build import ShardResult, build_shard
from pskd_jax.corpus.shard_writer import DEFAULT_CHUNK_TOKENS, ShardWriter
from pskd_jax.corpus.textfiles import decode_tokens_file, encode_text_file
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "MANIFEST",
    "BuildOptions",
    "BuildResult",
    "CorpusWindows",
    "Manifest",
    "Shard",
    "ShardResult",
    "ShardWriter",
    "Tokenizer",
    "VerifyResult",
    "build_corpus",
    "build_corpus_beam",
    "build_shard",
    "check_tokenizer",
    "decode_tokens_file",
    "encode_text_file",
    "find_inputs",
    "info_lines",
    "is_manifest",
    "merge_manifests",
    "read_manifest",
    "verify_corpus",
    "write_manifest",
]
