"""Benchmark of sharded corpora: build, verify, and window batches.

    python bench/bench_corpus.py [--mb 200] [--files 8] [--workers N] [--seq 256] [--batch 64]

Makes ``--files`` JSONL files holding ``--mb`` megabytes of JSON text in all (the Python standard
library's UTF-8 ``.py`` sources cut into documents of about 3 KB, repeated to size) in a temporary
directory, and measures, side by side in one run:

- build: ``pskd corpus build`` (the command, as a user runs it) with ``--workers N``, in MB of JSONL
  per second per worker, and the per-shard function alone in this process (one worker, no start-up);
  best of two; target ≥ 20 MB/s per worker with the byte tokenizer;
- verify: ``verify_corpus`` with N threads against N ``sha256sum`` processes over the same shard
  files (split between them as evenly as bytes allow), page cache warm, best of three; target ≥ 0.8×;
- windows: random batches of ``--batch`` windows of ``--seq`` tokens gathered from the corpus
  (``CorpusWindows``) against the same windows from one ``lm-windows`` file (``Reader.gather``),
  the same index batches in the same order, interleaved in short rounds, the best round of each;
  target ≥ 0.8×.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import pskd_jax  # noqa: E402
from pskd_jax import corpus  # noqa: E402
from pskd_jax.corpus import BuildOptions  # noqa: E402
from pskd_jax.data.windows import lm_window_records, window_type  # noqa: E402

MB = 1_000_000


def stdlib_texts() -> list[str]:
    texts = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
        if "site-packages" in path:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def make_jsonl(directory: str, files: int, size: int) -> list[str]:
    """``files`` JSONL files of about ``size / files`` bytes each: documents of ~3 KB of source."""
    docs = []
    for text in stdlib_texts():
        docs += [text[i : i + 3000] for i in range(0, len(text), 3000)]
    paths, k = [], 0
    for f in range(files):
        path = os.path.join(directory, f"part-{f:03d}.jsonl")
        written = 0
        with open(path, "w", encoding="utf-8") as out:
            while written < size // files:
                line = json.dumps({"id": k, "text": docs[k % len(docs)]}, ensure_ascii=False) + "\n"
                out.write(line)
                written += len(line.encode("utf-8"))
                k += 1
        paths.append(path)
    return paths


def bench_build(inputs: list[str], out: str, workers: int, repeat: int = 2) -> dict:
    """The per-shard function alone in this process (the kernel's own speed, one worker), and the
    command, start-up and all, with ``workers`` processes; the best of ``repeat`` runs each (other
    people's work on a shared machine only ever slows a run)."""
    size = sum(os.path.getsize(p) for p in inputs)
    one = seconds = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        corpus.build_shard(inputs[0], out + "-one.psk.d", BuildOptions(tokenizer=corpus.Tokenizer.bytes()))
        one = min(one, time.perf_counter() - t0)
        os.unlink(out + "-one.psk.d")
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", "corpus", "build", *inputs, "-o", out, "--workers",
                        str(workers)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        seconds = min(seconds, time.perf_counter() - t0)
    return {"mb": size / MB, "seconds": seconds, "per_worker": size / MB / seconds / workers,
            "one_shard": os.path.getsize(inputs[0]) / MB / one}


def sha256sum_seconds(paths: list[str], workers: int) -> float:
    """N ``sha256sum`` processes at once, the files dealt out largest first to the lightest."""
    groups: list[list[str]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for p in sorted(paths, key=os.path.getsize, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(p)
        loads[i] += os.path.getsize(p)
    t0 = time.perf_counter()
    children = [subprocess.Popen(["sha256sum", *g], stdout=subprocess.DEVNULL) for g in groups if g]
    for c in children:
        if c.wait() != 0:
            raise SystemExit("sha256sum failed")
    return time.perf_counter() - t0


def bench_verify(manifest: str, workers: int) -> dict:
    m = corpus.read_manifest(manifest)
    paths = [m.shard_path(i) for i in range(len(m.shards))]
    size = sum(os.path.getsize(p) for p in paths)
    ours, theirs = [], []
    for _ in range(3):
        theirs.append(sha256sum_seconds(paths, workers))
        t0 = time.perf_counter()
        corpus.verify_corpus(manifest, workers=workers)
        ours.append(time.perf_counter() - t0)
    return {"mb": size / MB, "ours": size / MB / min(ours), "sha256sum": size / MB / min(theirs)}


def bench_windows(manifest: str, directory: str, seq: int, batch: int, batches: int) -> dict:
    windows = corpus.CorpusWindows(manifest, seq=seq)
    stream = windows.stream(0, windows.total_tokens)
    path = os.path.join(directory, "windows.psk.d")
    with pskd_jax.Writer(path, window_type(windows.vocab_size, seq)) as writer:
        for records in lm_window_records(stream, seq, seq):
            writer.append((records[:, 0], records[:, 1]))
    del stream
    reader = pskd_jax.Reader(path)
    assert len(reader) == len(windows)
    order = [pskd_jax.shuffle_order(len(reader), seed=0, epoch=1, start=j * batch, stop=(j + 1) * batch)
             for j in range(batches)]
    for a, b in zip(windows.gather(order[0]), reader.gather(order[0])):
        assert np.array_equal(a, b), "the corpus and the file disagree"
    # Interleaved in short rounds, the best round of each kept: a burst of someone else's work
    # then slows both alike instead of one.
    rates: dict[str, float] = {"corpus": 0.0, "file": 0.0}
    step = max(1, batches // 10)
    for _ in range(3):
        for first in range(0, batches, step):
            for name, source in (("file", reader), ("corpus", windows)):
                t0 = time.perf_counter()
                for indices in order[first : first + step]:
                    source.gather(indices)
                rates[name] = max(rates[name], len(order[first : first + step]) / (time.perf_counter() - t0))
    return {"windows": len(windows), "shards": len(windows.manifest.shards), **rates}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="megabytes of JSONL in all")
    parser.add_argument("--files", type=int, default=8, help="input files (shards)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=2000)
    args = parser.parse_args()
    d = tempfile.mkdtemp(prefix="bench_corpus.")
    try:
        inputs = make_jsonl(d, args.files, args.mb * MB)
        out = os.path.join(d, "corpus")
        b = bench_build(inputs, out, args.workers)
        print(f"build:   {b['mb']:.0f} MB of JSONL into {args.files} shards in {b['seconds']:.2f} s with "
              f"{args.workers} workers (the command, start-up included): {b['per_worker']:.1f} MB/s per worker "
              f"[target >= 20]; one shard in this process: {b['one_shard']:.1f} MB/s")
        manifest = os.path.join(out, "shards.json")
        v = bench_verify(manifest, args.workers)
        print(f"verify:  {v['mb']:.0f} MB of shards, {args.workers} workers: {v['ours']:.0f} MB/s vs sha256sum "
              f"{v['sha256sum']:.0f} MB/s = {v['ours'] / v['sha256sum']:.2f}x [target >= 0.8]")
        w = bench_windows(manifest, d, args.seq, args.batch, args.batches)
        print(f"windows: batches of {args.batch} x {args.seq} tokens over {w['windows']} windows in {w['shards']} "
              f"shards: corpus {w['corpus']:.0f}/s vs one lm-windows file {w['file']:.0f}/s = "
              f"{w['corpus'] / w['file']:.2f}x [target >= 0.8]")
        ok = b["per_worker"] >= 20 and v["ours"] >= 0.8 * v["sha256sum"] and w["corpus"] >= 0.8 * w["file"]
        print("corpus targets: " + ("met" if ok else "NOT met"))
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
