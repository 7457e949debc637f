"""The corpus build on Apache Beam gives the bytes of the local build: every shard and
``shards.json``, on the DirectRunner with two worker processes, after a failed bundle is retried,
and when attempts of one shard run at once. Inputs through a Beam file system (a URL) too."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import sys
import threading

import pytest

from pskd_jax import corpus
from pskd_jax._os import names
from pskd_jax.corpus import Tokenizer
from pskd_jax.corpus import beam as corpus_beam
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import CorpusInputError, StorageError, TruncatedError, UsageError
from tests.helpers import free_port, python, wait_until

from .bpe import documents, repository_texts, train_bpe, write_jsonl
from .helpers import put


def listing(directory) -> dict[str, bytes]:
    """Every file of a directory, hidden ones included, and its bytes."""
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def assert_same_corpus(a, b) -> None:
    left, right = listing(a), listing(b)
    assert sorted(left) == sorted(right)  # no temporary file, no journal, nothing else
    for name in left:
        assert left[name] == right[name], name


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return documents(repository_texts())


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> str:
    pytest.importorskip("tokenizers")
    return train_bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def make_inputs(root, docs: list[str], bad: bool = False) -> list[str]:
    """Two JSONL files (one gzipped), a .txt, and a directory of two more: five inputs."""
    root.mkdir(parents=True, exist_ok=True)
    extra = ['{"text": 5}', "not json"] if bad else []
    a = write_jsonl(root / "a.jsonl", docs[0::4])
    if extra:
        with open(a, "a", encoding="utf-8") as f:
            f.write("\n".join(extra) + "\n")
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[1::4])
    (root / "c.txt").write_text("".join(docs[2::8]), encoding="utf-8")
    (root / "more").mkdir(exist_ok=True)
    write_jsonl(root / "more" / "d.jsonl", docs[3::4])
    (root / "more" / "e.txt").write_text(docs[5] * 3, encoding="utf-8")
    return [a, str(root / "b.jsonl.gz"), str(root / "c.txt"), str(root / "more")]


def test_without_apache_beam_it_is_e9012_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(UsageError, match=r"pip install 'pskd_jax\[beam\]'"):
        corpus.build_corpus_beam([tmp_path / "a.txt"], tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_attempts_of_one_shard_at_once_leave_one_whole_shard(tmp_path, docs):
    """What Beam's speculative execution does: several attempts of a shard at the same time."""
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    corpus.build_corpus([source], tmp_path / "local")
    directory = tmp_path / "c"
    directory.mkdir()
    errors = []

    def attempt() -> None:
        try:
            corpus_beam.write_shard(source, str(directory), 0, BuildOptions(chunk_tokens=4096))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert os.listdir(directory) == ["shard-00000.psk.d"]
    assert (directory / "shard-00000.psk.d").read_bytes() == (tmp_path / "local" / "shard-00000.psk.d").read_bytes()


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["hf", "bytes", "chars"])
def test_direct_runner_with_two_workers_gives_the_local_bytes(tmp_path, docs, bpe, kind):
    pytest.importorskip("apache_beam")
    inputs = make_inputs(tmp_path / "in", docs, bad=kind == "bytes")
    tokenizer = {"hf": lambda: Tokenizer.from_file(bpe), "bytes": Tokenizer.bytes,
                 "chars": lambda: Tokenizer.chars(sorted(set("".join(docs)) - {"\ufeff"}))}[kind]()
    options = BuildOptions(tokenizer=tokenizer, max_document_tokens=300 if kind == "hf" else None,
                           skip_bad=kind == "bytes")
    local = corpus.build_corpus(inputs, tmp_path / "local", options.replace(workers=2))
    on_beam = corpus.build_corpus_beam(
        inputs, tmp_path / "beam", options.replace(chunk_tokens=1000),
        beam_options=["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert_same_corpus(tmp_path / "local", tmp_path / "beam")
    assert len(on_beam.manifest.shards) == 5 and on_beam.skipped == local.skipped == (2 if kind == "bytes" else 0)
    assert on_beam.input_bytes == local.input_bytes and on_beam.manifest.tokens == local.manifest.tokens


@pytest.mark.slow
def test_a_bundle_that_fails_once_is_retried_and_gives_the_same_bytes(tmp_path, docs, monkeypatch):
    """The BundleBasedDirectRunner retries a failed bundle (the FnApiRunner does not retry). The
    first attempt at input 2 writes its whole temporary shard, then fails before the rename; an
    attempt killed earlier left a temporary file of shard 1 behind."""
    pytest.importorskip("apache_beam")
    inputs = make_inputs(tmp_path / "in", docs)
    corpus.build_corpus(inputs, tmp_path / "local")
    directory = tmp_path / "beam"
    directory.mkdir()
    killed = directory / (names.temporary_prefix("shard-00001.psk.d") + "killed00.tmp")
    killed.write_bytes(b"PSKD torn")
    marker = tmp_path / "failed-once"
    real = corpus_beam.build_shard

    def failing_once(source, shard_path, *args, **kwargs):
        result = real(source, shard_path, *args, **kwargs)
        if source.endswith("c.txt") and not marker.exists():
            marker.write_text(shard_path)
            raise RuntimeError("the first attempt at this input dies before its rename")
        return result

    monkeypatch.setattr(corpus_beam, "build_shard", failing_once)
    corpus.build_corpus_beam(inputs, directory, beam_options="--runner=BundleBasedDirectRunner")
    assert marker.exists() and not os.path.exists(marker.read_text())  # it failed, and its file went
    assert_same_corpus(tmp_path / "local", directory)


_KILLED_ATTEMPT = """
import os, sys, time
from pskd_jax.corpus import beam, shard_build
real = shard_build.token_blocks

def blocks_then_hang(*args, **kwargs):
    for block in real(*args, **kwargs):
        yield block
        open(sys.argv[3], "w").close()  # a chunk is written: the test kills this attempt now
        time.sleep(3600)

shard_build.token_blocks = blocks_then_hang
beam.write_shard(sys.argv[1], sys.argv[2], 0, shard_build.BuildOptions(chunk_tokens=64))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_attempt_killed_mid_shard_leaves_nothing_once_the_build_finishes(tmp_path, docs):
    """What a worker killed by its cluster (kill -9) leaves: an attempt's files of a shard half
    written. The build that then finishes (a rerun, or the rescheduled attempt's last step) leaves
    the local build's files and nothing else."""
    pytest.importorskip("apache_beam")
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    corpus.build_corpus([source], tmp_path / "local")
    directory, marker = tmp_path / "beam", tmp_path / "written"
    directory.mkdir()
    attempt = python(_KILLED_ATTEMPT, source, directory, marker)
    try:
        wait_until(marker.exists, alive=attempt, what="the attempt's first chunk")
    finally:
        attempt.kill()
        attempt.communicate()
    assert [n for n in os.listdir(directory) if n.endswith(".tmp")]  # what the killed attempt left
    corpus.build_corpus_beam([source], directory)
    assert_same_corpus(tmp_path / "local", directory)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [1, 2])
def test_bad_input_is_the_toolkits_error(tmp_path, docs, workers):
    pytest.importorskip("apache_beam")
    inputs = make_inputs(tmp_path / "in", docs, bad=True)
    with pytest.raises(CorpusInputError, match=r"a\.jsonl:\d+: the 'text' value is \d+, not a string"):
        corpus.build_corpus_beam(inputs, tmp_path / "c", BuildOptions(workers=workers))
    assert not (tmp_path / "c" / "shards.json").exists()
    assert not [n for n in os.listdir(tmp_path / "c") if n.endswith(".tmp")]


@pytest.mark.slow
def test_inputs_through_a_beam_file_system(tmp_path, docs):
    """A URL input is matched and read through Beam's FileSystems (here a file system of the test's
    own, scheme ``pskdtest``, over local files): the same shards as the local build; the manifest
    records the URLs."""
    pytest.importorskip("apache_beam")
    register_test_file_system()
    inputs = make_inputs(tmp_path / "in", docs)
    corpus.build_corpus(inputs, tmp_path / "local")
    urls = ["pskdtest://" + inputs[0], "pskdtest://" + str(tmp_path / "in") + "/b.jsonl*",
            "pskdtest://" + inputs[2], "pskdtest://" + inputs[3] + "/"]
    result = corpus.build_corpus_beam(urls, tmp_path / "beam")
    local = corpus.read_manifest(tmp_path / "local" / "shards.json")
    assert [s.source["path"] for s in result.manifest.shards] == \
        ["pskdtest://" + s.source["path"] for s in local.shards]
    for ours, theirs in zip(result.manifest.shards, local.shards):
        assert (ours.path, ours.tokens, ours.documents, ours.sha256) == (theirs.path, theirs.tokens, theirs.documents,
                                                                         theirs.sha256)
        assert ours.source["size"] == theirs.source["size"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    with pytest.raises(CorpusInputError, match=r"^E9015: pskdtest://.*bad\.jsonl:1: no 'text' key"):
        corpus.build_corpus_beam(["pskdtest://" + str(bad)], tmp_path / "bad")
    with pytest.raises(CorpusInputError, match="no such file"):
        corpus.build_corpus_beam(["pskdtest://" + str(tmp_path / "missing.jsonl")], tmp_path / "missing")


_REGISTERED = []


def register_test_file_system() -> None:
    """A Beam file system of scheme ``pskdtest`` whose paths are local paths behind the scheme
    (Beam finds a file system among the subclasses of ``FileSystem``)."""
    if _REGISTERED:
        return
    from apache_beam.io.filesystem import FileMetadata, MatchResult
    from apache_beam.io.localfilesystem import LocalFileSystem

    prefix = "pskdtest://"

    class PrefixedLocalFileSystem(LocalFileSystem):
        @classmethod
        def scheme(cls):
            return "pskdtest"

        def match(self, patterns, limits=None):
            results = super().match([p[len(prefix):] for p in patterns], limits)
            return [MatchResult(prefix + r.pattern, [FileMetadata(prefix + m.path, m.size_in_bytes,
                                                                  m.last_updated_in_seconds)
                                                     for m in r.metadata_list]) for r in results]

        def open(self, path, *args, **kwargs):
            return super().open(path[len(prefix):], *args, **kwargs)

    _REGISTERED.append(PrefixedLocalFileSystem)


# --------------------------------------------------------------------------------------------
# The default runner fetches nothing; stores; a real engine (Dask)


class _NetworkGuard:
    """Refuses, and counts, every attempt of this process to reach an address off the loopback
    interface (a connection, or a name looked up that is not this machine's)."""

    LOCAL = ("127.", "::1", "localhost", "0.0.0.0")

    def __init__(self, monkeypatch):
        import socket

        self.attempts: list[str] = []
        real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

        def connect(sock, address):
            host = address[0] if isinstance(address, tuple) else str(address)
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not str(host).startswith(self.LOCAL):
                self.attempts.append(f"connect {host}")
                raise OSError("the test's network guard: no address off the loopback interface")
            return real_connect(sock, address)

        def lookup(host, *args, **kwargs):
            if host is not None and not str(host).startswith(self.LOCAL):
                self.attempts.append(f"lookup {host}")
                raise OSError("the test's network guard: no name lookups")
            return real_lookup(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket, "getaddrinfo", lookup)


@pytest.mark.slow
def test_the_default_runner_is_named_and_reaches_for_no_network(tmp_path, docs, monkeypatch):
    """Without --runner the build names FnApiRunner, and runs with every address off the loopback
    interface refused; Beam's DirectRunner, named, tries the internet first (what the guard sees)."""
    pytest.importorskip("apache_beam")
    from apache_beam.options.pipeline_options import StandardOptions

    assert corpus_beam.pipeline_options(None, 1).view_as(StandardOptions).runner == "FnApiRunner"
    assert corpus_beam.pipeline_options(["--runner=DirectRunner"], 1).view_as(StandardOptions).runner == "DirectRunner"
    inputs = make_inputs(tmp_path / "in", docs)
    corpus.build_corpus(inputs, tmp_path / "local")
    guard = _NetworkGuard(monkeypatch)
    corpus.build_corpus_beam(inputs, tmp_path / "beam")
    assert guard.attempts == []
    assert_same_corpus(tmp_path / "local", tmp_path / "beam")
    import apache_beam as beam  # a pipeline Beam's DirectRunner hands to Prism: the guard sees the download
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(str)
    assert guard.attempts, "the guard saw nothing of the DirectRunner's download: it guards nothing"


def without_lock(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name != names.CORPUS_LOCK}


def store_listing(place: str) -> dict[str, bytes]:
    from pskd_jax.storage import resolve

    store, where = resolve(place)
    return {o.key.rpartition("/")[2]: store.get(o.key)[0] for o in store.list(where.key)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_into_a_store_the_workers_put_the_local_bytes(request, tmp_path, docs, kind):
    pytest.importorskip("apache_beam")
    place = (request.getfixturevalue("s3_bucket").url if kind == "s3" else "memory://beam-store") + "/corpus"
    inputs = make_inputs(tmp_path / "in", docs)
    corpus.build_corpus(inputs, tmp_path / "local")
    result = corpus.build_corpus_beam(inputs, place)
    assert store_listing(place) == without_lock(listing(tmp_path / "local"))  # no claim left, no journal
    assert result.manifest.path == place + "/shards.json" and result.manifest.complete


@pytest.mark.slow
def test_inputs_in_a_bucket_are_read_by_the_toolkit_and_recorded_as_the_local_build_records_them(tmp_path, docs,
                                                                                                  s3_bucket):
    """An object input is the toolkit's (streamed by the worker, its version tag recorded), not
    Beam's S3 file system's (which records a modification time): the local build's manifest."""
    pytest.importorskip("apache_beam")
    for i, name in enumerate(["a.jsonl", "b.jsonl"]):
        put(s3_bucket.url + "/raw", name, "".join(json.dumps({"text": d}) + "\n" for d in docs[i::2]).encode())
    inputs = [s3_bucket.url + "/raw/a.jsonl", s3_bucket.url + "/raw/b.*"]
    corpus.build_corpus(inputs, tmp_path / "local")
    corpus.build_corpus_beam(inputs, tmp_path / "beam")
    assert_same_corpus(tmp_path / "local", tmp_path / "beam")


def test_a_memory_store_takes_a_build_of_worker_processes_only_where_they_are_not_needed(tmp_path, docs):
    """A memory:// store is the launching process's own: two inputs with ``workers=2`` are refused
    (E9012) before anything is written; one input with ``workers=4`` runs in this process (one
    worker an input) and is built."""
    pytest.importorskip("apache_beam")
    inputs = make_inputs(tmp_path / "in", docs)
    with pytest.raises(UsageError, match="memory://beam-workers/two: a memory:// store is this process's own"):
        corpus.build_corpus_beam(inputs[:2], "memory://beam-workers/two", BuildOptions(workers=2))
    assert store_listing("memory://beam-workers/two") == {}
    result = corpus.build_corpus_beam(inputs[:1], "memory://beam-workers/one", BuildOptions(workers=4))
    assert result.manifest.complete and len(result.manifest.shards) == 1


@pytest.mark.parametrize("runner", ["dask", "processes"])
def test_a_memory_store_is_refused_for_a_runner_of_other_processes(tmp_path, docs, runner):
    """A runner whose steps run in other processes (a Dask cluster; the local runner told to start
    worker processes, even one) cannot reach this process's memory:// store: the corpus there, or
    an input there, is refused (E9012) before anything is written or any cluster is reached."""
    pytest.importorskip("apache_beam")
    flags = {"dask": ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
                      f"--dask_client_address=tcp://127.0.0.1:{free_port()}"],
             "processes": ["--direct_running_mode=multi_processing", "--direct_num_workers=1"]}[runner]
    inputs = make_inputs(tmp_path / "in", docs)[:2]
    with pytest.raises(UsageError, match=r"^E9012: memory://beam-elsewhere/c: a memory:// store is this process's "
                                         r"own, and the pipeline's steps would run in other processes"):
        corpus.build_corpus_beam(inputs, "memory://beam-elsewhere/c", beam_options=flags)
    assert store_listing("memory://beam-elsewhere/c") == {}
    put("memory://beam-elsewhere/in", "a.jsonl", pathlib.Path(inputs[0]).read_bytes())
    with pytest.raises(UsageError, match=r"^E9012: memory://beam-elsewhere/in/a\.jsonl: a memory:// store"):
        corpus.build_corpus_beam(["memory://beam-elsewhere/in/a.jsonl"], tmp_path / "c", beam_options=flags)
    assert not (tmp_path / "c").exists()


def held(place: str) -> dict[str, bytes]:
    return without_lock(listing(place)) if "://" not in place else store_listing(place)


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_a_users_file_at_a_shard_name_is_refused_before_the_pipeline_runs(request, tmp_path, docs, kind):
    """No manifest or journal of the place lists shard-00001.psk.d: the file there is the user's,
    and the launcher refuses (E9012 naming it) before it writes anything."""
    pytest.importorskip("apache_beam")
    place = {"local": lambda: str(tmp_path / "c"), "memory": lambda: "memory://beam-mine/c",
             "s3": lambda: request.getfixturevalue("s3_bucket").url + "/c"}[kind]()
    put(place, "shard-00001.psk.d", b"the user's own bytes")
    put(place, "shard-99999.psk.d", b"the user's other bytes")
    inputs = make_inputs(tmp_path / "in", docs)
    with pytest.raises(UsageError, match=r"^E9012: .*c/shard-00001\.psk\.d: an? (file|object) stands at a shard's "
                                         r"name, and no manifest or journal of this corpus lists it"):
        corpus.build_corpus_beam(inputs, place)
    assert held(place) == {"shard-00001.psk.d": b"the user's own bytes", "shard-99999.psk.d": b"the user's other bytes"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_smaller_rebuild_removes_the_builds_own_shards_and_no_other(tmp_path, docs, kind):
    pytest.importorskip("apache_beam")
    place = str(tmp_path / "c") if kind == "local" else "memory://beam-fewer/c"
    put(place, "shard-99999.psk.d", b"the user's own bytes")
    inputs = make_inputs(tmp_path / "in", docs)
    corpus.build_corpus_beam(inputs, place)
    assert sorted(held(place)) == [*(f"shard-{i:05d}.psk.d" for i in range(5)), "shard-99999.psk.d", "shards.json"]
    corpus.build_corpus_beam(inputs[:2], place)
    corpus.build_corpus(inputs[:2], tmp_path / "local")
    expected = dict(without_lock(listing(tmp_path / "local")), **{"shard-99999.psk.d": b"the user's own bytes"})
    assert held(place) == expected


@pytest.fixture
def dask_cluster(s3_bucket):
    """Two Dask worker processes on 127.0.0.1, started and stopped here, with the environment that
    reaches the test's bucket."""
    pytest.importorskip("apache_beam.runners.dask.dask_runner")
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address="127.0.0.1:0", env=s3_bucket.env)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_on_a_dask_cluster_into_a_directory_and_a_bucket(tmp_path, docs, bpe, s3_bucket, dask_cluster):
    """Beam's DaskRunner against a real dask.distributed cluster of worker processes: the local
    build's bytes, into a local directory and into the S3 server."""
    inputs = make_inputs(tmp_path / "in", docs)
    options = BuildOptions(tokenizer=Tokenizer.from_file(bpe), max_document_tokens=300)
    corpus.build_corpus(inputs, tmp_path / "local", options)
    flags = ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
             f"--dask_client_address={dask_cluster.scheduler_address}"]
    corpus.build_corpus_beam(inputs, tmp_path / "dask", options, beam_options=flags)
    assert_same_corpus(tmp_path / "local", tmp_path / "dask")
    place = s3_bucket.url + "/dask"
    corpus.build_corpus_beam(inputs, place, options, beam_options=flags)
    assert store_listing(place) == without_lock(listing(tmp_path / "local"))


@pytest.mark.parametrize(("given", "kind"), [("address", "local"), ("file", "local"), ("address", "s3")])
def test_a_dask_scheduler_out_of_reach_is_e9012_before_anything_is_written(request, tmp_path, docs, given, kind):
    """Nothing listens at the address, or the scheduler file is not there: one E9012 naming it, and
    no directory, lock, journal or claim. The runner connects only once the launcher has written
    those; it waited out Dask's 30 s and ended in a traceback, or waited for the file without end."""
    pytest.importorskip("apache_beam.runners.dask.dask_runner")
    target = {"address": f"--dask_client_address=tcp://127.0.0.1:{free_port()}",
              "file": f"--dask_scheduler_file={tmp_path / 'scheduler.json'}"}[given]
    place = str(tmp_path / "c") if kind == "local" else request.getfixturevalue("s3_bucket").url + "/c"
    expected = {"address": r"tcp://127\.0\.0\.1:[0-9]+: cannot reach the Dask scheduler \(--dask_client_address\)",
                "file": r".*scheduler\.json: no such Dask scheduler file"}[given]
    with pytest.raises(UsageError, match=f"^E9012: {expected}"):
        corpus.build_corpus_beam(make_inputs(tmp_path / "in", docs)[:2], place,
                                 beam_options=["--runner=apache_beam.runners.dask.dask_runner.DaskRunner", target])
    if kind == "s3":
        assert held(place) == {}
    else:
        assert not os.path.lexists(place)


def test_workers_dying_until_dask_gives_the_run_up_is_one_e9003_line():
    """Dask gives a run up with ``KilledWorker`` once the workers running a task died more often than
    it allows (``kill -9``, out of memory): that ended in Dask's traceback; it is E9003, as a dead
    worker of the local pool is, and a rerun finishes the build."""
    distributed = pytest.importorskip("distributed")

    class Worker:
        address = "tcp://127.0.0.1:40000"

    class Result:
        def wait_until_finish(self):  # what DaskRunnerResult raises, as the client got it
            raise distributed.KilledWorker("apply_dofn_to_bundle-from_sequence-1f2e", Worker(), 3)

    class Pipeline:
        def __init__(self, options):
            pass

        def __or__(self, transform):
            return self

        def run(self):
            return Result()

    class Transform:
        def __rrshift__(self, label):  # "BuildCorpus" >> transform
            return self

    beam = type("beam", (), {"Pipeline": Pipeline})
    with pytest.raises(TruncatedError) as lost:
        corpus_beam._run(beam, Transform(), None)
    assert str(lost.value) == ("E9003: a build worker died (Dask: Attempted to run task "
                               "'apply_dofn_to_bundle-from_sequence-1f2e' on 4 different workers, but all those "
                               "workers died while running it); run the build again to finish it")
    assert lost.value.__cause__ is None and lost.value.__suppress_context__


@pytest.mark.parametrize("kind", ["empty", "rebuilt", "memory"])
def test_a_run_the_runner_calls_finished_without_its_last_step_is_e9003_not_a_corpus(tmp_path, docs, monkeypatch,
                                                                                      kind):
    """Beam's DaskRunner reports a run finished when it loses its scheduler mid-run: the last step
    (the complete manifest) never ran. The launcher found the manifest in progress it put itself
    (or none) and reported it as the corpus, exit 0: "wrote …/shards.json (0 shards …)"."""
    pytest.importorskip("apache_beam")
    inputs = make_inputs(tmp_path / "in", docs)[:2]
    place = "memory://beam-unfinished/c" if kind == "memory" else str(tmp_path / "c")
    if kind == "rebuilt":
        corpus.build_corpus(inputs, place)
    monkeypatch.setattr(corpus_beam, "_run", lambda beam, transform, flags: None)  # "finished", ran nothing
    with pytest.raises(TruncatedError, match=r"^E9003: .*c/shards\.json: the pipeline ended without writing the "
                                             r"complete manifest .*run the build again to finish it"):
        corpus.build_corpus_beam(inputs, place)


@pytest.mark.parametrize("given", ["s3:/bkt/a.jsonl", "gs:relative.jsonl", "S3:bkt/a.jsonl"])
def test_a_served_scheme_without_its_slashes_is_refused_not_handed_to_beam(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match=f"E9018: {given}: starts like a URL"):
        corpus_beam.find_sources([given])
    assert os.listdir(tmp_path) == []


def listed_shards_intact(directory) -> dict[str, bool]:
    """What ``shards.json`` of ``directory`` lists now: each listed shard's name, and whether its
    file still matches its entry (a reader's view at that moment)."""
    from pskd_jax.corpus.journal import local_manifest
    from pskd_jax.corpus.maintain import shard_problem

    manifest = local_manifest(str(directory))
    assert manifest is not None, "no shards.json a reader could read"
    return {s.path: shard_problem(os.path.join(directory, s.path), s, manifest.tokenizer) is None
            for s in manifest.shards}


@pytest.mark.slow
def test_a_rebuild_unlists_the_old_shards_before_it_replaces_them(tmp_path, docs, monkeypatch):
    """Over a complete corpus of other inputs, every shard the rebuild writes is unlisted first: a
    reader while the shards are written, or after the pipeline dies before its manifest, sees a
    manifest in progress listing no shard whose bytes changed. A rerun then finishes the corpus."""
    pytest.importorskip("apache_beam")
    place = tmp_path / "c"
    old_inputs, new_inputs = make_inputs(tmp_path / "old", docs), make_inputs(tmp_path / "new", docs[1:])
    corpus.build_corpus(old_inputs, place)
    old_shards = {n: b for n, b in listing(place).items() if names.shard_index(n) is not None}
    seen: list[dict[str, bool]] = []
    real = corpus_beam.build_shard

    def watched(source, shard_path, *args, **kwargs):
        seen.append(listed_shards_intact(place))  # what a reader sees while shards are rewritten
        return real(source, shard_path, *args, **kwargs)

    def killed(*args, **kwargs):
        raise RuntimeError("the pipeline dies before its manifest")

    monkeypatch.setattr(corpus_beam, "build_shard", watched)
    monkeypatch.setattr(corpus_beam, "write_manifest", killed)
    with pytest.raises(Exception, match="dies before its manifest"):
        corpus.build_corpus_beam(new_inputs, place)
    assert len(seen) == 5 and all(all(view.values()) for view in seen)
    assert any(listing(place)[n] != b for n, b in old_shards.items())  # shards changed: the listing is what counts
    assert all(listed_shards_intact(place).values())
    monkeypatch.undo()
    corpus.build_corpus_beam(new_inputs, place)
    corpus.build_corpus(new_inputs, tmp_path / "local")
    assert_same_corpus(tmp_path / "local", place)


def test_a_directory_at_the_manifests_name_is_refused_before_the_pipeline_runs(tmp_path, docs):
    pytest.importorskip("apache_beam")
    (tmp_path / "c" / "shards.json").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"^E9012: .*c/shards\.json: not a file \(a directory"):
        corpus.build_corpus_beam(make_inputs(tmp_path / "in", docs), tmp_path / "c")
    assert sorted(set(os.listdir(tmp_path / "c")) - {names.CORPUS_LOCK}) == ["shards.json"]  # nothing written


class _Launched(Exception):
    """Raised in place of running the pipeline: the test wants only its options."""


@pytest.mark.parametrize(("given", "size", "count"), [([], 1, None), (["--dask_npartitions=2"], None, 2),
                                                     (["--dask_partition_size=4"], 4, None)])
def test_on_the_dask_runner_each_input_is_a_task_of_its_own(given, size, count):
    """Beam's DaskRunner put up to 128 inputs in one partition of its bag (one task) and runs
    Reshuffle as nothing: on a cluster of several workers one thread built every shard in turn,
    and a worker killed meanwhile lost them all. Unless the flags partition the bag, one input is one task."""
    pytest.importorskip("apache_beam.runners.dask.dask_runner")
    from apache_beam.runners.dask.dask_runner import DaskOptions

    flags = corpus_beam.pipeline_options(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner", *given], 1)
    dask = flags.view_as(DaskOptions)
    assert (dask.partition_size, dask.npartitions) == (size, count)


@pytest.mark.parametrize(("inputs", "expected"), [(1, None), (3, 3)])
def test_the_local_runner_gets_no_more_workers_than_inputs(tmp_path, docs, monkeypatch, inputs, expected):
    """``workers=12`` for one input is one process (Beam's default: no multi-processing flags), for
    three inputs three worker processes; the pipeline is not run."""
    pytest.importorskip("apache_beam")
    sources = [write_jsonl(tmp_path / f"{i}.jsonl", docs[i::3]) for i in range(inputs)]
    launched = []

    def launch(beam, transform, flags):
        launched.append(flags.get_all_options())
        raise _Launched

    monkeypatch.setattr(corpus_beam, "_run", launch)
    with pytest.raises(_Launched):
        corpus.build_corpus_beam(sources, tmp_path / "c", BuildOptions(workers=12))
    [given] = launched
    assert given["runner"] == corpus_beam.DEFAULT_RUNNER and given["direct_num_workers"] == (expected or 1)
    assert given["direct_running_mode"] == ("multi_processing" if expected else "in_memory")


def test_a_run_that_fails_leaves_no_killed_attempt_s_file(tmp_path, docs, monkeypatch):
    """A run that fails (here: its runner gave it up) after an attempt was killed mid-shard leaves
    none of that attempt's torn file; a file of the user's at a name like it stays."""
    pytest.importorskip("apache_beam")
    source = write_jsonl(tmp_path / "a.jsonl", docs)
    directory = tmp_path / "c"
    killed = directory / (names.temporary_prefix("shard-00000.psk.d") + "killed00.tmp")
    mine = directory / "notes.tmp"

    def run_killed(beam, transform, flags):
        killed.write_bytes(b"PSKD torn")  # (what an attempt killed mid-shard leaves, its lock gone)
        raise TruncatedError("a build worker died; run the build again to finish it")

    monkeypatch.setattr(corpus_beam, "_run", run_killed)
    directory.mkdir()
    mine.write_text("the user's")
    with pytest.raises(TruncatedError):
        corpus.build_corpus_beam([source], directory)
    assert not killed.exists() and mine.read_text() == "the user's"
