"""A mixture's batches against one source's, measured interleaved in one run.

    python bench/bench_mixture.py [--batches 2000] [--n 1000000] [--rounds 7] [--tokens 20000000]

Two shuffled sources mixed 3 : 1, B = 64, against ``stream |> shuffle |> batch(B = 64)`` over one
source of the same size: the host-side cost of a batch's (source, index) pairs, held to ≤ 1.2×.
Two ways of asking are measured: ``batch_indices`` batch by batch at random batch numbers (a
resume, ``pskd pipeline --start``), and the iterator a Loader walks (blocks of batches at once).
Then whole host batches as the Loader makes them (the iterator's indices and the gather of T = 1024
windows): two synthetic corpora of ``--tokens`` tokens (four shards each) mixed 3 : 1 against one
corpus holding as many tokens in as many shards, the figure held to 1.2×: the same bytes in play on
both sides, so the ratio is the mixture's own cost and not the cache's (a corpus of 16 MB stays in
this machine's 32 MiB L3 cache, two of them do not). The ratio against one of the two sources alone
is printed beside it. Times are this process's CPU time (``time.process_time``): on a shared
machine, other processes' load then shifts them less.
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
    """Whole host batches: the Loader's iterator and its gather, a mixture of two corpora against
    one corpus of as many tokens and shards (held) and against one of the two (shown)."""
    with tempfile.TemporaryDirectory() as directory:
        paths = [synthetic_corpus(os.path.join(directory, name), tokens=args.tokens, seed=k)
                 for k, name in enumerate("ab")]
        whole = synthetic_corpus(os.path.join(directory, "whole"), tokens=2 * args.tokens, shards=8, seed=2)
        for access in ("mmap", "pread"):
            a, b, both_in_one = (CorpusWindows(p, seq=args.seq, access=access) for p in (*paths, whole))
            mixture = MixedBatches(parse_pipeline(f'mix(stream "{paths[0]}" |> shuffle(seed = 1) : 3, '
                                                  f'stream "{paths[1]}" |> shuffle(seed = 2) : 1) '
                                                  f'|> batch(B = {BATCH})'), (len(a), len(b)))
            mixed = MixedSource([a, b])

            def alone(source: CorpusWindows) -> Any:
                single = parse_pipeline(f'stream "{source.path}" |> shuffle(seed = 1) |> batch(B = {BATCH})')

                def run() -> None:
                    for _, indices in itertools.islice(single.iter_batches(len(source)), args.gathered):
                        source.gather(indices)
                return run

            def both(mixture: MixedBatches = mixture, mixed: MixedSource = mixed) -> None:
                for _, pairs in itertools.islice(mixture.iter_batches(0), args.gathered):
                    mixed.gather(pairs)

            medians = interleaved_medians({"one": alone(both_in_one), "source": alone(a), "mixture": both},
                                          args.rounds, clock=time.process_time)
            ratio = medians["mixture"] / medians["one"]
            verdict = "ok" if ratio <= LIMIT else f"OVER {LIMIT}x"
            print(f"batches of T = {args.seq} windows, {access}: one corpus of {2 * args.tokens} tokens "
                  f"{1e6 * medians['one'] / args.gathered:7.1f} µs a batch, a mixture of two of {args.tokens} "
                  f"{1e6 * medians['mixture'] / args.gathered:7.1f} µs: {ratio:.2f}x ({verdict}); against "
                  f"one of the two alone ({1e6 * medians['source'] / args.gathered:.1f} µs): "
                  f"{medians['mixture'] / medians['source']:.2f}x")
            for source in (a, b, both_in_one):
                source.close()


if __name__ == "__main__":
    main()


__all__ = ["main"]
