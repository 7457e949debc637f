"""Saving a pytree as a one-sample ``.psk.d`` checkpoint, atomically, with its layout file.

What is stored for each kind of leaf is tabulated in :mod:`pskd_jax.format.stored_dtypes`; the
write, its lock and the layout file are described in ``docs/checkpoints.md``. This module imports
numpy but not JAX.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.digests import Hasher
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.encode import bytes_of, encode_chunks
from pskd_jax.checkpoint.jax_arrays import is_global
from pskd_jax.checkpoint.layout_file import check_layout_beside, write_layout
from pskd_jax.checkpoint.options import SaveOptions, save_options
from pskd_jax.checkpoint.planning import SavePlan, SaveResult, leaf_name, plan
from pskd_jax.errors import MismatchError, TruncatedError
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.encodings import Rounding
from pskd_jax.format.sample_type import ParamsType, parse_type


def save(path: str | os.PathLike, tree: Any, options: SaveOptions | None = None) -> SaveResult:
    """Saves a pytree as a one-sample ``.psk.d`` file, atomically; ``options`` (a
    :class:`SaveOptions`) says how: the type's name, the encodings of real leaves, whether to
    refuse NaN and ±Inf, the digest to compute while writing, the layout file, durability.

    A save waits for another save of the same destination (in any process) to finish; a tree
    nested deeper than :data:`pskd_jax.format.keypaths.MAX_KEY_DEPTH` is refused (E9005), its
    layout could not be read back. The toolkit's own layout file of the destination that this save
    does not rewrite (a closed type, or ``layout_file=False``) is removed with the data it
    described; any other file there is left alone, and where the save would write its layout over
    one the save is refused (E9012) before anything is written. A
    tree of arrays spread over several JAX processes is saved by :func:`save_distributed` (every
    process calls ``save``).

    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.psk.d")
    >>> result = save(path, {"w": np.ones((2, 3), np.float32), "step": np.int32(-7)},
    ...               SaveOptions(digest="xxh3_128"))
    >>> result.type_text, [e.label for e in result.encodings], list(result.digests)
    ('params Params', ['f32', 'f64'], ['xxh3_128'])
    >>> from pskd_jax.checkpoint import restore
    >>> restore(path, {"w": np.zeros((2, 3), np.float32), "step": np.int32(0)}, digests=result.digests)["step"]
    array(-7, dtype=int32)
    """
    return save_checkpoint(path, tree, options)


def save_checkpoint(path: str | os.PathLike, tree: Any, options: SaveOptions | None = None, *,
                    layout_extra: dict | None = None) -> SaveResult:
    """:func:`save`, with entries of its own added to the layout file (``layout_extra``: what a
    conversion keeps of its source, such as a safetensors file's ``__metadata__``)."""
    path = os.fspath(path)
    options = save_options(options)
    if any(is_global(value) for _, value in tree_lib.flatten(tree)[0]):
        return save_distributed(path, tree, options)
    algorithm = options.digest
    plan_ = plan(tree, options)
    reports: dict[int, Rounding] = {}
    beside = layout_path_for(path)
    layout_path = beside if options.layout_file and isinstance(parse_type(plan_.type_text), ParamsType) else None
    hasher = Hasher(algorithm) if algorithm else None
    try:
        # One save of a destination at a time (its data and its layout go together), and the
        # layout is written only once every value was accepted: a refused save writes nothing.
        with destination_lock(path), atomic_output(path, durable=options.durable) as f:
            own_beside = check_layout_beside(path, writes=layout_path is not None)  # (before any write)
            header = plan_.header
            f.write(header)
            if hasher:
                hasher.feed(header)
            for i in range(len(plan_.arrays)):
                for data in _leaf_bytes(path, i, plan_, options, reports):
                    f.write(data)
                    if hasher:
                        hasher.feed(data)
            found = {algorithm: hasher.hexdigest()} if hasher and algorithm else {}
            if layout_path:
                write_layout(layout_path, plan_, durable=options.durable, xxh3_128=found.get("xxh3_128"),
                             extra=layout_extra)
            elif own_beside:  # (a file of anyone else's is left as it is)
                _remove_stale_layout(beside)
    except BaseException:
        if hasher:
            hasher.abandon()
        raise
    return SaveResult.of(path, plan_, reports, found, layout_path)


def _leaf_bytes(path: str, i: int, plan_: SavePlan, options: SaveOptions,
                reports: dict[int, Rounding]) -> Iterator[memoryview]:
    """Leaf i's bytes, chunk by chunk; an unexpected error of numpy's names the leaf (E9005)."""
    try:
        for chunk in encode_chunks(i, plan_, options.round_to_encoding, reports, finite_only=options.finite_only):
            yield bytes_of(chunk)
    except (TypeError, ValueError, OverflowError) as e:
        raise MismatchError(f"{path}: {leaf_name(plan_.paths[i])}: cannot be stored: {type(e).__name__}: "
                            f"{str(e)[:200]}") from None


def _remove_stale_layout(beside: str) -> None:
    """Removes a layout file left beside a destination whose data this save replaces."""
    try:
        os.unlink(beside)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise TruncatedError(f"{beside}: cannot remove the layout of the data this save replaces: "
                             f"{e.strerror or e}") from e


__all__ = ["save", "save_checkpoint"]
