"""Random batches from a mapped file: Reader.gather against the plain numpy idioms, in one run.

    python bench/bench_gather.py [--mb 400] [--batch 64] [--seq 1025] [--seconds 2]

A file of windows of ``seq`` u16 tokens (one leaf, and the two-leaf lm-windows shape) is written to
a temporary directory; then, for random batches of ``batch`` indices, it times
  - pskd_jax.Reader.gather (one vectorised read per leaf),
  - an open np.memmap fancy-indexed with starts[:, None] + arange(T) (the best plain idiom),
  - np.copyto of the same number of bytes between ready buffers (the physical limit),
and prints batches per second and the ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import pskd_jax


def rate(step, seconds: float) -> float:
    """Calls per second of ``step`` over about ``seconds`` (after a short warm-up)."""
    for _ in range(10):
        step()
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(50):
            step()
        calls += 50
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1025)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    T, B = args.seq, args.batch
    count = int(args.mb * 1e6) // (2 * T)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "windows.psk.d")
        with pskd_jax.Writer(path, f"idx[65536][seq: {T}]", durable=False) as writer:
            for start in range(0, count, 4096):
                n = min(4096, count - start)
                writer.append(rng.integers(0, 65536, size=(n, T), dtype=np.uint16))
        pairs = os.path.join(directory, "pairs.psk.d")
        half = T // 2
        with pskd_jax.Writer(pairs, f"(idx[65536][seq: {half}], idx[65536][seq: {half}])", durable=False) as writer:
            for start in range(0, count, 4096):
                n = min(4096, count - start)
                block = rng.integers(0, 65536, size=(n, 2, half), dtype=np.uint16)
                writer.append((block[:, 0], block[:, 1]))
        reader = pskd_jax.Reader(path)
        pair_reader = pskd_jax.Reader(pairs)
        data_offset = reader.header.data_offset
        memmap = np.memmap(path, dtype=np.uint16, mode="r", offset=data_offset)
        arange = np.arange(T)
        source = np.empty((B, T), np.uint16)
        destination = np.empty((B, T), np.uint16)
        with open(path, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass

        def ours():
            reader.gather(rng.integers(0, count, size=B))

        def ours_pairs():
            pair_reader.gather(rng.integers(0, count, size=B))

        def memmap_fancy():
            starts = rng.integers(0, count, size=B) * T
            np.asarray(memmap[starts[:, None] + arange])

        def copyto():
            rng.integers(0, count, size=B)
            np.copyto(destination, source)

        rates = {
            "Reader.gather (1 leaf)": rate(ours, args.seconds),
            "Reader.gather (2 leaves)": rate(ours_pairs, args.seconds),
            "np.memmap[starts[:, None] + arange(T)]": rate(memmap_fancy, args.seconds),
            "np.copyto of the same bytes": rate(copyto, args.seconds),
        }
        print(f"random batches of {B} windows of {T} u16 tokens from a {count * 2 * T / 1e6:.0f} MB file")
        for name, value in rates.items():
            print(f"  {name:42s} {value:10.0f} batches/s")
        ours_rate = rates["Reader.gather (1 leaf)"]
        memmap_rate = rates["np.memmap[starts[:, None] + arange(T)]"]
        print(f"  ratio to np.memmap fancy indexing: {ours_rate / memmap_rate:.2f}x (held to >= 2x)")
        print(f"  fraction of the np.copyto limit:   {ours_rate / rates['np.copyto of the same bytes']:.2f}")
        reader.close()
        pair_reader.close()


if __name__ == "__main__":
    main()
