"""Building a sharded token corpus: documents → tokens → shards → ``shards.json``.

The unit of work is :func:`build_shard`, a pure function of its input file and options: one input
file (``.jsonl``, ``.jsonl.gz``, or ``.txt``) becomes one shard and its manifest entry. Any engine
that can run a function on many files can build a corpus with it and write the manifest with
:func:`pskd_jax.corpus.write_manifest`; :func:`build_corpus` does so with a process pool, and
resumes a build that was killed.

Documents
---------
How inputs are read, documents found and tokenized, and what counts as bad input: see
:mod:`pskd_jax.corpus_tokens`. Every document is followed by one boundary token, the last of the
shard included (see :mod:`pskd_jax.corpus`).

Writing a shard
---------------
See :mod:`pskd_jax.corpus.shard_writer`: chunks appended, synced, then counted in the header, so
a reader sees whole chunks only; a new shard is written in place, a shard that replaces a file is
written beside it and renamed over it, so a reader that holds the old file keeps its old, whole
bytes. A writer holds an exclusive ``flock`` on the shard, so two builders never write one shard
at once.

The manifest while a build runs
-------------------------------
``shards.json`` is never removed and never lists a shard that is not finished: it is replaced
atomically, and at any moment it is either the previous build's manifest (until the build first
changes what it lists) or the manifest of the build in progress, marked ``"in_progress":
{"planned_shards": N}``, which lists the longest run of finished shards from the first, in input
order (kept ones and newly built ones). Every entry it lists matches its file, so a reader that
opens or refreshes (:meth:`pskd_jax.corpus.CorpusWindows.refresh`) during a build sees a
consistent corpus, whose token stream only grows while the build runs (a prefix of the final
stream). It is rewritten when that run grows, at most every :data:`PUBLISH_SECONDS`; a shard that
the build replaces is left out of it before its new file is renamed into place. Once every shard is
done the complete manifest is written (the same bytes as an uninterrupted build's).

Resuming
--------
:func:`build_corpus` holds ``DIR/.pskd-corpus.lock`` for the whole build (a second build of the
directory is refused, E9016) and keeps a journal, ``DIR/.shards.journal``: its first line the
tokenizer and build options, then one JSON line per finished shard, appended and synced as each
finishes; it is removed once the complete manifest is written. A rerun keeps every shard whose
entry (in the journal or a previous ``shards.json``, finished or in progress) names the same input
(path, size, modification time) and the same options, and whose file still matches its entry
(count, size, sha256, tokens); it checks those first, in ``workers`` threads, and rebuilds the
others. The result is the same bytes as an uninterrupted build's. Once the complete
``shards.json`` is written, the shard files of an earlier build that it does not list
(``shard-NNNNN.psk.d`` names only: a build of fewer inputs) are removed, with what killed writers
left beside shards. ``DIR/.pskd-corpus.lock`` stays after the build (see :func:`directory_lock` for why).

Links at the build's own names
------------------------------
The names a build writes in its directory are its own: the shards, ``shards.json`` and the
journal (the user names the directory, not them), and what each holds is true only there (a
manifest lists its shards relative to its own directory; a shard is written in place chunk by
chunk). A symbolic link standing at one of them is therefore replaced by the build's file, never
written through, and its target is never touched: written through, a link would make the build
write JSON over a file it was never given, or a manifest elsewhere that names shards not beside
it, or chunks into a shard another corpus lists. That is the one exception to the toolkit's
output rule (a link at a path the user names, ``-o FILE``, is written through to its target,
which ``corpus merge -o`` follows). A directory, a FIFO or a device at ``shards.json`` or at a
shard's name is refused (E9012), never removed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import stat
import sys
import threading
import time
from typing import Any, Callable, Sequence

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output, fsync_directory, remove_stale_temporaries
from pskd_jax._os.digests import file_sha256
from pskd_jax._os.files import read_whole
from pskd_jax._os.jsonfile import json_text, read_strict
from pskd_jax.corpus.inputs import EXAMPLES, BadInput, ResetShard, find_inputs, iter_tokens, source_of
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.maintain import shard_problem
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard, parse_manifest, write_manifest
from pskd_jax.corpus.shard_writer import DEFAULT_CHUNK_TOKENS, ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import CorpusDirectoryError, CorpusInputError, PskdError, TruncatedError, UsageError

JOURNAL_FORMAT = "pskd-corpus-journal"

PUBLISH_SECONDS = 0.5  # the least time between two rewrites of shards.json during a build


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What :func:`build_shard` made: the manifest entry and the first bad documents it left out."""

    entry: Shard
    examples: tuple[str, ...] = ()
    kept: bool = False  # reused from an earlier build rather than written
    input_bytes: int = 0


def build_options(*, max_document_tokens: int | None = None, text_key: str = "text", skip_bad: bool = False
                  ) -> dict[str, Any]:
    """The options that decide a shard's bytes (``chunk_tokens`` does not), as the manifest records them."""
    if max_document_tokens is not None and (isinstance(max_document_tokens, bool) or max_document_tokens < 1):
        raise UsageError(f"--max-document-tokens must be at least 1, got {max_document_tokens}")
    if not isinstance(text_key, str) or not text_key:
        raise UsageError(f"--text-key must be a non-empty string, got {text_key!r}")
    return {"text_key": text_key, "max_document_tokens": max_document_tokens, "skip_bad": bool(skip_bad)}


def build_shard(source: str, shard_path: str, *, tokenizer: Tokenizer, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                max_document_tokens: int | None = None, text_key: str = "text", skip_bad: bool = False,
                durable: bool = True, on_bytes: Callable[[int], None] | None = None) -> ShardResult:
    """Tokenizes the input file ``source`` into the shard ``shard_path``; returns its entry.

    A pure function of the input and the options: the same input always gives the same bytes. The
    entry's ``path`` is the shard's file name (a manifest beside the shard lists it as is); its
    ``source`` identifies the input. A new shard is written in place; one that replaces a file is
    written beside it and renamed over it (:mod:`pskd_jax.corpus.shard_writer`), so a reader of the
    old file keeps its bytes. On bad input (without ``skip_bad``) or any other error the new file is
    deleted (a file that stood at ``shard_path`` before stays as it was) and the error raised.
    """
    options = build_options(max_document_tokens=max_document_tokens, text_key=text_key, skip_bad=skip_bad)
    identity = source_of(source)
    bad = BadInput(skip_bad)
    documents = 0
    writer = ShardWriter(shard_path, tokenizer, chunk_tokens=chunk_tokens, durable=durable)
    try:
        try:
            for tokens, docs in iter_tokens(source, tokenizer, max_document_tokens=options["max_document_tokens"],
                                            text_key=text_key, bad=bad, on_bytes=on_bytes):
                writer.append(tokens)
                documents += docs
        except ResetShard:
            writer.reset()
            documents = 0
        count = writer.close()
    except BaseException:
        writer.abort()
        raise
    entry = Shard(os.path.basename(shard_path), count, documents, file_sha256(shard_path), bad.count, identity)
    return ShardResult(entry, tuple(bad.examples), False, identity["size"])


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What :func:`build_corpus` did: the manifest written, shards built and kept, bad documents
    left out (and the first few), input bytes tokenized, and the wall time."""

    manifest: Manifest
    built: int
    kept: int
    skipped: int
    examples: tuple[str, ...]
    input_bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Task:
    index: int
    source: str
    shard_path: str
    recorded: Shard | None
    tokenizer: Tokenizer
    chunk_tokens: int
    options: dict[str, Any]
    durable: bool


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


def pool_context(start_method: str | None = None) -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the build's pool: ``start_method`` if given; else ``fork``
    (workers start at once) when this process runs no other thread and has not imported JAX (whose
    runtime threads a fork would copy in an unknown state), and ``spawn`` otherwise."""
    if start_method is None:
        threads = threading.active_count() > 1 or "jax" in sys.modules
        start_method = "spawn" if threads or "fork" not in multiprocessing.get_all_start_methods() else "fork"
    return multiprocessing.get_context(start_method)


def _worker_bytes(n: int) -> None:
    """Progress from a pool worker."""
    if _PROGRESS is not None:
        with _PROGRESS.get_lock():
            _PROGRESS.value += n


def _keeps(task: _Task) -> bool:
    """Whether the shard recorded for the task (same input, same options) is intact and kept. A
    symbolic link at the shard's name is never kept: it is replaced."""
    return task.recorded is not None and not os.path.islink(task.shard_path) \
        and shard_problem(task.shard_path, task.recorded, task.tokenizer) is None


def _kept_shards(tasks: Sequence[_Task], workers: int) -> list[ShardResult | None]:
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
        if kept:
            results[task.index] = ShardResult(task.recorded, (), True, 0)
    return results


def _run_task(task: _Task, on_bytes: Callable[[int], None] | None = None) -> ShardResult:
    """Builds the task's shard."""
    on_bytes = on_bytes or _worker_bytes
    done = 0

    def progress(position: int) -> None:
        nonlocal done
        on_bytes(position - done)
        done = position

    return build_shard(task.source, task.shard_path, tokenizer=task.tokenizer, chunk_tokens=task.chunk_tokens,
                       durable=task.durable, on_bytes=progress, **task.options)


class _Journal:
    """``DIR/.shards.journal``: the finished shards of the build in progress, one JSON line each."""

    def __init__(self, directory: str, tokenizer: Tokenizer, options: dict[str, Any]):
        self.path = os.path.join(directory, names.CORPUS_JOURNAL)
        self.header = {"format": JOURNAL_FORMAT, "tokenizer": tokenizer.to_json(), "build": options}

    def read(self) -> dict[str, Shard]:
        """The entries of a journal written with the same tokenizer and options (a torn last line,
        from a crash while appending, is ignored)."""
        try:
            lines = read_whole(self.path).split(b"\n")  # a regular file only, never a FIFO waited on
        except PskdError:
            return {}
        entries: dict[str, Shard] = {}
        try:
            if json.loads(lines[0]) != self.header:
                return {}
        except (ValueError, RecursionError):
            return {}
        for line in lines[1:]:
            try:
                shard = Shard.from_json(json.loads(line), self.path)
            except (ValueError, RecursionError, PskdError):
                continue
            entries[shard.path] = shard
        return entries

    def start(self, entries: Sequence[Shard]) -> None:
        """A fresh journal holding ``entries`` (a link at its name replaced, never written
        through), then opened for appending: the file just renamed into place, never a link."""
        with atomic_output(self.path, links="replace") as f:
            f.write(self._line(self.header))
            for shard in entries:
                f.write(self._line(shard.to_json()))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        self._file = open(fd, "ab")

    def add(self, shard: Shard) -> None:
        self._file.write(self._line(shard.to_json()))
        self._file.flush()
        os.fsync(self._file.fileno())

    def fileno(self) -> int | None:
        return self._file.fileno() if getattr(self, "_file", None) is not None else None

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def _line(data: Any) -> bytes:
        return (json_text(data) + "\n").encode("utf-8")  # a file name that is not UTF-8 included


def _recorded(directory: str, journal: _Journal, tokenizer: Tokenizer, options: dict[str, Any]) -> dict[str, Shard]:
    """Shards finished by earlier builds with the same tokenizer and options: the journal's, and
    those of a ``shards.json`` left by a finished build."""
    entries: dict[str, Shard] = {}
    path = os.path.join(directory, MANIFEST)
    try:  # the entries only: the build uses its own shard paths, and replaces a link at one
        old = parse_manifest(read_strict(path, CorpusDirectoryError), path)
        if old.tokenizer == tokenizer and old.build == options:
            entries.update((s.path, s) for s in old.shards)
    except PskdError:  # none, or not one to trust: every shard is rebuilt
        pass
    entries.update(journal.read())
    return entries


def finished_prefix(results: Sequence[ShardResult | None]) -> int:
    """How many shards from the first are finished (the run a manifest in progress lists)."""
    for i, result in enumerate(results):
        if result is None:
            return i
    return len(results)


class ManifestPublisher:
    """Keeps ``DIR/shards.json`` listing the finished shards of the build in progress (see the
    module docstring): :meth:`start` once the kept shards are known, :meth:`update` as shards
    finish, :meth:`finish` for the complete manifest."""

    def __init__(self, directory: str, tokenizer: Tokenizer, options: dict[str, Any], planned: int, *,
                 durable: bool = True):
        self.path = os.path.join(directory, MANIFEST)
        self.tokenizer, self.options, self.planned, self.durable = tokenizer, options, planned, durable
        self.listed: int | None = None  # shards the manifest on disk lists, once this build wrote it
        self._last = 0.0

    def start(self, results: Sequence[ShardResult | None]) -> None:
        """The first manifest of the build, unless none is needed yet: every shard is kept (the
        complete one follows at once), or there is no manifest and nothing finished to list. From
        here on no shard the manifest lists is rebuilt: only unlisted ones are."""
        listed = finished_prefix(results)
        if listed == len(results) or (listed == 0 and not os.path.lexists(self.path)):
            self.listed = 0 if listed < len(results) else None
            return
        self._write(results, listed)

    def update(self, results: Sequence[ShardResult | None], *, now: bool = False) -> None:
        """Lists the shards finished since the last rewrite, if the run from the first grew and
        :data:`PUBLISH_SECONDS` have passed (or ``now``: a build that fails lists what it
        finished)."""
        listed = finished_prefix(results)
        if self.listed is not None and self.listed < listed < len(results) \
                and (now or time.monotonic() - self._last >= PUBLISH_SECONDS):
            self._write(results, listed)

    def finish(self, results: Sequence[ShardResult]) -> Manifest:
        """The complete manifest (atomically, durably)."""
        return write_manifest(self.path, self.tokenizer, [r.entry for r in results], self.options, links="replace")

    def _write(self, results: Sequence[ShardResult | None], listed: int) -> None:
        write_manifest(self.path, self.tokenizer, [r.entry for r in results[:listed]], self.options,
                       planned_shards=self.planned, durable=self.durable, links="replace")
        self.listed, self._last = listed, time.monotonic()


def _check_manifest_name(path: str) -> None:
    """Refuses (E9012) a build whose ``shards.json`` name holds a directory, a FIFO or a device: the
    build replaces a manifest (a file, or a link: not followed, see the module docstring), never
    removes what a user put there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UsageError(f"{path}: not a file (a directory, a FIFO or a device stands there); the build writes "
                         "its manifest there: move it away or build into another directory")


def remove_stale_shards(directory: str, keep: set[str]) -> list[str]:
    """Removes the shards of earlier builds that the new manifest does not list (a build of fewer
    inputs than the last one); returns them. Only names this module gives shards
    (:func:`pskd_jax._os.names.shard_name`) are candidates, and only files or links, never a directory: other files
    in the directory are the user's."""
    removed = []
    try:
        listed = os.listdir(directory)
    except OSError:
        return removed
    for name in sorted(listed):
        left = names.leftover(name)
        if left is not None and left[0] == "random" and names.shard_index(left[1]) is not None:
            removed += remove_stale_temporaries(os.path.join(directory, left[1]))  # a killed writer's
            continue
        if names.shard_index(name) is None or name in keep:
            continue
        path = os.path.join(directory, name)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def check_build_counts(*, workers: Any, chunk_tokens: Any) -> None:
    """Refuses (E9012) a number of workers or a chunk size below 1, or one that is not an integer."""
    for flag, value in (("--workers", workers), ("--chunk-tokens", chunk_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value!r}")


def build_corpus(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
                 tokenizer: Tokenizer | None = None, workers: int = 1,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, max_document_tokens: int | None = None,
                 text_key: str = "text", skip_bad: bool = False, durable: bool = True,
                 progress: Callable[[int, int, int, int], None] | None = None,
                 start_method: str | None = None) -> BuildResult:
    """Builds (or finishes) the corpus of ``inputs`` in ``out_dir``: one shard per input file,
    ``workers`` processes, ``shards.json`` written last. See the module docstring for resuming.
    ``start_method`` chooses how pool workers start (default: :func:`pool_context`).

    ``progress(done_bytes, total_bytes, done_shards, total_shards)`` is called now and then.
    """
    started = time.perf_counter()
    tokenizer = tokenizer or Tokenizer.bytes()
    options = build_options(max_document_tokens=max_document_tokens, text_key=text_key, skip_bad=skip_bad)
    check_build_counts(workers=workers, chunk_tokens=chunk_tokens)
    sources = find_inputs(inputs)
    if not sources:
        raise CorpusInputError("no input files (.jsonl, .jsonl.gz, .txt) in " + ", ".join(map(str, inputs)))
    directory = os.fspath(out_dir)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CorpusDirectoryError(f"{directory}: cannot create the corpus directory: {e.strerror or e}") from e
    with directory_lock(directory) as lock_fd:
        _check_manifest_name(os.path.join(directory, MANIFEST))
        journal = _Journal(directory, tokenizer, options)
        known = _recorded(directory, journal, tokenizer, options)
        tasks = []
        for i, source in enumerate(sources):
            name = names.shard_name(i)
            recorded = known.get(name)
            if recorded is not None and recorded.source != source_of(source):
                recorded = None
            tasks.append(_Task(i, source, os.path.join(directory, name), recorded, tokenizer, chunk_tokens,
                               options, durable))
        results = _kept_shards(tasks, workers)
        journal.start([r.entry for r in results if r is not None])
        publisher = ManifestPublisher(directory, tokenizer, options, len(tasks), durable=durable)
        publisher.start(results)  # from here on, shards the manifest does not list may change
        try:
            _run_tasks(tasks, results, workers, journal, progress, start_method, lock_fd, publisher)
        except BaseException:
            with contextlib.suppress(Exception):  # a full disk, say: the manifest stays as it was
                publisher.update(results, now=True)
            raise
        finally:
            journal.close()
        manifest = publisher.finish(results)
        remove_stale_shards(directory, {s.path for s in manifest.shards})
        os.unlink(journal.path)
        fsync_directory(directory)
    examples = tuple(e for r in results for e in r.examples)[:EXAMPLES]
    return BuildResult(manifest, sum(not r.kept for r in results), sum(r.kept for r in results),
                       sum(r.entry.skipped for r in results), examples, sum(r.input_bytes for r in results),
                       time.perf_counter() - started)


def _run_tasks(tasks: list[_Task], results: list[ShardResult | None], workers: int, journal: _Journal,
               progress: Callable[[int, int, int, int], None] | None, start_method: str | None,
               lock_fd: int | None, publisher: ManifestPublisher) -> list[ShardResult]:
    """Builds the shards not kept (``results[i]`` None), in this process or a pool, journaling
    each as it finishes and publishing the manifest as the finished run grows."""
    total = sum(os.stat(t.source).st_size for t in tasks)
    kept_bytes = sum(r.entry.source["size"] for r in results if r is not None and r.entry.source)
    done_bytes = kept_bytes
    last = 0.0
    tasks = [t for t in tasks if results[t.index] is None]

    def report(force: bool = False) -> None:
        nonlocal last
        now = time.monotonic()
        if progress is not None and (force or now - last > 0.1):
            last = now
            progress(done_bytes, total, sum(r is not None for r in results), len(tasks))

    def finished(task: _Task, result: ShardResult) -> None:
        results[task.index] = result
        journal.add(result.entry)
        publisher.update(results)
        report(force=True)

    report(force=True)
    if not tasks:
        return results
    if workers == 1 or len(tasks) == 1:
        def on_bytes(n: int) -> None:
            nonlocal done_bytes
            done_bytes += n
            report()

        for task in tasks:
            finished(task, _run_task(task, on_bytes))
        return results

    context = pool_context(start_method)
    counter = context.Value("q", 0)
    order = sorted(tasks, key=lambda t: -os.stat(t.source).st_size)  # the largest first: better balance
    error: BaseException | None = None
    inherited = [fd for fd in (lock_fd, journal.fileno()) if fd is not None] if context.get_start_method() == "fork" else []
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=_init_worker,
                                                initargs=(counter, os.getpid(), inherited)) as pool:
        futures = {pool.submit(_run_task, task): task for task in order}
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=0.2,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            done_bytes = kept_bytes + counter.value
            for future in sorted(done, key=lambda f: futures[f].index):
                if future.cancelled():
                    continue
                try:
                    finished(futures[future], future.result())
                except BaseException as e:  # the first error is raised once the running shards end
                    if error is None:
                        error = e
                        for other in pending:
                            other.cancel()
            if error is None:
                publisher.update(results)  # a rewrite held back by PUBLISH_SECONDS
            report()
    if error is not None:
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
            raise TruncatedError(f"a build worker died ({error}); run the build again to finish it") from None
        raise error
    return results


__all__ = ["JOURNAL_FORMAT", "PUBLISH_SECONDS", "BuildResult", "ManifestPublisher", "ShardResult", "build_corpus",
           "build_options", "build_shard", "check_build_counts", "finished_prefix", "pool_context",
           "remove_stale_shards"]
