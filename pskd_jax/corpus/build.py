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
The shard is written in place at its final path: a header with count 0, then chunks of
``chunk_tokens`` tokens (the last one shorter), each appended, flushed and synced, *then* the
header's count rewritten and synced. A reader that opens the shard during the build (it reads the
count from the header) sees whole chunks only, and a crash leaves at most trailing bytes after the
counted tokens. The shard's bytes do not depend on ``chunk_tokens``. A writer holds an exclusive
``flock`` on the shard, so two builders never write one shard at once.

Resuming
--------
:func:`build_corpus` holds ``DIR/.pskd-corpus.lock`` for the whole build (a second build of the
directory is refused, E9016) and keeps a journal, ``DIR/.shards.journal``: its first line the
tokenizer and build options, then one JSON line per finished shard, appended and synced as each
finishes. ``shards.json`` is removed when a build starts (its entries go to the journal first)
and written, atomically, only when every shard is done; the journal is then removed. A rerun
keeps every shard whose entry (in the journal or a previous ``shards.json``) names the same input
(path, size, modification time) and the same options, and whose file still matches its entry
(count, size, sha256); it rebuilds the others. The result is the same bytes as an uninterrupted
build's. Once ``shards.json`` is written, the shard files of an earlier build that it does not list
(``shard-NNNNN.psk.d`` names only: a build of fewer inputs) are removed. A shard name that is a
symbolic link is replaced by the shard, never written through. ``DIR/.pskd-corpus.lock`` stays
after the build (see :func:`directory_lock` for why).
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
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard, parse_manifest, write_manifest
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.maintain import shard_problem
from pskd_jax._os.digests import file_sha256
from pskd_jax._os.files import read_whole
from pskd_jax._os.jsonfile import json_text, read_strict
from pskd_jax.corpus.inputs import EXAMPLES, BadInput, ResetShard, find_inputs, iter_tokens, source_of
from pskd_jax.errors import CorpusDirectoryError, CorpusInputError, PskdError, TruncatedError, UsageError
from pskd_jax._os.atomic import atomic_output, fsync_directory
from pskd_jax.corpus.lock import directory_lock
from pskd_jax._os import names
from pskd_jax.corpus.shard_writer import DEFAULT_CHUNK_TOKENS, ShardWriter




JOURNAL_FORMAT = "pskd-corpus-journal"

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
    ``source`` identifies the input. On bad input (without ``skip_bad``) or any other error the
    shard file is deleted and the error raised.
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

def _run_task(task: _Task, on_bytes: Callable[[int], None] | None = None) -> ShardResult:
    """Keeps the recorded shard when it is intact and of the same input, else builds it."""
    on_bytes = on_bytes or _worker_bytes
    if task.recorded is not None and not os.path.islink(task.shard_path) \
            and shard_problem(task.shard_path, task.recorded, task.tokenizer) is None:  # a link is replaced
        on_bytes(task.recorded.source["size"] if task.recorded.source else 0)
        return ShardResult(task.recorded, (), True, 0)
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
        """A fresh journal holding ``entries``, then opened for appending."""
        with atomic_output(self.path) as f:
            f.write(self._line(self.header))
            for shard in entries:
                f.write(self._line(shard.to_json()))
        self._file = open(self.path, "ab")

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


def _check_manifest_name(path: str) -> None:
    """Refuses (E9012) a build whose ``shards.json`` name holds a directory, a FIFO or a device: the
    build replaces a manifest (a file or a link), never removes what a user put there."""
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
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers!r}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise UsageError(f"--chunk-tokens must be at least 1, got {chunk_tokens!r}")
    sources = find_inputs(inputs)
    if not sources:
        raise CorpusInputError("no input files (.jsonl, .jsonl.gz, .txt) in " + ", ".join(map(str, inputs)))
    directory = os.fspath(out_dir)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CorpusDirectoryError(f"{directory}: cannot create the corpus directory: {e.strerror or e}") from None
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
        journal.start([t.recorded for t in tasks if t.recorded is not None])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, MANIFEST))  # shards may change from here on
            fsync_directory(directory)
        try:
            results = _run_tasks(tasks, workers, journal, progress, start_method, lock_fd)
        finally:
            journal.close()
        manifest = write_manifest(os.path.join(directory, MANIFEST), tokenizer, [r.entry for r in results], options)
        remove_stale_shards(directory, {s.path for s in manifest.shards})
        os.unlink(journal.path)
        fsync_directory(directory)
    examples = tuple(e for r in results for e in r.examples)[:EXAMPLES]
    return BuildResult(manifest, sum(not r.kept for r in results), sum(r.kept for r in results),
                       sum(r.entry.skipped for r in results), examples, sum(r.input_bytes for r in results),
                       time.perf_counter() - started)

def _run_tasks(tasks: list[_Task], workers: int, journal: _Journal,
               progress: Callable[[int, int, int, int], None] | None, start_method: str | None,
               lock_fd: int | None) -> list[ShardResult]:
    """Runs the shard tasks (in this process, or a pool), journaling each as it finishes."""
    total = sum(os.stat(t.source).st_size for t in tasks)
    results: list[ShardResult | None] = [None] * len(tasks)
    done_bytes = 0
    last = 0.0

    def report(force: bool = False) -> None:
        nonlocal last
        now = time.monotonic()
        if progress is not None and (force or now - last > 0.1):
            last = now
            progress(done_bytes, total, sum(r is not None for r in results), len(tasks))

    def finished(task: _Task, result: ShardResult) -> None:
        results[task.index] = result
        if not result.kept or task.recorded is None:
            journal.add(result.entry)
        report(force=True)

    report(force=True)
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
            done_bytes = counter.value
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
            report()
    if error is not None:
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
            raise TruncatedError(f"a build worker died ({error}); run the build again to finish it") from None
        raise error
    return results
