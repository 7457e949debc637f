"""Digests (pskd_jax._os.digests): the known digests of known bytes, as ``xxhsum -H2`` and
``sha256sum`` print them, whatever the block size or however a stream is cut into pieces."""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
import pytest

from pskd_jax._os import digests
from tests.helpers import raises

LONG = bytes(range(256)) * 1000
KNOWN = {  # bytes → (xxh3_128, sha256)
    b"": ("99aa06d3014798d86001c324468d497f",
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    b"abc": ("06b05ab6733a618578af5f94892f3950",
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    LONG: ("548512d98989de2d776474c39d20f9aa",
           "b57b64b198d5d59ce5a22a9b9f25e72a7d081476d432051aa923f3dbebb90934"),
}


@pytest.mark.parametrize("data", list(KNOWN), ids=["empty", "abc", "256000 bytes"])
def test_known_digests_of_known_files(tmp_path, data):
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    xxh3, sha256 = KNOWN[data]
    assert digests.file_digest(path) == digests.file_digest(path, "xxh3_128") == xxh3
    assert digests.file_digest(path, "sha256") == digests.file_sha256(path) == sha256
    for block in (1, 7, 4096, 1 << 20) if len(data) < 1000 else (4093, 1 << 20):
        assert digests.hash_file(path, digests.DIGESTS["sha256"](), block=block) == sha256
        assert digests.hash_file(str(path), digests.DIGESTS["xxh3_128"](), block=block) == xxh3


def test_the_algorithms_and_their_names():
    assert sorted(digests.DIGESTS) == ["sha256", "xxh3_128"]
    assert digests.check_algorithm("sha256", "x") == "sha256"
    for wrong in ("md5", "SHA256", "xxh3", None, 1):
        error = raises("E9012", digests.check_algorithm, wrong, "the checkpoint")
        assert error.message.startswith("the checkpoint: no digest ") and "['sha256', 'xxh3_128']" in error.message


def test_files_that_cannot_be_hashed_are_named(tmp_path):
    missing = tmp_path / "missing.psk.d"
    assert str(missing) in raises("E9003", digests.file_digest, missing).message
    raises("E9012", digests.file_digest, missing, "md5")  # the algorithm is checked first
    raises("E9002", digests.file_sha256, tmp_path)  # a directory
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    raises("E9002", digests.file_digest, fifo)  # refused, not waited on


@pytest.mark.parametrize("algorithm", sorted(digests.DIGESTS))
def test_a_hasher_digests_a_stream_cut_anywhere(algorithm):
    want = KNOWN[LONG][0 if algorithm == "xxh3_128" else 1]
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.integers(0, len(LONG), 30))
    pieces = [LONG[a:b] for a, b in zip([0, *cuts], [*cuts, len(LONG)])]
    hasher = digests.Hasher(algorithm)
    for i, piece in enumerate(pieces):  # bytes, buffers and arrays alike
        hasher.feed(piece if i % 3 == 0 else memoryview(piece) if i % 3 == 1 else np.frombuffer(piece, np.uint8))
    assert hasher.hexdigest() == want
    empty = digests.Hasher(algorithm)
    assert empty.hexdigest() == KNOWN[b""][0 if algorithm == "xxh3_128" else 1]


def test_a_hasher_fed_wider_arrays_hashes_their_bytes():
    values = np.arange(1000, dtype="<f8").reshape(10, 100)
    hasher = digests.Hasher("sha256")
    hasher.feed(values)
    assert hasher.hexdigest() == hashlib.sha256(values.tobytes()).hexdigest()


def test_an_abandoned_hasher_leaves_no_thread():
    hasher = digests.Hasher("xxh3_128")
    hasher.feed(b"partial")
    hasher.abandon()
    assert not [t for t in threading.enumerate() if t.name == "pskd-xxh3_128" and t.is_alive()]
