"""Kill points a writer reaches for sure, whatever the machine's speed or load.

A writer under test runs in a process of its own. :func:`arm` makes that process count its own
file-system operations on paths under a root directory (the test's scratch directory), each one
a *step* of the run:

- the operations Python reports to audit hooks (``sys.addaudithook``): opening a file, creating a
  temporary file, renaming, removing, truncating, making or listing a directory, changing a mode,
  taking an ``flock``;
- the ones that report nothing, through wrappers of the ``os`` functions that do them:
  ``os.write``, ``os.pwrite``, ``os.pwritev``, ``os.fsync`` and ``os.fdatasync`` on a descriptor
  of a file under the root.

A plan says where the process dies:

- ``{"step": k}``: SIGKILL just before step ``k`` (0-based): before the output is opened, between
  two chunks, between the sync and the rename, after the rename, as ``k`` falls;
- ``{"step": k, "bytes": n}``: from step ``k`` on, a file size limit of ``n`` bytes with SIGXFSZ at
  its default action: the process dies inside its next write past byte ``n`` of any file (that
  file then holds exactly ``n`` bytes: a write half done). Nothing of the process runs after
  either signal, as after a SIGKILL.
- ``{"at": [kind, name], "occurrence": j}``: SIGKILL just before the ``j``-th (1-based) step of
  that kind on that name (relative to the root, e.g. ``["os.fsync", "c/.shards.journal"]``).
- ``{"record": PATH}``: no kill; each step is appended to the file PATH as one JSON line
  ``[kind, name]`` (names relative to the root; a temporary file's random part kept).

A run from a given state does the same steps in the same order (the toolkit's writers are
deterministic; what a step is does not depend on time), so a step drawn from a recorded run of
that state is reached for sure, on any machine (one exception: a corpus build republishes its
manifest in progress at most every half second, so the count of those steps follows the clock;
``test_faults`` draws again a kill that such a run ended before). Steps on temporary files the process did not
make (those killed runs left, which it removes first) are not counted: a run after a kill does
the same numbered steps as one after none. Only the process that armed counts: a pool worker
it forks inherits the hook and ignores it.

``python -m tests.robustness.kill_points PLAN ROOT -- ARGS`` runs ``pskd ARGS`` armed with the
plan (JSON) in a fresh interpreter.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import sys
import threading

__all__ = ["KILLED", "arm", "byte_plans", "killed", "recorded", "step_plans"]

#: The signals a plan kills with.
KILLED = (signal.SIGKILL, signal.SIGXFSZ)

_AUDITED = {"open", "tempfile.mkstemp", "os.rename", "os.remove", "os.truncate", "os.mkdir", "os.rmdir",
            "os.listdir", "os.scandir", "os.chmod", "os.link", "os.symlink", "fcntl.flock"}
_WRAPPED = ("write", "pwrite", "pwritev", "fsync", "fdatasync")
_PR_SET_DUMPABLE = 4
_TEMPORARY = re.compile(r"\..+\.tmp")  # the toolkit's temporary files (pskd_jax._os.names)


def killed(wait_status: int) -> bool:
    """Whether a process of this module's plans died by its plan's signal."""
    return os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) in KILLED


class _Counter:
    def __init__(self, root: str, plan: dict):
        self.root = os.path.realpath(root) + os.sep
        self.plan = plan
        self.pid = os.getpid()
        self.steps = 0
        self.local = threading.local()  # a step's own calls (readlink) are not steps
        self.lock = threading.Lock()  # threads of one process (a manager's background save) count in turn
        self.occurrences = 0
        self.own: set[str] = set()  # the temporary files this process made
        self.record_fd = None
        if "record" in plan:
            self.record_fd = os.open(plan["record"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._write = os.write  # the real one, for the record

    def name_of(self, target) -> str | None:
        """The path (relative to the root) a path or a descriptor names, None outside the root."""
        if isinstance(target, bytes):
            target = os.fsdecode(target)
        if isinstance(target, int):
            try:
                target = os.readlink(f"/proc/self/fd/{target}")
            except OSError:
                return None
        if not isinstance(target, str):
            return None
        full = os.path.abspath(target)
        if not (full + os.sep).startswith(self.root):
            real = os.path.realpath(os.path.dirname(full))
            full = os.path.join(real, os.path.basename(full))
            if not (full + os.sep).startswith(self.root):
                return None
        return os.path.relpath(full, self.root[:-1])

    def step(self, kind: str, target) -> None:
        if getattr(self.local, "busy", False) or os.getpid() != self.pid:
            return
        self.local.busy = True
        try:
            name = self.name_of(target)
            if name is None:
                return
            if kind == "tempfile.mkstemp":
                self.own.add(name)
            elif _TEMPORARY.fullmatch(os.path.basename(name)) and name not in self.own:
                return  # a killed run's leftover this one removes: the same steps follow either way
            with self.lock:
                self._act(kind, name)
                self.steps += 1
        finally:
            self.local.busy = False

    def _act(self, kind: str, name: str) -> None:
        plan = self.plan
        if self.record_fd is not None:
            self._write(self.record_fd, (json.dumps([kind, name]) + "\n").encode())
            return
        if "at" in plan:
            if [kind, name] == list(plan["at"]):
                self.occurrences += 1
                if self.occurrences == plan["occurrence"]:
                    os.kill(os.getpid(), signal.SIGKILL)
            return
        if self.steps == plan["step"]:
            if "bytes" not in plan:
                os.kill(os.getpid(), signal.SIGKILL)
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]  # (an ordinary user cannot raise it)
            resource.setrlimit(resource.RLIMIT_FSIZE, (plan["bytes"], hard))


def arm(root: str, plan: dict) -> None:
    """Counts this process's file-system steps under ``root`` and acts on ``plan`` (see the module
    docstring). Call it in the process to be killed, before the writer starts; it cannot be undone."""
    counter = _Counter(root, plan)
    if "bytes" in plan:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: writes would fail instead
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # no core dump, even piped

    def hook(event: str, args: tuple) -> None:
        if event in _AUDITED and args:
            target = args[0]
            if event == "open" and isinstance(target, int):
                return  # os.fdopen of a descriptor opened (and counted) already
            counter.step(event, target)

    sys.addaudithook(hook)
    for name in _WRAPPED:
        real = getattr(os, name, None)
        if real is None:
            continue

        def wrapped(fd, *args, _real=real, _kind=f"os.{name}"):
            counter.step(_kind, fd)
            return _real(fd, *args)

        setattr(os, name, wrapped)


# --- choosing plans ----------------------------------------------------------------------------


def recorded(path: str) -> list[tuple[str, str]]:
    """The steps a ``{"record": path}`` run wrote."""
    with open(path, encoding="utf-8") as f:
        return [tuple(json.loads(line)) for line in f if line.strip()]


def step_plans(steps: int, count: int, rng) -> list[dict]:
    """``count`` kills spread over a run of ``steps`` steps: one drawn in each of ``count`` equal
    stretches of it, so that every part of the run (opening, writing, syncing, renaming) is hit."""
    return [{"step": min(steps - 1, int((i + rng.random()) * steps / count))} for i in range(count)]


def byte_plans(size: int, count: int, rng, *, step: int = 0) -> list[dict]:
    """``count`` kills inside writes, from step ``step`` on: at a byte drawn in each of ``count``
    equal stretches of ``size`` (the size of the file the writer writes)."""
    return [{"step": step, "bytes": max(1, min(size - 1, int((i + rng.random()) * size / count)))}
            for i in range(count)]


def _main(argv: list[str]) -> None:
    plan, root, rest = json.loads(argv[0]), argv[1], argv[argv.index("--") + 1 :]
    import pskd_jax.apps.pskd as pskd  # imported before arming: its modules are not steps

    arm(root, plan)
    sys.argv = ["pskd", *rest]
    pskd.run()


if __name__ == "__main__":
    _main(sys.argv[1:])
