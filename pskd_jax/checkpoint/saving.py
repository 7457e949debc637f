"""Pytree checkpoints: save a parameter tree as one ``.psk.d`` sample, restore it exactly.

A checkpoint is a ``.psk.d`` file holding one sample:

- a parameter tree is written as type ``params NAME``, its leaves in *declaration order* (dict
  insertion order, dataclass and NamedTuple fields, list and tuple order); a plain tuple of arrays
  is written as the closed tuple type (``(ℝ[2, 3], idx[256][4])``), a single array as its own
  closed type;
- every leaf bit for bit, as :mod:`pskd_jax.format.stored_dtypes` tabulates: float64 / float32 /
  bfloat16 in f64 / f32 / bf16, float16 in f32 (exact); ``Fraction``, ``Decimal``,
  ``numpy.longdouble`` and other reals rounded once to f64; bool → ``idx[2]``, unsigned intK →
  ``idx[2^K]``; signed intK → ``idx[2^K]`` holding the two's-complement pattern (negative values
  too); float8 families, int4 and other narrow ``ml_dtypes`` types → their bit pattern; complex →
  (real, imaginary) pairs; typed PRNG keys → their key data, the implementation recorded; Python
  scalars → the smallest fitting leaf. The layout file records the dtype each leaf gives back;
- NaN (its payload kept) and ±Inf are saved as they are unless ``finite_only=True``;
- narrowing a value its encoding does not hold is refused unless ``round_to_encoding=True``, which
  rounds half-even and reports the largest error per leaf. The caller's tree is never modified.

The write is atomic: a temporary file in the same directory, flushed, synced, renamed over the
destination, and the directory synced. Saves of one destination take turns, in any process (an
``flock`` on ``.NAME.psk.d.lock`` beside it, removed when the save is done:
:func:`destination_lock`), so that the checkpoint and its layout file always come from one save;
the layout file is written once every value was accepted, so a refused save writes no file at all,
and it records the data file's size and the digest of its header, so that it is never applied to
data of another save.
Memory: leaves already in their encoding are written from the caller's own buffers; a conversion
works in bounded chunks, so a save needs no second copy of the tree.

Beside a ``params`` checkpoint ``NAME.psk.d`` its layout is written as ``NAME.layout.json``
(:func:`layout_json`), so that ``pskd info``, ``diff`` and ``export`` can open it without the program
(:func:`read_layout`, :func:`find_layout`).

A restore reads each leaf with one ``preadv`` into a preallocated array (no copy through the map, so
the resident memory is the restored tree), or — opt-in, for tools that only read — returns
read-only numpy views of the map. Target leaves that carry a ``jax.sharding.Sharding`` are built
with ``jax.make_array_from_callback``, each device's shard read from its own region of the file.

Integrity: a digest of the whole file (header, leaves and any trailing bytes, in file order) can
be computed while saving (``save(..., digest=...)``) and checked while restoring
(``restore(..., xxh3_128=HEX)`` or ``sha256=HEX``; E9013 names the file on a mismatch). Two
algorithms, each of the whole file as ``xxhsum -H2`` and ``sha256sum`` print them:

- ``xxh3_128`` (XXH3, 128 bits), the checkpoint digest (:data:`CHECKPOINT_DIGEST`, what the
  checkpoint manager records): it detects damage — a flipped bit or byte, a torn copy — and is
  fast enough to check while restoring (``bench/bench_checkpoint.py`` prints what it costs). It is
  not cryptographic: it does not stand against someone who crafts a file to match (nor does a
  digest kept in the same directory as the file);
- ``sha256``, for digests that ``sha256sum`` reproduces and that hold against tampering, and for
  checkpoint indexes written before xxh3_128. It runs on one core and is several times slower, so
  a restore verified with it costs a multiple of an unverified one.

A verified restore reads the file in pieces of :data:`HASH_PIECE` bytes on two threads, straight
into the result's arrays, while the calling thread hashes each piece once it and every piece
before it are in: the bytes hashed are the bytes returned, and hashing overlaps reading.

This module imports numpy but not JAX: JAX is imported only when a restore makes device arrays
(the data tools and ``pskd verify``/``convert`` stay free of it).
"""

from __future__ import annotations

import os
from typing import Any

from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.digests import Hasher
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.encode import bytes_of, encode_chunks
from pskd_jax.checkpoint.integrity import digest_algorithm
from pskd_jax.checkpoint.jax_arrays import is_global
from pskd_jax.checkpoint.layout_file import write_layout
from pskd_jax.checkpoint.planning import SaveResult, leaf_name, plan
from pskd_jax.errors import MismatchError, TruncatedError
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.encodings import Encoding, Rounding
from pskd_jax.format.sample_type import ParamsType, parse_type


def save(
    path: str | os.PathLike,
    tree: Any,
    *,
    name: str | None = None,
    encodings: Any = None,
    round_to_encoding: bool = False,
    durable: bool = True,
    layout_file: bool = True,
    digest: bool | str = False,
    finite_only: bool = False,
) -> SaveResult:
    """Saves a pytree as a one-sample ``.psk.d`` file, atomically.

    ``name`` names a ``params`` type (default: the class name of a dataclass or NamedTuple root,
    else ``Params``). ``encodings`` overrides the encoding of real leaves: one label (``"bf16"``)
    for all, a sequence in storage order, or a dict from key path to label; narrowing needs
    ``round_to_encoding=True``, and the largest error per leaf is in the result's ``rounding``.
    NaN and ±Inf are saved as they are (bit for bit in a leaf's own encoding); ``finite_only=True``
    refuses them (E9004 naming the key path and index). ``layout_file`` writes ``NAME.layout.json``
    beside a ``params`` checkpoint. ``digest`` returns the whole file's digest, computed while
    writing on a second thread: ``"xxh3_128"`` (the faster, which a checkpoint directory records;
    the layout file records it too) in the result's ``xxh3_128``, ``"sha256"`` or True (as
    ``sha256sum`` prints it) in its ``sha256``.

    A save waits for another save of the same destination (in any process) to finish; a tree
    nested deeper than :data:`MAX_KEY_DEPTH` is refused (E9005), its layout could not be read back.
    A layout file beside the destination that this save does not rewrite (a closed type, or
    ``layout_file=False``) is removed with the data it described.

    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.psk.d")
    >>> result = save(path, {"w": np.ones((2, 3), np.float32), "step": np.int32(-7)})
    >>> result.type_text, [e.label for e in result.encodings]
    ('params Params', ['f32', 'f64'])
    >>> from pskd_jax.checkpoint import restore
    >>> restore(path, {"w": np.zeros((2, 3), np.float32), "step": np.int32(0)})["step"]
    array(-7, dtype=int32)
    """
    return save_checkpoint(path, tree, name=name, encodings=encodings, round_to_encoding=round_to_encoding,
                           durable=durable, layout_file=layout_file, digest=digest, finite_only=finite_only)


def save_checkpoint(path: str | os.PathLike, tree: Any, *, name: str | None = None, encodings: Any = None,
                    round_to_encoding: bool = False, durable: bool = True, layout_file: bool = True,
                    digest: bool | str = False, finite_only: bool = False,
                    layout_extra: dict | None = None) -> SaveResult:
    """:func:`save`, with entries of its own added to the layout file (``layout_extra``: what a
    conversion keeps of its source, such as a safetensors file's ``__metadata__``)."""
    path = os.fspath(path)
    if any(is_global(value) for _, value in tree_lib.flatten(tree)[0]):
        return save_distributed(path, tree, name=name, encodings=encodings, round_to_encoding=round_to_encoding,
                                durable=durable, layout_file=layout_file, digest=digest, finite_only=finite_only)
    algorithm = digest_algorithm(digest)
    plan_ = plan(tree, name=name, encodings=encodings)
    reports: dict[int, Rounding] = {}
    beside = layout_path_for(path)
    layout_path = beside if layout_file and isinstance(parse_type(plan_.type_text), ParamsType) else None
    hasher = Hasher(algorithm) if algorithm else None
    try:
        # One save of a destination at a time (its data and its layout go together), and the
        # layout is written only once every value was accepted: a refused save writes nothing.
        with destination_lock(path), atomic_output(path, durable=durable) as f:
            header = plan_.header
            f.write(header)
            if hasher:
                hasher.feed(header)
            for i in range(len(plan_.arrays)):
                for data in _leaf_bytes(path, i, plan_, round_to_encoding, reports, finite_only):
                    f.write(data)
                    if hasher:
                        hasher.feed(data)
            found = {algorithm: hasher.hexdigest()} if hasher else {}
            if layout_path:
                write_layout(layout_path, plan_, durable=durable, xxh3_128=found.get("xxh3_128"), extra=layout_extra)
            elif os.path.lexists(beside):
                _remove_stale_layout(beside)
    except BaseException:
        if hasher:
            hasher.abandon()
        raise
    encodings_ = plan_.placement.encodings
    return SaveResult(
        path,
        plan_.type_text,
        2 if any(e != Encoding.F64 for e in encodings_) else 1,
        encodings_,
        [reports[i] for i in sorted(reports)],
        plan_.size,
        found.get("sha256"),
        layout_path,
        found.get("xxh3_128"),
    )


def _leaf_bytes(path: str, i: int, plan_, round_to_encoding: bool, reports: dict, finite_only: bool):
    """Leaf i's bytes, chunk by chunk; an unexpected error of numpy's names the leaf (E9005)."""
    try:
        for chunk in encode_chunks(i, plan_, round_to_encoding, reports, finite_only=finite_only):
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
