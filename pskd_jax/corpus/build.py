"""Building a sharded token corpus on this machine: documents → tokens → shards → ``shards.json``.

:func:`build_corpus` plans one shard per input file (:func:`plan_shards`), keeps those an earlier
build of the same inputs and options finished (:mod:`pskd_jax.corpus.journal`), builds the others
with :func:`pskd_jax.corpus.shard_build.build_shard` in this process or a pool
(:mod:`pskd_jax.corpus.pool`), journals each as it finishes, and keeps ``shards.json`` listing the
finished ones until the complete manifest is written (:mod:`pskd_jax.corpus.publisher`). A killed
build resumes, and gives the bytes of an uninterrupted one. The rules — resuming, reading while a
build writes, links at the build's own names — are in ``docs/corpus.md`` (Building).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from pskd_jax._os import names
from pskd_jax.corpus.inputs import EXAMPLES, find_inputs, require_inputs, source_of
from pskd_jax.corpus.journal import BuildJournal, recorded_shards
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.maintain import shard_problem
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.pool import run_tasks
from pskd_jax.corpus.publisher import ManifestPublisher, check_manifest_name, tidy_directory
from pskd_jax.corpus.shard_build import ShardResult, ShardTask
from pskd_jax.errors import CorpusDirectoryError

#: ``progress(done_bytes, total_bytes, done_shards, total_shards)``: input bytes read (those of
#: kept shards included) and shards finished (kept ones included), of all the build's.
Progress = Callable[[int, int, int, int], None]

PROGRESS_SECONDS = 0.1  # the least time between two progress reports, but for a finished shard's


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What a build did: the manifest written, shards built and kept, bad documents left out (and
    the first few), input bytes tokenized, and the wall time."""

    manifest: Manifest
    built: int
    kept: int
    skipped: int
    examples: tuple[str, ...]
    input_bytes: int
    seconds: float


def build_corpus(inputs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                 options: BuildOptions | None = None, *, progress: Progress | None = None,
                 start_method: str | None = None) -> BuildResult:
    """Builds (or finishes) the corpus of ``inputs`` in ``out_dir``: one shard per input file,
    ``options.workers`` processes, ``shards.json`` written last. ``progress`` is called now and
    then (see :data:`Progress`); ``start_method`` chooses how pool workers start (default:
    :func:`pskd_jax.corpus.pool.pool_context`). The directory's build lock is held throughout: a
    second build of it is refused (E9016)."""
    started = time.perf_counter()
    options = BuildOptions.checked(options)
    sources = require_inputs(find_inputs(inputs), inputs)
    directory = _corpus_directory(out_dir)
    with directory_lock(directory) as lock_fd:
        check_manifest_name(os.path.join(directory, MANIFEST))
        journal = BuildJournal(directory, options)
        tasks = plan_shards(sources, directory, options, recorded_shards(directory, journal, options))
        results = kept_shards(tasks, options.workers)
        journal.start([r.entry for r in results if r is not None])
        publisher = ManifestPublisher(directory, options, len(tasks))
        publisher.start(results)  # from here on, shards the manifest does not list may change
        ledger = _Ledger(tasks, results, journal, publisher, progress)
        ledger.report(force=True)
        inherited = [fd for fd in (lock_fd, journal.fileno()) if fd is not None]
        try:
            run_tasks([t for t in tasks if results[t.index] is None], options.workers, ledger,
                      start_method=start_method, inherited=inherited)
        except BaseException:
            with contextlib.suppress(Exception):  # a full disk, say: the manifest stays as it was
                publisher.update(results, now=True)
            raise
        finally:
            journal.close()
        finished = [r for r in results if r is not None]
        manifest = publisher.finish(finished)
        tidy_directory(directory, manifest)
    examples = tuple(e for r in finished for e in r.examples)[:EXAMPLES]
    return BuildResult(manifest, sum(not r.kept for r in finished), sum(r.kept for r in finished),
                       sum(r.entry.skipped for r in finished), examples,
                       sum(r.input_bytes for r in finished), time.perf_counter() - started)


def _corpus_directory(out_dir: str | os.PathLike[str]) -> str:
    directory = os.fspath(out_dir)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CorpusDirectoryError(f"{directory}: cannot create the corpus directory: {e.strerror or e}") from e
    return directory


def plan_shards(sources: Sequence[str], directory: str, options: BuildOptions, recorded: dict[str, Shard]
                ) -> list[ShardTask]:
    """One task per input: shard ``i`` at its fixed name in ``directory``, with the entry an earlier
    build ``recorded`` under that name when it names the same input (path, size, modification time)."""
    tasks = []
    for i, source in enumerate(sources):
        name = names.shard_name(i)
        entry = recorded.get(name)
        if entry is not None and entry.source != source_of(source):
            entry = None
        tasks.append(ShardTask(i, source, os.path.join(directory, name), options, entry))
    return tasks


def _keeps(task: ShardTask) -> bool:
    """Whether the shard recorded for the task is intact and kept. A symbolic link at the shard's
    name is never kept: it is replaced."""
    return task.recorded is not None and not os.path.islink(task.shard_path) \
        and shard_problem(task.shard_path, task.recorded, task.options.tokenizer) is None


def kept_shards(tasks: Sequence[ShardTask], workers: int) -> list[ShardResult | None]:
    """The result of each task whose recorded shard is kept, None for those to build; the
    recorded shards are checked (hashed) in ``workers`` threads, before anything is written."""
    candidates = [t for t in tasks if t.recorded is not None]
    if workers > 1 and len(candidates) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(candidates))) as pool:
            keep = list(pool.map(_keeps, candidates))
    else:
        keep = [_keeps(t) for t in candidates]
    results: list[ShardResult | None] = [None] * len(tasks)
    for task, kept in zip(candidates, keep):
        if kept and task.recorded is not None:
            results[task.index] = ShardResult(task.recorded, (), True, 0)
    return results


class _Ledger:
    """The build's account while shards are built (the :class:`pskd_jax.corpus.pool.TaskEvents`
    of :func:`run_tasks`): each finished shard journaled, then published, and progress reported."""

    def __init__(self, tasks: Sequence[ShardTask], results: list[ShardResult | None], journal: BuildJournal,
                 publisher: ManifestPublisher, progress: Progress | None):
        self.results, self.journal, self.publisher, self.progress = results, journal, publisher, progress
        self.total_bytes = sum(os.stat(t.source).st_size for t in tasks)
        self.done_bytes = sum(r.entry.source["size"] for r in results if r is not None and r.entry.source)
        self._last = 0.0

    def finished(self, task: ShardTask, result: ShardResult) -> None:
        self.results[task.index] = result
        self.journal.add(result.entry)
        self.publisher.update(self.results)
        self.report(force=True)

    def progressed(self, input_bytes: int) -> None:
        self.done_bytes += input_bytes
        self.report()

    def poll(self) -> None:
        self.publisher.update(self.results)  # a rewrite held back by PUBLISH_SECONDS
        self.report()

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._last > PROGRESS_SECONDS):
            self._last = now
            self.progress(self.done_bytes, self.total_bytes, sum(r is not None for r in self.results),
                          len(self.results))


__all__ = ["PROGRESS_SECONDS", "BuildResult", "Progress", "build_corpus", "kept_shards", "plan_shards"]
