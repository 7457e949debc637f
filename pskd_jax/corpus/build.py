"""Building a sharded token corpus on this machine: documents → tokens → shards → ``shards.json``.

:func:`build_corpus` plans one shard per input file (:func:`plan_shards`), keeps those an earlier
build of the same inputs and options finished (:mod:`pskd_jax.corpus.journal`), builds the others
with :func:`pskd_jax.corpus.shard_build.build_shard` in this process or a pool
(:mod:`pskd_jax.corpus.pool`), journals each as it finishes, and keeps ``shards.json`` listing the
finished ones until the complete manifest is written (:mod:`pskd_jax.corpus.publisher`). A killed
build resumes, and gives the bytes of an uninterrupted one. A build replaces or removes a file at
a shard's name only when an earlier record of the place lists it (its ``shards.json`` or journal);
any other file at a name it would write makes it refuse to start (E9012). The rules — resuming,
reading while a build writes, links at the build's own names — are in ``docs/corpus.md``
(Building).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Callable, Sequence

from pskd_jax._os import names
from pskd_jax.corpus.inputs import EXAMPLES, find_inputs, require_inputs, source_of
from pskd_jax.corpus.journal import (
    BuildJournal,
    journal_for,
    local_manifest,
    owned_shards,
    previous_manifest,
    recorded_shards,
)
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.maintain import shard_problem
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.pool import run_tasks
from pskd_jax.corpus.publisher import ManifestPublisher, check_manifest_name, check_shard_names, tidy_directory
from pskd_jax.corpus.shard_build import BuildClaim, ShardResult, ShardTask
from pskd_jax.errors import CorpusDirectoryError
from pskd_jax.storage import CREATE, Location, Version, is_object_url, locate, object_digest, resolve

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
    """Builds (or finishes) the corpus of ``inputs`` (paths, or objects' URLs) in ``out_dir`` (a
    directory, or a prefix of a store: ``s3://bucket/corpus``): one shard per input file,
    ``options.workers`` processes, ``shards.json`` written last. ``progress`` is called now and
    then (see :data:`Progress`); ``start_method`` chooses how pool workers start (default:
    :func:`pskd_jax.corpus.pool.pool_context`, ``spawn`` when a store is involved). A local
    directory's build lock is held throughout: a second build of it is refused (E9016); in a
    store, the build that puts its manifest first wins and the other stops (E9016). A file (or
    object) at a shard name the build would write that no manifest or journal of the place lists
    is the user's: the build refuses (E9012) before writing anything."""
    started = time.perf_counter()
    options = BuildOptions.checked(options)
    place = locate(out_dir)  # E9018 for a URL the toolkit cannot serve: never a local directory named "s3:"
    sources = require_inputs(find_inputs(inputs), inputs)
    in_store = not place.is_local or any(is_object_url(s) for s in sources)
    if in_store and start_method is None:
        start_method = "spawn"  # a store's client runs threads a fork would not carry over
    # memory:// stores are this process's own: their shards are built here, one at a time.
    here = place.scheme == "memory" or any(s.startswith("memory://") for s in sources)
    planned = [names.shard_name(i) for i in range(len(sources))]
    if not place.is_local:
        journal = journal_for(place, options)
        previous, condition = previous_manifest(place)
        owned = owned_shards(journal, previous)
        check_shard_names(place, planned, owned)
        writer = secrets.token_hex(8)
        claim = BuildClaim(place.child(MANIFEST).url, writer)
        tasks = plan_shards(sources, place, options, recorded_shards(journal, options, previous), claim)
        run = _Run(place, options, tasks, journal, progress, owned, writer=writer, condition=condition)
        finished = run.build(start_method, here, [])
        return _result(finished, run.finish(finished), started)
    directory = _corpus_directory(place.path)
    local = Location("file", "", directory)
    with directory_lock(directory) as lock_fd:
        check_manifest_name(os.path.join(directory, MANIFEST))
        journal = journal_for(local, options)
        previous = local_manifest(directory)
        owned = owned_shards(journal, previous)
        check_shard_names(local, planned, owned)
        tasks = plan_shards(sources, local, options, recorded_shards(journal, options, previous))
        run = _Run(local, options, tasks, journal, progress, owned)
        finished = run.build(start_method, here, [lock_fd])
        manifest = run.finish(finished)
    return _result(finished, manifest, started)


def _result(finished: Sequence[ShardResult], manifest: Manifest, started: float) -> BuildResult:
    examples = tuple(e for r in finished for e in r.examples)[:EXAMPLES]
    return BuildResult(manifest, sum(not r.kept for r in finished), sum(r.kept for r in finished),
                       sum(r.entry.skipped for r in finished), examples, sum(r.input_bytes for r in finished),
                       time.perf_counter() - started)


class _Run:
    """One build's course once its shards are planned: the kept ones checked, the journal started
    and the first manifest put, the others built and journaled, the complete manifest written and
    the place tidied. ``owned`` are the shard names earlier records of the place list."""

    def __init__(self, place: Location, options: BuildOptions, tasks: list[ShardTask], journal: BuildJournal,
                 progress: Progress | None, owned: set[str], *, writer: str | None = None,
                 condition: str | Version = CREATE):
        self.place, self.options, self.tasks, self.journal = place, options, tasks, journal
        self.owned = owned
        self.publisher = ManifestPublisher(place, options, len(tasks), writer=writer, condition=condition)
        self.results = kept_shards(tasks, options.workers)
        self.ledger = _Ledger(tasks, self.results, journal, self.publisher, progress)

    def build(self, start_method: str | None, here: bool, inherited: list[int]) -> list[ShardResult]:
        results = self.results
        kept = [r.entry for r in results if r is not None]
        # The journal names every shard the build may write, and those earlier records listed, so
        # that a rerun after a kill knows them for its own. In a directory it comes first (the
        # first manifest may list fewer names than the one before it); in a store the claim comes
        # first: a build that loses it puts nothing.
        writes = self.owned | {names.shard_name(t.index) for t in self.tasks}
        if self.place.is_local:
            self.journal.start(kept, writes)
        try:
            self.publisher.start(results)  # from here on, shards the manifest does not list may change
            if not self.place.is_local:
                self.journal.start(kept, writes)
            self.ledger.report(force=True)
            descriptors = [fd for fd in (*inherited, self.journal.fileno()) if fd is not None]
            run_tasks([t for t in self.tasks if results[t.index] is None], self.options.workers, self.ledger,
                      start_method=start_method, inherited=descriptors, in_process=here)
        except BaseException:
            with contextlib.suppress(Exception):  # a full disk, say: the manifest stays as it was
                self.publisher.update(results, now=True)
            raise
        finally:
            self.journal.close()
        return [r for r in results if r is not None]

    def finish(self, finished: list[ShardResult]) -> Manifest:
        if not self.place.is_local:
            check_unchanged(self.place, finished)
        manifest = self.publisher.finish(finished)
        tidy_directory(self.place if not self.place.is_local else self.place.path, manifest, self.owned)
        return manifest


def check_unchanged(place: Location, finished: Sequence[ShardResult]) -> None:
    """Before the complete manifest of a build into a store: every shard this build put is still
    the object it put (E9016 when another build overwrote one meanwhile)."""
    store, _ = resolve(place)
    for result in finished:
        if result.tag is None:
            continue
        found = store.info(place.child(result.entry.path).key)
        if found is None or found.tag != result.tag:
            raise CorpusDirectoryError(f"{place.child(result.entry.path).url}: changed while this build ran (another "
                                       "build of this corpus wrote it?); this build's shards are not listed: run "
                                       "one build of a corpus at a time, then run it again to finish it")


def _corpus_directory(out_dir: str | os.PathLike[str]) -> str:
    directory = os.fspath(out_dir)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CorpusDirectoryError(f"{directory}: cannot create the corpus directory: {e.strerror or e}") from e
    return directory


def plan_shards(sources: Sequence[str], place: str | Location, options: BuildOptions, recorded: dict[str, Shard],
                claim: BuildClaim | None = None) -> list[ShardTask]:
    """One task per input: shard ``i`` at its fixed name in ``place`` (a directory, or a prefix
    of a store), with the entry an earlier build ``recorded`` under that name when it names the
    same input (path, size, modification time or version tag)."""
    where = Location("file", "", place) if isinstance(place, str) else place
    tasks = []
    for i, source in enumerate(sources):
        name = names.shard_name(i)
        identity = source_of(source)
        entry = recorded.get(name)
        if entry is not None and entry.source != identity:
            entry = None
        shard = os.path.join(where.path, name) if where.is_local else where.child(name).url
        tasks.append(ShardTask(i, source, shard, options, entry, identity["size"], claim))
    return tasks


def _keeps(task: ShardTask) -> bool:
    """Whether the shard recorded for the task is intact and kept. A symbolic link at the shard's
    name is never kept: it is replaced. An object of a store is kept when its size and sha256 are
    its entry's (the entry was written by a build of the same tokenizer and options)."""
    if task.recorded is None:
        return False
    if is_object_url(task.shard_path):
        return _object_matches(task.shard_path, task.recorded, task.options)
    return not os.path.islink(task.shard_path) \
        and shard_problem(task.shard_path, task.recorded, task.options.tokenizer) is None


def _object_matches(url: str, entry: Shard, options: BuildOptions) -> bool:
    store, where = resolve(url)
    found = store.info(where.key)
    tokenizer = options.tokenizer
    if found is None or found.size != len(tokenizer.header(0)) + entry.tokens * tokenizer.dtype.itemsize:
        return False
    return object_digest(store, where.key, "sha256") == entry.sha256


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
        self.total_bytes = sum(t.size for t in tasks)
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


__all__ = ["PROGRESS_SECONDS", "BuildResult", "Progress", "build_corpus", "check_unchanged", "kept_shards",
           "plan_shards"]
