"""``pskd pipeline``: the sample indices a pipeline will feed, batch by batch."""

from __future__ import annotations

import argparse
import os
from typing import Iterator

from pskd_jax.format import Reader
from pskd_jax.pipeline import load_pipeline, parse_pipeline


def _pipeline(args) -> Iterator[str]:
    if os.path.lexists(args.text):  # a file (a FIFO or a directory there is refused, not parsed as text)
        pipeline = load_pipeline(args.text, root=args.root)
    else:
        pipeline = parse_pipeline(args.text, base_dir=".", source="TEXT")
    with Reader(pipeline.path) as reader:
        header = reader.header
    n = header.count
    per_epoch = pipeline.check_batches(n)  # E9010 when it makes no batch, as a training run refuses it
    yield f"pipeline {pipeline}"
    yield f"samples  {n} of type {header.type_text}, {per_epoch} batches an epoch"
    shown = min(pipeline.batch_size, args.indices)  # a batch of 10^9 is not printed whole
    more = f" … ({pipeline.batch_size} indices)" if shown < pipeline.batch_size else ""
    for j in range(min(args.batches, per_epoch)):
        indices = pipeline.batch_indices(n, args.epoch, j, stop=shown)
        yield f"epoch {args.epoch} batch {j}: " + " ".join(map(str, indices.tolist())) + more


def register(subparsers: argparse._SubParsersAction) -> None:
    help_text = "Print the sample indices of the first batches of a pipeline's epoch."
    parser = subparsers.add_parser("pipeline", help=help_text, description=help_text)
    parser.set_defaults(handler=_pipeline)
    parser.add_argument("text", metavar="TEXT",
                        help='the pipeline, e.g. \'stream "w.psk.d" |> shuffle(seed = 1) |> batch(B = 8)\', '
                             "or a file holding it (its path is then relative to that file)")
    parser.add_argument("--epoch", type=int, default=1, metavar="E", help="the epoch, from 1")
    parser.add_argument("--batches", type=int, default=4, metavar="K", help="how many batches to print")
    parser.add_argument("--indices", type=int, default=1024, metavar="N",
                        help="how many indices of a batch to print at most (the rest is counted)")
    parser.add_argument("--root", metavar="DIR",
                        help="a pipeline file may stream files inside DIR (default: only inside its own directory)")


__all__ = ["register"]
