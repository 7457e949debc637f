"""Per-leaf overhead of a restore: a tree of many small leaves restored in-process.

A checkpoint of ``--leaves`` float32 leaves of 64 elements (a flax/optax train state has hundreds
to thousands of leaves) is restored, as numpy, with and without a target, and — to show what opening
costs — the file's layout is applied to a reader on its own (``Reader.with_layout``). Median of
``--rounds`` interleaved rounds, in milliseconds and microseconds a leaf.

    python bench/bench_restore_leaves.py [--leaves 1000] [--rounds 50]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile

import numpy as np
from interleaved import interleaved_medians  # bench/interleaved.py, beside this script

from pskd_jax import checkpoint as ck
from pskd_jax.format import Reader


def measure(directory: pathlib.Path, leaves: int, rounds: int) -> dict[str, float]:
    tree = {f"layer_{i:04d}": {"w": np.full(64, i, np.float32)} for i in range(leaves)}
    path = directory / "many.psk.d"
    ck.save(path, tree)
    target = {k: {"w": np.zeros(64, np.float32)} for k in tree}
    layout = ck.find_layout_file(path).layout

    def with_layout() -> None:
        with Reader(path) as reader:
            reader.with_layout(layout)

    runs = {"restore, no target": lambda: ck.restore(path, as_numpy=True),
            "restore, numpy target": lambda: ck.restore(path, target, as_numpy=True),
            "Reader.with_layout alone": with_layout}
    return interleaved_medians(runs, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    directory = pathlib.Path(tempfile.mkdtemp(prefix="bench_restore_leaves."))
    try:
        found = measure(directory, args.leaves, args.rounds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{args.leaves} leaves of 64 float32, median of {args.rounds}:")
    for name, seconds in found.items():
        print(f"  {name:28s} {seconds * 1e3:8.2f} ms   {seconds / args.leaves * 1e6:6.2f} µs a leaf")


if __name__ == "__main__":
    main()
