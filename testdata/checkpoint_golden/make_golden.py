"""Writes the golden checkpoints: trees that use only the stored mappings of the first format
(f64, f32, bf16, unsigned integers, bool). Run once, before the checkpoint dtype mappings changed;
tests/checkpoint/test_dtypes.py saves the same trees and compares the files byte for byte."""

import os
import sys

import ml_dtypes
import numpy as np


def golden_trees():
    """name → tree; deterministic values (no random generator whose stream could change)."""
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / np.float32(3)
    return {
        "plain": {
            "w": w,
            "b": (np.arange(5) / 7 - 0.3).astype(ml_dtypes.bfloat16),
            "scale": np.float64(0.125),
            "blocks": [{"k": np.arange(4.0).reshape(2, 2) / 3}, {"k": -np.arange(4.0).reshape(2, 2)}],
            "count": np.uint32(7),
            "ids": np.arange(6, dtype=np.uint8).reshape(2, 3),
            "big": np.array([0, 2**64 - 1], dtype=np.uint64),
            "h": np.uint16(65535),
            "lr": 0.001,
            "mask": np.array([True, False, True]),
        },
        "all_f64": {"a": np.linspace(0, 1, 7), "b": [np.float64(-2.5), np.zeros((0, 3))]},
        "tuple": (np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.uint8)),
        "single": np.arange(5, dtype=np.float64),
        "bools": (np.array([[True, False]]), np.float32(2.5)),
    }


if __name__ == "__main__":
    from pskd_jax import checkpoint as ck

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, tree in golden_trees().items():
        ck.save(os.path.join(out, name + ".psk.d"), tree)
