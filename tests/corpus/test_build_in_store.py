"""Corpus builds into any place: a local directory, ``memory://`` and a bucket of the loopback S3
server. The same bytes as a local build; a build cut off resumes; ``shards.json`` is a whole
manifest whenever it is read; a builder that another took over stops, E9016, its shards not
listed; inputs read from a bucket; merges into a bucket; faults while a shard is uploaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pskd_jax import corpus
from pskd_jax._os import names
from pskd_jax.corpus import BuildOptions
from pskd_jax.corpus import shard_build as shard_build_module
from pskd_jax.corpus.manifest import manifest_bytes, manifest_object
from pskd_jax.errors import CorpusDirectoryError, CorpusInputError, PskdError, StorageError
from pskd_jax.storage import CREATE, Version, resolve
from tests.faultproxy import Rule, answer, drop
from tests.helpers import ROOT

from .helpers import make_inputs, put

SHARDS = 5  # make_inputs gives four .jsonl inputs and a .txt


def objects(place: str) -> dict[str, bytes]:
    """The shards, manifest and journal in a place (a directory's lock file left out), by name."""
    store, where = resolve(place)
    if where.is_local:
        return {n: open(os.path.join(where.path, n), "rb").read() for n in sorted(os.listdir(where.path))
                if n != names.CORPUS_LOCK and not os.path.isdir(os.path.join(where.path, n))}
    return {o.key.rpartition("/")[2]: store.get(o.key)[0] for o in store.list(where.key)}


def manifest_at(place: str) -> corpus.Manifest:
    store, where = resolve(place)
    if where.is_local:
        return corpus.read_manifest(os.path.join(where.path, "shards.json"))
    return manifest_object(store, where.child("shards.json").key)[0]


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "in").mkdir()
    return [str(p) for p in make_inputs(tmp_path / "in")]


@pytest.fixture
def local(tmp_path, inputs) -> dict[str, bytes]:
    """The local build of the inputs: what every place must hold."""
    corpus.build_corpus(inputs, tmp_path / "local", BuildOptions(durable=False))
    return objects(str(tmp_path / "local"))


def test_a_build_gives_the_local_bytes_in_every_place(any_place, inputs, local):
    place = any_place + "/corpus"
    result = corpus.build_corpus(inputs, place, BuildOptions(chunk_tokens=7))
    assert objects(place) == local  # no journal, nothing else
    assert result.built == SHARDS and os.path.basename(result.manifest.path) == "shards.json"
    again = corpus.build_corpus(inputs, place)
    assert (again.built, again.kept) == (0, SHARDS) and objects(place) == local


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_pool_of_workers_writes_straight_to_the_bucket(s3_bucket, inputs, local):
    place = s3_bucket.url + "/pool"
    corpus.build_corpus(inputs, place, BuildOptions(workers=2))
    assert objects(place) == local


def test_nothing_is_written_to_a_local_path_named_like_a_url(tmp_path, inputs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("s3://NotABucket/c", "ftp://host/c", "s3://bucket/a//b"):
        with pytest.raises(StorageError, match=r"^E9018: "):
            corpus.build_corpus(inputs, url)
    assert sorted(os.listdir(tmp_path)) == ["in"]


def kill_at_the_third_shard(monkeypatch):
    """Builds from here on die (as if killed) when they start the third shard; returns the real
    ``build_shard``, to put back."""
    real = shard_build_module.build_shard

    def dies_at_the_third(source, shard_path, *args, **kwargs):
        if shard_path.endswith("shard-00002.psk.d"):
            raise KeyboardInterrupt("killed")
        return real(source, shard_path, *args, **kwargs)

    monkeypatch.setattr(shard_build_module, "build_shard", dies_at_the_third)
    return real


def test_a_build_cut_off_resumes_and_gives_the_same_bytes(any_place, inputs, local, monkeypatch):
    """The third shard's build dies: the manifest in progress lists the two before it, the journal
    records them, and the rerun keeps them and finishes with the uninterrupted build's bytes."""
    place = any_place + "/resumed"
    real = kill_at_the_third_shard(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        corpus.build_corpus(inputs, place)
    cut = manifest_at(place)
    assert not cut.complete and [s.path for s in cut.shards] == ["shard-00000.psk.d", "shard-00001.psk.d"]
    assert names.CORPUS_JOURNAL in objects(place)
    monkeypatch.setattr(shard_build_module, "build_shard", real)
    again = corpus.build_corpus(inputs, place)
    assert (again.kept, again.built) == (2, 3) and objects(place) == local


def test_a_kept_object_that_changed_is_rebuilt(any_place, inputs, local):
    place = any_place + "/changed"
    corpus.build_corpus(inputs, place)
    store, where = resolve(place)
    key = where.child("shard-00001.psk.d")
    data = bytearray(store.get(key.key if not key.is_local else key.path)[0])
    data[-1] ^= 1
    store.put(key.key if not key.is_local else key.path, bytes(data))
    again = corpus.build_corpus(inputs, place)
    assert (again.kept, again.built) == (SHARDS - 1, 1) and objects(place) == local


def test_shards_json_is_a_whole_manifest_whenever_it_is_read(any_place, inputs, local, monkeypatch):
    """Read while writing: at every progress report the manifest is a whole one, in progress,
    listing a prefix of the shards, each of which is already its final bytes."""
    from pskd_jax.corpus import publisher

    monkeypatch.setattr(publisher, "PUBLISH_SECONDS", 0.0)  # a manifest as each shard finishes
    place = any_place + "/growing"
    seen: list[int] = []

    def look(done_bytes, total_bytes, done_shards, total_shards):
        try:
            m = manifest_at(place)
        except PskdError:
            return  # none yet: the first report comes before the first manifest
        assert m.complete or m.planned_shards == SHARDS
        held = objects(place)
        for shard in m.shards:
            assert held[shard.path] == local[shard.path]
        seen.append(len(m.shards))

    corpus.build_corpus(inputs, place, progress=look)
    assert seen == sorted(seen) and seen[-1] == SHARDS - 1
    assert objects(place) == local


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_a_builder_another_took_over_stops_and_lists_nothing_more(request, kind, tmp_path, inputs):
    """Builder A is taken over after its first shard (builder B puts its own manifest in progress):
    A's next shard is not put, A fails E9016, and the manifest is B's."""
    place = (request.getfixturevalue("s3_bucket").url if kind == "s3" else "memory://takeover") + "/c"
    store, where = resolve(place)
    key = where.child("shards.json").key
    options = BuildOptions()
    taken: list[bytes] = []

    def take_over(done_bytes, total_bytes, done_shards, total_shards):
        if done_shards == 1 and not taken:
            current, info = manifest_object(store, key)
            taken.append(manifest_bytes(options.tokenizer, current.shards, options.recorded(), planned_shards=SHARDS,
                                        writer="builder-b"))
            store.put(key, taken[0], mode=Version(info.tag))

    with pytest.raises(CorpusDirectoryError, match=r"^E9016: .*another build took this corpus over.*builder-b"):
        corpus.build_corpus(inputs, place, options, progress=take_over)
    assert store.get(key)[0] == taken[0]
    assert "shard-00001.psk.d" not in objects(place)


def test_a_builder_that_loses_the_first_put_writes_nothing(object_place, inputs, monkeypatch):
    """Two builders start from an empty place; the other one's manifest lands first: this one's
    claim (only if there is none) loses, E9016, before any shard is put."""
    from pskd_jax.corpus import build as build_module

    place = object_place + "/raced"
    store, where = resolve(place)
    key = where.child("shards.json").key
    other = manifest_bytes(BuildOptions().tokenizer, [], BuildOptions().recorded(), planned_shards=1, writer="other")
    real = build_module.previous_manifest

    def read_then_lose(at):
        found = real(at)
        store.put(key, other, mode=CREATE)  # the other builder's claim lands meanwhile
        return found

    monkeypatch.setattr(build_module, "previous_manifest", read_then_lose)
    with pytest.raises(CorpusDirectoryError, match=r"^E9016: .*another build of this corpus put its manifest"):
        corpus.build_corpus(inputs, place)
    assert sorted(objects(place)) == ["shards.json"] and store.get(key)[0] == other


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_inputs_from_a_bucket(request, kind, tmp_path, inputs, local):
    """Inputs as objects: a prefix ending in '/', a pattern, an object named; the shards are the
    local build's and the manifest records each object's URL, size and version tag."""
    any_place = request.getfixturevalue("s3_bucket").url if kind == "s3" else "memory://inputs"
    store, where = resolve(any_place)
    raw = where.child("raw")
    for path in inputs:
        with open(path, "rb") as f:
            store.put(raw.child(os.path.basename(path)).key, f.read())
    given = [raw.url + "/in0.jsonl", raw.url + "/in[12].jsonl", raw.url + "/in3.*", raw.url + "/in9.txt"]
    result = corpus.build_corpus(given, any_place + "/from-bucket")
    built = objects(any_place + "/from-bucket")
    assert {n: b for n, b in built.items() if n != "shards.json"} == {n: b for n, b in local.items()
                                                                    if n != "shards.json"}
    sources = [s.source for s in result.manifest.shards]
    assert [s["path"] for s in sources] == [raw.url + f"/in{i}.jsonl" for i in range(4)] + [raw.url + "/in9.txt"]
    assert all(set(s) == {"path", "size", "tag"} for s in sources)
    prefixed = corpus.build_corpus([raw.url + "/"], any_place + "/from-prefix")
    assert [s.sha256 for s in prefixed.manifest.shards] == [s.sha256 for s in result.manifest.shards]
    assert corpus.build_corpus(given, any_place + "/from-bucket").kept == SHARDS
    with pytest.raises(CorpusInputError, match=r"^E9015: .*raw/missing\.jsonl: no such object"):
        corpus.build_corpus([raw.url + "/missing.jsonl"], any_place + "/none")
    store.put(raw.child("bad.jsonl").key, b'{"text": 1}\n')
    with pytest.raises(CorpusInputError, match=r"^E9015: .*raw/bad\.jsonl:1: the 'text' value is \d+"):
        corpus.build_corpus([raw.url + "/bad.jsonl"], any_place + "/bad")


def test_a_pattern_or_prefix_finding_no_object_is_bad_input_not_nothing(object_place, inputs):
    """A pattern that matched no object, or a prefix with nothing below it (a store's directory
    that is not there), beside other inputs gave no input without a word: the corpus was built
    without its documents. Each is now E9015 naming it, and nothing is written; a prefix holding
    objects but no input gives none, as a directory of other files does."""
    store, where = resolve(object_place)
    raw = where.child("raw")
    store.put(raw.child("notes.md").key, b"not an input")
    store.put(raw.child("deeper").child("in0.jsonl").key, b'{"text": "below a prefix inside"}\n')
    for given, words in ((raw.url + "/in*.jsonl", "the pattern matches no .jsonl, .jsonl.gz or .txt object (of 1"),
                         (where.child("rwa").url + "/", "no object directly below this prefix"),
                         (where.child("rwa").url + "/*.jsonl", "the pattern matches no .jsonl, .jsonl.gz or .txt "
                                                               "object (of 0"),
                         (raw.child("deeper").url + "x/", "no object directly below this prefix")):
        with pytest.raises(CorpusInputError, match="^E9015: ") as refused:
            corpus.build_corpus([inputs[0], given], object_place + "/c")
        assert str(refused.value).startswith(f"E9015: {given}: {words}"), refused.value
        assert objects(object_place + "/c") == {}
    built = corpus.build_corpus([inputs[0], raw.url + "/"], object_place + "/c")  # notes.md: no input
    assert len(built.manifest.shards) == 1


def test_merge_into_a_bucket(any_place, tmp_path, inputs):
    all_parts = any_place + "/all"
    corpus.build_corpus(inputs[:2], all_parts + "/a")
    corpus.build_corpus(inputs[2:], all_parts + "/b")
    whole = corpus.build_corpus(inputs, any_place + "/whole")
    parts = [all_parts + "/a/shards.json", all_parts + "/b/shards.json"]
    merged = corpus.merge_manifests(parts, all_parts + "/shards.json")
    assert [s.path for s in merged.shards] == ["a/shard-00000.psk.d", "a/shard-00001.psk.d", "b/shard-00000.psk.d",
                                               "b/shard-00001.psk.d", "b/shard-00002.psk.d"]
    assert [s.sha256 for s in manifest_at(all_parts).shards] == [s.sha256 for s in whole.manifest.shards]
    with pytest.raises(CorpusDirectoryError, match="lists already"):
        corpus.merge_manifests([parts[0], parts[0]], all_parts + "/twice.json")
    with pytest.raises(CorpusDirectoryError, match="outside"):
        corpus.merge_manifests(parts, all_parts + "/a/inner.json")


@pytest.mark.slow
@pytest.mark.parametrize("fault", [answer(503), drop(reset=True)], ids=["503", "reset"])
def test_a_fault_while_a_shard_is_put_is_retried(faulty_bucket, fault_proxy, inputs, local, fault):
    place = faulty_bucket.url + "/faulty"
    fault_proxy.plan(Rule(fault, method="PUT", path=r"shard-0000[13]\.psk\.d", times=2))
    corpus.build_corpus(inputs, place)
    assert fault_proxy.faults_done() == 2
    assert objects(place) == local


@pytest.mark.slow
def test_a_shard_put_that_keeps_failing_is_e9018_and_never_listed(faulty_bucket, fault_proxy, inputs, local):
    place = faulty_bucket.url + "/failing"
    fault_proxy.plan(Rule(answer(503), method="PUT", path=r"shard-00002\.psk\.d", times=None))
    with pytest.raises(StorageError, match=r"^E9018: s3://.*shard-00002\.psk\.d: cannot write it"):
        corpus.build_corpus(inputs, place)
    fault_proxy.plan()
    m = manifest_at(place)
    assert not m.complete and "shard-00002.psk.d" not in [s.path for s in m.shards]
    assert "shard-00002.psk.d" not in objects(place)
    corpus.build_corpus(inputs, place)  # the rerun finishes it
    assert objects(place) == local


@pytest.mark.slow
def test_a_worker_that_cannot_read_the_claim_says_so_not_that_another_build_took_over(faulty_bucket, fault_proxy,
                                                                                     inputs):
    """After the claim, every read of ``shards.json`` is refused (403: what a Beam worker without
    the store's credentials meets): the check before a shard's put is E9018 naming the manifest and
    the store's answer, not E9016 'another build took this corpus over', and no shard is put."""
    place = faulty_bucket.url + "/unreadable"
    fault_proxy.plan(Rule(answer(403), method="GET", path=r"unreadable/shards\.json", skip=1, times=None))
    with pytest.raises(StorageError, match=r"^E9018: s3://.*unreadable/shards\.json: .*403.*before this build puts "
                                           r".*shard-00000\.psk\.d"):
        corpus.build_corpus(inputs, place)
    assert fault_proxy.faults_done() >= 1
    fault_proxy.plan()
    assert "shard-00000.psk.d" not in objects(place)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_build_killed_mid_way_resumes_from_the_bucket(s3_bucket, tmp_path, local):
    """``pskd corpus build … -o s3://…`` SIGKILLed once the manifest in progress lists a shard; the
    rerun keeps what it listed or journaled and ends with the local build's bytes."""
    inputs = sorted(str(tmp_path / "in" / n) for n in os.listdir(tmp_path / "in"))
    place = s3_bucket.url + "/killed"
    command = [sys.executable, "-m", "pskd_jax.apps.pskd", "corpus", "build", *inputs, "-o", place,
               "--chunk-tokens", "8"]
    env = dict(s3_bucket.env, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if manifest_at(place).shards:
                    break
            except PskdError:
                pass
            time.sleep(0.01)
        process.kill()
    finally:
        process.wait()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert objects(place) == local
    assert json.loads(objects(place)["shards.json"])["shards"][0]["path"] == "shard-00000.psk.d"


# --------------------------------------------------------------------------------------------
# Files at shard names: only those an earlier record of the place lists are the build's own


def test_a_users_file_at_a_shard_name_the_build_writes_is_refused_and_nothing_written(any_place, inputs):
    """A first build (no manifest, no journal) where the user keeps files named like shards: one
    at a name it would write is refused, E9012 naming it, before anything is written."""
    place = any_place + "/mine"
    put(place, "shard-00001.psk.d", b"the user's own bytes")
    put(place, "shard-99999.psk.d", b"the user's other bytes")
    with pytest.raises(PskdError) as caught:
        corpus.build_corpus(inputs[:2], place)
    assert caught.value.code == "E9012"
    assert "shard-00001.psk.d: a file stands at a shard's name" in caught.value.message \
        or "shard-00001.psk.d: an object stands at a shard's name" in caught.value.message
    assert "no manifest or journal of this corpus lists it" in caught.value.message
    assert "move it away or build into another directory" in caught.value.message
    assert objects(place) == {"shard-00001.psk.d": b"the user's own bytes",
                              "shard-99999.psk.d": b"the user's other bytes"}  # no manifest, no journal


def test_a_users_file_at_a_shard_name_the_build_does_not_write_is_left(any_place, inputs, tmp_path):
    place = any_place + "/beside"
    put(place, "shard-00007.psk.d", b"the user's own bytes")
    put(place, "shard-99999.psk.d", b"the user's other bytes")
    corpus.build_corpus(inputs[:1], place)
    corpus.build_corpus(inputs[:1], tmp_path / "one")
    assert objects(place) == dict(objects(str(tmp_path / "one")), **{"shard-00007.psk.d": b"the user's own bytes",
                                                                       "shard-99999.psk.d": b"the user's other bytes"})
    corpus.build_corpus(inputs[:3], place)  # a rebuild of more inputs: still never at the user's names
    corpus.build_corpus(inputs[:1], place)  # and one of fewer: its own extra shards removed, no other
    assert objects(place) == dict(objects(str(tmp_path / "one")), **{"shard-00007.psk.d": b"the user's own bytes",
                                                                       "shard-99999.psk.d": b"the user's other bytes"})


def test_builds_killed_mid_way_then_one_of_fewer_inputs_removes_their_shards_and_no_other(any_place, inputs, tmp_path,
                                                                                           monkeypatch):
    """A first build killed at its third shard, with a torn shard 3 as a writer killed while writing
    it in place leaves it (no manifest or journal entry lists it: the journal's "writes" line does);
    a rerun of three inputs killed too; then a build of two inputs finishes, removes shards 2 to 4
    (the killed builds' own) and leaves the user's file at shard-99999.psk.d."""
    place = any_place + "/killed"
    put(place, "shard-99999.psk.d", b"the user's own bytes")
    real = kill_at_the_third_shard(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        corpus.build_corpus(inputs, place)
    put(place, "shard-00003.psk.d", b"PSKD a torn shard")
    put(place, "shard-00004.psk.d", b"PSKD another")
    with pytest.raises(KeyboardInterrupt):
        corpus.build_corpus(inputs[:3], place)
    assert json.loads(objects(place)[names.CORPUS_JOURNAL].split(b"\n")[1]) == \
        {"writes": [f"shard-{i:05d}.psk.d" for i in range(SHARDS)]}  # the first build's names too
    monkeypatch.setattr(shard_build_module, "build_shard", real)
    again = corpus.build_corpus(inputs[:2], place)
    assert (again.kept, again.built) == (2, 0)
    corpus.build_corpus(inputs[:2], tmp_path / "two")
    assert objects(place) == dict(objects(str(tmp_path / "two")), **{"shard-99999.psk.d": b"the user's own bytes"})
