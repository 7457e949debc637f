"""A mixture's schedule (pskd_jax.pipeline.schedule): every prefix within one sample of every
source's share, whichever construction serves the weights; positions at random equal the walk
from the start; the certificate is sound; the deadline walk is the one docs/pipeline.md defines."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError
from pskd_jax.pipeline.schedule import (
    MAX_SEQUENTIAL_PERIOD,
    Schedule,
    certify,
    integer_weights,
    merge_order,
)

weights_lists = st.lists(st.integers(1, 60), min_size=2, max_size=9)
spread_weights = st.lists(st.sampled_from([1, 2, 3, 5, 12, 40, 97, 333]), min_size=5, max_size=9)


def deviations(schedule: Schedule, length: int) -> np.ndarray:
    """|c_i(L)·W - L·w_i| for every prefix L in 1..length and every source (exact integers)."""
    sources, _ = schedule.run(0, length)
    counts = np.zeros((length, len(schedule.weights)), dtype=np.int64)
    counts[np.arange(length), sources] = 1
    counts = counts.cumsum(axis=0)
    lengths = np.arange(1, length + 1, dtype=np.int64)[:, None]
    return np.abs(counts * schedule.period - lengths * np.array(schedule.weights))


def assert_within_one(schedule: Schedule, length: int) -> None:
    worst = int(deviations(schedule, length).max())
    assert worst < schedule.period, (schedule, Fraction(worst, schedule.period))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(weights_lists)
def test_every_prefix_holds_each_source_within_one_sample_of_its_share(weights):
    schedule = Schedule(weights)
    assert_within_one(schedule, 2 * schedule.period + 7)  # two periods: the schedule then repeats


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(spread_weights)
def test_spread_weights_are_within_one_too(weights):
    """Weights of very different sizes: those the certificate does not prove walk by deadlines."""
    schedule = Schedule(weights)
    assert_within_one(schedule, schedule.period + 3)


@settings(max_examples=40, deadline=None)
@given(weights_lists, st.integers(0, 2**62), st.integers(1, 40))
def test_far_positions_are_within_one_and_equal_the_walk_from_the_period(weights, first, length):
    schedule = Schedule(weights)
    sources, taken = schedule.run(first, length)
    counts = list(schedule.counts(first))
    for s, c in zip(sources.tolist(), taken.tolist()):
        assert c == counts[s]
        counts[s] += 1
    assert tuple(counts) == schedule.counts(first + length)
    prefix = first + length
    assert all(abs(c * schedule.period - prefix * w) < schedule.period for c, w in zip(counts, schedule.weights))


@settings(max_examples=30, deadline=None)
@given(weights_lists, st.integers(0, 500), st.integers(0, 60))
def test_a_run_at_any_position_is_a_slice_of_the_run_from_zero(weights, first, length):
    schedule = Schedule(weights)
    whole_sources, whole_taken = schedule.run(0, first + length)
    sources, taken = schedule.run(first, length)
    assert np.array_equal(sources, whole_sources[first:]) and np.array_equal(taken, whole_taken[first:])
    cursor = schedule.cursor(first)
    parts = [cursor.take(k) for k in (length // 3, length - length // 3)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), sources)


@pytest.mark.parametrize("weights", [[3, 1], [7, 2, 1], [0.5, 0.3, 0.2], [1, 2, 3, 4], [1] * 7,
                                     [100, 313, 1, 97, 24, 73], [12, 12, 3, 3, 1],
                                     [1, 1, 1, 69, 118, 1683, 4866, 8272]])
def test_given_weights_are_within_one_over_two_periods(weights):
    weights = [Fraction(str(w)) for w in weights]
    schedule = Schedule(weights)
    assert_within_one(schedule, 2 * schedule.period + 1)


@pytest.mark.parametrize("weights", [[3, 1], [5, 3, 1], [12, 12, 3, 3, 1], [1, 1, 1, 1, 1]])
def test_each_period_gives_each_source_exactly_its_weight(weights):
    schedule = Schedule(weights)
    for periods in (1, 2, 7, 10**12):
        assert schedule.counts(periods * schedule.period) == tuple(periods * w for w in schedule.weights)


def test_both_constructions_are_used():
    assert Schedule([3, 1]).kind == "splits" and Schedule([1, 2, 3, 4]).kind == "splits"
    assert Schedule([1] * 16).kind == "splits"
    assert Schedule([12, 12, 3, 3, 1]).kind == "deadlines"


def random_shape(draw, leaves):
    if len(leaves) == 1:
        return leaves[0]
    cut = draw(st.integers(1, len(leaves) - 1))
    return random_shape(draw, leaves[:cut]), random_shape(draw, leaves[cut:])


@st.composite
def shapes(draw):
    weights = draw(st.lists(st.integers(1, 30), min_size=2, max_size=7))
    order = draw(st.permutations(range(len(weights))))
    return random_shape(draw, list(order)), weights


def splits_deviation(shape, weights) -> Fraction:
    """The largest deviation of the splits of ``shape`` over one period, by brute force."""
    total = sum(weights)

    def walk(node, counts):
        if isinstance(node, int):
            return {node: counts}
        left = weight(node[0])
        v = left + weight(node[1])
        to_left = [(2 * c * left + v) // (2 * v) for c in counts]
        found = walk(node[0], to_left)
        found.update(walk(node[1], [c - a for c, a in zip(counts, to_left)]))
        return found

    def weight(node):
        return weights[node] if isinstance(node, int) else weight(node[0]) + weight(node[1])

    counts = walk(shape, list(range(total + 1)))
    return max(Fraction(abs(c * total - length * weights[i]), total)
               for i, column in counts.items() for length, c in enumerate(column))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(shapes())
def test_the_certificate_is_sound(shape_and_weights):
    shape, weights = shape_and_weights
    if certify(shape, weights):
        assert splits_deviation(shape, weights) < 1


def test_the_certificate_refuses_a_tree_that_strays():
    shape, weights = (0, (1, (2, (3, 4)))), [1, 1, 1, 9, 1]
    assert splits_deviation(shape, weights) >= 1  # the harmonic pile-up of a deep unbalanced tree
    assert not certify(shape, weights)


@pytest.mark.parametrize("sources", [2, 3, 4])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_two_to_four_sources_always_take_the_closed_form(sources, data):
    weights = data.draw(st.lists(st.integers(1, 10**6), min_size=sources, max_size=sources))
    assert Schedule(weights).kind == "splits"


def reference_deadlines(weights, length):
    """The deadline walk as docs/pipeline.md writes it, in fractions."""
    total = sum(weights)
    counts, order = [0] * len(weights), []
    for p in range(length):
        due = [i for i, w in enumerate(weights) if Fraction(counts[i], w) < Fraction(p + 1, total)]
        best = min(due, key=lambda i: (Fraction(counts[i] + 1, weights[i]), i))
        order.append(best)
        counts[best] += 1
    return order


@pytest.mark.parametrize("weights", [[12, 12, 3, 3, 1], [1, 1, 1, 69, 118, 1683, 4866, 8272]])
def test_the_deadline_walk_is_the_documented_one(weights):
    schedule = Schedule(weights)
    assert schedule.kind == "deadlines"
    length = min(3 * schedule.period, 4000)
    assert schedule.run(0, length)[0].tolist() == reference_deadlines(list(schedule.weights), length)


def test_weights_are_ratios_kept_exactly():
    assert integer_weights([Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)]) == (5, 3, 2)
    assert integer_weights([6, 4, 2]) == (3, 2, 1)
    as_tenths = Schedule([Fraction(3, 10), Fraction(1, 10)])
    assert Schedule([6, 2]).run(0, 40)[0].tolist() == as_tenths.run(0, 40)[0].tolist()


def test_merge_order_is_deterministic_and_balanced_for_equal_weights():
    assert merge_order([1] * 8) == (((0, 1), (2, 3)), ((4, 5), (6, 7)))
    assert merge_order([1, 1, 1, 1, 1]) == ((2, 3), (4, (0, 1)))


def test_refusals():
    with pytest.raises(PskdError) as raised:
        Schedule([1])
    assert raised.value.code == "E9010"
    with pytest.raises(PskdError) as raised:
        Schedule([1, 2**31])
    assert raised.value.code == "E9010" and "2**31 - 1" in raised.value.message
    # A sequential schedule whose period is too long to walk from its start at every resume.
    heavy = [100 * w for w in (1, 1, 1, 69, 118, 1683, 4866, 8272)]
    heavy[0] += 1
    assert not certify(merge_order(heavy), heavy) and sum(heavy) > MAX_SEQUENTIAL_PERIOD
    with pytest.raises(PskdError) as raised:
        Schedule(heavy)
    assert raised.value.code == "E9010" and "2**20" in raised.value.message
    with pytest.raises(PskdError):
        Schedule([1, 1]).run(2**63 - 2, 5)


@pytest.mark.parametrize("weights", [[3, 1], [5, 3, 2], [1, 1, 1, 1, 1], [12, 12, 3, 3, 1], [7, 1000], [1, 2**15]])
def test_a_run_from_the_kept_period_equals_the_cursor_s(weights):
    """``Schedule.sources`` (one period kept, for periods up to PATTERN_PERIOD) gives what a
    cursor walked from that position gives, at any position and any length."""
    schedule = Schedule(weights)
    rng = np.random.default_rng(len(weights))
    for first in [0, 1, schedule.period - 1, schedule.period, 10**12 + 7, 2**62, *rng.integers(0, 10**9, 6).tolist()]:
        for length in (0, 1, 5, schedule.period, 3 * schedule.period + 2, 700):
            got, before = schedule.sources(first, length)
            want, want_before = schedule.cursor(first).take_sources(length)
            assert got.dtype == np.int64 and np.array_equal(got, want) and before == want_before, (first, length)
            assert before == schedule.counts(first)


# Harder weights than those above: up to 256 sources, totals up to 2**31 - 1, very unequal pairs.
many_small = st.lists(st.integers(1, 3), min_size=2, max_size=256)
hard_weights = st.one_of(
    st.lists(st.integers(1, 2**16), min_size=2, max_size=40),
    many_small,
    st.lists(st.sampled_from([1, 2, 3, 7, 100, 10**4, 10**6, 10**8]), min_size=2, max_size=12),
    st.lists(st.integers(1, 2**30), min_size=2, max_size=2),
)


def schedule_or_none(weights) -> Schedule | None:
    """The schedule, or None for weights refused (a total over 2**31 - 1, or over 2**20 unproven)."""
    try:
        return Schedule(weights)
    except PskdError:
        return None


def assert_prefix_within_one(schedule: Schedule, length: int) -> None:
    counts = schedule.counts(length)
    assert sum(counts) == length
    assert all(abs(c * schedule.period - length * w) < schedule.period for c, w in zip(counts, schedule.weights)), (
        schedule, length, counts)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(hard_weights, st.lists(st.integers(0, 2**63 - 2**40), min_size=1, max_size=3), st.integers(1, 120))
def test_far_prefixes_of_hard_weights_are_within_one_and_runs_agree_with_counts(weights, prefixes, length):
    schedule = schedule_or_none(weights)
    assume(schedule is not None)  # (refused weights: test_refusals)
    assert schedule is not None
    for prefix in prefixes:
        assert_prefix_within_one(schedule, prefix)
        sources, taken = schedule.run(prefix, length)
        counts = list(schedule.counts(prefix))
        for s, c in zip(sources.tolist(), taken.tolist()):
            assert c == counts[s]
            counts[s] += 1
        assert tuple(counts) == schedule.counts(prefix + length)
        assert_prefix_within_one(schedule, prefix + length)
        if schedule.kind == "splits" or schedule.period <= 2**15:  # (sources() walks a long deadline period)
            kept, before = schedule.sources(prefix, length)
            assert np.array_equal(kept, sources) and before == schedule.counts(prefix)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(many_small)
def test_every_prefix_of_many_sources_is_within_one(weights):
    schedule = Schedule(weights)
    assert_within_one(schedule, 2 * schedule.period + 3)


def test_a_long_deadline_period_is_walked_once_and_any_position_is_the_documented_walk(monkeypatch):
    # A period too long to keep as a mixture's tables (over PATTERN_PERIOD) but within the walk's
    # bound: one walk of it a schedule, kept; positions anywhere, and runs across a period's end,
    # are the documented walk's, and their counts its counts.
    from pskd_jax.pipeline import schedule as module
    weights = (32768, 9, 128, 2, 128, 4096)
    schedule = Schedule(weights)
    assert schedule.kind == "deadlines" and schedule.period > module.PATTERN_PERIOD
    walks = []
    walk = module._walk_period
    monkeypatch.setattr(module, "_walk_period", lambda w: walks.append(w) or walk(w))
    period = schedule.period
    reference = np.array(reference_deadlines(list(schedule.weights), 2 * period))
    for first, length in ((period - 5, 10), (7 * period + 12345, 300), (10**12 * period + period - 40, 2000),
                          (0, 64), (2**63 - 65, 64)):
        sources, counts = schedule.run(first, length)
        periods, phase = divmod(first, period)
        want = reference[phase : phase + length]
        assert np.array_equal(sources, want)
        before = [periods * w + int(np.count_nonzero(reference[:phase] == s)) for s, w in enumerate(schedule.weights)]
        assert schedule.counts(first) == tuple(before)
        for k, s in enumerate(want.tolist()):
            assert counts[k] == before[s]
            before[s] += 1
    assert len(walks) == 1  # (the one walk of the period, whatever the positions asked)
    cursor = schedule.cursor(period - 100)
    taken = np.concatenate([cursor.take(60)[0], cursor.take(80)[0]])
    assert np.array_equal(taken, reference[period - 100 : period + 40])
