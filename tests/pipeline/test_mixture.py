"""Mixtures (pskd_jax.pipeline.mixture): the pinned first positions of given texts, each source in
its own order starting its own next epoch, batches and take over the mixed stream, and iterator
states saved at every batch that resume the exact stream."""

from __future__ import annotations

import itertools
import json
import pathlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError
from pskd_jax.pipeline import IteratorState, MixSource, Mixture, parse_pipeline
from pskd_jax.pipeline.shuffle import held_permutation, shuffle_order

# The first 16 positions as SOURCE:INDEX, as docs/pipeline.md pins them.
PINNED = [
    ('mix(stream "a" : 3, stream "b" : 1) |> batch(B = 4)', (100, 100),
     "0:0 0:1 1:0 0:2 0:3 0:4 1:1 0:5 0:6 0:7 1:2 0:8 0:9 0:10 1:3 0:11"),
    ('mix(stream "a" : 0.5, stream "b" : 0.3, stream "c" : 0.2) |> batch(B = 4)', (100, 100, 100),
     "0:0 1:0 0:1 2:0 0:2 1:1 0:3 2:1 0:4 1:2 0:5 1:3 0:6 2:2 0:7 1:4"),
    ('mix(stream "a" : 1, stream "b" : 1, stream "c" : 1, stream "d" : 1, stream "e" : 1) |> batch(B = 4)', (100,) * 5,
     "0:0 2:0 4:0 3:0 1:0 0:1 2:1 4:1 3:1 1:1 0:2 2:2 4:2 3:2 1:2 0:3"),
    ('mix(stream "a" : 12, stream "b" : 12, stream "c" : 3, stream "d" : 3, stream "e" : 1) |> batch(B = 4)',
     (100,) * 5,
     "0:0 1:0 0:1 1:1 2:0 0:2 1:2 0:3 1:3 3:0 0:4 1:4 0:5 1:5 2:1 0:6"),
    ('mix(stream "a" |> shuffle(seed = 0) : 2, stream "b" |> shuffle(seed = 42) : 1) |> batch(B = 4)', (10, 1000),
     "0:2 1:156 0:4 0:5 1:421 0:6 0:8 1:538 0:7 0:0 1:754 0:9 0:1 1:810 0:3 0:9"),
    ('mix(stream "a" : 3, stream "b" |> shuffle(seed = 7) : 1) |> batch(B = 4)', (2, 2),
     "0:0 0:1 1:0 0:0 0:1 0:0 1:1 0:1 0:0 0:1 1:0 0:0 0:1 0:0 1:1 0:1"),
]


def shown(mixture: Mixture, counts, batches: int) -> str:
    pairs = []
    for j in range(batches):
        sources, indices = mixture.batch_indices(counts, 1, j)
        pairs += [f"{s}:{i}" for s, i in zip(sources.tolist(), indices.tolist())]
    return " ".join(pairs)


@pytest.mark.parametrize("text, counts, expected", PINNED)
def test_pinned_first_positions(text, counts, expected):
    mixture = parse_pipeline(text)
    assert shown(mixture, counts, 4) == expected
    stream = mixture.iter_batches(counts)
    joined = [f"{s}:{i}" for _, (src, idx) in itertools.islice(stream, 4) for s, i in zip(src.tolist(), idx.tolist())]
    assert " ".join(joined) == expected


def test_the_pinned_mixtures_use_both_schedules():
    kinds = [parse_pipeline(text).schedule.kind for text, _, _ in PINNED]
    assert kinds.count("deadlines") == 1 and kinds.count("splits") == len(PINNED) - 1


def test_each_source_follows_its_own_order_and_starts_its_own_next_epoch():
    mixture = parse_pipeline('mix(stream "a" |> shuffle(seed = 5) : 2, stream "b" |> shuffle(seed = 9) : 1, '
                             'stream "c" : 1) |> batch(B = 8)')
    counts = (7, 3, 5)
    sources, indices = [], []
    for _, (s, i) in itertools.islice(mixture.iter_batches(counts), 40):
        sources.append(s)
        indices.append(i)
    sources, indices = np.concatenate(sources), np.concatenate(indices)
    for source, n, seed in ((0, 7, 5), (1, 3, 9), (2, 5, None)):
        got = indices[sources == source]
        epochs = -(-got.size // n)
        orders = [shuffle_order(n, seed=seed, epoch=e) if seed is not None else np.arange(n)
                  for e in range(1, epochs + 1)]
        assert np.array_equal(got, np.concatenate(orders)[: got.size]), source


def test_take_keeps_the_first_batches_and_ends_the_stream():
    mixture = parse_pipeline('mix(stream "a" : 3, stream "b" : 1) |> batch(B = 4) |> take(n = 3)')
    stream = list(mixture.iter_batches((5, 5)))
    assert [state for state, _ in stream] == [IteratorState(1, 1), IteratorState(1, 2), IteratorState(1, 3)]
    assert mixture.batches_per_epoch((5, 5)) == 3
    with pytest.raises(PskdError) as raised:
        mixture.batch_indices((5, 5), 1, 3)
    assert raised.value.code == "E9004"
    assert list(mixture.iter_batches((5, 5), epochs=0)) == []


@pytest.mark.parametrize("text", [
    'mix(stream "a" |> shuffle(seed = 77) : 3, stream "b" : 2) |> batch(B = 3) |> take(n = 40)',
    'mix(stream "a" : 12, stream "b" |> shuffle(seed = 1) : 12, stream "c" : 3, stream "d" : 3, stream "e" : 1) '
    '|> batch(B = 5) |> take(n = 30)',
])
def test_state_saved_at_every_batch_resumes_the_exact_stream(text):
    mixture = parse_pipeline(text)
    counts = tuple(range(7, 7 + len(mixture.sources)))
    reference = [(state, s.tolist(), i.tolist()) for state, (s, i) in mixture.iter_batches(counts)]
    saved = [IteratorState()] + [state for state, _, _ in reference]
    for k, state in enumerate(saved):
        restored = IteratorState.from_json(json.loads(json.dumps(state.to_json())))
        rest = [(st, s.tolist(), i.tolist()) for st, (s, i) in mixture.iter_batches(counts, restored)]
        assert rest == reference[k:], k


def test_a_stream_without_take_resumes_far_on_and_crosses_blocks():
    mixture = parse_pipeline('mix(stream "a" |> shuffle(seed = 3) : 0.7, stream "b" : 0.3) |> batch(B = 4)')
    counts = (1100, 13)
    first = list(itertools.islice(mixture.iter_batches(counts), 4100))  # several blocks of batches computed at once
    for k in (0, 1, 4095, 4096, 4099):
        state, (sources, indices) = first[k]
        assert state == IteratorState(1, k + 1)
        expected = mixture.batch_indices(counts, 1, k)
        assert np.array_equal(sources, expected[0]) and np.array_equal(indices, expected[1])
    far = IteratorState(1, 10**15)
    state, (sources, indices) = next(mixture.iter_batches(counts, far))
    assert state == IteratorState(1, 10**15 + 1)
    assert np.array_equal(indices, mixture.batch_indices(counts, 1, 10**15)[1])
    numbers = list(itertools.islice(mixture.iter_batch_numbers(counts, far), 2))
    assert numbers == [(IteratorState(1, 10**15 + 1), 1, 10**15), (IteratorState(1, 10**15 + 2), 1, 10**15 + 1)]


def test_a_long_sequential_schedule_is_walked_once_by_the_iterator(monkeypatch):
    # A deadline schedule whose period is too long to keep: a cursor made a block would walk again
    # from its period's start each time (O(period) a block); the iterator walks on with one.
    from pskd_jax.pipeline.schedule import PATTERN_PERIOD, Schedule
    weights = (32768, 9, 128, 2, 128, 4096)
    mixture = Mixture(tuple(MixSource(f"s{i}", 3 if i % 2 else None, w) for i, w in enumerate(weights)),
                      batch_size=64)
    assert mixture.schedule.kind == "deadlines" and mixture.schedule.period > PATTERN_PERIOD
    counts = (1000, 7, 50, 3, 60, 900)
    made = []
    cursor = Schedule.cursor
    monkeypatch.setattr(Schedule, "cursor", lambda self, first: made.append(first) or cursor(self, first))
    start = 30000 // 64
    blocks = list(itertools.islice(mixture.iter_blocks(counts, IteratorState(1, start)), 4))
    assert made == [start * 64]
    monkeypatch.setattr(Schedule, "cursor", cursor)
    for j, sources, indices in blocks:  # (across the period's end: 37131 positions)
        for k in (0, len(sources) - 1):
            expected = mixture.batch_indices(counts, 1, j + k)
            assert np.array_equal(sources[k], expected[0]) and np.array_equal(indices[k], expected[1])


def test_a_state_past_the_end_of_the_positions_is_refused():
    # Without take the stream ends where its positions do (2**63 - 1): a state beyond that is
    # refused as one beyond take is, not an iterator that yields nothing as if the stream were done.
    mixture = parse_pipeline('mix(stream "a" : 1, stream "b" : 1) |> batch(B = 8)')
    end = (2**63 - 1) // 8
    assert mixture.end_batch == end
    for state in (IteratorState(1, end + 1), IteratorState(1, 2**70)):
        for call in (mixture.iter_batches, mixture.iter_batch_numbers, mixture.iter_blocks):
            with pytest.raises(PskdError) as raised:
                call((3, 3), state)
            assert raised.value.code == "E9004" and f"beyond the {end} batches" in raised.value.message
    assert list(mixture.iter_batches((3, 3), IteratorState(1, end))) == []  # the state after the last batch
    (state, (_, indices)), = mixture.iter_batches((3, 3), IteratorState(1, end - 1))
    assert state == IteratorState(1, end) and indices.tolist() == mixture.batch_indices((3, 3), 1, end - 1)[1].tolist()
    # A take beyond the positions ends where they do, for batches and iterators alike.
    beyond = parse_pipeline(f'mix(stream "a" : 1, stream "b" : 1) |> batch(B = 8) |> take(n = {10**30})')
    assert beyond.end_batch == end and len(list(beyond.iter_batch_numbers((3, 3), IteratorState(1, end - 2)))) == 2
    with pytest.raises(PskdError) as raised:
        beyond.batch_indices((3, 3), 1, end)
    assert raised.value.code == "E9004"


def test_parts_of_a_batch_are_slices_of_it():
    mixture = parse_pipeline('mix(stream "a" |> shuffle(seed = 3) : 2, stream "b" : 1) |> batch(B = 10)')
    sources, indices = mixture.batch_indices((4, 4), 1, 7)
    part = mixture.batch_indices((4, 4), 1, 7, start=3, stop=8)
    assert np.array_equal(part[0], sources[3:8]) and np.array_equal(part[1], indices[3:8])
    assert sources.dtype == np.int64 and indices.dtype == np.int64


def test_iterator_and_index_errors():
    mixture = parse_pipeline('mix(stream "a" : 1, stream "b" : 1) |> batch(B = 2) |> take(n = 4)')
    for call in (lambda: mixture.batch_indices((3, 3), 2, 0),
                 lambda: next(mixture.iter_batches((3, 3), IteratorState(2, 0))),
                 lambda: next(mixture.iter_batches((3, 3), IteratorState(1, 5))),
                 lambda: mixture.batch_indices((3,), 1, 0),
                 lambda: mixture.batch_indices((3, 3), 1, 0, start=1, stop=0),
                 lambda: mixture.batch_indices((3, -1), 1, 0)):
        with pytest.raises(PskdError) as raised:
            call()
        assert raised.value.code == "E9004"
    assert list(mixture.iter_batches((3, 3), IteratorState(1, 4))) == []  # the state after the last batch


def test_a_source_without_samples_is_named():
    mixture = parse_pipeline('mix(stream "a" : 1,\n    stream "empty.psk.d" : 1) |> batch(B = 2)')
    with pytest.raises(PskdError) as raised:
        mixture.check_counts((3, 0))
    assert raised.value.code == "E9010"
    assert raised.value.message.startswith('pipeline:2:5: source 1 (stream "empty.psk.d") has no sample')


def test_sources_of_different_sample_types_are_refused_naming_both():
    mixture = parse_pipeline('mix(stream "a" : 1, stream "b" : 1,\n stream "c" : 2) |> batch(B = 2)')
    assert mixture.check_sample_types(["ℝ[2]", "ℝ[2]", "ℝ[ 2 ]"]) == "ℝ[2]"
    with pytest.raises(PskdError) as raised:
        mixture.check_sample_types(["ℝ[2]", "ℝ[2]", "ℝ[3]"])
    assert raised.value.code == "E9010"
    message = raised.value.message
    assert message.startswith("pipeline:2:2: source 2") and "'ℝ[3]'" in message and "at pipeline:1:5" in message
    mixture.check_batch_type("ℝ[2]", "ℝ[B, 2]")
    with pytest.raises(PskdError) as raised:
        mixture.check_batch_type("ℝ[2]", "ℝ[B, 3]")
    assert raised.value.code == "E9010" and "batch(B = 2)" in raised.value.message


@pytest.mark.parametrize("sources, options", [
    ((MixSource("a", None, 1),), {}),
    ((MixSource("a", None, 1), "b"), {}),
    ((MixSource("a", None, 1), MixSource("b", None, 1)), {"batch_size": 0}),
    ((MixSource("a", None, 1), MixSource("b", None, 1)), {"batch_size": 2**63}),  # (no batch: refused, E9010)
    ((MixSource("a", None, 1), MixSource("b", None, 1)), {"take": 0}),
])
def test_a_mixture_built_directly_is_checked(sources, options):
    with pytest.raises(PskdError) as raised:
        Mixture(sources, **({"batch_size": 2} | options))
    assert raised.value.code == "E9010"


@pytest.mark.parametrize("weight", [0, -1, 0.5, Fraction(1, 3), "x", True, None])
def test_a_source_built_directly_takes_an_exact_positive_weight(weight):
    with pytest.raises(PskdError) as raised:
        MixSource("a", None, weight)
    assert raised.value.code == "E9010"


def test_exact_weights_in_every_spelling_are_equal():
    assert MixSource("a", 1, "0.25") == MixSource("a", 1, Fraction(1, 4)) == MixSource("a", 1, Fraction("0.250"))
    assert MixSource("a", 1, 3, where="x:1:1") == MixSource("a", 1, np.int64(3))
    assert str(MixSource("a", None, Fraction(5, 2))) == 'stream "a" : 2.5'
    assert str(MixSource("a", 4, "0.0625")) == 'stream "a" |> shuffle(seed = 4) : 0.0625'


def test_weights_in_the_same_ratio_give_the_same_stream():
    texts = ['mix(stream "a" : 3, stream "b" : 1) |> batch(B = 8)',
             'mix(stream "a" : 0.75, stream "b" : 0.25) |> batch(B = 8)',
             'mix(stream "a" : 30, stream "b" : 10.0) |> batch(B = 8)']
    streams = {shown(parse_pipeline(text), (9, 9), 5) for text in texts}
    assert len(streams) == 1


def test_docs_pin_the_same_vectors():
    """docs/pipeline.md's table of mixture vectors is this file's: the same first positions."""
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "pipeline.md").read_text(encoding="utf-8")
    table = docs[docs.index("### Mixture test vectors"):]
    rows = [line for line in table.splitlines() if line.startswith("| ") and ":" in line.split("|")[-2]]
    assert [row.split("|")[-2].strip() for row in rows[: len(PINNED)]] == [expected for _, _, expected in PINNED]


def definition(mixture: Mixture, counts, first: int, length: int) -> tuple[list[int], list[int]]:
    """Position by position from the schedule's run and each source's scalar permutation: source
    s's count c is position c mod n of its epoch ⌊c / n⌋ + 1."""
    sources, taken = mixture.schedule.run(first, length)
    indices = []
    for s, c in zip(sources.tolist(), taken.tolist()):
        n, seed = counts[s], mixture.sources[s].seed
        epoch, position = divmod(c, n)
        indices.append(position if seed is None else held_permutation(n, seed=seed, epoch=epoch + 1).at(position))
    return sources.tolist(), indices


@pytest.mark.parametrize("weights, counts, seeds, together", [
    ((3, 1), (1000, 1000), (1, 2), True),  # one half-word size: stacked tables side by side
    ((3, 1), (5000, 70), (1, None), True),  # one source in file order
    ((5, 3, 1), (3000, 40000, 700), (4, 5, 6), True),  # half-words of 6, 8 and 5 bits
    # The deadline schedule; a source in file order that takes several of its epochs a batch.
    ((1, 1, 9, 1), (1 << 16, 1700, 3000, 2), (None, 8, 9, None), True),
    (("0.7", "0.3"), (1, 13), (3, 4), False),  # a source of one sample: source by source
])
def test_batches_in_one_pass_equal_the_definition(weights, counts, seeds, together):
    sources = tuple(MixSource(chr(97 + k), seed, Fraction(w)) for k, (w, seed) in enumerate(zip(weights, seeds)))
    mixture = Mixture(sources, batch_size=48)
    warm = 700 if together else 20  # (a source of one sample starts ~34 epochs a batch: slow)
    for _ in itertools.islice(mixture.iter_batches(counts), warm):  # the shuffles' tables get built
        pass
    passes = [mixture._together(48 * j, 48, counts) is not None for j in range(warm - 20, warm)]
    rng = np.random.default_rng(len(counts))
    numbers = [0, 1, 2**40 + 3, *rng.integers(0, 10**6, 25).tolist()]
    # Batches where a source's counts cross into its next epoch (those go source by source).
    numbers += [(k * counts[0] * sum(map(Fraction, weights)) / Fraction(weights[0])) // 48 for k in (1, 2)]
    # (Each number three times: a permutation's tables are built once it has been asked enough.)
    for j in map(int, numbers * 3 if together else numbers[:6]):
        got_sources, got_indices = mixture.batch_indices(counts, 1, j)
        assert (got_sources.tolist(), got_indices.tolist()) == definition(mixture, counts, 48 * j, 48), j
    # The last batches the iterator gave went in one pass, but where a source has one sample.
    assert sum(passes) >= 17 if together else not any(passes)
    state = IteratorState(1, 12345)  # and the iterator's blocks of batches
    for k, (_, (got_sources, got_indices)) in enumerate(itertools.islice(mixture.iter_batches(counts, state), 3)):
        assert (got_sources.tolist(), got_indices.tolist()) == definition(mixture, counts, 48 * (12345 + k), 48)


@pytest.mark.parametrize("seed", [None, 5])
def test_a_source_of_2_63_samples_beside_one_that_wraps_gives_its_batches(seed):
    """check_counts takes a count up to 2**63, which int64 cannot hold: a batch where another source
    in file order starts its next epoch must not make the counts an int64 array (it raised a bare
    OverflowError)."""
    mixture = Mixture((MixSource("a", None, 1), MixSource("b", seed, 10)), batch_size=72)
    counts = (1, 2**63)
    for j in (0, 25, 10**12):
        got_sources, got_indices = mixture.batch_indices(counts, 1, j)
        assert (got_sources.tolist(), got_indices.tolist()) == definition(mixture, counts, 72 * j, 72), j
    (_, (first_sources, _)), = itertools.islice(mixture.iter_batches(counts), 1)
    assert first_sources.tolist() == mixture.batch_indices(counts, 1, 0)[0].tolist()


# Sources of any count a mixture takes (to 2**63), shuffled or not, with weights far apart.
hard_sources = st.tuples(st.one_of(st.none(), st.integers(0, 2**64 - 1)),
                         st.sampled_from([1, 2, 3, 10, 1000, 40000, 10**6]),
                         st.one_of(st.integers(1, 5), st.integers(1, 10**12), st.just(2**63)))


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.one_of(st.lists(hard_sources, min_size=2, max_size=6), st.lists(hard_sources, min_size=20, max_size=40)),
       st.integers(1, 3000), st.data())
def test_batches_anywhere_equal_the_definition_for_hard_sources(sources, batch_size, data):
    try:
        mixture = Mixture(tuple(MixSource(f"s{i}", seed, w) for i, (seed, w, _) in enumerate(sources)),
                          batch_size=batch_size)
    except PskdError:
        assume(False)  # (weights whose schedule is refused: test_schedule)
    counts = tuple(n for _, _, n in sources)
    first = data.draw(st.one_of(st.integers(0, 100), st.integers(0, mixture.end_batch - 10)))
    batches = itertools.islice(mixture.iter_batches(counts, IteratorState(1, first)), 3)
    for k, (state, (got_sources, got_indices)) in enumerate(batches):
        j = first + k
        assert state == IteratorState(1, j + 1)
        expected = definition(mixture, counts, batch_size * j, batch_size)
        assert (got_sources.tolist(), got_indices.tolist()) == expected, j
        at_j = mixture.batch_indices(counts, 1, j)
        assert (at_j[0].tolist(), at_j[1].tolist()) == expected, j
