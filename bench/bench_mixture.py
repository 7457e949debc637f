"""A mixture's batches against one source's, measured interleaved in one run.

    python bench/bench_mixture.py [--batches 2000] [--n 1000000] [--rounds 7] [--tokens 20000000]

Two shuffled sources mixed 3 : 1, B = 64, against ``stream |> shuffle |> batch(B = 64)`` over one
source of the same size: the host-side cost of a batch's (source, index) pairs, held to ≤ 1.2×.
Two ways of asking are measured: ``batch_indices`` batch by batch at random batch numbers (a
resume, ``pskd pipeline --start``), and the iterator a Loader walks (blocks of batches at once).
Then whole host batches as the Loader makes them (the iterator's indices and the gather of T = 1024
windows): two synthetic corpora of ``--tokens`` tokens mixed 3 : 1 against one of them alone. Times
are this process's CPU time (``time.process_time``): on a shared machine, other processes' load then
shifts them less.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from interleaved import interleaved_medians
from synthetic_corpus import synthetic_corpus

from pskd_jax.corpus import CorpusWindows
from pskd_jax.loader.mixed import MixedBatches, MixedSource
from pskd_jax.pipeline import parse_pipeline

BATCH = 64
LIMIT = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000, help="batches a measurement asks for")
    parser.add_argument("--n", type=int, default=1_000_000, help="samples of each source (windows of a corpus)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=20_000_000, help="tokens of each corpus (0: no gathers)")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--gathered", type=int, default=300, help="batches a measurement gathers")
    args = parser.parse_args()

    single = parse_pipeline(f'stream "a" |> shuffle(seed = 1) |> batch(B = {BATCH})')
    mixture = parse_pipeline(f'mix(stream "a" |> shuffle(seed = 1) : 3, stream "b" |> shuffle(seed = 2) : 1) '
                             f'|> batch(B = {BATCH})')
    counts = (args.n, args.n)
    per_epoch = single.batches_per_epoch(args.n)
    rng = np.random.default_rng(0)
    numbers = rng.integers(0, per_epoch, size=args.batches).tolist()

    def single_random() -> None:
        for j in numbers:
            single.batch_indices(args.n, 1, j)

    def mixture_random() -> None:
        for j in numbers:
            mixture.batch_indices(counts, 1, j)

    def single_stream() -> None:
        for _ in itertools.islice(single.iter_batches(args.n), args.batches):
            pass

    def mixture_stream() -> None:
        for _ in itertools.islice(mixture.iter_batches(counts), args.batches):
            pass

    medians = interleaved_medians({"single random": single_random, "mixture random": mixture_random,
                                   "single stream": single_stream, "mixture stream": mixture_stream}, args.rounds,
                                  clock=time.process_time)
    print(f"schedule: {mixture.schedule}; B = {BATCH}; {args.batches} batches a measurement; n = {args.n} a source")
    for way in ("random", "stream"):
        one, mixed = medians[f"single {way}"], medians[f"mixture {way}"]
        ratio = mixed / one
        verdict = "ok" if ratio <= LIMIT else f"OVER {LIMIT}x"
        print(f"{way:>6}: one source {1e6 * one / args.batches:7.1f} µs a batch, mixture "
              f"{1e6 * mixed / args.batches:7.1f} µs a batch: {ratio:.2f}x ({verdict})")
    if args.tokens:
        gathered(args)


def gathered(args: argparse.Namespace) -> None:
    """Whole host batches: the Loader's iterator and its gather, one corpus against a mixture."""
    with tempfile.TemporaryDirectory() as directory:
        paths = [synthetic_corpus(os.path.join(directory, name), tokens=args.tokens, seed=k)
                 for k, name in enumerate("ab")]
        for access in ("mmap", "pread"):
            a, b = (CorpusWindows(p, seq=args.seq, access=access) for p in paths)
            single = parse_pipeline(f'stream "{paths[0]}" |> shuffle(seed = 1) |> batch(B = {BATCH})')
            mixture = MixedBatches(parse_pipeline(f'mix(stream "{paths[0]}" |> shuffle(seed = 1) : 3, '
                                                  f'stream "{paths[1]}" |> shuffle(seed = 2) : 1) '
                                                  f'|> batch(B = {BATCH})'), (len(a), len(b)))
            mixed = MixedSource([a, b])

            def one(single: Any = single, a: CorpusWindows = a) -> None:
                for _, indices in itertools.islice(single.iter_batches(len(a)), args.gathered):
                    a.gather(indices)

            def both(mixture: MixedBatches = mixture, mixed: MixedSource = mixed) -> None:
                for _, pairs in itertools.islice(mixture.iter_batches(0), args.gathered):
                    mixed.gather(pairs)

            medians = interleaved_medians({"one": one, "mixture": both}, args.rounds, clock=time.process_time)
            ratio = medians["mixture"] / medians["one"]
            verdict = "ok" if ratio <= LIMIT else f"OVER {LIMIT}x"
            print(f"batches of T = {args.seq} windows, {access}: one corpus {1e6 * medians['one'] / args.gathered:7.1f}"
                  f" µs a batch, a mixture of two {1e6 * medians['mixture'] / args.gathered:7.1f} µs: {ratio:.2f}x "
                  f"({verdict})")
            a.close()
            b.close()


if __name__ == "__main__":
    main()


__all__ = ["main"]
