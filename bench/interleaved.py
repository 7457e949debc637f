"""A timing helper shared by the benchmarks (imported by them; not a benchmark itself)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(runs: dict[str, Callable[[], object]], rounds: int, *,
                        clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """The median seconds of each run, the runs taken in turn round after round (after one warm-up
    each), so that drift in the machine's load affects each alike. ``clock`` reads the time
    (wall time by default; ``time.process_time`` counts this process's CPU time only)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            run()
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def interleaved_times(runs: dict[str, Callable[[], object]], rounds: int, *,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Every timed round of each run (as :func:`interleaved_medians` takes them), for a median
    with its minimum and maximum."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            run()
            times[name].append(clock() - start)
    return times


__all__ = ["interleaved_medians", "interleaved_times"]
