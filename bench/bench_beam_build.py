"""Benchmark: the corpus build on Apache Beam's DirectRunner with 2 worker processes against the
local build with ``--workers 2``, the same inputs, side by side in one run.

    python bench/bench_beam_build.py [--mb 40] [--files 8] [--tokenizer bytes|bpe] [--vocab 8000]

Writes ``--files`` JSONL files of ``--mb`` megabytes in all (documents of about 3 KB cut from the
Python standard library's ``.py`` sources), then runs, as a user runs them, best of two,
alternating:

- ``pskd corpus build INPUTS -o DIR --workers 2``
- ``pskd corpus build INPUTS -o DIR --workers 2 --runner beam`` (DirectRunner,
  ``--direct_num_workers=2 --direct_running_mode=multi_processing``)

with the byte tokenizer, or (``--tokenizer bpe``) a byte-level BPE of ``--vocab`` ids trained here
on the same sources. Checks that both directories hold the same bytes, and prints both times and
Beam's as a ratio to the local build's (start-up included: Beam's is a few seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_corpus import MB, make_jsonl, stdlib_texts  # noqa: E402
from bench_hf_build import train  # noqa: E402


def build(inputs: list[str], out: str, extra: list[str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", "corpus", "build", *inputs, "-o", out, "--workers", "2",
                    *extra], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def same_bytes(a: str, b: str) -> bool:
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    return all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in names)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=40, help="megabytes of JSONL in all")
    parser.add_argument("--files", type=int, default=8, help="input files (shards)")
    parser.add_argument("--tokenizer", choices=("bytes", "bpe"), default="bytes")
    parser.add_argument("--vocab", type=int, default=8000, help="BPE vocabulary size (--tokenizer bpe)")
    args = parser.parse_args()
    d = tempfile.mkdtemp(prefix="bench_beam_build.")
    try:
        inputs = make_jsonl(d, args.files, args.mb * MB)
        extra = []
        if args.tokenizer == "bpe":
            extra = ["--tokenizer", train(os.path.join(d, "tokenizer.json"), stdlib_texts(), args.vocab)]
        local, beam = os.path.join(d, "local"), os.path.join(d, "beam")
        times = {"local": float("inf"), "beam": float("inf")}
        for _ in range(2):
            times["local"] = min(times["local"], build(inputs, local, extra))
            times["beam"] = min(times["beam"], build(inputs, beam, extra + ["--runner", "beam"]))
        identical = same_bytes(local, beam)
        size = sum(os.path.getsize(p) for p in inputs) / MB
        print(f"beam build: {size:.0f} MB of JSONL in {args.files} files, {args.tokenizer} tokenizer, 2 workers each "
              f"(the command, start-up included)")
        for name, command in (("local", "pskd corpus build --workers 2:"),
                              ("beam", "pskd corpus build --workers 2 --runner beam:")):
            print(f"  {command:45s} {times[name]:.2f} s ({size / times[name]:.1f} MB/s)")
        print(f"  beam / local = {times['beam'] / times['local']:.2f}x the time; same bytes: "
              f"{'yes' if identical else 'NO'}")
        return 0 if identical else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
