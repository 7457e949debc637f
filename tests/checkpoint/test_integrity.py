"""Digests of checkpoints (pskd_jax.checkpoint.integrity): sha256 and xxh3_128 of the whole file,
checked while restoring; a flipped byte anywhere fails a verified restore."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import xxhash

from pskd_jax import checkpoint as ck
from pskd_jax._os.digests import file_digest, file_sha256
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint import SaveOptions, restoring
from pskd_jax.errors import PskdError
from pskd_jax.format.reader import Reader

from .helpers import BF16, bits, random_finite


def test_sha256_checked_while_restoring(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (256, 64))}
    result = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(digest="sha256"))
    assert result.digests["sha256"] == hashlib.sha256((tmp_path / "c.psk.d").read_bytes()).hexdigest()
    assert list(result.digests) == ["sha256"]
    assert file_sha256(tmp_path / "c.psk.d") == result.digests["sha256"]
    ck.restore(tmp_path / "c.psk.d", tree, digests={"sha256": result.digests["sha256"]})
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-1000] ^= 0x01  # one flipped bit in the weights
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    for options in ({}, {"zero_copy": True}):
        with pytest.raises(PskdError) as e:
            ck.restore(tmp_path / "c.psk.d", tree, **options, digests={"sha256": result.digests["sha256"]})
        assert e.value.code == "E9013" and "c.psk.d" in e.value.message and "sha256" in e.value.message
    # unverified, the damage goes unnoticed, as with any format without a digest
    ck.restore(tmp_path / "c.psk.d", tree)


def test_xxh3_128_is_the_digest_of_the_whole_file(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (64, 33)), "step": np.int32(3)}
    result = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(digest="xxh3_128"))
    content = (tmp_path / "c.psk.d").read_bytes()
    assert ck.CHECKPOINT_DIGEST == "xxh3_128"
    assert result.digests["xxh3_128"] == xxhash.xxh3_128(content).hexdigest() == file_digest(tmp_path / "c.psk.d")
    assert len(result.digests["xxh3_128"]) == 32  # as `xxhsum -H2` prints it
    assert list(result.digests) == ["xxh3_128"]
    assert file_digest(tmp_path / "c.psk.d", "sha256") == hashlib.sha256(content).hexdigest()
    assert ck.verify_file(tmp_path / "c.psk.d", {"xxh3_128": result.digests["xxh3_128"].upper()}) == "xxh3_128"
    assert ck.verify_file(tmp_path / "c.psk.d", {"sha256": hashlib.sha256(content).hexdigest()}) == "sha256"
    with pytest.raises(PskdError) as e:
        ck.verify_file(tmp_path / "c.psk.d", {"xxh3_128": "0" * 32})
    assert e.value.code == "E9013" and "c.psk.d" in e.value.message and "xxh3_128" in e.value.message
    with pytest.raises(PskdError, match="E9012"):
        ck.verify_file(tmp_path / "c.psk.d", {})  # nothing to check against
    with pytest.raises(PskdError, match="E9012.*md5"):
        ck.save(tmp_path / "d.psk.d", tree, SaveOptions(digest="md5"))
    with pytest.raises(PskdError, match="E9003"):
        file_digest(tmp_path / "missing.psk.d")


def test_both_digests_are_checked_when_both_are_given(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (16, 8))}
    xxh = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(digest="xxh3_128")).digests["xxh3_128"]
    sha = file_sha256(tmp_path / "c.psk.d")
    back = ck.restore(tmp_path / "c.psk.d", tree, digests={"xxh3_128": xxh, "sha256": sha})
    np.testing.assert_array_equal(bits(back["w"]), bits(tree["w"]))
    with pytest.raises(PskdError, match="E9013.*sha256"):
        ck.restore(tmp_path / "c.psk.d", tree, digests={"xxh3_128": xxh, "sha256": "0" * 64})
    with pytest.raises(PskdError, match="E9013.*xxh3_128"):
        ck.restore(tmp_path / "c.psk.d", tree, digests={"xxh3_128": "0" * 32, "sha256": sha})


@pytest.mark.parametrize("threaded", [False, True])
def test_a_flipped_byte_anywhere_fails_a_verified_restore(tmp_path, monkeypatch, rng, threaded):
    if threaded:  # pieces read on two threads, smaller than a leaf and not aligned to one
        monkeypatch.setattr(restoring, "PARALLEL_READ_BYTES", 1)
        monkeypatch.setattr(restoring, "HASH_PIECE", 40)
    tree = {"a": random_finite(rng, BF16, (7, 9)), "b": random_finite(rng, np.float32, (5,)),
            "c": np.arange(6, dtype=np.int32), "d": random_finite(rng, np.float64, (3, 2))}
    path = tmp_path / "c.psk.d"
    digest = ck.save(path, tree, SaveOptions(digest="xxh3_128")).digests["xxh3_128"]
    back = ck.restore(path, tree, digests={"xxh3_128": digest})
    for key in tree:
        np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))
    good = path.read_bytes()
    with Reader(path, layout=ck.read_layout_file(layout_path_for(path)).layout) as reader:
        data_offset = reader.header.data_offset
        assert len(good) == data_offset + reader.placement.sample_bytes  # every byte is header or data
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(PskdError) as e:
            ck.restore(path, tree, digests={"xxh3_128": digest})
        if position >= data_offset:  # a data byte: the digest catches it, naming the file
            assert e.value.code == "E9013" and str(path) in e.value.message, (position, e.value)
    path.write_bytes(good + b"\0")  # a byte more at the end
    with pytest.raises(PskdError):
        ck.restore(path, tree, digests={"xxh3_128": digest})


def test_digests_are_a_map_of_algorithm_to_hex(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (8,))}
    path = tmp_path / "c.psk.d"
    result = ck.save(path, tree, SaveOptions(digest="xxh3_128"))
    upper = {"xxh3_128": result.digests["xxh3_128"].upper()}
    np.testing.assert_array_equal(bits(ck.restore(path, tree, digests=upper)["w"]), bits(tree["w"]))
    for bad, fragment in (("0" * 32, "digests='"), (["xxh3_128"], "digests=["), ({"md5": "00"}, "md5"),
                          ({"xxh3_128": 3}, "hex string")):
        for attempt in (lambda: ck.restore(path, tree, digests=bad), lambda: ck.verify_file(path, bad)):
            with pytest.raises(PskdError) as e:
                attempt()
            assert e.value.code == "E9012" and str(path) in e.value.message and fragment in e.value.message
    assert ck.restore(path, tree, digests={})["w"].shape == (8,)  # an empty map checks nothing
