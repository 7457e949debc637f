"""What many test files need, written once: the repository's paths, commands run the way a user
runs them, and checks of an error's code.

Commands run in a fresh interpreter with :data:`ENV`: this checkout first on the path, one BLAS
thread (the machine's cores are shared by the tests that run processes side by side), and none of
pytest's own variables. ``pskd`` is either the console script the package installed beside this
interpreter (``script=True``, as a user types it) or ``python -m pskd_jax.apps.pskd``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time

import pytest

from pskd_jax.errors import PskdError

__all__ = [
    "ENV",
    "HANG_GUARD_S",
    "ROOT",
    "SCRIPT",
    "TESTDATA",
    "assert_code",
    "documents",
    "free_port",
    "pskd",
    "pskd_fails",
    "pskd_ok",
    "python",
    "raises",
    "run_jax_processes",
    "run_python",
    "start_pskd",
    "train_lm",
    "wait_until",
    "wait_until_waiting_for_lock",
    "waiting_for_lock",
]

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "testdata"
# The console script the package installs beside this interpreter (None where it is not installed).
SCRIPT = shutil.which("pskd", path=os.path.dirname(sys.executable))
ENV = {
    **{key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")},
    "PYTHONPATH": str(ROOT),
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def c_compiler_found() -> bool:
    """Whether a C compiler and Python's headers are here, as setup.py's build of the compiled
    scan (pskd_jax/corpus/_segments.c) needs: where they are, the install must have built it."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None and pathlib.Path(sysconfig.get_paths()["include"], "Python.h").exists()


C_COMPILER_FOUND = c_compiler_found()
TIMEOUT_S = 300  # a command that hangs fails its test instead of the whole run
# How long a test waits for something that must happen (a process reaching a point, a file
# appearing) before it calls it a hang. A guard against hanging the run, never a measure of
# speed: no test asserts how long anything took, and a loaded machine only makes waits longer.
HANG_GUARD_S = 600


def _pskd_command(script: bool) -> list[str]:
    if script:
        assert SCRIPT is not None, "the pskd console script is not installed beside this interpreter"
        return [SCRIPT]
    return [sys.executable, "-m", "pskd_jax.apps.pskd"]


def pskd(*args, cwd=None, script: bool = False, env: dict | None = None, timeout: float = TIMEOUT_S,
         **options) -> subprocess.CompletedProcess:
    """Runs ``pskd ARGS`` in a fresh interpreter (in the repository root unless ``cwd`` is given)
    and returns what it did, text captured."""
    return subprocess.run([*_pskd_command(script), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env or ENV, timeout=timeout, **options)


def start_pskd(*args, cwd=None, script: bool = False, **options) -> subprocess.Popen:
    """Starts ``pskd ARGS`` (as :func:`pskd` runs it) and returns the running process; ``options``
    go to ``Popen`` (its pipes, for one)."""
    return subprocess.Popen([*_pskd_command(script), *map(str, args)], cwd=cwd or ROOT, **{"env": ENV, **options})


def pskd_ok(*args, **options) -> list[str]:
    """Runs a command that must succeed and print nothing on stderr; returns its stdout lines."""
    result = pskd(*args, **options)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # not a terminal: no progress bar either
    return result.stdout.splitlines()


def pskd_fails(code: str, *args, status: int | None = None, **options) -> str:
    """Runs a command that must fail with ``code``: nothing on stdout, one line ``pskd: CODE: …`` on
    stderr, no traceback, and exit status ``status``: by default 1, or for a usage error (E9012)
    1 or 2 (2 where the command line itself does not parse, as argparse exits). Returns the line."""
    result = pskd(*args, **options)
    expected = {status} if status is not None else {1, 2} if code == "E9012" else {1}
    assert result.returncode in expected, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert_code(result, code)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def train_lm(*args, cwd=None, env: dict | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs ``python -m pskd_jax.apps.train_lm ARGS`` on the CPU, text captured (in ``env``, by
    default :data:`ENV`)."""
    return subprocess.run([sys.executable, "-m", "pskd_jax.apps.train_lm", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=timeout, env=dict(env or ENV, JAX_PLATFORMS="cpu"))


def python(code: str, *args, **options) -> subprocess.Popen:
    """Starts ``python -c CODE ARGS`` (the code dedented), text pipes on stdout and stderr."""
    options = {"env": ENV, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **options}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], **options)


def run_python(code: str, *args, timeout: float = TIMEOUT_S, **options) -> subprocess.CompletedProcess:
    """Runs ``python -c CODE ARGS`` (the code dedented) to its end, text captured."""
    options = {"env": ENV, "capture_output": True, "text": True, "cwd": ROOT, **options}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], timeout=timeout, **options)


def run_jax_processes(code: str, *args, env: dict, count: int = 2, devices: int = 4,
                      timeout: float = 300) -> list[tuple[int, str, str]]:
    """Runs ``count`` JAX processes of ``python -c CODE K PORT ARGS`` (K the process's index, PORT
    a free coordinator port) on the CPU with ``devices`` host devices each, to their ends; their
    ``(returncode, stdout, stderr)`` in order (any still running at a failure are killed)."""
    env = dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    port = str(free_port())
    workers = [python(code, k, port, *args, env=env) for k in range(count)]
    outputs = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=timeout)
            outputs.append((worker.returncode, out, err))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    return outputs


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a JAX coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_code(outcome, code: str, *fragments: str) -> str:
    """Checks that ``outcome`` failed with ``code`` and that its message holds every fragment;
    returns the message. ``outcome`` is a :class:`PskdError`, the ``ExceptionInfo`` of
    ``pytest.raises`` or a finished command (whose stderr must begin ``pskd: CODE: ``)."""
    if isinstance(outcome, subprocess.CompletedProcess):
        message = outcome.stderr
        assert message.startswith(f"pskd: {code}: "), message
        assert "Traceback" not in message, message
    else:
        error = outcome.value if isinstance(outcome, pytest.ExceptionInfo) else outcome
        assert isinstance(error, PskdError), repr(error)
        assert error.code == code, str(error)
        message = error.message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def raises(code: str, *args, **kwargs):
    """A :class:`PskdError` with ``code``, in either of pytest.raises' two forms:

    - ``raises(code, fn, *args, **kwargs)`` calls ``fn`` and returns the error it raised;
    - ``with raises(code, *fragments) as info:`` checks the error raised in the block, and that its
      message holds every fragment (``info`` is pytest's ``ExceptionInfo``).
    """
    if args and callable(args[0]):
        with pytest.raises(PskdError) as info:
            args[0](*args[1:], **kwargs)
        assert_code(info, code)
        return info.value
    return _raises_in_block(code, args)


@contextlib.contextmanager
def _raises_in_block(code: str, fragments: tuple[str, ...]):
    with pytest.raises(PskdError) as info:
        yield info
    assert_code(info, code, *fragments)


def documents(path: pathlib.Path, n: int, seed: int, width: int = 60) -> pathlib.Path:
    """Writes ``n`` random documents of up to ``width`` words (some of them not ASCII), one JSON object
    a line, to ``path``; the same documents for the same seed."""
    rng = random.Random(seed)
    words = ["corpus", "shard", "tökén", "window", "boundary", "jax", "données", "🙂", "a", "the"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(0, width)))
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
    return path


def wait_until(condition, *, alive: subprocess.Popen | None = None, what: str = "the condition") -> None:
    """Polls ``condition()`` until it holds. Fails at once if the process ``alive`` ends first
    (with what it printed), and after :data:`HANG_GUARD_S` (a hang, not a slow machine)."""
    guard = time.monotonic() + HANG_GUARD_S
    while not condition():
        if alive is not None and alive.poll() is not None:
            out, err = alive.communicate()
            raise AssertionError(f"the process ended (status {alive.returncode}) before {what}: {out}{err}")
        assert time.monotonic() < guard, f"waited {HANG_GUARD_S} s for {what}: a hang"
        time.sleep(0.002)


def waiting_for_lock(pid: int, path: str | os.PathLike) -> bool:
    """Whether process ``pid`` is blocked waiting for an ``flock`` on the file ``path`` (Linux
    lists waiters in /proc/locks, marked ``->``, with their pid and the file's inode)."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[5] == str(pid) \
                and fields[6].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def wait_until_waiting_for_lock(process: subprocess.Popen, path: str | os.PathLike) -> None:
    """Waits until ``process`` blocks on the lock of ``path`` (it reached the point where it must
    wait): what a test checks in place of "still running after a head start"."""
    wait_until(lambda: waiting_for_lock(process.pid, path), alive=process,
               what=f"process {process.pid} waited for the lock of {path}")
