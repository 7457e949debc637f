"""Saving one checkpoint from several JAX processes into one file on a shared file system, in
three phases agreed on at barriers: create the file, write each process's shards, commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from pskd_jax._os import names
from pskd_jax._os.atomic import check_destination, destination_for, fsync_directory
from pskd_jax._os.digests import DIGESTS, file_digest
from pskd_jax._os.jsonfile import json_text
from pskd_jax._os.locks import clear_committing, destination_lock, keep_layout_before, mark_committing
from pskd_jax._os.positional import write_at
from pskd_jax.checkpoint.encode import bytes_of, encode_chunks
from pskd_jax.checkpoint.jax_arrays import is_array_like, is_global, jax_module
from pskd_jax.checkpoint.layout_file import check_layout_beside, layout_json, layout_ready, own_store_layout
from pskd_jax.checkpoint.options import SaveOptions, save_options
from pskd_jax.checkpoint.parts import TOKEN_BYTES, PartsIndex, part_key, parts_index_at, parts_named_for
from pskd_jax.checkpoint.planning import SavePlan, SaveResult, plan
from pskd_jax.checkpoint.regions import region_runs
from pskd_jax.errors import PskdError, TruncatedError, UsageError
from pskd_jax.format.encodings import Rounding
from pskd_jax.format.sample_type import ParamsType, parse_type
from pskd_jax.storage import Location, locate, store_for


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


_T = TypeVar("_T")


def agreed(tag: str, work: Callable[[], _T] | None) -> _T | None:
    """Runs ``work`` in the processes that are given one (None in the others), then a barrier at
    which every process learns whether any failed: all raise if one did (the one that failed its
    own error). What ``work`` returned, None where there was none."""
    multihost_utils = importlib.import_module("jax.experimental.multihost_utils")
    done: list[_T] = []
    error = _attempt(lambda: done.append(work()), None) if work is not None else None
    _agree(multihost_utils, tag, error)
    return done[0] if done else None


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


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where a distributed save goes: the path asked for, the file it writes (a link's target),
    that file's directory, the temporary file, and the layout file (None: none is written)."""

    path: str
    destination: str
    directory: str
    temporary: str
    layout_path: str | None


def _attempt(work: Callable[[], object], where: str | None) -> BaseException | None:
    """Runs ``work``; returns what it raised (to be agreed on by every process), an ``OSError`` as
    E9003 naming ``where`` (as it is when ``where`` is None)."""
    try:
        work()
    except OSError as e:
        return TruncatedError(f"{where}: {e.strerror or e}") if where is not None else e
    except BaseException as e:  # handed to every process by _agree
        return e
    return None


def save_distributed(path: str | os.PathLike | Location, tree: Any, options: SaveOptions | None = None) -> SaveResult:
    """Saves a tree of arrays sharded over several JAX processes into one file on a shared
    filesystem; every process calls it (``save`` does so by itself for such trees), with the same
    ``options``.

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
    where = locate(path)
    if not where.is_local:
        return _save_parts(where, tree, save_options(options))
    jax = jax_module()
    multihost_utils = importlib.import_module("jax.experimental.multihost_utils")
    path = where.path
    options = save_options(options)
    me = jax.process_index()
    plan_ = plan(tree, options, keep_global=True)
    target, error = _target(path, plan_, options)  # (every process: a refusal is agreed on first)
    with contextlib.ExitStack() as held:  # process 0 holds the destination's lock to the commit
        if me == 0 and error is None:
            error = _attempt(lambda: held.enter_context(destination_lock(path)), None)
        if me == 0 and error is None:
            error = _attempt(lambda: _create(target.temporary, plan_), target.temporary)
        _agree(multihost_utils, f"{path}: creating the file", error)

        reports: dict[int, Rounding] = {}
        error = _attempt(lambda: _write_shards(target.temporary, plan_, options, reports, me), target.temporary)
        try:
            _agree(multihost_utils, f"{path}: writing the shards", error)
        except BaseException:
            if me == 0:
                with contextlib.suppress(OSError):
                    os.unlink(target.temporary)
            raise

        found: dict[str, str] = {}
        error = _attempt(lambda: _commit(target, plan_, options, found), path) if me == 0 else None
        _agree(multihost_utils, f"{path}: committing", error)
    return SaveResult.of(path, plan_, reports, found, target.layout_path)


def _gathered(multihost_utils: Any, table: np.ndarray) -> list[np.ndarray]:
    """Every process's int64 table (n, 3), gathered (as bytes: without x64, JAX would narrow
    int64 to int32)."""
    counts = np.asarray(multihost_utils.process_allgather(np.array([len(table)], np.int32))).reshape(-1)
    padded = np.zeros((max(1, int(counts.max())), 3), "<i8")
    padded[: len(table)] = table
    raw = np.asarray(multihost_utils.process_allgather(padded.reshape(-1).view(np.uint8)))
    rows = raw.reshape(len(counts), -1).view("<i8").reshape(len(counts), -1, 3)
    return [rows[p, : int(counts[p])] for p in range(len(counts))]


@contextlib.contextmanager
def _removed_on_failure(store: Any, key: str) -> Iterator[None]:
    """Removes this process's part object (its own: named with this save's token) when the block
    raises: a save that is not committed leaves no part behind."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(PskdError):
            store.delete(key)
        raise


def _save_parts(where: Location, tree: Any, options: SaveOptions) -> SaveResult:
    """A tree spread over several JAX processes saved to a bucket (no shared file system): each
    process puts the bytes it owns as one part object (named with a token of this save, so that
    no part of a save another reader may be reading is overwritten); after a barrier process 0
    checks that the parts hold every byte exactly once, computes the digest asked for (reading the
    parts), puts the parts index at the checkpoint's key and then the layout object, which records
    the index's version (its URL and put tag: what tells a reader the pair is of one save), and
    removes the parts of the save it replaced. See :mod:`pskd_jax.checkpoint.parts`."""
    jax = jax_module()
    multihost_utils = importlib.import_module("jax.experimental.multihost_utils")
    me, count = jax.process_index(), jax.process_count()
    store, url = store_for(where), where.url
    plan_ = plan(tree, options, keep_global=True)
    token = np.asarray(multihost_utils.broadcast_one_to_all(np.frombuffer(os.urandom(TOKEN_BYTES), np.uint8)))
    keys = [f"{part_key(where.key, p, count)}.{bytes(token.astype(np.uint8)).hex()}" for p in range(count)]
    key = keys[me]
    reports: dict[int, Rounding] = {}
    extents: list[tuple[int, int, int]] = []
    written = [0]
    layout_key = names.layout_path_for(where.key)
    writes_layout = options.layout_file and isinstance(parse_type(plan_.type_text), ParamsType)
    own_beside = [False]  # (process 0's finding: whether the object at the layout's key is this checkpoint's layout)

    def look_beside() -> None:  # (before any put: anything else at the layout's key is never replaced)
        own_beside[0] = own_store_layout(store, layout_key, where.key, url, writes=writes_layout)

    _agree(multihost_utils, f"{url}: looking at its layout's key", _attempt(look_beside, url) if me == 0 else None)

    def pieces() -> Iterator[memoryview]:
        for offset, data in _my_pieces(plan_, options, reports, me):
            view = memoryview(data).cast("B")
            extents.append((offset, len(view), written[0]))
            written[0] += len(view)
            yield view

    error = _attempt(lambda: store.put(key, pieces()), url)
    with _removed_on_failure(store, key):
        _agree(multihost_utils, f"{url}: writing the parts", error)
    tables = _gathered(multihost_utils, np.asarray(extents, "<i8").reshape(-1, 3))
    sizes = [int(t[:, 1].sum()) if len(t) else 0 for t in tables]
    found: dict[str, str] = {}

    def commit() -> None:
        index = PartsIndex.of(plan_.size, keys, sizes, tables, url)
        try:
            old = parts_index_at(store, where.key, url)  # (what this save replaces)
        except PskdError:
            old = None
        if options.digest:
            hashed = DIGESTS[options.digest]()
            buffer = bytearray(min(16 << 20, max(1, plan_.size)))
            for start in range(0, plan_.size, len(buffer)):
                view = memoryview(buffer)[: min(len(buffer), plan_.size - start)]
                index.read_spans(store, url, [view], [start])
                hashed.update(view)
            found[options.digest] = hashed.hexdigest()
        # The index first, then the layout recording the version its put was given, as a save of
        # one object does: a reader that finds one save's index beside the other's layout (this
        # save between its two puts, or cut off there) is told so (OtherVersion) and reads the
        # pair again, never a mix of two saves whose headers and sizes agree
        put = store.put(where.key, index.encoded())
        if writes_layout:
            content = layout_json(plan_, xxh3_128=found.get("xxh3_128"), data_name=where.key.rsplit("/", 1)[-1],
                                  version=(url, put.tag) if put.tag else None)
            store.put(layout_key, (json_text(content, indent=1) + "\n").encode("utf-8"))
        if not writes_layout and own_beside[0]:  # the layout of the data replaced, which this save does not rewrite
            store.delete(layout_key)
        if old is not None:  # the parts of the save replaced (only keys named as its parts)
            for stale in sorted(set(parts_named_for(old.keys, where.key)) - set(keys)):
                with contextlib.suppress(PskdError):  # (committed already: a part left is only a cost)
                    store.delete(stale)

    error = _attempt(commit, url) if me == 0 else None
    with _removed_on_failure(store, key):
        _agree(multihost_utils, f"{url}: committing", error)
    return SaveResult.of(url, plan_, reports, found, store.url(layout_key) if writes_layout else None)


def _target(path: str, plan_: SavePlan, options: SaveOptions) -> tuple[_Target, BaseException | None]:
    """Where the save goes, and the refusal of the destination (to be agreed on), if any."""
    error: BaseException | None = None
    writes_layout = options.layout_file and isinstance(parse_type(plan_.type_text), ParamsType)
    try:
        destination = destination_for(path)
        check_layout_beside(path, writes=writes_layout)  # (refused before anything is written)
    except BaseException as e:  # handed to every process by _agree
        error, destination = e, path
    return _Target(path, destination, os.path.dirname(os.path.abspath(destination)),
                   names.distributed_temporary(destination),
                   names.layout_path_for(path) if writes_layout else None), error


def _create(temporary: str, plan_: SavePlan) -> None:
    """Process 0: the temporary file at its full size, its header written."""
    fd = _open_temporary(temporary, create=True)
    try:
        os.ftruncate(fd, plan_.size)
        write_at(fd, memoryview(plan_.header), 0, temporary)
    finally:
        os.close(fd)


def _write_shards(temporary: str, plan_: SavePlan, options: SaveOptions, reports: dict[int, Rounding],
                  me: int) -> None:
    """Every process: the shards of the JAX arrays it owns (replica 0 of each); process 0 also the
    leaves that are not spread over processes."""
    fd = _open_temporary(temporary, create=False)
    try:
        for i, value in enumerate(plan_.arrays):
            if not is_array_like(value) or isinstance(value, np.ndarray) or not hasattr(value, "addressable_shards"):
                if me == 0:
                    _write_whole_leaf(fd, temporary, plan_, i, options, reports)
                continue
            for shard in value.addressable_shards:
                if shard.replica_id == 0:
                    _write_shard(fd, temporary, plan_, i, shard, options, reports)
        if options.durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _leaf_start(plan_: SavePlan, i: int) -> int:
    return len(plan_.header) + plan_.placement.offsets[i]


def _write_whole_leaf(fd: int, temporary: str, plan_: SavePlan, i: int, options: SaveOptions,
                      reports: dict[int, Rounding]) -> None:
    for position, data in _whole_leaf_pieces(plan_, i, options, reports):
        write_at(fd, data, position, temporary)


def _whole_leaf_pieces(plan_: SavePlan, i: int, options: SaveOptions, reports: dict[int, Rounding]
                       ) -> Iterator[tuple[int, memoryview]]:
    """Leaf i encoded, chunk by chunk, with each chunk's offset in the file."""
    position = _leaf_start(plan_, i)
    for chunk in encode_chunks(i, plan_, options.round_to_encoding, reports, finite_only=options.finite_only):
        data = bytes_of(chunk)
        yield position, data
        position += len(data)


def _write_shard(fd: int, temporary: str, plan_: SavePlan, i: int, shard: Any, options: SaveOptions,
                 reports: dict[int, Rounding]) -> None:
    """One shard of leaf i, encoded, written run by run at its offsets in the file."""
    for position, data in _shard_pieces(plan_, i, shard, options, reports):
        write_at(fd, data, position, temporary)


def _my_pieces(plan_: SavePlan, options: SaveOptions, reports: dict[int, Rounding], me: int
               ) -> Iterator[tuple[int, memoryview]]:
    """The bytes this process owns, with their offsets in the file: the shards of the JAX arrays
    it holds (replica 0 of each); process 0 also the header and the leaves not spread over
    processes."""
    if me == 0:
        yield 0, memoryview(plan_.header)
    for i, value in enumerate(plan_.arrays):
        if not is_global(value) or isinstance(value, np.ndarray) or not hasattr(value, "addressable_shards"):
            if me == 0:  # (a leaf every process holds whole, a JAX array of local devices too)
                yield from _whole_leaf_pieces(plan_, i, options, reports)
            continue
        for shard in value.addressable_shards:
            if shard.replica_id == 0:
                yield from _shard_pieces(plan_, i, shard, options, reports)


def _shard_pieces(plan_: SavePlan, i: int, shard: Any, options: SaveOptions, reports: dict[int, Rounding]
                  ) -> Iterator[tuple[int, memoryview]]:
    """One shard of leaf i, encoded, run by run, with each run's offset in the file."""
    leaf = plan_.placement.layout.leaves[i]
    itemsize = plan_.placement.disk_dtypes[i].itemsize
    index = tuple(shard.index)
    box = np.asarray(shard.data)
    origin = tuple(s.indices(d)[0] for s, d in zip(index, leaf.shape))
    chunks = encode_chunks(i, plan_, options.round_to_encoding, reports, box, origin, finite_only=options.finite_only)
    encoded = np.concatenate([np.ascontiguousarray(c).reshape(-1).view(np.uint8) for c in chunks]) \
        if box.size else np.zeros(0, np.uint8)
    _, runs, run = region_runs(leaf.shape, index)
    run_bytes = run * itemsize
    start = _leaf_start(plan_, i)
    if run_bytes:
        for k, element in enumerate(runs):
            yield start + element * itemsize, encoded[k * run_bytes : (k + 1) * run_bytes].data


def _layout_ready(layout_path: str | None, plan_: SavePlan, options: SaveOptions,
                  found: dict[str, str]) -> contextlib.AbstractContextManager[None]:
    """The layout file written under its temporary name, put in place on leaving the block
    (nothing when the save writes none)."""
    if layout_path is None:
        return contextlib.nullcontext()
    return layout_ready(layout_path, plan_, durable=options.durable, xxh3_128=found.get("xxh3_128"))


def _commit(target: _Target, plan_: SavePlan, options: SaveOptions, found: dict[str, str]) -> None:
    """Process 0, once every process wrote its shards: the digest (into ``found``), the layout
    file, the rename into place and the directory's sync. Uncommitted, the temporary file goes."""
    committed = False
    try:
        if options.digest:  # (before the layout, which records an xxh3_128)
            found[options.digest] = file_digest(target.temporary, options.digest)
        # (from the layout's rename to the data's the two may be of two saves: the layout replaced
        # kept and the commit marked, as a save's, so that a reader reads one save's pair whole)
        writes = target.layout_path is not None  # only now that every process accepted its values
        own = not writes and check_layout_beside(target.path, writes=False)  # its own, of the data replaced
        with _layout_ready(target.layout_path, plan_, options, found):
            before = (writes or own) and keep_layout_before(target.path, durable=options.durable)
            mark_committing(target.path, data=target.temporary, before=before, layout=writes,
                            durable=options.durable)
            if own:
                os.unlink(names.layout_path_for(target.path))
        if options.durable and (writes or own):  # (the layout's rename on the disk before the data's)
            fsync_directory(os.path.dirname(os.path.abspath(target.path)))
        check_destination(target.destination)  # (still nothing or a regular file)
        os.replace(target.temporary, target.destination)
        committed = True
        if options.durable:
            fsync_directory(target.directory)
        clear_committing(target.path)
    finally:
        if not committed:
            with contextlib.suppress(OSError):
                os.unlink(target.temporary)


__all__ = ["agreed", "save_distributed"]
