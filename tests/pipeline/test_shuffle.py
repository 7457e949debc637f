"""The epoch shuffle: ChaCha20, the pinned orders of docs/pipeline.md, and every evaluation against the
scalar reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError
from pskd_jax.pipeline import shuffle
from pskd_jax.pipeline.shuffle import Permutation, chacha20_block, permute_together, round_keys, shuffle_order
from tests.helpers import run_python

# RFC 8439 §2.3.2: key 00..1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00, block counter 1.
RFC_KEY = bytes(range(32))
RFC_NONCE = bytes.fromhex("000000090000004a00000000")
RFC_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4"
    "c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2"
    "b5129cd1de164eb9cbd083e8a2503c4e"
)

PINNED_VECTORS = [
    (0, 1, 10, [2, 4, 5, 6, 8, 7, 0, 9, 1, 3]),
    (0, 2, 10, [9, 1, 3, 6, 8, 0, 7, 2, 5, 4]),
    (42, 1, 1000, [156, 421, 538, 754, 810, 994, 786, 322, 107, 873, 747, 539, 559, 344, 304, 976]),
    (7, 3, 2, [1, 0]),
]

# Sizes that exercise every evaluation: tables (h <= 16), lanes of 64 and of 128 bits, a domain of
# 4n (the longest walks), n a power of four (no walk at all), and n beyond 2**63 (uint64 results).
BIG_N = [2**40, 2**38 + 1, 2**32 + 3, 2**62 + 1, 2**63, 2**63 + 5, 2**64 - 1, 2**64, 10**8, 65537]


def test_chacha20_block_matches_rfc_8439_section_2_3_2():
    assert chacha20_block(RFC_KEY, 1, RFC_NONCE) == RFC_BLOCK


def test_chacha20_block_rejects_wrong_sizes():
    with pytest.raises(ValueError):
        chacha20_block(bytes(31), 0, bytes(12))
    with pytest.raises(ValueError):
        chacha20_block(bytes(32), 2**32, bytes(12))


def test_round_keys_are_the_first_eight_words_of_the_keyed_block():
    key = (5).to_bytes(8, "little") + (3).to_bytes(8, "little") + b"pskd.shuffle.v1\0"
    block = chacha20_block(key, 0, bytes(12))
    assert round_keys(5, 3) == tuple(int.from_bytes(block[4 * i : 4 * i + 4], "little") for i in range(8))


@pytest.mark.parametrize("seed, epoch, n, expected", PINNED_VECTORS)
def test_spec_vectors(seed, epoch, n, expected):
    order = shuffle_order(n, seed=seed, epoch=epoch)
    assert order[: len(expected)].tolist() == expected
    permutation = Permutation(n, seed=seed, epoch=epoch)
    assert [permutation.at(p) for p in range(len(expected))] == expected


def test_a_single_sample_is_order_zero():
    assert shuffle_order(1, seed=9, epoch=4).tolist() == [0]
    assert Permutation(1, seed=9, epoch=4).at(0) == 0


@pytest.mark.parametrize("seed", [0, 1, 42, 2**64 - 1])
def test_every_n_up_to_300_gives_a_permutation(seed):
    for n in range(1, 301):
        order = shuffle_order(n, seed=seed, epoch=1)
        assert order.dtype == np.int64
        assert np.array_equal(np.sort(order), np.arange(n)), n


def test_whole_order_agrees_with_the_scalar_reference():
    permutation = Permutation(777, seed=11, epoch=2)
    assert permutation.order().tolist() == [permutation.at(p) for p in range(777)]


@pytest.mark.parametrize("n", BIG_N)
def test_vectorised_equals_scalar_reference_on_random_positions(n):
    rng = np.random.default_rng(n % 1000)
    positions = rng.integers(0, min(n, 2**63), size=600, dtype=np.int64).astype(np.uint64)
    positions[:3] = [0, n - 1, n // 2]
    expected = [Permutation(n, seed=3, epoch=7).at(int(p)) for p in positions]
    small = Permutation(n, seed=3, epoch=7)  # batches small enough for the lanes
    assert [int(v) for v in np.concatenate([small(positions[:256]), small(positions[256:])])] == expected
    large = Permutation(n, seed=3, epoch=7)
    large_positions = np.repeat(positions, 3)  # one call above the lane limit: numpy rounds or tables
    assert [int(v) for v in large(large_positions)[::3]] == expected


def test_tables_agree_with_the_other_evaluations():
    n = 10**6 + 3
    cold, warm = Permutation(n, seed=1, epoch=1), Permutation(n, seed=1, epoch=1)
    warm.order()  # a million positions: the round tables are built
    assert cold._tables is None and warm._tables is not None
    positions = np.random.default_rng(0).integers(0, n, size=200)
    assert np.array_equal(cold(positions), warm(positions))


def test_result_dtype_is_int64_up_to_2_pow_63_and_uint64_beyond():
    assert Permutation(2**63, seed=0, epoch=1)(np.array([5])).dtype == np.int64
    assert Permutation(2**63 + 1, seed=0, epoch=1)(np.array([5])).dtype == np.uint64


def test_call_keeps_the_shape_and_accepts_any_integer_dtype():
    permutation = Permutation(1000, seed=42, epoch=1)
    for dtype in (np.int8, np.uint16, np.int32, np.uint64):
        got = permutation(np.array([[0, 1], [2, 3]], dtype=dtype))
        assert got.shape == (2, 2) and got.ravel().tolist() == [156, 421, 538, 754]
    assert permutation([]).shape == (0,)


def test_epochs_and_seeds_give_different_orders():
    n = 10_000
    first = shuffle_order(n, seed=5, epoch=1)
    assert not np.array_equal(first, shuffle_order(n, seed=5, epoch=2))
    assert not np.array_equal(first, shuffle_order(n, seed=6, epoch=1))
    assert np.array_equal(first, shuffle_order(n, seed=5, epoch=1))


@pytest.mark.parametrize("n", [1, 2, 10, 1000, 70_000, 2**38 + 1])
def test_slices_agree_with_the_whole_order(n):
    whole = shuffle_order(min(n, 5000), seed=8, epoch=3)
    for start, stop in [(0, 0), (0, 1), (3, 7), (min(n, 5000) - 1, min(n, 5000))]:
        if stop <= min(n, 5000) and start <= stop:
            got = shuffle_order(min(n, 5000), seed=8, epoch=3, start=start, stop=stop)
            assert np.array_equal(got, whole[start:stop])
    if n > 5000:  # far positions: a slice equals the scalar reference
        permutation = Permutation(n, seed=8, epoch=3)
        got = shuffle_order(n, seed=8, epoch=3, start=n - 40, stop=n)
        assert got.tolist() == [permutation.at(p) for p in range(n - 40, n)]


def test_slices_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(shuffle, "CHUNK", 64)  # many chunks, some walks above the lane limit
    monkeypatch.setattr(shuffle, "LANE_LIMIT", 8)
    n = 3001
    expected = [Permutation(n, seed=2, epoch=2).at(p) for p in range(n)]
    assert shuffle_order(n, seed=2, epoch=2).tolist() == expected
    assert shuffle_order(n, seed=2, epoch=2, start=100, stop=2000).tolist() == expected[100:2000]


def test_slices_beyond_2_pow_63():
    n = 2**64 - 1
    permutation = Permutation(n, seed=1, epoch=1)
    got = shuffle_order(n, seed=1, epoch=1, start=n - 5, stop=n)
    assert got.dtype == np.uint64
    assert [int(v) for v in got] == [permutation.at(p) for p in range(n - 5, n)]


@pytest.mark.subprocess
def test_the_same_order_in_a_fresh_process():
    code = (
        "from pskd_jax.pipeline import shuffle_order;"
        "print(' '.join(map(str, shuffle_order(5000, seed=1234, epoch=9).tolist())))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    here = shuffle_order(5000, seed=1234, epoch=9).tolist()
    assert [int(v) for v in result.stdout.split()] == here


@given(n=st.integers(1, 5000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(1, 2**64 - 1))
@settings(max_examples=60, deadline=None)
def test_property_every_order_is_a_permutation(n, seed, epoch):
    order = shuffle_order(n, seed=seed, epoch=epoch)
    assert sorted(order.tolist()) == list(range(n))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(n=10, seed=-1, epoch=1), "seed must be an integer in [0, 2**64), got seed=-1"),
        (dict(n=10, seed=2**64, epoch=1), "seed must be an integer in [0, 2**64)"),
        (dict(n=10, seed=1.5, epoch=1), "seed must be an integer"),
        (dict(n=10, seed=True, epoch=1), "seed must be an integer"),
        (dict(n=10, seed=0, epoch=0), "epoch must be an integer in [1, 2**64) (epochs count from 1), got epoch=0"),
        (dict(n=0, seed=0, epoch=1), "n must be an integer in [1, 2**64]"),
        (dict(n=2**64 + 1, seed=0, epoch=1), "n must be an integer in [1, 2**64]"),
        (dict(n=10, seed=0, epoch=1, start=5, stop=4), "need 0 <= start <= stop <= n=10"),
        (dict(n=10, seed=0, epoch=1, stop=11), "need 0 <= start <= stop <= n=10"),
        (dict(n=10, seed=0, epoch=1, start=-1), "start must be an integer"),
    ],
)
def test_argument_errors_say_what_is_accepted(kwargs, fragment):
    with pytest.raises(PskdError) as raised:
        shuffle_order(**kwargs)
    assert raised.value.code == "E9004"
    assert fragment in raised.value.message


def test_numpy_integers_are_accepted_as_arguments():
    assert shuffle_order(np.int64(10), seed=np.uint64(0), epoch=np.int32(1)).tolist()[:3] == [2, 4, 5]


@pytest.mark.parametrize("positions", [[-1], [10], [3, 12, -1], np.array([0.5]), ["a"]])
def test_bad_positions(positions):
    permutation = Permutation(10, seed=0, epoch=1)
    with pytest.raises(PskdError) as raised:
        permutation(positions)
    assert raised.value.code == "E9004" and "positions must be" in raised.value.message
    with pytest.raises(PskdError):
        permutation.at(10)


def test_bad_positions_beyond_2_pow_63():
    permutation = Permutation(2**64, seed=0, epoch=1)
    assert permutation(np.array([2**64 - 1], dtype=np.uint64)).dtype == np.uint64
    with pytest.raises(PskdError) as raised:
        permutation(np.array([2**63 - 1, -2], dtype=np.int64))
    assert "got -2" in raised.value.message
    with pytest.raises(PskdError) as raised:
        Permutation(2**63 + 1, seed=0, epoch=1)(np.array([2**63 + 1], dtype=np.uint64))
    assert f"got {2**63 + 1}" in raised.value.message


def test_permutations_together_equal_each_alone():
    """permute_together: stacked tables (one half-word size, and several), many walkers (another
    numpy pass) and few (Python integers) give each permutation's own numbers; it declines where
    a permutation has no tables yet or one sample."""
    rng = np.random.default_rng(5)
    for ns in [(10**6, 10**6), (1000, 10**6, 5), (2, 3, 4**8 + 1), (4**8, 4**8 + 1)]:
        permutations = tuple(Permutation(n, seed=k + 3, epoch=2) for k, n in enumerate(ns))
        assert permute_together(permutations, np.zeros(1, np.int64), np.zeros(1, np.int64)) is None  # no tables
        for p in permutations:
            p._make_tables()
        for size in (1, 40, 5000):
            which = rng.integers(0, len(ns), size)
            positions = (rng.random(size) * np.array(ns).take(which)).astype(np.int64)
            got = permute_together(permutations, which, positions)
            assert got is not None and got.dtype == np.int64
            want = [permutations[w](np.array([x]))[0] for w, x in zip(which.tolist(), positions.tolist())]
            assert got.tolist() == want, (ns, size)
    one = (Permutation(1, seed=0, epoch=1), Permutation(9, seed=0, epoch=1))
    for p in one:
        p._make_tables()
    assert permute_together(one, np.array([0, 1]), np.array([0, 3])) is None
