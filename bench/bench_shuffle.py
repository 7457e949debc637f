"""The shuffle's figures, measured side by side in one run.

    python bench/bench_shuffle.py [--n 100000000] [--batches 2000]

1. One batch of 256 random positions through π at n = 2^40 (held to ≤ 100 µs) and at the worst
   case n = 2^38 + 1, whose domain is 4n so a few positions walk twenty times (≤ 500 µs).
2. The whole order of an epoch of n samples against ``np.random.default_rng().permutation(n)``
   (held to ≤ 3×).
3. ``shuffle_order(n, seed=, epoch=, start=, stop=)`` called once per batch of 256 consecutive
   positions at n = 2^40 against ``order(start, stop)`` on a Permutation held by the caller
   (held to ≤ 1.5×): the round keys of (seed, epoch) are derived once, not per call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pskd_jax.pipeline.shuffle import Permutation, shuffle_order

BATCH = 256


def batch_microseconds(n: int, batches: int) -> float:
    """Median over 5 repeats of the mean µs per batch of 256 random positions (keys derived once)."""
    permutation = Permutation(n, seed=1234, epoch=1)
    rng = np.random.default_rng(0)
    positions = [rng.integers(0, n, size=BATCH, dtype=np.int64) for _ in range(batches)]
    permutation(positions[0])  # warm the lane constants
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for p in positions:
            permutation(p)
        runs.append((time.perf_counter() - start) / batches * 1e6)
    return float(np.median(runs))


def plain_numpy_pass_microseconds(batches: int) -> float:
    """µs of one plain numpy pass of the 8 rounds over 256 positions (88 ufunc calls): the
    machine-speed reference that PERFORMANCE.md measured at 40–75 µs."""
    permutation = Permutation(2**40, seed=1234, epoch=1)
    x = np.random.default_rng(1).integers(0, 2**40, size=BATCH, dtype=np.int64).astype(np.uint64)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(batches):
            permutation._encrypt_rounds(x)
        runs.append((time.perf_counter() - start) / batches * 1e6)
    return float(np.median(runs))


def per_batch_call_microseconds(n: int, batches: int) -> tuple[float, float]:
    """Median µs per batch of 256 consecutive positions: shuffle_order called per batch, and
    ``order(start, stop)`` of a Permutation the caller holds (interleaved, so load hits both)."""
    held = Permutation(n, seed=1234, epoch=1)
    starts = [j * BATCH for j in range(batches)]
    shuffle_order(n, seed=1234, epoch=1, start=0, stop=BATCH)  # the first call derives the keys
    held.order(0, BATCH)
    called, kept = [], []
    for _ in range(5):
        begin = time.perf_counter()
        for s in starts:
            shuffle_order(n, seed=1234, epoch=1, start=s, stop=s + BATCH)
        called.append((time.perf_counter() - begin) / batches * 1e6)
        begin = time.perf_counter()
        for s in starts:
            held.order(s, s + BATCH)
        kept.append((time.perf_counter() - begin) / batches * 1e6)
    return float(np.median(called)), float(np.median(kept))


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10**8, help="samples of the whole-epoch comparison")
    parser.add_argument("--batches", type=int, default=2000, help="batches timed per repeat")
    args = parser.parse_args()

    print(f"one batch of {BATCH} random positions (median of 5 × {args.batches} batches)")
    # The plain pass calibrates the machine: absolute µs drift ±30% (and 2× under load) here.
    plain = plain_numpy_pass_microseconds(args.batches)
    for label, n, target in [("n = 2^40", 2**40, 100.0), ("n = 2^38 + 1", 2**38 + 1, 500.0)]:
        us = batch_microseconds(n, args.batches)
        verdict = "ok" if us <= target else "OVER"
        print(
            f"  {label:13s} {us:8.1f} µs/batch   target ≤ {target:.0f} µs   ({us / target:.2f}× target, {verdict});"
            f" {us / plain:.2f}× a plain numpy pass"
        )
    print(f"  reference: one plain numpy pass of the rounds over {BATCH} positions: {plain:.1f} µs"
          " (40–75 µs in PERFORMANCE.md)")

    print(f"shuffle_order per batch of {BATCH} consecutive positions at n = 2^40 (median of 5 × {args.batches})")
    called, kept = per_batch_call_microseconds(2**40, args.batches)
    ratio = called / kept
    verdict = "ok" if ratio <= 1.5 else "OVER"
    print(f"  shuffle_order(start=, stop=) per batch: {called:7.1f} µs")
    print(f"  held Permutation.order(start, stop):    {kept:7.1f} µs")
    print(f"  ratio per-batch call / held:            {ratio:7.2f}×   target ≤ 1.5×   ({verdict})")

    n = args.n
    print(f"whole order of an epoch of {n} samples")
    reference = seconds(lambda: np.random.default_rng().permutation(n))
    ours = seconds(lambda: shuffle_order(n, seed=1234, epoch=1))
    ratio = ours / reference
    verdict = "ok" if ratio <= 3.0 else "OVER"
    print(f"  numpy default_rng().permutation: {reference:7.3f} s")
    print(f"  pskd_jax shuffle_order:          {ours:7.3f} s")
    print(f"  ratio shuffle_order / numpy:     {ratio:7.2f}×   target ≤ 3×   ({verdict})")


if __name__ == "__main__":
    main()
