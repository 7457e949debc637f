"""Boxes of a row-major tensor as contiguous runs of the file that stores it.
"""

from __future__ import annotations

import math

import numpy as np

from pskd_jax._os.positional import read_into
from pskd_jax.errors import MismatchError


def region_runs(shape: tuple[int, ...], index: tuple) -> tuple[tuple[int, ...], list[int], int]:
    """A box of a row-major tensor as contiguous runs: (box shape, element offset of each run,
    elements per run)."""
    starts, sizes = [], []
    for dim, s in zip(shape, tuple(index) + (slice(None),) * (len(shape) - len(index))):
        start, stop, step = s.indices(dim)
        if step != 1:
            raise MismatchError(f"a shard with step {step} along an axis")
        starts.append(start)
        sizes.append(max(0, stop - start))
    j = len(shape)
    while j > 0 and sizes[j - 1] == shape[j - 1]:
        j -= 1
    # axes j.. are whole; axis j-1 (if any) is partial and still contiguous within one run
    if j == 0:
        return tuple(sizes), [0], math.prod(shape)
    inner = math.prod(shape[j:])
    run = sizes[j - 1] * inner
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
    outer = [range(starts[k], starts[k] + sizes[k]) for k in range(j - 1)]
    base = starts[j - 1] * strides[j - 1]
    offsets = []
    for position in np.ndindex(*[len(r) for r in outer]) if outer else [()]:
        offsets.append(base + sum((starts[k] + p) * strides[k] for k, p in enumerate(position)))
    return tuple(sizes), offsets, run


def read_region(fd: int, path: str, offset: int, shape: tuple[int, ...], disk: np.dtype,
                value: np.dtype, index: tuple) -> np.ndarray:
    """The box ``index`` of a leaf stored at ``offset``, read run by run with preadv."""
    box, runs, run = region_runs(shape, index)
    out = np.empty(box, dtype=value)
    flat = out.reshape(-1).view(np.uint8)
    run_bytes = run * disk.itemsize
    for k, start in enumerate(runs):
        if run_bytes:
            read_into(fd, flat[k * run_bytes : (k + 1) * run_bytes].data, offset + start * disk.itemsize, path)
    return out


__all__ = ["read_region", "region_runs"]
