"""The hostile collection (``testdata/hostile/``, made by ``tools/make_hostile.py``): every file, through
the API and through the ``pskd`` command, answers with the code its manifest records.

Each case runs in a process of its own, forked from a worker that has imported the toolkit once
(so that a few hundred cases times two cost seconds, not a Python start-up each), under:

- an address-space limit (``RLIMIT_AS``, the worker's own plus 512 MiB): an input that makes the
  toolkit allocate out of all proportion fails instead of swapping the machine;
- a proportionality check on the API side: the peak of Python and numpy allocations
  (``tracemalloc``) stays within ``64 × the input's size + 16 MiB``;
- a CPU time limit (``RLIMIT_CPU``, 20 s: work out of proportion to the input ends in SIGXCPU),
  which a loaded machine does not make any shorter, and a wall-clock guard (``SIGALRM``, 120 s)
  for an input that blocks (a hang uses no CPU).

Through the API the only exception allowed is ``PskdError`` with the recorded code; through the
command, exit status 1 and exactly one stderr line ``pskd: E9xxx: …``, no traceback, and no output
file (nor temporary file) left behind. A case whose code is ``null`` must succeed both ways.
A few cases are also run through the installed console script itself, a fresh interpreter each.

Checkpoint cases (issue 20): a ``checkpoint`` case (a data file and what lies beside it) is
restored, listed, read by a ``Reader`` given its layout file (whose integer and bool leaves must
show what restore gives) and exported, or converted to safetensors and back (its keys must come
back as they were); an ``into`` case is ``pskd convert in.safetensors -o out.psk.d`` on a copy of
its directory, which a refused save must leave exactly as it was (an accepted one: the files its
``kept`` names).

Manager cases: an ``index`` case whose ``args`` hold ``open`` is opened by a ``CheckpointManager``
(its recovery) and then verified, on a copy of its directory; the files its ``kept`` names (the
steps the index lists) must be left exactly as they were, whatever the answer (a damaged listed
step is reported, E9013, never removed).

Corpus cases: a ``manifest`` case (a directory) goes through four API steps (``read_manifest``,
``info_lines``, ``verify_corpus``, ``CorpusWindows`` and a gather), each of which must answer with
the case's code or succeed, the first failing one with the code; through the command it is
``pskd corpus verify`` (the case's code) and ``pskd corpus info`` (which reads no shard: it fails
with E9016 cases only). A ``jsonl`` case is built with ``build_corpus`` / ``pskd corpus build``, and
what was built is verified and read back; a refused build leaves no ``shards.json`` and no shard,
only the lock and journal it keeps to resume.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import traceback
import tracemalloc

import numpy as np
import pskd_jax.apps.pskd
import pytest

from pskd_jax import checkpoint, corpus, pipeline
from pskd_jax import data as inspection
from pskd_jax import format as container
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.checkpoint import safetensors as convert
from pskd_jax.corpus import BuildOptions
from pskd_jax.corpus import build as corpus_build
from pskd_jax.data import pack, text, windows
from pskd_jax.errors import PskdError
from pskd_jax.format import reader as reader_module
from pskd_jax.format.reader import Reader
from pskd_jax.pipeline.streams import check_stream_path
from tests.helpers import ENV, ROOT, SCRIPT, pskd

HOSTILE = ROOT / "testdata" / "hostile"
MANIFEST = json.loads((HOSTILE / "manifest.json").read_text(encoding="utf-8"))
CASES = MANIFEST["cases"]
MEMORY_HEADROOM = 512 << 20
CPU_LIMIT_S = 20  # seconds of CPU a case may use (its own work, whatever the machine's load)
HANG_GUARD_S = 120  # seconds of wall time before a case that blocks is called a hang
PEAK_FACTOR, PEAK_SLACK = 64, 16 << 20

FIXTURES = HOSTILE / "_fixtures"
CHECKPOINT = FIXTURES / "checkpoint.psk.d"
TEXT = FIXTURES / "text.txt"
SMALL = FIXTURES / "small.psk.d"


BUILD_STATE = {".pskd-corpus.lock", ".shards.journal"}  # what a refused corpus build keeps, to resume


def sides(case: dict) -> tuple[str, ...]:
    return ("api", "cli", "cli-info") if case["kind"] == "manifest" else ("api", "cli")


def cli_arguments(case: dict, path: str, out_dir: str, side: str = "cli") -> list[str]:
    kind, args = case["kind"], case.get("args", {})
    out = os.path.join(out_dir, "out")
    if kind == "manifest":
        return ["corpus", "info" if side == "cli-info" else "verify", os.path.join(path, corpus.MANIFEST)]
    if kind == "jsonl":
        return (["corpus", "build", path, "-o", os.path.join(out_dir, "corpus")]
                + (["--vocab", str(HOSTILE / args["vocab"])] if "vocab" in args else [])
                + (["--tokenizer", str(HOSTILE / args["tokenizer"])] if "tokenizer" in args else [])
                + (["--boundary-token", args["boundary_token"]] if "boundary_token" in args else [])
                + (["--skip-bad"] if args.get("skip_bad") else []))
    return {
        "container": lambda: ["info", path],
        "pipeline": lambda: ["pipeline", path, "--root", str(HOSTILE)],
        "vocab": lambda: ["encode", str(TEXT), "--vocab", path, "-o", out + ".tok"],
        "tokens": lambda: ["lm-windows", path, "--vocab", str(args.get("vocab")), "--seq", "4", "-o", out + ".psk.d"],
        "pack": lambda: ["pack", path, "--type", args.get("type", ""), "-o", out + ".psk.d"],
        "layout": lambda: ["info", str(CHECKPOINT), "--layout", path],
        "index": lambda: ["verify", path],
        "safetensors": lambda: ["convert", path, "-o", out + ".psk.d"],
        "export": lambda: ["export", path, "-o", out + ".json"],
        "output": lambda: ["export", str(SMALL), "-o", os.path.join(path, "out.json")],
        "diff": lambda: ["diff", os.path.join(path, "a.psk.d"), os.path.join(path, "b.psk.d")],
        "checkpoint": lambda: (["convert", os.path.join(path, args.get("data", "m.psk.d")), "-o", out + ".safetensors"]
                               if args.get("command") == "convert"
                               else ["export", os.path.join(path, args.get("data", "m.psk.d")), "-o", out + ".json"]),
        "into": lambda: ["convert", os.path.join(path, "in.safetensors"), "-o", os.path.join(path, "out.psk.d")],
    }[kind]()


def _keys_of(tree) -> object:
    """A tree's containers and keys, each key with its type (what a round trip must keep)."""
    if isinstance(tree, dict):
        return [[type(k).__name__, repr(k), _keys_of(v)] for k, v in tree.items()]
    if isinstance(tree, (list, tuple)):
        return [_keys_of(v) for v in tree]
    return None


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {p: v for k, value in tree.items() for p, v in _flat(value, f"{prefix}[{k!r}]").items()}
    if isinstance(tree, (list, tuple)):
        return {p: v for k, value in enumerate(tree) for p, v in _flat(value, f"{prefix}[{k}]").items()}
    return {prefix: tree}


def run_checkpoint(case: dict, path: str, out_dir: str) -> None:
    """A ``checkpoint`` case through the API (see the generator's docstring)."""
    args = case.get("args", {})
    data = os.path.join(path, args.get("data", "m.psk.d"))
    out = os.path.join(out_dir, "out")
    restored = checkpoint.restore(data, as_numpy=True)
    found = checkpoint.find_layout_file(data)
    inspection.info_lines(data, layout=found, samples=1)
    if found is not None:
        assert all(p in [leaf.path for leaf in found.layout.leaves] for p in args.get("paths", [])), args
        with Reader(data) as reader:
            shown = _flat(reader.with_layout(found)[0])
        for (where, want), form in zip(_flat(restored).items(), found.forms):
            if form is not None and form.kind == "value" and form.dtype.startswith(("int", "uint", "bool")):
                assert np.array_equal(np.asarray(shown[where]), np.asarray(want)), (where, shown[where], want)
    if args.get("command") == "convert":
        convert.pskd_to_safetensors(data, out + ".safetensors")
        convert.safetensors_to_pskd(out + ".safetensors", out + ".psk.d", SaveOptions(durable=False))
        back = checkpoint.restore(out + ".psk.d", as_numpy=True)
        assert _keys_of(back) == _keys_of(restored), (_keys_of(back), _keys_of(restored))
    else:
        inspection.export_json(data, out + ".json", layout=found)


def run_into(case: dict, path: str) -> None:
    """An ``into`` case through the API, on a copy of its directory."""
    convert.safetensors_to_pskd(os.path.join(path, "in.safetensors"), os.path.join(path, "out.psk.d"),
                                SaveOptions(durable=False))
    back = checkpoint.restore(os.path.join(path, "out.psk.d"), as_numpy=True)
    if "keys" in case.get("args", {}):
        assert list(back) == case["args"]["keys"], list(back)


def run_api(case: dict, path: str, out_dir: str) -> dict | None:
    """What a program does with the file (the worker imported everything before forking); for a
    ``diff`` case, the distance it gave."""
    kind, args = case["kind"], case.get("args", {})
    out = os.path.join(out_dir, "out")
    if kind == "container":
        with Reader(path) as reader:
            if reader.placement is not None:
                for k in range(min(len(reader), 4)):
                    reader[k]
                if len(reader):
                    reader.gather([0, len(reader) - 1])
        inspection.info_lines(path, samples=3)
    elif kind == "pipeline":
        p = pipeline.load_pipeline(path, root=HOSTILE)  # cases stream ../_fixtures and ../container
        check_stream_path(p.path)  # (E9010 for nothing there or a directory, as the Loader and pskd pipeline)
        with Reader(p.path) as reader:
            p.check_batches(len(reader))  # E9010 for no batch at all, as pskd pipeline and a training run
    elif kind == "vocab":
        vocab = text.read_vocab(path)
        text.encode_file(str(TEXT), vocab, out + ".tok")
    elif kind == "tokens":
        windows.lm_windows_file(path, out + ".psk.d", vocab=args["vocab"], seq=4)
    elif kind == "pack":
        pack.pack_file(path, args["type"], out + ".psk.d")
    elif kind == "layout":
        layout = checkpoint.read_layout_file(path).layout
        inspection.info_lines(str(CHECKPOINT), layout=layout)
    elif kind == "index":
        if args.get("open"):  # a manager's recovery first (on a copy): it may remove only its own leftovers
            checkpoint.CheckpointManager(path, save_options=SaveOptions(durable=False)).close()
        checkpoint.verify_directory(path)
    elif kind == "safetensors":
        convert.safetensors_to_pskd(path, out + ".psk.d", SaveOptions(durable=False))
    elif kind == "export":
        inspection.export_json(path, out + ".json")
    elif kind == "output":
        inspection.export_json(str(SMALL), os.path.join(path, "out.json"))
    elif kind == "diff":
        d = inspection.diff(os.path.join(path, "a.psk.d"), os.path.join(path, "b.psk.d"))
        return {"diff_norm": d.diff_norm, "a_norm": d.a_norm, "relative": d.relative, "elements": d.elements}
    elif kind == "checkpoint":
        run_checkpoint(case, path, out_dir)
    elif kind == "into":
        run_into(case, path)
    elif kind == "jsonl":
        options = BuildOptions(skip_bad=args.get("skip_bad", False), durable=False)
        if "vocab" in args:
            options = options.replace(tokenizer=corpus.Tokenizer.chars(text.read_vocab(str(HOSTILE / args["vocab"]))))
        if "tokenizer" in args:
            options = options.replace(tokenizer=corpus.Tokenizer.from_file(HOSTILE / args["tokenizer"],
                                                                           boundary_token=args.get("boundary_token")))
        built = corpus_build.build_corpus([path], os.path.join(out_dir, "corpus"), options)
        corpus.verify_corpus(built.manifest.path, workers=1)
        _windows(built.manifest.path)
    else:
        raise AssertionError(f"unknown kind {kind}")


def _windows(manifest_path: str) -> None:
    with corpus.CorpusWindows(manifest_path, seq=4) as w:
        if len(w):
            w.gather([0, len(w) - 1, -1])
            w[len(w) // 2]


def manifest_steps(path: str) -> list[dict]:
    """A corpus directory through each reader of the API: each step's code (None: it succeeded)."""
    manifest_path = os.path.join(path, corpus.MANIFEST)
    steps = []
    for name, step in (("read_manifest", lambda: corpus.read_manifest(manifest_path)),
                       ("info_lines", lambda: corpus.info_lines(manifest_path, shards=True)),
                       ("verify_corpus", lambda: corpus.verify_corpus(manifest_path, workers=2)),
                       ("CorpusWindows", lambda: _windows(manifest_path))):
        try:
            step()
            steps.append({"step": name, "code": None})
        except PskdError as e:
            steps.append({"step": name, "code": e.code, "message": e.message[:2000]})
    return steps


# --------------------------------------------------------------------------------------------
# The worker: python tests/robustness/test_hostile.py --worker SCRATCH  (one JSON line per case and side)


def _limit_memory() -> None:
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_HEADROOM, resource.RLIM_INFINITY))


def _in_child(body, result_fd: int) -> None:
    """Runs ``body`` in the forked child under the limits and sends its outcome; never returns."""
    status = 0
    try:
        signal.alarm(HANG_GUARD_S)  # default action: the child dies of SIGALRM
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]  # (kept: an ordinary user cannot raise it)
        soft = CPU_LIMIT_S if hard == resource.RLIM_INFINITY else min(CPU_LIMIT_S, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))  # then SIGXCPU
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _limit_memory()
        outcome = body()
    except SystemExit as e:  # sys.exit(None) is a success, sys.exit("text") a failure
        status = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        outcome = None
    except BaseException:
        traceback.print_exc()
        outcome = {"status": "crash", "traceback": traceback.format_exc()[-4000:]}
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if outcome is not None:
            os.write(result_fd, json.dumps(outcome).encode())
    finally:
        os._exit(status)


def _fork(body, stdout_path: str | None = None) -> tuple[dict | None, int | None, int | None]:
    """Forks, runs ``body`` in the child; returns (its outcome, exit status, killing signal)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        if stdout_path is not None:
            fd = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(os.open(stdout_path + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        _in_child(body, write_fd)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    outcome = json.loads(b"".join(chunks)) if chunks else None
    if os.WIFSIGNALED(wait_status):
        return outcome, None, os.WTERMSIG(wait_status)
    return outcome, os.WEXITSTATUS(wait_status), None


def _size(path: str) -> int:
    """A file's size, or a directory's files' (links counted as links: a case's may lead anywhere)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    return sum(os.lstat(os.path.join(d, f)).st_size for d, dirs, files in os.walk(path) for f in files + dirs)


def _left(out_dir: str) -> list[str]:
    """What a run left in its output directory, files below subdirectories included."""
    found = []
    for directory, dirs, files in os.walk(out_dir):
        found += [os.path.relpath(os.path.join(directory, name), out_dir) for name in files]
        found += [os.path.relpath(os.path.join(directory, name), out_dir) + "/" for name in dirs
                  if not os.listdir(os.path.join(directory, name))]
    return sorted(found)


def _entries(directory: str, *, contents: bool = False) -> list[tuple[str, str]]:
    """A directory's entries and what each is (a link: where it leads), never followed; with
    ``contents``, a regular file's digest and a directory's entries too."""
    found = []
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if os.path.islink(full):
            what = "link " + os.readlink(full)
        elif os.path.isdir(full):
            what = f"directory {_entries(full, contents=True)}" if contents else "directory"
        elif contents:
            with open(full, "rb") as f:
                what = f"file {hashlib.sha256(f.read()).hexdigest()}"
        else:
            what = f"file {os.path.getsize(full)}"
        found.append((name, what))
    return found


def worker(scratch: str) -> None:
    for index, case in enumerate(CASES):
        path = str(HOSTILE / case["file"])
        size = _size(path)
        for side in sides(case):
            out_dir = os.path.join(scratch, f"{index}-{side}")
            os.makedirs(out_dir)
            on_copy = case["kind"] in ("output", "into") or "kept" in case.get("args", {})
            if on_copy:  # written at: a copy of the case's directory, links as links
                path = os.path.join(scratch, f"{index}-{side}-case")
                shutil.copytree(HOSTILE / case["file"], path, symlinks=True)
                before = _entries(path, contents=case["kind"] != "output")

            def api() -> dict:
                tracemalloc.start()
                if case["kind"] == "manifest":
                    steps = manifest_steps(path)
                    failed = [step for step in steps if step["code"] is not None]
                    result = ({"status": "error", "code": failed[0]["code"], "message": failed[0]["message"]}
                              if failed else {"status": "ok"})
                    result["steps"] = steps
                else:
                    try:
                        result = {"status": "ok", "value": run_api(case, path, out_dir)}
                    except PskdError as e:
                        result = {"status": "error", "code": e.code, "message": e.message[:2000]}
                result["peak"] = tracemalloc.get_traced_memory()[1]
                return result

            def cli() -> dict:
                sys.argv = ["pskd", *cli_arguments(case, path, out_dir, side)]
                pskd_jax.apps.pskd.run()
                return {"status": "ok"}

            log = os.path.join(scratch, f"{index}-{side}.log")
            outcome, status, signal_number = _fork(api if side == "api" else cli, log)
            with open(log + ".err", encoding="utf-8", errors="replace") as f:
                stderr = f.read()
            left = _left(out_dir)
            if case["kind"] == "output" and _entries(path) != before:
                left.append(f"the output's directory changed: {_entries(path)}")
            if case["kind"] == "index" and "kept" in case.get("args", {}):  # a manager's steps: never removed
                after = dict(_entries(path, contents=True))
                changed = [name for name, what in before if name in case["args"]["kept"] and after.get(name) != what]
                if changed:
                    left.append(f"the case's directory changed: {changed} removed or altered "
                                f"(what was there: {before}; now: {sorted(after)})")
            if case["kind"] == "into":
                after = dict(_entries(path, contents=True))
                refused = outcome is None or outcome.get("status") != "ok" if side == "api" else status != 0
                kept = [name for name, _ in before] if refused else case.get("args", {}).get("kept", [])
                changed = [name for name, what in before if name in kept and after.get(name) != what]
                if changed:
                    left.append(f"the case's directory changed: {changed} (what was there: {before})")
            print(json.dumps({"file": case["file"], "side": side, "outcome": outcome, "status": status,
                              "signal": signal_number, "stderr": stderr[-4000:], "left": left, "size": size}),
                  flush=True)
            shutil.rmtree(out_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    scratch = tmp_path_factory.mktemp("hostile")
    run = subprocess.run([sys.executable, __file__, "--worker", str(scratch)], cwd=scratch, env=ENV,
                         capture_output=True, text=True, timeout=3600)  # (a guard: the run takes seconds)
    assert run.returncode == 0, run.stderr[-4000:]
    results = {}
    for line in run.stdout.splitlines():
        record = json.loads(line)
        results[record["file"], record["side"]] = record
    return results


def _same_number(got: float, want: float | str) -> bool:
    """``want`` as a case records it: a number (equal exactly), or "inf" / "nan"."""
    if want == "inf":
        return math.isinf(got) and got > 0
    if want == "nan":
        return math.isnan(got)
    return got == want


def _id(case: dict) -> str:
    return case["file"]


def _signal_name(number: int) -> str:
    return signal.Signals(number).name


def _needs_packages(case) -> None:
    """safetensors headers are read with the optional safetensors package (the 'convert' extra)."""
    if case["file"].startswith(("safetensors/", "into/")) or case.get("args", {}).get("command") == "convert":
        pytest.importorskip("safetensors")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_api(outcomes, case):
    _needs_packages(case)
    record = outcomes[case["file"], "api"]
    assert record["signal"] is None, \
        f"killed by {_signal_name(record['signal'])} (CPU time, hang guard or memory limit)"
    outcome = record["outcome"]
    assert outcome is not None and outcome["status"] != "crash", outcome and outcome.get("traceback")
    if case["code"] is None:
        assert outcome["status"] == "ok", outcome
        for key, want in case.get("args", {}).get("expect", {}).items():  # a diff case's values
            assert _same_number(outcome["value"][key], want), (key, outcome["value"], want)
    else:
        assert (outcome["status"], outcome.get("code")) == ("error", case["code"]), outcome
        assert outcome["message"], "an error says what and where"
    assert not [entry for entry in record["left"] if "changed" in entry], record["left"]
    for step in outcome.get("steps", []):  # a manifest case: every reader answers alike, or succeeds
        # ... or, for windows, refuses a gathered token at or above the vocabulary size (E9004, as
        # Reader.gather does) where only hashing would find the damage.
        allowed = (None, case["code"], "E9004") if step["step"] == "CorpusWindows" else (None, case["code"])
        assert step["code"] in allowed, step
    assert outcome["peak"] <= PEAK_FACTOR * record["size"] + PEAK_SLACK, (
        f"allocated {outcome['peak']} bytes for an input of {record['size']}")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_cli(outcomes, case):
    _needs_packages(case)
    record = outcomes[case["file"], "cli"]
    assert record["signal"] is None, \
        f"killed by {_signal_name(record['signal'])} (CPU time, hang guard or memory limit)"
    stderr = record["stderr"]
    assert "Traceback" not in stderr, stderr
    if case["code"] is None:
        assert record["status"] == 0, stderr
        assert "Warning" not in stderr, stderr  # (numpy's warnings are no answer)
        assert not [entry for entry in record["left"] if "changed" in entry], record["left"]
        return
    lines = stderr.splitlines()
    assert record["status"] == 1 and len(lines) == 1, stderr
    assert lines[0].startswith(f"pskd: {case['code']}: "), stderr
    left = record["left"]
    if case["kind"] == "jsonl":  # a refused build keeps its lock and journal, no shard, no manifest
        left = [name for name in left if os.path.relpath(name, "corpus") not in BUILD_STATE]
    assert left == [], f"left behind: {left}"


MANIFEST_CASES = [case for case in CASES if case["kind"] == "manifest"]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", MANIFEST_CASES, ids=_id)
def test_cli_corpus_info(outcomes, case):
    """``pskd corpus info`` reads the manifest alone: E9016 where the manifest is bad, else its lines."""
    record = outcomes[case["file"], "cli-info"]
    assert record["signal"] is None, \
        f"killed by {_signal_name(record['signal'])} (CPU time, hang guard or memory limit)"
    stderr = record["stderr"]
    assert "Traceback" not in stderr, stderr
    if case["code"] != "E9016":
        assert record["status"] == 0, stderr
        return
    assert record["status"] == 1 and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith("pskd: E9016: "), stderr


def test_the_collection_holds_links_that_lead_outside():
    """The path cases are what they say: links git stores as links, leading out of their directory."""
    outside = HOSTILE / "_fixtures" / "outside.psk.d"
    assert outside.is_symlink() and os.readlink(outside) == "/etc/passwd"
    link = HOSTILE / "manifest" / "symlink-to-sibling" / "shard-00000.psk.d"
    assert link.is_symlink() and link.resolve() == (HOSTILE / "manifest" / "valid" / "shard-00000.psk.d")
    assert (HOSTILE / "manifest" / "symlink-directory-out" / "sub").is_symlink()


def test_manifest_lists_every_file_once():
    files = [case["file"] for case in CASES]
    assert len(files) == len(set(files))
    on_disk = {str(p.relative_to(HOSTILE)) for kind in HOSTILE.iterdir() if kind.is_dir() and kind.name != "_fixtures"
               for p in kind.iterdir()}
    assert on_disk == set(files)
    assert all(case["code"] is None or case["code"].startswith("E9") for case in CASES)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["container/type-len-max.psk.d", "container/count-max.psk.d",
                                  "container/v2-f32-on-idx.psk.d"])
def test_the_console_script_itself(name):
    """The installed ``pskd`` (a fresh interpreter, as a user runs it) on a few of the files."""
    case = next(c for c in CASES if c["file"] == name)
    run = pskd("info", HOSTILE / name, script=SCRIPT is not None, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"pskd: {case['code']}: ") and run.stderr.count("\n") == 1, run.stderr


def test_a_sample_larger_than_a_numpy_record_is_read(tmp_path, monkeypatch):
    """A sample of more than 2^31 - 1 bytes (a checkpoint of a few GiB) cannot be one numpy record:
    the reader opens it (a sparse file here) and gathers leaf by leaf."""
    path = tmp_path / "big.psk.d"
    head = container.encode_header("(idx[256][3000000000], ℝ[])", 1, [container.Encoding.F64] * 2)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + 3_000_000_000 + 8)
    with container.Reader(path) as reader:
        assert reader.sample_bytes == 3_000_000_008 and reader.leaves()[1][0] == 0.0
    small = tmp_path / "small.psk.d"
    container.write(small, "(idx[64][4], ℝ[2])", (np.arange(12).reshape(3, 4), np.arange(6.0).reshape(3, 2)))
    monkeypatch.setattr(reader_module, "MAX_RECORD_BYTES", 8)  # the same path on a small file
    with container.Reader(small) as reader:
        tokens, reals = reader.gather([2, 0, -1])
        assert tokens.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3], [8, 9, 10, 11]]
        assert reals.tolist() == [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(ROOT))
        worker(sys.argv[2])
    else:
        sys.exit("usage: python tests/robustness/test_hostile.py --worker SCRATCH (run by pytest)")
