"""Writers under faults: killed at points drawn over their run, a full disk, a read-only directory, a missing parent.

The writers are the ``pskd`` commands ``pack``, ``lm-windows``, ``encode`` and ``corpus build``, and
the checkpoint ``save`` and ``CheckpointManager.save``. Each run happens in a process forked from a worker that
imported the toolkit once, so a kill costs the time the writer ran, not an interpreter start:

- killed at points each run reaches for sure, whatever the machine's speed or load (see
  :mod:`tests.robustness.kill_points`): a reference run records its file-system steps, then half
  the kills land just before a step drawn in each stretch of that run (before the output is
  opened, between chunks, between the sync and the rename, after it) and half inside a write, at a
  byte drawn in each stretch of the output's size. Every planned kill must land. The destination
  then holds the old content or the new, whole (compared byte for byte with reference runs);
  after the kills a rerun completes, writes the new content, and leaves no temporary file in the
  directory (a killed writer's temporary file is removed by the next writer of the same
  destination);
- for ``corpus build`` the destination is a directory: after a kill it holds the old corpus or the
  new one, whole (``shards.json`` and every shard it lists, byte for byte), or the manifest of the
  unfinished build, marked in progress, every shard it lists whole, and its journal (a build never
  removes the manifest, and leaves a shard out of it before replacing it); the kills of one
  series resume each other's work (each drawn over the steps of a run from the state the last one
  left, recorded on a copy of the directory), and a rerun finishes the build: the directory then
  equals a reference build's, file for file and byte for byte (stale shards of the old, bigger
  corpus, the journal and temporary files gone);
- a full disk (``RLIMIT_FSIZE`` below the output's size: writes fail with EFBIG), a read-only
  directory, a missing parent directory: exit status 1, one ``pskd: E9003: …`` line naming the
  destination, the old destination untouched, no temporary file.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import traceback

import numpy as np
import pskd_jax.apps.pskd
import pytest

from pskd_jax import checkpoint
from pskd_jax._os.atomic import atomic_output, remove_stale_temporaries
from pskd_jax.checkpoint import CheckpointManager, Retention
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import Writer, write
from tests.helpers import ENV, ROOT, run_python
from tests.robustness import kill_points

KILLS = 12  # per writer
SEED = 20261129


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _temporaries(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n.endswith(".tmp"))


# --------------------------------------------------------------------------------------------
# The worker: python tests/robustness/test_faults.py --worker SCRATCH  (one JSON line per scenario)


def _inputs(directory: str) -> dict[str, dict]:
    """Per writer: how to run it with the old input and with the new one, and its destination."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(SEED)
    paths = {name: os.path.join(directory, name) for name in
             ("old.tok", "new.tok", "old.txt", "new.txt", "vocab.json", "old.pack", "new.pack")}
    for name, n in (("old.tok", 20000), ("new.tok", 200000)):
        with open(paths[name], "w") as f:
            f.write(" ".join(map(str, rng.integers(0, 64, n))) + "\n")
    letters = list("abcdefgh \n")
    for name, n in (("old.txt", 10000), ("new.txt", 1000000)):
        with open(paths[name], "w") as f:
            f.write("".join(rng.choice(letters, n)))
    with open(paths["vocab.json"], "w") as f:
        json.dump(sorted(letters), f)
    for name, n in (("old.pack", 100), ("new.pack", 20000)):
        rows = rng.integers(0, 10, (n, 8))
        with open(paths[name], "w") as f:
            f.write("\n".join(" ".join(map(str, r)) + f" {k}.25" for k, r in enumerate(rows)) + "\n")
    out = {name: os.path.join(directory, "out", name) for name in ("windows.psk.d", "tokens.txt", "packed.psk.d")}
    os.makedirs(os.path.join(directory, "out"))
    return {
        "lm-windows": {"dest": out["windows.psk.d"],
                       "old": ["lm-windows", paths["old.tok"], "--vocab", "64", "--seq", "16", "--stride", "1",
                               "-o", out["windows.psk.d"]],
                       "new": ["lm-windows", paths["new.tok"], "--vocab", "64", "--seq", "16", "--stride", "1",
                               "-o", out["windows.psk.d"]]},
        "encode": {"dest": out["tokens.txt"],
                   "old": ["encode", paths["old.txt"], "--vocab", paths["vocab.json"], "-o", out["tokens.txt"]],
                   "new": ["encode", paths["new.txt"], "--vocab", paths["vocab.json"], "-o", out["tokens.txt"]]},
        "pack": {"dest": out["packed.psk.d"],
                 "old": ["pack", paths["old.pack"], "--type", "(idx[10][8], ℝ[])", "-o", out["packed.psk.d"]],
                 "new": ["pack", paths["new.pack"], "--type", "(idx[10][8], ℝ[])", "-o", out["packed.psk.d"]]},
    }


def _fork(body, *, prepare=None, log: str | None = None, plan: dict | None = None,
          root: str | None = None) -> tuple[int | None, int | None, str]:
    """Runs ``body`` in a forked child (after ``prepare``), armed with a kill ``plan`` counting the
    steps under ``root`` when given (see :mod:`tests.robustness.kill_points`). Returns (exit
    status, killing signal, stderr)."""
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            if log is not None:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            if prepare is not None:
                prepare()
            if plan is not None:
                kill_points.arm(root, plan)
            body()
        except SystemExit as e:
            status = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    stderr = ""
    if log is not None:
        with open(log, encoding="utf-8", errors="replace") as f:
            stderr = f.read()
    if os.WIFSIGNALED(wait_status):
        return None, os.WTERMSIG(wait_status), stderr
    return os.WEXITSTATUS(wait_status), None, stderr


def _record(body, root: str, record: str, log: str) -> list[tuple[str, str]]:
    """The steps of a run of ``body`` (which must succeed), as :mod:`kill_points` counts them."""
    if os.path.exists(record):
        os.unlink(record)
    status, _, stderr = _fork(body, log=log, plan={"record": record}, root=root)
    assert status == 0, stderr
    return kill_points.recorded(record) if os.path.exists(record) else []


def _cli(argv: list[str]):
    def body() -> None:
        sys.argv = ["pskd", *argv]
        pskd_jax.apps.pskd.run()

    return body


def _restore_old(dest: str, old_bytes: bytes) -> None:
    with open(dest + ".reset", "wb") as f:
        f.write(old_bytes)
    os.replace(dest + ".reset", dest)


CAP_DAC_OVERRIDE = 1  # linux/capability.h
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def bound_by_permissions() -> None:
    """Makes this (forked) process obey permission bits as its user's files' owner, even as root.

    Root writes into a read-only directory through the ``CAP_DAC_OVERRIDE`` capability: dropping it
    (from the effective and permitted sets, for good) makes the directory's mode 0555 stop root as
    it stops its owner. The process keeps its user, so everything it could read it still reads:
    the modules it has yet to import (numpy imports some lazily), wherever the checkout and its
    virtual environment lie, even under a directory others may not enter (a root user's home, a
    ``mktemp -d``), which a switch to another user such as ``nobody`` would lose. Nothing to do for
    any other user, whom the mode stops already."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)  # {version, pid 0: this process}
    sets = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}: capabilities 0-31, 32-63
    if libc.capget(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    sets[0] &= ~(1 << CAP_DAC_OVERRIDE)  # effective
    sets[1] &= ~(1 << CAP_DAC_OVERRIDE)  # permitted
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _plans(steps: int, size: int, count: int, rng: random.Random) -> list[dict]:
    """Half the kills at steps spread over the run, half inside the writes of a file of ``size``
    bytes (see :mod:`kill_points`): every one a point the writer reaches for sure."""
    return kill_points.step_plans(steps, count // 2, rng) + kill_points.byte_plans(size, count - count // 2, rng)


def kill_cli_writers(directory: str, rng: random.Random) -> list[dict]:
    results = []
    scratch = os.path.dirname(directory)
    log = os.path.join(scratch, "stderr.log")
    for writer, spec in _inputs(directory).items():
        dest = spec["dest"]
        out_dir = os.path.dirname(dest)
        # Reference runs: the new content, then the old one left in place.
        status, _, stderr = _fork(_cli(spec["new"]), log=log)
        assert status == 0, stderr
        with open(dest, "rb") as f:
            new_bytes = f.read()
        new_digest = hashlib.sha256(new_bytes).hexdigest()
        status, _, stderr = _fork(_cli(spec["old"]), log=log)
        assert status == 0, stderr
        with open(dest, "rb") as f:
            old_bytes = f.read()
        old_digest = hashlib.sha256(old_bytes).hexdigest()
        # The steps of a run over the old content: each kill run does them all (and more where a
        # killed run left a temporary file to remove), so each planned kill lands.
        steps = _record(_cli(spec["new"]), directory, os.path.join(scratch, f"{writer}.steps"), log)
        _restore_old(dest, old_bytes)
        states, killed, left_temporary = [], 0, 0
        for plan in _plans(len(steps), len(new_bytes), KILLS, rng):
            status, signal_number, _ = _fork(_cli(spec["new"]), log=log, plan=plan, root=directory)
            killed += signal_number in kill_points.KILLED
            digest = _digest(dest)
            states.append("old" if digest == old_digest else "new" if digest == new_digest else "torn")
            left_temporary += bool(_temporaries(out_dir))
            if digest == new_digest:
                _restore_old(dest, old_bytes)
        leftovers_before_rerun = _temporaries(out_dir)
        status, _, stderr = _fork(_cli(spec["new"]), log=log)
        results.append({"scenario": f"kill {writer}", "states": states, "killed": killed, "steps": len(steps),
                        "kills_leaving_a_temporary": left_temporary, "before_rerun": leftovers_before_rerun,
                        "rerun_status": status, "rerun_stderr": stderr,
                        "rerun_new": _digest(dest) == new_digest, "after_rerun": _temporaries(out_dir)})
    return results


def _tree(directory: str) -> dict[str, bytes]:
    """Every file of a directory (no subdirectories in a corpus), name → bytes."""
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def _corpus_state(directory: str, old: dict[str, bytes], new: dict[str, bytes]) -> str:
    """``old`` or ``new`` when ``shards.json`` and every shard it lists are those of that build,
    ``building`` when ``shards.json`` is the manifest of a build in progress (marked so) whose every
    listed shard is whole, beside its journal, ``torn`` otherwise (a build never removes the manifest)."""
    try:
        with open(os.path.join(directory, "shards.json"), "rb") as f:
            manifest = f.read()
    except FileNotFoundError:
        return "torn (no manifest)"
    data = json.loads(manifest)
    if "in_progress" in data:
        listed = [(e["path"], e["sha256"]) for e in data["shards"]]
        damaged = [p for p, digest in listed if _digest(os.path.join(directory, p)) != digest]
        journal = os.path.exists(os.path.join(directory, ".shards.journal"))
        return f"torn (manifest in progress, shards {damaged}, journal {journal})" if damaged or not journal \
            else "building"
    for name, files in (("old", old), ("new", new)):
        if manifest == files["shards.json"]:
            listed = [entry["path"] for entry in json.loads(manifest)["shards"]]
            damaged = [p for p in listed if _digest(os.path.join(directory, p)) != hashlib.sha256(files[p]).hexdigest()]
            return f"torn ({name} manifest, shards {damaged})" if damaged else name
    return "torn (another manifest)"


def kill_corpus_build(directory: str, rng: random.Random) -> dict:
    """``pskd corpus build`` of three inputs killed over and over in a directory that holds the
    corpus of five other inputs; then run to its end."""
    inputs = os.path.join(directory, "corpus-inputs")
    os.makedirs(inputs)
    data = np.random.default_rng(SEED + 1)
    words = np.array(["corpus", "shard", "tökén", "window", "boundary", "données", "🙂", "a", "the"])

    def jsonl(name: str, documents: int) -> str:
        path = os.path.join(inputs, name)
        with open(path, "w", encoding="utf-8") as f:
            for i in range(documents):
                text = " ".join(data.choice(words, int(data.integers(0, 60))))
                f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
        return path

    old = [jsonl(f"old{i}.jsonl", 200) for i in range(5)]
    new = [jsonl(f"new{i}.jsonl", 2500 + 500 * i) for i in range(3)]
    argv = lambda paths, out: ["corpus", "build", *paths, "-o", out, "--chunk-tokens", "4000"]  # noqa: E731
    scratch = os.path.dirname(directory)
    log = os.path.join(scratch, "stderr.log")
    reference, dest = os.path.join(directory, "corpus-reference"), os.path.join(directory, "corpus")
    status, _, stderr = _fork(_cli(argv(new, reference)), log=log)
    assert status == 0, stderr
    new_files = _tree(reference)
    status, _, stderr = _fork(_cli(argv(old, dest)), log=log)
    assert status == 0, stderr
    old_files = _tree(dest)
    states, killed, attempts = [], 0, 0
    while killed < KILLS and attempts < 3 * KILLS:
        # Each kill resumes what the last one left: the steps of a run from that state are those
        # of a run on a copy of the directory (the build does the same work in the same order;
        # only how often it republishes its manifest in progress follows the clock, so a kill
        # drawn near the end may miss, and is drawn again).
        plan = _corpus_plan(_corpus_steps(argv(new, os.path.join(directory, "probe")), dest, directory, log),
                            new_files, (killed + rng.random()) / KILLS, killed % 2 == 1)
        attempts += 1
        _, signal_number, _ = _fork(_cli(argv(new, dest)), log=log, plan=plan, root=directory)
        if signal_number not in kill_points.KILLED:
            states.append(_corpus_state(dest, old_files, new_files))
            assert states[-1] == "new", states  # a run that was not killed finished
        else:
            killed += 1
            states.append(_corpus_state(dest, old_files, new_files))
        if states[-1] == "new":  # back to the old corpus, whole
            shutil.rmtree(dest)
            os.makedirs(dest)
            for name, content in old_files.items():
                with open(os.path.join(dest, name), "wb") as f:
                    f.write(content)
    before_rerun = sorted(set(os.listdir(dest)) - set(new_files))
    status, _, stderr = _fork(_cli(argv(new, dest)), log=log)
    after = _tree(dest)
    return {"scenario": "kill corpus build", "states": states, "killed": killed, "attempts": attempts,
            "before_rerun": before_rerun, "rerun_status": status, "rerun_stderr": stderr,
            "rerun_new": after == new_files, "after_rerun": sorted(set(after) - set(new_files)),
            "missing_after_rerun": sorted(set(new_files) - set(after))}


def _corpus_steps(argv: list[str], dest: str, root: str, log: str) -> list[tuple[str, str]]:
    """The steps of a build from the state ``dest`` is in, run on a copy of it (``argv`` builds
    into the copy), named as they would be in ``dest``."""
    probe = argv[argv.index("-o") + 1]
    shutil.rmtree(probe, ignore_errors=True)
    shutil.copytree(dest, probe, symlinks=True)
    steps = _record(_cli(argv), root, os.path.join(os.path.dirname(root), "corpus.steps"), log)
    shutil.rmtree(probe)
    here, there = os.path.basename(probe), os.path.basename(dest)
    return [(kind, there + name[len(here):] if name.startswith(here) else name) for kind, name in steps]


def _corpus_plan(steps: list[tuple[str, str]], new_files: dict[str, bytes], where: float, inside: bool) -> dict:
    """A kill at the fraction ``where`` of a build's steps: just before that step, or (``inside``)
    inside the writes of the first shard the build starts writing from there on (a shard's writer
    starts by truncating its file), at a byte of it drawn with the same fraction."""
    at = min(len(steps) - 1, int(where * len(steps)))
    if inside:
        for k in range(at, len(steps)):
            kind, name = steps[k]
            shard = re.fullmatch(r"\.?(shard-\d+\.psk\.d)(\.\w+\.tmp)?", os.path.basename(name))
            if kind == "os.truncate" and shard and shard[1] in new_files:
                size = len(new_files[shard[1]])
                return {"step": k, "bytes": max(1, min(size - 1, int(where * size)))}
    return {"step": at}


def _checkpoint_tree(k: int):
    return {"w": np.full((1024, 1024), k, np.float32), "b": np.full(2048, k, np.float64), "k": np.int64(k)}


def kill_checkpoint_writers(directory: str, rng: random.Random) -> list[dict]:
    results = []
    scratch = os.path.dirname(directory)
    log = os.path.join(scratch, "stderr.log")
    path = os.path.join(directory, "ck", "c.psk.d")
    os.makedirs(os.path.dirname(path))
    checkpoint.save(path, _checkpoint_tree(0))
    steps = _record(lambda: checkpoint.save(path, _checkpoint_tree(0)), directory,
                    os.path.join(scratch, "save.steps"), log)
    states, left_temporary, killed = [], 0, 0
    plans = _plans(len(steps), os.path.getsize(path), KILLS // 2, rng)
    for i, plan in enumerate(plans, start=1):
        _, signal_number, _ = _fork(lambda i=i: checkpoint.save(path, _checkpoint_tree(i)), log=log, plan=plan,
                                    root=directory)
        killed += signal_number in kill_points.KILLED
        try:
            back = checkpoint.restore(path, _checkpoint_tree(0), as_numpy=True)
            k = int(back["k"])
            whole = all((back[key] == value).all() for key, value in _checkpoint_tree(k).items())
            states.append("old" if whole and k < i else "new" if whole else "torn")
        except Exception as e:
            states.append(f"torn ({e})")
        left_temporary += bool(_temporaries(os.path.dirname(path)))
    status, _, _ = _fork(lambda: checkpoint.save(path, _checkpoint_tree(99)))
    results.append({"scenario": "kill checkpoint.save", "states": states, "kills_leaving_a_temporary": left_temporary,
                    "killed": killed, "kills": len(plans), "rerun_status": status,
                    "after_rerun": _temporaries(os.path.dirname(path))})

    run = os.path.join(directory, "run")

    def save(i: int, where: str = run) -> None:
        with CheckpointManager(where, retention=Retention(keep=2)) as m:
            m.save(i, _checkpoint_tree(i))

    save(0)
    probe = os.path.join(directory, "run-probe")
    shutil.copytree(run, probe)
    steps = _record(lambda: save(1, probe), directory, os.path.join(scratch, "manager.steps"), log)
    shutil.rmtree(probe)
    states, left_temporary, killed = [], 0, 0
    plans = _plans(len(steps), os.path.getsize(os.path.join(run, "step-00000000.psk.d")), KILLS // 2, rng)
    for i, plan in enumerate(plans, start=1):
        _, signal_number, _ = _fork(lambda i=i: save(i), log=log, plan=plan, root=directory)
        killed += signal_number in kill_points.KILLED
        try:
            with CheckpointManager(run, retention=Retention(keep=2)) as manager:
                step = manager.latest_step()
                manager.verify(step)
                back = manager.restore(step, _checkpoint_tree(0), as_numpy=True)
                states.append("new" if int(back["k"]) == step == i else "old" if int(back["k"]) == step else "torn")
        except Exception as e:
            states.append(f"torn ({e})")
        left_temporary += bool(_temporaries(run))

    def final() -> None:
        with CheckpointManager(run, retention=Retention(keep=2)) as m:
            m.save(100, _checkpoint_tree(100))
    status, _, _ = _fork(final)
    results.append({"scenario": "kill CheckpointManager.save", "states": states, "killed": killed,
                    "kills": len(plans), "kills_leaving_a_temporary": left_temporary, "rerun_status": status,
                    "after_rerun": _temporaries(run)})
    return results


def environment_faults(directory: str) -> list[dict]:
    results = []
    log = os.path.join(directory, "stderr.log")
    specs = _inputs(os.path.join(directory, "env"))
    for writer, spec in specs.items():
        dest = spec["dest"]
        status, _, stderr = _fork(_cli(spec["old"]), log=log)
        assert status == 0, stderr
        old = _digest(dest)

        def small_disk() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

        status, signal_number, stderr = _fork(_cli(spec["new"]), prepare=small_disk, log=log)
        results.append({"scenario": f"full disk {writer}", "status": status, "signal": signal_number,
                        "stderr": stderr, "dest": dest, "unchanged": _digest(dest) == old,
                        "temporaries": _temporaries(os.path.dirname(dest))})

    # A read-only directory (as root, whom permissions do not stop, the writer first gives up
    # the capability that lets it write there: see bound_by_permissions).
    read_only = os.path.join(directory, "env", "read-only")
    os.makedirs(read_only)
    os.chmod(read_only, 0o555)

    for writer, spec in specs.items():
        dest = os.path.join(read_only, os.path.basename(spec["dest"]))
        argv = [*spec["new"][:-1], dest]
        status, signal_number, stderr = _fork(_cli(argv), prepare=bound_by_permissions, log=log)
        results.append({"scenario": f"read-only directory {writer}", "status": status, "signal": signal_number,
                        "stderr": stderr, "dest": dest, "unchanged": not os.path.exists(dest),
                        "temporaries": _temporaries(read_only)})
        missing = os.path.join(directory, "env", "no-such-directory", os.path.basename(spec["dest"]))
        argv = [*spec["new"][:-1], missing]
        status, signal_number, stderr = _fork(_cli(argv), log=log)
        results.append({"scenario": f"missing parent {writer}", "status": status, "signal": signal_number,
                        "stderr": stderr, "dest": missing, "unchanged": not os.path.exists(os.path.dirname(missing)),
                        "temporaries": []})
    return results


def corpus_environment_faults(directory: str) -> list[dict]:
    """``pskd corpus build`` over an existing corpus on a full disk (then run again with room), and
    into a read-only directory."""
    log = os.path.join(directory, "stderr.log")
    base = os.path.join(directory, "corpus-env")
    os.makedirs(os.path.join(base, "inputs"))
    data = np.random.default_rng(SEED + 2)
    words = np.array(["full", "disk", "read", "only", "données", "🙂", "a"])

    def jsonl(name: str, documents: int) -> str:
        path = os.path.join(base, "inputs", name)
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(documents):
                f.write(json.dumps({"text": " ".join(data.choice(words, 40))}, ensure_ascii=False) + "\n")
        return path

    small, large = jsonl("small.jsonl", 50), jsonl("large.jsonl", 3000)  # ~0.8 MB of shards
    build = lambda source, out: _cli(["corpus", "build", source, "-o", out, "--chunk-tokens", "4000"])  # noqa: E731
    reference, dest = os.path.join(base, "reference"), os.path.join(base, "corpus")
    for source, out in ((large, reference), (small, dest)):
        status, _, stderr = _fork(build(source, out), log=log)
        assert status == 0, stderr
    new, old = _tree(reference), _tree(dest)

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

    status, signal_number, stderr = _fork(build(large, dest), prepare=small_disk, log=log)
    result = {"scenario": "full disk corpus build", "status": status, "signal": signal_number, "stderr": stderr,
              "dest": dest, "state": _corpus_state(dest, old, new), "temporaries": _temporaries(dest)}
    rerun_status, _, rerun_stderr = _fork(build(large, dest), log=log)
    result.update(rerun_status=rerun_status, rerun_stderr=rerun_stderr, rerun_state=_corpus_state(dest, old, new))
    results = [result]

    read_only = os.path.join(base, "read-only")
    os.makedirs(read_only)
    os.chmod(read_only, 0o555)

    target = os.path.join(read_only, "corpus")
    status, signal_number, stderr = _fork(build(large, target), prepare=bound_by_permissions, log=log)
    results.append({"scenario": "read-only directory corpus build", "status": status, "signal": signal_number,
                    "stderr": stderr, "dest": target, "state": "absent" if not os.path.exists(target) else "created",
                    "temporaries": _temporaries(read_only)})
    return results


def worker(scratch: str) -> None:
    rng = random.Random(SEED)
    directory = os.path.join(scratch, "kills")
    os.makedirs(directory)
    for result in kill_cli_writers(directory, rng) + [kill_corpus_build(directory, rng)] \
            + kill_checkpoint_writers(directory, rng) + environment_faults(scratch) \
            + corpus_environment_faults(scratch):
        print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    scratch = str(tmp_path_factory.mktemp("faults"))
    try:
        run = subprocess.run([sys.executable, __file__, "--worker", scratch], cwd=scratch, env=ENV,
                             capture_output=True, text=True, timeout=3600)  # (a guard: the run takes seconds)
    finally:
        subprocess.run(["chmod", "-R", "u+w", scratch], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-4000:]
    return {r["scenario"]: r for r in map(json.loads, run.stdout.splitlines())}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("writer", ["pack", "lm-windows", "encode"])
def test_a_killed_command_leaves_the_old_or_the_new_file_and_a_rerun_cleans_up(results, writer):
    r = results[f"kill {writer}"]
    assert "torn" not in r["states"], r["states"]
    assert r["killed"] == KILLS, f"{r['killed']} of {KILLS} planned kills landed (of {r['steps']} steps)"
    assert (r["rerun_status"], r["rerun_new"]) == (0, True), r["rerun_stderr"]
    assert r["after_rerun"] == [], f"left behind after the rerun: {r['after_rerun']}"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_killed_corpus_build_leaves_a_whole_corpus_or_its_journal_and_a_rerun_finishes_it(results):
    r = results["kill corpus build"]
    assert not [s for s in r["states"] if s.startswith("torn")], r["states"]
    assert set(r["states"]) <= {"old", "new", "building"}, r["states"]
    assert r["killed"] == KILLS, f"{r['killed']} of {KILLS} kills landed in {r['attempts']} runs"
    assert r["states"].count("building") >= 2, r["states"]  # kills did land mid-build (and the next run resumed)
    assert (r["rerun_status"], r["rerun_new"]) == (0, True), r["rerun_stderr"]
    assert (r["after_rerun"], r["missing_after_rerun"]) == ([], []), "not the reference build's files"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("scenario", ["kill checkpoint.save", "kill CheckpointManager.save"])
def test_a_killed_checkpoint_save_leaves_a_whole_checkpoint_and_a_rerun_cleans_up(results, scenario):
    r = results[scenario]
    assert not [s for s in r["states"] if s.startswith("torn")], r["states"]
    assert r["killed"] == r["kills"] == KILLS // 2, f"{r['killed']} of {r['kills']} planned kills landed"
    assert r["rerun_status"] == 0
    assert r["after_rerun"] == [], f"left behind after the rerun: {r['after_rerun']}"


@pytest.mark.slow
@pytest.mark.subprocess
def test_kills_did_leave_temporary_files_for_the_rerun_to_remove(results):
    """Evidence that the cleanup was exercised, not only that nothing happened to need it."""
    assert sum(results[f"kill {w}"]["kills_leaving_a_temporary"] for w in ("pack", "lm-windows", "encode")) > 0


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("writer", ["pack", "lm-windows", "encode"])
@pytest.mark.parametrize("fault", ["full disk", "read-only directory", "missing parent"])
def test_environment_faults_give_a_clear_error_and_tear_nothing(results, fault, writer):
    r = results[f"{fault} {writer}"]
    assert r["signal"] is None, f"killed by signal {r['signal']}"
    lines = r["stderr"].splitlines()
    assert r["status"] == 1 and len(lines) == 1 and "Traceback" not in r["stderr"], r["stderr"]
    assert lines[0].startswith("pskd: E9003: ") and r["dest"] in lines[0], lines[0]
    assert r["unchanged"], "the destination changed"
    assert r["temporaries"] == [], f"left behind: {r['temporaries']}"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("fault", ["full disk", "read-only directory"])
def test_environment_faults_of_a_corpus_build_give_a_clear_error_and_tear_nothing(results, fault):
    r = results[f"{fault} corpus build"]
    assert r["signal"] is None, f"killed by signal {r['signal']}"
    lines = r["stderr"].splitlines()
    assert r["status"] == 1 and len(lines) == 1 and "Traceback" not in r["stderr"], r["stderr"]
    assert lines[0].startswith(("pskd: E9003: ", "pskd: E9016: ")) and r["dest"] in lines[0], lines[0]
    assert r["temporaries"] == [], f"left behind: {r['temporaries']}"
    if fault == "full disk":  # the old corpus whole, or its journal for the rerun, which finishes
        assert r["state"] in ("old", "building"), r["state"]
        assert (r["rerun_status"], r["rerun_state"]) == (0, "new"), r["rerun_stderr"]
    else:
        assert r["state"] == "absent"


def test_the_cleanup_removes_only_stale_temporaries_of_its_own_destination(tmp_path):
    dest = tmp_path / "d.psk.d"
    stale = tmp_path / ".d.psk.d.abcd_123.tmp"  # a killed writer's file: nobody holds it
    others = [tmp_path / ".e.psk.d.abcd_123.tmp", tmp_path / ".d.psk.d.abcd_123.tmp.keep",
              tmp_path / "d.psk.d.abcd_123.tmp", tmp_path / ".d.psk.d.toolong99.tmp"]
    for other in others:
        other.write_bytes(b"not ours")
    link = tmp_path / ".d.psk.d.link_123.tmp"
    link.symlink_to(tmp_path / "d.psk.d.abcd_123.tmp")
    with Writer(dest, "ℝ[]") as live:  # a live writer of the same destination holds its file
        live.append(np.arange(3.0))
        stale.write_bytes(b"old")
        assert remove_stale_temporaries(str(dest)) == [str(stale)]
        assert os.path.exists(live._tmp)
    assert dest.exists() and not stale.exists()
    assert all(other.exists() for other in others) and link.is_symlink()


@pytest.mark.subprocess
def test_a_second_writer_of_one_destination_leaves_the_first_ones_file_alone(tmp_path):
    """Another process writes the destination while this one's writer is open: both finish."""
    dest = tmp_path / "d.psk.d"
    with Writer(dest, "ℝ[]") as first:
        first.append(np.arange(3.0))
        code = f"from pskd_jax.format import write; import numpy as np; write({str(dest)!r}, 'ℝ[]', np.ones(5))"
        assert run_python(code, timeout=60).returncode == 0
        assert os.path.exists(first._tmp)
        with Reader(dest) as reader:
            assert len(reader) == 5
    with Reader(dest) as reader:
        assert len(reader) == 3
    assert _temporaries(str(tmp_path)) == []


def test_outputs_get_the_mode_of_the_umask_not_that_of_a_temporary_file(tmp_path):
    old = os.umask(0o027)
    try:
        write(tmp_path / "a.psk.d", "ℝ[]", np.arange(2.0))
        with atomic_output(str(tmp_path / "b.txt")) as f:
            f.write(b"b")
    finally:
        os.umask(old)
    assert [(tmp_path / n).stat().st_mode & 0o777 for n in ("a.psk.d", "b.txt")] == [0o640, 0o640]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(ROOT))
        worker(sys.argv[2])
    else:
        sys.exit("usage: python tests/robustness/test_faults.py --worker SCRATCH (run by pytest)")


def test_a_file_system_without_flock_still_gets_atomic_output(tmp_path, monkeypatch):
    import errno

    from pskd_jax._os import atomic as fileio
    from pskd_jax._os import locks

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    destination = tmp_path / "out.bin"
    with fileio.atomic_output(str(destination)) as f:
        f.write(b"whole")
    assert destination.read_bytes() == b"whole"
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]  # no temporary made and left per retry
