"""Retention as a value: which steps stay, given every step's score, checked when it is made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pskd_jax.checkpoint import Retention
from pskd_jax.errors import PskdError


def test_the_default_keeps_every_step():
    assert Retention().kept_steps({1: None, 2: 0.5, 9: None}) == {1, 2, 9}
    assert Retention().kept_steps({}) == set()
    assert Retention(keep_period=4).kept_steps(dict.fromkeys(range(7))) == set(range(7))


def test_keep_and_keep_period():
    scores = dict.fromkeys(range(11))
    assert Retention(keep=2).kept_steps(scores) == {9, 10}
    assert Retention(keep=2, keep_period=3).kept_steps(scores) == {0, 3, 6, 9, 10}


@pytest.mark.parametrize("mode, best", [("min", {4, 2}), ("max", {7, 1})])
def test_keep_best_ranks_by_the_mode(mode, best):
    scores = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.3, 5: 0.8, 6: 0.6, 7: 0.95}
    policy = Retention(keep=1, keep_best=2, best_fn=lambda m: m, best_mode=mode)
    assert policy.kept_steps(scores) == best | {7}
    assert policy.best_step(scores) == sorted(best, key=lambda s: scores[s], reverse=mode == "max")[0]


def test_unscored_steps_are_kept_by_the_other_rules_only_and_ties_prefer_the_newer():
    policy = Retention(keep=1, keep_best=1, best_fn=lambda m: m, best_mode="max")
    assert policy.kept_steps({1: 5.0, 2: 5.0, 3: 5.0, 4: None, 5: 1.0}) == {3, 5}
    assert policy.best_step({1: None, 2: None}) is None
    assert Retention().best_step({1: 0.5}) is None  # no mode: nothing ranks


@given(st.dictionaries(st.integers(0, 2**63 - 1), st.one_of(st.none(), st.floats(-1e9, 1e9)), max_size=30),
       st.one_of(st.none(), st.integers(1, 5)), st.one_of(st.none(), st.integers(1, 7)),
       st.one_of(st.none(), st.integers(1, 3)), st.sampled_from(["min", "max"]))
def test_what_stays_is_a_subset_holding_the_newest_step(scores, keep, period, best, mode):
    policy = Retention(keep=keep, keep_period=period, keep_best=best,
                       best_fn=(lambda m: m) if best else None, best_mode=mode if best else None)
    kept = policy.kept_steps(scores)
    assert kept <= set(scores)
    if scores:
        assert max(scores) in kept
    if keep is None and best is None:
        assert kept == set(scores)
    else:
        newest = sorted(scores)[-keep:] if keep else []
        periodic = [s for s in scores if period and s % period == 0]
        ranked = policy.ranked(scores)[: best or 0]
        assert kept == {max(scores)} | set(newest) | set(periodic) | set(ranked) if scores else kept == set()


def test_a_score_is_a_finite_real_or_none():
    policy = Retention(best_fn=lambda m: m["loss"], best_mode="min")
    assert policy.score(3, {"loss": np.float32(0.25)}) == 0.25
    assert policy.score(3, {"loss": np.array(0.5)}) == 0.5
    assert policy.score(3, None) is None and Retention().score(3, {"loss": 1.0}) is None
    for metrics, code, why in (({}, "E9012", "KeyError"), ({"loss": "0.5"}, "E9014", "returned '0.5'"),
                               ({"loss": True}, "E9014", "returned True"), ({"loss": float("nan")}, "E9014", "nan"),
                               ({"loss": float("inf")}, "E9014", "inf"), ({"loss": 10**400}, "E9014", "finite")):
        with pytest.raises(PskdError) as e:
            policy.score(3, metrics)
        assert e.value.code == code and "step 3" in e.value.message and why in e.value.message


@pytest.mark.parametrize("options, fragment", [
    ({"keep": 0}, "keep=0: keep at least the newest"),
    ({"keep": np.int64(-1)}, "keep=-1"),
    ({"keep": True}, "keep=True"),
    ({"keep_period": 2.5}, "keep_period=2.5"),
    ({"keep_best": 0, "best_fn": len, "best_mode": "min"}, "keep_best=0"),
    ({"keep_best": 2}, "keep_best needs best_fn"),
    ({"best_fn": len}, "best_fn and best_mode go together"),
    ({"best_fn": len, "best_mode": "lowest"}, "best_mode='lowest'"),
    ({"best_fn": 3, "best_mode": "min"}, "best_fn=3"),
])
def test_a_bad_policy_is_e9014_naming_the_parameter(options, fragment):
    with pytest.raises(PskdError) as e:
        Retention(**options)
    assert e.value.code == "E9014" and fragment in e.value.message


def test_a_policy_is_frozen_and_its_counts_python_ints():
    policy = Retention(keep=np.int64(3))
    assert type(policy.keep) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.keep = 1  # type: ignore[misc]
