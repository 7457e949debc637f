"""Values for the checkpoint tests, and exact comparisons of them."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(array: np.ndarray) -> np.ndarray:
    """An array's raw bits, to compare exactly (a -0.0 is not a 0.0 here)."""
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.itemsize in (1, 2, 4, 8) else array


def random_finite(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Random bit patterns of a float dtype, NaN and Inf replaced: subnormals, -0.0, extremes."""
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=f"u{dtype.itemsize}")
    values = raw.view(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(values.astype(np.float64))
    values[bad] = dtype.type(-0.0)
    return values


def all_files(directory) -> list[str]:
    return sorted(os.listdir(directory))
