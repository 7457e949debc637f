"""Reading a corpus while it is built and rebuilt: the manifest is never absent and lists finished
shards only; a shard that changes is written beside the old file and renamed over it, so an open
reader keeps its old view until it refreshes; ``CorpusWindows.refresh`` takes up the newer corpus."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from pskd_jax._os.digests import file_sha256
from pskd_jax.corpus import publisher
from pskd_jax.corpus.build import build_corpus
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError
from tests.helpers import HANG_GUARD_S, wait_until, wait_until_waiting_for_lock

ROOT = pathlib.Path(__file__).resolve().parents[2]
B = 256  # the byte tokenizer's boundary


def write_jsonl(path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return path


def tokens_of(path: str | os.PathLike) -> np.ndarray:
    """The byte tokenizer's tokens of a JSONL file: each document's UTF-8 bytes, then the boundary."""
    out = []
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        if text:
            out += list(text.encode("utf-8")) + [B]
    return np.array(out, np.uint16)


def texts(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("abcdé xyz"), int(rng.integers(1, 50)))) for _ in range(n)]


def expected_windows(stream: np.ndarray, seq: int, stride: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = indices * stride
    return stream[starts[:, None] + np.arange(seq)], stream[starts[:, None] + np.arange(1, seq + 1)]


def assert_serves(windows: CorpusWindows, stream: np.ndarray) -> None:
    """Every window of ``windows`` (and its whole stream) is that of ``stream``."""
    assert windows.total_tokens == len(stream)
    np.testing.assert_array_equal(windows.stream(0, windows.total_tokens), stream)
    if len(windows):
        idx = np.arange(len(windows))
        got, want = windows.gather(idx), expected_windows(stream, windows.seq, windows.stride, idx)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


# ---------------------------------------------------------------------------------------------
# The shard writer never changes a file a reader may hold


def test_a_shard_that_exists_is_replaced_by_rename_and_an_open_reader_keeps_its_bytes(tmp_path):
    path = tmp_path / "s.psk.d"
    first = ShardWriter(str(path), Tokenizer.bytes(), chunk_tokens=3, durable=False)
    assert first.in_place
    first.append(np.arange(10, dtype=np.uint16))
    first.close()
    inode = path.stat().st_ino
    with pskd_jax.Reader(path) as old_map, pskd_jax.Reader(path, access="pread") as old_pread:
        second = ShardWriter(str(path), Tokenizer.bytes(), chunk_tokens=3, durable=False)
        assert not second.in_place
        second.append(np.arange(100, 104, dtype=np.uint16))
        assert path.stat().st_ino == inode  # nothing renamed yet: the old shard is still at its path
        assert second.close() == 4
        assert path.stat().st_ino != inode
        # The old file was never shortened: both readers read all ten of its tokens (no SIGBUS, no E9003).
        np.testing.assert_array_equal(old_map.gather(np.arange(10)), np.arange(10))
        np.testing.assert_array_equal(old_pread.gather(np.arange(10)), np.arange(10))
    with pskd_jax.Reader(path) as new:
        np.testing.assert_array_equal(new.leaves()[0], np.arange(100, 104))
    assert sorted(os.listdir(tmp_path)) == ["s.psk.d"]  # no temporary file left


def test_abort_of_a_replacement_leaves_the_old_shard(tmp_path):
    path = tmp_path / "s.psk.d"
    w = ShardWriter(str(path), Tokenizer.bytes(), durable=False)
    w.append(np.arange(5, dtype=np.uint16))
    w.close()
    before = path.read_bytes()
    w = ShardWriter(str(path), Tokenizer.bytes(), chunk_tokens=2, durable=False)
    w.append(np.arange(7, dtype=np.uint16))
    w.abort()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["s.psk.d"]
    w = ShardWriter(str(tmp_path / "new.psk.d"), Tokenizer.bytes(), chunk_tokens=2, durable=False)
    w.append(np.arange(7, dtype=np.uint16))
    w.abort()  # a shard created in place is removed
    assert sorted(os.listdir(tmp_path)) == ["s.psk.d"]


def test_reset_of_a_shard_written_in_place_does_not_truncate_what_a_reader_saw(tmp_path):
    path = tmp_path / "s.psk.d"
    w = ShardWriter(str(path), Tokenizer.bytes(), chunk_tokens=2, durable=False)
    w.append(np.arange(5, dtype=np.uint16))  # two chunks counted, one token held
    with pskd_jax.Reader(path) as seen:
        assert len(seen) == 4
        w.reset()
        w.append(np.array([7, B], np.uint16))
        assert w.close() == 2
        np.testing.assert_array_equal(seen.gather(np.arange(4)), np.arange(4))  # its bytes are whole
    with pskd_jax.Reader(path) as r:
        np.testing.assert_array_equal(r.leaves()[0], [7, B])
    assert sorted(os.listdir(tmp_path)) == ["s.psk.d"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_directory_or_fifo_at_a_shard_name_is_refused_not_replaced(tmp_path, kind):
    path = tmp_path / "s.psk.d"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    with pytest.raises(PskdError,
                       match=r"E9012: .*s.psk.d: a (directory|named pipe \(FIFO\)) stands at the shard's name"):
        ShardWriter(str(path), Tokenizer.bytes(), durable=False)
    assert path.is_dir() if kind == "directory" else path.is_fifo()
    assert sorted(os.listdir(tmp_path)) == ["s.psk.d"]


@pytest.mark.subprocess
def test_two_writers_of_one_shard_take_turns(tmp_path):
    """The second writer waits for the first (it holds the shard's lock), then replaces its shard."""
    path = tmp_path / "s.psk.d"
    first = ShardWriter(str(path), Tokenizer.bytes(), chunk_tokens=2, durable=False)
    first.append(np.arange(4, dtype=np.uint16))
    code = textwrap.dedent(f"""
        import numpy as np
        from pskd_jax.corpus.shard_writer import ShardWriter
        from pskd_jax.corpus.tokenizer import Tokenizer
        w = ShardWriter({str(path)!r}, Tokenizer.bytes(), durable=False)
        print("opened", flush=True)
        w.append(np.array([9, 9, 9], np.uint16)); w.close()
    """)
    second = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_until_waiting_for_lock(second, path)  # it reached the shard and waits for the first
        first.close()
        assert second.stdout.readline() == "opened\n" and second.wait(timeout=60) == 0
    finally:
        if second.poll() is None:
            second.kill()
    with pskd_jax.Reader(path) as r:
        np.testing.assert_array_equal(r.leaves()[0], [9, 9, 9])


# ---------------------------------------------------------------------------------------------
# The manifest during a build


def test_the_manifest_lists_finished_shards_only_and_grows_during_a_first_build(tmp_path, monkeypatch):
    monkeypatch.setattr(publisher, "PUBLISH_SECONDS", 0.0)
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 30 + 10 * i)) for i in range(4)]
    out = tmp_path / "c"
    seen = []

    def progress(done_bytes, total_bytes, done_shards, total_shards):
        if (out / "shards.json").exists():  # read while the build runs, between two shards
            result = corpus.verify_corpus(out / "shards.json")
            seen.append((result.manifest.complete, result.manifest.planned_shards, len(result.manifest.shards)))

    build_corpus(inputs, out, BuildOptions(chunk_tokens=16, durable=False), progress=progress)
    assert sorted(set(seen)) == [(False, 4, n) for n in (1, 2, 3)] and seen == sorted(seen)  # it only grows
    final = corpus.read_manifest(out / "shards.json")
    assert final.complete and "in_progress" not in (out / "shards.json").read_text()
    with CorpusWindows(out / "shards.json", seq=8) as w:
        assert w.complete
        assert_serves(w, np.concatenate([tokens_of(p) for p in inputs]))


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_a_rebuild_never_breaks_an_open_reader_and_refresh_takes_it_up(tmp_path, monkeypatch, access):
    monkeypatch.setattr(publisher, "PUBLISH_SECONDS", 0.0)
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 40)) for i in range(4)]
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(chunk_tokens=16, durable=False))
    old_stream = np.concatenate([tokens_of(p) for p in inputs])
    windows = CorpusWindows(out / "shards.json", seq=8, stride=3, access=access)
    held = CorpusWindows(out / "shards.json", seq=8, stride=3, access=access)  # never refreshed
    assert_serves(windows, old_stream)

    write_jsonl(inputs[1], texts(100, 25))  # a changed input: its shard is rebuilt, the others kept
    inputs.append(write_jsonl(tmp_path / "in9.jsonl", texts(9, 5)))  # and one more shard
    during = []

    def progress(*_):
        m = corpus.verify_corpus(out / "shards.json").manifest  # never absent, every listed shard whole
        during.append([s.path for s in m.shards])
        assert windows.refresh() in (True, False)
        assert windows.complete == m.complete and windows.manifest.to_bytes() == m.to_bytes()
        pieces = [tokens_of(p) for p in inputs[: len(m.shards)]]
        assert_serves(windows, np.concatenate(pieces or [np.zeros(0, np.uint16)]))
        assert_serves(held, old_stream)

    result = build_corpus(inputs, out, BuildOptions(chunk_tokens=16, durable=False), progress=progress)
    assert (result.built, result.kept) == (2, 3)
    assert during[0] == ["shard-00000.psk.d"]  # shard 1 left out before its new file was renamed in
    new_stream = np.concatenate([tokens_of(p) for p in inputs])
    assert_serves(held, old_stream)  # the old files, unlinked or replaced, still read whole
    assert windows.refresh() is True and windows.complete
    assert_serves(windows, new_stream)
    assert windows.refresh() is False
    held.close()
    windows.close()


def test_refresh_keeps_the_old_view_on_an_error(tmp_path):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 20)) for i in range(2)]
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    stream = np.concatenate([tokens_of(p) for p in inputs])
    windows = CorpusWindows(out / "shards.json", seq=4, verify=True)
    assert windows.refresh() is False  # the same bytes: nothing reopened
    # A newly listed shard that does not verify: refresh verifies what it opens, as the constructor did.
    extra = out / "extra.psk.d"
    w = ShardWriter(str(extra), Tokenizer.bytes(), durable=False)
    w.append(np.array([1, 2, B], np.uint16))
    w.close()
    digest = file_sha256(extra)
    damaged = bytearray(extra.read_bytes())
    damaged[-6] ^= 1  # token 1 becomes 0
    extra.write_bytes(bytes(damaged))
    manifest = corpus.read_manifest(out / "shards.json")
    corpus.write_manifest(out / "shards.json", manifest.tokenizer,
                          list(manifest.shards) + [corpus.Shard("extra.psk.d", 3, 1, digest)], manifest.build)
    with pytest.raises(PskdError, match="E9017: .*shard 2 extra.psk.d: sha256"):
        windows.refresh()
    assert_serves(windows, stream)  # the old corpus, whole
    assert windows.refresh(verify=False) is True  # unverified, it opens (its header and size match)
    stream = np.concatenate([stream, [0, 2, B]]).astype(np.uint16)
    assert_serves(windows, stream)
    # A manifest of another tokenizer is not taken up.
    build_corpus(inputs, tmp_path / "chars", BuildOptions(tokenizer=Tokenizer.chars(list("abcdé xyz")), durable=False))
    os.replace(tmp_path / "chars" / "shards.json", out / "shards.json")
    with pytest.raises(PskdError, match="E9016: .*another tokenizer"):
        windows.refresh()
    assert_serves(windows, stream)
    windows.close()
    with pytest.raises(PskdError, match="E9012: .*closed"):
        windows.refresh()


def test_a_killed_build_resumes_from_its_manifest_in_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(publisher, "PUBLISH_SECONDS", 0.0)
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 30)) for i in range(3)]
    build_corpus(inputs, tmp_path / "ref", BuildOptions(durable=False))
    out = tmp_path / "c"

    class Killed(BaseException):
        pass

    def progress(done_bytes, total_bytes, done_shards, total_shards):
        if done_shards == 2:
            raise Killed

    with pytest.raises(Killed):
        build_corpus(inputs, out, BuildOptions(durable=False), progress=progress)
    partial = corpus.verify_corpus(out / "shards.json").manifest
    assert (partial.complete, len(partial.shards)) == (False, 2) and (out / ".shards.journal").exists()
    info = corpus.info_lines(out / "shards.json")
    assert info[-1].startswith("building   2 of 3 shards listed")
    with pytest.raises(PskdError, match="E9016: .*in progress or was interrupted .*2 of 3 shards"):
        corpus.merge_manifests([out / "shards.json"], tmp_path / "merged.json")
    result = build_corpus(inputs, out, BuildOptions(durable=False))
    assert (result.built, result.kept) == (1, 2)
    for name in os.listdir(tmp_path / "ref"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "ref"))


def test_a_killed_writers_temporary_file_is_removed_by_the_next_build(tmp_path):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 10)) for i in range(3)]
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    # As a writer killed while replacing shard 2 leaves it, and shard 2 is then dropped.
    (out / ".shard-00002.psk.d.abcd_123.tmp").write_bytes(b"PSKD half a shard")
    (out / ".shard-00001.psk.d.abcd_123.tmp").write_bytes(b"PSKD half a shard")
    build_corpus(inputs[:2], out, BuildOptions(durable=False))
    build_corpus(inputs[:2], tmp_path / "ref", BuildOptions(durable=False))
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "ref"))


# ---------------------------------------------------------------------------------------------
# A trainer-like reader in one process, a writer appending and rebuilding in another


WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from pskd_jax.corpus import build as corpus_build, publisher
    from pskd_jax.corpus.options import BuildOptions
    publisher.PUBLISH_SECONDS = 0.0
    work, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(7)
    version = 0

    def pause(token):
        # Waits until the reader has read the corpus as it is now (it answers ack-TOKEN): each
        # round's finished corpus and one manifest in progress a round are seen, however the two
        # processes are scheduled.
        with open(os.path.join(work, "waiting.tmp"), "w") as f:
            f.write(token)
        os.replace(os.path.join(work, "waiting.tmp"), os.path.join(work, "waiting"))
        guard = time.monotonic() + 600
        while not os.path.exists(os.path.join(work, "ack-" + token)):
            if time.monotonic() > guard:
                sys.exit("the reader never answered " + token)
            time.sleep(0.001)

    publish, paused = publisher.ManifestPublisher._write, set()

    def publish_then_pause(self, results, listed):
        publish(self, results, listed)
        if round_number not in paused:  # the first manifest in progress of the round
            paused.add(round_number)
            pause(f"progress-{round_number}")

    publisher.ManifestPublisher._write = publish_then_pause

    def new_input(i):
        global version
        version += 1
        path = os.path.join(work, f"in{i}-v{version}.jsonl")
        with open(path, "w", encoding="utf-8") as f:  # an input is never changed: a new version is a new file
            for _ in range(int(rng.integers(300, 900))):
                text = "".join(rng.choice(list("abcdé xyz🙂"), int(rng.integers(1, 60))))
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\\n")
        return path

    inputs = [new_input(i) for i in range(4)]
    for round_number in range(rounds):
        corpus_build.build_corpus(inputs, out, BuildOptions(chunk_tokens=512, durable=False,
                                                            workers=1 + round_number % 2))
        pause(f"round-{round_number}")
        change = round_number % 3
        if change == 0:
            inputs[int(rng.integers(0, len(inputs)))] = new_input(0)  # a rebuilt shard
        elif change == 1:
            inputs.append(new_input(len(inputs)))  # a new shard, appended
        else:
            inputs = inputs[1:]  # every shard's content moves: all rebuilt; the last one removed
            inputs.append(new_input(len(inputs)))
    open(os.path.join(work, "done"), "w").close()
    """
)

ROUNDS = 8


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_reader_beside_a_process_that_appends_and_rebuilds_reads_the_stream_of_each_moment(tmp_path):
    """The writer pauses at points (once a round with a manifest in progress, and after each
    round) until the reader has read the corpus there; in between both run freely. What the test
    counts (manifests seen, reads of a build in progress, readers held across rebuilds) then does
    not depend on how the processes are scheduled."""
    work, out = tmp_path / "work", tmp_path / "corpus"
    work.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(work), str(out), str(ROUNDS)],
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE, text=True)
    cache: dict[str, np.ndarray] = {}

    def stream_of(manifest: corpus.Manifest) -> np.ndarray:
        pieces = []
        for shard in manifest.shards:
            source = shard.source["path"]
            if source not in cache:
                cache[source] = tokens_of(source)
            pieces.append(cache[source])
        return np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)

    def waiting() -> str | None:
        """The point the writer is paused at, if it is paused (the token of its ack)."""
        try:
            token = (work / "waiting").read_text()
        except FileNotFoundError:
            return None
        return None if (work / f"ack-{token}").exists() else token

    rng = np.random.default_rng(0)
    seen, in_progress, checks = set(), 0, 0
    readers: list[CorpusWindows] = []
    held: list[tuple[CorpusWindows, np.ndarray]] = []  # refreshed never: old views across rebuilds
    try:
        wait_until(lambda: (out / "shards.json").exists(), alive=writer, what="the first manifest")
        readers = [CorpusWindows(out / "shards.json", seq=16, stride=5, access=a) for a in ("mmap", "pread")]
        guard = time.monotonic() + HANG_GUARD_S
        while True:
            done = (work / "done").exists()
            paused = waiting()  # read before the refresh: the writer waits there until answered
            for windows in readers:
                windows.refresh()
                stream = stream_of(windows.manifest)
                seen.add(windows.manifest.to_bytes())
                in_progress += not windows.complete
                assert windows.total_tokens == len(stream)
                if len(windows):
                    idx = rng.integers(0, len(windows), 64)
                    got = windows.gather(idx)
                    want = expected_windows(stream, 16, 5, idx)
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])
                    checks += 1
            if (paused or "").startswith("round-") or done:
                snapshot = CorpusWindows(out / "shards.json", seq=16, stride=5, access="pread")
                held.append((snapshot, stream_of(snapshot.manifest)))
            for old, stream in held:  # each still reads the corpus it opened, whatever was rebuilt since
                if len(old):
                    idx = rng.integers(0, len(old), 16)
                    np.testing.assert_array_equal(old.gather(idx)[0], expected_windows(stream, 16, 5, idx)[0])
            if paused is not None:
                (work / f"ack-{paused}").write_text("")
            if done:
                break
            assert writer.poll() is None or (work / "done").exists(), writer.communicate()
            assert time.monotonic() < guard, "a hang"
        writer.wait(timeout=HANG_GUARD_S)
    finally:
        if writer.poll() is None:
            writer.kill()
        stderr = writer.communicate()[1]
        for windows in readers + [w for w, _ in held]:
            windows.close()
    assert writer.returncode == 0, stderr
    assert all(w.complete for w in readers)
    assert len(seen) >= ROUNDS and in_progress >= 2 * ROUNDS, (len(seen), in_progress)  # (two readers)
    assert len(held) == ROUNDS + 1
    print(f"{len(seen)} manifests seen, {in_progress} reads of a build in progress, {checks} batches checked, "
          f"{len(held)} readers held across rebuilds")


@pytest.mark.slow
@pytest.mark.subprocess
def test_pskd_corpus_verify_and_info_say_a_build_is_in_progress(tmp_path):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(i, 10)) for i in range(2)]
    out = tmp_path / "c"
    build_corpus(inputs, out, BuildOptions(durable=False))
    m = corpus.read_manifest(out / "shards.json")
    corpus.write_manifest(out / "shards.json", m.tokenizer, m.shards[:1], m.build, planned_shards=2)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda *a: subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", "corpus", *a, str(out)],  # noqa: E731
                                    capture_output=True, text=True, env=env, timeout=120)
    verify = run("verify")
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.splitlines()[1] == ("pskd: note: a build of this corpus is in progress or was interrupted: "
                                             "1 of 2 shards listed")
    info = run("info")
    assert info.returncode == 0 and "building   1 of 2 shards listed" in info.stdout
