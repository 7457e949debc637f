"""A host copy of a tree for a background save, so that the caller may go on (and donate or
overwrite its buffers) while the copy is written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskd_jax.checkpoint.jax_arrays import is_array_like, is_key_array, key_data, key_impl_of, wrap_keys
from pskd_jax.errors import MismatchError, PskdError
from pskd_jax.format import tree as tree_lib


def host_snapshot(tree: Any) -> Any:
    """A copy of the tree's leaves in host memory (Python numbers, immutable, as they are).

    A typed PRNG key array (an nnx model's ``RngState``, ``jax.random.key``), which numpy cannot
    hold, is copied as its key data and wrapped again as a key array of its implementation (a new
    buffer, which the caller's donations never reach). A leaf that does not copy is E9005 naming
    its key path."""
    pairs, rebuild = tree_lib.flatten(tree)
    return rebuild([_leaf_copy(path, value) if is_array_like(value) else value for path, value in pairs])


def _leaf_copy(path: str, value: Any) -> Any:
    try:
        if is_key_array(value):
            impl, _ = key_impl_of(value.dtype)
            return wrap_keys(np.array(key_data(value), copy=True), impl)
        return np.array(value, copy=True)
    except PskdError:
        raise
    except Exception as e:  # (a deleted or donated buffer, an object numpy refuses)
        raise MismatchError(f"leaf {path or '(root)'}: cannot be copied for a background save: "
                            f"{type(e).__name__}: {str(e)[:200]}") from None


__all__ = ["host_snapshot"]
