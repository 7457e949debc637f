"""Benchmark of the text kernels: ``chars``, ``encode`` and token reading + ``lm-windows``.

    python bench/bench_text.py [--mb 200] [--text FILE] [--baseline-mb 16] [--seq 256]

Makes a UTF-8 text of ``--mb`` megabytes (the Python standard library's ``.py`` sources that are
UTF-8, concatenated and repeated to size) in a temporary directory, or takes ``--text``. Each
stage runs in its own process, so that its peak resident memory (``wait4``'s ``ru_maxrss``) is its
own, and is timed inside that process around the kernel alone (no interpreter start-up).

Prints, for the whole text, the input throughput and peak memory of each stage, and on the first
``--baseline-mb`` megabytes of the same text (the hand-written idioms hold a Python object per
character, so they cannot take 200 MB) the ratio against the idiom, with the outputs compared
byte for byte:

- encode vs ``" ".join(str(index[c]) for c in text)`` (held to ≥ 5×);
- token reading + windows vs ``np.array(text.split()).astype(int)`` + strided windows (≥ 2×).

Targets (the project's figures): ≥ 50 MB/s of input for each stage, peak memory < 1 GiB.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from pskd_jax.data import text as T  # noqa: E402
from pskd_jax.data import tokens as TOK  # noqa: E402
from pskd_jax.data import windows as W  # noqa: E402
from pskd_jax.format import index_dtype  # noqa: E402

MB = 1_000_000


# ---------------------------------------------------------------------------------------------
# The stages, each run in a child process: ``bench_text.py --stage NAME --dir DIR --seq T``
# ---------------------------------------------------------------------------------------------


def stage_chars(d: str, name: str, seq: int) -> dict:
    t0 = time.perf_counter()
    vocab, count = T.char_vocab_file(os.path.join(d, f"{name}.txt"))
    seconds = time.perf_counter() - t0
    T.write_vocab(os.path.join(d, "vocab.json"), vocab)
    return {"seconds": seconds, "vocab": len(vocab), "chars": count}


def stage_encode(d: str, name: str, seq: int) -> dict:
    vocab = T.read_vocab(os.path.join(d, "vocab.json"))
    t0 = time.perf_counter()
    count = T.encode_file(os.path.join(d, f"{name}.txt"), vocab, os.path.join(d, f"{name}.tok"))
    return {"seconds": time.perf_counter() - t0, "tokens": count}


def stage_encode_idiom(d: str, name: str, seq: int) -> dict:
    vocab = T.read_vocab(os.path.join(d, "vocab.json"))
    t0 = time.perf_counter()
    with open(os.path.join(d, f"{name}.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    index = {c: i for i, c in enumerate(vocab)}
    out = " ".join(str(index[c]) for c in text)
    with open(os.path.join(d, f"{name}.idiom.tok"), "w", encoding="ascii") as f:
        f.write(out + "\n")
    return {"seconds": time.perf_counter() - t0}


def stage_windows(d: str, name: str, seq: int) -> dict:
    bound = len(T.read_vocab(os.path.join(d, "vocab.json")))
    t0 = time.perf_counter()
    tokens = TOK.read_tokens(os.path.join(d, f"{name}.tok"), bound=bound)
    windows = 0
    with open(os.path.join(d, f"{name}.win"), "wb") as f:
        for records in W.lm_window_records(tokens, seq, seq):
            f.write(records)  # the (input, target) sample bytes, as the container stores them
            windows += len(records)
    return {"seconds": time.perf_counter() - t0, "windows": windows, "tokens": len(tokens)}


def stage_windows_stream(d: str, name: str, seq: int) -> dict:
    bound = len(T.read_vocab(os.path.join(d, "vocab.json")))
    t0 = time.perf_counter()
    windows = 0
    with open(os.path.join(d, f"{name}.stream.win"), "wb") as f:
        for records in W.lm_window_stream(TOK.iter_tokens(os.path.join(d, f"{name}.tok"), bound=bound), seq, seq):
            f.write(records)
            windows += len(records)
    return {"seconds": time.perf_counter() - t0, "windows": windows}


def stage_windows_idiom(d: str, name: str, seq: int) -> dict:
    bound = len(T.read_vocab(os.path.join(d, "vocab.json")))
    t0 = time.perf_counter()
    with open(os.path.join(d, f"{name}.tok"), encoding="ascii") as f:
        tokens = np.array(f.read().split()).astype(int)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, seq + 1)[::seq]
    records = np.stack([windows[:, :seq], windows[:, 1:]], axis=1).astype(index_dtype(bound))
    with open(os.path.join(d, f"{name}.idiom.win"), "wb") as f:
        f.write(records.tobytes())
    return {"seconds": time.perf_counter() - t0, "windows": len(records)}


STAGES = {
    "chars": stage_chars,
    "encode": stage_encode,
    "encode-idiom": stage_encode_idiom,
    "windows": stage_windows,
    "windows-stream": stage_windows_stream,
    "windows-idiom": stage_windows_idiom,
}


def run_stage(stage: str, d: str, name: str, seq: int, repeat: int = 1) -> dict:
    """Runs one stage ``repeat`` times, each in a child process; returns the fastest run's report
    with its own peak RSS in MiB (other people's work on a shared machine only ever slows a run)."""
    runs = [run_stage_once(stage, d, name, seq) for _ in range(repeat)]
    return min(runs, key=lambda report: report["seconds"])


def run_stage_once(stage: str, d: str, name: str, seq: int) -> dict:
    """Runs one stage in a child process; returns its report plus its own peak RSS in MiB."""
    cmd = [sys.executable, os.path.abspath(__file__), "--stage", stage, "--dir", d, "--name", name, "--seq", str(seq)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"stage {stage} on {name} failed with exit status {child.returncode}")
    report = json.loads(output)
    report["peak_mib"] = usage.ru_maxrss / 1024  # Linux reports kilobytes
    report["user"], report["sys"] = usage.ru_utime, usage.ru_stime  # the whole child, start-up included
    return report


# ---------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------


def stdlib_sources() -> list[bytes]:
    """The standard library's ``.py`` files that are UTF-8, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    sources = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path:
            continue
        with open(path, "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a few test files are deliberately in other encodings
        sources.append(data)
    return sources


def make_text(path: str, size: int) -> None:
    """Writes the standard library's sources, repeated, cut to ``size`` bytes at a character."""
    sources = stdlib_sources()
    if not sources:
        raise SystemExit("no UTF-8 .py sources found in the standard library")
    written = 0
    with open(path, "wb") as f:
        while written < size:
            for data in sources:
                if len(data) >= size - written:
                    data = data[: size - written]
                    f.write(data[: T._utf8_cut(data)])
                    return
                f.write(data)
                written += len(data)


def copy_prefix(src: str, dst: str, size: int) -> int:
    """Copies the first ``size`` bytes of ``src``, cut back to a character boundary."""
    with open(src, "rb") as f:
        data = f.read(size)
    data = data[: T._utf8_cut(data)]
    with open(dst, "wb") as f:
        f.write(data)
    return len(data)


def same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="size of the generated text in MB (default 200)")
    parser.add_argument("--text", help="a UTF-8 text to use instead of generating one")
    parser.add_argument("--baseline-mb", type=float, default=16, help="prefix compared with the idioms (default 16)")
    parser.add_argument("--seq", type=int, default=256, help="window length (stride = seq)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each stage, the fastest reported (default 2)")
    parser.add_argument("--keep", help="a directory to work in and keep, instead of a temporary one")
    parser.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.stage:
        print(json.dumps(STAGES[args.stage](args.dir, args.name, args.seq)))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench_text.") as scratch:
        d = args.keep or scratch
        os.makedirs(d, exist_ok=True)
        full = os.path.join(d, "full.txt")
        t0 = time.perf_counter()
        if args.text:
            size = copy_prefix(args.text, full, os.path.getsize(args.text))
        else:
            make_text(full, int(args.mb * MB))
            size = os.path.getsize(full)
        prefix = copy_prefix(full, os.path.join(d, "prefix.txt"), int(args.baseline_mb * MB))
        print(f"text: {size / MB:.1f} MB ({'--text ' + args.text if args.text else 'stdlib .py sources'}), "
              f"made in {time.perf_counter() - t0:.1f} s; idioms on its first {prefix / MB:.1f} MB; "
              f"numpy {np.__version__}, {os.cpu_count()} CPUs, fastest of {args.repeat} runs a stage", flush=True)

        chars = run_stage("chars", d, "full", args.seq, args.repeat)
        encode = run_stage("encode", d, "full", args.seq, args.repeat)
        tokens_size = os.path.getsize(os.path.join(d, "full.tok"))
        windows = run_stage("windows", d, "full", args.seq, args.repeat)
        stream = run_stage("windows-stream", d, "full", args.seq, args.repeat)
        same_s = same_bytes(os.path.join(d, "full.win"), os.path.join(d, "full.stream.win"))
        os.remove(os.path.join(d, "full.win"))
        os.remove(os.path.join(d, "full.stream.win"))
        print(f"vocabulary {chars['vocab']} characters, {chars['chars']} characters, "
              f"tokens text {tokens_size / MB:.1f} MB, {windows['windows']} windows of {args.seq}")
        print(f"{'stage (input)':<42}{'seconds':>8}{'MB/s':>8}{'user s':>8}{'sys s':>8}{'peak MiB':>10}")
        rows = [
            ("chars (text)", chars, size),
            ("encode (text)", encode, size),
            ("read_tokens + windows (tokens text)", windows, tokens_size),
            ("  the same per MB of the original text", windows, size),
            ("iter_tokens + window stream (tokens text)", stream, tokens_size),
            ("  the same per MB of the original text", stream, size),
        ]
        for label, report, nbytes in rows:
            print(f"{label:<42}{report['seconds']:>8.2f}{nbytes / MB / report['seconds']:>8.1f}"
                  f"{report['user']:>8.2f}{report['sys']:>8.2f}{report['peak_mib']:>10.0f}")
        print(f"window stream output identical to read_tokens + lm_window_records: {same_s}")

        # Ratios against the idioms, on the same prefix, outputs compared byte for byte. The
        # vocabulary of the whole text is kept: encode needs every character of the prefix.
        ours_e = run_stage("encode", d, "prefix", args.seq, args.repeat)
        idiom_e = run_stage("encode-idiom", d, "prefix", args.seq, args.repeat)
        ours_w = run_stage("windows", d, "prefix", args.seq, args.repeat)
        ours_s = run_stage("windows-stream", d, "prefix", args.seq, args.repeat)
        idiom_w = run_stage("windows-idiom", d, "prefix", args.seq, args.repeat)
        same_e = same_bytes(os.path.join(d, "prefix.tok"), os.path.join(d, "prefix.idiom.tok"))
        same_w = same_bytes(os.path.join(d, "prefix.win"), os.path.join(d, "prefix.idiom.win"))
        same_ps = same_bytes(os.path.join(d, "prefix.stream.win"), os.path.join(d, "prefix.idiom.win"))
        print(f"{'on the prefix (same data)':<34}{'ours s':>9}{'idiom s':>9}{'ratio':>8}"
              f"{'ours MiB':>10}{'idiom MiB':>10}  same output")
        for label, ours, idiom, same in (
            ("encode vs join(str(index[c]))", ours_e, idiom_e, same_e),
            ("tokens+windows vs split/astype", ours_w, idiom_w, same_w),
            ("window stream vs split/astype", ours_s, idiom_w, same_ps),
        ):
            ratio = idiom["seconds"] / ours["seconds"]
            print(f"{label:<34}{ours['seconds']:>9.3f}{idiom['seconds']:>9.3f}{ratio:>7.1f}x"
                  f"{ours['peak_mib']:>10.0f}{idiom['peak_mib']:>10.0f}  {same}")
        print(f"load average at the end: {os.getloadavg()[0]:.2f} (other work on the machine slows every figure)")
        if not (same_e and same_w and same_s and same_ps):
            print("OUTPUTS DIFFER")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
