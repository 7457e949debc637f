"""Runs one fuzz target for a given number of minutes.

    python fuzz/run.py TARGET --minutes M [--engine atheris|mutate] [--workdir DIR]
    python fuzz/run.py --list

TARGET is one of ``fuzz/targets.py``'s TARGETS. The run starts from the target's valid seeds and
the matching files of ``testdata/hostile/``, and keeps its corpus under ``WORKDIR/TARGET/corpus``
(default ``out/fuzz``), so that a second run goes on where the first stopped.

A finding is an input on which a parser raised anything but ``PskdError`` (or answered wrongly, see
``Finding``), ran past the time limit, or ran out of memory (the fuzzing process runs under an
address-space limit, so an allocation out of proportion to the input is a ``MemoryError``). Each
distinct finding (exception type and the innermost frame of the toolkit) is saved once, as
``WORKDIR/TARGET/crashes/<signature>.bin`` with the traceback beside it in ``.txt``; the fuzzer
goes on after it. Timeouts and out-of-memory kills are saved by libFuzzer in the same directory
(``timeout-…``, ``oom-…``) and the run restarts for the time left. Once a finding is fixed, copy its
input to ``fuzz/regressions/TARGET-<name>.bin``: ``tests/robustness/test_fuzz_regressions.py`` replays them.

Engines: ``atheris`` (coverage-guided libFuzzer over instrumented Python; the default when the
``atheris`` package is installed) or ``mutate`` (random byte mutations of the seeds, no coverage;
needs nothing but the toolkit). At the end a summary (executions, restarts, findings) is printed
and written to ``WORKDIR/TARGET/summary.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import random
import re
import resource
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

TIMEOUT_S = 10  # one input may take at most this long
MEMORY_HEADROOM = 1 << 30  # address space above the fuzzing process's own at start
# The longest input, by target (4096 for the others).
MAX_LEN = {"container": 16384, "safetensors": 8192, "export": 16384, "diff": 16384}


# --------------------------------------------------------------------------------------------
# In the fuzzing process


class Recorder:
    """Saves each distinct finding once: the shortest input seen for its signature."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def record(self, error: BaseException, data: bytes) -> None:
        frames = traceback.extract_tb(error.__traceback__)
        ours = [f for f in frames if "pskd_jax" in f.filename] or frames
        where = f"{os.path.basename(ours[-1].filename)}-{ours[-1].name}-{ours[-1].lineno}" if ours else "unknown"
        signature = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{type(error).__name__}-{where}")
        path = os.path.join(self.directory, signature + ".bin")
        if os.path.exists(path) and os.path.getsize(path) <= len(data):
            return
        with open(path, "wb") as f:
            f.write(data)
        with open(path[:-4] + ".txt", "w", encoding="utf-8", errors="backslashreplace") as f:  # (text of bad bytes)
            f.write("".join(traceback.format_exception(error)))


def limit_memory() -> None:
    """Caps the address space at what the process uses now plus MEMORY_HEADROOM."""
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_HEADROOM, resource.RLIM_INFINITY))


def make_one_input(target: str, workdir: str):
    """The function the engines call with each input, and the scratch it runs in."""
    import targets as targets_module

    scratch = targets_module.Scratch(os.path.join(workdir, "scratch"))
    recorder = Recorder(os.path.join(workdir, "crashes"))
    run = targets_module.TARGETS[target]

    def one_input(data: bytes) -> None:
        try:
            run(scratch, data)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            recorder.record(e, data)

    return one_input


def atheris_child(target: str, workdir: str, libfuzzer_args: list[str]) -> None:
    import atheris

    with atheris.instrument_imports(include=["pskd_jax", "targets"]):
        import targets  # noqa: F401  (instrumented for the coverage of the toolkit's parsers)

        import pskd_jax  # noqa: F401
    one_input = make_one_input(target, workdir)
    limit_memory()
    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


# --------------------------------------------------------------------------------------------
# The runner


def write_seeds(target: str, workdir: str) -> str:
    import targets

    directory = os.path.join(workdir, "seeds")
    os.makedirs(directory, exist_ok=True)
    scratch = targets.Scratch(os.path.join(workdir, "scratch"))
    for data in targets.seeds(target, scratch) + targets.hostile_inputs(target):
        name = hashlib.sha1(data).hexdigest()
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    return directory


def run_atheris(target: str, workdir: str, seconds: float) -> dict:
    corpus = os.path.join(workdir, "corpus")
    crashes = os.path.join(workdir, "crashes")
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(crashes, exist_ok=True)
    seeds_dir = write_seeds(target, workdir)
    deadline = time.monotonic() + seconds
    executions, restarts = 0, 0
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    while True:
        left = int(deadline - time.monotonic())
        if left < 5:
            break
        args = [corpus, seeds_dir, f"-max_total_time={left}", f"-timeout={TIMEOUT_S}", "-rss_limit_mb=3072",
                f"-max_len={MAX_LEN.get(target, 4096)}", f"-artifact_prefix={crashes}/", "-print_final_stats=1"]
        child = subprocess.run([sys.executable, os.path.abspath(__file__), target, "--child", workdir, "--", *args],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               errors="replace")
        found = re.findall(r"stat::number_of_executed_units:\s*(\d+)", child.stderr)
        executions += int(found[-1]) if found else 0
        with open(os.path.join(workdir, "libfuzzer.log"), "a") as log:
            log.write(child.stderr[-20000:])
        if time.monotonic() + 5 < deadline:
            restarts += 1  # a timeout, an out-of-memory kill or a libFuzzer crash ended it early
            tail = [line for line in child.stderr.splitlines() if "ERROR" in line or "Test unit written" in line]
            print(f"[{target}] libFuzzer stopped early: {' | '.join(tail[-2:]) or child.returncode}", flush=True)
    return {"executions": executions, "restarts": restarts}


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.randrange(7)
        if choice == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif choice == 1 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif choice == 2:
            buf.insert(rng.randrange(len(buf) + 1), rng.randrange(256))
        elif choice == 3 and buf:
            start = rng.randrange(len(buf))
            del buf[start : start + rng.randint(1, 16)]
        elif choice == 4 and buf:
            start = rng.randrange(len(buf))
            piece = buf[start : start + rng.randint(1, 32)]
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = piece * rng.randint(1, 64)
        elif choice == 5 and len(buf) >= 8:
            width = rng.choice((2, 4, 8))
            at = rng.randrange(len(buf) - width + 1)
            value = rng.choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), rng.randrange(2**(8 * width))))
            buf[at : at + width] = value.to_bytes(width, "little")
        elif choice == 6 and pool:
            other = rng.choice(pool)
            at = rng.randrange(len(buf) + 1)
            buf[at:] = other[rng.randrange(len(other) + 1):]
    return bytes(buf[: 1 << 16])


def run_mutate(target: str, workdir: str, seconds: float) -> dict:
    seeds_dir = write_seeds(target, workdir)
    pool = [pathlib.Path(seeds_dir, n).read_bytes() for n in sorted(os.listdir(seeds_dir))]
    one_input = make_one_input(target, workdir)
    limit_memory()
    rng = random.Random(int(time.time()))
    deadline = time.monotonic() + seconds
    executions = 0

    def on_alarm(signum, frame):
        raise TimeoutError(f"one input ran past {TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    while time.monotonic() < deadline:
        data = mutate(rng.choice(pool), rng, pool)
        signal.alarm(TIMEOUT_S)
        try:
            one_input(data)
        finally:
            signal.alarm(0)
        executions += 1
    return {"executions": executions, "restarts": 0}


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[2] == "--child":  # run.py TARGET --child WORKDIR -- LIBFUZZER_ARGS
        target, workdir = sys.argv[1], sys.argv[3]
        atheris_child(target, workdir, sys.argv[sys.argv.index("--") + 1 :])
        return
    parser = argparse.ArgumentParser(description="Run one fuzz target for a number of minutes.")
    parser.add_argument("target", nargs="?")
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--engine", choices=("atheris", "mutate"))
    parser.add_argument("--workdir", default=os.path.join(ROOT, "out", "fuzz"))
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args()
    import targets

    if args.list or not args.target:
        print("\n".join(targets.TARGETS))
        return
    if args.target not in targets.TARGETS:
        parser.error(f"unknown target {args.target!r}; one of {', '.join(targets.TARGETS)}")
    workdir = os.path.join(os.path.abspath(args.workdir), args.target)
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "mutate"
    os.makedirs(workdir, exist_ok=True)
    started = time.time()
    stats = (run_atheris if engine == "atheris" else run_mutate)(args.target, workdir, args.minutes * 60)
    crashes = os.path.join(workdir, "crashes")
    findings = sorted(n for n in os.listdir(crashes) if not n.endswith(".txt")) if os.path.isdir(crashes) else []
    summary = {"target": args.target, "engine": engine, "minutes": round((time.time() - started) / 60, 2),
               **stats, "findings": findings}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
