"""Sharded token corpora: tokenizers, the ``shards.json`` manifest, building (a local process pool,
or Apache Beam), looking after, and training windows over the global token stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pskd_jax._os.lazy import lazy_names

if TYPE_CHECKING:
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
else:  # each name imported from its module when first asked for (see pskd_jax._os.lazy)
    __getattr__, __dir__ = lazy_names(__name__, {
        "pskd_jax.corpus.beam": ("build_corpus_beam",),
        "pskd_jax.corpus.build": ("BuildResult", "build_corpus"),
        "pskd_jax.corpus.inputs": ("find_inputs",),
        "pskd_jax.corpus.maintain": ("VerifyResult", "check_tokenizer", "info_lines", "verify_corpus"),
        "pskd_jax.corpus.manifest": ("MANIFEST", "Manifest", "Shard", "is_manifest", "read_manifest", "write_manifest"),
        "pskd_jax.corpus.merge": ("merge_manifests",),
        "pskd_jax.corpus.options": ("BuildOptions",),
        "pskd_jax.corpus.shard_build": ("ShardResult", "build_shard"),
        "pskd_jax.corpus.shard_writer": ("DEFAULT_CHUNK_TOKENS", "ShardWriter"),
        "pskd_jax.corpus.textfiles": ("decode_tokens_file", "encode_text_file"),
        "pskd_jax.corpus.tokenizer": ("Tokenizer",),
        "pskd_jax.corpus.windows": ("CorpusWindows",),
    })

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
