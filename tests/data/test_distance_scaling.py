"""diff scales each norm by its own largest value: a's values are never flushed to zero by b's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pskd_jax.data import diff
from pskd_jax.format import write


def pair(tmp_path, a, b):
    pa, pb = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    write(pa, f"ℝ[{len(a)}]", np.array([a], dtype=np.float64), durable=False)
    write(pb, f"ℝ[{len(b)}]", np.array([b], dtype=np.float64), durable=False)
    return diff(pa, pb)


@pytest.mark.parametrize("tiny", [-9.812829121142502e-281, 5e-324, 1e-300])
def test_a_tiny_a_against_a_huge_b_keeps_its_norm(tmp_path, tiny):
    d = pair(tmp_path, [tiny], [-1e308])
    assert d.a_norm == abs(tiny)
    assert d.diff_norm == 1e308 and d.relative == math.inf  # (1e308 / tiny is beyond f64)


def test_each_norm_keeps_its_small_values_beside_large_ones(tmp_path):
    a = [3e-300, 4e-300, 0.0]
    b = [0.0, 0.0, 1e300]
    d = pair(tmp_path, a, b)
    assert d.a_norm == pytest.approx(5e-300, rel=1e-15)  # (not 0: a common scale with b flushed it)
    assert d.diff_norm == 1e300  # (a's values are below 1e300's last bit)
    assert d.relative == math.inf
