"""What ``segments=True`` adds to a gather of corpus windows, measured interleaved in one run.

    python bench/bench_segments.py [--tokens 20000000] [--batch 64] [--seq 1024] [--batches 300]

A synthetic corpus (random byte tokens, documents of ``--document`` tokens on average) is written
to a temporary directory; then the same random batches of window indices are gathered from
``CorpusWindows(…)`` and ``CorpusWindows(…, segments=True)``, with each access mode, every case
(A B A B …) interleaved. Three ways of keeping the batches, each printed against the goal (≤ 20%):

- let go: each batch dropped before the next is gathered, as a training loop does (the figure);
- a queue of 4: the last four batches kept, as a Loader's prefetched batches are;
- all kept: every batch of a measurement held in a list, so that each one's outputs are fresh
  memory the kernel zeroes first (that cost is the page faults', the plain gather's as well).

Then the same batches gathered ``--group`` at a time, as the Loader gathers them, and the
segments alone (``segment_ids_and_positions`` of a batch already gathered). Which scan computed
them is printed (compiled, or numpy where the package was built without a C compiler). Times are
this process's CPU time (``time.process_time``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from interleaved import interleaved_medians
from synthetic_corpus import synthetic_corpus

from pskd_jax.corpus import CorpusWindows, segments
from pskd_jax.corpus.segments import segment_ids_and_positions

LIMIT = 1.2
SCAN = "numpy's scan and copies" if segments._native is None else "the compiled scan and mapped gather"


def let_go(windows: CorpusWindows, batches: list[np.ndarray]) -> None:
    """Each batch gathered and dropped before the next, as a training loop does."""
    for batch in batches:
        windows.gather(batch)


def queued(windows: CorpusWindows, batches: list[np.ndarray], keep: int = 4) -> None:
    """The last ``keep`` batches held, as a queue of prefetched batches holds them."""
    queue: collections.deque = collections.deque(maxlen=keep)
    for batch in batches:
        queue.append(windows.gather(batch))


def let_go_segments(inputs: np.ndarray, count: int) -> None:
    for _ in range(count):
        segment_ids_and_positions(inputs, 256)


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
              f"T = {args.seq}; {args.batches} batches a measurement; {SCAN}")
        for access in ("mmap", "pread"):
            plain = CorpusWindows(manifest, seq=args.seq, access=access)
            packed = CorpusWindows(manifest, seq=args.seq, access=access, segments=True)
            rng = np.random.default_rng(1)
            batches = [rng.integers(0, len(plain), args.batch) for _ in range(args.batches)]
            inputs = plain.gather(batches[0])[0]
            runs = {
                "gather, let go": lambda plain=plain, batches=batches: let_go(plain, batches),
                "with segments, let go": lambda packed=packed, batches=batches: let_go(packed, batches),
                "gather, a queue of 4": lambda plain=plain, batches=batches: queued(plain, batches),
                "with segments, a queue of 4": lambda packed=packed, batches=batches: queued(packed, batches),
                "gather, all kept": lambda plain=plain, batches=batches: [plain.gather(b) for b in batches],
                "with segments, all kept": lambda packed=packed, batches=batches: [packed.gather(b) for b in batches],
                "segments alone": lambda inputs=inputs, batches=batches: let_go_segments(inputs, len(batches)),
            }
            # A Loader gathers its batches a group at a time (pskd_jax.loader: 32 a group here):
            # the same batches as one gather a group, measured apart, after the batches above.
            groups = [np.concatenate(batches[k : k + args.group]) for k in range(0, len(batches), args.group)]
            grouped_runs = {
                "group gather": lambda plain=plain, groups=groups: let_go(plain, groups),
                "group gather with segments": lambda packed=packed, groups=groups: let_go(packed, groups),
            }
            medians = interleaved_medians(runs, args.rounds, clock=time.process_time)
            for way in ("let go", "a queue of 4", "all kept"):
                one = medians[f"gather, {way}"] / args.batches
                both = medians[f"with segments, {way}"] / args.batches
                ratio = both / one
                verdict = "ok" if ratio <= LIMIT else f"OVER {LIMIT}x"
                print(f"{access:>5}, {way + ':':<13} gather {1e6 * one:7.1f} µs a batch, with segments "
                      f"{1e6 * both:7.1f} µs: {ratio:.2f}x ({verdict})")
            print(f"{access:>5}: the segments alone {1e6 * medians['segments alone'] / args.batches:6.1f} µs a batch")
            medians = interleaved_medians(grouped_runs, args.rounds, clock=time.process_time)
            grouped = medians["group gather with segments"] / medians["group gather"]
            print(f"{access:>5}: in groups of {args.group} batches (the Loader's gathers), let go: gather "
                  f"{1e6 * medians['group gather'] / args.batches:7.1f} µs a batch, with segments "
                  f"{1e6 * medians['group gather with segments'] / args.batches:7.1f} µs: {grouped:.2f}x")
            plain.close()
            packed.close()


if __name__ == "__main__":
    main()


__all__ = ["main"]
