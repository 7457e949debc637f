"""Checkpoint speed and memory, as ratios measured side by side in one run (issue 4, PERFORMANCE.md).

The tree: 8 bf16 [8192, 4096] and 8 f32 [4096, 4096] arrays (1 GiB; ``--scale`` shrinks the first
axis of every array). Every case runs in its own process, page cache warm, and reports its time,
its CPU time (all threads; less sensitive to other jobs than the wall time) and its peak
resident memory beyond what the process held before the timed part. Each case is run
``--repeat`` times; the best time is kept (absolute times on a shared machine are noise).

    python bench/bench_checkpoint.py [--scale 1.0] [--repeat 3] [--dir /tmp/...]

safetensors and orbax-checkpoint (the ``bench`` extra) are compared when installed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pskd_jax import checkpoint as ck  # noqa: E402
from pskd_jax._os.digests import DIGESTS, file_digest  # noqa: E402
from pskd_jax._os.names import layout_path_for  # noqa: E402
from pskd_jax.checkpoint import (  # noqa: E402
    SaveOptions,
    restoring,
)
from pskd_jax.format import Reader  # noqa: E402

# ------------------------------------------------------------------------------------------------
# The tree


def shapes(scale: float) -> list[tuple[str, tuple[int, int], str]]:
    rows_bf16, rows_f32 = max(1, int(8192 * scale)), max(1, int(4096 * scale))
    return ([(f"bf16_{i}", (rows_bf16, 4096), "bfloat16") for i in range(8)]
            + [(f"f32_{i}", (rows_f32, 4096), "float32") for i in range(8)])


def make_tree(scale: float) -> dict:
    import ml_dtypes

    rng = np.random.default_rng(0)
    tree = {}
    for name, shape, dtype in shapes(scale):
        values = rng.random(shape, dtype=np.float32) - np.float32(0.5)
        tree[name] = values.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else values
    return tree


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> None:
    """Resets the kernel's high-water mark of this process (Linux ≥ 4.0), so the peak is the timed
    part's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def cpu_seconds() -> float:
    """User and system CPU time of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_since_reset() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return peak_rss_bytes()


# ------------------------------------------------------------------------------------------------
# Cases (each runs in its own process)


def case(name: str, directory: pathlib.Path, scale: float) -> dict:
    pskd = directory / "tree.psk.d"
    st = directory / "tree.safetensors"
    orbax_dir = directory / "orbax"
    size = os.path.getsize(pskd)
    data_offset = Reader(pskd, layout=ck.read_layout_file(layout_path_for(pskd)).layout).header.data_offset
    timed = {}

    if name in ("save", "save_durable", "write", "write_fsync", "safetensors_save", "orbax_save"):
        tree = ck.restore(pskd, as_numpy=True)
        if name == "orbax_save":
            import jax
            import orbax.checkpoint as ocp

            checkpointer = ocp.StandardCheckpointer()
            target = directory / "orbax_out"
            shutil.rmtree(target, ignore_errors=True)
        if name == "safetensors_save":
            import safetensors.numpy as stn
        for stale in ("out.psk.d", "out.raw", "out.safetensors"):  # every case writes a new file
            try:
                os.unlink(directory / stale)
            except FileNotFoundError:
                pass
        # No case pays for another's dirty pages: gigabytes left unwritten by the case before (the
        # peers' saves do not sync) throttle the next writer, which once made a plain write 3.4 s.
        os.sync()
        time.sleep(0.2)
        base = rss_bytes()
        reset_peak()
        cpu = cpu_seconds()
        start = time.perf_counter()
        if name in ("save", "save_durable"):
            ck.save(directory / "out.psk.d", tree, SaveOptions(durable=name == "save_durable", layout_file=False))
        elif name in ("write", "write_fsync"):
            with open(directory / "out.raw", "wb") as f:
                for value in tree.values():
                    f.write(memoryview(value.reshape(-1).view(np.uint8)))
                f.flush()
                if name == "write_fsync":
                    os.fsync(f.fileno())
        elif name == "safetensors_save":
            stn.save_file(tree, str(directory / "out.safetensors"))
        else:
            checkpointer.save(target, tree)
            checkpointer.wait_until_finished()
        timed["seconds"] = time.perf_counter() - start
        timed["cpu"] = cpu_seconds() - cpu
        timed["extra_rss"] = peak_since_reset() - base
        return timed

    if name in ("restore_jax", "read_device_put", "orbax_restore"):
        import jax

        jax.device_put(np.zeros(1)).block_until_ready()
    if name == "orbax_restore":
        import orbax.checkpoint as ocp

        checkpointer = ocp.StandardCheckpointer()
    if name == "safetensors_load":
        import safetensors.numpy as stn
    layout = ck.read_layout_file(layout_path_for(pskd)).layout
    digests = json.loads((directory / "tree.digests.json").read_text())
    base = rss_bytes()
    reset_peak()
    cpu = cpu_seconds()
    start = time.perf_counter()
    if name == "read":
        buffer = np.empty(size - data_offset, np.uint8)  # fresh, as numpy allocates (huge pages)
        with open(pskd, "rb", buffering=0) as f:
            f.seek(data_offset)
            f.readinto(buffer)
    elif name == "restore_numpy":
        result = ck.restore(pskd, as_numpy=True, layout=layout)
    elif name == "restore_numpy_1thread":
        restoring.PARALLEL_READ_BYTES = 1 << 62
        result = ck.restore(pskd, as_numpy=True, layout=layout)
    elif name == "restore_numpy_verified":  # with the checkpoint digest, as a manager restores
        result = ck.restore(pskd, as_numpy=True, layout=layout, **{ck.CHECKPOINT_DIGEST: digests[ck.CHECKPOINT_DIGEST]})
    elif name == "restore_numpy_verified_sha256":
        result = ck.restore(pskd, as_numpy=True, layout=layout, digests={"sha256": digests["sha256"]})
    elif name == "restore_jax":
        result = ck.restore(pskd, layout=layout)
        jax.block_until_ready(result)
    elif name == "read_device_put":
        arrays = []
        with open(pskd, "rb", buffering=0) as f:
            f.seek(data_offset)
            for _, shape, dtype in shapes(scale):
                import ml_dtypes

                out = np.empty(shape, ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
                f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
                arrays.append(jax.device_put(out))
        jax.block_until_ready(arrays)
    elif name == "safetensors_load":
        result = stn.load_file(str(st))
    elif name == "orbax_restore":
        result = checkpointer.restore(orbax_dir)
        jax.block_until_ready(result)
    else:
        raise SystemExit(f"unknown case {name}")
    timed["seconds"] = time.perf_counter() - start
    timed["cpu"] = cpu_seconds() - cpu
    timed["extra_rss"] = peak_since_reset() - base
    return timed


# ------------------------------------------------------------------------------------------------
# The driver


def prepare(directory: pathlib.Path, scale: float, have: dict) -> int:
    tree = make_tree(scale)
    result = ck.save(directory / "tree.psk.d", tree, SaveOptions(digest=ck.CHECKPOINT_DIGEST))
    digests = {name: file_digest(directory / "tree.psk.d", name) for name in DIGESTS}
    assert digests[ck.CHECKPOINT_DIGEST] == result.digests[ck.CHECKPOINT_DIGEST]
    (directory / "tree.digests.json").write_text(json.dumps(digests))
    if have["safetensors"]:
        import safetensors.numpy as stn

        stn.save_file(tree, str(directory / "tree.safetensors"))
    return result.bytes


def inputs_of(name: str, directory: pathlib.Path) -> list[pathlib.Path]:
    """The files a case reads: the checkpoint and its side files for every case (the save cases
    restore the tree from it first), and the other library's copy for its own cases."""
    files = [directory / "tree.psk.d", directory / "tree.layout.json", directory / "tree.digests.json"]
    if name == "safetensors_load":
        files.append(directory / "tree.safetensors")
    if name == "orbax_restore":
        files += sorted(p for p in (directory / "orbax").rglob("*") if p.is_file())
    return files


def run_case(name: str, directory: pathlib.Path, scale: float) -> dict:
    # A warm page cache for the case's inputs only, read into one reused buffer: reading every
    # file of the directory (3 GiB) through a fresh buffer a read before each case made the
    # next case's time swing 2-4x here (the memory churn lands on it).
    buffer = bytearray(64 << 20)
    for path in inputs_of(name, directory):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
    del buffer
    result = subprocess.run([sys.executable, __file__, "--case", name, "--dir", str(directory), "--scale", str(scale)],
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir")
    parser.add_argument("--case")
    parser.add_argument("--cases", help="a comma list of the cases to run (default: all)")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.case, pathlib.Path(args.dir), args.scale)))
        return
    have = {m: _importable(m) for m in ("safetensors", "orbax.checkpoint")}
    directory = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench_checkpoint."))
    directory.mkdir(parents=True, exist_ok=True)
    size = prepare(directory, args.scale, have)
    if have["orbax.checkpoint"]:
        subprocess.run([sys.executable, "-c", _ORBAX_SETUP, str(directory)], check=True, timeout=900)
    cases = ["read", "restore_numpy", "restore_numpy_verified", "restore_numpy_verified_sha256",
             "read_device_put", "restore_jax",
             "write", "save", "write_fsync", "save_durable"]
    if have["safetensors"]:
        cases += ["safetensors_load", "safetensors_save"]
    if have["orbax.checkpoint"]:
        cases += ["orbax_restore", "orbax_save"]
    if args.cases:
        cases = args.cases.split(",")
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name in cases:  # interleaved, so drift hits every case alike
            got = run_case(name, directory, args.scale)
            if "error" in got:
                best.setdefault(name, got)
                continue
            if name not in best or "error" in best[name] or got["seconds"] < best[name]["seconds"]:
                best[name] = {**got, "extra_rss": min(got["extra_rss"], best.get(name, {}).get("extra_rss", 1 << 62))}
    print(f"checkpoint: {size / 2**30:.3f} GiB ({size} bytes), best of {args.repeat}, in {directory}")
    for name in cases:
        entry = best[name]
        if "error" in entry:
            print(f"  {name:30s} error: {entry['error']}")
        else:
            print(f"  {name:30s} {entry['seconds']:7.3f} s   cpu {entry['cpu']:6.3f} s   "
                  f"peak RSS +{entry['extra_rss'] / 2**20:8.1f} MiB")
    t = {k: v.get("seconds") for k, v in best.items()}

    def ratio(label: str, a: str, b: str, bound: str) -> None:
        if t.get(a) and t.get(b):
            print(f"  {label:58s} {t[a] / t[b]:6.2f}   (held to {bound})")

    print("ratios:")
    ratio("restore to numpy / raw readinto", "restore_numpy", "read", "≤ 1.2")
    ratio("safetensors load_file / restore to numpy", "safetensors_load", "restore_numpy", "≥ 2")
    ratio("orbax restore / restore to numpy", "orbax_restore", "restore_numpy", "≥ 3")
    ratio("restore to JAX / (raw read + device_put)", "restore_jax", "read_device_put", "≤ 1.3")
    ratio(f"verified restore ({ck.CHECKPOINT_DIGEST}) / restore", "restore_numpy_verified", "restore_numpy", "≤ 2")
    ratio("verified restore (sha256) / restore", "restore_numpy_verified_sha256", "restore_numpy", "—")
    ratio("save / plain write", "save", "write", "≤ 1.1")
    ratio("durable save / write + fsync", "save_durable", "write_fsync", "≤ 1.1")
    ratio("safetensors save_file / save", "safetensors_save", "save", "≥ 1")
    ratio("orbax save / save", "orbax_save", "save", "—")
    if "restore_numpy" in best and "extra_rss" in best["restore_numpy"]:
        print(f"  {'peak RSS of restore to numpy / checkpoint size':58s} "
              f"{best['restore_numpy']['extra_rss'] / size:6.2f}   (held to ≤ 1.05)")
    if "save" in best and "extra_rss" in best["save"]:
        print(f"  {'peak RSS of save beyond the tree':58s} {best['save']['extra_rss'] / 2**20:6.1f} MiB "
              "(held to ≤ 64 MiB)")
    if "safetensors_load" in best and "extra_rss" in best["safetensors_load"]:
        print(f"  {'peak RSS of safetensors load_file / checkpoint size':58s} "
              f"{best['safetensors_load']['extra_rss'] / size:6.2f}")
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)


_ORBAX_SETUP = f"""
import sys, pathlib, shutil
sys.path.insert(0, {str(ROOT)!r})
from pskd_jax import checkpoint as ck
import orbax.checkpoint as ocp
directory = pathlib.Path(sys.argv[1])
tree = ck.restore(directory / "tree.psk.d", as_numpy=True)
shutil.rmtree(directory / "orbax", ignore_errors=True)
checkpointer = ocp.StandardCheckpointer()
checkpointer.save(directory / "orbax", tree)
checkpointer.wait_until_finished()
"""


def _importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
