"""Runs every benchmark in bench/ in turn (``make bench``), each in its own process.

By default each runs at a small size that still shows its figure, so that the whole set takes a
few minutes on the 2-core development machine; ``--full`` runs each at the size ``bench/README.md``
records its figure at. ``--only NAME`` (repeatable) runs those scripts only. A script missing from
the table below runs with its own defaults.

    python bench/run_all.py [--full] [--only bench_checkpoint.py]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent

# script → (quick arguments, full arguments); a script may appear more than once (a list of pairs).
RUNS: dict[str, list[tuple[list[str], list[str]]]] = {
    "bench_beam_build.py": [(["--mb", "4", "--files", "2"], [])],
    "bench_checkpoint.py": [(["--part", "save", "--scale", "0.25", "--rounds", "5"],
                             ["--part", "save", "--scale", "1.0", "--rounds", "5"]),
                            (["--part", "restore", "--scale", "0.0625", "--rounds", "3"],
                             ["--part", "restore", "--scale", "1.0", "--rounds", "3"])],
    "bench_checkpoint_flax.py": [(["--layers", "2", "--width", "512", "--repeat", "2", "--rounds", "10"],
                                  ["--layers", "8", "--width", "2048", "--repeat", "3"])],
    "bench_corpus.py": [(["--mb", "16", "--files", "2", "--batches", "300"], [])],
    "bench_corpus_verify.py": [(["--mb", "16", "--files", "2"], [])],
    "bench_gather.py": [(["--mb", "50", "--seconds", "1"], [])],
    "bench_hf_build.py": [(["--mb", "2", "--rounds", "3"], ["--mb", "10", "--rounds", "5"]),
                          (["--process", "--mb", "4", "--rounds", "3"], ["--process", "--mb", "8", "--rounds", "7"])],
    "bench_loader.py": [(["--mb", "50", "--seconds", "1", "--rounds", "3", "--large-mb", "200", "--memory-repeats",
                          "1", "--steps", "100", "--train-steps", "20"], [])],
    "bench_manager.py": [(["--scale", "0.125", "--repeat", "3"], ["--jax"])],
    "bench_mixture.py": [(["--batches", "500", "--rounds", "5"], [])],
    "bench_restore_leaves.py": [(["--rounds", "20"], [])],
    "bench_segments.py": [(["--tokens", "4000000", "--batches", "128", "--rounds", "5"],
                           ["--tokens", "8000000", "--batches", "192", "--rounds", "7"])],
    "bench_shuffle.py": [(["--n", "1000000", "--batches", "500"], ["--n", "1000000", "--batches", "500"])],
    "bench_startup.py": [(["--rounds", "5"], [])],
    "bench_text.py": [(["--mb", "20", "--baseline-mb", "4", "--repeat", "1"], [])],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the sizes bench/README.md records its figures at")
    parser.add_argument("--only", action="append", help="run only this script (repeatable)")
    args = parser.parse_args()
    failed = []
    started = time.perf_counter()
    for script in sorted(HERE.glob("bench_*.py")):
        if args.only and script.name not in args.only:
            continue
        for quick, full in RUNS.get(script.name, [([], [])]):
            arguments = full if args.full else quick
            print(f"== {script.name} {' '.join(arguments)}", flush=True)
            began = time.perf_counter()
            done = subprocess.run([sys.executable, str(script), *arguments])
            print(f"   ({time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.2f})", flush=True)
            if done.returncode != 0:
                failed.append(script.name)
    print(f"all benchmarks: {time.perf_counter() - started:.0f} s")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
