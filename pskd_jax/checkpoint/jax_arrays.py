"""Meeting JAX arrays without importing JAX before a device array is needed.
"""

from __future__ import annotations

import importlib
from typing import Any
import numpy as np


def jax_module():
    """JAX, imported when device arrays are made (never at import: SPEC §10)."""
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
    return module.startswith("jax") or module.startswith("jaxlib")

def sharding_of(spec: Any) -> Any:
    return getattr(spec, "sharding", None) if wants_jax(spec) else None

def single_device(sharding: Any) -> bool:
    return len(sharding.device_set) == 1


__all__ = ["is_array_like", "is_global", "jax_module", "sharding_of", "single_device", "wants_jax"]
