"""A timing helper shared by the benchmarks (imported by them; not a benchmark itself).

Every figure is a ratio of two cases measured in the same run, taken in turn (A B A B …) so that
drift in the machine's load hits both alike, and reported as a median with the range seen.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence


def interleaved_times(runs: dict[str, Callable[[], object]], rounds: int, *,
                      clock: Callable[[], float] = time.perf_counter,
                      before: Callable[[str], object] | None = None,
                      warm: bool = True) -> dict[str, list[float]]:
    """The seconds of each run, every round, the runs taken in turn round after round (after one
    warm-up each unless ``warm=False``). ``before(name)`` runs untimed before each timed run (to
    remove an output, sync the disk …). ``clock`` reads the time (wall time by default;
    ``time.process_time`` counts this process's CPU time only)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    if warm:
        for name, run in runs.items():
            if before:
                before(name)
            run()
    for _ in range(rounds):
        for name, run in runs.items():
            if before:
                before(name)
            start = clock()
            run()
            times[name].append(clock() - start)
    return times


def interleaved_medians(runs: dict[str, Callable[[], object]], rounds: int, *,
                        clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """The median seconds of each run of :func:`interleaved_times`."""
    return {name: statistics.median(values) for name, values in interleaved_times(runs, rounds, clock=clock).items()}


def process_times(commands: dict[str, Sequence[str]], rounds: int, *, env: dict[str, str] | None = None,
                  before: Callable[[str], object] | None = None, warm: bool = True) -> dict[str, list[float]]:
    """Wall seconds of whole processes, each command run in turn round after round (as
    ``hyperfine`` would, interleaved): start-up, imports and exit included. A command that fails
    raises ``CalledProcessError``."""
    environment = {**os.environ, **(env or {})}

    def runner(command: Sequence[str]) -> Callable[[], object]:
        return lambda: subprocess.run(list(command), check=True, env=environment,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    return interleaved_times({name: runner(c) for name, c in commands.items()}, rounds, before=before, warm=warm)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def ratio_spread(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The ratio of the medians of ``a`` and ``b``, and the range of the per-round ratios (round i
    of ``a`` over round i of ``b``: the two were run back to back)."""
    per_round = [x / y for x, y in zip(a, b) if y > 0]
    return statistics.median(a) / statistics.median(b), min(per_round), max(per_round)


def seconds_text(values: Sequence[float]) -> str:
    """``median s (min–max)``."""
    median, low, high = spread(values)
    return f"{median:8.4f} s ({low:.4f}–{high:.4f})"


def ratio_text(a: Sequence[float], b: Sequence[float]) -> str:
    """``ratio (min–max of the rounds' ratios)``."""
    median, low, high = ratio_spread(a, b)
    return f"{median:5.2f} ({low:.2f}–{high:.2f})"


def load_text() -> str:
    """The machine's load averages and core count, to print beside the figures."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load: unknown"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


__all__ = ["interleaved_medians", "interleaved_times", "load_text", "process_times", "ratio_spread",
           "ratio_text", "seconds_text", "spread"]
