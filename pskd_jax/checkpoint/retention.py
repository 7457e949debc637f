"""Which checkpoints a directory keeps, as one value: :class:`Retention`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pskd_jax._os.checks import abridged, checked_integer, is_integer
from pskd_jax.errors import CheckpointDirectoryError, PskdError, UsageError

BEST_MODES = ("min", "max")


def _count(what: str, value: Any) -> int | None:
    """A retention count: None, or an integer >= 1 (E9014 otherwise)."""
    return checked_integer(value, what, low=1, error=CheckpointDirectoryError, none=True)


@dataclasses.dataclass(frozen=True)
class Retention:
    """Which steps a checkpoint directory keeps when a step is saved.

    - ``keep``: the ``keep`` newest steps;
    - ``keep_period``: also every step divisible by it;
    - ``best_fn`` with ``best_mode`` (``"min"`` or ``"max"``) and ``keep_best``: also the
      ``keep_best`` steps of best score. ``best_fn`` is called once, when a step is saved, with the
      metrics given to the save (or, when none were, its extra JSON); it returns a finite real
      number or None (no score: such steps are kept by the other rules only); anything else (NaN,
      ±inf, 10**400, a string, a bool) is refused, E9014 naming the step. Of equal scores the newer
      step ranks first.

    The newest step is always kept. Without ``keep`` and ``keep_best`` every step is kept (the
    default, ``Retention()``).

    >>> policy = Retention(keep=2, keep_period=10)
    >>> sorted(policy.kept_steps({5: None, 10: None, 15: None, 20: None, 25: None}))
    [10, 20, 25]
    >>> best = Retention(keep=1, best_fn=lambda metrics: metrics["loss"], best_mode="min", keep_best=1)
    >>> sorted(best.kept_steps({1: 0.9, 2: 0.2, 3: 0.5}))
    [2, 3]
    """

    keep: int | None = None
    keep_period: int | None = None
    keep_best: int | None = None
    best_fn: Callable[[Any], Any] | None = None
    best_mode: str | None = None

    def __post_init__(self) -> None:
        keep = self.keep
        if keep is not None and is_integer(keep) and keep < 1:
            raise CheckpointDirectoryError(f"keep={keep}: keep at least the newest checkpoint (keep >= 1, or "
                                           "None for all)")
        for what in ("keep", "keep_period", "keep_best"):
            object.__setattr__(self, what, _count(what, getattr(self, what)))
        if self.best_fn is not None and not callable(self.best_fn):
            raise CheckpointDirectoryError(f"best_fn={abridged(self.best_fn, 80)}: expected a function of a step's "
                                           "metrics")
        if (self.best_fn is None) != (self.best_mode is None):
            raise CheckpointDirectoryError(f"best_fn and best_mode go together (best_mode one of {list(BEST_MODES)}: "
                                           "whether a lower or a higher score is better)")
        if self.best_mode is not None and self.best_mode not in BEST_MODES:
            raise CheckpointDirectoryError(f"best_mode={abridged(self.best_mode, 80)}: expected one of "
                                           f"{list(BEST_MODES)}")
        if self.keep_best is not None and self.best_fn is None:
            raise CheckpointDirectoryError("keep_best needs best_fn and best_mode (what makes a checkpoint best)")

    def score(self, step: int, metrics: Any) -> float | None:
        """``best_fn`` of a step's metrics: a finite number, or None (no ``best_fn``, no metrics, or
        None returned). A failing ``best_fn`` is E9012 naming the step; a value that is not a finite
        real (NaN, ±inf, 10**400, a string, a bool) is E9014 naming it."""
        if self.best_fn is None or metrics is None:
            return None
        try:
            value = self.best_fn(metrics)
        except PskdError:
            raise
        except Exception as e:
            raise UsageError(f"step {step}: best_fn failed on its metrics: {type(e).__name__}: {e}") from e
        if value is None:
            return None
        if getattr(value, "shape", None) == () and hasattr(value, "item"):
            value = value.item()  # a numpy or JAX scalar
        refused = CheckpointDirectoryError(
            f"step {step}: best_fn returned {abridged(value)}, which is not a finite real number; the index "
            "records a score as a finite number (return None for a step without a score, a diverged run's)")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise refused
        try:
            score = float(value)  # (an int or a Fraction beyond a float's range overflows)
        except (OverflowError, ValueError, TypeError):
            raise refused from None
        if not math.isfinite(score):
            raise refused
        return score

    def ranked(self, scores: Mapping[int, float | None]) -> list[int]:
        """The scored steps, best first; of equal scores, the newer step first."""
        sign = -1.0 if self.best_mode == "min" else 1.0
        scored = [(score, step) for step, score in scores.items() if score is not None]
        return [step for _, step in sorted(scored, key=lambda pair: (sign * pair[0], pair[1]), reverse=True)]

    def best_step(self, scores: Mapping[int, float | None]) -> int | None:
        """The step of best score (None when no step has one, or without ``best_mode``)."""
        ranked = self.ranked(scores) if self.best_mode else []
        return ranked[0] if ranked else None

    def kept_steps(self, scores: Mapping[int, float | None]) -> set[int]:
        """The steps this policy keeps of ``scores`` (every step, with its score or None)."""
        steps = sorted(scores)
        if not steps or (self.keep is None and self.keep_best is None):
            return set(steps)
        kept = {steps[-1]}
        if self.keep is not None:
            kept.update(steps[-self.keep:])
        if self.keep_period is not None:
            kept.update(s for s in steps if s % self.keep_period == 0)
        if self.keep_best is not None:
            kept.update(self.ranked(scores)[: self.keep_best])
        return kept


def retention(value: Any) -> Retention:
    """``value`` as a :class:`Retention` (None: keep everything); E9012 otherwise."""
    if value is None:
        return Retention()
    if not isinstance(value, Retention):
        raise UsageError(f"retention={abridged(value, 80)}: expected Retention(...) or None")
    return value


def scores_of(entries: Iterable[Any]) -> dict[int, float | None]:
    """The score of each entry's step (entries with ``step`` and ``score``)."""
    return {entry.step: entry.score for entry in entries}


__all__ = ["BEST_MODES", "Retention", "retention", "scores_of"]
