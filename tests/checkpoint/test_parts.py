"""The parts index of a checkpoint several processes saved to a bucket: read through it, a
checkpoint is the file its parts hold, whatever way the bytes are cut among the parts; an index
whose parts miss a byte, hold one twice or point past a part's end is refused (E9002)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.storage import resolve
from tests.helpers import raises

from .helpers import split_into_parts


@pytest.mark.parametrize("seed", range(4))
def test_a_checkpoint_read_through_its_parts_is_the_file(seed):
    rng = np.random.default_rng(seed)
    url = f"memory://parts-{seed}/ckpt.psk.d"
    tree = {"a": rng.standard_normal((50, 7)).astype(np.float32), "b": rng.integers(0, 9, 33).astype(np.int8),
            "c": rng.standard_normal(5)}
    digests = ck.save(url, tree, ck.SaveOptions(digest="xxh3_128")).digests
    size = len(resolve(url)[0].get(resolve(url)[1].key)[0])
    cuts = sorted(rng.choice(np.arange(1, size), size=12, replace=False).tolist())
    split_into_parts(url, cuts, rng.integers(0, 3, len(cuts) + 1).tolist(), 3)
    back = ck.restore(url, tree, digests=digests)
    for key in tree:
        assert np.asarray(back[key]).tobytes() == tree[key].tobytes()
    part = ck.restore(url, {"b": tree["b"]}, partial=True)
    assert part["b"].tolist() == tree["b"].tolist()
    ck.verify_file(url, digests)


@pytest.mark.parametrize("extents, why", [
    ([[0, 10, 0], [12, 8, 10]], "a gap"),
    ([[0, 12, 0], [10, 10, 12]], "an overlap"),
    ([[0, 10, 0], [10, 10, 15]], "past the part's end"),
    ([[0, 30, 0]], "past the file's end"),
])
def test_a_parts_index_that_does_not_tile_the_file_is_refused(extents, why):
    url = "memory://bad-parts/ckpt.psk.d"
    store, where = resolve(url)
    store.put(where.key + ".p0", bytes(20))
    raw = json.dumps({"format": "pskd-parts", "version": 1, "bytes": 20,
                      "parts": [{"key": where.key + ".p0", "bytes": 20, "extents": extents}]}).encode()
    store.put(where.key, raw)
    with raises("E9002", url):
        ck.restore(url, {"w": np.zeros(3)})


@pytest.mark.parametrize("part_bytes, extents", [
    (2**63, [[0, 20, 0]]),  # a part's size past int64 (was OverflowError)
    (10**90, [[0, 20, 0]]),
    (20, [[0, 20, 2**63 - 10]]),  # a piece past the part's end by a sum that wraps in int64 (was accepted)
])
def test_a_parts_index_of_sizes_past_int64_is_refused(part_bytes, extents):
    # (found by fuzz/targets.py's parts_index target)
    url = "memory://huge-parts/ckpt.psk.d"
    store, where = resolve(url)
    store.put(where.key + ".p0", bytes(20))
    raw = json.dumps({"format": "pskd-parts", "version": 1, "bytes": 20,
                      "parts": [{"key": where.key + ".p0", "bytes": part_bytes, "extents": extents}]}).encode()
    store.put(where.key, raw)
    with raises("E9002", url):
        ck.restore(url, {"w": np.zeros(3)})
