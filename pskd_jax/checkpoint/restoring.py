"""Restoring a checkpoint exactly, into numpy or JAX arrays, sharded or not, by key path: the
reading (positional reads into preallocated arrays, on two threads when large, hashed in file
order when verified; maps for ``zero_copy``; shard by shard for sharded targets). What a restore
reads is planned in :mod:`pskd_jax.checkpoint.read_plan`, and what comes back — with and without
a target — is in ``docs/checkpoints.md``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.positional import read_into
from pskd_jax.checkpoint.integrity import check_digest, checked_digests
from pskd_jax.checkpoint.jax_arrays import jax_module, single_device, wrap_keys
from pskd_jax.checkpoint.read_plan import ReadPlan, Target, plan_read
from pskd_jax.checkpoint.regions import read_region, region_runs
from pskd_jax.checkpoint.stored import StoredFile
from pskd_jax.checkpoint.targets import (
    TargetSpec,
    cast,
    check_jax_dtype,
    check_x64,
    final_dtype,
    saved_values,
    to_target,
    where_of,
)
from pskd_jax.errors import MismatchError, PskdError, TruncatedError, UsageError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.layout import Leaf
from pskd_jax.format.layout_file import LayoutFile, OtherVersion, layout_after
from pskd_jax.format.one_save import identity_of, of_held_file, until_one_save
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader
from pskd_jax.storage import Location, locate

PARALLEL_READ_BYTES = 64 << 20  # restores larger than this read leaves on two threads

HASH_PIECE = 16 << 20  # a verified restore reads, and hashes, pieces of at most this size

GUARDED = "an error no check above foresaw"  # (in a message: the fuzz tests look for it)


def restore(
    path: str | os.PathLike,
    target: Any = None,
    *,
    layout: Any = None,
    as_numpy: bool = False,
    zero_copy: bool = False,
    digests: Mapping[str, str] | None = None,
    partial: bool = False,
    allow_overflow: bool = False,
) -> Any:
    """Restores a checkpoint, every leaf bit for bit (``docs/checkpoints.md`` says what comes back).

    ``target`` is a pytree of arrays, ``jax.ShapeDtypeStruct``s, key arrays or Python scalars:
    its containers, shapes and dtypes are what the result has, its leaves matched to the saved
    ones by key path through the layout file (by position for a file without one). A mismatch
    lists every missing and extra key path (E9005). ``partial=True`` restores the subset the
    target names, reading only those bytes. A target dtype other than the saved one is an explicit
    cast; one that would change a value is refused (E9004), except rounding to a narrower float, and
    overflow to ±inf when ``allow_overflow=True``. A leaf whose target carries a
    ``jax.sharding.Sharding`` is built shard by shard, each read from its own region of the file.

    Without a target, a closed type restores to its tuple and a ``params`` file needs its layout
    (``layout=`` a layout file's path or :class:`LayoutFile`, which give the saved dtypes and match
    by key path; a :class:`Layout` or template, which give the stored view and match by position;
    or the ``NAME.layout.json`` beside it, which must belong to the file: E9005 otherwise; E9001
    when there is none). A :class:`LayoutFile` the caller looked up (``find_layout_file``,
    ``read_layout_file(…, data=…)``) is looked up again when the checkpoint was saved since, as
    the restore's own is; one read or made by hand is used as given (E9005 when it does not pair).

    Leaves come back as JAX arrays, except for numpy target leaves, with ``as_numpy=True``, and with
    ``zero_copy=True`` (read-only numpy views of the map). 64-bit leaves into JAX with x64 disabled
    are refused unless the target asks for a narrower dtype.

    ``digests`` (``{"xxh3_128": HEX}``, ``{"sha256": HEX}`` or both, as a save's result has them)
    checks the whole file while reading (each given is checked) and raises E9013 naming the file
    on a mismatch; nothing is returned from a file that does not verify.

    A local checkpoint saved again meanwhile (by another process) gives back the old checkpoint
    whole or the new one whole, never one's key paths with the other's values (E9005 when saves
    overtake it :data:`~pskd_jax.format.one_save.ATTEMPTS` times running; ``docs/checkpoints.md``, "A checkpoint file").
    """
    where = locate(path)
    path = where.path if where.is_local else where.url
    expected = checked_digests(path, digests)
    if partial and target is None:
        raise UsageError(f"{path}: partial=True restores the key paths a target names: give a target")
    if zero_copy and not where.is_local:
        raise UsageError(f"{path}: zero_copy=True maps a local file; an object of a store is read (give "
                         "as_numpy=True for numpy arrays)")
    try:
        wanted = Target.of(target, as_numpy=as_numpy or zero_copy) if target is not None else None
        if not where.is_local:
            stored, read = _open_stored_planned(where, wanted, layout, partial, expected.get("xxh3_128"))
            with stored:
                values = _read_stored_values(stored, read, as_numpy, expected, allow_overflow)
            return read.tree(values)
        reader, read = _open_planned(path, wanted, layout, partial)
        with reader:
            if zero_copy:
                values = _zero_copy_values(path, reader, read, expected, allow_overflow)
            else:
                values = _read_values(path, reader, read, as_numpy, expected, allow_overflow)
        return read.tree(values)
    except PskdError:
        raise
    except (TypeError, ValueError, OverflowError, KeyError, IndexError) as e:
        # A last guard: the roots are checked above; no raw error of numpy's or JAX's escapes.
        raise MismatchError(f"{path}: cannot restore into this target ({GUARDED}): {type(e).__name__}: "
                            f"{str(e)[:300]}") from None


def _open_planned(path: str, wanted: Target | None, layout: Any, partial: bool) -> tuple[Reader, ReadPlan]:
    """A reader of the checkpoint ``path``, open, and its read plan (the caller closes the
    reader). A save of the path that overtakes the planning has the checkpoint opened again, the
    new one read whole; E9005 when saves overtake it :data:`~pskd_jax.format.one_save.ATTEMPTS` times running."""
    given = [layout]  # (a layout file looked up by the caller: looked up again after a save, as the restore's own)

    def attempt() -> tuple[bool, tuple[Reader, ReadPlan] | None]:
        reader = Reader(path)
        try:
            done, read = _plan_of_held_file(reader, wanted, given[0], partial)
        except OtherVersion as e:
            reader.close()
            given[0] = _layout_after(e, given[0])
            return False, None
        except BaseException:
            reader.close()
            raise
        if not done or read is None:
            reader.close()  # (saved again meanwhile)
            return False, None
        return True, (reader, read)

    opened = until_one_save(path, attempt)
    assert opened is not None  # (an attempt that is done has its reader and plan)
    return opened


def _open_stored_planned(where: Location, wanted: Target | None, layout: Any, partial: bool,
                         xxh3_128: str | None) -> tuple[StoredFile, ReadPlan]:
    """The checkpoint object at ``where``, opened, and its read plan, with the layout of that very
    version of it: a layout object that records another version (a save of the key ran between
    the object's opening and its layout's read, or is between its data's put and its layout's)
    has the pair read again (:func:`~pskd_jax.format.one_save.until_one_save`). The ranged reads
    that follow are compared with the version opened, so the data read is the version the layout
    was proven to go with. ``xxh3_128``: the digest a verified restore checks the reads against
    (see :class:`StoredFile`)."""
    given = [layout]  # (a layout file looked up by the caller: looked up again after a save, as the restore's own)

    def attempt() -> tuple[bool, tuple[StoredFile, ReadPlan] | None]:
        stored = StoredFile(where, xxh3_128=xxh3_128)
        try:
            return True, (stored, plan_read(stored, wanted, layout=given[0], partial=partial))
        except OtherVersion as e:
            stored.close()
            given[0] = _layout_after(e, given[0])
            return False, None
        except BaseException:
            stored.close()
            raise

    opened = until_one_save(where.url, attempt)
    assert opened is not None  # (an attempt that is done has its object and plan)
    return opened


def _layout_after(error: OtherVersion, layout: Any) -> Any:
    """The layout the next attempt reads through, after ``error`` (the pair of two saves):
    ``layout`` itself when the restore finds its own (it looks again), a layout file the caller
    looked up looked up again, as the restore's own is (E9005 raised for a layout file made or
    read by hand: used as given)."""
    return layout_after(error, layout) if isinstance(layout, LayoutFile) else layout


def _plan_of_held_file(reader: Reader, wanted: Target | None, layout: Any,
                       partial: bool) -> tuple[bool, ReadPlan | None]:
    """``(True, plan)``: the read plan of the data file ``reader`` holds open, with the layout of
    that very file; ``(False, None)`` when a save of its path ran meanwhile
    (:func:`~pskd_jax.format.one_save.of_held_file`). Every byte of data is then read through the
    reader's descriptor, never by the path again, so the data read is the file the layout was
    proven to go with."""
    if not locate(reader.path).is_local:  # (an object of a store: its layout records the version it goes with)
        try:
            return True, plan_read(reader, wanted, layout=layout, partial=partial)
        except OtherVersion:
            if isinstance(layout, LayoutFile):  # (a layout given: the caller decides what is read next)
                raise
            return False, None
    return of_held_file(reader.path, identity_of(reader.fileno()),
                        lambda: plan_read(reader, wanted, layout=layout, partial=partial))


def _zero_copy_values(path: str, reader: Reader, read: ReadPlan, expected: dict[str, str],
                      allow_overflow: bool) -> list[Any]:
    if expected:
        from_file = _hash_only(path, reader, list(expected))
        for name, found in from_file.items():
            check_digest(path, name, found, expected[name])
    raw = _map_views(path, reader, read.placement, read.chosen)
    out = []
    for k, i in enumerate(read.chosen):
        leaf = read.view.layout.leaves[i]
        where = where_of(path, leaf)
        saved = saved_values(raw[i], leaf, read.view.forms[i], read.placement, i, where)
        out.append(to_target(saved, read.specs[k], where, allow_overflow))
    return out


def _hash_only(path: str, reader: Reader, names: list[str]) -> dict[str, str]:
    hashes = {name: DIGESTS[name]() for name in names}
    fd = reader.fileno()  # (the file the plan was made for: never the path again)
    buffer = bytearray(min(HASH_PIECE, max(1, reader.file_size)))
    position = 0
    while position < reader.file_size:
        n = min(len(buffer), reader.file_size - position)
        view = memoryview(buffer)[:n]
        read_into(fd, view, position, path)
        for digest in hashes.values():
            digest.update(view)
        position += n
    return {name: digest.hexdigest() for name, digest in hashes.items()}


def _map_views(path: str, reader: Reader, placement: Placement, which: Sequence[int]) -> dict[int, np.ndarray]:
    """Read-only views of the leaves ``which`` over a map of their own: ``np.frombuffer`` holds the
    map's buffer, so the map lives exactly as long as a view does (the reader's own map closes)."""
    leaves = placement.layout.leaves
    if reader.file_size == 0 or placement.sample_bytes == 0:
        return {i: np.zeros(leaves[i].shape, placement.value_dtype(i)) for i in which}
    try:  # (the file the plan was made for, through the reader's descriptor: never the path again)
        mapped = mmap.mmap(reader.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise TruncatedError(f"{path}: cannot map: {getattr(e, 'strerror', None) or e}") from e
    views = {}
    for i in which:
        leaf = leaves[i]
        view = np.frombuffer(mapped, dtype=placement.disk_dtypes[i], count=leaf.size,
                             offset=reader.header.data_offset + placement.offsets[i])
        views[i] = view.reshape(leaf.shape).view(placement.value_dtype(i))
    return views


@dataclasses.dataclass(frozen=True)
class _Routes:
    """How each target leaf (by its position k) is read: built shard by shard from the file
    (``sharded``), or whole (``plain``), and whether it goes to JAX."""

    sharded: list[int]
    plain: list[int]
    to_jax: list[bool]


def _routes(path: str, read: ReadPlan, placement: Placement, as_numpy: bool) -> _Routes:
    """The routes of a plan's leaves; JAX-bound 64-bit leaves with x64 disabled refused first."""
    leaves, forms, specs = read.view.layout.leaves, read.view.forms, read.specs
    sharded, plain, to_jax = [], [], []
    for k, i in enumerate(read.chosen):
        spec, form = specs[k], forms[i]
        elementwise = form is None or form.kind in (sd.KIND_VALUE, sd.KIND_BITS)
        if spec is not None and spec.sharding is not None and not single_device(spec.sharding) and elementwise:
            sharded.append(k)
        else:
            plain.append(k)
        to_jax.append(not as_numpy and (spec.to_jax if spec is not None else True))
    for k, i in enumerate(read.chosen):
        if to_jax[k]:
            dtype = final_dtype(leaves[i], forms[i], specs[k], placement, i)
            if dtype is not None:
                check_x64(where_of(path, leaves[i]), dtype, specs[k] is not None)
                check_jax_dtype(where_of(path, leaves[i]), dtype, specs[k] is not None)
    return _Routes(sharded, plain, to_jax)


def _read_values(path: str, reader: Reader, read: ReadPlan, as_numpy: bool, expected: dict[str, str],
                 allow_overflow: bool) -> list[Any]:
    placement = read.placement
    leaves, forms, specs, chosen = read.view.layout.leaves, read.view.forms, read.specs, read.chosen
    data_offset = reader.header.data_offset
    routes = _routes(path, read, placement, as_numpy)
    results: list[Any] = [None] * len(chosen)
    fd = reader.fileno()  # (the file the plan was made for: never the path again; the reader closes it)
    hashes = {name: DIGESTS[name]() for name in expected}
    header_bytes = bytearray(data_offset)
    read_into(fd, memoryview(header_bytes), 0, path)
    for digest in hashes.values():
        digest.update(header_bytes)
    # Leaves bound for JAX are read and put on their device one at a time, so the host holds
    # one leaf, not a second copy of the tree (unless verifying, which reads all in file order).
    streamed = [] if hashes else [k for k in routes.plain if routes.to_jax[k]]
    wanted = {chosen[k] for k in routes.plain if k not in streamed}
    if hashes:
        wanted |= {chosen[k] for k in routes.sharded}
    host = _read_leaves(fd, path, data_offset, placement, sorted(wanted), list(hashes.values()),
                        every=len(leaves) if hashes else 0)
    for k in streamed:
        i = chosen[k]
        one = _read_leaves(fd, path, data_offset, placement, [i], [])[i]
        results[k] = _finish(path, one, leaves[i], forms[i], specs[k], placement, i, True, allow_overflow)
        del one
    if hashes:
        _hash_tail(fd, path, data_offset + placement.sample_bytes, reader.file_size, hashes.values())
        for name, digest in hashes.items():
            check_digest(path, name, digest.hexdigest(), expected[name])
    for k in routes.plain:
        if k not in streamed:
            i = chosen[k]
            results[k] = _finish(path, host[i], leaves[i], forms[i], specs[k], placement, i, routes.to_jax[k],
                                 allow_overflow)
    for k in routes.sharded:
        i = chosen[k]
        spec = specs[k]
        assert spec is not None  # (a sharded leaf has a target)
        results[k] = _restore_sharded(fd, path, data_offset + placement.offsets[i], leaves[i], forms[i],
                                      placement, i, spec, host.get(i), allow_overflow)
    return results


def _hash_tail(fd: int, path: str, end: int, file_size: int, hashes: Any) -> None:
    """Feeds the bytes after the sample (a file longer than its data) to the hashes."""
    if file_size > end:
        tail = bytearray(file_size - end)
        read_into(fd, memoryview(tail), end, path)
        for digest in hashes:
            digest.update(tail)


def _pieces(sizes: dict[int, int], piece: int | None) -> list[tuple[int, int, int]]:
    """(leaf, start, stop) byte ranges covering the leaves in order, each at most ``piece`` bytes
    (a whole leaf a range when ``piece`` is None)."""
    out = []
    for i, size in sizes.items():
        if piece is None or size <= piece:
            out.append((i, 0, size))
        else:
            out.extend((i, start, min(size, start + piece)) for start in range(0, size, piece))
    return out


def _read_leaves(fd: int, path: str, data_offset: int, placement: Placement, which: list[int],
                 hashes: list[Any], every: int = 0) -> dict[int, np.ndarray]:
    """Leaves ``which`` (in storage order) read into fresh arrays; on two threads when large (the
    page faults of fresh buffers are half the cost of a read, and they run in parallel). With
    ``hashes`` (hash objects), the reads go by pieces of :data:`HASH_PIECE` bytes, and this thread
    hashes each piece once it and every piece before it are read (the hashes see the file's byte
    order) while the two threads read on; then the leaves not in ``which`` (of the ``every``
    leaves) are read too, for the hash only, a piece at a time."""
    leaves = placement.layout.leaves
    out = {i: np.empty(leaves[i].shape, dtype=placement.value_dtype(i)) for i in which}
    order = range(every) if every else which
    sizes = {i: (out[i].nbytes if i in out else leaves[i].size * placement.disk_dtypes[i].itemsize) for i in order}
    pieces = _pieces(sizes, HASH_PIECE if hashes else None)

    def read(piece: tuple[int, int, int]) -> memoryview:
        i, start, stop = piece
        view = _as_bytes(out[i])[start:stop] if i in out else memoryview(bytearray(stop - start))
        read_into(fd, view, data_offset + placement.offsets[i] + start, path)
        return view

    if sum(sizes.values()) <= PARALLEL_READ_BYTES or len(pieces) < 2:
        for piece in pieces:
            view = read(piece)
            for digest in hashes:
                digest.update(view)
        return out
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pskd-read") as pool:
        for view in pool.map(read, pieces):  # in order
            for digest in hashes:
                digest.update(view)
    return out


def _as_bytes(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def _finish(path: str, raw: np.ndarray, leaf: Leaf, form: sd.Form | None, spec: TargetSpec | None,
            placement: Placement, i: int, to_jax: bool, allow_overflow: bool) -> Any:
    where = where_of(path, leaf)
    saved = saved_values(raw, leaf, form, placement, i, where)
    value = to_target(saved, spec, where, allow_overflow)
    is_key = form is not None and form.kind == sd.KIND_KEY
    if not to_jax or isinstance(value, (bool, int, float)):
        return value
    jax = jax_module()
    sharding = spec.sharding if spec is not None else None
    if is_key:
        assert form is not None and form.impl is not None  # (a key leaf's form names its implementation)
        keys = wrap_keys(jax.device_put(value), form.impl)
        return jax.device_put(keys, sharding) if sharding is not None else keys
    return jax.device_put(value, sharding) if sharding is not None else jax.device_put(value)


def _restore_sharded(fd: int, path: str, offset: int, leaf: Leaf, form: sd.Form | None, placement: Placement,
                     i: int, spec: TargetSpec, host: np.ndarray | None, allow_overflow: bool) -> Any:
    """A leaf built shard by shard, each distinct box read once from its region of the file."""
    jax = jax_module()
    where = where_of(path, leaf)
    disk, value = placement.disk_dtypes[i], placement.value_dtype(i)
    cache: dict[tuple, np.ndarray] = {}

    def shard(index: tuple) -> np.ndarray:
        index = tuple(index) if index is not None else ()
        key = tuple(s.indices(d) for s, d in zip(index, leaf.shape))
        if key not in cache:
            if host is not None:
                piece = np.ascontiguousarray(host[index]) if index else host
            else:
                piece = read_region(fd, path, offset, leaf.shape, disk, value, index)
            saved = saved_values(piece, leaf, form, placement, i, where)
            assert spec.dtype is not None  # (an array leaf: a key or a scalar is never sharded)
            cache[key] = cast(saved, spec.dtype, where, allow_overflow=allow_overflow)
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, spec.sharding, shard, dtype=spec.dtype)


def _read_stored_values(stored: StoredFile, read: ReadPlan, as_numpy: bool, expected: dict[str, str],
                        allow_overflow: bool) -> list[Any]:
    """A restore of an object of a store: every byte range the plan needs — whole leaves, and of a
    sharded leaf only the runs of the boxes this process's devices hold — read at once, many in
    flight, each into its destination array. Verified (``expected``), every leaf is read whole and
    the gaps too, and the digests are taken over the whole object in order before anything is
    returned. The object's version tag is compared after the reads: an object replaced meanwhile is
    E9003, never a mix of two saves."""
    path, placement = stored.path, read.placement
    leaves, forms, specs, chosen = read.view.layout.leaves, read.view.forms, read.specs, read.chosen
    data_offset = stored.header.data_offset
    routes = _routes(path, read, placement, as_numpy)
    whole = {chosen[k] for k in routes.plain} | ({chosen[k] for k in routes.sharded} if expected else set())
    host = {i: np.empty(leaves[i].shape, dtype=placement.value_dtype(i)) for i in sorted(whole)}
    spans: list[tuple[int, memoryview]] = [(data_offset + placement.offsets[i], _as_bytes(host[i]))
                                           for i in sorted(whole) if host[i].nbytes]
    boxes: dict[int, dict[tuple, np.ndarray]] = {}
    if not expected:
        for k in routes.sharded:
            spec = specs[k]
            assert spec is not None and spec.sharding is not None  # (a sharded leaf has a target)
            i = chosen[k]
            disk = placement.disk_dtypes[i]
            boxes[k] = {}
            for index in spec.sharding.addressable_devices_indices_map(leaves[i].shape).values():
                index = tuple(index) if index is not None else ()
                key = _box_key(index, leaves[i].shape)
                if key in boxes[k]:
                    continue
                box, runs, run = region_runs(leaves[i].shape, index)
                out = boxes[k][key] = np.empty(box, dtype=placement.value_dtype(i))
                flat, run_bytes = out.reshape(-1).view(np.uint8), run * disk.itemsize
                if run_bytes:
                    spans.extend((data_offset + placement.offsets[i] + start * disk.itemsize,
                                  flat[r * run_bytes : (r + 1) * run_bytes].data) for r, start in enumerate(runs))
    if expected:
        spans = _with_gaps(spans, data_offset, stored.file_size)
    stored.read_spans([view for _, view in spans], [offset for offset, _ in spans])
    now = stored.store.info(stored.key)
    if now is None or now.tag != stored.tag:
        raise TruncatedError(f"{path}: the object was replaced or removed while it was read; nothing was restored "
                             "from it (restore again)")
    if expected:
        hashes = {name: DIGESTS[name]() for name in expected}
        for digest in hashes.values():
            digest.update(stored.header_bytes)
            for _, view in spans:
                digest.update(view)
        for name, digest in hashes.items():
            check_digest(path, name, digest.hexdigest(), expected[name])
    results: list[Any] = [None] * len(chosen)
    for k in routes.plain:
        i = chosen[k]
        results[k] = _finish(path, host[i], leaves[i], forms[i], specs[k], placement, i, routes.to_jax[k],
                             allow_overflow)
    for k in routes.sharded:
        i = chosen[k]
        spec = specs[k]
        assert spec is not None
        results[k] = _sharded_of(path, leaves[i], forms[i], placement, i, spec, host.get(i), boxes.get(k, {}),
                                 allow_overflow)
    return results


def _box_key(index: tuple, shape: tuple[int, ...]) -> tuple:
    return tuple(s.indices(d) for s, d in zip(index, shape))


def _with_gaps(spans: list[tuple[int, memoryview]], start: int, end: int) -> list[tuple[int, memoryview]]:
    """``spans`` in order with buffers for the bytes between them (and up to ``end``): together
    they cover ``[start, end)``, for a digest of the whole object."""
    out: list[tuple[int, memoryview]] = []
    position = start
    for offset, view in sorted(spans, key=lambda pair: pair[0]):
        if offset > position:
            out.append((position, memoryview(bytearray(offset - position))))
        out.append((offset, view))
        position = max(position, offset + len(view))
    if end > position:
        out.append((position, memoryview(bytearray(end - position))))
    return out


def _sharded_of(path: str, leaf: Leaf, form: sd.Form | None, placement: Placement, i: int, spec: TargetSpec,
                host: np.ndarray | None, boxes: dict[tuple, np.ndarray], allow_overflow: bool) -> Any:
    """A sharded leaf made from the boxes read for this process's devices (or sliced from the
    whole leaf, when it was read whole)."""
    jax = jax_module()
    where = where_of(path, leaf)
    cache: dict[tuple, np.ndarray] = {}

    def shard(index: tuple) -> np.ndarray:
        index = tuple(index) if index is not None else ()
        key = _box_key(index, leaf.shape)
        if key not in cache:
            piece = (np.ascontiguousarray(host[index]) if index else host) if host is not None else boxes[key]
            saved = saved_values(piece, leaf, form, placement, i, where)
            assert spec.dtype is not None  # (an array leaf: a key or a scalar is never sharded)
            cache[key] = cast(saved, spec.dtype, where, allow_overflow=allow_overflow)
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, spec.sharding, shard, dtype=spec.dtype)


def read_saved_leaves(path: str | os.PathLike, *,
                      layout: Any = None) -> tuple[list[tuple[str, Any]], LayoutFile | None]:
    """Every leaf of a checkpoint as (key path, saved value), in storage order, as numpy (key
    arrays as their key data, Python scalars as themselves), and its layout file (when it has
    one): what a conversion writes out."""
    path = os.fspath(path)
    reader, read = _open_planned(path, None, layout, False)
    with reader:
        leaves = read.view.layout.leaves
        out = []
        for i in read.chosen:
            # Positional reads, leaf by leaf: a file cut short meanwhile is E9003, never a SIGBUS.
            raw = reader.leaf_range(0, i, 0, leaves[i].size).reshape(leaves[i].shape)
            where = where_of(path, leaves[i])
            out.append((leaves[i].path, saved_values(raw, leaves[i], read.view.forms[i], read.placement, i, where)))
    return out, read.view.layout_file


__all__ = ["HASH_PIECE", "PARALLEL_READ_BYTES", "read_saved_leaves", "restore"]
