"""Running a local build's shard tasks: in this process, or on a pool of worker processes.

The runner knows nothing of journals or manifests: it tells a :class:`TaskEvents` (the build's
bookkeeping) when a shard is finished, how many input bytes were read, and, while the pool runs,
that time passed. A pool worker ends as soon as the build process is gone, and a forked worker
closes the descriptors of the build's lock and journal it inherited.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from pskd_jax.corpus.shard_build import ShardResult, ShardTask
from pskd_jax.errors import TruncatedError

POLL_SECONDS = 0.2  # how often the build process looks at a running pool


class TaskEvents(Protocol):
    """What the runner reports to the build, always in the build process."""

    def finished(self, task: ShardTask, result: ShardResult) -> None:
        """A task's shard is built (called in index order among shards that end together)."""

    def progressed(self, input_bytes: int) -> None:
        """``input_bytes`` more bytes of input were read."""

    def poll(self) -> None:
        """Time passed while the pool runs (a manifest rewrite held back may be due now)."""


# Set in each pool worker by _init_worker: the shared progress counter and the parent's pid.
_PROGRESS: Any = None

_PARENT: int | None = None


def _init_worker(progress: Any, parent: int, inherited: Sequence[int]) -> None:
    """A pool worker's set-up: the progress counter, a watchdog that ends the worker as soon as
    the build process is gone (killed, it cannot shut its pool down: a worker left behind, idle or
    mid-shard, would outlive it), and, in a forked worker, closing the descriptors it inherited
    that hold the directory's lock and the journal: they belong to the build process alone."""
    global _PROGRESS, _PARENT
    _PROGRESS, _PARENT = progress, parent
    # A tokenizer.json encodes on one thread per worker: the pool is the parallelism (unless the user said).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    threading.Thread(target=_watch_parent, args=(parent,), name="pskd-corpus-watchdog", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.05)
    os._exit(1)


def _worker_bytes(n: int) -> None:
    """Progress from a pool worker, added to the counter the build process reads."""
    if _PROGRESS is not None:
        with _PROGRESS.get_lock():
            _PROGRESS.value += n


def _run_in_worker(task: ShardTask) -> ShardResult:
    return task.run(_worker_bytes)


def pool_context(start_method: str | None = None) -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the build's pool: ``start_method`` if given; else ``fork``
    (workers start at once) when this process runs no other thread and has not imported JAX (whose
    runtime threads a fork would copy in an unknown state), and ``spawn`` otherwise."""
    if start_method is None:
        threads = threading.active_count() > 1 or "jax" in sys.modules
        start_method = "spawn" if threads or "fork" not in multiprocessing.get_all_start_methods() else "fork"
    return multiprocessing.get_context(start_method)


def run_tasks(tasks: Sequence[ShardTask], workers: int, events: TaskEvents, *, start_method: str | None = None,
              inherited: Sequence[int] = (), in_process: bool = False) -> None:
    """Builds every task's shard: in this process when ``workers`` is 1, there is one task or
    ``in_process`` (a ``memory://`` store is this process's own), else
    on ``min(workers, len(tasks))`` processes (started by :func:`pool_context`; a forked worker
    closes the descriptors ``inherited``), the largest inputs first. The first error is raised
    once the running shards end; the tasks not started are cancelled."""
    if not tasks:
        return
    if workers == 1 or len(tasks) == 1 or in_process:
        for task in tasks:
            events.finished(task, task.run(events.progressed))
        return
    _run_on_pool(tasks, workers, events, pool_context(start_method), inherited)


def _run_on_pool(tasks: Sequence[ShardTask], workers: int, events: TaskEvents,
                 context: multiprocessing.context.BaseContext, inherited: Sequence[int]) -> None:
    counter = context.Value("q", 0)
    counted = 0
    order = sorted(tasks, key=lambda t: -t.size)  # the largest first: better balance
    error: BaseException | None = None
    closed = list(inherited) if context.get_start_method() == "fork" else []
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context,
                                                initializer=_init_worker,
                                                initargs=(counter, os.getpid(), closed)) as pool:
        futures = {pool.submit(_run_in_worker, task): task for task in order}
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=POLL_SECONDS,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            now = counter.value
            events.progressed(now - counted)
            counted = now
            for future in sorted(done, key=lambda f: futures[f].index):
                if future.cancelled():
                    continue
                try:
                    events.finished(futures[future], future.result())
                except BaseException as e:  # the first error is raised once the running shards end
                    if error is None:
                        error = e
                        for other in pending:
                            other.cancel()
            if error is None:
                events.poll()
    if error is not None:
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
            raise TruncatedError(f"a build worker died ({error}); run the build again to finish it") from None
        raise error


__all__ = ["POLL_SECONDS", "TaskEvents", "pool_context", "run_tasks"]
