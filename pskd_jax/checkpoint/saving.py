"""Saving a pytree as a one-sample ``.psk.d`` checkpoint, atomically, with its layout file.

What is stored for each kind of leaf is tabulated in :mod:`pskd_jax.format.stored_dtypes`; the
write, its lock and the layout file are described in ``docs/checkpoints.md``. This module imports
numpy but not JAX.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from pskd_jax._os.atomic import atomic_output, destination_for, fsync_directory
from pskd_jax._os.digests import Hasher
from pskd_jax._os.jsonfile import json_text
from pskd_jax._os.locks import clear_committing, destination_lock, keep_layout_before, mark_committing
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.distributed import save_distributed
from pskd_jax.checkpoint.encode import bytes_of, encode_chunks
from pskd_jax.checkpoint.jax_arrays import is_global
from pskd_jax.checkpoint.layout_file import check_layout_beside, layout_json, layout_ready, own_store_layout
from pskd_jax.checkpoint.options import SaveOptions, save_options
from pskd_jax.checkpoint.planning import SavePlan, SaveResult, leaf_name, plan
from pskd_jax.errors import MismatchError, TruncatedError
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.encodings import Rounding
from pskd_jax.format.sample_type import ParamsType, parse_type
from pskd_jax.storage import Location, locate, store_for


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
    where = locate(path)
    path = where.path if where.is_local else where.url
    options = save_options(options)
    if any(is_global(value) for _, value in tree_lib.flatten(tree)[0]):
        return save_distributed(path if where.is_local else where, tree, options)
    if not where.is_local:
        return _save_to_store(where, tree, options, layout_extra)
    algorithm = options.digest
    plan_ = plan(tree, options)
    reports: dict[int, Rounding] = {}
    beside = layout_path_for(path)
    layout_path = beside if options.layout_file and isinstance(parse_type(plan_.type_text), ParamsType) else None
    hasher = Hasher(algorithm) if algorithm else None
    try:
        # One save of a destination at a time (its data and its layout go together), and the
        # layout is written only once every value was accepted: a refused save writes nothing.
        with destination_lock(path):
            # (synced here, not by atomic_output: the data before the marked window, the directory
            # once after both renames)
            with atomic_output(path, durable=False) as f:
                own_beside = check_layout_beside(path, writes=layout_path is not None)  # (before any write)
                header = plan_.header
                _preallocate(f.fileno(), plan_.size)
                f.write(header)
                if hasher:
                    hasher.feed(header)
                offset = len(header)
                for i in range(len(plan_.arrays)):
                    for data in _leaf_bytes(path, i, plan_, options, reports):
                        f.write(data)
                        if hasher:
                            hasher.feed(data)
                        if options.durable:
                            _start_writeback(f.fileno(), offset, len(data))
                        offset += len(data)
                found = {algorithm: hasher.hexdigest()} if hasher and algorithm else {}
                if options.durable:  # (the data on the disk first, and the layout below: the marked
                    f.flush()        # window holds little more than the two renames)
                    os.fsync(f.fileno())
                with _layout_ready(layout_path, plan_, options, found, layout_extra):
                    # From the layout's rename to the data's, the two files beside each other may
                    # be of two saves (no rename puts two files in place at once): the layout file
                    # replaced is kept under a second name, and the lock file marked with the new
                    # data's identity, so that a reader of a save cut off there reads the old pair
                    # or the new one whole, and the next save puts it back in order.
                    replaces = layout_path is not None or own_beside
                    before = replaces and keep_layout_before(path, durable=options.durable)
                    f.flush()
                    mark_committing(path, data=f.fileno(), before=before, layout=layout_path is not None,
                                    durable=options.durable)
                    if not layout_path and own_beside:  # (a file of anyone else's is left as it is)
                        _remove_stale_layout(beside)
                if options.durable and replaces:  # (the layout's rename on the disk before the data's)
                    fsync_directory(os.path.dirname(os.path.abspath(beside)))
            if options.durable:
                _sync_directories(path)
            clear_committing(path)
    except BaseException:
        if hasher:
            hasher.abandon()
        raise
    return SaveResult.of(path, plan_, reports, found, layout_path)


def _sync_directories(path: str) -> None:
    """Makes the renames of a save durable: the directory of the file renamed (a link at ``path``
    is written through) and the one of the layout beside ``path``, when that is another."""
    directories = {os.path.dirname(os.path.abspath(p)) for p in (destination_for(path), path)}
    for directory in sorted(directories):
        fsync_directory(directory)


def _layout_ready(layout_path: str | None, plan_: SavePlan, options: SaveOptions, found: dict[str, str],
                  extra: dict | None) -> contextlib.AbstractContextManager[None]:
    """The save's layout file written under its temporary name, put in place on leaving the block
    (nothing when the save writes none)."""
    if layout_path is None:
        return contextlib.nullcontext()
    return layout_ready(layout_path, plan_, durable=options.durable, xxh3_128=found.get("xxh3_128"), extra=extra)


def _leaf_bytes(path: str, i: int, plan_: SavePlan, options: SaveOptions,
                reports: dict[int, Rounding]) -> Iterator[memoryview]:
    """Leaf i's bytes, chunk by chunk; an unexpected error of numpy's names the leaf (E9005)."""
    try:
        for chunk in encode_chunks(i, plan_, options.round_to_encoding, reports, finite_only=options.finite_only):
            yield bytes_of(chunk)
    except (TypeError, ValueError, OverflowError) as e:
        raise MismatchError(f"{path}: {leaf_name(plan_.paths[i])}: cannot be stored: {type(e).__name__}: "
                            f"{str(e)[:200]}") from None


def _save_to_store(where: Location, tree: Any, options: SaveOptions, layout_extra: dict | None) -> SaveResult:
    """:func:`save` to an object of a store. There is no rename on a bucket: the data object is
    one put (a multipart upload for a large one), visible only once whole, and an upload whose
    values are refused midway is aborted, leaving nothing. The layout object is put after it;
    a layout object of the data replaced that this save does not rewrite is removed when it is
    the toolkit's (a layout file), and anything else at its key is left alone."""
    store, path = store_for(where), where.url
    plan_ = plan(tree, options)
    reports: dict[int, Rounding] = {}
    algorithm = options.digest
    beside = layout_path_for(where.key)
    writes_layout = options.layout_file and isinstance(parse_type(plan_.type_text), ParamsType)
    own_beside = own_store_layout(store, beside, where.key, path, writes=writes_layout)  # (before any put)
    hasher = Hasher(algorithm) if algorithm else None

    def pieces() -> Iterator[memoryview]:
        yield memoryview(plan_.header)
        for i in range(len(plan_.arrays)):
            yield from _leaf_bytes(path, i, plan_, options, reports)

    def hashed() -> Iterator[memoryview]:
        for piece in pieces():
            if hasher:
                hasher.feed(piece)
            yield piece

    try:
        info = store.put(where.key, hashed(), size=plan_.size)
        found = {algorithm: hasher.hexdigest()} if hasher and algorithm else {}
    except BaseException:
        if hasher:
            hasher.abandon()
        raise
    if info.size != plan_.size:
        raise TruncatedError(f"{path}: {info.size} bytes written of the {plan_.size} planned")
    if writes_layout:
        # (the data's version as its put was answered: a restore that finds another version there
        # knows this layout is not that data's, whatever their headers and sizes; a store that
        # answers a put with no tag leaves the header and size check alone, as before)
        content = layout_json(plan_, xxh3_128=found.get("xxh3_128"), extra=layout_extra,
                              data_name=where.key.rsplit("/", 1)[-1], version=(path, info.tag) if info.tag else None)
        store.put(beside, (json_text(content, indent=1) + "\n").encode("utf-8"))
    elif own_beside:  # (anything else at its key is left alone)
        store.delete(beside)
    return SaveResult.of(path, plan_, reports, found, store.url(beside) if writes_layout else None)


_PREALLOCATE_BYTES = 1 << 20  # files smaller than this are written without preallocation
_SYSTEM_CALLS: list[Any] = []  # libc's fallocate, sync_file_range, fstatfs once looked up (None: absent)
# File systems whose preallocation costs more than it saves: in memory, fallocate zeroes every page
# the writes then overwrite (+18% on a save of 128 MiB to /dev/shm here).
_MEMORY_FILE_SYSTEMS = (0x01021994, 0x858458F6)  # tmpfs, ramfs (statfs's f_type)


def _system_calls() -> list[Any]:
    """[fallocate, sync_file_range, fstatfs] from libc (Linux), each None where there is none;
    looked up once, and only by a save that has use for them."""
    if not _SYSTEM_CALLS:
        found: list[Any] = [None, None, None]
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            # fallocate64 takes 64-bit offsets everywhere; plain fallocate only where off_t is 64-bit
            fallocate = getattr(libc, "fallocate64", None)
            if fallocate is None and ctypes.sizeof(ctypes.c_long) == 8:
                fallocate = getattr(libc, "fallocate", None)
            sync_file_range = getattr(libc, "sync_file_range", None)  # (its offsets are 64-bit)
            for k, (function, last) in enumerate(((fallocate, ctypes.c_int), (sync_file_range, ctypes.c_uint))):
                if function is not None:
                    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, last)
                    function.restype = ctypes.c_int
                    found[k] = function
            fstatfs = getattr(libc, "fstatfs", None)
            if fstatfs is not None:
                fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)
                fstatfs.restype = ctypes.c_int
                found[2] = fstatfs
        except (OSError, ImportError):
            pass
        _SYSTEM_CALLS[:] = found
    return _SYSTEM_CALLS


def _preallocate(fd: int, size: int) -> None:
    """Reserves the file's ``size`` bytes before they are written (Linux ``fallocate``): the
    writes then find their blocks allocated, which made a save of 256 MiB ~8% faster here (on
    ext4; not done in memory, see :data:`_MEMORY_FILE_SYSTEMS`). Only
    the system call itself: where a file system has none (EOPNOTSUPP) nothing is done (glibc's
    ``posix_fallocate`` would write zeros instead), and any other failure is left to the writes
    to report."""
    if size >= _PREALLOCATE_BYTES and (fallocate := _system_calls()[0]) is not None and not _in_memory(fd):
        fallocate(fd, 0, 0, size)


def _in_memory(fd: int) -> bool:
    """Whether the file is on a file system held in memory (tmpfs, ramfs), by ``fstatfs``; False
    when that cannot be told."""
    fstatfs = _system_calls()[2]
    if fstatfs is None:
        return False
    import ctypes

    buffer = ctypes.create_string_buffer(512)  # struct statfs (120 bytes on x86-64), its f_type first
    if fstatfs(fd, buffer) != 0:
        return False
    return ctypes.c_long.from_buffer(buffer).value in _MEMORY_FILE_SYSTEMS


_SYNC_FILE_RANGE_WRITE = 2  # start the writeback of the range's dirty pages, without waiting


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Starts writing a durable save's bytes to the disk as soon as they are written (Linux
    ``sync_file_range``), so that the disk works while the rest is copied and the closing
    ``fsync`` finds little left: a durable save of 256 MiB took ~0.6x the time of a write and
    one ``fsync`` here. The ``fsync`` still makes the file durable; this only starts early."""
    if length >= _PREALLOCATE_BYTES and (sync_file_range := _system_calls()[1]) is not None:
        sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


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
