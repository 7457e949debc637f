"""The loader's figures, measured side by side in one run (issue 3, "Speed and memory").

    python bench/bench_loader.py [--mb 400] [--seconds 2] [--rounds 3] [--steps 300]
                                 [--small-mb 10] [--large-mb 1000] [--step-ms 50] [--train-steps 60]

A file of windows of ``--seq`` u16 tokens (``idx[65536][seq: 1025]``) is written to a temporary
directory and read back from the page cache:

1. Random host batches of ``--batch`` windows. Ours: the batch's shuffle order
   (``Pipeline.iter_batches``, the keyed Feistel permutation) and ``Reader.gather``, both counted.
   Against: an open ``np.memmap`` fancy-indexed with ``starts[:, None] + arange(T)`` (the best
   plain idiom; its order is a permutation drawn once, sliced for free); grain's
   ``MapDataset.source(...).shuffle(seed).batch(B)`` indexed batch by batch, over a plain
   ``np.memmap`` source and over a ``pskd_jax.Reader`` (both with ``__len__``/``__getitem__``);
   and ``np.copyto`` of the same bytes between ready buffers, the limit. Held to ≥ 2× numpy and
   ≥ 10× grain.
2. Device batches: the Loader's rate (batches the consumer receives a second, CPU device) against
   a bare loop of ``jax.device_put`` (one call a batch) on 16 ready-made host batches of the same
   shape, gathered by the same Reader (≥ 0.9×; the bare loop is run before and after each Loader
   round, and each Loader round is compared with the mean of those two), with the Reader mapping
   the file and with ``access="pread"``, and what one batch costs the loader's producer thread,
   part by part; then the CPU a batch costs the whole process (all threads) in each mode and the
   most this machine's cores can deliver at that cost, and the CPU of a pread group's reads alone.
   Every gather fills a 64-byte-aligned array, which the CPU backend's
   ``device_put`` takes without a copy: the bare loop's batches are those too (its fastest case).
3. Resident memory of a training-like loop (a jitted step consuming Loader batches for
   ``--steps`` steps) over a ``--small-mb`` and a ``--large-mb`` file, each in its own process,
   with the Reader in each access mode: peak and growth of the whole RSS and of its anonymous
   part (held to ±10%: the total with ``access="pread"``, what ``apps/train_lm`` uses).
4. A training step of ``--step-ms`` (a jitted computation, then a sleep to the step's length)
   fed by the Loader: the time the step waited for data over the total (≤ 1%).

Rates are the median of ``--rounds`` interleaved rounds; absolute times drift ±30% on a shared
machine, so only the ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pskd_jax
from pskd_jax.pipeline import Pipeline, parse_pipeline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleaved import load_text  # bench/interleaved.py, beside this script

VOCAB = 65536
SEED = 1
MIB = 1 << 20


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def write_windows(path: str, mb: float, seq: int) -> int:
    """A file of random windows of ``seq`` u16 tokens, about ``mb`` MB; returns the count."""
    count = max(1, int(mb * 1e6) // (2 * seq))
    rng = np.random.default_rng(0)
    with pskd_jax.Writer(path, f"idx[{VOCAB}][seq: {seq}]", durable=False) as writer:
        for start in range(0, count, 4096):
            n = min(4096, count - start)
            writer.append(rng.integers(0, VOCAB, size=(n, seq), dtype=np.uint16))
    return count


def warm_page_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def pipeline_for(path: str, batch: int) -> Pipeline:
    directory, name = os.path.split(path)
    return parse_pipeline(f'stream "{name}" |> shuffle(seed = {SEED}) |> batch(B = {batch})', base_dir=directory)


def rates(steps: dict, seconds: float, rounds: int) -> dict[str, float]:
    """Calls per second of each step: the median of ``rounds`` interleaved rounds of about
    ``seconds / rounds`` each (so that a slow spell of a shared machine hits every step)."""
    per_round = seconds / rounds
    measured: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(5):
            step()
    for _ in range(rounds):
        for name, step in steps.items():
            calls, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < per_round:
                for _ in range(10):
                    step()
                calls += 10
            measured[name].append(calls / elapsed)
    return {name: float(np.median(values)) for name, values in measured.items()}


# --------------------------------------------------------------------------------------------
# 1. Random host batches


class MemmapWindows:
    """What a grain user writes over the file: a random-access source on an open ``np.memmap``."""

    def __init__(self, path: str, offset: int, count: int, seq: int):
        self._windows = np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(count, seq))

    def __len__(self) -> int:
        return len(self._windows)

    def __getitem__(self, index: int) -> np.ndarray:
        return np.array(self._windows[index])


def host_batches(path: str, count: int, args: argparse.Namespace) -> None:
    try:
        import grain
    except ImportError:  # a bench extra, never a dependency
        grain = None

    B, T = args.batch, args.seq
    reader = pskd_jax.Reader(path)
    pread_reader = pskd_jax.Reader(path, access="pread")
    batches = pipeline_for(path, B).iter_batches(count)
    pread_batches = pipeline_for(path, B).iter_batches(count)

    def ours():
        _, indices = next(batches)
        reader.gather(indices)

    def ours_pread():
        _, indices = next(pread_batches)
        pread_reader.gather(indices)

    memmap = np.memmap(path, dtype=np.uint16, mode="r", offset=reader.header.data_offset)
    arange = np.arange(T)
    order = np.random.default_rng(SEED).permutation(count)  # drawn once, outside the timing
    per_epoch = count // B
    numpy_position = [0]

    def numpy_fancy():
        j = numpy_position[0] = (numpy_position[0] + 1) % per_epoch
        starts = order[j * B : (j + 1) * B] * T
        np.asarray(memmap[starts[:, None] + arange])

    def grain_batches(source):
        dataset = grain.MapDataset.source(source).shuffle(seed=SEED).batch(B, drop_remainder=True)
        position = [0]

        def step():
            dataset[position[0]]
            position[0] += 1

        return step

    source, destination = np.empty((B, T), np.uint16), np.empty((B, T), np.uint16)

    def copyto():
        np.copyto(destination, source)

    names = {
        "ours": "pskd_jax: Pipeline order + Reader.gather",
        "ours_pread": "the same, Reader(access=\"pread\")",
        "numpy": "np.memmap[starts[:, None] + arange(T)]",
        "grain_memmap": "grain MapDataset shuffle+batch, np.memmap source",
        "grain_reader": "grain MapDataset shuffle+batch, Reader source",
        "copyto": "np.copyto of the same bytes (the limit)",
    }
    steps = {"ours": ours, "ours_pread": ours_pread, "numpy": numpy_fancy, "copyto": copyto}
    if grain is not None:
        steps["grain_memmap"] = grain_batches(MemmapWindows(path, reader.header.data_offset, count, T))
        steps["grain_reader"] = grain_batches(reader)
    # Every step gets the same wall time: grain, ~10-50× slower, still makes hundreds of batches.
    measured = rates(steps, args.seconds, args.rounds)
    print(f"1. random host batches of {B} windows of {T} u16 tokens, {count * 2 * T / 1e6:.0f} MB file in page cache")
    for key, name in names.items():
        if key in measured:
            print(f"  {name:52s} {measured[key]:9.0f} batches/s")
    ours_rate = measured["ours"]
    to_numpy = ours_rate / measured["numpy"]
    print(f"  ours / numpy fancy indexing:      {to_numpy:6.2f}×   target ≥ 2×   ({verdict(to_numpy >= 2)})")
    if grain is None:
        print("  ours / grain: not measured, grain is not installed (pip install grain)")
    else:
        to_grain = ours_rate / max(measured["grain_memmap"], measured["grain_reader"])
        print(f"  ours / grain (the faster source): {to_grain:6.2f}×   target ≥ 10×  ({verdict(to_grain >= 10)})")
    print(f"  ours / np.copyto limit:           {ours_rate / measured['copyto']:6.2f}")
    print(f"  access=\"pread\" / numpy:           {measured['ours_pread'] / measured['numpy']:6.2f}×   "
          "(the mode whose resident memory stays flat, part 3)")
    reader.close()
    pread_reader.close()


# --------------------------------------------------------------------------------------------
# 2. Device batches


def device_batches(path: str, count: int, args: argparse.Namespace) -> None:
    import jax

    from pskd_jax.loader import Loader
    from pskd_jax.loader.placing import put_on_default_device

    B, T = args.batch, args.seq
    reader = pskd_jax.Reader(path)
    pread_reader = pskd_jax.Reader(path, access="pread")
    pipeline = pipeline_for(path, B)
    first = pipeline.iter_batches(count)
    ready = [reader.gather(next(first)[1]) for _ in range(16)]

    position = [0]

    def bare():
        jax.device_put(ready[position[0] % len(ready)]).block_until_ready()
        position[0] += 1

    cpu_a_batch: dict[str, list[float]] = {"mmap": [], "pread": []}

    def loader_rate(source, seconds: float) -> float:
        loader = Loader(source, pipeline)
        calls, started, cpu = -20, None, 0.0  # 20 batches for the thread to start and fill the queue
        for batch in loader:
            batch.block_until_ready()
            calls += 1
            if calls == 0:
                started, cpu = time.perf_counter(), time.process_time()
            elif calls > 0 and time.perf_counter() - started >= seconds:
                break
        rate = calls / (time.perf_counter() - started)
        cpu_a_batch[source.access].append((time.process_time() - cpu) / calls)  # (every thread's CPU)
        return rate

    per_round = args.seconds / args.rounds
    bare_rates, loader_rates, pread_rates = [], [], []
    rates({"bare": bare}, 0.2, 1)  # warm-up
    for _ in range(args.rounds):  # A B A C …: the limit measured between the cases it bounds
        bare_rates.append(rates({"bare": bare}, per_round, 1)["bare"])
        loader_rates.append(loader_rate(reader, per_round))
        bare_rates.append(rates({"bare": bare}, per_round, 1)["bare"])
        pread_rates.append(loader_rate(pread_reader, per_round))
    bare_rate, ours = float(np.median(bare_rates)), float(np.median(loader_rates))
    ours_pread = float(np.median(pread_rates))
    # Each Loader round against the bare rounds either side of it.
    mmap_ratios = [r / ((bare_rates[2 * k] + bare_rates[2 * k + 1]) / 2) for k, r in enumerate(loader_rates)]
    pread_ratios = [r / ((bare_rates[2 * k + 1] + bare_rates[min(2 * k + 2, len(bare_rates) - 1)]) / 2)
                    for k, r in enumerate(pread_rates)]

    # What one batch costs the producer thread, part by part, serially in this thread, as the
    # loader does it: the order of a group's batches, one gather of the group's rows, one x64
    # check and one move to the device a group (the Loader's own call: see pskd_jax.loader.placing).
    batches = pipeline.iter_batches(count)
    helper = Loader(reader, pipeline)
    group_size = helper.group_size
    parts = {"order": 0.0, "gather": 0.0, "x64 check": 0.0, "device_put": 0.0}
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < per_round:
        t0 = time.perf_counter()
        indices = np.concatenate([next(batches)[1] for _ in range(group_size)])
        t1 = time.perf_counter()
        host = reader.gather(indices)
        t2 = time.perf_counter()
        helper._check_fits_jax(host)
        t3 = time.perf_counter()
        for placed in put_on_default_device([host[k * B : (k + 1) * B] for k in range(group_size)]):
            placed.block_until_ready()
        t4 = time.perf_counter()
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[name] += dt
        n += group_size
    serial = sum(parts.values()) / n

    def spread(values: list[float]) -> str:
        return f"{min(values):.0f}–{max(values):.0f}"

    def ratio_spread(values: list[float]) -> str:
        return f"{np.median(values):5.2f}× ({min(values):.2f}–{max(values):.2f})"

    print(f"2. device batches ({B} × {T} u16, {B * T * 2 / 1e3:.0f} KB) on {jax.devices()[0].platform}, "
          f"{args.rounds} rounds A B A C, medians (min–max), page cache warm; {load_text()}")
    print(f"  bare loop of jax.device_put on ready host batches {bare_rate:9.0f} batches/s ({spread(bare_rates)})")
    print(f"  Loader (default prefetch), consumer side           {ours:9.0f} batches/s ({spread(loader_rates)})")
    print(f"  Loader over Reader(access=\"pread\")                {ours_pread:9.0f} batches/s ({spread(pread_rates)})")
    ratio, pread_ratio = float(np.median(mmap_ratios)), float(np.median(pread_ratios))
    print(f"  Loader / bare device_put: {ratio_spread(mmap_ratios)}   goal ≥ 0.9×   ({verdict(ratio >= 0.9)})")
    print(f"  the same with pread:      {ratio_spread(pread_ratios)}   goal ≥ 0.9×   ({verdict(pread_ratio >= 0.9)})")
    shown = ", ".join(f"{name} {seconds / n * 1e6:.0f} µs" for name, seconds in parts.items())
    print(f"  producer's serial cost a batch (in groups of {group_size}): {shown}; sum {serial * 1e6:.0f} µs "
          f"= {1 / serial:.0f} batches/s if nothing overlaps")
    cores_limit(pipeline, pread_reader, count, group_size, cpu_a_batch, bare_rate)
    reader.close()
    pread_reader.close()


def cores_limit(pipeline: Pipeline, pread_reader, count: int, group_size: int,
                cpu_a_batch: dict[str, list[float]], bare_rate: float) -> None:
    """The most a Loader can deliver on this machine's cores at the CPU a batch it was measured to
    spend (every thread's, in the rounds above), against the bare loop; and the CPU of a pread
    group's reads alone (the kernel's copies out of the page cache), measured here."""
    batches = pipeline.iter_batches(count)
    groups = [np.concatenate([next(batches)[1] for _ in range(group_size)]) for _ in range(20)]
    took = []
    for _ in range(3):
        started = time.process_time()
        for indices in groups:
            pread_reader.gather(indices)
        took.append((time.process_time() - started) / (len(groups) * group_size))
    reads = min(took)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for access, spent in cpu_a_batch.items():
        cpu = float(np.median(spent))
        best = cores / cpu
        print(f"  {access}: the process spends {cpu * 1e6:.0f} µs of CPU a batch (all threads); {cores} cores at "
              f"that cost give at most {best:.0f} batches/s = {best / bare_rate:.2f}× the bare loop")
    print(f"  a pread gather alone (groups of {group_size}): {reads * 1e6:.0f} µs of CPU a batch; at the bare loop's "
          f"{1e6 / bare_rate:.0f} µs a batch that is {reads * bare_rate / cores:.2f} of the {cores} cores' time, "
          "before the order, the move and the consumer")


# --------------------------------------------------------------------------------------------
# 3. Resident memory (each file in its own process)


def memory_fields() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in bytes (Linux /proc)."""
    wanted = {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"}
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in wanted:
                fields[key] = int(value.split()[0]) * 1024
    return fields


def memory_child(path: str, args: argparse.Namespace) -> None:
    """The training-like loop; prints one JSON line of memory figures."""
    import jax
    import jax.numpy as jnp
    import psutil

    from pskd_jax.loader import Loader

    reader = pskd_jax.Reader(path, access=args.access)
    pipeline = pipeline_for(path, args.batch)
    table = jnp.zeros((256, 8), jnp.float32)

    def loss_of(table, tokens):
        # Narrow on purpose: a (B, T, 64) f32 intermediate is 17 MB, allocated and freed every
        # step, and would add that much noise to every sample of RssAnon.
        predicted = table[tokens[:, :-1] % 256].sum(-1)  # (B, T - 1, 8) → (B, T - 1)
        return jnp.mean((predicted - (tokens[:, 1:] % 7).astype(jnp.float32)) ** 2)

    @jax.jit
    def step(table, tokens):
        loss, grad = jax.value_and_grad(loss_of)(table, tokens)
        return table - 1e-3 * grad, loss

    loader = Loader(reader, pipeline)
    peak_rss = peak_anon = 0
    start: dict[str, int] = {}
    for i, tokens in enumerate(loader):
        table, loss = step(table, tokens)
        loss.block_until_ready()
        fields = memory_fields()
        if i == 10:  # compiled, queue full: growth is counted from here
            start = fields
        if i >= 10:
            peak_rss, peak_anon = max(peak_rss, fields["VmRSS"]), max(peak_anon, fields["RssAnon"])
        if i + 1 == args.steps:
            break
    end = memory_fields()
    print(json.dumps({
        "samples": len(reader),
        "peak_rss": end["VmHWM"],
        "peak_rss_loop": peak_rss,
        "peak_anon": peak_anon,
        "growth_rss": end["VmRSS"] - start["VmRSS"],
        "growth_anon": end["RssAnon"] - start["RssAnon"],
        "end_file": end["RssFile"],
        "uss": psutil.Process().memory_full_info().uss,
    }))


def resident_memory(directory: str, args: argparse.Namespace) -> None:
    sizes = {"small": args.small_mb, "large": args.large_mb}
    paths = {label: os.path.join(directory, f"{label}.psk.d") for label in sizes}
    for label, mb in sizes.items():
        write_windows(paths[label], mb, args.seq)
        warm_page_cache(paths[label])
    modes = ("pread", "mmap")
    runs: dict[tuple[str, str], list[dict]] = {(mode, label): [] for mode in modes for label in sizes}
    for _ in range(args.memory_repeats):  # interleaved, so that a busy spell hits every case
        for mode in modes:
            for label, path in paths.items():
                command = [sys.executable, os.path.abspath(__file__), "--memory-child", path,
                           "--steps", str(args.steps), "--batch", str(args.batch), "--access", mode]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                runs[mode, label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for path in paths.values():
        os.remove(path)
    median = {case: {key: float(np.median([run[key] for run in found])) for key in found[0]}
              for case, found in runs.items()}
    print(f"3. resident memory of {args.steps} jitted steps fed by the Loader, each file in its own process "
          f"(MiB, median of {args.memory_repeats} runs)")
    for mode in modes:
        small, large = median[mode, "small"], median[mode, "large"]
        note = " (apps/train_lm's default)" if mode == "pread" else " (Reader's default)"
        print(f"  Reader(access={mode!r}){note}")
        print(f"  {'':36s} {args.small_mb:>7.0f} MB {args.large_mb:>7.0f} MB   large / small")
        rows = [
            ("peak RSS, total (VmHWM)", "peak_rss", True),
            ("peak RssAnon in the loop", "peak_anon", True),
            ("RssFile at the end (mapped file)", "end_file", True),
            ("USS at the end", "uss", True),
            ("RSS growth in the loop, total", "growth_rss", False),  # from ~0: a ratio means nothing
            ("RSS growth in the loop, anonymous", "growth_anon", False),
        ]
        for name, key, with_ratio in rows:
            ratio = f"{large[key] / small[key]:6.2f}" if with_ratio else "     —"
            print(f"  {name:36s} {small[key] / MIB:10.1f} {large[key] / MIB:10.1f}   {ratio}")
        anon = large["peak_anon"] / small["peak_anon"]
        total = large["peak_rss"] / small["peak_rss"]
        held = (f"target 0.9–1.1   ({verdict(0.9 <= total <= 1.1)})" if mode == "pread"
                else "(the map's pages: not held)")
        print(f"  peak total RSS, large / small:        {total:5.2f}   {held}")
        print(f"  peak anonymous memory, large / small: {anon:5.2f}   target 0.9–1.1   ({verdict(0.9 <= anon <= 1.1)})")
    print("  With mmap the file's pages count in RssFile as the loop visits them (one fault maps a whole")
    print("  large folio, so a few thousand random windows map ~all of the file); clean page cache, but")
    print("  resident. With pread the same page cache is filled and none of it is the process's.")



# --------------------------------------------------------------------------------------------
# 4. A step of --step-ms never waits


def step_never_waits(path: str, count: int, args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp

    from pskd_jax.loader import Loader

    reader = pskd_jax.Reader(path, access="pread")  # apps/train_lm's default: the slower gather
    table = jnp.zeros((256, 64), jnp.float32)

    @jax.jit
    def step(table, tokens):
        embedded = table[tokens % 256]
        loss = jnp.mean(embedded.sum(-1))
        return table - 1e-3 * loss, loss

    step(table, jnp.zeros((args.batch, args.seq), jnp.uint16))[1].block_until_ready()  # compile first
    step_seconds = args.step_ms / 1e3
    loader = Loader(reader, pipeline_for(path, args.batch))
    started = time.perf_counter()
    first_wait = None
    for i, tokens in enumerate(loader):
        if first_wait is None:
            first_wait = loader.waited_seconds
        t0 = time.perf_counter()
        table, loss = step(table, tokens)
        loss.block_until_ready()
        time.sleep(max(0.0, step_seconds - (time.perf_counter() - t0)))
        if i + 1 == args.train_steps:
            break
    total = time.perf_counter() - started
    waited = loader.waited_seconds
    steady = (waited - first_wait) / total
    print(f"4. {args.train_steps} steps of {args.step_ms:.0f} ms fed by the Loader over Reader(access=\"pread\") "
          f"({total:.2f} s)")
    print(f"  waited for data: {waited * 1e3:.1f} ms in all, {first_wait * 1e3:.1f} ms of it for the first batch")
    print(f"  waited / total, all batches:         {waited / total:7.3%}")
    print(f"  waited / total, after the first:     {steady:7.3%}   target ≤ 1%   ({verdict(steady <= 0.01)})")
    reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=400, help="size of the file of parts 1, 2 and 4")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1025)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measured rate (split in rounds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="steps of the memory loop")
    parser.add_argument("--memory-repeats", type=int, default=3, help="processes per file size in part 3")
    parser.add_argument("--small-mb", type=float, default=10)
    parser.add_argument("--large-mb", type=float, default=1000)
    parser.add_argument("--step-ms", type=float, default=50)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--only", choices=["1", "2", "3", "4"], action="append", help="run only these parts")
    parser.add_argument("--memory-child", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--access", default="mmap", help=argparse.SUPPRESS)  # of the memory child
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args)
        return
    parts = set(args.only or ["1", "2", "3", "4"])
    with tempfile.TemporaryDirectory() as directory:
        if parts & {"1", "2", "4"}:
            path = os.path.join(directory, "windows.psk.d")
            count = write_windows(path, args.mb, args.seq)
            warm_page_cache(path)
        if "1" in parts:
            host_batches(path, count, args)
        if "2" in parts:
            device_batches(path, count, args)
        if "4" in parts:
            step_never_waits(path, count, args)
        if "3" in parts:
            if parts & {"1", "2", "4"}:
                os.remove(path)  # leave only the memory loop's files in the page cache
            resident_memory(directory, args)


if __name__ == "__main__":
    main()
