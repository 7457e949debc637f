"""The corpus commands: ``pskd corpus build``, ``verify``, ``info`` and ``merge``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterator

import tqdm

from pskd_jax import corpus, data
from pskd_jax.errors import UsageError


class BuildProgress:
    """Shows a corpus build's progress with a tqdm bar (input megabytes, and shards done)."""

    def __init__(self, file=None):
        self.bar = tqdm.tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1000, file=file or sys.stderr,
                             desc="corpus build", dynamic_ncols=True, mininterval=0.1)

    def __call__(self, done_bytes: int, total_bytes: int, done_shards: int, total_shards: int) -> None:
        self.bar.total = total_bytes
        self.bar.n = done_bytes
        self.bar.set_postfix_str(f"{done_shards}/{total_shards} shards", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _tokenizer(args) -> corpus.Tokenizer:
    if args.vocab is not None:
        if args.tokenizer not in (None, "chars"):
            raise UsageError("--vocab gives a character tokenizer; it does not go with --tokenizer bytes")
        return corpus.Tokenizer.chars(data.read_vocab(args.vocab), args.vocab)
    if args.tokenizer == "chars":
        raise UsageError("--tokenizer chars needs its vocabulary: --vocab VOCAB.json (from pskd chars)")
    return corpus.Tokenizer.bytes()


def _build(args) -> Iterator[str]:
    if args.output == data.STANDARD_STREAM:
        raise UsageError("pskd corpus build: -o -: the output is a corpus directory, not a stream; give a directory")
    tokenizer = _tokenizer(args)
    bar = BuildProgress() if sys.stderr.isatty() else None
    try:
        result = corpus.build_corpus(
            args.inputs, args.output, tokenizer=tokenizer, workers=args.workers, chunk_tokens=args.chunk_tokens,
            max_document_tokens=args.max_document_tokens, text_key=args.text_key, skip_bad=args.skip_bad,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    m = result.manifest
    kept = f"; {result.kept} kept from an earlier build" if result.kept else ""
    yield (f"pskd: wrote {m.path} ({len(m.shards)} shards, {m.tokens} tokens, {m.documents} documents, "
           f"vocabulary {m.vocab_size} with boundary {m.boundary}{kept})")
    if result.skipped:
        yield f"pskd: left out {result.skipped} bad documents (--skip-bad); the first:"
        for example in result.examples:
            yield f"pskd:   {example}"
    mb = result.input_bytes / 1e6
    if result.built:
        yield (f"pskd: {result.built} shards from {mb:.1f} MB of input in {result.seconds:.2f} s "
               f"({mb / max(result.seconds, 1e-9):.1f} MB/s with {args.workers} worker{'s' if args.workers > 1 else ''})")


def _manifest_path(given: str) -> str:
    """A corpus directory stands for its shards.json."""
    return os.path.join(given, "shards.json") if os.path.isdir(given) else given


def _verify(args) -> Iterator[str]:
    started = time.perf_counter()
    args.manifest = _manifest_path(args.manifest)
    result = corpus.verify_corpus(args.manifest, workers=args.workers)
    seconds = time.perf_counter() - started
    yield (f"pskd: ok {args.manifest}: {result.shards} shards, {result.tokens} tokens; every sha256, count and "
           f"size matches ({result.bytes / 1e6:.1f} MB in {seconds:.2f} s)")


def _info(args) -> Iterator[str]:
    yield from corpus.info_lines(_manifest_path(args.manifest), shards=args.shards)


def _merge(args) -> Iterator[str]:
    output = args.output
    if os.path.isdir(output):  # a directory: its shards.json
        output = os.path.join(output, corpus.MANIFEST)
    m = corpus.merge_manifests(args.manifests, output)
    yield (f"pskd: wrote {output} ({len(m.shards)} shards from {len(args.manifests)} manifests, {m.tokens} tokens, "
           f"{m.documents} documents, vocabulary {m.vocab_size} with boundary {m.boundary})")


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("corpus", help="Build, verify, inspect and merge sharded token corpora.",
                                  description="Build, verify, inspect and merge sharded token corpora.")
    commands = group.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("build", _build, "Tokenize documents into shards (one per input file) and write DIR/shards.json.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".jsonl, .jsonl.gz, .txt files, or directories of them")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the corpus directory")
    p.add_argument("--tokenizer", choices=("bytes", "chars"), help="bytes (the default) or chars (needs --vocab)")
    p.add_argument("--vocab", metavar="VOCAB.json", help="a character vocabulary (pskd chars): the chars tokenizer")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="processes building shards at once")
    p.add_argument("--chunk-tokens", type=int, default=corpus.DEFAULT_CHUNK_TOKENS, metavar="C",
                   help="tokens appended between two updates of a shard's header count")
    p.add_argument("--max-document-tokens", type=int, metavar="M", help="keep the first M tokens of each document")
    p.add_argument("--text-key", default="text", metavar="KEY", help="the JSONL key holding a document's text")
    p.add_argument("--skip-bad", action="store_true",
                   help="leave out bad documents (counted and reported) instead of stopping at the first")

    p = command("verify", _verify, "Hash every shard in parallel and check it against the manifest.")
    p.add_argument("manifest", metavar="DIR/shards.json", help="the manifest, or the corpus directory holding it")
    p.add_argument("--workers", type=int, metavar="N", help="shards hashed at once (default: the CPUs)")

    p = command("info", _info, "Shards, tokens, documents, the boundary's share and tokens per document.")
    p.add_argument("manifest", metavar="DIR/shards.json", help="the manifest, or the corpus directory holding it")
    p.add_argument("--shards", action="store_true", help="also one line per shard")

    p = command("merge", _merge, "One manifest listing the shards of several, in the order given (corpora built "
                "apart become one); shard paths are rewritten relative to the output's directory.")
    p.add_argument("manifests", nargs="+", metavar="PART/shards.json", type=_manifest_path,
                   help="manifests of one tokenizer and one set of build options, each shard listed once")
    p.add_argument("-o", "--output", required=True, metavar="DIR/shards.json",
                   help="the merged manifest (written atomically), in a directory above every shard; a directory "
                        "means its shards.json")
