"""A pipeline evaluated over sample indices: epochs, batches, take, and the iterator's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from pskd_jax._os.checks import counted
from pskd_jax.errors import BadValueError, PipelineError
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.sample_type import Dim, ParamsType, SampleType, TupleType, format_type, parse_type
from pskd_jax.pipeline.shuffle import MAX_N, MAX_SEED, held_permutation

BLOCK_POSITIONS = 1 << 14  # positions whose order the iterator computes in one pass


@dataclasses.dataclass(frozen=True)
class IteratorState:
    """The next batch an iterator produces: batch index ``batch`` (from 0) of epoch ``epoch``.

    >>> IteratorState(2, 5).to_json()
    {'epoch': 2, 'batch': 5}
    >>> IteratorState.from_json({'epoch': 2, 'batch': 5})
    IteratorState(epoch=2, batch=5)
    """

    epoch: int = 1
    batch: int = 0

    def __post_init__(self) -> None:
        for name, low in (("epoch", 1), ("batch", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise BadValueError(f"iterator state {name} must be an integer >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers become ints, for JSON

    def to_json(self) -> dict[str, int]:
        """A dict for ``json.dumps``."""
        return {"epoch": self.epoch, "batch": self.batch}

    @classmethod
    def from_json(cls, data: Any) -> IteratorState:
        """The state of a :meth:`to_json` dict (as ``json.loads`` gives it back)."""
        if not isinstance(data, dict) or set(data) != {"epoch", "batch"}:
            raise BadValueError(f"an iterator state is a dict with keys 'epoch' and 'batch', got {data!r}")
        return cls(epoch=data["epoch"], batch=data["batch"])


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """``stream path [|> shuffle(seed)] |> batch(B) [|> take(n)]`` over sample indices.

    ``path`` is resolved against the base directory (or the pipeline file's directory).

    >>> p = Pipeline("data.psk.d", seed=None, batch_size=4, take=None)
    >>> p.batches_per_epoch(10), p.batch_indices(10, epoch=1, j=1).tolist()
    (2, [4, 5, 6, 7])
    """

    path: str
    seed: int | None
    batch_size: int
    take: int | None = None
    # Where the text writes its batch stage (``pipeline:1:15``) for error messages: no part of equality.
    where: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        # The parser checks the text; these checks cover a Pipeline built directly.
        object.__setattr__(self, "batch_size", _check_stage_value("batch_size", self.batch_size, 1))
        if self.take is not None:
            object.__setattr__(self, "take", _check_stage_value("take", self.take, 1))
        if self.seed is not None:
            object.__setattr__(self, "seed", _check_stage_value("seed", self.seed, 0, MAX_SEED))

    def __str__(self) -> str:
        stages = [f'stream "{self.path}"']
        if self.seed is not None:
            stages.append(f"shuffle(seed = {self.seed})")
        stages.append(f"batch(B = {self.batch_size})")
        if self.take is not None:
            stages.append(f"take(n = {self.take})")
        return " |> ".join(stages)

    def batches_per_epoch(self, n: int) -> int:
        """floor(n / B) complete batches, at most ``take`` of them.

        >>> Pipeline("x", seed=1, batch_size=3, take=2).batches_per_epoch(10)
        2
        """
        n = _check_count(n)
        full = n // self.batch_size
        return full if self.take is None else min(full, self.take)

    def check_batches(self, n: int) -> int:
        """:meth:`batches_per_epoch`, refusing (E9010) a pipeline that makes no batch of ``n``
        samples: ``batch(B = n)`` larger than the file would give every epoch zero batches, and
        a training run would loop over nothing.

        >>> Pipeline("d.psk.d", seed=None, batch_size=8).check_batches(5)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        pskd_jax.errors.PipelineError: E9010: stream "d.psk.d" |> batch(B = 8) makes no batch of 8 from 5 samples:
            the source needs at least 8 samples, or a smaller B
        """
        count = self.batches_per_epoch(n)
        if count == 0:
            at = f"{self.where}: " if self.where else ""
            raise PipelineError(f"{at}{self} makes no batch of {self.batch_size} from {counted(n, 'sample')}: "
                                f"the source needs at least {counted(self.batch_size, 'sample')}, or a smaller B")
        return count

    def batch_indices(self, n: int, epoch: int, j: int, *, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The sample indices of batch ``j`` (from 0) of ``epoch`` (from 1): π_epoch(jB + i) for
        i < B, or jB + i without a shuffle; with ``start``/``stop``, only those of rows
        ``start <= i < stop`` (a part of a batch too large to hold its indices at once).

        int64 (uint64 only when ``n > 2**63``), shape ``(stop - start,)`` (``(B,)`` by default).
        """
        count = self.batches_per_epoch(n)
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 1:
            raise BadValueError(f"epoch must be an integer >= 1 (epochs count from 1), got epoch={epoch!r}")
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < count:
            raise BadValueError(f"batch index j must be in [0, {count}) for {self} over {n} samples, got j={j!r}")
        stop = self.batch_size if stop is None else stop
        for name, value in (("start", start), ("stop", stop)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= self.batch_size:
                raise BadValueError(f"{name} must be an integer in [0, {self.batch_size}], got {name}={value!r}")
        if stop < start:
            raise BadValueError(f"stop must be at least start, got start={start!r}, stop={stop!r}")
        return self._positions(n, int(epoch), int(j) * self.batch_size + int(start), int(stop) - int(start))

    def iter_batch_numbers(self, n: int, state: IteratorState | None = None, *,
                           epochs: int | None = None) -> Iterator[tuple[IteratorState, int, int]]:
        """Yields ``(state, epoch, j)`` for every batch :meth:`iter_batches` yields, without its
        indices (take them with :meth:`batch_indices`, in parts for a batch too large to hold
        its indices at once); the state is the one after that batch."""
        count = self._check_iteration(n, state, epochs)
        return self._numbers(count, state or IteratorState(), epochs)

    @staticmethod
    def _numbers(count: int, state: IteratorState, epochs: int | None) -> Iterator[tuple[IteratorState, int, int]]:
        epoch, j = state.epoch, state.batch
        while epochs is None or epoch <= epochs:
            while j < count:
                following = IteratorState(epoch, j + 1) if j + 1 < count else IteratorState(epoch + 1, 0)
                yield following, epoch, j
                j += 1
            epoch, j = epoch + 1, 0

    def iter_batches(
        self, n: int, state: IteratorState | None = None, *, epochs: int | None = None
    ) -> Iterator[tuple[IteratorState, np.ndarray]]:
        """Yields ``(state, indices)`` for every batch from ``state`` on (default: epoch 1, batch 0).

        The yielded state names the batch *after* the one yielded: save it once the batch is
        used, and a new iterator started from it continues with the next batch. The stream runs
        over epochs 1, 2, … forever, or up to and including epoch ``epochs``.
        """
        count = self._check_iteration(n, state, epochs)
        return self._iterate(n, count, state or IteratorState(), epochs)

    def _check_iteration(self, n: int, state: IteratorState | None, epochs: int | None) -> int:
        """The batches of an epoch, after checking what an iteration starts from."""
        count = self.check_batches(n)
        state = IteratorState() if state is None else state
        if not isinstance(state, IteratorState):
            raise BadValueError(f"state must be an IteratorState (IteratorState.from_json), got {state!r}")
        if state.batch > count:
            raise BadValueError(f"iterator state batch {state.batch} is beyond the {count} batches of an epoch of "
                                f"{self} over {n} samples")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0):
            raise BadValueError(f"epochs must be an integer >= 0 (the last epoch to produce), got {epochs!r}")
        return count

    def _iterate(
        self, n: int, count: int, state: IteratorState, epochs: int | None
    ) -> Iterator[tuple[IteratorState, np.ndarray]]:
        epoch, j = state.epoch, state.batch
        # The order is computed for a block of batches at once: one vectorised pass over
        # BLOCK_POSITIONS positions costs little more than over one batch's (the shuffle is random
        # access, so a block is as exact as batch by batch), and memory stays O(block).
        per_block = max(1, BLOCK_POSITIONS // self.batch_size)
        while epochs is None or epoch <= epochs:
            while j < count:
                block = min(per_block, count - j)
                indices = self._indices(n, epoch, j, block).reshape(block, self.batch_size)
                for k in range(block):
                    following = IteratorState(epoch, j + 1) if j + 1 < count else IteratorState(epoch + 1, 0)
                    yield following, indices[k]
                    j += 1
            epoch, j = epoch + 1, 0

    def check_batch_type(self, sample_type: str, batch_type: str) -> None:
        """Checks a file's sample type against the batch type a step expects (E9010 otherwise).

        The batch type is the sample type with a leading batch axis on every leaf, written with
        the symbol ``B`` that ``batch(B = n)`` binds (or with n itself).

        >>> p = Pipeline("d.psk.d", seed=None, batch_size=32)
        >>> p.check_batch_type("(idx[64][seq: 8], ℝ[])", "(idx[64][B, seq: 8], ℝ[B])")
        >>> p.check_batch_type("ℝ[3]", "ℝ[B, 4]")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        pskd_jax.errors.PipelineError: E9010: batch(B = 32) over samples of type 'ℝ[3]' gives batches of type
            'ℝ[32, 3]', but the step expects 'ℝ[B, 4]' (= 'ℝ[32, 4]')
        """
        check_batch_type(self.batch_size, sample_type, batch_type)

    def _indices(self, n: int, epoch: int, j: int, batches: int = 1) -> np.ndarray:
        """π_epoch(jB .. (j + batches)B - 1) without argument checks."""
        return self._positions(n, epoch, j * self.batch_size, self.batch_size * batches)

    def _positions(self, n: int, epoch: int, first: int, length: int) -> np.ndarray:
        """π_epoch(first .. first + length - 1) without argument checks."""
        dtype = np.int64 if n <= 2**63 else np.uint64
        positions = np.arange(length, dtype=dtype)
        positions += dtype(first)
        if self.seed is None:
            return positions
        return held_permutation(n, seed=self.seed, epoch=epoch)(positions)


def check_batch_type(batch_size: int, sample_type: str, batch_type: str) -> None:
    """Checks that ``batch(B = batch_size)`` over samples of ``sample_type`` gives ``batch_type``
    (written with the symbol ``B`` or with the number), E9010 otherwise."""
    sample = Layout.of_type(sample_type)
    batch = Layout.of_type(parse_type(batch_type, symbols={"B": batch_size}))
    stacked = [Leaf(leaf.path, (batch_size, *leaf.shape), leaf.bound) for leaf in sample.leaves]
    if sample.structure != batch.structure or stacked != list(batch.leaves):
        given = format_type(_with_batch_axis(parse_type(sample_type), batch_size))
        expected = format_type(parse_type(batch_type, symbols={"B": batch_size}))
        raise PipelineError(f"batch(B = {batch_size}) over samples of type {sample_type!r} gives batches of "
                            f"type {given!r}, but the step expects {batch_type!r} (= {expected!r})")


def _with_batch_axis(parsed: SampleType, batch_size: int) -> SampleType:
    """The type of a batch: a leading axis of ``batch_size`` on every leaf."""
    if isinstance(parsed, TupleType):
        return TupleType(tuple(_with_batch_axis(item, batch_size) for item in parsed.items))
    assert not isinstance(parsed, ParamsType)  # (a params type has no layout of its own: refused before)
    return dataclasses.replace(parsed, dims=(Dim(batch_size), *parsed.dims))


def _check_stage_value(name: str, value: Any, low: int, high: int | None = None) -> int:
    """A stage's value as an int in [low, high), or PskdError(BAD_PIPELINE) saying what fits."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (high and value >= high):
        accepted = f"an integer in [{low}, 2**64)" if high else f"an integer >= {low}"
        raise PipelineError(f"{name} must be {accepted}, got {name}={value!r}")
    return int(value)


def _check_count(n: Any) -> int:
    """The number of samples as an int in [0, 2**64]."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_N:
        raise BadValueError(f"n (the number of samples) must be an integer in [0, 2**64], got n={n!r}")
    return int(n)


__all__ = ["BLOCK_POSITIONS", "IteratorState", "Pipeline", "check_batch_type"]
