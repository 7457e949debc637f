"""Building a corpus on Apache Beam: the shards and ``shards.json`` of the local build, byte for
byte, from any Beam runner (the FnApiRunner in this process or its worker processes by default;
Dask, Dataflow, Flink or Spark on a cluster). ``apache_beam`` is imported on first use (the extra
``pskd_jax[beam]``); without it a Beam build is E9012, and nothing else here needs it.

The pipeline: ``Create`` the inputs with their index → ``Reshuffle`` → one shard per input
(:func:`write_shard`: in a directory under a temporary name renamed to its fixed one; in a store
put whole under its fixed name; either way a retried or speculative attempt never leaves a torn or
doubled shard) → every entry gathered → ``shards.json`` written once, in input order, and the
place tidied as the local build tidies it. Before the pipeline runs, the launcher refuses (E9012)
a place where a file of the user's stands at a shard name the build would write (one no manifest
or journal of the place lists), and records in the journal the names the build writes, as the
local build does, so that a rerun after a kill knows them for the toolkit's. Into a store, the
launcher then puts a manifest in progress (the build's claim, see
:mod:`pskd_jax.corpus.publisher`) and the last step puts the complete one only if that claim
still stands. Inputs, the corpus's place, what workers need and how this differs from the local
build: ``docs/corpus.md`` (Building, Apache Beam).

The default runner is named: ``FnApiRunner``. Beam's own default, the DirectRunner, tries to
download a runner program (Prism) from the internet on every run before falling back; the toolkit
never fetches anything while it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import secrets
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.atomic import fsync_directory, unlocked_temporary_for
from pskd_jax._os.checks import abridged_list
from pskd_jax.corpus.build import BuildResult, check_unchanged
from pskd_jax.corpus.extras import beam_module
from pskd_jax.corpus.inputs import SUFFIXES, find_inputs, require_inputs, source_of
from pskd_jax.corpus.journal import journal_for, local_manifest, owned_shards, previous_manifest
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.maintain import shard_problem
from pskd_jax.corpus.manifest import (
    MANIFEST,
    Manifest,
    manifest_object,
    put_manifest,
    read_manifest,
    write_manifest,
)
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.publisher import (
    ManifestPublisher,
    check_manifest_name,
    check_shard_names,
    remove_killed_writers,
    tidy_directory,
)
from pskd_jax.corpus.shard_build import BuildClaim, ShardResult, build_shard
from pskd_jax.errors import (
    CODES,
    CorpusDirectoryError,
    CorpusInputError,
    PskdError,
    ShardMismatchError,
    TruncatedError,
    UsageError,
)
from pskd_jax.storage import Conflict, Location, Version, locate, resolve
from pskd_jax.storage.urls import SCHEMES, is_url

_LOG = logging.getLogger(__name__)
DEFAULT_RUNNER = "FnApiRunner"  # Beam's in-process (or multi-process) local runner; it fetches nothing
DASK_CONNECT_SECONDS = 10  # the check that a Dask scheduler answers, unless --dask_connection_timeout says
# How a worker's PskdError reads once a runner has turned it into text (a traceback).
_REPORTED = re.compile(r"pskd_jax\.errors\.[A-Za-z]+Error: (?P<code>E9[0-9]{3}): (?P<message>[^\n]*)")


# --------------------------------------------------------------------------------------------
# Inputs


def find_sources(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The input files in order: local paths and objects of the toolkit's stores (``s3://``,
    ``gs://``, ``memory://``, ``file://``) as :func:`find_inputs` finds them, other URLs matched
    through Beam's ``FileSystems`` (sorted by path, input suffixes only, hidden names passed over)."""
    found: list[str] = []
    local: list[str] = []
    for given in [os.fspath(p) for p in inputs]:
        if not is_url(given) or _served(given):
            local.append(given)
            continue
        found += find_inputs(local) if local else []
        local = []
        found += _match_urls(given)
    return found + (find_inputs(local) if local else [])


def _served(url: str) -> bool:
    """Whether the toolkit's own storage takes ``url`` (rather than one of Beam's file systems): its
    schemes, and anything not written ``scheme://`` (``s3:/x``), which it refuses naming it."""
    scheme, slashes, _ = url.partition("://")
    return not slashes or scheme.lower() in SCHEMES


def _match_urls(given: str) -> list[str]:
    filesystems = beam_module().io.filesystems.FileSystems
    pattern = given + "**" if given.endswith("/") else given
    try:
        matched = [m.path for result in filesystems.match([pattern]) for m in result.metadata_list]
    except Exception as e:  # Beam's file systems raise their own errors
        raise CorpusInputError(f"{given}: cannot list: {e}") from None
    if pattern == given and not any(c in given for c in "*?[") and not matched:
        raise CorpusInputError(f"{given}: no such file")
    if pattern == given and len(matched) == 1 and matched[0] == given and not given.endswith(SUFFIXES):
        raise CorpusInputError(f"{given}: not a .jsonl, .jsonl.gz or .txt file (or a URL ending in / for the files "
                               "below it)")
    return sorted(p for p in matched if p.endswith(SUFFIXES) and not p.rsplit("/", 1)[-1].startswith("."))


@contextlib.contextmanager
def _readable(source: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """What to read ``source`` from, and the identity the manifest records for it: a local path or
    an object of the toolkit's stores as is (read, and identified by :func:`source_of`, as the
    local build reads it: an object by its version tag), a URL of another file system copied to a
    temporary file (its size and modification time as that file system reports them)."""
    if not is_url(source) or _served(source):
        yield source, source_of(source)
        return
    beam = beam_module()
    filesystems = beam.io.filesystems.FileSystems
    local = None
    try:
        metadata = filesystems.match([source])[0].metadata_list[0]
        identity = {"path": source, "size": int(metadata.size_in_bytes),
                    "mtime_ns": round(metadata.last_updated_in_seconds * 1e9)}
        suffix = next(s for s in sorted(SUFFIXES, key=len, reverse=True) if source.endswith(s))
        with tempfile.TemporaryDirectory(prefix="pskd-corpus-input.") as directory:
            local = os.path.join(directory, "input" + suffix)
            # Uncompressed: the bytes as stored (a .jsonl.gz is gunzipped by the tokenizing step).
            with filesystems.open(source, compression_type=beam.io.filesystem.CompressionTypes.UNCOMPRESSED) as f, \
                    open(local, "wb") as out:
                shutil.copyfileobj(f, out, 1 << 22)
            yield local, identity
    except PskdError as e:  # name the input, not its copy
        raise type(e)(e.message.replace(local, source) if local else e.message) from None
    except (OSError, IndexError, StopIteration) as e:
        raise CorpusInputError(f"{source}: cannot read: {e}") from e


# --------------------------------------------------------------------------------------------
# One shard, one attempt


def write_shard(source: str, directory: str, index: int, options: BuildOptions | None = None, *,
                recorded_path: str | None = None, claim: BuildClaim | None = None) -> ShardResult:
    """Builds shard ``index`` of the corpus in ``directory`` from ``source`` (a path or a URL). In a
    local directory it is written under a temporary name, then renamed to its deterministic name;
    in a store (``directory`` a prefix URL) it is put whole under that name, once the build's
    ``claim`` is checked. Any number of attempts, one after another or at once, leave one whole
    shard of the same bytes. ``recorded_path`` is the path the manifest records for the input
    (default: ``source``)."""
    options = BuildOptions.checked(options)
    place = locate(directory)
    with _readable(source) as (readable, identity):
        if not place.is_local:
            result = build_shard(readable, place.child(names.shard_name(index)).url, options, claim=claim)
        else:
            result = _renamed_shard(readable, place.path, index, options)
    identity = dict(identity, path=recorded_path if recorded_path is not None else identity["path"])
    entry = dataclasses.replace(result.entry, path=names.shard_name(index), source=identity)
    return dataclasses.replace(result, entry=entry)


def _renamed_shard(source: str, directory: str, index: int, options: BuildOptions) -> ShardResult:
    final = os.path.join(directory, names.shard_name(index))
    temporary = unlocked_temporary_for(final)  # a name of this attempt's own (random)
    # The shard writer creates the file itself, locked from the start. Given a file there already,
    # it would write the shard to a second temporary file beside it and rename that over the
    # first: a file that an attempt killed meanwhile (a lost worker) leaves at a name no tidying
    # knows, in the finished corpus.
    os.unlink(temporary)
    try:
        result = build_shard(source, temporary, options)
        try:
            os.replace(temporary, final)
        except OSError as e:
            raise TruncatedError(f"{final}: cannot put the shard in place: {e.strerror or e}") from e
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if options.durable:
        fsync_directory(directory)
    return result


def _shard_step(element: tuple[int, str, str], directory: str, options: BuildOptions,
                claim: BuildClaim | None = None) -> tuple[int, ShardResult]:
    """The pipeline's per-input step (runs on a worker)."""
    index, recorded, readable = element
    # One tokenizer thread per worker: the workers are the parallelism (unless the user said otherwise).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = write_shard(readable, directory, index, options, recorded_path=recorded, claim=claim)
    for example in result.examples:
        _LOG.warning("pskd corpus build: left out: %s", example)
    return index, result


def _finish(results: list[tuple[int, ShardResult]], directory: str, options: BuildOptions, count: int,
            claimed: str | None = None, owned: Sequence[str] = ()) -> str:
    """The pipeline's last step: ``shards.json`` in input order, then the directory tidied (of the
    shard names in ``owned``, those earlier records of the place list, the ones it does not list
    removed). In a store, the manifest is put only if it is still the claim the launcher put (tag
    ``claimed``)."""
    by_index: dict[int, ShardResult] = {}
    for index, result in results:
        by_index.setdefault(index, result)  # a result given twice is the same shard
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise TruncatedError(f"{directory}: the pipeline gave no shard for input(s) {abridged_list(missing, 5)}")
    place = locate(directory)
    entries = [by_index[i].entry for i in range(count)]
    if not place.is_local:
        return _finish_in_store(place, [by_index[i] for i in range(count)], options, claimed, owned)
    for entry in entries:
        problem = shard_problem(os.path.join(directory, entry.path), entry, options.tokenizer, digest=False)
        if problem is not None:
            raise ShardMismatchError(f"{directory}: shard {entry.path}: {problem}")
    manifest = write_manifest(os.path.join(directory, MANIFEST), options.tokenizer, entries, options.recorded(),
                              links="replace")
    tidy_directory(directory, manifest, owned)
    return manifest.path


def _finish_in_store(place: Location, results: list[ShardResult], options: BuildOptions, claimed: str | None,
                     owned: Sequence[str] = ()) -> str:
    check_unchanged(place, results)
    store, _ = resolve(place)
    where = place.child(MANIFEST)
    try:
        manifest, _ = put_manifest(store, where.key, options.tokenizer, [r.entry for r in results], options.recorded(),
                                   mode=Version(claimed) if claimed is not None else "create")
    except Conflict as e:
        raise CorpusDirectoryError(f"{where.url}: another build of this corpus put its manifest while this one ran "
                                   f"({e.why}); this build's shards are not listed: run one build of a corpus at a "
                                   "time, then run it again to finish it") from None
    tidy_directory(place, manifest, owned)
    return manifest.path


def build_transform(sources: Sequence[str], directory: str, options: BuildOptions | None = None, *,
                    readable: Sequence[str] | None = None, claim: BuildClaim | None = None,
                    claimed: str | None = None, owned: Sequence[str] = ()) -> Any:
    """The Beam transform that builds the corpus of ``sources`` (input files, in stream order) into
    ``directory`` (a path, or a prefix URL of a store): apply it to a pipeline (``pipeline |
    build_transform(...)``); its output is the manifest's path, once the manifest is written.
    ``readable`` gives, per source, the path a worker reads it from (default: the source itself).
    Into a store, ``claim`` is the build's claim and ``claimed`` the version tag of the manifest
    in progress that made it (see :func:`build_corpus_beam`). ``owned`` are the shard names
    earlier records of the place list (:func:`pskd_jax.corpus.journal.owned_shards`): the last
    step removes those the new manifest does not list, and no other file."""
    beam: Any = beam_module()  # (imported on first use: Any lets a class below derive from beam.PTransform)
    options = BuildOptions.checked(options)
    readable = list(readable) if readable is not None else list(sources)
    elements = [(i, s, r) for i, (s, r) in enumerate(zip(sources, readable, strict=True))]
    count = len(elements)
    owned = tuple(sorted(owned))  # (a step's argument: pickled for the workers)

    class BuildCorpus(beam.PTransform):
        def expand(self, root: Any) -> Any:
            return (root
                    | "Inputs" >> beam.Create(elements)
                    | "Spread" >> beam.Reshuffle()
                    | "Shards" >> beam.Map(_shard_step, directory, options, claim)
                    | "Gather" >> beam.combiners.ToList()
                    | "Manifest" >> beam.Map(_finish, directory, options, count, claimed, owned))

    return BuildCorpus()


# --------------------------------------------------------------------------------------------
# The launcher


def pipeline_options(beam_options: str | Sequence[str] | None, workers: int) -> Any:
    """Beam's ``PipelineOptions`` from command-line flags (a string is split as a shell would), passed
    through to the runner as given. Without a ``--runner`` the runner is ``FnApiRunner`` (named, so
    that Beam's DirectRunner does not try to download a program first). On it, or on the
    DirectRunner, ``workers`` above 1 sets ``--direct_num_workers`` and
    ``--direct_running_mode=multi_processing`` unless the flags set them. On Beam's DaskRunner each
    input is a partition of its own (``--dask_partition_size=1``) unless the flags say otherwise."""
    beam = beam_module()
    flags = shlex.split(beam_options) if isinstance(beam_options, str) else list(beam_options or [])
    if beam.options.pipeline_options.PipelineOptions(flags).view_as(
            beam.options.pipeline_options.StandardOptions).runner is None:
        flags.append(f"--runner={DEFAULT_RUNNER}")
    options = beam.options.pipeline_options.PipelineOptions(flags)
    runner = options.view_as(beam.options.pipeline_options.StandardOptions).runner
    if _runner_name(beam, options) == "daskrunner" \
            and not any(f.startswith(("--dask_npartitions", "--dask_partition_size")) for f in flags):
        # The DaskRunner puts up to 128 elements in one partition of its bag, one task, and runs
        # Reshuffle as nothing: every shard would be built one after another by one thread of one
        # worker, and a worker lost meanwhile would take every shard with it. One input a task.
        flags = flags + ["--dask_partition_size=1"]
        options = beam.options.pipeline_options.PipelineOptions(flags)
    if workers > 1 and runner in (DEFAULT_RUNNER, "DirectRunner", "direct") \
            and not any(f.startswith(("--direct_num_workers", "--direct_running_mode")) for f in flags):
        options = beam.options.pipeline_options.PipelineOptions(
            flags + [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"])
    return options


# The runners that run a pipeline's steps in the launching process (unless told to start worker
# processes): Beam's local ones. The DirectRunner hands a pipeline to Prism, whose Python steps run
# in the launching process too (its default environment, LOOPBACK).
_LOCAL_RUNNERS = frozenset({"fnapirunner", "directrunner", "bundlebaseddirectrunner", "switchingdirectrunner",
                            "direct"})


def _runner_name(beam: Any, flags: Any) -> str:
    """The runner's class name, lower case (``apache_beam.runners.dask.dask_runner.DaskRunner``:
    ``daskrunner``)."""
    runner = flags.view_as(beam.options.pipeline_options.StandardOptions).runner
    return (runner.rsplit(".", 1)[-1] if isinstance(runner, str) else type(runner).__name__).lower()


def _in_this_process(beam: Any, flags: Any) -> bool:
    """Whether the runner of ``flags`` runs the pipeline's steps in this process."""
    options = beam.options.pipeline_options
    name = _runner_name(beam, flags)
    environment = (flags.view_as(options.PortableOptions).environment_type or "").upper()
    return (name in _LOCAL_RUNNERS and environment in ("", "EMBEDDED", "LOOPBACK")
            and flags.view_as(options.DirectOptions).direct_running_mode != "multi_processing")


def _check_memory_places(beam: Any, flags: Any, places: Sequence[str]) -> None:
    """E9012, before anything is written, for a ``memory://`` corpus or input on a runner whose
    steps run in other processes (worker processes, a cluster): each process has a memory store of
    its own, so a worker would find none of the launcher's objects (its claim, an input) there."""
    memory = [p for p in places if is_url(p) and p.partition(":")[0].lower() == "memory"]
    if memory and not _in_this_process(beam, flags):
        runner = flags.view_as(beam.options.pipeline_options.StandardOptions).runner
        raise UsageError(f"{memory[0]}: a memory:// store is this process's own, and the pipeline's steps would run "
                         f"in other processes ({runner}"
                         f"{', worker processes' if runner == DEFAULT_RUNNER else ''}), which cannot reach it: a Beam "
                         "build with a memory:// store runs on the local runner in this process (no --runner, "
                         "workers=1); on a cluster, use a directory every worker sees or a bucket")


def _check_dask_scheduler(beam: Any, flags: Any) -> None:
    """E9012, before anything is written, when the Dask scheduler that Beam's DaskRunner is told
    to use cannot be reached. The runner connects only once the launcher has made the directory,
    taken its lock and written the journal (in a store: put the claim); then a wrong address
    waited out Dask's connection timeout (30 s) and ended in its traceback, and a scheduler file
    that is not there (``--dask_scheduler_file``) was waited for without end. The check connects a
    client of its own, under the runner's ``--dask_connection_timeout`` or
    :data:`DASK_CONNECT_SECONDS`; a refused connection is told at once."""
    if _runner_name(beam, flags) != "daskrunner":
        return
    try:
        import distributed
        from apache_beam.runners.dask.dask_runner import DaskOptions
    except ImportError as e:
        raise UsageError(f"Beam's DaskRunner needs dask.distributed ({e}): pip install 'apache-beam[dask]'") from None
    dask = flags.view_as(DaskOptions)
    address, scheduler_file = dask.address, dask.scheduler_file
    if address is None and scheduler_file is None:
        return  # the runner starts a local cluster of its own
    if address is None and not os.path.isfile(scheduler_file):
        raise UsageError(f"{scheduler_file}: no such Dask scheduler file (--dask_scheduler_file): start the "
                         "scheduler with --scheduler-file naming it, or give --dask_client_address")
    timeout = dask.timeout if isinstance(dask.timeout, int) else DASK_CONNECT_SECONDS
    given = address or scheduler_file
    flag = "--dask_client_address" if address else "--dask_scheduler_file"
    try:
        _refused_at_once(address)
        client = distributed.Client(address=address, scheduler_file=scheduler_file, timeout=timeout,
                                    set_as_default=False)
    except Exception as e:  # Dask's own errors (OSError, ValueError for a malformed address, ...)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"{given}: cannot reach the Dask scheduler ({flag}): {reason}; start it, or give its "
                         "address (and --dask_connection_timeout=SECONDS for a slow network)") from None
    client.close()


def _refused_at_once(address: str | None) -> None:
    """Raises ``OSError`` when nothing listens at a ``tcp://`` ``address`` (Dask's client would
    retry until its timeout)."""
    if address is None:
        return
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme != "tcp":
        return
    host, port = parse_host_port(location)
    with socket.create_connection((host, port), timeout=DASK_CONNECT_SECONDS):
        pass


def _reported(error: BaseException) -> PskdError | None:
    """The toolkit's error behind a pipeline failure: raised as is by an in-process runner, or
    found in the text a runner made of a worker's traceback."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, PskdError):
            return seen
        seen = seen.__cause__ or seen.__context__
    match = _REPORTED.search(str(error))
    if match is not None and match.group("code") in CODES:
        return PskdError(match.group("code"), match.group("message"))
    return None


def build_corpus_beam(inputs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                      options: BuildOptions | None = None, *,
                      beam_options: str | Sequence[str] | None = None) -> BuildResult:
    """Builds the corpus of ``inputs`` in ``out_dir`` (a directory every worker sees, or a prefix
    of a store: ``s3://bucket/corpus``) on Apache Beam (see the module docstring): the same shards
    and ``shards.json`` as :func:`pskd_jax.corpus.build_corpus` with the same options.

    ``beam_options`` are Beam's own flags (``--runner``, ``--project``, …), passed to the runner as
    given; ``options.workers`` is the local runner's number of worker processes when they do not
    say (at most one per input). A worker's error is raised here as the toolkit's error (E9015 for bad input, …)."""
    started = time.perf_counter()
    beam = beam_module()
    options = BuildOptions.checked(options)
    place = locate(out_dir)  # E9018 for a URL the toolkit cannot serve
    sources = require_inputs(find_sources(inputs), inputs)
    # No more worker processes than inputs: each input is one shard, one element of the pipeline,
    # and a worker given none is a process (a Python and its imports) started for nothing.
    workers = min(options.workers, len(sources))
    flags = pipeline_options(beam_options, workers)
    _check_memory_places(beam, flags, [place.url, *sources])
    _check_dask_scheduler(beam, flags)
    # (the manifest named as the local build names it)
    where = os.path.join(place.path, MANIFEST) if place.is_local else place.child(MANIFEST).url
    if not place.is_local:
        manifest = _run_in_store(beam, sources, place, options, flags)
    else:
        _run_in_directory(beam, sources, os.path.abspath(place.path), options, flags)
        manifest = read_manifest(where) if os.path.lexists(where) else None
    manifest = _finished(manifest, where, len(sources))
    return BuildResult(manifest, len(manifest.shards), 0, sum(s.skipped for s in manifest.shards), (),
                       sum(s.source["size"] for s in manifest.shards if s.source), time.perf_counter() - started)


def _finished(manifest: Manifest | None, where: str, count: int) -> Manifest:
    """The complete manifest of ``count`` shards the pipeline's last step wrote, or E9003. A runner
    may report a run that never reached that step as finished (Beam's DaskRunner does when it
    loses its scheduler): the launcher then finds the manifest in progress it put itself, or none,
    and must not report that as the corpus."""
    if manifest is None or not manifest.complete or len(manifest.shards) != count:
        raise TruncatedError(f"{where}: the pipeline ended without writing the complete manifest (its runner "
                             "reported the run finished, but the last step never ran: a lost scheduler or worker?); "
                             "run the build again to finish it")
    return manifest


def _readable_paths(sources: Sequence[str]) -> list[str]:
    # Workers may start elsewhere (another directory, another machine): a local input is read by its
    # absolute path, and recorded as given, as the local build records it.
    return [s if is_url(s) else os.path.abspath(s) for s in sources]


def _run_in_directory(beam: Any, sources: list[str], directory: str, options: BuildOptions, flags: Any) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{directory}: cannot create the corpus directory: {e.strerror or e}") from e
    with directory_lock(directory):
        place = Location("file", "", directory)
        check_manifest_name(os.path.join(directory, MANIFEST))
        journal = journal_for(place, options)
        owned = owned_shards(journal, local_manifest(directory))
        planned = [names.shard_name(i) for i in range(len(sources))]
        check_shard_names(place, planned, owned)
        journal.start([], owned | set(planned))  # the names the build writes, for a rerun after a kill
        journal.close()
        # Every shard is written again: the manifest standing there (an earlier build's, complete)
        # is replaced by one in progress that lists none, as the local build does, before any
        # shard it lists changes under a reader (or stays listed after a crash).
        ManifestPublisher(place, options, len(sources)).start([None] * len(sources))
        try:
            _run(beam, build_transform(sources, directory, options, readable=_readable_paths(sources),
                                       owned=sorted(owned)), flags)
        except BaseException:
            # A run that failed leaves no attempt's torn file: those of attempts killed meanwhile
            # (a lost worker) go now, while the lock is held. (A writer still running somewhere
            # holds its file's lock: its file stays, and becomes a whole shard a rerun keeps.)
            remove_killed_writers(directory)
            raise


def _run_in_store(beam: Any, sources: list[str], place: Location, options: BuildOptions,
                  flags: Any) -> Manifest | None:
    """The shard names checked, the claim (a manifest in progress, put under the previous
    manifest's version), the journal of the names the build writes, the pipeline, and the
    complete manifest read back."""
    previous, condition = previous_manifest(place)
    journal = journal_for(place, options)
    owned = owned_shards(journal, previous)
    planned = [names.shard_name(i) for i in range(len(sources))]
    check_shard_names(place, planned, owned)
    writer = secrets.token_hex(8)
    publisher = ManifestPublisher(place, options, len(sources), writer=writer, condition=condition)
    publisher.start([None] * len(sources))
    journal.start([], owned | set(planned))  # after the claim: a build that loses it puts nothing
    claimed = publisher.condition.tag if isinstance(publisher.condition, Version) else None
    claim = BuildClaim(place.child(MANIFEST).url, writer)
    _run(beam, build_transform(sources, place.url, options, readable=_readable_paths(sources), claim=claim,
                               claimed=claimed, owned=sorted(owned)), flags)
    store, _ = resolve(place)
    try:
        return manifest_object(store, place.child(MANIFEST).key)[0]
    except TruncatedError:  # (none there: the claim removed meanwhile, which the check of the caller reports)
        return None


def _run(beam: Any, transform: Any, flags: Any) -> None:
    try:
        pipeline = beam.Pipeline(options=flags)
        _ = pipeline | "BuildCorpus" >> transform
        result = pipeline.run()
        try:
            result.wait_until_finish()
        finally:
            # Beam's DaskRunner connects a client to the cluster for the run and leaves it open;
            # left open, it keeps reconnecting (and logging) once the cluster is gone.
            client = getattr(result, "client", None)
            if client is not None and hasattr(client, "close"):
                client.close()
    except Exception as e:
        reported = _reported(e) or _lost_worker(e)
        if reported is None:
            raise
        raise reported from None


def _lost_worker(error: BaseException) -> PskdError | None:
    """E9003 for a run its runner gave up because workers died while they ran a step (Dask's
    ``KilledWorker``: a task whose workers died more often than the scheduler allows), as the local
    build says it for its pool: a worker killed (out of memory, preempted, ``kill -9``) is no bug to
    show a traceback of, and a rerun finishes the build."""
    distributed = sys.modules.get("distributed")  # (imported by whoever raised one: never imported here)
    if distributed is None or not isinstance(error, distributed.KilledWorker):
        return None
    # (Dask's first sentence names the task and how many workers died running it; the rest is advice)
    reason = str(error).strip().split(". ", 1)[0].strip() or type(error).__name__
    return TruncatedError(f"a build worker died (Dask: {reason}); run the build again to finish it")


__all__ = [
    "DEFAULT_RUNNER",
    "build_corpus_beam",
    "build_transform",
    "find_sources",
    "pipeline_options",
    "write_shard",
]
