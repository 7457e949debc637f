"""Host batches → arrays on the default device, a group at a time, for about the cost of the move.

``jax.device_put`` spends 60–90 µs of Python on each array it is given (checks, the primitive's
dispatch), whatever its size: over a group of small batches that is most of the Loader's work. Of
that the move itself is one call into jaxlib, ``pxla.batched_device_put`` (5–7 µs), which
``jax.device_put`` ends in for a numpy array. :func:`put_on_default_device` makes that call
itself where its outcome is known to be what ``jax.device_put`` would give — C-contiguous numpy
leaves whose dtype JAX keeps as it is (no 64-bit narrowing under disabled x64), to the default
device, uncommitted as ``jax.device_put(x)`` leaves them — and hands everything else, and every
group when the call is not there (another JAX), to ``jax.device_put``.

The first leaf of each group goes through ``jax.device_put``: its device is the default device
the rest go to, and its result is checked against the fast call's once a process (value,
dtype, device, commitment, and whether the host buffer is used in place); a difference turns
the fast call off for good.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import numpy as np

try:  # (jaxlib's call behind jax.device_put; absent from a JAX that moved it: then not used)
    from jax._src.core import ShapedArray as _ShapedArray
    from jax._src.interpreters.pxla import batched_device_put as _batched_device_put
except ImportError:  # pragma: no cover - depends on the JAX installed
    _batched_device_put = None  # type: ignore[assignment]

_state = {"checked": False, "usable": _batched_device_put is not None}
_lock = threading.Lock()


def put_on_default_device(trees: list[Any]) -> list[Any]:
    """``jax.device_put(trees)``: each tree's leaves on the default device, the same arrays."""
    leaves, structure = jax.tree_util.tree_flatten(trees)
    if not leaves or not _state["usable"] or not all(_plain(leaf) for leaf in leaves):
        return jax.device_put(trees)
    first = jax.device_put(leaves[0])
    if first.dtype != leaves[0].dtype:  # (JAX changed the dtype after all: the slow path for all)
        return jax.device_put(trees)
    sharding = first.sharding
    if not _state["checked"] and not _check(leaves[0], first, sharding):
        return jax.device_put(trees)
    device = [first.device]
    placed = [first] + [_batched_device_put(_aval(leaf.shape, leaf.dtype), sharding, [leaf], device,
                                            committed=False) for leaf in leaves[1:]]
    return jax.tree_util.tree_unflatten(structure, placed)


@functools.lru_cache(maxsize=64)
def _aval(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """The abstract value of leaves of ``shape`` and ``dtype`` (made once: a group's batches,
    and every group after it, share them; making one costs half the move)."""
    return _ShapedArray(shape, dtype)


def _plain(leaf: Any) -> bool:
    """A leaf the fast call takes as ``jax.device_put`` would: a C-contiguous numpy array of a
    dtype JAX keeps (no narrowing, no object or structured dtype)."""
    if type(leaf) is not np.ndarray or not leaf.flags.c_contiguous or leaf.dtype.hasobject or leaf.dtype.fields:
        return False
    try:
        return bool(jax.dtypes.canonicalize_dtype(leaf.dtype) == leaf.dtype)  # (bf16 and the like: kept)
    except (TypeError, ValueError):
        return False


def _check(leaf: np.ndarray, expected: jax.Array, sharding: Any) -> bool:
    """Whether the fast call gives what ``jax.device_put`` gave for ``leaf`` (once a process)."""
    with _lock:
        if _state["checked"]:
            return bool(_state["usable"])
        try:
            got = _batched_device_put(_aval(leaf.shape, leaf.dtype), sharding, [leaf], [expected.device],
                                      committed=False)
            same = (got.dtype == expected.dtype and got.shape == expected.shape and got.sharding == sharding
                    and got.committed == expected.committed and type(got) is type(expected)
                    and np.array_equal(np.asarray(got), np.asarray(expected), equal_nan=True)
                    and _in_place(got, leaf) == _in_place(expected, leaf))
        except Exception:  # (a JAX whose call takes other arguments)
            same = False
        _state["usable"], _state["checked"] = same, True
        return same


def _in_place(array: jax.Array, leaf: np.ndarray) -> bool | None:
    """Whether ``array`` uses ``leaf``'s memory (None where the backend does not say)."""
    try:
        return bool(array.unsafe_buffer_pointer() == leaf.ctypes.data)
    except Exception:
        return None


__all__ = ["put_on_default_device"]
