"""The corpus commands: ``pskd corpus build``, ``verify``, ``info`` and ``merge``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from pskd_jax import corpus, data
from pskd_jax._os.checks import counted, integer
from pskd_jax.errors import PskdError, UsageError
from pskd_jax.storage import is_url, locate


class BuildProgress:
    """Shows a corpus build's progress with a tqdm bar (input megabytes, and shards done)."""

    def __init__(self, file=None):
        import tqdm  # only for a terminal: a build's start-up stays small without it

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
    """bytes (the default), chars (--vocab), or a tokenizer.json given as --tokenizer PATH."""
    if args.boundary_token is not None and (args.vocab is not None or args.tokenizer in (None, "bytes", "chars")):
        raise UsageError("--boundary-token names a token of a tokenizer.json (--tokenizer tokenizer.json); the "
                         "boundary of bytes or chars is their size")
    if args.vocab is not None:
        if args.tokenizer not in (None, "chars"):
            raise UsageError(f"--vocab gives a character tokenizer; it does not go with --tokenizer {args.tokenizer}")
        return corpus.Tokenizer.chars(data.read_vocab(args.vocab), args.vocab)
    if args.tokenizer == "chars":
        raise UsageError("--tokenizer chars needs its vocabulary: --vocab VOCAB.json (from pskd chars)")
    if args.tokenizer in (None, "bytes"):
        return corpus.Tokenizer.bytes()
    return corpus.Tokenizer.from_file(args.tokenizer, boundary_token=args.boundary_token)


def _build_options(args: argparse.Namespace) -> corpus.BuildOptions:
    """The build's options from the flags; a refused setting is named by its flag too."""
    tokenizer = _tokenizer(args)
    values = {"workers": args.workers, "chunk_tokens": args.chunk_tokens,
              "max_document_tokens": args.max_document_tokens, "text_key": args.text_key}
    try:
        return corpus.BuildOptions(tokenizer=tokenizer, skip_bad=args.skip_bad, **values)
    except UsageError as e:  # its message names the parameter (workers=0: …): say which flag set it
        parameter = e.message.partition("=")[0]
        if parameter not in values:
            raise
        raise UsageError(f"--{parameter.replace('_', '-')}: {e.message}") from None


def _build(args: argparse.Namespace) -> Iterator[str]:
    if args.output == data.STANDARD_STREAM:
        raise UsageError("pskd corpus build: -o -: the output is a corpus directory, not a stream; give a directory")
    options = _build_options(args)
    if args.beam_options is not None and args.runner != "beam":
        raise UsageError("--beam_options are for --runner beam")
    if args.runner == "beam":
        # Beam logs its set-up on every run, and a worker's error with its traceback, which would
        # bury the result or the one-line error: its log is silenced, here and in the workers,
        # unless the options ask for a level.
        flags = shlex.split(args.beam_options or "")
        quiet = not any(f.startswith("--default_sdk_harness_log_level") for f in flags)
        if quiet:
            flags.append("--default_sdk_harness_log_level=CRITICAL")
            logging.getLogger().setLevel(logging.CRITICAL)
        with _stderr_held() if quiet else contextlib.nullcontext():
            result = corpus.build_corpus_beam(args.inputs, args.output, options, beam_options=flags)
        runner = [f.split("=", 1)[1] for f in flags if f.startswith("--runner=")]
        # (another runner's workers are its own: --workers counts only the local runner's)
        yield from _built(options, result, f"on Apache Beam's {runner[-1]}" if runner else "on Apache Beam",
                          count_workers=not runner)
        return
    bar = BuildProgress() if sys.stderr.isatty() else None
    try:
        result = corpus.build_corpus(args.inputs, args.output, options, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    yield from _built(options, result, "")


@contextlib.contextmanager
def _stderr_held() -> Iterator[None]:
    """Holds back what is written to descriptor 2 meanwhile (Beam's worker processes print a
    worker's traceback there whatever the log level): dropped when the build succeeds or fails
    with the toolkit's error (its one line says it), shown when anything else went wrong."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        show = False
        try:
            yield
        except PskdError:
            raise
        except BaseException:
            show = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if show:
                held.seek(0)
                sys.stderr.flush()
                shutil.copyfileobj(held, sys.stderr.buffer)
                sys.stderr.flush()


def _built(options: corpus.BuildOptions, result: corpus.BuildResult, where: str,
           count_workers: bool = True) -> Iterator[str]:
    m = result.manifest
    kept = f"; {result.kept} kept from an earlier build" if result.kept else ""
    yield (f"pskd: wrote {m.path} ({counted(len(m.shards), 'shard')}, {counted(m.tokens, 'token')}, "
           f"{counted(m.documents, 'document')}, a vocabulary of {m.vocab_size} tokens with boundary "
           f"{m.boundary}{kept})")
    if result.skipped:
        first = "; the first:" if result.examples else ""
        yield f"pskd: left out {counted(result.skipped, 'bad document')} (--skip-bad){first}"
        for example in result.examples:
            yield f"pskd:   {example}"
    mb = result.input_bytes / 1e6
    if result.built:
        used = min(options.workers, result.built)  # (the pool, and Beam's, start no more than the shards built)
        workers = f"with {counted(used, 'worker')}" if count_workers else ""
        place = " ".join(part for part in (workers, where) if part)
        yield (f"pskd: {counted(result.built, 'shard')} from {mb:.1f} MB of input in {result.seconds:.2f} s "
               f"({mb / max(result.seconds, 1e-9):.1f} MB/s {place})")


def _manifest_path(given: str) -> str:
    """A corpus directory stands for its shards.json; so does a store's prefix (a URL whose last
    part does not end in ``.json``, or that ends in ``/``)."""
    if is_url(given):
        where = locate(given)
        if where.is_local:
            given = where.path
        elif given.endswith("/") or not where.name.endswith(".json"):
            return where.child(corpus.MANIFEST).url
        else:
            return given
    return os.path.join(given, "shards.json") if os.path.isdir(given) else given


def _verify(args) -> Iterator[str]:
    started = time.perf_counter()
    args.manifest = _manifest_path(args.manifest)
    result = corpus.verify_corpus(args.manifest, workers=args.workers, tokenizer=args.tokenizer)
    seconds = time.perf_counter() - started
    yield (f"pskd: ok {args.manifest}: {counted(result.shards, 'shard')}, {counted(result.tokens, 'token')}; "
           "every sha256, count, size, "
           f"token and document count matches ({result.bytes / 1e6:.1f} MB in {seconds:.2f} s)")
    m = result.manifest
    if not m.complete:
        yield (f"pskd: note: a build of this corpus is in progress or was interrupted: {len(m.shards)} of "
               f"{m.planned_shards} shards listed")


def _info(args) -> Iterator[str]:
    yield from corpus.info_lines(_manifest_path(args.manifest), shards=args.shards)


def _merge(args) -> Iterator[str]:
    output = args.output
    if os.path.isdir(output) or is_url(output):  # a directory (or a store's prefix): its shards.json
        output = _manifest_path(output) if is_url(output) else os.path.join(output, corpus.MANIFEST)
    m = corpus.merge_manifests(args.manifests, output)
    yield (f"pskd: wrote {output} ({counted(len(m.shards), 'shard')} from "
           f"{counted(len(args.manifests), 'manifest')}, {counted(m.tokens, 'token')}, "
           f"{counted(m.documents, 'document')}, a vocabulary of {m.vocab_size} tokens with boundary {m.boundary})")


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("corpus", help="Build, verify, inspect and merge sharded token corpora.",
                                  description="Build, verify, inspect and merge sharded token corpora.")
    commands = group.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    p = command("build", _build, "Tokenize documents into shards (one per input file) and write DIR/shards.json.")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help=".jsonl, .jsonl.gz, .txt files, or directories of them; or objects of a store (s3://B/K, "
                        "gs://B/K), a prefix ending in / for the objects directly below it, a pattern such as "
                        "s3://B/raw/*.jsonl")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the corpus directory, or a prefix of a store (s3://B/corpus, gs://B/corpus)")
    p.add_argument("--tokenizer", metavar="bytes|chars|tokenizer.json",
                   help="bytes (the default), chars (needs --vocab), or a Hugging Face tokenizer.json (needs the "
                        "tokenizers package: pip install 'pskd_jax[tokenizers]')")
    p.add_argument("--vocab", metavar="VOCAB.json", help="a character vocabulary (pskd chars): the chars tokenizer")
    p.add_argument("--boundary-token", metavar="NAME",
                   help="with a tokenizer.json: the token between documents (default: its end-of-text token, such as "
                        "<|endoftext|>, </s> or [SEP], else an id past its vocabulary; '' for that id)")
    p.add_argument("--workers", type=integer, default=1, metavar="N",
                   help="processes building shards at once (with --runner beam: the local runner's worker processes)")
    p.add_argument("--runner", choices=("local", "beam"), default="local",
                   help="local: this machine's process pool (the default); beam: an Apache Beam pipeline (needs "
                        "pip install 'pskd_jax[beam]'), Beam's local FnApiRunner unless --beam_options name another")
    p.add_argument("--beam_options", "--beam-options", metavar='"FLAGS"',
                   help="Beam pipeline options passed to the runner as given, e.g. \"--runner=DataflowRunner "
                        "--project=P --region=R --temp_location=gs://B/tmp\"")
    p.add_argument("--chunk-tokens", type=integer, default=corpus.DEFAULT_CHUNK_TOKENS, metavar="C",
                   help="tokens appended between two updates of a shard's header count")
    p.add_argument("--max-document-tokens", type=integer, metavar="M", help="keep the first M tokens of each document")
    p.add_argument("--text-key", default="text", metavar="KEY", help="the JSONL key holding a document's text")
    p.add_argument("--skip-bad", action="store_true",
                   help="leave out bad documents (counted and reported) instead of stopping at the first")

    p = command("verify", _verify, "Hash every shard in parallel and check it against the manifest.")
    p.add_argument("manifest", metavar="DIR/shards.json",
                   help="the manifest, or the corpus directory holding it; or a store's (s3://B/corpus/shards.json, "
                        "or the prefix s3://B/corpus)")
    p.add_argument("--workers", type=integer, metavar="N",
                   help="shards hashed at once (default: the CPUs; 16 for a store)")
    p.add_argument("--tokenizer", metavar="tokenizer.json",
                   help="refuse a corpus built with another tokenizer (a tokenizer.json, or a VOCAB.json)")

    p = command("info", _info, "Shards, tokens, documents, the boundary's share and tokens per document.")
    p.add_argument("manifest", metavar="DIR/shards.json",
                   help="the manifest, or the corpus directory holding it; or a store's (s3://B/corpus/shards.json, "
                        "or the prefix s3://B/corpus)")
    p.add_argument("--shards", action="store_true", help="also one line per shard")

    p = command("merge", _merge, "One manifest listing the shards of several, in the order given (corpora built "
                "apart become one); shard paths are rewritten relative to the output's directory.")
    p.add_argument("manifests", nargs="+", metavar="PART/shards.json", type=_manifest_path,
                   help="manifests of one tokenizer and one set of build options, each shard listed once")
    p.add_argument("-o", "--output", required=True, metavar="DIR/shards.json",
                   help="the merged manifest (written atomically), in a directory above every shard; a directory "
                        "means its shards.json")


__all__ = ["BuildProgress", "register"]
