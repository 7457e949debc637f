"""``pskd pipeline``: the samples a pipeline will feed, batch by batch."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from pskd_jax._os.checks import integer
from pskd_jax.errors import UsageError
from pskd_jax.pipeline import Mixture, Pipeline, StreamFacts, load_pipeline, parse_pipeline, stream_facts
from pskd_jax.pipeline.streams import check_stream_path, stream_places


def _pipeline(args: argparse.Namespace) -> Iterator[str]:
    if os.path.lexists(args.text):  # a file (a FIFO or a directory there is refused, not parsed as text)
        pipeline = load_pipeline(args.text, root=args.root)
    else:
        pipeline = parse_pipeline(args.text, base_dir=".", source="TEXT")
    for name in ("start", "batches", "indices"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name} must be at least 0, got {getattr(args, name)}")
    if isinstance(pipeline, Mixture):
        return _mixture_lines(pipeline, args)
    return _stream_lines(pipeline, args)


def _facts(path: str, args: argparse.Namespace, where: str = "") -> StreamFacts:
    check_stream_path(path, where)  # (E9010 for nothing there, or a directory: the Loader's own check)
    return stream_facts(path, seq=args.seq, stride=args.stride)


def _check_cut_flags(facts: list[StreamFacts], args: argparse.Namespace) -> None:
    """E9012 for ``--seq`` or ``--stride`` when no stream is a corpus (as train_lm refuses them):
    a .psk.d file's samples are cut already, and the flag would go unheeded."""
    if any(f.corpus for f in facts):
        return
    for name in ("seq", "stride"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name} cuts a corpus's windows; {facts[0].path} is a .psk.d file of samples cut "
                             "already")


def _cut(facts: StreamFacts) -> str:
    """How a corpus's samples are cut (nothing for a .psk.d file)."""
    return f" (windows of {facts.seq} tokens every {facts.stride} tokens)" if facts.corpus else ""


def _first(args: argparse.Namespace, batches: int, what: str) -> range:
    """The batches to print: from --start, --batches of them, within ``batches``."""
    if args.start >= batches and args.batches:
        raise UsageError(f"--start {args.start}: {what} has {batches} batches (0 to {batches - 1})")
    return range(args.start, min(args.start + args.batches, batches))


def _stream_lines(pipeline: Pipeline, args: argparse.Namespace) -> Iterator[str]:
    facts = _facts(pipeline.path, args)
    _check_cut_flags([facts], args)
    n = facts.count
    epoch = 1 if args.epoch is None else args.epoch
    per_epoch = pipeline.check_batches(n)  # E9010 when it makes no batch, as a training run refuses it
    printed = _first(args, per_epoch, "an epoch")  # refused before anything is printed
    pipeline.batch_indices(n, epoch, 0, stop=0)  # so is an epoch the pipeline refuses (batch 0 is one it has)
    yield f"pipeline {pipeline}"
    yield f"samples  {n} of type {facts.sample_type}, {per_epoch} batches an epoch{_cut(facts)}"
    shown = min(pipeline.batch_size, args.indices)  # a batch of 10^9 is not printed whole
    more = f" … ({pipeline.batch_size} indices)" if shown < pipeline.batch_size else ""
    for j in printed:
        indices = pipeline.batch_indices(n, epoch, j, stop=shown)
        yield f"epoch {epoch} batch {j}: " + " ".join(map(str, indices.tolist())) + more


def _mixture_lines(mixture: Mixture, args: argparse.Namespace) -> Iterator[str]:
    if args.epoch not in (None, 1):
        raise UsageError(f"--epoch {args.epoch}: a mixture has no epochs of its own (each source starts its next "
                         "epoch when it runs out); print a later part of its stream with --start J")
    facts = [_facts(path, args, where) for path, where in stream_places(mixture)]
    _check_cut_flags(facts, args)
    counts = mixture.check_counts([f.count for f in facts])
    sample_type = mixture.check_sample_types([f.sample_type for f in facts])
    # The stream ends after take, and where its positions do (2**63 - 1): refused before anything is printed
    printed = _first(args, mixture.end_batch, "the stream")
    yield f"pipeline {mixture}"
    total = sum(source.weight for source in mixture.sources)
    for i, (source, f) in enumerate(zip(mixture.sources, facts)):
        yield f"source {i} {source.stream_text()}: {f.count} samples{_cut(f)}, share {source.weight / total}"
    end = f"{mixture.take} batches" if mixture.take is not None else "batches without end (no take)"
    yield f"samples  of type {sample_type}, printed SOURCE:INDEX; {end}"
    shown = min(mixture.batch_size, args.indices)
    more = f" … ({mixture.batch_size} samples)" if shown < mixture.batch_size else ""
    for j in printed:
        sources, indices = mixture.batch_indices(counts, 1, j, stop=shown)
        yield f"batch {j}: " + " ".join(f"{s}:{i}" for s, i in zip(sources.tolist(), indices.tolist())) + more


def register(subparsers: argparse._SubParsersAction) -> None:
    help_text = "Print the samples of a pipeline's batches (a mixture's as SOURCE:INDEX)."
    parser = subparsers.add_parser("pipeline", help=help_text, description=help_text)
    parser.set_defaults(handler=_pipeline)
    parser.add_argument("text", metavar="TEXT",
                        help='the pipeline, e.g. \'stream "w.psk.d" |> shuffle(seed = 1) |> batch(B = 8)\' or '
                             '\'mix(stream "a.psk.d" : 3, stream "b.psk.d" : 1) |> batch(B = 8)\', or a file holding '
                             "it (its paths are then relative to that file)")
    parser.add_argument("--epoch", type=integer, default=None, metavar="E", help="the epoch, from 1 (default 1; a "
                        "mixture has none of its own)")
    parser.add_argument("--start", type=integer, default=0, metavar="J", help="the first batch to print (from 0)")
    parser.add_argument("--batches", type=integer, default=4, metavar="K", help="how many batches to print")
    parser.add_argument("--indices", type=integer, default=1024, metavar="N",
                        help="how many samples of a batch to print at most (the rest is counted)")
    parser.add_argument("--seq", type=integer, default=None, metavar="T",
                        help="the window length for a stream that is a corpus (DIR/shards.json)")
    parser.add_argument("--stride", type=integer, default=None, metavar="S",
                        help="the stride of a corpus's windows (default: T)")
    parser.add_argument("--root", metavar="DIR",
                        help="a pipeline file may stream files inside DIR (default: only inside its own directory)")


__all__ = ["register"]
