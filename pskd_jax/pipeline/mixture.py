"""A mixture of streams by weight: ``mix(P1 : w1, P2 : w2, …) |> batch(B = n) [|> take(n = k)]``.

Position p of the mixed stream takes source ``s`` and that source's count ``c`` of earlier
positions from the :class:`~pskd_jax.pipeline.schedule.Schedule` of the weights; the sample is
then the source's own: its epoch ``⌊c / n_s⌋ + 1`` and position ``c mod n_s`` in that epoch's
order (its shuffle's, or file order), so each source begins its next epoch when it runs out. The
mixture has no epochs of its own: batch j holds positions ``jB … jB + B - 1``, ``take(n = k)``
ends the stream after k batches, and the iterator's state is ``IteratorState(epoch=1, batch=j)``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Sequence
from fractions import Fraction

import numpy as np

from pskd_jax._os.checks import is_integer
from pskd_jax.errors import BadValueError, PipelineError, PskdError
from pskd_jax.format.sample_type import format_type, parse_type
from pskd_jax.pipeline.batches import BLOCK_POSITIONS, IteratorState, check_batch_type
from pskd_jax.pipeline.schedule import COUNTED_SPAN, MAX_POSITION, PATTERN_PERIOD, Schedule
from pskd_jax.pipeline.shuffle import HELD_PERMUTATIONS, MAX_SEED, Permutation, held_permutation, permute_together
from pskd_jax.storage.urls import locate

__all__ = ["MAX_BATCH_SIZE", "MAX_SOURCES", "MixSource", "Mixture", "weight_text"]

MAX_SOURCES = 256  # sources a mix may name
#: The largest B of a mix: its stream's positions end at 2**63 - 1, so a larger batch would make none.
MAX_BATCH_SIZE = MAX_POSITION


def weight_text(weight: Fraction) -> str:
    """A weight as the text writes it: digits, with a decimal point when it has a fraction.

    >>> weight_text(Fraction(3)), weight_text(Fraction(1, 8)), weight_text(Fraction(5, 2))
    ('3', '0.125', '2.5')
    """
    if weight.denominator == 1:
        return str(weight.numerator)
    places = 0
    while (weight * 10**places).denominator != 1:
        places += 1
    digits = str((weight * 10**places).numerator).rjust(places + 1, "0")
    return f"{digits[:-places]}.{digits[-places:]}"


def _decimal(weight: Fraction) -> bool:
    """Whether the weight has a finite decimal expansion (a denominator of 2s and 5s)."""
    d = weight.denominator
    for prime in (2, 5):
        while d % prime == 0:
            d //= prime
    return d == 1


def _file_key(path: str) -> str:
    """What tells two streams' files apart by their spelling: a URL as its store names it (so
    ``S3://b/k`` is ``s3://b/k``), a path, and a ``file://`` URL's path, made absolute and
    normalised; a URL the toolkit cannot serve as written (its opener refuses it)."""
    try:
        where = locate(path)
    except PskdError:
        return path
    return os.path.abspath(where.path) if where.is_local else where.url


def _check_distinct(sources: tuple[MixSource, ...]) -> None:
    """E9010 for two sources that stream one file in one order (the same path, unshuffled or with
    the same seed): the mix would give each of its samples twice, one after the other, where a
    single source of their summed weight gives it once in that share."""
    seen: dict[tuple[str, int | None], int] = {}
    for k, source in enumerate(sources):
        key = (_file_key(source.path), source.seed)
        if key in seen:
            first = seen[key]
            order = "unshuffled" if source.seed is None else f"shuffled with seed {source.seed}"
            place = f"{source.where}: " if source.where else ""
            raise PipelineError(f"{place}source {k} streams {source.path!r} {order}, as source {first} does: the "
                                "mix would give each of its samples twice in a row; give one source the sum of "
                                "their weights, or shuffle one with another seed")
        seen[key] = k


@dataclasses.dataclass(frozen=True)
class MixSource:
    """One source of a mixture: ``stream path [|> shuffle(seed)] : weight``.

    ``weight`` is exact: an int, a :class:`~fractions.Fraction` of finite decimal expansion, or
    its decimal text. ``where`` names the source's place in the text (``pipeline:1:5``) for
    error messages; it takes no part in equality.
    """

    path: str
    seed: int | None
    weight: Fraction
    where: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        weight = self.weight
        if isinstance(weight, str):
            try:
                weight = Fraction(weight)
            except ValueError:
                raise PipelineError(f"weight {weight!r} is not a number") from None
        if isinstance(weight, (bool, float)) or not isinstance(weight, (int, Fraction, np.integer)):
            raise PipelineError(f"a weight is exact: an int, a Fraction or decimal text, got {weight!r}")
        weight = Fraction(int(weight)) if is_integer(weight) else weight
        if weight <= 0 or not _decimal(weight):
            raise PipelineError(f"a weight is a positive number of finite decimal expansion, got {weight}")
        object.__setattr__(self, "weight", weight)
        if self.seed is not None and (not is_integer(self.seed) or not 0 <= self.seed < MAX_SEED):
            raise PipelineError(f"seed must be an integer in [0, 2**64), got seed={self.seed!r}")

    def stream_text(self) -> str:
        """``stream "path" [|> shuffle(seed = s)]``."""
        shuffled = f" |> shuffle(seed = {self.seed})" if self.seed is not None else ""
        return f'stream "{self.path}"{shuffled}'

    def __str__(self) -> str:
        return f"{self.stream_text()} : {weight_text(self.weight)}"


@dataclasses.dataclass(frozen=True)
class Mixture:
    """``mix(source : weight, …) |> batch(B) [|> take(n)]`` over (source, sample index) pairs.

    Methods take ``counts``, each source's number of samples in the text's order.

    >>> m = Mixture((MixSource("a", None, 3), MixSource("b", None, 1)), batch_size=4)
    >>> [f"{s}:{i}" for s, i in zip(*m.batch_indices((5, 2), 1, 1))]
    ['0:3', '0:4', '1:1', '0:0']
    """

    sources: tuple[MixSource, ...]
    batch_size: int
    take: int | None = None

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        if not all(isinstance(s, MixSource) for s in sources):
            raise PipelineError("a mixture's sources are MixSource values")
        if not 2 <= len(sources) <= MAX_SOURCES:
            raise PipelineError(f"a mix has from 2 to {MAX_SOURCES} sources, got {len(sources)}")
        object.__setattr__(self, "sources", sources)
        _check_distinct(sources)
        for name, value in (("batch_size", self.batch_size), ("take", self.take)):
            if (value is not None or name == "batch_size") and (not is_integer(value) or value < 1):
                raise PipelineError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if self.batch_size > MAX_BATCH_SIZE:  # (a stream of no batch would end before it began)
            raise PipelineError(f"batch_size must be at most {MAX_BATCH_SIZE} (2**63 - 1) in a mix: its positions end "
                                f"there, and a larger batch makes none; got batch_size={self.batch_size!r}")
        object.__setattr__(self, "batch_size", int(self.batch_size))
        if self.take is not None:
            object.__setattr__(self, "take", int(self.take))
        _ = self.schedule  # the weights are checked now (their total), not at the first batch

    def __str__(self) -> str:
        stages = ["mix(" + ", ".join(map(str, self.sources)) + ")", f"batch(B = {self.batch_size})"]
        if self.take is not None:
            stages.append(f"take(n = {self.take})")
        return " |> ".join(stages)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(s.path for s in self.sources)

    @functools.cached_property
    def schedule(self) -> Schedule:
        """Which source each position takes (a pure function of the weights)."""
        return _schedule(tuple(s.weight for s in self.sources))

    # -- the files, once known -------------------------------------------------------------------

    def check_counts(self, counts: Sequence[int]) -> tuple[int, ...]:
        """Each source's number of samples, checked: one a source, each at least 1 (E9010)."""
        if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) != len(self.sources):
            raise BadValueError(f"counts must be a sequence of {len(self.sources)} sample counts (one a source), "
                                f"got {counts!r}")
        for i, (source, n) in enumerate(zip(self.sources, counts)):
            if not is_integer(n) or not 0 <= n <= 2**63:
                raise BadValueError(f"source {i}'s count must be an integer in [0, 2**63], got {n!r}")
            if n == 0:
                raise PipelineError(f"{_at(source)}source {i} ({source.stream_text()}) has no sample: every source of "
                                    "a mix must have one")
        return tuple(int(n) for n in counts)

    def check_sample_types(self, sample_types: Sequence[str]) -> str:
        """The sources' one sample type; E9010 naming the first source whose type differs."""
        if len(sample_types) != len(self.sources):
            raise BadValueError(f"one sample type a source: {len(self.sources)}, got {len(sample_types)}")
        canonical = [format_type(parse_type(t)) for t in sample_types]
        for i, text in enumerate(canonical):
            if text != canonical[0]:
                first, other = self.sources[0], self.sources[i]
                raise PipelineError(f"{_at(other)}source {i} ({other.stream_text()}) has samples of type "
                                    f"{sample_types[i]!r}, but source 0 ({first.stream_text()}"
                                    f"{', at ' + first.where if first.where else ''}) has {sample_types[0]!r}: the "
                                    "sources of a mix have one sample type")
        return sample_types[0]

    def check_batch_type(self, sample_type: str, batch_type: str) -> None:
        """As :meth:`Pipeline.check_batch_type <pskd_jax.pipeline.Pipeline.check_batch_type>`."""
        check_batch_type(self.batch_size, sample_type, batch_type)

    def batches_per_epoch(self, counts: Sequence[int]) -> int | None:
        """The batches of the stream: ``take``'s, or None without take (the stream never ends)."""
        self.check_counts(counts)
        return self.take

    # -- batches ---------------------------------------------------------------------------------

    def batch_indices(self, counts: Sequence[int], epoch: int, j: int, *, start: int = 0,
                      stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(sources, indices) of batch ``j``'s rows ``start <= i < stop`` (default all B): the
        source each row takes (int64, numbered from 0 in the text's order) and the sample index in
        that source (int64). ``epoch`` is 1: a mixture has no epochs of its own."""
        counts = self.check_counts(counts)
        if epoch != 1 or isinstance(epoch, bool):
            raise BadValueError(f"a mixture has no epochs of its own: its batches are all of epoch 1, got "
                                f"epoch={epoch!r}")
        if not is_integer(j) or not 0 <= j < self.end_batch:
            bound = f"[0, {self.end_batch})" if self.take is not None else "[0, 2**63 / B)"
            raise BadValueError(f"batch index j must be in {bound} for {self}, got j={j!r}")
        stop = self.batch_size if stop is None else stop
        for name, value in (("start", start), ("stop", stop)):
            if not is_integer(value) or not 0 <= value <= self.batch_size:
                raise BadValueError(f"{name} must be an integer in [0, {self.batch_size}], got {name}={value!r}")
        if stop < start:
            raise BadValueError(f"stop must be at least start, got start={start!r}, stop={stop!r}")
        return self._run(int(j) * self.batch_size + int(start), int(stop) - int(start), counts)

    def iter_batch_numbers(self, counts: Sequence[int], state: IteratorState | None = None, *,
                           epochs: int | None = None) -> Iterator[tuple[IteratorState, int, int]]:
        """Yields ``(state, 1, j)`` for every batch :meth:`iter_batches` yields (take its indices
        with :meth:`batch_indices`); the state is the one after that batch."""
        stop = self._check_iteration(counts, state, epochs)
        return ((IteratorState(1, j + 1), 1, j) for j in _numbers((state or IteratorState()).batch, stop))

    def iter_batches(self, counts: Sequence[int], state: IteratorState | None = None, *,
                     epochs: int | None = None) -> Iterator[tuple[IteratorState, tuple[np.ndarray, np.ndarray]]]:
        """Yields ``(state, (sources, indices))`` for every batch from ``state`` on (default batch
        0): the state names the batch after the one yielded. The stream ends after ``take``
        batches, or runs on forever without take; ``epochs=0`` yields nothing, any other value
        the whole stream (its one epoch)."""
        blocks = self.iter_blocks(counts, state, epochs=epochs)  # (checked now, not at the first batch)
        return ((IteratorState(1, j + k + 1), (sources[k], indices[k]))
                for j, sources, indices in blocks for k in range(len(sources)))

    def iter_blocks(self, counts: Sequence[int], state: IteratorState | None = None, *,
                    epochs: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """The batches :meth:`iter_batches` yields, a block of them at a time: ``(j, sources,
        indices)`` with the number of the block's first batch and two ``(batches, B)`` int64
        arrays (a reader that makes something of every batch can make it for a block at once)."""
        stop = self._check_iteration(counts, state, epochs)
        return self._iterate(self.check_counts(counts), (state or IteratorState()).batch, stop)

    def _check_iteration(self, counts: Sequence[int], state: IteratorState | None, epochs: int | None) -> int:
        """The batch the stream stops before, after checking what it starts from."""
        self.check_counts(counts)
        state = IteratorState() if state is None else state
        if not isinstance(state, IteratorState):
            raise BadValueError(f"state must be an IteratorState (IteratorState.from_json), got {state!r}")
        if state.epoch != 1:
            raise BadValueError(f"a mixture's iterator state has epoch 1 (a mixture has no epochs of its own), got "
                                f"epoch {state.epoch}")
        # The stream ends after take batches, or where its positions do: a state past its end is
        # refused (an iterator started there would yield nothing, as if the stream were done).
        stop = self.end_batch
        if state.batch > stop:
            raise BadValueError(f"iterator state batch {state.batch} is beyond the {stop} batches of {self}")
        if epochs is not None and (not is_integer(epochs) or epochs < 0):
            raise BadValueError(f"epochs must be an integer >= 0, got {epochs!r}")
        return 0 if epochs == 0 else stop

    @property
    def end_batch(self) -> int:
        """One past the stream's last batch: after take batches, or at the last batch whose
        positions stay below 2**63 - 1, whichever comes first."""
        last = MAX_POSITION // self.batch_size
        return last if self.take is None else min(self.take, last)

    def _iterate(self, counts: tuple[int, ...], j: int, stop: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        # Blocks of batches at once, as a single stream's iterator does: the schedule and the
        # shuffles cost little more for BLOCK_POSITIONS positions than for one batch's.
        size = self.batch_size
        per_block = max(1, self._block_positions(counts) // size)
        # A period too long for the mixture's tables has no slices to take: one cursor walks on from
        # block to block, since a cursor made a block would count its period's prefix again.
        cursor = self.schedule.cursor(j * size) if self.schedule.period > PATTERN_PERIOD else None
        while j < stop:
            block = min(per_block, stop - j)
            if cursor is None:
                sources, indices = self._run(j * size, block * size, counts)
            else:
                sources, before = cursor.take_sources(block * size)
                indices = self._samples(sources, before, counts)
            yield j, sources.reshape(block, size), indices.reshape(block, size)
            j += block

    def _block_positions(self, counts: tuple[int, ...]) -> int:
        """Positions computed at once: BLOCK_POSITIONS, or fewer where a shuffled source is so
        small that a block would span many of its epochs (each derives its own round keys)."""
        weights = self.schedule.weights
        limits = [2 * n * self.schedule.period // w for source, n, w in zip(self.sources, counts, weights)
                  if source.seed is not None]
        return min([BLOCK_POSITIONS, *limits])

    def _run(self, first: int, length: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(sources, indices) of positions ``first … first + length - 1``: in one pass over all
        of them where :meth:`_together` applies, else source by source."""
        together = self._together(first, length, counts)
        if together is not None:
            return together
        sources, before = self.schedule.sources(first, length)
        return sources, self._samples(sources, before, counts)

    def _together(self, first: int, length: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """(sources, indices) with all sources at once: a source's count ``c`` (a closed form of
        the schedule, :meth:`Schedule.counted`) is at position ``c - e·n`` of its epoch e + 1, and
        every shuffled source's order is evaluated in one :func:`permute_together` call. ``None``
        (the caller goes source by source) when a source's counts in the run cross into its next
        epoch, the schedule's arrays are not kept for the run, or the shuffles cannot be stacked."""
        schedule = self.schedule
        if schedule.period > PATTERN_PERIOD or length > COUNTED_SPAN:
            return None
        before, after = schedule.before(first), schedule.before(first + length)
        epochs, wraps = [], False
        for source, n, b, a in zip(self.sources, counts, before, after):
            epoch = b // n
            # (a count of 2**63 is no int64: the counts would not make the wrap's divisors)
            if (a > b and (a - 1) // n != epoch) or n >= 2**63:
                if source.seed is not None or n >= 2**63:
                    return None
                wraps = True  # (a source in file order: its counts modulo n)
            epochs.append(epoch)
        plan = _plan(tuple(s.seed for s in self.sources), counts, tuple(epochs))
        if plan is None:
            return None
        epoch_starts, permutations, number = plan
        counted = schedule.counted(first, length, epoch_starts)
        assert counted is not None  # (the run is one the schedule keeps)
        kind, positions = counted
        if wraps:  # (the other sources' positions are below their n already)
            np.remainder(positions, np.array(counts, dtype=np.int64).take(kind), out=positions)
        if not permutations:
            return kind, positions
        if number is None:
            values = permute_together(permutations, kind, positions)
            return None if values is None else (kind, values)
        which = number.take(kind)
        rows = (which >= 0).nonzero()[0]
        values = permute_together(permutations, which.take(rows), positions.take(rows))
        if values is None:
            return None
        positions[rows] = values
        return kind, positions

    def _samples(self, sources: np.ndarray, before: tuple[int, ...], counts: tuple[int, ...]) -> np.ndarray:
        """The sample index of each position: in its source's own order at its own epoch.

        A source's positions in a run take its counts one after another from ``before[i]``, so
        they are a slice of its stream of samples."""
        indices = np.empty(sources.size, dtype=np.int64)
        first = sources == 0
        for i, (source, n) in enumerate(zip(self.sources, counts)):
            mine = first if i == 0 else ~first if len(self.sources) == 2 else sources == i
            length = int(np.count_nonzero(mine))
            if length:
                np.place(indices, mine, _source_samples(source.seed, n, before[i], length))
        return indices


def _source_samples(seed: int | None, n: int, start: int, length: int) -> np.ndarray:
    """Samples ``start … start + length - 1`` of a source's stream of ``n``-sample epochs: epoch
    ``⌊c / n⌋ + 1`` at its position ``c mod n``, in its shuffle's order or in file order."""
    parts = []
    c, stop = start, start + length
    while c < stop:
        epoch, position = divmod(c, n)
        run = min(n - position, stop - c)
        if seed is None:
            parts.append(np.arange(position, position + run, dtype=np.int64))
        else:
            parts.append(held_permutation(n, seed=seed, epoch=epoch + 1).order(position, position + run))
        c += run
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@functools.lru_cache(maxsize=4)
def _plan(seeds: tuple[int | None, ...], counts: tuple[int, ...], epochs: tuple[int, ...]
          ) -> tuple[np.ndarray, tuple[Permutation, ...], np.ndarray | None] | None:
    """For sources at epochs ``epochs`` (from 0): the first count of each one's epoch (int64), the
    shuffled ones' permutations, and each source's number among those (-1 for a source in file
    order; None when all are shuffled). None for more shuffled sources than are held at once."""
    shuffled = [s for s, seed in enumerate(seeds) if seed is not None]
    if len(shuffled) > HELD_PERMUTATIONS:
        return None
    epoch_starts = np.array([e * n for e, n in zip(epochs, counts)], dtype=np.int64)
    epoch_starts.flags.writeable = False
    permutations = tuple(held_permutation(counts[s], seed=seeds[s], epoch=epochs[s] + 1)  # type: ignore[arg-type]
                         for s in shuffled)
    if len(shuffled) == len(seeds) or not shuffled:
        return epoch_starts, permutations, None
    number = np.full(len(seeds), -1, dtype=np.int64)
    number[shuffled] = np.arange(len(shuffled))
    number.flags.writeable = False
    return epoch_starts, permutations, number


def _numbers(first: int, stop: int) -> Iterator[int]:
    j = first
    while j < stop:
        yield j
        j += 1


def _at(source: MixSource) -> str:
    return f"{source.where}: " if source.where else ""


@functools.lru_cache(maxsize=64)
def _schedule(weights: tuple[Fraction, ...]) -> Schedule:
    """Schedules kept by their weights: building one certifies its tree in exact fractions."""
    return Schedule(weights)
