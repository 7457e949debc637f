"""Values for the checkpoint tests, and exact comparisons of them."""

from __future__ import annotations

import itertools
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


def split_into_parts(url: str, cuts: list[int], owners: list[int], parts: int) -> bytes:
    """Rewrites the object at ``url`` (a checkpoint saved by one process) as a several-process
    save leaves it: a parts index over ``parts`` part objects, written with the save's own
    :func:`~pskd_jax.checkpoint.parts.part_key` and :class:`~pskd_jax.checkpoint.parts.PartsIndex`,
    the file cut at ``cuts`` and each piece given to a part (``owners``). Returns the file's bytes."""
    from pskd_jax.checkpoint.parts import PartsIndex, part_key
    from pskd_jax.storage import resolve

    store, where = resolve(url)
    data = store.get(where.key)[0]
    bounds = [0, *cuts, len(data)]
    held: list[list[bytes]] = [[] for _ in range(parts)]
    extents: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    for (start, stop), owner in zip(itertools.pairwise(bounds), owners, strict=True):
        at = sum(len(b) for b in held[owner])
        held[owner].append(data[start:stop])
        extents[owner].append((start, stop - start, at))
    keys = [f"{part_key(where.key, p, parts)}.test" for p in range(parts)]
    for key, pieces in zip(keys, held):
        store.put(key, b"".join(pieces))
    index = PartsIndex.of(len(data), keys, [sum(map(len, h)) for h in held],
                          [np.asarray(e, np.int64).reshape(-1, 3) for e in extents], url)
    store.put(where.key, index.encoded())
    as_saved_in_parts(url)
    return data


def as_saved_in_parts(url: str) -> None:
    """Rewrites the layout object beside ``url`` (if any) as a save of parts leaves it: recording
    the version of the parts index now at ``url`` (put after it, as a save of one object's layout
    is put after its data)."""
    import json

    from pskd_jax._os.names import layout_path_for
    from pskd_jax.storage import resolve

    store, where = resolve(url)
    key = layout_path_for(where.key)
    if store.info(key) is None:
        return
    layout = json.loads(store.get(key)[0])
    layout["data"]["url"], layout["data"]["tag"] = url, store.info(where.key).tag
    store.put(key, json.dumps(layout).encode())
