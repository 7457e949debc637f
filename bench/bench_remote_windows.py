"""Random corpus windows from a bucket of an S3 server on the loopback interface.

    python bench/bench_remote_windows.py [--mtokens 16] [--shards 4] [--batch 64] [--seq 1024]
                                         [--batches 4] [--rounds 7]

Writes a corpus of ``--shards`` shards holding ``--mtokens`` million random byte-tokenizer tokens
(u16) in a temporary directory, starts moto's S3 server on 127.0.0.1 (``moto[server]``, in the
test extra) and puts the same shards and manifest in a bucket of it. Then, for the same random
batches of ``--batch`` windows of ``--seq`` tokens (``--batches`` batches a round), interleaved
round after round (A B C D, A B C D, …, after one warm-up each):

- local: ``CorpusWindows`` over the local shards (mapped, page cache warm);
- warm cache: ``CorpusWindows("s3://…/shards.json", cache_dir=…)``, its cache filled before (each
  shard is fetched when a gather first needs it);
- ranges: ``CorpusWindows("s3://…/shards.json")`` with no cache, each gather one batched call a
  shard, one request a contiguous run of the batch, the requests of a call in flight together;
- ranges merged: the same, with the client's own merging of runs less than 1 MiB apart (fewer
  requests, many more bytes);
- one request each: the same byte ranges (each window's T + 1 tokens) fetched one GET request
  after the other, the naive way to read windows from a bucket.

It prints each case's median seconds a round with the min–max, and the ratios: local over warm
cache (held to >= 0.8: the warm cache serves windows at least 0.8x as fast as local shards), and
one-request-each over each way of ranges. The time to open with a cold cache and gather every
window once (every shard fetched whole, concurrently, its sha256 checked as it is filled) is
printed once.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np

from pskd_jax._os.digests import file_sha256
from pskd_jax.corpus import CorpusWindows
from pskd_jax.corpus.manifest import Shard, write_manifest
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.format import byte_sources
from pskd_jax.storage import resolve

KEYS = {"AWS_ACCESS_KEY_ID": "benchkey", "AWS_SECRET_ACCESS_KEY": "benchsecret", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}


def make_corpus(directory: str, tokens: int, shards: int) -> str:
    tokenizer = Tokenizer.bytes()
    rng = np.random.default_rng(0)
    entries = []
    per = tokens // shards
    for i in range(shards):
        path = os.path.join(directory, f"shard-{i:05d}.psk.d")
        writer = ShardWriter(path, tokenizer, chunk_tokens=1 << 22, durable=False)
        data = rng.integers(0, 256, per, dtype=np.uint16)
        data[:: 997] = tokenizer.boundary  # a document every 997 tokens
        writer.append(data)
        writer.close()
        entries.append(Shard(os.path.basename(path), per, int(np.count_nonzero(data == tokenizer.boundary)),
                             file_sha256(path)))
    return write_manifest(os.path.join(directory, "shards.json"), tokenizer, entries, durable=False).path


def start_server() -> tuple[object, str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def upload(directory: str, endpoint: str, bucket: str) -> str:
    request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=60):
        pass
    for name in sorted(os.listdir(directory)):
        store, where = resolve(f"s3://{bucket}/corpus/{name}")
        with open(os.path.join(directory, name), "rb") as f:
            store.put(where.key, f.read())
    return f"s3://{bucket}/corpus/shards.json"


def window_ranges(windows: CorpusWindows, batch: np.ndarray) -> list[tuple[str, int, int]]:
    """(key, start, stop) of each window's T + 1 tokens in its shard (windows inside one shard)."""
    state = windows._state
    item = windows.dtype.itemsize
    out = []
    for w in batch.tolist():
        start = w * windows.stride
        k = int(np.searchsorted(state.offsets, start, side="right")) - 1
        source = state.sources[k]
        offset = int(state.data_offsets[k]) + (start - int(state.offsets[k])) * item
        out.append((source.key, offset, offset + (windows.seq + 1) * item))  # type: ignore[attr-defined]
    return out


def interleaved(runs: dict, rounds: int) -> dict[str, list[float]]:
    """Each run's seconds, every round, the runs taken in turn round after round (A B A B …,
    after one warm-up each), so that drift in the machine's load hits each alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mtokens", type=float, default=16, help="millions of tokens in the corpus")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=4, help="batches a round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        import moto.server  # noqa: F401
    except ImportError:
        print("skipped: needs moto's S3 server (pip install -e '.[test]', which installs moto[server])")
        return 0
    os.environ.update(KEYS)
    server, endpoint = start_server()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.mkdir(os.path.join(tmp, "local"))
            local = make_corpus(os.path.join(tmp, "local"), int(args.mtokens * 1e6), args.shards)
            url = upload(os.path.join(tmp, "local"), endpoint, "pskd-bench")
            cache = os.path.join(tmp, "cache")
            started = time.perf_counter()
            with CorpusWindows(url, seq=args.seq, cache_dir=cache) as cold:
                cold.gather(np.arange(len(cold)))  # the first gather of each shard fetches it
            cold_open = time.perf_counter() - started
            here = CorpusWindows(local, seq=args.seq)
            warm = CorpusWindows(url, seq=args.seq, cache_dir=cache)
            ranged = CorpusWindows(url, seq=args.seq)
            store, _ = resolve(url)
            rng = np.random.default_rng(1)
            offsets = here._state.offsets
            # Windows inside one shard (the rare one across a boundary is read from pieces by all).
            inside = np.flatnonzero(np.searchsorted(offsets, np.arange(len(here)) * args.seq, "right")
                                    == np.searchsorted(offsets, np.arange(len(here)) * args.seq + args.seq, "right"))
            batches = [rng.choice(inside, args.batch) for _ in range(args.batches)]
            expected = [here.gather(b) for b in batches]
            for source in (warm, ranged):
                for b, want in zip(batches, expected):
                    assert all(np.array_equal(x, y) for x, y in zip(source.gather(b), want))
            plans = [window_ranges(ranged, b) for b in batches]

            def one_request_each() -> None:
                for plan in plans:
                    for key, start, stop in plan:
                        store.read_ranges(key, [start], [stop])

            mapped_batches = [rng.choice(inside, args.batch) for _ in range(args.batches * 64)]
            # Two interleaved groups: the mapped cases take microseconds a batch, the remote ones
            # milliseconds, so the mapped ones read 64 times as many batches a round.
            times = interleaved({"local shards (mapped)": lambda: [here.gather(b) for b in mapped_batches],
                                 "warm cache (mapped)": lambda: [warm.gather(b) for b in mapped_batches]},
                                args.rounds * 3)
            def merged_by_the_client() -> None:
                byte_sources.COALESCE = 1 << 20  # the client's default: runs < 1 MiB apart in one request
                try:
                    [ranged.gather(b) for b in batches]
                finally:
                    byte_sources.COALESCE = exact

            exact = byte_sources.COALESCE
            times.update(interleaved({"byte ranges, batched": lambda: [ranged.gather(b) for b in batches],
                                      "ranges merged < 1 MiB": merged_by_the_client,
                                      "one GET a window": one_request_each}, args.rounds))
            size = here.total_tokens * 2 / 1e6
            print(f"random batches of {args.batch} windows of {args.seq} u16 tokens from {args.shards} shards "
                  f"({size:.0f} MB) in a bucket of moto's S3 server on loopback: the mapped cases "
                  f"{64 * args.batches} batches a round, {3 * args.rounds} rounds; the remote ones {args.batches} "
                  f"batches a round, {args.rounds} rounds; interleaved")
            print(f"  cold cache: opening and gathering every window once (every shard fetched whole, sha256 "
                  f"checked) {cold_open:.3f} s")
            for name, values in times.items():
                print(f"  {name:26s} {statistics.median(values):9.5f} s a round "
                      f"({min(values):.5f}–{max(values):.5f})")

            def ratio(a: str, b: str) -> str:
                rounds = [x / y for x, y in zip(times[a], times[b])]
                return (f"{statistics.median(times[a]) / statistics.median(times[b]):.2f} "
                        f"({min(rounds):.2f}–{max(rounds):.2f} by round)")

            print(f"  warm cache speed / local shards: {ratio('local shards (mapped)', 'warm cache (mapped)')} "
                  "(held to >= 0.8)")
            print(f"  batched ranges over one GET a window: {ratio('one GET a window', 'byte ranges, batched')}x "
                  "as fast")
            print(f"  ranges merged < 1 MiB over one GET a window: "
                  f"{ratio('one GET a window', 'ranges merged < 1 MiB')}x as fast")
            for source in (here, warm, ranged):
                source.close()
    finally:
        server.stop()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
