"""Checkpoint speed and memory, as ratios measured side by side in one run (issue 4, issue 21).

The tree: 8 bf16 [8192, 4096] and 8 f32 [4096, 4096] arrays at ``--scale 1.0`` (1 GiB; the
default ``--scale 0.25`` shrinks the first axis of every array, 256 MiB).

Saves run in this one process, on the same arrays, interleaved round after round with the limit
they are held to: a plain write of the same buffers (one ``os.pwritev`` of all of them into a new
file: no copy, no Python per element), and for a durable save the same write + ``fsync``. Before
every timed run the output is removed and the dirty pages of the last are synced (``os.sync``),
so no case pays for another's writeback; the written pages stay in the page cache (the case
without ``fsync`` measures the write into it). The peak resident memory beyond the tree is read
from the kernel's high-water mark, reset before each save.

Restores run in a process of their own each (as a fresh process restores: its buffers are new
pages), interleaved, the checkpoint's file read into the page cache before each (page cache warm).

Every case prints its median time and the range of ``--rounds`` rounds, and every ratio the
ratio of the medians and the range of the rounds' ratios.

    python bench/bench_checkpoint.py [--scale 0.25] [--rounds 5] [--dir /tmp/...] [--part save|restore]

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
sys.path.insert(0, str(ROOT / "bench"))

from interleaved import interleaved_times, load_text, ratio_text, seconds_text  # noqa: E402

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
# Saves: one process, the same buffers, interleaved with the plain write they are held to


def plain_write(path: pathlib.Path, buffers: list[memoryview], durable: bool, preallocate: bool = False) -> None:
    """The limit: a new file, every buffer written by one ``os.pwritev`` (repeated only for what a
    call did not take: Linux writes at most 2 GiB - 4 KiB a call), then ``fsync`` if durable.
    ``preallocate``: the file's blocks reserved first (``posix_fallocate``), as ``save`` does."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if preallocate:
            os.posix_fallocate(fd, 0, sum(len(b) for b in buffers))
        views, offset = list(buffers), 0
        while views:
            done = os.pwritev(fd, views[:1024], offset)
            offset += done
            while views and done >= len(views[0]):
                done -= len(views[0])
                views.pop(0)
            if views and done:
                views[0] = views[0][done:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def save_part(directory: pathlib.Path, scale: float, rounds: int, peers: bool) -> tuple[dict, dict, int]:
    tree = make_tree(scale)
    buffers = [memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8)) for v in tree.values()]
    size = sum(len(b) for b in buffers)
    out = directory / "out"
    runs = {
        "write": lambda: plain_write(out, buffers, False),
        "save": lambda: ck.save(out, tree, SaveOptions(durable=False, layout_file=False)),
        f"save_{ck.CHECKPOINT_DIGEST}": lambda: ck.save(out, tree, SaveOptions(
            durable=False, layout_file=False, digest=ck.CHECKPOINT_DIGEST)),
        "write_fallocate": lambda: plain_write(out, buffers, False, preallocate=True),
        "write_fsync": lambda: plain_write(out, buffers, True),
        "save_durable": lambda: ck.save(out, tree, SaveOptions(durable=True, layout_file=False)),
    }
    if peers and _importable("safetensors"):
        import safetensors.numpy as stn

        runs["safetensors_save"] = lambda: stn.save_file(tree, str(out))
    peaks: dict[str, int] = {}

    def before(name: str) -> None:
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.sync()  # no case pays for the writeback of the one before
        peaks[name + ".base"] = rss_bytes()
        reset_peak()

    def measured(name: str, run):  # the peak beyond the tree of each run, the smallest kept
        def call() -> None:
            run()
            extra = peak_since_reset() - peaks[name + ".base"]
            peaks[name] = min(extra, peaks.get(name, extra))
        return call

    times = interleaved_times({name: measured(name, run) for name, run in runs.items()}, rounds, before=before)
    before("")
    return times, {k: v for k, v in peaks.items() if not k.endswith(".base")}, size


# ------------------------------------------------------------------------------------------------
# Restores (each in its own process)


def case(name: str, directory: pathlib.Path, scale: float) -> dict:
    pskd = directory / "tree.psk.d"
    st = directory / "tree.safetensors"
    orbax_dir = directory / "orbax"
    data_offset = Reader(pskd, layout=ck.read_layout_file(layout_path_for(pskd)).layout).header.data_offset
    timed = {}
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
    if name == "read":  # the limit: the same bytes into fresh buffers of the leaves' sizes, one preadv each
        fd = os.open(pskd, os.O_RDONLY)
        try:
            offset, result = data_offset, []
            for _, shape, dtype in shapes(scale):
                buffer = np.empty(shape, np.uint16 if dtype == "bfloat16" else np.float32)  # as restore allocates
                result.append(buffer)  # (all kept, as a restore's leaves are)
                view = memoryview(buffer.reshape(-1).view(np.uint8))
                while view:
                    got = os.preadv(fd, [view], offset)
                    offset, view = offset + got, view[got:]
        finally:
            os.close(fd)
    elif name == "restore_numpy":
        result = ck.restore(pskd, as_numpy=True, layout=layout)
    elif name == "restore_numpy_1thread":
        restoring.PARALLEL_READ_BYTES = 1 << 62
        result = ck.restore(pskd, as_numpy=True, layout=layout)
    elif name == "restore_numpy_verified":  # with the checkpoint digest, as a manager restores
        result = ck.restore(pskd, as_numpy=True, layout=layout,
                            digests={ck.CHECKPOINT_DIGEST: digests[ck.CHECKPOINT_DIGEST]})
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
    """The files a case reads: the checkpoint and its side files for every case, and the other
    library's copy for its own cases."""
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


def restore_part(directory: pathlib.Path, scale: float, rounds: int, have: dict) -> tuple[dict, dict, dict]:
    if have["orbax.checkpoint"]:
        subprocess.run([sys.executable, "-c", _ORBAX_SETUP, str(directory)], check=True, timeout=900)
    cases = ["read", "restore_numpy", "restore_numpy_verified", "restore_numpy_verified_sha256",
             "read_device_put", "restore_jax"]
    if have["safetensors"]:
        cases += ["safetensors_load"]
    if have["orbax.checkpoint"]:
        cases += ["orbax_restore"]
    times: dict[str, list[float]] = {name: [] for name in cases}
    peaks: dict[str, int] = {}
    errors: dict[str, str] = {}
    for _ in range(rounds):
        for name in cases:  # interleaved, so drift hits every case alike
            got = run_case(name, directory, scale)
            if "error" in got:
                errors.setdefault(name, got["error"])
                continue
            times[name].append(got["seconds"])
            peaks[name] = min(got["extra_rss"], peaks.get(name, got["extra_rss"]))
    return {k: v for k, v in times.items() if v}, peaks, errors


# ------------------------------------------------------------------------------------------------
# The driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, help=argparse.SUPPRESS)  # the old name of --rounds
    parser.add_argument("--dir")
    parser.add_argument("--part", choices=("save", "restore", "all"), default="all")
    parser.add_argument("--no-peers", action="store_true", help="leave safetensors and orbax out")
    parser.add_argument("--case")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.case, pathlib.Path(args.dir), args.scale)))
        return
    rounds = args.repeat or args.rounds
    have = {m: not args.no_peers and _importable(m) for m in ("safetensors", "orbax.checkpoint")}
    directory = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench_checkpoint."))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"bench_checkpoint: scale {args.scale}, {rounds} rounds, in {directory}; {load_text()}", flush=True)
    times: dict[str, list[float]] = {}
    peaks: dict[str, int] = {}
    errors: dict[str, str] = {}
    if args.part in ("save", "all"):
        got, got_peaks, size = save_part(directory, args.scale, rounds, have["safetensors"])
        times.update(got)
        peaks.update(got_peaks)
    if args.part in ("restore", "all"):
        size = prepare(directory, args.scale, have)
        got, got_peaks, errors = restore_part(directory, args.scale, rounds, have)
        times.update(got)
        peaks.update(got_peaks)
    print(f"tree: {size / 2**30:.3f} GiB ({size} bytes); saves in one process, page cache holding what "
          "they write, synced between runs; restores a process each, page cache warm")
    for name, values in times.items():
        print(f"  {name:30s} {seconds_text(values)}   peak RSS +{peaks.get(name, 0) / 2**20:8.1f} MiB")
    for name, error in errors.items():
        print(f"  {name:30s} error: {error}")

    def ratio(label: str, a: str, b: str, bound: str) -> None:
        if times.get(a) and times.get(b):
            print(f"  {label:58s} {ratio_text(times[a], times[b])}   (held to {bound})")

    print("ratios (median, range of the rounds' ratios):")
    ratio("save / plain write", "save", "write", "≤ 1.0")
    ratio(f"save with {ck.CHECKPOINT_DIGEST} (as a manager saves) / plain write",
          f"save_{ck.CHECKPOINT_DIGEST}", "write", "≤ 1.0")
    ratio("save / (fallocate + plain write)", "save", "write_fallocate", "— (what save does)")
    ratio("durable save / write + fsync", "save_durable", "write_fsync", "≤ 1.0")
    ratio("safetensors save_file / save", "safetensors_save", "save", "≥ 1")
    ratio("restore to numpy / raw readinto", "restore_numpy", "read", "≤ 1.2")
    ratio("safetensors load_file / restore to numpy", "safetensors_load", "restore_numpy", "≥ 2")
    ratio("orbax restore / restore to numpy", "orbax_restore", "restore_numpy", "≥ 3")
    ratio("restore to JAX / (raw read + device_put)", "restore_jax", "read_device_put", "≤ 1.3")
    ratio(f"verified restore ({ck.CHECKPOINT_DIGEST}) / restore", "restore_numpy_verified", "restore_numpy", "≤ 2")
    ratio("verified restore (sha256) / restore", "restore_numpy_verified_sha256", "restore_numpy", "—")
    if "restore_numpy" in peaks:
        print(f"  {'peak RSS of restore to numpy / checkpoint size':58s} "
              f"{peaks['restore_numpy'] / size:6.2f}   (held to ≤ 1.05)")
    for name in ("save", "save_durable", f"save_{ck.CHECKPOINT_DIGEST}"):
        if name in peaks:
            print(f"  {'peak RSS of ' + name + ' beyond the tree':58s} {peaks[name] / 2**20:6.1f} MiB "
                  "(held to ≤ 64 MiB)")
    if "safetensors_load" in peaks:
        print(f"  {'peak RSS of safetensors load_file / checkpoint size':58s} "
              f"{peaks['safetensors_load'] / size:6.2f}")
    print(f"({load_text()})")
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
