"""A flax nnx + optax train state saved and restored with pskd_jax and with orbax-checkpoint, as
ratios measured side by side in one run; and what matching leaves by key path costs.

The state: an nnx model of ``--layers`` Linear layers of ``--width``² float32 weights (with
dropout: a typed PRNG key in its RngState) and its ``optax.adamw`` optimizer (mu and nu: three
copies of the weights in all, and int32 counts), as ``nnx.state((model, optimizer))``. Restores go
into the abstract state of ``nnx.eval_shape`` (Variables wrapping ShapeDtypeStructs), giving
Variables holding jax.Arrays. Every case runs in its own process, page cache warm, interleaved,
``--repeat`` times; the best time is kept (absolute times on a shared machine are noise).

Key-path matching: a tree of ``--leaves`` small float32 leaves restored in-process, the target in
the saved order and in sorted order (both matched by key path through the layout file), and by
position from a file without its layout file; the median of many restores of each, interleaved.

    python bench/bench_checkpoint_flax.py [--layers 8] [--width 2048] [--repeat 3] [--leaves 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from interleaved import interleaved_medians  # bench/interleaved.py, beside this script

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make(layers: int, width: int):
    import optax
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(layers)])
            self.drop = nnx.Dropout(0.1, rngs=rngs)

    model = Model(nnx.Rngs(0, dropout=1))
    return model, nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)


def case(name: str, directory: pathlib.Path, layers: int, width: int) -> dict:
    import jax
    from flax import nnx

    from pskd_jax import checkpoint as ck

    jax.device_put(0).block_until_ready()
    if name.startswith("orbax"):
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
    if name.endswith("save"):
        state = nnx.state(make(layers, width))
        jax.block_until_ready(state)
        for stale in ("out.psk.d", "out.layout.json"):
            try:
                os.unlink(directory / stale)
            except FileNotFoundError:
                pass
        shutil.rmtree(directory / "orbax_out", ignore_errors=True)
        os.sync()
        time.sleep(0.2)
        start = time.perf_counter()
        if name == "pskd_save":
            ck.save(directory / "out.psk.d", state)
        else:
            checkpointer.save(directory / "orbax_out", state)
            checkpointer.wait_until_finished()
        return {"seconds": time.perf_counter() - start}
    abstract = nnx.state(nnx.eval_shape(lambda: make(layers, width)))
    start = time.perf_counter()
    if name == "pskd_restore":
        restored = ck.restore(directory / "state.psk.d", abstract)
    elif name == "pskd_restore_verified":
        digest = (directory / "state.xxh3").read_text().strip()
        restored = ck.restore(directory / "state.psk.d", abstract, digests={"xxh3_128": digest})
    else:
        restored = checkpointer.restore(directory / "orbax", abstract)
    jax.block_until_ready(restored)
    seconds = time.perf_counter() - start
    kernel = restored[0]["layers"][0]["kernel"]
    assert isinstance(kernel, nnx.Param) and isinstance(kernel[...], jax.Array)
    return {"seconds": seconds}


def prepare(directory: pathlib.Path, layers: int, width: int) -> int:
    from flax import nnx

    from pskd_jax import checkpoint as ck

    state = nnx.state(make(layers, width))
    result = ck.save(directory / "state.psk.d", state, ck.SaveOptions(digest="xxh3_128"))
    (directory / "state.xxh3").write_text(result.digests["xxh3_128"])
    import orbax.checkpoint as ocp

    shutil.rmtree(directory / "orbax", ignore_errors=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory / "orbax", state)
    checkpointer.wait_until_finished()
    return result.bytes


def run_case(name: str, directory: pathlib.Path, layers: int, width: int) -> dict:
    buffer = bytearray(64 << 20)  # a warm page cache for every input
    for path in [directory / "state.psk.d", directory / "state.layout.json",
                 *sorted(p for p in (directory / "orbax").rglob("*") if p.is_file())]:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
    del buffer
    result = subprocess.run([sys.executable, __file__, "--case", name, "--dir", str(directory), "--layers", str(layers),
                             "--width", str(width)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def key_path_matching(directory: pathlib.Path, leaves: int, rounds: int) -> dict:
    """Median seconds of restoring a tree of ``leaves`` small leaves: by key path with the target in
    the saved order, by key path with it sorted, and by position (no layout file)."""
    import numpy as np

    from pskd_jax import checkpoint as ck

    tree = {f"layer_{i:04d}_{'wb'[i % 2]}": np.full(64, i, np.float32) for i in reversed(range(leaves))}
    ck.save(directory / "keyed.psk.d", tree)
    ck.save(directory / "positional.psk.d", tree, ck.SaveOptions(layout_file=False))
    in_order = {k: np.zeros(64, np.float32) for k in tree}
    sorted_target = dict(sorted(in_order.items()))
    runs = {"key path, saved order": lambda: ck.restore(directory / "keyed.psk.d", in_order, as_numpy=True),
            "key path, sorted target": lambda: ck.restore(directory / "keyed.psk.d", sorted_target, as_numpy=True),
            "by position, no layout file": lambda: ck.restore(directory / "positional.psk.d", in_order, as_numpy=True)}
    return interleaved_medians(runs, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--dir")
    parser.add_argument("--case")
    args = parser.parse_args()
    directory = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench_checkpoint_flax."))
    if args.case:
        print(json.dumps(case(args.case, directory, args.layers, args.width)))
        return
    directory.mkdir(parents=True, exist_ok=True)
    size = prepare(directory, args.layers, args.width)
    cases = ["pskd_save", "orbax_save", "pskd_restore", "pskd_restore_verified", "orbax_restore"]
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name in cases:
            got = run_case(name, directory, args.layers, args.width)
            if "error" in got:
                best.setdefault(name, got)
            elif name not in best or "error" in best[name] or got["seconds"] < best[name]["seconds"]:
                best[name] = got
    print(f"flax nnx + optax adamw state: {size / 2**20:.1f} MiB ({args.layers} layers of {args.width}², "
          f"best of {args.repeat}), in {directory}")
    for name in cases:
        entry = best[name]
        print(f"  {name:26s} " + (f"error: {entry['error']}" if "error" in entry else f"{entry['seconds']:7.3f} s"))
    t = {k: v.get("seconds") for k, v in best.items()}
    print("ratios:")
    for label, a, b in (("orbax save / pskd_jax save", "orbax_save", "pskd_save"),
                        ("orbax restore / pskd_jax restore", "orbax_restore", "pskd_restore"),
                        ("orbax restore / pskd_jax verified restore", "orbax_restore", "pskd_restore_verified")):
        if t.get(a) and t.get(b):
            print(f"  {label:44s} {t[a] / t[b]:6.2f}   (held to > 1)")
    matching = key_path_matching(directory, args.leaves, args.rounds)
    base = matching["by position, no layout file"]
    print(f"key-path matching, {args.leaves} leaves, median of {args.rounds}:")
    for name, seconds in matching.items():
        print(f"  {name:30s} {seconds * 1e3:8.2f} ms   ({seconds / base:5.2f}× by position)")
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
