"""shuffle_order keeps the permutation of (n, seed, epoch): a call per batch derives no keys."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pskd_jax
from pskd_jax.errors import PskdError
from pskd_jax.pipeline import shuffle


@pytest.fixture
def counted_keys(monkeypatch):
    """Counts the round-key derivations (the ChaCha20 block) made from here on."""
    calls = []
    original = shuffle.round_keys

    def counting(seed, epoch):
        calls.append((seed, epoch))
        return original(seed, epoch)

    monkeypatch.setattr(shuffle, "round_keys", counting)
    shuffle._held.cache_clear()
    yield calls
    shuffle._held.cache_clear()


def test_a_call_per_batch_derives_the_keys_once(counted_keys):
    n, batch = 2**40, 64
    pieces = [pskd_jax.shuffle_order(n, seed=7, epoch=3, start=j * batch, stop=(j + 1) * batch) for j in range(50)]
    assert counted_keys == [(7, 3)]
    held = shuffle.Permutation(n, seed=7, epoch=3)
    assert np.array_equal(np.concatenate(pieces), held.order(0, 50 * batch))


def test_numpy_integers_and_ints_share_one_permutation(counted_keys):
    a = pskd_jax.shuffle_order(np.int64(1000), seed=np.uint64(5), epoch=np.int32(2), stop=10)
    b = pskd_jax.shuffle_order(1000, seed=5, epoch=2, stop=10)
    assert np.array_equal(a, b) and len(counted_keys) == 1


def test_each_epoch_seed_and_size_has_its_own_permutation(counted_keys):
    orders = {key: pskd_jax.shuffle_order(key[0], seed=key[1], epoch=key[2]).tolist()
              for key in [(100, 1, 1), (100, 1, 2), (100, 2, 1), (101, 1, 1)]}
    assert len(counted_keys) == 4
    for (n, seed, epoch), order in orders.items():
        assert order == shuffle.Permutation(n, seed=seed, epoch=epoch).order().tolist()
    assert len({tuple(o) for o in orders.values()}) == 4


def test_the_kept_permutations_are_bounded(counted_keys):
    for epoch in range(1, 3 * shuffle.HELD_PERMUTATIONS):
        pskd_jax.shuffle_order(50, seed=0, epoch=epoch, stop=1)
    assert shuffle._held.cache_info().currsize == shuffle.HELD_PERMUTATIONS
    pskd_jax.shuffle_order(50, seed=0, epoch=1, stop=1)  # long evicted: derived again, same numbers
    assert counted_keys.count((0, 1)) == 2


def test_the_pipeline_shares_the_kept_permutation(counted_keys):
    pipeline = pskd_jax.Pipeline("x", seed=11, batch_size=8)
    for j in range(5):
        assert np.array_equal(pipeline.batch_indices(1000, 2, j),
                              pskd_jax.shuffle_order(1000, seed=11, epoch=2, start=8 * j, stop=8 * j + 8))
    assert counted_keys == [(11, 2)]


def test_bad_arguments_are_refused_before_anything_is_kept(counted_keys):
    for kwargs in ({"n": 0, "seed": 0, "epoch": 1}, {"n": 10, "seed": -1, "epoch": 1},
                   {"n": 10, "seed": 0, "epoch": 0}, {"n": 10, "seed": 0, "epoch": 1, "stop": 11}):
        with pytest.raises(PskdError, match="E9004"):
            pskd_jax.shuffle_order(**kwargs)
    assert shuffle._held.cache_info().currsize <= 1  # only the valid (10, 0, 1) of the last call


def test_threads_asking_at_once_get_the_same_numbers():
    n = 2**38 + 1  # walks of every length: the kept permutation's caches grow while shared
    want = shuffle.Permutation(n, seed=3, epoch=1).order(0, 4096)
    got: dict[int, np.ndarray] = {}

    def work(k: int) -> None:
        got[k] = np.concatenate([pskd_jax.shuffle_order(n, seed=3, epoch=1, start=s, stop=s + 256)
                                 for s in range(0, 4096, 256)])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(order, want) for order in got.values()) and len(got) == 4
