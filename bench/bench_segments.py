"""What ``segments=True`` adds to a gather of corpus windows, measured interleaved in one run.

    python bench/bench_segments.py [--tokens 20000000] [--batch 64] [--seq 1024] [--batches 300]

A synthetic corpus (random byte tokens, documents of ``--document`` tokens on average) is written
to a temporary directory; then the same random batches of window indices are gathered from
``CorpusWindows(…)`` and ``CorpusWindows(…, segments=True)``, with each access mode, and the
segments' share of the gather is printed against its goal (≤ 20%); then the same batches
gathered ``--group`` at a time, as the Loader gathers them. The segments alone
(``segment_ids_and_positions`` of a batch already gathered) are timed too. Times are this process's
CPU time (``time.process_time``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from interleaved import interleaved_medians
from synthetic_corpus import synthetic_corpus

from pskd_jax.corpus import CorpusWindows
from pskd_jax.corpus.segments import segment_ids_and_positions

LIMIT = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--document", type=int, default=500, help="mean document length, in tokens")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=300, help="batches a measurement gathers")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--group", type=int, default=32, help="batches a Loader gathers at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        manifest = synthetic_corpus(directory, tokens=args.tokens, mean_document=args.document)
        print(f"corpus: {args.tokens} tokens, documents of {args.document} tokens on average; B = {args.batch}, "
              f"T = {args.seq}; {args.batches} batches a measurement")
        for access in ("mmap", "pread"):
            plain = CorpusWindows(manifest, seq=args.seq, access=access)
            packed = CorpusWindows(manifest, seq=args.seq, access=access, segments=True)
            rng = np.random.default_rng(1)
            batches = [rng.integers(0, len(plain), args.batch) for _ in range(args.batches)]
            inputs = plain.gather(batches[0])[0]
            runs = {
                "gather": lambda plain=plain, batches=batches: [plain.gather(b) for b in batches],
                "gather with segments": lambda packed=packed, batches=batches: [packed.gather(b) for b in batches],
                "segments alone": lambda inputs=inputs, batches=batches: [segment_ids_and_positions(inputs, 256)
                                                                          for _ in batches],
            }
            # A Loader gathers its batches a group at a time (pskd_jax.loader: 32 a group here):
            # the same batches as one gather a group, measured apart, after the batches above.
            groups = [np.concatenate(batches[k : k + args.group]) for k in range(0, len(batches), args.group)]
            grouped_runs = {
                "group gather": lambda plain=plain, groups=groups: [plain.gather(g) for g in groups],
                "group gather with segments": lambda packed=packed, groups=groups: [packed.gather(g) for g in groups],
            }
            medians = interleaved_medians(runs, args.rounds, clock=time.process_time)
            one = medians["gather"] / args.batches
            both = medians["gather with segments"] / args.batches
            alone = medians["segments alone"] / args.batches
            ratio = both / one
            verdict = "ok" if ratio <= LIMIT else f"OVER {LIMIT}x"
            print(f"{access:>5}: gather {1e6 * one:7.1f} µs a batch, with segments {1e6 * both:7.1f} µs: "
                  f"{ratio:.2f}x ({verdict}); the segments alone {1e6 * alone:6.1f} µs")
            medians = interleaved_medians(grouped_runs, args.rounds, clock=time.process_time)
            grouped = medians["group gather with segments"] / medians["group gather"]
            print(f"{access:>5}: in groups of {args.group} batches (the Loader's gathers): gather "
                  f"{1e6 * medians['group gather'] / args.batches:7.1f} µs a batch, with segments "
                  f"{1e6 * medians['group gather with segments'] / args.batches:7.1f} µs: {grouped:.2f}x")
            plain.close()
            packed.close()


if __name__ == "__main__":
    main()


__all__ = ["main"]
