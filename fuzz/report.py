"""Writes ``docs/hardening.md``, the hardening report, from what was actually run.

    python fuzz/report.py                       # from the recorded runs (fuzz/last_run.json)
    python fuzz/report.py --tests               # run the hostile and fault tests first, record their outcome
    python fuzz/report.py --fuzz-minutes 10     # regenerate everything first: the hostile collection,
                                                # every fuzz target for 10 minutes (two at a time),
                                                # the hostile and fault tests
    python fuzz/report.py --record              # record the fuzz runs found in --workdir (run by hand
                                                # with fuzz/run.py), then write the report

Fuzzing keeps its corpora and summaries in ``out/fuzz/`` (not in the repository), so what a run found
is recorded in ``fuzz/last_run.json``: per target its minutes, inputs run and findings, the outcome of
the hostile and fault tests, and the day and commit of the run. The report counts the hostile files
by kind, lists that record and the regressions kept, the kills per writer of
``tests/robustness/test_faults.py`` (``pskd corpus build`` included), and what each test collection
throws at the toolkit. ``--output -`` prints it instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORD = os.path.join(HERE, "last_run.json")
REPORT = os.path.join(ROOT, "docs", "hardening.md")
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import targets  # noqa: E402  (fuzz/targets.py)

from tests.robustness import test_faults  # noqa: E402  (its kill counts)


def run_fuzzers(minutes: float, workdir: str) -> None:
    names = list(targets.TARGETS)
    for first in range(0, len(names), 2):  # two at a time: the fuzzers are single-threaded
        running = [subprocess.Popen([sys.executable, os.path.join(HERE, "run.py"), name, "--minutes", str(minutes),
                                     "--workdir", workdir]) for name in names[first : first + 2]]
        for process in running:
            process.wait()


def run_tests() -> str:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/robustness",
                          "tests/os/test_outputs.py", "tests/format/test_refresh.py", "tests/data/test_pack_blocks.py",
                          "tests/corpus/test_links_at_build_names.py"],
                         cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return lines[-1].strip("= ") if lines else "the tests did not run"


def load_record() -> dict:
    with open(RECORD, encoding="utf-8") as f:
        return json.load(f)


def save_record(record: dict) -> None:
    with open(RECORD, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")


def this_run() -> dict[str, str]:
    """The day and commit a run is recorded under."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    return {"date": datetime.date.today().isoformat(), "commit": commit.stdout.strip() or "unknown"}


def record_fuzzing(record: dict, workdir: str) -> None:
    """Takes the summaries ``fuzz/run.py`` left in ``workdir`` into the record, each dated by its file
    and marked with the commit checked out now (targets without a summary keep what they had)."""
    runs = {run["target"]: run for run in record.get("fuzz", [])}
    for name in sorted(os.listdir(workdir)) if os.path.isdir(workdir) else []:
        path = os.path.join(workdir, name, "summary.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
            ran_on = datetime.date.fromtimestamp(os.path.getmtime(path)).isoformat()
            runs[name] = {"target": name, "minutes": summary["minutes"], "executions": summary["executions"],
                          "findings": summary["findings"], **this_run(), "date": ran_on}
            if "engine" in summary:
                runs[name]["engine"] = summary["engine"]
    record["fuzz"] = [runs[name] for name in sorted(runs)]


def report(record: dict) -> str:
    with open(os.path.join(ROOT, "testdata", "hostile", "manifest.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    kinds: dict[str, int] = {}
    for case in cases:
        kinds[case["kind"]] = kinds.get(case["kind"], 0) + 1
    valid = sum(case["code"] is None for case in cases)
    out = ["# Hardening", "",
           "What was thrown at the toolkit, and what it answered. This page is written by `python fuzz/report.py` "
           "from the recorded runs (`fuzz/last_run.json`); `python fuzz/report.py --fuzz-minutes 10` runs "
           "everything again first (the hostile collection, every fuzz target for ten minutes, the hostile and "
           "fault tests).", "",
           f"**Hostile files** (`testdata/hostile/`, made by `tools/make_hostile.py`, each with the code it "
           f"must produce in `manifest.json`): {len(cases)} — "
           + ", ".join(f"{n} {k}" for k, n in kinds.items())
           + f"; {valid} of them odd but valid (must be accepted). Each is run through the API and through "
             "`pskd`, in a process of its own under an address-space limit (its own size + 512 MiB), a CPU "
             "time limit of 20 s and a 120 s guard against blocking; the API's peak allocation must stay "
             "within 64 × the input's size + 16 MiB, an accepted `diff` pair must give the values its case "
             "records, the command must exit 0 without a warning on an accepted input, or 1 with one "
             "`pskd: E9xxx:` line, no traceback, and leave no output behind.",
           "", "**Fuzzing** (`fuzz/`, atheris coverage-guided where it is installed, else the runner's own "
           "mutation engine; one command per target: `python fuzz/run.py TARGET --minutes M`):", "",
           "| target | engine | minutes | inputs run | findings in the last run | regressions kept "
           "| run on, at commit |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    regressions = sorted(os.listdir(os.path.join(HERE, "regressions")))
    for run in record.get("fuzz", []):
        name = run["target"]
        found = ", ".join(run["findings"]) or "none"
        kept = ", ".join(r for r in regressions if r.startswith(name + "-")) or "—"
        out.append(f"| `{name}` | {run.get('engine', 'not recorded')} | {run['minutes']:.1f} | {run['executions']:,} | "
                   f"{found} | {kept} | {run['date']}, {run['commit']} |")
    waiting = sorted(os.listdir(os.path.join(HERE, "open"))) if os.path.isdir(os.path.join(HERE, "open")) else []
    out += ["", f"Every input a fuzzer found a bug with is kept: fixed ones in `fuzz/regressions/` "
                f"({len(regressions)} files, replayed by `tests/robustness/test_fuzz_regressions.py`), ones "
                f"whose fix belongs to other code in `fuzz/open/` ({len(waiting)}: {', '.join(waiting) or 'none'}); "
                "the hostile collection's cases of open bugs are written by "
                "`python tools/make_hostile.py --include-open`.", ""]
    out += ["**Faults** (`tests/robustness/test_faults.py`): kills at points each run reaches for sure, whatever the "
            "machine's speed or load (`tests/robustness/kill_points.py`: a run's file-system steps are counted "
            "through audit hooks and wrappers of `os.write`, `os.pwrite`, `os.fsync`; half the kills are a SIGKILL "
            "just before a step drawn in each stretch of a recorded run, half die inside a write at a drawn byte "
            f"under a file size limit), {test_faults.KILLS} kills each of `pskd pack`, `pskd lm-windows`, `pskd "
            f"encode` and `pskd corpus build`, {test_faults.KILLS // 2} each of `checkpoint.save` and "
            "`CheckpointManager.save`, every one landing (and in `tests/robustness/test_kill.py`, fresh interpreters: "
            "saves, and a `corpus build` with two workers killed before the journal line of its n-th shard is "
            "synced): the destination held the old content or the new, whole, after every kill (a corpus: its old or "
            "new `shards.json` and every shard it lists, or the manifest of the unfinished build, marked in progress, "
            "every shard it lists whole, and its journal); a rerun completed and left no temporary file (a killed "
            "writer's temporary file is removed by the next writer of the same destination, never one a live writer "
            "holds), and the rerun corpus build equals a reference build byte for byte, the old corpus's extra shards "
            "removed. A full disk (`RLIMIT_FSIZE`), a read-only directory and a missing parent directory, for each of "
            "`pack`, `lm-windows` and `encode`: exit 1, one `pskd: E9003:` line naming the destination, the old file "
            "untouched, nothing left behind; `pskd corpus build` on a full disk leaves the old corpus or its manifest "
            "in progress and journal (and a rerun with room finishes it), and into a read-only directory creates "
            "nothing.", "",
            "**Two writers at once** (real processes): a second `CheckpointManager` of one directory is refused "
            "with E9014 while the first is open (`read_only=True` and `pskd verify` still read); two "
            "`checkpoint.save`s of one file take turns under a lock, never mixing data and layout "
            "(`tests/checkpoint/test_concurrent.py`); a second `pskd corpus build` of one directory is refused "
            "with E9016 (`tests/cli/test_corpus_commands.py`); two `atomic_output` writers of one file never "
            "remove each other's temporary file.", "",
            "**Paths**: a pipeline file, a `shards.json` and a checkpoint index may not lead outside their "
            "directory — absolute paths, `..` and symlinks out are refused (E9010, E9016, E9014), tested in the "
            "hostile collection and in unit tests; a pipeline file may be given a wider root (`root=`, `--root`).", "",
            "**Inputs that are not files**: every input is opened as a regular file without blocking; a named "
            "pipe, a directory or a device (a link to `/dev/zero` in the collection, FIFOs in "
            "`tests/robustness/test_non_regular_inputs.py` and the `non_regular` fuzz target) is E9002 at once, "
            "and a FIFO at a shard's name is never written into (E9012).", "",
            "**Outputs**: what stands at `-o` is looked at once: a link is written through to its target (in "
            "the target's directory), a directory, FIFO, device, loop or `/dev/stdout` is E9012 and left as it "
            "was (the collection's `output` cases run on a copy that must not change; the `output_path` fuzz "
            "target), an output that is one of the command's inputs is E9012, `-o -` writes a text output to "
            "standard output once complete and is refused for binary outputs. The names `corpus build` gives "
            "inside its directory (shards, `shards.json`, its journal) are its own: a link at one is replaced, "
            "never written through, its target untouched (`tests/corpus/test_links_at_build_names.py`).", "",
            "**Files that change under a reader**: a file cut short while read is E9003 naming it, never a "
            "SIGBUS: `info`, `export`, `convert` and `diff` read with positional reads (`diff` maps neither "
            "file), a mapped `Reader` checks the file's size before each gather and mapped `CorpusWindows` the "
            "size of each shard a gather copies from (`tests/robustness/test_changing_files.py` and "
            "`test_cut_short_under_diff_and_windows.py` cut files under readers and under running commands, in "
            "child processes); the toolkit's writers never rewrite a "
            "file in place; `Reader.refresh()` takes in samples another process appends "
            "(`tests/format/test_refresh.py`).", "",
            "**Layout files and what a save replaces** (the collection's `checkpoint` and `into` cases, "
            "`tests/robustness/test_sidecar_names.py`): a layout file's name follows from its data file's whole "
            "name (`STEM.psk.d` → `STEM.layout.json`, any other `NAME` → `NAME.pskd-layout.json`: no two data "
            "files share one), and records its data file's name; a save replaces or removes only the toolkit's "
            "own layout of that very file — a user's notes, a data file named like a layout, another "
            "checkpoint's layout or a directory there refuse the save (E9012) before anything is written, and "
            "the `into` cases run on a copy that a refused save must leave exactly as it was; an older "
            "`NAME.layout.json` is read when it proves to belong.", "",
            "**Keys and values on the way** (`checkpoint` cases, the `keys` fuzz target, "
            "`tests/format/test_key_text.py`, `test_tree_walks.py`, `test_values_on_the_way.py`): dict keys "
            "that print alike (`1` and `'1'`, `True` and `'True'`, `None`, `1.5`, tuples, bytes, text that is "
            "not UTF-8) restore as saved or are refused at save (E9005); `export` refuses keys JSON would "
            "write alike (E9005 naming both); safetensors and back keeps keys, key types and containers; every "
            "dataclass field is saved (`init=False` ones too); zero-size typed key arrays save; a `Fraction`, "
            "`Decimal`, long double or object array beyond f64's range is E9004 at save; a `Reader` given its "
            "layout file shows what restore gives.", "",
            "**Work in proportion to the bytes present** (`tests/robustness/test_bounded_work.py`, peak "
            "allocations measured): 2^40 samples of an empty type (export refuses more than 2^24, info shows "
            "two), a sample of 1.6 GB (info reads the 64 elements it shows; export streams a sample in "
            "chunks), zero samples of a 2.4 GB type, a batch of 10^9 (indices in parts), a tokens word of "
            "32 MiB (linear time, bounded memory), a sparse tokens file of 100 GiB (no reservation before "
            "its tokens), decode of long tokens (16 MiB of text at a time); `pack` reads blocks of whole lines "
            "and writes each before the next (`tests/data/test_pack_blocks.py`: memory follows a block, not the "
            "input); `diff` of 2^40 empty samples reads nothing."]
    tests = record.get("tests")
    if tests is not None:
        out += ["", (f"Last run of the hostile, fault and regression tests ({tests['date']}, commit "
                     f"{tests['commit']}): {tests['outcome']}.")]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="Write docs/hardening.md from the recorded runs.")
    parser.add_argument("--fuzz-minutes", type=float, help="first regenerate everything, fuzzing this long per target")
    parser.add_argument("--workdir", default=os.path.join(ROOT, "out", "fuzz"))
    parser.add_argument("--tests", action="store_true", help="run the hostile and fault tests (without fuzzing)")
    parser.add_argument("--record", action="store_true", help="record the fuzz summaries found in --workdir")
    parser.add_argument("--output", default=REPORT, help="where the report goes ('-': standard output)")
    args = parser.parse_args()
    record = load_record()
    if args.fuzz_minutes:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_hostile.py")], check=True)
        run_fuzzers(args.fuzz_minutes, args.workdir)
    if args.fuzz_minutes or args.record:
        record_fuzzing(record, args.workdir)
    if args.fuzz_minutes or args.tests:
        record["tests"] = {"outcome": run_tests(), **this_run()}
    if args.fuzz_minutes or args.record or args.tests:
        save_record(record)
    text = report(record)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
