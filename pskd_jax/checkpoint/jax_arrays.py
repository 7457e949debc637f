"""Meeting JAX arrays without importing JAX before a device array is needed.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np


def jax_module():
    """JAX, imported when device arrays are made (never at import: the data tools stay free of it)."""
    return importlib.import_module("jax")


def is_array_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def is_global(value: Any) -> bool:
    """A JAX array spread over several processes (no process holds all of it)."""
    return is_array_like(value) and getattr(value, "is_fully_addressable", True) is False


def wants_jax(spec: Any) -> bool:
    if spec is None or isinstance(spec, np.ndarray) or not is_array_like(spec):
        return False
    module = type(spec).__module__ or ""
    return module.startswith(("jax", "jaxlib"))


def sharding_of(spec: Any) -> Any:
    return getattr(spec, "sharding", None) if wants_jax(spec) else None


def single_device(sharding: Any) -> bool:
    return len(sharding.device_set) == 1


def is_key_dtype(dtype: Any) -> bool:
    """A typed PRNG key dtype (``key<fry>``); False without JAX imported (no key exists then)."""
    jax = sys.modules.get("jax")
    if jax is None or dtype is None or isinstance(dtype, np.dtype):
        return False
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def is_key_array(value: Any) -> bool:
    """A typed PRNG key array, or its ``ShapeDtypeStruct``."""
    return is_array_like(value) and is_key_dtype(getattr(value, "dtype", None))


def key_impl_of(dtype: Any) -> tuple[str, int]:
    """A key dtype's implementation name and the uint32 words per key."""
    impl = dtype._impl
    return str(impl.name), int(np.prod(impl.key_shape, dtype=np.int64))


def key_data(value: Any) -> Any:
    """A key array's data, uint32 with the key words as a last axis (a JAX array)."""
    jax = jax_module()
    data = jax.random.key_data(value)
    # (the words per key named, never -1: a zero-size key array has no elements to divide by)
    return data.reshape(tuple(value.shape) + (key_impl_of(value.dtype)[1],))


def wrap_keys(data: Any, impl: str) -> Any:
    """Key data (uint32, the key words last) as a typed key array of implementation ``impl``."""
    return jax_module().random.wrap_key_data(data, impl=impl)


__all__ = [
    "is_array_like",
    "is_global",
    "is_key_array",
    "is_key_dtype",
    "jax_module",
    "key_data",
    "key_impl_of",
    "sharding_of",
    "single_device",
    "wants_jax",
    "wrap_keys",
]
