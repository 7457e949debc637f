"""What a verified restore costs through the checkpoint manager: ``CheckpointManager.restore()``
(which checks the digest recorded in the index while reading, the default) against
``restore(verify=False)``, on the same checkpoint, side by side in one run.

The checkpoint: 4 bf16 [8192, 2048] and 2 f32 [4096, 4096] arrays (256 MiB; ``--scale`` shrinks the
first axis of every array), saved once by a manager recording xxh3_128 and once by one recording
sha256. The page cache is warm (every file is read once before timing); the cases run interleaved
``--repeat`` times and the best time of each is kept (absolute times on a shared machine are
noise: the ratios are the figures).

    python bench/bench_manager.py [--scale 1.0] [--repeat 5] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pskd_jax.checkpoint import (  # noqa: E402
    CheckpointManager,
    SaveOptions,
)


def make_tree(scale: float) -> dict:
    import ml_dtypes

    rng = np.random.default_rng(0)
    rows_bf16, rows_f32 = max(1, int(8192 * scale)), max(1, int(4096 * scale))
    tree = {}
    for i in range(4):
        tree[f"bf16_{i}"] = (rng.random((rows_bf16, 2048), dtype=np.float32) - 0.5).astype(ml_dtypes.bfloat16)
    for i in range(2):
        tree[f"f32_{i}"] = rng.random((rows_f32, 4096), dtype=np.float32) - np.float32(0.5)
    return tree


def timed(function) -> float:
    gc.collect()
    start = time.perf_counter()
    result = function()
    seconds = time.perf_counter() - start
    del result
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir")
    parser.add_argument("--jax", action="store_true", help="also restore to JAX arrays (the default of restore())")
    args = parser.parse_args()
    directory = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench_manager."))
    tree = make_tree(args.scale)
    size = sum(value.nbytes for value in tree.values())
    managers = {}
    for digest in ("xxh3_128", "sha256"):
        manager = CheckpointManager(directory / digest, save_options=SaveOptions(digest=digest, durable=False))
        manager.save(1, tree)
        managers[digest] = manager
    del tree
    for manager in managers.values():  # warm the page cache
        manager.restore(as_numpy=True, verify=False)

    xxh3, sha = managers["xxh3_128"], managers["sha256"]
    cases = {
        "restore to numpy, verify=False": lambda: xxh3.restore(as_numpy=True, verify=False),
        "restore to numpy (verified, xxh3_128)": lambda: xxh3.restore(as_numpy=True),
        "restore to numpy (verified, sha256)": lambda: sha.restore(as_numpy=True),
    }
    if args.jax:
        import jax  # noqa: F401  (imported before the timed part)

        cases["restore to JAX, verify=False"] = lambda: xxh3.restore(verify=False)
        cases["restore to JAX (verified, xxh3_128)"] = lambda: xxh3.restore()
    best = {name: float("inf") for name in cases}
    for _ in range(args.repeat):
        for name, function in cases.items():  # interleaved, so drift hits every case alike
            best[name] = min(best[name], timed(function))
    print(f"checkpoint: {size / 2**20:.0f} MiB of leaves, best of {args.repeat}, in {directory}")
    for name, seconds in best.items():
        print(f"  {name:42s} {seconds:7.3f} s   {size / seconds / 2**30:6.2f} GiB/s")
    print("ratios:")
    plain = best["restore to numpy, verify=False"]
    print(f"  {'verified (xxh3_128, the default) / verify=False, to numpy':62s} "
          f"{best['restore to numpy (verified, xxh3_128)'] / plain:6.2f}")
    print(f"  {'verified (sha256) / verify=False, to numpy':62s} "
          f"{best['restore to numpy (verified, sha256)'] / plain:6.2f}")
    if args.jax:
        print(f"  {'verified (xxh3_128) / verify=False, to JAX':62s} "
              f"{best['restore to JAX (verified, xxh3_128)'] / best['restore to JAX, verify=False']:6.2f}")
    for manager in managers.values():
        manager.close()
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
