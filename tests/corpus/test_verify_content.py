"""Verification reads each shard once and checks, beside its sha256, what a hash recorded after
the damage would pass: every token below the vocabulary size, boundary tokens equal to the
recorded documents, a version 1 header; and it refuses non-regular files at once."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import struct
import threading

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError
from pskd_jax.format import write

B = 256


def shard_file(path: pathlib.Path, tokens, tokenizer: Tokenizer = Tokenizer.bytes()) -> Shard:
    """A shard holding ``tokens``, and its honest entry (documents = its boundary tokens)."""
    w = ShardWriter(str(path), tokenizer, durable=False)
    w.append(np.asarray(tokens, tokenizer.dtype))
    w.close()
    tokens = np.asarray(tokens)
    return Shard(path.name, len(tokens), int(np.count_nonzero(tokens == tokenizer.boundary)),
                 hashlib.sha256(path.read_bytes()).hexdigest())


def corpus_of(d: pathlib.Path, pieces, tokenizer: Tokenizer = Tokenizer.bytes()) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    shards = [shard_file(d / f"s{i}.psk.d", p, tokenizer) for i, p in enumerate(pieces)]
    return pathlib.Path(corpus.write_manifest(d / "shards.json", tokenizer, shards).path)


def rewrite(manifest: pathlib.Path, index: int, **changes) -> None:
    """Records the shard's present sha256 (as a manifest written after the damage would), and
    ``changes`` to its entry."""
    m = corpus.read_manifest(manifest)
    shards = list(m.shards)
    path = manifest.parent / shards[index].path
    fields = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), **changes}
    shards[index] = Shard(**{**shards[index].__dict__, **fields})
    corpus.write_manifest(manifest, m.tokenizer, shards, m.build)


def expect_verify(manifest: pathlib.Path, pattern: str) -> None:
    for workers in (1, 3):
        with pytest.raises(PskdError, match=pattern):
            corpus.verify_corpus(manifest, workers=workers)


def test_a_token_at_or_above_the_vocabulary_with_its_sha256_recorded_after_the_damage(tmp_path):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B, 4, 5, B]])
    corpus.verify_corpus(m)
    shard = tmp_path / "c" / "s1.psk.d"
    data = bytearray(shard.read_bytes())
    data[-4:-2] = struct.pack("<H", 300)  # token 3 (5) becomes 300 >= 257
    shard.write_bytes(bytes(data))
    rewrite(m, 1)
    expect_verify(m, r"E9017: .*shard 1 s1.psk.d: token 3 is 300, not below the vocabulary size 257")
    with pytest.raises(PskdError, match=r"E9017: .*shard 1 s1.psk.d: token 3 is 300"):
        CorpusWindows(m, seq=2, verify=True)
    # Opened unverified (a caller's cheaper checks first), then verified: the same refusal.
    windows = CorpusWindows(m, seq=2)
    with pytest.raises(PskdError, match=r"E9017: .*shard 1 s1.psk.d: token 3 is 300"):
        windows.verify_shards()
    windows.close()
    with pytest.raises(PskdError, match="closed"):
        windows.verify_shards()
    clean = corpus_of(tmp_path / "clean", [[1, 2, B], [3, B, 4, 5, B]])
    with CorpusWindows(clean, seq=2) as windows:
        windows.verify_shards()


def test_documents_that_disagree_with_the_boundary_tokens(tmp_path):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B, 4, 5, B]])
    rewrite(m, 1, documents=1)
    expect_verify(m, r"E9017: .*shard 1 s1.psk.d: 2 boundary tokens \(256\), but the manifest records 1 document,")
    rewrite(m, 1, documents=2)
    corpus.verify_corpus(m)
    # A token turned into a boundary (or a boundary into a token), the hash recorded after it.
    shard = tmp_path / "c" / "s0.psk.d"
    data = bytearray(shard.read_bytes())
    data[-6:-4] = struct.pack("<H", B)
    shard.write_bytes(bytes(data))
    rewrite(m, 0)
    expect_verify(m, r"E9017: .*shard 0 s0.psk.d: 2 boundary tokens \(256\), but the manifest records 1 document,")


def test_a_small_vocabulary_in_u8(tmp_path):
    t = Tokenizer.chars(["a", "b"])  # V = 3 in u8: 253 stored values are out of range
    m = corpus_of(tmp_path / "c", [[0, 1, 2], [1, 2]], t)
    corpus.verify_corpus(m)
    shard = tmp_path / "c" / "s1.psk.d"
    data = bytearray(shard.read_bytes())
    data[-2] = 200
    shard.write_bytes(bytes(data))
    rewrite(m, 1)
    expect_verify(m, r"E9017: .*shard 1 s1.psk.d: token 0 is 200, not below the vocabulary size 3")


def as_version_2(shard: pathlib.Path, tokenizer: Tokenizer, encodings: bytes = b"\x00") -> None:
    """Rewrites a shard's version 1 header as version 2, listing ``encodings`` (one byte a leaf)."""
    raw = shard.read_bytes()
    header = len(tokenizer.header(0))
    shard.write_bytes(raw[:4] + struct.pack("<H", 2) + raw[6:header] + struct.pack("<I", len(encodings))
                      + encodings + raw[header:])


def test_a_version_2_header_is_read_by_verify_and_windows(tmp_path):
    """A version 2 header whose one idx leaf carries encoding byte 0 is a shard like any: every
    reader reads both versions. Its tokens start five bytes later, so with the bytes tokenizer's
    u16 tokens the shards' tokens are not aligned alike in their maps, which the windows serve."""
    tokenizer = Tokenizer.bytes()
    pieces = [[1, 2, B, 7, 8, 9, B], [3, B, 4, 5, 6, B], [10, 11, B]]
    plain = corpus_of(tmp_path / "plain", pieces)
    m = corpus_of(tmp_path / "c", pieces)
    as_version_2(tmp_path / "c" / "s1.psk.d", tokenizer)
    rewrite(m, 1)
    for workers in (1, 3):
        corpus.verify_corpus(m, workers=workers)
    for access in ("mmap", "pread"):
        with CorpusWindows(m, seq=3, stride=1, access=access) as windows, \
                CorpusWindows(plain, seq=3, stride=1) as expected:
            everything = np.arange(len(expected))
            for got, want in zip(windows.gather(everything), expected.gather(everything)):
                np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(windows.stream(0, windows.total_tokens),
                                          expected.stream(0, expected.total_tokens))


@pytest.mark.parametrize(("encodings", "words"), [(b"\x01", "1 leaf encodings (f32)"),
                                                   (b"\x00\x00", "2 leaf encodings (f64 f64)"),
                                                   (b"", "0 leaf encodings (none)")])
def test_a_version_2_header_of_other_leaves_is_refused(tmp_path, encodings, words):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B]])
    as_version_2(tmp_path / "c" / "s1.psk.d", Tokenizer.bytes(), encodings)
    rewrite(m, 1)
    pattern = rf"E9017: .*shard 1 s1.psk.d: a version 2 header listing {re.escape(words)}"
    expect_verify(m, pattern)
    for access in ("mmap", "pread"):
        with pytest.raises(PskdError, match=pattern):
            CorpusWindows(m, seq=2, access=access)


def test_a_shard_of_another_width_in_one_manifest(tmp_path):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B]])
    shard = tmp_path / "c" / "s1.psk.d"
    write(shard, "idx[70000][]", np.array([3, 256], np.uint32))  # u32 tokens where the manifest's are u16
    rewrite(m, 1)
    expect_verify(m, r"E9017: .*shard 1 s1.psk.d: type 'idx\[70000\]\[\]', expected 'idx\[257\]\[\]'")
    with pytest.raises(PskdError, match=r"E9017: .*shard 1 s1.psk.d: type 'idx\[70000\]\[\]'"):
        CorpusWindows(m, seq=2)


def run_briefly(action, seconds: float = 60.0):
    """Runs ``action`` on a thread; fails the test if it has not returned in time (it blocked)."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = action()
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.parametrize("kind,what", [("fifo", r"a named pipe \(FIFO\), not a regular file"),
                                       ("directory", "a directory, not a regular file"),
                                       ("link-to-fifo", r"a named pipe \(FIFO\), not a regular file"),
                                       ("dangling", "missing"),
                                       ("loop", "missing")])
def test_a_shard_that_is_not_a_regular_file_is_e9017_at_once(tmp_path, kind, what):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B]])
    shard = tmp_path / "c" / "s1.psk.d"
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    elif kind == "directory":
        shard.mkdir()
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "c" / "pipe")
        os.symlink("pipe", shard)
    elif kind == "dangling":
        os.symlink("nothing-here", shard)
    else:
        os.symlink("s1.psk.d", shard)
    pattern = rf"E9017: .*shard 1 s1.psk.d: {what}"
    for action in (lambda: corpus.verify_corpus(m, workers=1), lambda: corpus.verify_corpus(m, workers=2),
                   lambda: CorpusWindows(m, seq=2), lambda: CorpusWindows(m, seq=2, access="pread")):
        with pytest.raises(PskdError, match=pattern):
            run_briefly(action)


def test_a_shard_through_a_symlink(tmp_path):
    m = corpus_of(tmp_path / "c", [[1, 2, B], [3, B]])
    (tmp_path / "c" / "sub").mkdir()
    os.replace(tmp_path / "c" / "s1.psk.d", tmp_path / "c" / "sub" / "real.psk.d")
    os.symlink("sub/real.psk.d", tmp_path / "c" / "s1.psk.d")  # inside the directory: followed
    corpus.verify_corpus(m)
    with CorpusWindows(m, seq=2) as w:
        np.testing.assert_array_equal(w.stream(0, 5), [1, 2, B, 3, B])
    os.unlink(tmp_path / "c" / "s1.psk.d")
    os.replace(tmp_path / "c" / "sub" / "real.psk.d", tmp_path / "outside.psk.d")
    os.symlink(tmp_path / "outside.psk.d", tmp_path / "c" / "s1.psk.d")  # out of the directory: refused
    for action in (lambda: corpus.verify_corpus(m), lambda: CorpusWindows(m, seq=2)):
        with pytest.raises(PskdError, match="E9016: .*s1.psk.d.*outside the manifest's directory"):
            action()


def test_a_manifest_in_progress_verifies_and_says_so(tmp_path):
    d = tmp_path / "c"
    m = corpus_of(d, [[1, 2, B]])
    manifest = corpus.read_manifest(m)
    corpus.write_manifest(m, manifest.tokenizer, manifest.shards, manifest.build, planned_shards=4)
    result = corpus.verify_corpus(m)
    assert not result.manifest.complete and result.manifest.planned_shards == 4
    text = m.read_text()
    assert '"in_progress": {"planned_shards": 4}' in text
    for bad, what in (('{"planned_shards": 0}', "plans 0 shards but 1 are listed"),
                      ('{"planned": 4}', "must be an object of 'planned_shards'"),
                      ('{"planned_shards": true}', "'planned_shards' must be an integer")):
        m.write_text(text.replace('{"planned_shards": 4}', bad))
        with pytest.raises(PskdError, match=f"E9016: .*'in_progress'.*{what}|E9016: .*{what}"):
            corpus.read_manifest(m)


def test_merge_compares_files_not_paths(tmp_path):
    a = corpus_of(tmp_path / "all" / "a", [[1, 2, B]])
    b = corpus_of(tmp_path / "all" / "b", [[3, B]])
    os.unlink(tmp_path / "all" / "b" / "s0.psk.d")
    os.link(tmp_path / "all" / "a" / "s0.psk.d", tmp_path / "all" / "b" / "s0.psk.d")  # one file, two names
    rewrite(b, 0, tokens=3, documents=1)
    with pytest.raises(PskdError, match=r"E9016: .*b/shards.json: shard 0 s0.psk.d is .*b/s0.psk.d, which "
                                        r".*a/shards.json lists already \(the same file"):
        corpus.merge_manifests([a, b], tmp_path / "all" / "shards.json")
    assert not (tmp_path / "all" / "shards.json").exists()
    os.unlink(tmp_path / "all" / "b" / "s0.psk.d")
    shard_file(tmp_path / "all" / "b" / "s0.psk.d", [1, 2, B])  # the same bytes, another file: fine
    merged = corpus.merge_manifests([a, b], tmp_path / "all" / "shards.json")
    assert [s.path for s in merged.shards] == ["a/s0.psk.d", "b/s0.psk.d"]
