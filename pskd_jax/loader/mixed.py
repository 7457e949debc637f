"""A mixture's batches as a loader reads them: (source, index) pairs and the samples they name.

A :class:`~pskd_jax.pipeline.Mixture` answers a batch with two arrays, the source of each row
and the sample index in that source. :class:`MixedBatches` presents them as one ``(rows, 2)``
int64 array a row (what the loader slices into parts and hands to a source), and
:class:`MixedSource` gathers such an array from its sources, in the mixture's order. Corpora
(``CorpusWindows``) of one access mode are read as a single corpus whose stream is theirs one
after another: one ``searchsorted`` and one fancy index a leaf over a view of all their maps, or
one positional read a window over all their files (:class:`_Joint`). Other sources each read their
own rows with one vectorised read: the source with the most rows of a batch straight into the
batch (standing in one of its own samples for the other sources' rows), and the other sources'
rows written over those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from numpy.lib.stride_tricks import as_strided

from pskd_jax.corpus.segments import gathered_windows
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import BadValueError, PskdError
from pskd_jax.format.byte_sources import Runs, first_cut_short, read_runs
from pskd_jax.format.source import RandomAccessSource, Source
from pskd_jax.pipeline.batches import IteratorState
from pskd_jax.pipeline.mixture import Mixture

__all__ = ["MixedBatches", "MixedSource"]


def _pairs(sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``(rows, 2)`` (source, index) rows, stored column by column (each column contiguous)."""
    pairs = np.empty((2, len(sources)), dtype=np.int64)
    pairs[0] = sources
    pairs[1] = indices
    return pairs.T


def _block_pairs(block: tuple[int, np.ndarray, np.ndarray]) -> tuple[int, np.ndarray]:
    """A block's first batch number and its pairs ``(batches, 2, B)``: batch k's are ``[k].T``."""
    j, sources, indices = block
    pairs = np.empty((len(sources), 2, sources.shape[1]), dtype=np.int64)
    pairs[:, 0] = sources
    pairs[:, 1] = indices
    return j, pairs


class MixedBatches:
    """A mixture over its sources' counts with the methods a loader walks a pipeline by (the
    ``n`` they take is ignored: the counts are the mixture's). Each batch is a ``(B, 2)`` array
    of (source, index) rows."""

    def __init__(self, mixture: Mixture, counts: Sequence[int]):
        self.mixture = mixture
        self.counts = mixture.check_counts(counts)
        self.batch_size = mixture.batch_size

    def __str__(self) -> str:
        return str(self.mixture)

    def batch_indices(self, n: int, epoch: int, j: int, *, start: int = 0, stop: int | None = None) -> np.ndarray:
        return _pairs(*self.mixture.batch_indices(self.counts, epoch, j, start=start, stop=stop))

    def iter_batch_numbers(self, n: int, state: IteratorState | None = None, *,
                           epochs: int | None = None) -> Iterator[tuple[IteratorState, int, int]]:
        return self.mixture.iter_batch_numbers(self.counts, state, epochs=epochs)

    def iter_batches(self, n: int, state: IteratorState | None = None, *,
                     epochs: int | None = None) -> Iterator[tuple[IteratorState, np.ndarray]]:
        blocks = self.mixture.iter_blocks(self.counts, state, epochs=epochs)  # (checked now)
        return ((IteratorState(1, j + k + 1), pairs[k].T) for j, pairs in map(_block_pairs, blocks)
                for k in range(len(pairs)))


class MixedSource:
    """The sources of a mixture (one sample type), read as one: ``gather(pairs)`` takes a
    ``(rows, 2)`` array of (source number, sample index) and gives the batch of those samples in
    row order, as the first source would give a batch of its own."""

    def __init__(self, sources: Sequence[Source]):
        self.sources = list(sources)
        # Corpora of one access mode are read as one corpus: one view over all their maps, or
        # one positional read a window over all their files.
        corpora = [s for s in self.sources if type(s) is CorpusWindows]
        alike = len(corpora) == len(self.sources) and len({c.access for c in corpora}) == 1
        self._mapped: list[CorpusWindows] = corpora if alike else []
        self._joint: _Joint | None = None

    def __len__(self) -> int:
        return sum(len(s) for s in self.sources)

    def gather(self, pairs: np.ndarray) -> Any:
        pairs = np.asarray(pairs)
        if pairs.ndim == 1:  # (a probe of one sample: the first source's)
            return self.sources[0].gather(pairs)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise BadValueError(f"a mixture's batch is (rows, 2) pairs of (source, index), got shape {pairs.shape}")
        which, indices = pairs[:, 0], pairs[:, 1]
        first = self.sources[0]
        if not len(which):
            return first.gather(indices)
        joint = self._joint_read(which, indices)
        if joint is not None:
            return self._mapped[0]._assemble(joint)
        if which.min() == which.max():  # one source only: its own gather, no copy
            return self.sources[int(which[0])].gather(indices)
        rows = [np.flatnonzero(which == i) for i in range(len(self.sources))]
        cores = [s for s in self.sources if isinstance(s, RandomAccessSource)]
        if len(cores) == len(self.sources):
            return cores[0]._assemble(_gather_in_place(cores, indices, rows))
        trees = [s.gather(indices[r]) if len(r) else None for s, r in zip(self.sources, rows)]
        structure = jax.tree_util.tree_structure(next(t for t in trees if t is not None))
        flat = [jax.tree_util.tree_leaves(t) if t is not None else None for t in trees]
        return jax.tree_util.tree_unflatten(structure, _scatter(len(which), rows, flat))

    def _joint_read(self, which: np.ndarray, indices: np.ndarray) -> list[np.ndarray] | None:
        """The batch through one view over every corpus's maps, when that applies (else None)."""
        if not self._mapped:
            return None
        states = [w._now() for w in self._mapped]
        joint = self._joint
        if joint is None or any(a is not b for a, b in zip(joint.states, states)):
            joint = self._joint = _joint_views(self._mapped, states)  # (made again after a refresh)
            if joint is None:
                self._mapped = []
                return None
        return _joint_windows(self._mapped, joint, which, indices)

    def close(self) -> None:
        self._joint, self._mapped = None, []
        for source in self.sources:
            close = getattr(source, "close", None)
            if close is not None:
                close()


@dataclasses.dataclass(eq=False)
class _Joint:
    """Several corpora's snapshots as one: their shards in one list, their maps under one view.

    Source k's token ``t`` is token ``start[k] + t`` of a joint stream (the sources one after
    another), and every per-shard table of :class:`~pskd_jax.corpus.CorpusWindows` is kept for
    that stream, so that a batch of windows from any of the sources is found, checked and read as
    a single corpus's is: one ``searchsorted``, one fancy index a leaf."""

    states: list[Any]  # each source's snapshot the views were made from (held: their maps stay open)
    inputs: np.ndarray | None  # (None with access="pread": then the files are read)
    targets: np.ndarray | None
    start: np.ndarray  # by source: where its tokens begin in the joint stream
    length: np.ndarray  # by source: its windows
    stride: np.ndarray  # by source
    bounds: np.ndarray  # searchsorted(bounds, position, "right") is a position's shard (of all of them)
    inside_end: np.ndarray  # by shard: a window starting before it fits in the shard
    shift: np.ndarray  # by shard: joint stream position → record index of the views
    files: list[Any]  # by shard: its bytes (checked for a file cut short before a copy)
    needed: list[int]  # by shard: its size when whole
    shard_start: np.ndarray  # by shard: where its tokens begin in the joint stream
    data_offsets: np.ndarray  # by shard: where its tokens begin in its file


def _joint_views(windows: list[CorpusWindows], states: list[Any]) -> _Joint | None:
    """The joint tables of ``windows`` (corpora alike, of one access mode), and with
    ``access="mmap"`` the view over their maps; None when one of them has no window to map."""
    first = windows[0]
    if any((w.dtype, w.seq, w._bound, w.segments, w.boundary) != (first.dtype, first.seq, first._bound,
                                                                   first.segments, first.boundary)
           for w in windows):
        return None
    item = first.dtype.itemsize
    start = np.cumsum([0] + [state.total_tokens for state in states[:-1]]).astype(np.int64)
    shard_starts = np.concatenate([state.offsets[:-1] + g for state, g in zip(states, start)])
    inside_end = np.concatenate([state.inside_end + g for state, g in zip(states, start)])
    inputs = targets = None
    offsets = [0] * len(states)
    if first.access == "mmap":
        if any(not len(state.inputs) for state in states):
            return None
        # Each source's views step one byte at a time from its lowest mapped token (record r is
        # the T tokens at that address plus r bytes), so one view from the lowest of them serves
        # every source, a source's records offset by the bytes between their bases.
        bases = [state.inputs.__array_interface__["data"][0] for state in states]
        low = min(bases)
        offsets = [base - low for base in bases]
        span = max(offset + len(state.inputs) for offset, state in zip(offsets, states))
        lowest = states[bases.index(low)]
        inputs = as_strided(lowest.inputs, shape=(span,), strides=(1,), writeable=False)
        targets = as_strided(lowest.targets, shape=(span,), strides=(1,), writeable=False)
    # joint stream position P in shard k of source s is record P * item + shift[k] of the views
    shift = np.concatenate([state.shift + offset - g * item for state, offset, g in zip(states, offsets, start)])
    return _Joint(states, inputs, targets, start, np.array([state.length for state in states], dtype=np.int64),
                  np.array([w.stride for w in windows], dtype=np.int64), shard_starts[1:], inside_end, shift,
                  [f for state in states for f in state.sources], [n for state in states for n in state.needed_list],
                  shard_starts, np.concatenate([state.data_offsets for state in states]))


def _joint_windows(corpora: list[CorpusWindows], joint: _Joint, which: np.ndarray, indices: np.ndarray
                   ) -> list[np.ndarray] | None:
    """A batch of windows from several mapped corpora in one fancy index a leaf, or None when
    this path does not apply (then each source reads its own rows).

    Each ``CorpusWindows(access="mmap")`` serves its windows as records of a view whose index is
    an address (see its ``_address_views``): record r is the T tokens at the view's base address
    plus r bytes. The corpora of a mixture are mapped in one process, so one view from the lowest
    of their bases serves them all (:class:`_Joint`). It applies when every source is such windows,
    alike (token dtype, T, vocabulary, segments and boundary). The rare window across two shards
    is read by its own source afterwards (the batch's other windows still read as one); anything
    else (an index out of range, a shard cut short, a token at or above the vocabulary size) goes
    to the sources' own reads, which give or refuse it as they do alone."""
    if indices.min() < 0 or not (indices < joint.length.take(which)).all():
        return None
    first = corpora[0]
    starts = indices * joint.stride.take(which)
    starts += joint.start.take(which)
    shard = joint.bounds.searchsorted(starts, side="right")
    inside = starts < joint.inside_end.take(shard)
    crossing = (~inside).nonzero()[0]
    if crossing.size == len(indices):
        return None
    if crossing.size:  # (read as one of the windows inside, then each from its own source)
        some = int(np.argmax(inside))
        starts[crossing], shard[crossing] = starts[some], shard[some]
    leaves = _joint_leaves(first, joint, starts, shard)
    if leaves is None:
        return None
    for row in crossing.tolist():  # (each from its own source, which checks and scans it)
        own = corpora[int(which[row])].gather(indices[row : row + 1])
        for leaf, part in zip(leaves, own):
            leaf[row] = part[0]
    return leaves


def _joint_leaves(first: CorpusWindows, joint: _Joint, starts: np.ndarray, shard: np.ndarray
                  ) -> list[np.ndarray] | None:
    """The leaves of the windows from joint stream positions ``starts`` (each inside ``shard``),
    checked against the vocabulary and with segments where asked, as each source's own; None
    when a source's own read is to name what is wrong (a shard cut short, a token at or above
    the vocabulary size)."""
    n, seq, dtype = len(starts), first.seq, first.dtype
    if joint.inputs is None or joint.targets is None:  # access="pread": each window one run of its file
        starts = (starts - joint.shard_start.take(shard)) * dtype.itemsize + joint.data_offsets.take(shard)
        windows = np.empty((n, seq + 1), dtype)
        try:
            read_runs(joint.files, Runs.of_rows(starts, (seq + 1) * dtype.itemsize, shard), windows, first.path)
        except PskdError:
            return None  # (the source's own read names the shard)
        return first._leaves(np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:]))
    touched = np.flatnonzero(np.bincount(shard)).tolist()
    if first_cut_short([joint.files[k] for k in touched], [joint.needed[k] for k in touched]) is not None:
        return None
    records = starts * dtype.itemsize + joint.shift.take(shard)  # a record index of the views
    checked = gathered_windows((joint.inputs, joint.targets), records, dtype, first.boundary,
                               first._bound if first._bounded else None, first.segments)
    if checked is not None:  # (copied, checked and scanned a window at a time)
        return checked[0] if checked[1] else None
    inputs = joint.inputs[records].view(dtype).reshape(n, seq)
    targets = joint.targets[records].view(dtype).reshape(n, seq)
    return first._leaves(inputs, targets)


def _gather_in_place(sources: list[RandomAccessSource], indices: np.ndarray, rows: list[np.ndarray]
                     ) -> list[np.ndarray]:
    """The batch's leaves, the source with the most rows read straight into them: it reads every
    row of the batch (the rows of the other sources as copies of one of its own samples), and the
    other sources' rows are then written over those. No batch-sized copy beyond the reads."""
    most = max(range(len(sources)), key=lambda i: len(rows[i]))
    mine = rows[most]
    filled = np.full(len(indices), indices[mine[0]], dtype=indices.dtype)
    filled[mine] = indices[mine]
    leaves = sources[most].gather_leaves(filled)
    for i, (source, r) in enumerate(zip(sources, rows)):
        if i != most and len(r):
            for leaf, part in zip(leaves, source.gather_leaves(indices[r])):
                leaf[r] = part
    return leaves


def _scatter(count: int, rows: list[np.ndarray], parts: list[list[np.ndarray] | None]) -> list[np.ndarray]:
    """Leaves of ``count`` rows: source i's leaves ``parts[i]`` written into its ``rows[i]``."""
    shown = next(p for p in parts if p is not None)
    out = [np.empty((count, *leaf.shape[1:]), dtype=leaf.dtype) for leaf in shown]
    for r, part in zip(rows, parts):
        if part is not None:
            for target, leaf in zip(out, part):
                target[r] = leaf
    return out
