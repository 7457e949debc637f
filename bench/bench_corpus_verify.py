"""What verifying a corpus at start costs, against reading the corpus once.

    python bench/bench_corpus_verify.py [--mb 100] [--files 8] [--workers N] [--seq 256] [--batch 64]

Builds a byte-tokenized corpus from ``--mb`` megabytes of JSONL (the Python standard library's
sources, as ``bench_corpus.py`` makes them) in a temporary directory, then measures, page cache
warm, the best of three runs each:

- verify: ``verify_corpus`` with ``--workers`` threads and with one (sha256, every token below the
  vocabulary size, boundary tokens against documents, in one read of each shard), and sha256 alone
  with ``--workers`` threads (what verification cost before the content checks);
- open + verify: ``CorpusWindows(verify=True, access="pread")``, what ``apps/train_lm`` does at start;
- read once, sequentially: every token through ``CorpusWindows.stream`` (``pread``), one thread;
- read once as training does: every window of ``--seq`` tokens (stride ``--seq``, so each token
  once) in shuffled batches of ``--batch`` through ``CorpusWindows.gather`` (``pread``, train_lm's
  default), one thread.

It prints each time and the ratios: verification time over each way of reading the corpus once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from bench_corpus import MB, make_jsonl

from pskd_jax import corpus
from pskd_jax._os.digests import file_sha256
from pskd_jax.corpus import BuildOptions


def best(action, repeat: int = 3) -> float:
    seconds = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        action()
        seconds = min(seconds, time.perf_counter() - t0)
    return seconds


def hash_only(paths: list[str], workers: int) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(file_sha256, paths))


def read_sequentially(windows: corpus.CorpusWindows, piece: int = 1 << 22) -> None:
    for start in range(0, windows.total_tokens, piece):
        windows.stream(start, min(windows.total_tokens, start + piece))


def read_an_epoch(windows: corpus.CorpusWindows, batch: int) -> None:
    order = np.random.default_rng(0).permutation(len(windows))
    for first in range(0, len(order), batch):
        windows.gather(order[first : first + batch])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=100, help="megabytes of JSONL in all")
    parser.add_argument("--files", type=int, default=8, help="input files (shards)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    d = tempfile.mkdtemp(prefix="bench_corpus_verify.")
    try:
        inputs = make_jsonl(d, args.files, args.mb * MB)
        out = os.path.join(d, "corpus")
        manifest = corpus.build_corpus(inputs, out, BuildOptions(workers=args.workers, durable=False)).manifest.path
        m = corpus.read_manifest(manifest)
        paths = [m.shard_path(i) for i in range(len(m.shards))]
        size = sum(os.path.getsize(p) for p in paths)
        print(f"corpus:  {size / MB:.0f} MB of shards ({m.tokens} tokens of u16) in {len(paths)} files, "
              f"{os.cpu_count()} CPUs, page cache warm")
        hash_only(paths, args.workers)  # warm the page cache
        verify = best(lambda: corpus.verify_corpus(manifest, workers=args.workers))
        verify_one = best(lambda: corpus.verify_corpus(manifest, workers=1))
        hashed = best(lambda: hash_only(paths, args.workers))
        opened = best(lambda: corpus.CorpusWindows(manifest, seq=args.seq, verify=True, workers=args.workers,
                                                   access="pread").close())
        print(f"verify:  {args.workers} threads {verify:.3f} s ({size / MB / verify:.0f} MB/s); 1 thread "
              f"{verify_one:.3f} s; sha256 alone, {args.workers} threads {hashed:.3f} s: the content checks add "
              f"{100 * (verify / hashed - 1):.0f}%")
        print(f"train_lm start (CorpusWindows(verify=True), {args.workers} threads): {opened:.3f} s")
        with corpus.CorpusWindows(manifest, seq=args.seq, stride=args.seq, access="pread") as windows:
            sequential = best(lambda: read_sequentially(windows))
            epoch = best(lambda: read_an_epoch(windows, args.batch))
            print(f"read once, sequentially (stream, pread, 1 thread): {sequential:.3f} s "
                  f"({size / MB / sequential:.0f} MB/s); verify costs {verify / sequential:.2f}x that")
            print(f"read once as training does ({len(windows)} windows of {args.seq} tokens in shuffled batches of "
                  f"{args.batch}, gather, pread, 1 thread): {epoch:.3f} s; verify costs {verify / epoch:.2f}x that")
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
