"""A mixture's schedule: which source each position of the mixed stream takes, and how many of
that source's positions came before it.

The weights become coprime integers ``w_0 … w_{k-1}`` of total ``W`` (exactly: no float is ever
involved). Every prefix of ``L`` positions then holds ``c_i(L)`` positions of source i with
``|c_i(L) - L·w_i/W| < 1``, and the schedule repeats every ``W`` positions (``c_i(W) = w_i``).

Two constructions give such a schedule; which one a mixture uses is a function of its weights:

* **Splits** (a closed form, used whenever its certificate holds): a binary tree over the sources;
  a node that has taken ``C`` positions gives ``⌊C·A/V + 1/2⌋`` of them to its left child (``A``
  the left child's weight, ``V`` the node's) and the rest to its right child; the root takes
  every position. Position ``p`` goes down the tree to the one leaf whose count grows from ``p``
  to ``p + 1``, in O(depth) integer operations, vectorised over any array of positions.
  The tree is ``(0, 1)``, ``(0, (1, 2))`` or ``((0, 1), (2, 3))`` for two to four sources, and
  for more the one :func:`merge_order` builds. Its certificate bounds every node's deviation
  ``C - L·V/W`` by an interval, exactly (:func:`certify`); within one is proven when every leaf's
  interval lies inside (-1, 1), which always holds for trees of depth two.
* **Deadlines** (sequential, for the trees that the certificate does not prove): position ``p``
  goes to the source, among those whose next sample is not early (``c_i·W < (p + 1)·w_i``), whose
  next sample is due first (the least ``(c_i + 1)/w_i``; the lower number on a tie). A schedule
  within one exists for any weights (Tijdeman, 1980), and taking the earliest deadline among the
  samples already due finds one whenever one exists. It costs O(sources) a position, so one
  period is walked once a schedule and its sources kept (a byte a position for up to 256
  sources); any position is then a count of the kept period's prefix. A period over
  :data:`MAX_SEQUENTIAL_PERIOD` is refused (its walk, and what it keeps, would be too long).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from pskd_jax.errors import PipelineError

__all__ = [
    "COUNTED_SPAN",
    "MAX_PERIOD",
    "MAX_POSITION",
    "MAX_SEQUENTIAL_PERIOD",
    "PATTERN_PERIOD",
    "Schedule",
    "ScheduleCursor",
    "Shape",
    "certify",
    "integer_weights",
    "merge_order",
]

#: The largest total of the integer weights: the splits' arithmetic stays inside int64.
MAX_PERIOD = 2**31 - 1
#: The largest total the deadline schedule accepts (its one period, walked once and kept).
MAX_SEQUENTIAL_PERIOD = 2**20
#: Positions of a mixture's stream are below this.
MAX_POSITION = 2**63 - 1
RUN_CHUNK = 4096  # positions the splits evaluate at once
TILE_SPAN = 256  # positions of whole periods evaluated once and repeated over a longer run
#: Schedules of a period up to this many positions keep one period's sources (a few hundred KiB at
#: most, whatever the stream's length): any run of positions is then a slice of it.
PATTERN_PERIOD = 1 << 15
#: Positions :meth:`Schedule.counted` gives at once (the iterator's blocks are no longer).
COUNTED_SPAN = 1 << 14

Shape = int | tuple["Shape", "Shape"]  # a source number, or (left, right)

_FIXED_SHAPES: dict[int, Shape] = {2: (0, 1), 3: (0, (1, 2)), 4: ((0, 1), (2, 3))}


def integer_weights(weights: Sequence[Fraction | int]) -> tuple[int, ...]:
    """The weights as coprime positive integers in the same ratios.

    >>> integer_weights([Fraction(3, 2), 1, Fraction(1, 4)])
    (6, 4, 1)
    """
    fractions = [Fraction(w) for w in weights]
    scale = math.lcm(*(f.denominator for f in fractions))
    integers = [int(f * scale) for f in fractions]
    common = math.gcd(*integers)
    return tuple(i // common for i in integers)


def merge_order(weights: Sequence[int]) -> Shape:
    """The tree for five sources or more: merge the two subtrees of least key until two remain.

    A subtree's key is ``(x, weight, creation number)``; a leaf of weight w has ``x = -1/(2w)`` and
    a merge of a and b has ``x = max(x_a, x_b) + 1/(2(w_a + w_b))`` (the first taken is the left
    child). ``x`` is the bound the certificate puts on a subtree, so the merges keep it low.

    >>> merge_order([1, 1, 1, 1, 1])
    ((2, 3), (4, (0, 1)))
    """
    heap: list[tuple[Fraction, int, int, Shape]] = [(Fraction(-1, 2 * w), w, i, i) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    created = len(heap)
    while len(heap) > 2:
        x_a, w_a, _, a = heapq.heappop(heap)
        x_b, w_b, _, b = heapq.heappop(heap)
        total = w_a + w_b
        heapq.heappush(heap, (max(x_a, x_b) + Fraction(1, 2 * total), total, created, (a, b)))
        created += 1
    first, second = heapq.heappop(heap), heapq.heappop(heap)
    return first[3], second[3]


def _weight(shape: Shape, weights: Sequence[int]) -> int:
    return weights[shape] if isinstance(shape, int) else _weight(shape[0], weights) + _weight(shape[1], weights)


def _rounding_range(left: int, total: int) -> tuple[Fraction, Fraction]:
    """The least and the greatest value of ``⌊C·left/total + 1/2⌋ - C·left/total`` over integers C."""
    reduced = total // math.gcd(left, total)
    return Fraction(-((reduced + 1) // 2 - 1), reduced), Fraction(reduced // 2, reduced)


def certify(shape: Shape, weights: Sequence[int]) -> bool:
    """Whether the splits of ``shape`` keep every source within one sample of its share.

    A node's deviation ``e = C - L·V/W`` lies in an interval [lo, hi] (the root's is [0, 0]); its
    left child's deviation is ``r + ρ·e`` and its right child's ``(1 - ρ)·e - r``, with ``ρ = A/V``
    and ``r`` the rounding of the split, whose least and greatest values :func:`_rounding_range`
    gives. The source of a leaf is within one when its interval lies inside (-1, 1).

    >>> certify((0, (1, 2)), [5, 3, 1]), certify((0, (1, (2, 3))), [1, 1, 9, 1])
    (True, False)
    """
    def inside(node: Shape, low: Fraction, high: Fraction) -> bool:
        if isinstance(node, int):
            return low > -1 and high < 1
        left, right = _weight(node[0], weights), _weight(node[1], weights)
        total = left + right
        least, greatest = _rounding_range(left, total)
        share = Fraction(left, total)
        return (inside(node[0], share * low + least, share * high + greatest)
                and inside(node[1], (1 - share) * low - greatest, (1 - share) * high - least))

    return inside(shape, Fraction(0), Fraction(0))


class Schedule:
    """The schedule of a mixture of the given weights (positive ints or Fractions, at least two).

    >>> s = Schedule([3, 1])
    >>> s.kind, s.period, s.run(0, 8)[0].tolist(), s.counts(8)
    ('splits', 4, [0, 0, 1, 0, 0, 0, 1, 0], (6, 2))
    """

    def __init__(self, weights: Sequence[Fraction | int]):
        if len(weights) < 2:
            raise PipelineError(f"a schedule mixes two sources or more, got {len(weights)}")
        self.weights = integer_weights(weights)
        self.period = sum(self.weights)
        if self.period > MAX_PERIOD:
            raise PipelineError(f"the weights are {', '.join(map(str, self.weights))} as coprime integers, whose total "
                                f"{self.period} is over {MAX_PERIOD} (2**31 - 1): write them with fewer digits")
        sources = len(self.weights)
        self.shape = _FIXED_SHAPES[sources] if sources in _FIXED_SHAPES else merge_order(self.weights)
        if certify(self.shape, self.weights):
            self.kind = "splits"
            self._tree = _Tree(self.shape, self.weights)
        else:
            self.kind = "deadlines"
            if self.period > MAX_SEQUENTIAL_PERIOD:
                raise PipelineError(f"the weights are {', '.join(map(str, self.weights))} as coprime integers: no "
                                    f"closed form is proven within one sample for them, and their total {self.period} "
                                    f"is over {MAX_SEQUENTIAL_PERIOD} (2**20) for the sequential schedule: write the "
                                    "weights with fewer digits")

    def __repr__(self) -> str:
        return f"Schedule(weights={list(self.weights)}, kind={self.kind!r})"

    def run(self, first: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, count) of positions ``first … first + length - 1``: the source each takes and
        how many positions of that source come before it. Both int64."""
        return self.cursor(first).take(length)

    def cursor(self, first: int) -> ScheduleCursor:
        """A cursor at position ``first`` that yields consecutive runs of positions."""
        if not 0 <= first <= MAX_POSITION:
            raise PipelineError(f"a position of a mixture is in [0, 2**63 - 1], got {first}")
        if self.kind == "splits":
            return _TreeCursor(self._tree, first)
        return _KeptCursor(self._walked, self.weights, first)

    def sources(self, first: int, length: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """The source of each of positions ``first … first + length - 1`` (int64), and each
        source's count of the positions before ``first``: what :meth:`ScheduleCursor.take_sources`
        gives, from one period's sources kept once (for a period up to :data:`PATTERN_PERIOD`),
        so that a run anywhere in the stream costs a slice and a count, whatever the kind."""
        if not 0 <= first <= MAX_POSITION:
            raise PipelineError(f"a position of a mixture is in [0, 2**63 - 1], got {first}")
        _check_end(first, length)
        if self.period > PATTERN_PERIOD:
            return self.cursor(first).take_sources(length)
        pattern = self._pattern
        phase = first % self.period
        before = self.before(first)
        if length <= self.period:
            return pattern[phase : phase + length].copy(), before
        turn = pattern[phase : phase + self.period]
        return np.tile(turn, -(-length // self.period))[:length], before

    def before(self, first: int) -> tuple[int, ...]:
        """Each source's count of the positions before ``first`` (for a period up to
        :data:`PATTERN_PERIOD`: one count of a kept period's sources, not a walk)."""
        if self.kind == "splits":
            return self._tree.counts(first)
        if self.period > PATTERN_PERIOD:
            return self.counts(first)
        periods, phase = divmod(first, self.period)
        # whole periods give each source its weight; the phase's own, counted
        within = np.bincount(self._pattern[:phase], minlength=len(self.weights))
        return tuple(periods * w + int(c) for w, c in zip(self.weights, within))

    def counted(self, first: int, length: int, less: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray] | None:
        """What :meth:`run` gives (each position's source, and that source's count of the
        positions before it), as two slices and one gather of kept arrays: ``None`` where they are
        not kept (a period over :data:`PATTERN_PERIOD`) or do not reach (``length`` over
        :data:`COUNTED_SPAN`). The counts come from one closed form: a position ``p = P·W + q``
        (``q < W``) of source ``s`` has ``P·w_s`` positions of ``s`` in the whole periods before
        it and the kept count of ``s`` before ``q`` in the kept periods from 0. With ``less`` (an
        int64 number a source), each count less its source's number."""
        if self.period > PATTERN_PERIOD or length > COUNTED_SPAN:
            return None
        if not 0 <= first <= MAX_POSITION:
            raise PipelineError(f"a position of a mixture is in [0, 2**63 - 1], got {first}")
        _check_end(first, length)
        sources, before, weights = self._counted
        periods, phase = divmod(first, self.period)
        kind = sources[phase : phase + length]
        whole = weights * periods  # (one number a source: P·w_s stays below 2**63)
        if less is not None:
            whole -= less
        counts = whole.take(kind)
        counts += before[phase : phase + length]
        return kind.copy(), counts

    @functools.cached_property
    def _counted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sources of whole periods from position 0 reaching ``W + COUNTED_SPAN`` positions, each
        position's count of its source's positions before it there, and the weights (int64)."""
        periods = -(-(self.period + COUNTED_SPAN) // self.period)
        sources = np.tile(self._pattern[: self.period], periods)
        weights = np.array(self.weights, dtype=np.int64)
        before = np.empty(sources.size, dtype=np.int64)
        for s in range(len(self.weights)):  # (once a schedule: a pass a source)
            mine = np.flatnonzero(sources == s)
            before[mine] = np.arange(mine.size, dtype=np.int64)
        for array in (sources, before, weights):
            array.flags.writeable = False
        return sources, before, weights

    @functools.cached_property
    def _walked(self) -> np.ndarray:
        """One period's sources of a deadline schedule, walked once from its start and kept in
        the narrowest unsigned dtype that numbers the sources (a period of 2**20 positions: 1 MiB
        for up to 256 sources), so that a cursor anywhere costs a count of the kept sources, not
        a walk of O(period · sources) steps from its period's start."""
        walked = _walk_period(self.weights)
        kept = walked.astype(np.min_scalar_type(len(self.weights) - 1))
        kept.flags.writeable = False
        return kept

    @functools.cached_property
    def _pattern(self) -> np.ndarray:
        """Two periods' sources (int64, read-only)."""
        one = self.cursor(0).take(self.period)[0]
        doubled = np.concatenate([one, one])
        doubled.flags.writeable = False
        return doubled

    def counts(self, length: int) -> tuple[int, ...]:
        """How many of the first ``length`` positions each source takes (exact, any length)."""
        if self.kind == "splits":
            return self._tree.counts(length)
        return tuple(int(c) for c in _KeptCursor(self._walked, self.weights, length).counts())


class ScheduleCursor:
    """Consecutive runs of a schedule's positions from :attr:`position` on."""

    position: int

    def take(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, count) of the next ``length`` positions, int64 both."""
        raise NotImplementedError

    def take_sources(self, length: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """The source of each of the next ``length`` positions, and each source's count before
        them (a source's positions in the run then take its next counts one after another)."""
        raise NotImplementedError


class _Tree:
    """The splits as arrays: internal nodes 0 … m-1 (0 the root), leaf of source s at m + s."""

    def __init__(self, shape: Shape, weights: Sequence[int]):
        internal: list[tuple[Shape, Shape]] = []
        order: list[Shape] = [shape]
        while order:  # breadth first, so that a node's number is below its children's
            node = order.pop(0)
            if not isinstance(node, int):
                internal.append(node)
                order.extend(node)
        number = {id(node): k for k, node in enumerate(internal)}
        leaves = len(internal)

        def ref(node: Shape) -> int:
            return leaves + node if isinstance(node, int) else number[id(node)]

        size = leaves + len(weights)
        self.internal = leaves
        self.left_child = np.zeros(size, dtype=np.int64)
        self.right_child = np.zeros(size, dtype=np.int64)
        self.left_weight = np.ones(size, dtype=np.int64)
        self.weight = np.ones(size, dtype=np.int64)
        for k, (a, b) in enumerate(internal):
            self.left_child[k], self.right_child[k] = ref(a), ref(b)
            self.left_weight[k], self.weight[k] = _weight(a, weights), _weight(a, weights) + _weight(b, weights)
        self.depth = _depth(shape)
        self.nodes = [(int(self.left_child[k]), int(self.right_child[k]), int(self.left_weight[k]), int(self.weight[k]))
                      for k in range(leaves)]
        self.sources = len(weights)
        self.weights = tuple(weights)

    def run(self, first: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        if length <= RUN_CHUNK:
            return self._run(first, length)
        sources, taken = np.empty(length, dtype=np.int64), np.empty(length, dtype=np.int64)
        for lo in range(0, length, RUN_CHUNK):  # a chunk's temporaries stay in the cache
            hi = min(lo + RUN_CHUNK, length)
            sources[lo:hi], taken[lo:hi] = self._run(first + lo, hi - lo)
        return sources, taken

    def _run(self, first: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        count = np.arange(first, first + length, dtype=np.int64)
        # The root: every position, its constants as scalars (no gathers).
        left, right, a, v = self.nodes[0]
        goes_left, to_left = _split(count, a, v)
        count -= to_left
        np.copyto(count, to_left, where=goes_left)
        node = np.where(goes_left, left, right)
        for _ in range(self.depth - 1):
            active = np.flatnonzero(node < self.internal)
            if not active.size:
                break
            at, c = node[active], count[active]
            goes_left, to_left = _split(c, self.left_weight[at], self.weight[at])
            node[active] = np.where(goes_left, self.left_child[at], self.right_child[at])
            c -= to_left
            np.copyto(c, to_left, where=goes_left)
            count[active] = c
        node -= self.internal
        return node, count

    def counts(self, length: int) -> tuple[int, ...]:
        taken = [0] * len(self.nodes) + [0] * self.sources
        taken[0] = length
        for k, (left, right, a, v) in enumerate(self.nodes):
            c = taken[k]
            to_left = (c // v) * a + (2 * (c % v) * a + v) // (2 * v)
            taken[left], taken[right] = to_left, c - to_left
        return tuple(taken[self.internal:])


def _split(count: np.ndarray, a: np.ndarray | int, v: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """For a node of weight v whose left child weighs a, holding ``count`` positions before the
    one at hand: whether that one goes left, and the left child's count before it.

    ``⌊C·a/v + 1/2⌋ = ⌊C/v⌋·a + ⌊(2(C mod v)·a + v) / 2v⌋``: every product stays below 2**63.
    In place where it can: the temporaries are a chunk's size."""
    whole = count // v
    rest = whole * v
    np.subtract(count, rest, out=rest)
    rest *= 2 * a
    rest += v
    before = rest // (2 * v)
    rest += 2 * a
    rest //= 2 * v
    goes_left = np.greater(rest, before)
    whole *= a
    whole += before
    return goes_left, whole


def _check_end(position: int, length: int) -> None:
    if position + length > MAX_POSITION:
        raise PipelineError(f"positions of a mixture end at 2**63 - 1, asked for {position} + {length}")


def _depth(shape: Shape) -> int:
    return 0 if isinstance(shape, int) else 1 + max(_depth(shape[0]), _depth(shape[1]))


class _TreeCursor(ScheduleCursor):
    def __init__(self, tree: _Tree, first: int):
        self.tree, self.position = tree, first

    def take(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        _check_end(self.position, length)
        out = self.tree.run(self.position, length)
        self.position += length
        return out

    def take_sources(self, length: int) -> tuple[np.ndarray, tuple[int, ...]]:
        _check_end(self.position, length)
        before = self.tree.counts(self.position)
        period = sum(self.tree.weights)
        if period < length // 2:  # the sources repeat every period: whole periods, repeated
            span = period * max(1, TILE_SPAN // period)
            pattern = self.tree.run(self.position, span)[0]
            sources = np.tile(pattern, -(-length // span))[:length]
        else:
            sources = self.tree.run(self.position, length)[0]
        self.position += length
        return sources, before


#: Bits of a deadline's fixed-point key: ``((c + 1) << DEADLINE_BITS) // w`` orders the deadlines
#: ``(c + 1)/w`` exactly (two distinct ones differ by at least 1/(w·w') >= 2**-40 for weights up
#: to 2**20, so their keys differ; equal ones share a key) and stays below 2**63.
DEADLINE_BITS = 42


def _walk_period(weights: Sequence[int]) -> np.ndarray:
    """The sources of one period of the deadline schedule (int64), in O(log sources) a position:
    the sources not early (released) in a heap by deadline, then the source number (the lower on
    a tie); those early in a heap by the first position at which their next sample is not early
    (``c·W < (p + 1)·w`` first holds at ``p = ⌊c·W/w⌋``)."""
    period = sum(weights)
    counts = [0] * len(weights)
    ready = [(((1 << DEADLINE_BITS) // w), i) for i, w in enumerate(weights)]  # (every first sample: p = 0)
    heapq.heapify(ready)
    early: list[tuple[int, int]] = []
    order = [0] * period
    for p in range(period):
        while early and early[0][0] <= p:
            i = heapq.heappop(early)[1]
            heapq.heappush(ready, (((counts[i] + 1) << DEADLINE_BITS) // weights[i], i))
        i = heapq.heappop(ready)[1]  # (never empty: a schedule within one exists, and this walk finds it)
        order[p] = i
        c = counts[i] = counts[i] + 1
        if c < weights[i]:
            heapq.heappush(early, (c * period // weights[i], i))
    return np.array(order, dtype=np.int64)


class _KeptCursor(ScheduleCursor):
    """A deadline schedule's positions from one kept period's sources (:attr:`Schedule._walked`):
    a run is a gather of the kept sources, each source's count before it a count of the kept
    period's prefix plus its weight for every whole period."""

    def __init__(self, kept: np.ndarray, weights: Sequence[int], first: int):
        self.kept, self.position = kept, first
        self.weights = np.array(weights, dtype=np.int64)
        self._before: np.ndarray | None = None  # each source's count before the cursor (made when asked)

    def counts(self) -> np.ndarray:
        """Each source's positions before the cursor (int64; below 2**63: ``periods · w_s`` is
        at most the position)."""
        if self._before is None:
            periods, phase = divmod(self.position, len(self.kept))
            self._before = self.weights * periods + np.bincount(self.kept[:phase], minlength=len(self.weights))
        return self._before

    def take_sources(self, length: int) -> tuple[np.ndarray, tuple[int, ...]]:
        _check_end(self.position, length)
        before = self.counts()
        phase, period = self.position % len(self.kept), len(self.kept)
        if phase + length <= period:
            sources = self.kept[phase : phase + length].astype(np.int64)
        else:  # (across a period's end: the kept period again from its start)
            sources = self.kept.take(np.arange(phase, phase + length, dtype=np.int64) % period).astype(np.int64)
        self._before = before + np.bincount(sources, minlength=len(self.weights))
        self.position += length
        return sources, tuple(int(c) for c in before)

    def take(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        sources, before = self.take_sources(length)
        # Each position's count: its source's count before the run, plus the positions of that
        # source earlier in the run (its rank among them, from a stable sort by source).
        order = np.argsort(sources, kind="stable")
        grouped = sources[order]
        ranks = np.arange(length, dtype=np.int64) - np.searchsorted(grouped, grouped, side="left")
        counts = np.empty(length, dtype=np.int64)
        counts[order] = np.array(before, dtype=np.int64)[grouped] + ranks
        return sources, counts
