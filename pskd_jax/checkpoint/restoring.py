"""Restoring a checkpoint exactly, into numpy or JAX arrays, sharded or not.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
from typing import Any, Sequence
import numpy as np
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader
from pskd_jax.format.encodings import is_real_dtype
from pskd_jax.errors import BadValueError, MismatchError, NotClosedError, TruncatedError
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.positional import read_into
from pskd_jax.checkpoint.integrity import check_digest, expected_digests, verify_file
from pskd_jax.checkpoint.jax_arrays import is_array_like, jax_module, sharding_of, single_device, wants_jax
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.layout_file import find_layout, read_layout
from pskd_jax.checkpoint.regions import read_region


PARALLEL_READ_BYTES = 64 << 20  # restores larger than this read leaves on two threads

HASH_PIECE = 16 << 20  # a verified restore reads, and hashes, pieces of at most this size

def _target_pairs(target: Any) -> tuple[list[tuple[str, Any]], Any]:
    pairs, rebuild = tree_lib.flatten(target)
    return pairs, rebuild

def _describe(shape: Sequence[int], dtype: Any) -> str:
    return f"{tuple(shape)} {tree_lib.describe_dtype(np.dtype(dtype))}"

def _check_target(path: str, file_layout: Layout, placement: Placement | None, pairs: list[tuple[str, Any]]) -> None:
    """Refuses a target whose structure or shapes differ from the file's (E9005 at the key path)."""
    file_leaves = file_layout.leaves
    found_paths = [leaf.path for leaf in file_leaves]
    target_paths = [p for p, _ in pairs]
    if found_paths != target_paths:
        for k, (want, have) in enumerate(zip(target_paths, found_paths)):
            if want != have:
                raise MismatchError(f"{path}: leaf {k}: the target has {want or '(root)'} where the checkpoint has "
                    f"{have or '(root)'} (leaves in declaration order)",
                )
        if len(target_paths) > len(found_paths):
            raise MismatchError(f"{path}: at {target_paths[len(found_paths)]}: expected by the target, "
                                      f"not in the checkpoint ({len(found_paths)} leaves)")
        raise MismatchError(f"{path}: at {found_paths[len(target_paths)]}: in the checkpoint, missing from "
                                  f"the target ({len(target_paths)} leaves)")
    for i, ((key, spec), leaf) in enumerate(zip(pairs, file_leaves)):
        shape = tuple(int(d) for d in getattr(spec, "shape", np.shape(spec)))
        if shape != leaf.shape:
            found = placement.value_dtype(i) if placement else None
            raise MismatchError(f"{path}: at {key or '(root)'}: expected {_describe(shape, _spec_dtype(spec))}, "
                f"found {tuple(leaf.shape)}" + (f" {tree_lib.describe_dtype(found)}" if found is not None else ""),
            )
        dtype = _spec_dtype(spec)
        if leaf.is_real != is_real_dtype(dtype):
            kind = "reals" if leaf.is_real else f"indices below {leaf.bound}"
            raise MismatchError(f"{path}: at {key or '(root)'}: expected {_describe(shape, dtype)}, "
                                      f"found {kind}")

def _spec_dtype(spec: Any) -> np.dtype:
    return np.dtype(spec.dtype) if is_array_like(spec) else np.asarray(spec).dtype

def _resolve_file_layout(reader: Reader, layout: Any, target_pairs) -> tuple[Layout, bool]:
    """The layout to read the file with, and whether it came from the file's side (type text,
    layout file or explicit layout) rather than from the target alone."""
    if layout is not None:
        if isinstance(layout, (str, os.PathLike)):
            return read_layout(layout), True
        if isinstance(layout, Layout):
            return layout, True
        return tree_lib.layout_of_template(layout), True
    if not reader.header.is_params:
        return Layout.of_type(reader.header.type_text), True
    beside = find_layout(reader.path)
    if beside is not None:
        return beside, True
    if target_pairs is None:
        raise NotClosedError(f"{reader.path}: type {reader.header.type_text!r} needs its layout: pass a target pytree, "
            f"layout=..., or keep {os.path.basename(layout_path_for(reader.path))} beside it",
        )
    leaves = tuple(tree_lib.leaf_of_spec(p, spec) for p, spec in target_pairs)
    return Layout(leaves, tuple(range(len(leaves)))), False

def _as_bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))

def _cast(array: np.ndarray, dtype: np.dtype, leaf: Leaf, where: str) -> np.ndarray:
    """The explicit cast a target asks for; an integer cast that would change a value is refused."""
    if array.dtype == dtype:
        return array
    if dtype.kind in "iu" and array.dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if leaf.bound is None or leaf.bound - 1 > info.max:
            high = int(array.max())
            if high > info.max:
                raise BadValueError(f"{where}: the stored value {high} does not fit the target's {dtype}")
    if dtype.kind in "iub" and leaf.is_real:
        raise MismatchError(f"{where}: expected {dtype}, found reals")
    return array.astype(dtype)

def _check_x64(where: str, dtype: np.dtype, asked: bool) -> None:
    jax = jax_module()
    if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        stored = "f64" if dtype.kind == "f" else str(dtype)
        how = "ask for float32 in the target" if dtype.kind == "f" else "ask for a 32-bit integer dtype in the target"
        raise MismatchError(f"{where}: {'the target asks for' if asked else 'stored as'} {stored}, but JAX has x64 disabled: "
            f"enable jax_enable_x64 or {how} (an explicit cast)",
        )

def restore(
    path: str | os.PathLike,
    target: Any = None,
    *,
    layout: Any = None,
    as_numpy: bool = False,
    zero_copy: bool = False,
    sha256: str | None = None,
    xxh3_128: str | None = None,
) -> Any:
    """Restores a checkpoint, every leaf bit for bit in its stored encoding.

    ``target`` is a pytree of arrays or ``jax.ShapeDtypeStruct``s: its structure, shapes and dtypes
    are what the result has. A target dtype that differs from the stored one is an explicit cast;
    a leaf whose target carries a ``jax.sharding.Sharding`` is built shard by shard, each read from
    its own region of the file. Without a target, a closed type restores to its tuple and a
    ``params`` file needs its layout (``layout=`` a :class:`Layout`, template or layout file, or
    the ``NAME.layout.json`` beside it; E9001 otherwise).

    Leaves come back as JAX arrays, except for numpy target leaves, with ``as_numpy=True``, and with
    ``zero_copy=True`` (read-only numpy views of the map, for tools that only read). f64 (and 64-bit
    index) leaves into JAX with x64 disabled are refused unless the target asks for a narrower dtype.

    ``xxh3_128`` or ``sha256`` (hex) checks the whole file's digest while reading (each given is
    checked) and raises E9013 naming the file on a mismatch; nothing is returned from a file that
    does not verify.
    """
    path = os.fspath(path)
    expected = expected_digests(path, {"xxh3_128": xxh3_128, "sha256": sha256})
    target_pairs, rebuild = _target_pairs(target) if target is not None else (None, None)
    with Reader(path) as reader:
        file_layout, from_file = _resolve_file_layout(reader, layout, target_pairs)
        reader.with_layout(file_layout)
        placement = reader.placement
        if reader.header.count != 1:
            raise MismatchError(f"{path}: a checkpoint holds one sample, this file holds {reader.header.count}")
        if target_pairs is not None and from_file:
            _check_target(path, file_layout, placement, target_pairs)
        specs = [spec for _, spec in target_pairs] if target_pairs is not None else [None] * len(file_layout.leaves)
        if zero_copy:
            if expected:
                verify_file(path, **expected)
            values = _map_views(path, reader, placement)
            return rebuild(values) if rebuild is not None else file_layout.unflatten(values)
        return _restore_read(path, reader, file_layout, placement, specs, rebuild, as_numpy, expected)

def _map_views(path: str, reader: Reader, placement: Placement) -> list[np.ndarray]:
    """Read-only views of each leaf over a map of their own: ``np.frombuffer`` holds the map's
    buffer, so the map lives exactly as long as a view does (the reader's own map closes)."""
    leaves = placement.layout.leaves
    if reader.file_size == 0 or placement.sample_bytes == 0:
        return [np.zeros(leaf.shape, placement.value_dtype(i)) for i, leaf in enumerate(leaves)]
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise TruncatedError(f"{path}: cannot map: {e.strerror or e}") from None
    views = []
    for i, leaf in enumerate(leaves):
        view = np.frombuffer(mapped, dtype=placement.disk_dtypes[i], count=leaf.size,
                             offset=reader.header.data_offset + placement.offsets[i])
        views.append(view.reshape(leaf.shape).view(placement.value_dtype(i)))
    return views

def _restore_read(path, reader, file_layout, placement, specs, rebuild, as_numpy, expected: dict[str, str]):
    leaves = file_layout.leaves
    data_offset = reader.header.data_offset
    results: list[Any] = [None] * len(leaves)
    plain: list[int] = []  # leaves read whole into host memory
    sharded: list[int] = []
    for i, spec in enumerate(specs):
        (sharded if (not as_numpy and sharding_of(spec) is not None
                     and not single_device(sharding_of(spec))) else plain).append(i)
    jax_leaf = [not as_numpy and (spec is None or wants_jax(spec)) for spec in specs]
    for i, leaf in enumerate(leaves):
        if jax_leaf[i]:
            spec = specs[i]
            dtype = _spec_dtype(spec) if spec is not None else placement.value_dtype(i)
            _check_x64(f"{path}: at {leaf.path or '(root)'}", dtype, spec is not None)
    fd = os.open(path, os.O_RDONLY)
    hashes = {name: DIGESTS[name]() for name in expected}
    try:
        header_bytes = bytearray(data_offset)
        read_into(fd, memoryview(header_bytes), 0, path)
        for digest in hashes.values():
            digest.update(header_bytes)
        # Leaves bound for JAX are read and put on their device one at a time, so the host holds
        # one leaf, not a second copy of the tree (unless verifying, which reads all in file order).
        streamed = [] if hashes else [i for i in plain if jax_leaf[i]]
        first = list(range(len(leaves))) if hashes else [i for i in plain if not jax_leaf[i]]
        host = _read_leaves(fd, path, data_offset, placement, first, list(hashes.values()))
        for i in streamed:
            one = _read_leaves(fd, path, data_offset, placement, [i], [])[i]
            results[i] = _finish_host(path, one, leaves[i], specs[i], True)
            del one
        if hashes:
            end = data_offset + placement.sample_bytes
            if reader.file_size > end:
                tail = bytearray(reader.file_size - end)
                read_into(fd, memoryview(tail), end, path)
                for digest in hashes.values():
                    digest.update(tail)
            for name, digest in hashes.items():
                check_digest(path, name, digest.hexdigest(), expected[name])
        for i in plain:
            if i not in streamed:
                results[i] = _finish_host(path, host.pop(i), leaves[i], specs[i], jax_leaf[i])
        for i in sharded:
            results[i] = _restore_sharded(fd, path, data_offset + placement.offsets[i], leaves[i],
                                          placement, i, specs[i], host.get(i))
    finally:
        os.close(fd)
    return rebuild(results) if rebuild is not None else file_layout.unflatten(results)

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
                 hashes: list[Any]) -> dict[int, np.ndarray]:
    """Leaves ``which`` (in storage order) read into fresh arrays; on two threads when large (the
    page faults of fresh buffers are half the cost of a read, and they run in parallel). With
    ``hashes`` (hash objects), the reads go by pieces of :data:`HASH_PIECE` bytes, and this thread
    hashes each piece once it and every piece before it are read (the hashes see the file's byte
    order) while the two threads read on."""
    leaves = placement.layout.leaves
    out = {i: np.empty(leaves[i].shape, dtype=placement.value_dtype(i)) for i in which}
    pieces = _pieces({i: out[i].nbytes for i in which}, HASH_PIECE if hashes else None)

    def read(piece: tuple[int, int, int]) -> memoryview:
        i, start, stop = piece
        view = _as_bytes(out[i])[start:stop]
        read_into(fd, view, data_offset + placement.offsets[i] + start, path)
        return view

    if sum(out[i].nbytes for i in which) <= PARALLEL_READ_BYTES or len(pieces) < 2:
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

def _finish_host(path: str, array: np.ndarray, leaf: Leaf, spec: Any, to_jax: bool) -> Any:
    where = f"{path}: at {leaf.path or '(root)'}"
    if spec is not None:
        array = _cast(array, _spec_dtype(spec), leaf, where)
    if not to_jax:
        return array
    jax = jax_module()
    sharding = sharding_of(spec)
    return jax.device_put(array, sharding) if sharding is not None else jax.device_put(array)

def _restore_sharded(fd: int, path: str, offset: int, leaf: Leaf, placement: Placement, i: int, spec: Any,
                     host: np.ndarray | None) -> Any:
    jax = jax_module()
    sharding = sharding_of(spec)
    dtype = _spec_dtype(spec)
    where = f"{path}: at {leaf.path or '(root)'}"
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
            cache[key] = _cast(piece, dtype, leaf, where)
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, sharding, shard, dtype=dtype)


__all__ = ["HASH_PIECE", "PARALLEL_READ_BYTES", "restore"]
