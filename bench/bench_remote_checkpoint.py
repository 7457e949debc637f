"""Checkpoints in a bucket: save and restore against the same client's raw put and raw ranged GET
of the same bytes, at the same concurrency and part size, through a real S3-protocol server on the
loopback interface (moto's, the ``test`` extra), measured side by side in one run (issue 18).

The tree: 8 bf16 and 8 f32 arrays of ``--gib`` GiB in all (default 1/32 GiB, so that ``make bench``
stays under a minute; the figure is taken at ``--gib 1``). The cases, interleaved round after
round (after one warm-up each), report their median and min–max seconds, and the CPU seconds
this process and the server's spent on each (which the machine's other work does not change):

- ``save``: ``checkpoint.save("s3://…", tree)`` (one multipart upload of the data, then its layout
  object), against ``raw put``: the client's ``put`` of the saved object's bytes, held in memory,
  with the same part size and concurrency;
- ``restore``: ``checkpoint.restore("s3://…", target)`` into numpy arrays (ranged reads straight
  into each leaf), and ``restore verified`` (the xxh3_128 digest of the whole object checked),
  against ``raw get``: the same part-sized ranged GETs of the whole object by the client, the same
  number in flight, each copied into one preallocated buffer.

    python bench/bench_remote_checkpoint.py [--gib 1] [--rounds 5] [--concurrency 16] [--part-mib 8]
                                            [--only save|restore]

The server runs in a process of its own (moto's threaded server, started by this one), which
both sides share; the ratios, not the absolute times, are the figure. (In this process, its
request handling would contend with the client for the interpreter lock, and the save, whose
pieces are handed to the client from Python, would pay for it where the raw put of one buffer
does not.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from interleaved import interleaved_times  # noqa: E402

import pskd_jax.storage as storage  # noqa: E402
from pskd_jax import checkpoint as ck  # noqa: E402
from pskd_jax.storage.config import client_store  # noqa: E402

BUCKET = "pskd-bench"


def make_tree(gib: float) -> dict:
    import ml_dtypes

    rng = np.random.default_rng(0)
    per_leaf = int(gib * (1 << 30)) // 16
    tree = {}
    for i in range(8):
        tree[f"bf16_{i}"] = (rng.random(per_leaf // 2, dtype=np.float32) - 0.5).astype(ml_dtypes.bfloat16)
        tree[f"f32_{i}"] = rng.random(per_leaf // 4, dtype=np.float32) - 0.5
    return tree


# The server's own process: moto's threaded server on a port of the system's choosing, the port
# written on its first line, stopped when its standard input closes.
_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


def start_server() -> subprocess.Popen:
    """moto's S3 server in a process of its own, so that its Python work does not contend with
    the client's for this process's interpreter lock (which would penalise whichever side of a
    ratio does more in Python); the bucket made. Stop it with :func:`stop_server`."""
    # (Objects held in memory: by default moto spools any object over 5 MiB to a temporary file,
    # and a multipart upload of 1 GiB then writes several GiB to the disk when it completes.)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1 << 40)})
    assert server.stdout is not None
    line = server.stdout.readline().strip()
    if not line.isdigit():
        stop_server(server)
        raise SystemExit(f"moto's server did not start (it said {line!r})")
    endpoint = f"http://127.0.0.1:{line}"
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "NO_PROXY": "127.0.0.1"})
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=60):
        pass
    return server


def stop_server(server: subprocess.Popen) -> None:
    if server.stdin is not None:
        server.stdin.close()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _cpu_seconds(server: subprocess.Popen) -> float:
    """The CPU seconds this process and the server's have used (the server's from ``/proc``, 0
    where there is none): what a case costs both sides, whatever else the machine runs."""
    mine = time.process_time()
    try:
        with open(f"/proc/{server.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return mine + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return mine


def shown(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} s ({min(times):.3f}–{max(times):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1 / 32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=storage.DEFAULT_OPTIONS.concurrency)
    parser.add_argument("--part-mib", type=float, default=storage.DEFAULT_OPTIONS.part_bytes / (1 << 20))
    parser.add_argument("--only", choices=("save", "restore"),
                        help="only the save and its raw put, or only the restores and their raw get")
    args = parser.parse_args()
    options = storage.StorageOptions(concurrency=args.concurrency, part_bytes=int(args.part_mib * (1 << 20)))
    storage.DEFAULT_OPTIONS = options  # (the options the toolkit's own stores are made with)
    server = start_server()
    try:
        tree = make_tree(args.gib)
        url = f"s3://{BUCKET}/ckpt/step.psk.d"
        result = ck.save(url, tree, ck.SaveOptions(digest="xxh3_128"))
        client = client_store("s3", BUCKET, options)
        import obstore

        data = bytes(obstore.get(client, "ckpt/step.psk.d").bytes())
        size = len(data)
        target = {name: np.zeros_like(value) for name, value in tree.items()}
        buffer = np.empty(size, np.uint8)
        part = options.part_bytes
        pool = concurrent.futures.ThreadPoolExecutor(options.concurrency)

        def raw_put() -> None:
            obstore.put(client, "raw/step.psk.d", data, chunk_size=max(part, 5 << 20),
                        max_concurrency=options.concurrency)

        def fetch(start: int) -> None:
            stop = min(size, start + part)
            got = obstore.get_range(client, "ckpt/step.psk.d", start=start, end=stop)
            np.copyto(buffer[start:stop], np.frombuffer(got, np.uint8))

        def raw_get() -> None:
            list(pool.map(fetch, range(0, size, part)))

        runs = {
            "save": lambda: ck.save(url, tree),
            "raw put": raw_put,
            "restore": lambda: ck.restore(url, target),
            "restore verified": lambda: ck.restore(url, target, digests=result.digests),
            "raw get": raw_get,
        }
        if args.only:
            runs = {name: run for name, run in runs.items() if (name in ("save", "raw put")) == (args.only == "save")}
        cpu: dict[str, list[float]] = {name: [] for name in runs}

        def counted(name: str, run):
            def counted_run() -> None:
                before = _cpu_seconds(server)
                run()
                cpu[name].append(_cpu_seconds(server) - before)
            return counted_run

        times = interleaved_times({name: counted(name, run) for name, run in runs.items()}, args.rounds)
        print(f"{size / (1 << 20):.1f} MiB object (8 bf16 + 8 f32 leaves), {options.concurrency} requests in flight, "
              f"parts of {part / (1 << 20):g} MiB, {args.rounds} rounds, loopback moto server in its own process")
        for name, values in times.items():
            print(f"  {name:18s} {shown(values)}  {size / statistics.median(values) / (1 << 20):7.1f} MiB/s"
                  f"   CPU {shown(cpu[name][1:])}")  # (the warm-up's left out)
        median = {name: statistics.median(values) for name, values in times.items()}
        work = {name: statistics.median(values[1:]) for name, values in cpu.items()}
        if "save" in median:
            print(f"save / raw put             {median['save'] / median['raw put']:.2f}  (goal ≤ 1.2)")
            print(f"  its CPU seconds          {work['save'] / work['raw put']:.2f}")
        if "restore" in median:
            print(f"restore / raw get          {median['restore'] / median['raw get']:.2f}  (goal ≤ 1.2)")
            print(f"restore verified / raw get {median['restore verified'] / median['raw get']:.2f}")
        # (after the figures: a check that fails does not lose them)
        if "restore" in runs:
            back = ck.restore(url, target, digests=result.digests)
            assert all(np.array_equal(back[k].view(np.uint8), tree[k].view(np.uint8)) for k in tree)
        else:  # (one whole GET: ranged ones of a large object are slow on this server)
            assert bytes(obstore.get(client, "ckpt/step.psk.d").bytes()) == data
        pool.shutdown()
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
