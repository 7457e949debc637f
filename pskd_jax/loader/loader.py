"""Feeding a ``jit``-compiled step: batches of indices → host arrays → device arrays, ahead of time.

A :class:`Loader` walks a pipeline's batches of sample indices, gathers each batch from its source
(one vectorised read per leaf or record, no per-sample Python work) and ``jax.device_put``s it on
background threads (one gathers, one places what it gathered), a bounded number of batches ahead,
in pipeline order. Its own memory is that of the batches in flight, never of the dataset; over a
``Reader(path, access="pread")`` so is the process's whole resident set (with the default memory
map, the file pages the loop visits count in RSS as clean page cache).

With a ``jax.sharding.Sharding`` each batch lands sharded along its batch axis. Under several JAX
processes each process gathers only the rows of the global batch that its own devices hold and
the global array is assembled with ``jax.make_array_from_process_local_data``.

The iterator state is global — (epoch, batch index) — so a run saved under two processes resumes
under one, or under four devices, with the same global batches.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from pskd_jax.errors import BadValueError, PipelineError, UsageError
from pskd_jax.format.source import Source
from pskd_jax.loader import opening, placing
from pskd_jax.pipeline.batches import IteratorState

_DONE = object()
GROUP_SIZE = 32  # the most host batches gathered in one read and moved to the device by one device_put call
PREFETCH_BYTES = 16 << 20  # the default prefetch: as many batches as this many bytes hold, 2 to GROUP_SIZE
UNSIZED_PREFETCH = 8  # the default prefetch over a source that does not say how large its samples are
PART_ROWS = 1 << 20  # a batch of more rows is gathered in parts: its indices never all at once
GATHERED_AHEAD = 1  # groups gathered (on the gathering thread) ahead of the one being placed


class _GatheringThread:
    """One thread running the gathers handed to it, in turn. A daemon, as the loader's own thread
    is: a process that ends while a gather waits on a store does not wait for it (a pool's
    threads would be joined at exit)."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[concurrent.futures.Future, Any, tuple] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pskd-loader-gather", daemon=True)
        self._thread.start()

    def submit(self, call: Any, *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((future, call, args))
        return future

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, call, args = task
            if not future.set_running_or_notify_cancel():  # (cancelled before it began)
                continue
            try:
                future.set_result(call(*args))
            except BaseException as e:  # (the loader's thread re-raises it from result())
                future.set_exception(e)
            del task, future

    def close(self) -> None:
        """Ends the thread once the gathers handed to it have run or been cancelled (a running one
        returns first)."""
        self._tasks.put(None)
        self._thread.join()


def local_rows(sharding: jax.sharding.Sharding, global_shape: Sequence[int]) -> tuple[int, int]:
    """The rows [start, stop) of a global batch that this process's devices hold.

    A process's devices must hold one contiguous block of rows (as every mesh laid out with the
    batch axis outermost does); anything else is refused rather than read twice.
    """
    batch = int(global_shape[0])
    spans = set()
    for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
        start, stop, _ = index[0].indices(batch) if index else (0, batch, 1)
        spans.add((start, stop))
    start, stop = min(s for s, _ in spans), max(e for _, e in spans)
    covered = np.zeros(stop - start, dtype=bool)
    for s, e in spans:
        covered[s - start : e - start] = True
    if not covered.all():
        raise PipelineError(f"this process's devices hold rows {sorted(spans)} of the batch, not one contiguous block")
    return start, stop


class Loader:
    """Iterates device batches in the order of a pipeline, from what its text streams.

    ``Loader(pipeline, seq=T)`` opens the ``.psk.d`` file, the corpus (windows of ``seq`` tokens,
    every ``stride``; ``segments=True`` adds their segment ids and positions) or every source of
    the ``mix(…)`` the text names, relative paths joined to ``base_dir`` (default: the current
    directory); ``access`` and ``verify`` are the sources' own options. ``pipeline`` is the text, a
    pipeline file (a ``pathlib.Path``), a Pipeline or a Mixture. ``Loader(source, pipeline)`` (or
    ``source=``; a list of sources for a mix) reads the source given, checked against the text
    (E9010 when it reads another file). See :mod:`pskd_jax.loader.opening`.

    ``state`` resumes at a saved :class:`IteratorState`; ``epochs`` bounds the run (default:
    forever); ``prefetch`` is how many batches wait on the device ahead of the step (default: as
    many as 16 MiB hold, from 2 to 32). Batches are gathered in groups of up to ``prefetch`` (at
    most 32): one read of the source and one ``device_put`` call a group, handed to the loop
    whole. A group's batches are views of one new host buffer, which the CPU backend's
    ``device_put`` uses in place when it is 64-byte aligned (a Reader's gathers are), so a batch
    kept alive may keep its group's host memory; no buffer is ever filled twice, so a batch the
    loop holds never changes. A source that fails stops the loop at the group it fails in.

    Iterate it in a ``for`` loop; ``loader.state`` is then the state to save with a checkpoint
    (the next batch the loop will receive). Breaking out of the loop, or an exception in it, stops
    the background thread; so does ``close()`` or leaving a ``with`` block.
    """

    def __init__(
        self,
        pipeline_or_source: Any,
        pipeline: Any = None,
        *,
        source: Source | Sequence[Source] | None = None,
        seq: int | None = None,
        stride: int | None = None,
        segments: bool = False,
        base_dir: str | os.PathLike[str] | None = None,
        access: str | None = None,
        verify: bool = False,
        sharding: jax.sharding.Sharding | None = None,
        state: IteratorState | None = None,
        epochs: int | None = None,
        prefetch: int | None = None,
    ):
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise PipelineError(f"prefetch must be an integer >= 1 (or None: sized by the batch's bytes), got "
                                f"{prefetch!r}")
        if pipeline is not None:
            if source is not None:
                raise UsageError("a source given twice: Loader(source, pipeline) or Loader(pipeline, source=…)")
            pipeline_or_source, source = pipeline, pipeline_or_source
        options = opening.WindowOptions(seq, stride, segments, access, verify)
        opened = opening.open_pipeline(pipeline_or_source, source, options, base_dir)
        self.source = opened.source
        self.pipeline = opened.pipeline  # a mixture's as (source, index) rows: opening.MixedBatches
        self.text = opened.text  # the Pipeline or Mixture of the text
        self._owned = opened.owned  # the sources opened here, closed when a with block ends
        self.sharding = sharding
        self.epochs = epochs
        self.prefetch = prefetch if prefetch is not None else self._default_prefetch()
        prefetch = self.prefetch
        self.state = state if state is not None else IteratorState()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None
        self._taking: list[tuple[IteratorState, Any]] = []  # the rest of the group the loop takes from
        self.waited_seconds = 0.0  # time the consumer spent waiting for a batch
        # Batches are gathered and moved to the device in groups (see _host_groups and _place):
        # whole groups wait in the queue, about ``prefetch`` batches.
        self.group_size = min(prefetch, GROUP_SIZE)
        # At most: the groups in the queue (``prefetch`` batches, rounded down to whole groups),
        # the group being placed, the one gathered ahead of it, and the group the loop is taking
        # its batches from.
        queued = max(self.group_size, prefetch - prefetch % self.group_size)
        self.in_flight = queued + (2 + GATHERED_AHEAD) * self.group_size
        self._wide_leaves: list[int] | None = None
        try:
            opening.check_divides(sharding, self.pipeline.batch_size)
            opening.check_batch_fits(self.source, self.pipeline.batch_size, self.in_flight)
            # (the state and epochs checked now, as iterating checks them: not at the first batch)
            self.pipeline.iter_batches(len(self.source), self.state, epochs=self.epochs)
        except BaseException:
            self.close_sources()
            raise

    def _default_prefetch(self) -> int:
        """As many batches as PREFETCH_BYTES hold (2 to GROUP_SIZE): the fixed cost of a gather
        and of a device_put call is then shared by many small batches, and large ones are not
        held by the dozen."""
        sample = opening.sample_bytes(self.source)
        if sample is None:
            return UNSIZED_PREFETCH
        batch = sample * self.pipeline.batch_size
        return GROUP_SIZE if batch == 0 else min(GROUP_SIZE, max(2, PREFETCH_BYTES // batch))

    # -- placing one batch -------------------------------------------------------------------

    def _local_rows(self, batch_size: int) -> tuple[int, int]:
        """The rows of each global batch this process gathers: all of them on a single process."""
        if self.sharding is None or jax.process_count() == 1:
            return 0, batch_size
        sample = jax.tree_util.tree_leaves(self.source.gather(np.zeros(1, dtype=np.int64)))[0]
        return local_rows(self.sharding, (batch_size, *np.shape(sample)[1:]))

    def _check_fits_jax(self, host_batch: Any) -> None:
        """Refuses 64-bit leaves while JAX's x64 is disabled: device_put would narrow them silently.

        Dtypes are fixed by the source's layout, so they are looked at once; a u64 leaf (an idx
        bound above 2^32) is then checked batch by batch for values that 32 bits cannot hold."""
        if jax.config.jax_enable_x64:  # type: ignore[attr-defined]  # a flag JAX's stubs do not declare
            return
        leaves = jax.tree_util.tree_leaves(host_batch)
        if self._wide_leaves is None:
            for leaf in leaves:
                if leaf.dtype == np.float64:
                    self._refuse_wide(host_batch, leaf)
            self._wide_leaves = [i for i, leaf in enumerate(leaves) if leaf.dtype == np.uint64]
        for i in self._wide_leaves:
            if leaves[i].size and leaves[i].max() >= 2**32:
                self._refuse_wide(host_batch, leaves[i])

    @staticmethod
    def _refuse_wide(host_batch: Any, wide: np.ndarray) -> None:
        for path, leaf in jax.tree_util.tree_flatten_with_path(host_batch)[0]:
            if leaf is wide:
                raise BadValueError(f"leaf {jax.tree_util.keystr(path) or '(root)'} is {leaf.dtype} but JAX has x64 "
                                    "disabled, which would narrow it silently; enable it "
                                    "(jax.config.update('jax_enable_x64', True)) or store the leaf narrower")

    def _place(self, host_batches: list[Any], batch_size: int) -> list[Any]:
        """Host batches → device batches. One ``device_put`` call moves a whole group: its fixed
        cost is then paid once a group, not once a batch."""
        if self.sharding is None:
            return placing.put_on_default_device(host_batches)  # (jax.device_put's arrays, less its overhead)
        if jax.process_count() == 1:
            return jax.device_put(host_batches, self.sharding)
        return [
            jax.tree_util.tree_map(
                lambda local: jax.make_array_from_process_local_data(
                    self.sharding, local, (batch_size, *local.shape[1:])
                ),
                host,
            )
            for host in host_batches
        ]

    # -- the background thread ---------------------------------------------------------------

    def _host_groups(self, state: IteratorState) -> Generator[list[tuple[IteratorState, Any]], None, None]:
        """Groups of up to ``group_size`` (following state, host batch) for every batch from
        ``state`` on, each batch the rows this process holds. A group's rows are gathered in one
        read (one call of the source for the group, not one a batch) and the group's batches are
        views of it, each starting where the one before ends; their leaves are checked against
        JAX's x64 once a group.

        The reads run on a thread of their own, a group ahead: while this thread places group k
        on the device (and works out the order of group k + 2), that one gathers group k + 1. A
        gather lets go of the interpreter lock while it copies, so on two cores the copy and the
        placing overlap instead of taking turns; the source is still read by one thread at a time,
        in the pipeline's order. A batch larger than PART_ROWS rows is gathered on its own, in
        parts of PART_ROWS indices, on this thread (its indices would take more memory than the
        batch itself when samples are small)."""
        if self.pipeline.batch_size * self.group_size > PART_ROWS:
            yield from self._large_groups(state)
            return
        gathering = _GatheringThread()
        ahead: collections.deque[concurrent.futures.Future] = collections.deque()
        try:
            for pending in self._index_groups(state):
                ahead.append(gathering.submit(self._gather_group, pending))
                if len(ahead) == GATHERED_AHEAD + 1:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:  # (stopped, or a gather failed: the reads not yet begun are dropped)
            for waiting in ahead:
                waiting.cancel()
            gathering.close()

    def _index_groups(self, state: IteratorState) -> Iterator[list[tuple[IteratorState, np.ndarray]]]:
        """Groups of up to ``group_size`` (following state, indices of this process's rows)."""
        n = len(self.source)
        batch_size = self.pipeline.batch_size
        rows = None
        pending: list[tuple[IteratorState, np.ndarray]] = []
        for following, indices in self.pipeline.iter_batches(n, state, epochs=self.epochs):
            rows = self._local_rows(batch_size) if rows is None else rows
            pending.append((following, indices[rows[0] : rows[1]]))
            if len(pending) == self.group_size:
                yield pending
                pending = []
        if pending:
            yield pending

    def _large_groups(self, state: IteratorState) -> Iterator[list[tuple[IteratorState, Any]]]:
        group: list[tuple[IteratorState, Any]] = []
        for following, host in self._large_batches(state):
            self._check_fits_jax(host)
            group.append((following, host))
            if len(group) == self.group_size:
                yield group
                group = []
        if group:
            yield group

    def _gather_group(self, pending: list[tuple[IteratorState, np.ndarray]]) -> list[tuple[IteratorState, Any]]:
        if len(pending) == 1:
            host = self.source.gather(pending[0][1])
            self._check_fits_jax(host)
            return [(pending[0][0], host)]
        joined = self.source.gather(np.concatenate([indices for _, indices in pending]))
        self._check_fits_jax(joined)
        leaves, structure = jax.tree_util.tree_flatten(joined)
        group, start = [], 0
        for following, indices in pending:
            stop = start + len(indices)
            group.append((following, jax.tree_util.tree_unflatten(structure, [leaf[start:stop] for leaf in leaves])))
            start = stop
        return group

    def _large_batches(self, state: IteratorState) -> Iterator[tuple[IteratorState, Any]]:
        """(following state, host batch) for batches of more than PART_ROWS rows, each gathered
        in parts of PART_ROWS indices."""
        n = len(self.source)
        batch_size = self.pipeline.batch_size
        rows = None
        for following, epoch, j in self.pipeline.iter_batch_numbers(n, state, epochs=self.epochs):
            rows = self._local_rows(batch_size) if rows is None else rows
            parts = [self.source.gather(self.pipeline.batch_indices(n, epoch, j, start=a,
                                                                    stop=min(a + PART_ROWS, rows[1])))
                     for a in range(rows[0], max(rows[1], rows[0] + 1), PART_ROWS)]
            yield following, jax.tree_util.tree_map(lambda *leaves: np.concatenate(leaves), *parts)

    def _produce(self, state: IteratorState) -> None:
        out = self._queue
        assert out is not None  # (made by _start before the thread that runs this)
        groups = self._host_groups(state)
        try:
            batch_size = self.pipeline.batch_size
            for group in groups:
                placed = self._place([host for _, host in group], batch_size)
                # A group is one item of the queue: one hand-over between the threads a group.
                if not self._put(out, [(following, batch) for (following, _), batch in zip(group, placed)]):
                    return
                del group, placed
            self._put(out, _DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(out, e)
        finally:
            groups.close()  # (the gathering thread ends with it: nothing is read after the loader stops)

    def _put(self, out: queue.Queue, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _start(self) -> None:
        self.close()
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=max(1, self.prefetch // self.group_size))  # (of groups)
        self._thread = threading.Thread(target=self._produce, args=(self.state,), name="pskd-loader",
                                        daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        self._start()
        try:
            while True:
                started = time.perf_counter()
                made = self._queue
                assert made is not None  # (made by _start; gone only after close() inside the loop, a misuse)
                item = made.get()
                self.waited_seconds += time.perf_counter() - started
                if item is _DONE:
                    return
                if isinstance(item, MemoryError):
                    raise PipelineError(f"{self.text}: a batch of {self.pipeline.batch_size} samples does not fit "
                                        "in memory; a smaller B (or prefetch)") from item
                if isinstance(item, BaseException):
                    raise item
                item.reverse()  # (popped from the end: a batch yielded is no longer held here)
                self._taking = item
                while item:
                    self.state, batch = item.pop()
                    yield batch
                    del batch
        finally:
            self.close()

    def waiting(self) -> int:
        """How many batches are ready on the device for the loop's next steps: the rest of the
        group the loop takes its batches from, and those of the groups in the queue."""
        made = self._queue
        if made is None:
            return 0
        with made.mutex:
            queued = sum(len(item) for item in made.queue if isinstance(item, list))
        return len(self._taking) + queued

    def close(self) -> None:
        """Stops the background thread and drops the batches in flight."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._thread = None
        self._queue = None
        self._taking = []

    def close_sources(self) -> None:
        """Closes the sources the loader opened itself (none when it was given its source)."""
        owned, self._owned = getattr(self, "_owned", []), []
        for source in owned:
            source.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        self.close_sources()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


__all__ = ["GROUP_SIZE", "Loader", "local_rows"]
