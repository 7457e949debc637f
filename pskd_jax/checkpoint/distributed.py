"""Saving one checkpoint from several JAX processes into one file on a shared file system.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import stat
from typing import Any

import numpy as np

from pskd_jax._os import names
from pskd_jax._os.atomic import check_destination, destination_for, fsync_directory
from pskd_jax._os.digests import file_digest
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.positional import write_at
from pskd_jax.checkpoint.encode import bytes_of, encode_chunks
from pskd_jax.checkpoint.integrity import digest_algorithm
from pskd_jax.checkpoint.jax_arrays import is_array_like, jax_module
from pskd_jax.checkpoint.layout_file import write_layout
from pskd_jax.checkpoint.planning import SaveResult, plan
from pskd_jax.checkpoint.regions import region_runs
from pskd_jax.errors import PskdError, TruncatedError, UsageError
from pskd_jax.format.encodings import Encoding, Rounding
from pskd_jax.format.sample_type import ParamsType, parse_type


def _agree(multihost_utils: Any, tag: str, error: BaseException | None) -> None:
    """A barrier at which every process learns whether any failed; all raise if one did."""
    code = 0 if error is None else int(error.code[1:]) if isinstance(error, PskdError) else 9003
    codes = np.asarray(multihost_utils.process_allgather(np.array([code], np.int32))).reshape(-1)
    if error is not None:
        raise error
    failed = [(k, int(c)) for k, c in enumerate(codes) if c]
    if failed:
        k, c = failed[0]
        raise PskdError(f"E{c}", f"{tag}: process {k} refused the save (E{c}, its own error says where); "
                                 "nothing was committed")


def _open_temporary(temporary: str, *, create: bool) -> int:
    """The save's temporary file opened for writing, never blocking (``O_NONBLOCK``: a FIFO there
    without a reader fails at once instead of waiting for one) and never through a link
    (``O_NOFOLLOW``); E9012 naming it when it is not a regular file (a FIFO, a device, a directory,
    a link), which is left where it is."""
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | (os.O_CREAT if create else 0)
    refused = (f"{temporary}: the temporary file of this save is not a regular file (a named pipe, a device, a "
               "directory or a link stands at its name); it is not written through or removed: move it away")
    try:
        fd = os.open(temporary, flags, 0o644)
    except OSError as e:
        if os.path.lexists(temporary) and not stat.S_ISREG(os.lstat(temporary).st_mode):
            raise UsageError(refused) from e
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(refused)
        if create:
            os.ftruncate(fd, 0)  # (a stale temporary of a crashed save of this destination)
    except BaseException:
        os.close(fd)
        raise
    return fd


def save_distributed(
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
    """Saves a tree of arrays sharded over several JAX processes into one file on a shared
    filesystem; every process calls it (``save`` does so by itself for such trees).

    Process 0 takes the destination's lock (:func:`destination_lock`, held to the commit), creates
    the temporary file at its full size and writes the header; after a barrier each process writes
    the shards it owns (replica 0 of each, at their offsets; process 0 also writes the leaves that
    are not JAX arrays); after a second barrier process 0 writes the layout file, renames the file
    into place and syncs the directory, and a last barrier returns once it is committed. A failure
    in any process fails every process, and nothing is committed. The file is the one a single
    process writes of the same values. ``rounding`` reports this process's shards only.

    The output follows the rules of every writer (:func:`pskd_jax._os.atomic.destination_for`): a
    symbolic link at ``path`` is written through (the temporary file and the rename are in its
    target's directory), a directory, FIFO or device there is refused (E9012), checked again
    just before the rename. The temporary file ``.NAME.distributed.tmp`` is opened without
    blocking and must be a regular file: a FIFO, device, directory or link standing at its name is
    refused (E9012), never waited on or removed.
    """
    jax = jax_module()
    multihost_utils = importlib.import_module("jax.experimental.multihost_utils")
    path = os.fspath(path)
    me = jax.process_index()
    algorithm = digest_algorithm(digest)
    plan_ = plan(tree, name=name, encodings=encodings, keep_global=True)
    placement = plan_.placement
    error: BaseException | None = None
    try:  # (every process: a refusal in any one is agreed on before anything is written)
        destination = destination_for(path)
    except BaseException as e:
        error, destination = e, path
    directory = os.path.dirname(os.path.abspath(destination))
    temporary = names.distributed_temporary(destination)
    layout_path = names.layout_path_for(path) if layout_file and isinstance(parse_type(plan_.type_text), ParamsType) else None
    header = plan_.header
    # Process 0 holds the destination's lock from before the layout to the commit.
    with contextlib.ExitStack() as held:
        if me == 0 and error is None:
            try:
                held.enter_context(destination_lock(path))
            except BaseException as e:  # handed to every process by _agree
                error = e
        if me == 0 and error is None:
            try:
                fd = _open_temporary(temporary, create=True)
                try:
                    os.ftruncate(fd, plan_.size)
                    write_at(fd, memoryview(header), 0, temporary)
                finally:
                    os.close(fd)
            except OSError as e:
                error = TruncatedError(f"{temporary}: {e.strerror or e}")
            except BaseException as e:  # handed to every process by _agree
                error = e
        _agree(multihost_utils, f"{path}: creating the file", error)

        reports: dict[int, Rounding] = {}
        try:
            fd = _open_temporary(temporary, create=False)
            try:
                for i, value in enumerate(plan_.arrays):
                    start = len(header) + placement.offsets[i]
                    itemsize = placement.disk_dtypes[i].itemsize
                    if not is_array_like(value) or isinstance(value, np.ndarray) or not hasattr(value, "addressable_shards"):
                        if me == 0:
                            position = start
                            for chunk in encode_chunks(i, plan_, round_to_encoding, reports, finite_only=finite_only):
                                data = bytes_of(chunk)
                                write_at(fd, data, position, temporary)
                                position += len(data)
                        continue
                    leaf = placement.layout.leaves[i]
                    for shard in value.addressable_shards:
                        if shard.replica_id != 0:
                            continue
                        index = tuple(shard.index)
                        box = np.asarray(shard.data)
                        origin = tuple(s.indices(d)[0] for s, d in zip(index, leaf.shape))
                        encoded = np.concatenate([np.ascontiguousarray(c).reshape(-1).view(np.uint8) for c in
                                                  encode_chunks(i, plan_, round_to_encoding, reports, box, origin,
                                                                finite_only=finite_only)]) \
                            if box.size else np.zeros(0, np.uint8)
                        _, runs, run = region_runs(leaf.shape, index)
                        run_bytes = run * itemsize
                        for k, element in enumerate(runs):
                            write_at(fd, memoryview(encoded[k * run_bytes : (k + 1) * run_bytes]),
                                        start + element * itemsize, temporary)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            error = TruncatedError(f"{temporary}: {e.strerror or e}")
        except BaseException as e:  # handed to every process by _agree
            error = e
        try:
            _agree(multihost_utils, f"{path}: writing the shards", error)
        except BaseException:
            if me == 0:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
            raise

        found: dict[str, str] = {}
        if me == 0:
            committed = False
            try:
                if algorithm:  # (before the layout, which records an xxh3_128)
                    found[algorithm] = file_digest(temporary, algorithm)
                if layout_path:  # only now that every process accepted its values
                    write_layout(layout_path, plan_, durable=durable, xxh3_128=found.get("xxh3_128"))
                elif os.path.lexists(names.layout_path_for(path)):  # it described the data replaced
                    os.unlink(names.layout_path_for(path))
                check_destination(destination)  # (still nothing or a regular file)
                os.replace(temporary, destination)
                committed = True
                if durable:
                    fsync_directory(directory)
            except OSError as e:
                error = TruncatedError(f"{path}: {e.strerror or e}")
            except BaseException as e:  # handed to every process by _agree
                error = e
            if not committed:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        _agree(multihost_utils, f"{path}: committing", error)
        return SaveResult(path, plan_.type_text, 2 if any(e != Encoding.F64 for e in placement.encodings) else 1,
                          placement.encodings, [reports[i] for i in sorted(reports)], plan_.size, found.get("sha256"),
                          layout_path, found.get("xxh3_128"))


__all__ = ["save_distributed"]
