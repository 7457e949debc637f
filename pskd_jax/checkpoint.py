"""Pytree checkpoints: save a parameter tree as one ``.psk.d`` sample, restore it exactly.

A checkpoint is a ``.psk.d`` file holding one sample (SPEC §3–4):

- a parameter tree is written as type ``params NAME``, its leaves in *declaration order* (dict
  insertion order, dataclass and NamedTuple fields, list and tuple order); a plain tuple of arrays
  is written as the closed tuple type (``(ℝ[2, 3], idx[256][4])``), a single array as its own
  closed type;
- each real leaf in the encoding of its dtype: float64 → f64, float32 → f32, bfloat16 → bf16,
  float16 → f32 (exact); ``Fraction``, ``Decimal``, ``numpy.longdouble`` and other reals are
  rounded once to f64; bool → ``idx[2]``, unsigned intK → ``idx[2^K]``, signed intK →
  ``idx[2^(K-1)]`` with negative values refused (E9004);
- narrowing a value its encoding does not hold is refused unless ``round_to_encoding=True``, which
  rounds half-even and reports the largest error per leaf; NaN and ±Inf are refused, naming the
  leaf's key path and index. The caller's tree is never modified.

The write is atomic: a temporary file in the same directory, flushed, synced, renamed over the
destination, and the directory synced. Saves of one destination take turns, in any process (an
``flock`` on ``.NAME.psk.d.lock`` beside it, removed when the save is done:
:func:`destination_lock`), so that the checkpoint and its layout file always come from one save;
the layout file is written once every value was accepted, so a refused save writes no file at all.
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
  checkpoint manager records): it detects damage — a flipped bit or byte, a torn copy — and at
  about 17 GB/s a core it keeps a verified restore at 1.3–1.5× an unverified one on this
  project's 2-core machine (``bench/bench_checkpoint.py``). It is not cryptographic: it does not
  stand against someone who crafts a file to match (nor does a digest kept in the same directory
  as the file);
- ``sha256``, for digests that ``sha256sum`` reproduces and that hold against tampering, and for
  checkpoint indexes written before xxh3_128. At 1.5 GB/s a core (one core: it cannot be split)
  a restore verified with it takes about 5× an unverified one there.

A verified restore reads the file in pieces of :data:`HASH_PIECE` bytes on two threads, straight
into the result's arrays, while the calling thread hashes each piece once it and every piece
before it are in: the bytes hashed are the bytes returned, and hashing overlaps reading.

This module imports numpy but not JAX: JAX is imported only when a restore makes device arrays
(the data tools and ``pskd verify``/``convert`` stay free of it, SPEC §10).
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import mmap
import os
import queue
import re
import threading
from typing import Any, Iterator, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: saves of one destination are not serialised
    fcntl = None

import numpy as np
import xxhash

from pskd_jax import tree as tree_lib
from pskd_jax.container import Placement, Reader, check_finite_encoded, encode_header
from pskd_jax.encodings import (
    REAL_DTYPES,
    Encoding,
    Rounding,
    Site,
    encoding_of_dtype,
    is_real_dtype,
    narrow,
    to_f64,
    to_index,
)
from pskd_jax.errors import BAD_USAGE, BAD_VALUE, DIGEST_MISMATCH, MISMATCH, NOT_CLOSED, TRUNCATED, PskdError
from pskd_jax.fileio import atomic_output, fsync_directory, hash_file
from pskd_jax.sample_type import MAX_NESTING, Layout, Leaf, ParamsType, header_text, parse_type

CHUNK_BYTES = 8 << 20  # a conversion or a check works on at most this much at a time
READ_PIECE = 1 << 30  # one preadv moves at most this (Linux caps a call near 2 GiB)
PARALLEL_READ_BYTES = 64 << 20  # restores larger than this read leaves on two threads
HASH_PIECE = 16 << 20  # a verified restore reads, and hashes, pieces of at most this size
DIGESTS = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}  # algorithm → a new hash object
CHECKPOINT_DIGEST = "xxh3_128"  # the digest a checkpoint directory records (the faster one)
LAYOUT_FORMAT = "pskd-layout"
LAYOUT_VERSION = 1
# A key path (of a tree to save, a layout file, a safetensors name) holds at most this many keys:
# the nesting a sample type may have, so that no tree is rebuilt by recursing without bound.
MAX_KEY_DEPTH = MAX_NESTING
_IDENT = re.compile(r"[^\W\d]\w*")


def _jax():
    """JAX, imported when device arrays are made (never at import: SPEC §10)."""
    return importlib.import_module("jax")


# --------------------------------------------------------------------------------------------
# Leaves of a tree to save


def _is_plain_tuple(node: Any) -> bool:
    return type(node) is tuple


def _is_array_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _is_global(value: Any) -> bool:
    """A JAX array spread over several processes (no process holds all of it)."""
    return _is_array_like(value) and getattr(value, "is_fully_addressable", True) is False


def _host_array(value: Any, path: str, *, keep_global: bool = False) -> Any:
    """A leaf as a numpy array without copying when it already is one (the caller's buffer is
    only ever read). Python numbers and objects with ``__float__`` become object arrays that
    :func:`to_f64` rounds once. A global JAX array stays as it is when ``keep_global``."""
    if isinstance(value, np.ndarray):
        return value
    if _is_array_like(value):
        if _is_global(value) and keep_global:
            return value
        if _is_global(value):
            raise PskdError(
                MISMATCH,
                f"leaf {path or '(root)'}: an array spread over several processes; "
                "use save_distributed (every process calls it)",
            )
        return np.asarray(value)
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, int):
        return np.asarray(value, dtype=np.int64) if -(2**63) <= value < 2**63 else np.asarray(value, dtype=object)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    return np.asarray(value, dtype=object) if not isinstance(value, (list, tuple)) else np.asarray(value)


def _leaf_for(path: str, array: np.ndarray) -> Leaf:
    """The stored leaf of a value (SPEC §3); object arrays of reals are real leaves."""
    if array.dtype == object:
        flat = array.reshape(-1)
        if flat.size and all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            low, high = min(flat), max(flat)
            if low < 0:
                raise PskdError(BAD_VALUE, f"leaf {path or '(root)'}: {low} is not an index (negative)")
            return Leaf(path, tuple(array.shape), max(2, 1 << max(1, int(high).bit_length())))
        return Leaf(path, tuple(int(d) for d in array.shape))
    return tree_lib.leaf_of_spec(path, array)


def _default_encoding(leaf: Leaf, array: np.ndarray) -> Encoding:
    if not leaf.is_real:
        return Encoding.F64
    # (a byte-swapped float32 is still a float32: compare in native byte order)
    dtype = np.dtype(array.dtype)
    return encoding_of_dtype(dtype.newbyteorder("=")) if is_real_dtype(dtype) else Encoding.F64


def _encodings_asked(pairs: list[tuple[str, Any]], leaves: list[Leaf], asked: Any) -> list[Encoding | None]:
    """``encodings``: None, one label for every real leaf, a sequence in storage order, or a dict
    from key path to label."""
    if asked is None:
        return [None] * len(leaves)
    if isinstance(asked, (str, Encoding)):
        one = Encoding.parse(asked) if isinstance(asked, str) else Encoding(asked)
        return [one if leaf.is_real else None for leaf in leaves]
    if isinstance(asked, dict):
        unknown = set(asked) - {p for p, _ in pairs}
        if unknown:
            raise PskdError(MISMATCH, f"encodings given for {sorted(unknown)}, which are not leaves of the tree")
        labels = [asked.get(p) for p, _ in pairs]
    else:
        labels = list(asked)
        if len(labels) != len(leaves):
            raise PskdError(MISMATCH, f"{len(labels)} encodings for a tree of {len(leaves)} leaves")
    out: list[Encoding | None] = []
    for leaf, label in zip(leaves, labels):
        if label is None or label == "-":
            out.append(None)
            continue
        encoding = Encoding.parse(label) if isinstance(label, str) else Encoding(label)
        if not leaf.is_real and encoding != Encoding.F64:
            raise PskdError(MISMATCH, f"leaf {leaf.path or '(root)'} is an index leaf; it has no real encoding")
        out.append(encoding)
    return out


@dataclasses.dataclass
class _Plan:
    """What a save writes: the type, and per leaf its array, stored leaf, encoding and dtype."""

    type_text: str
    paths: list[str]
    arrays: list[np.ndarray]
    dtypes: list[str]  # the dtype of each leaf as given, for the layout file
    layout: Layout
    placement: Placement

    @property
    def header(self) -> bytes:
        return encode_header(self.type_text, 1, self.placement.encodings)

    @property
    def size(self) -> int:
        return len(self.header) + self.placement.sample_bytes


def _type_name(tree: Any, name: str | None) -> str:
    if name is None:
        kind = type(tree)
        name = kind.__name__ if (dataclasses.is_dataclass(tree) or hasattr(kind, "_fields")) else "Params"
    if not _IDENT.fullmatch(name) or name in ("params", "idx", "bool", "R", "ℝ"):
        raise PskdError(NOT_CLOSED, f"params name {name!r}: expected an identifier such as 'MiniGPT'")
    return name


def _closed_leaf_text(leaf: Leaf, dtype: np.dtype) -> str:
    dims = "[" + ", ".join(str(d) for d in leaf.shape) + "]"
    if leaf.is_real:
        return "ℝ" + dims
    if dtype == np.bool_:
        return "bool" + dims
    return f"idx[{leaf.bound}]" + dims


def plan(tree: Any, *, name: str | None = None, encodings: Any = None, keep_global: bool = False) -> _Plan:
    """The type, layout and encodings a save of ``tree`` writes (no file is touched)."""
    pairs, _ = tree_lib.flatten(tree)
    if not pairs:
        raise PskdError(MISMATCH, "the tree has no leaves: nothing to save")
    arrays = [_host_array(value, path, keep_global=keep_global) for path, value in pairs]
    leaves = [_leaf_for(path, array) for (path, _), array in zip(pairs, arrays)]
    asked = _encodings_asked(pairs, leaves, encodings)
    chosen = [a if a is not None else _default_encoding(leaf, array) for a, leaf, array in zip(asked, leaves, arrays)]
    if _is_array_like(tree) and not isinstance(tree, (list, tuple, dict)):
        type_text = _closed_leaf_text(leaves[0], arrays[0].dtype)
        layout = Layout.of_type(type_text)
    elif _is_plain_tuple(tree) and len(tree) >= 2 and all(_is_array_like(v) or isinstance(v, (int, float)) for v in tree) \
            and len(pairs) == len(tree):
        type_text = "(" + ", ".join(_closed_leaf_text(l, a.dtype) for l, a in zip(leaves, arrays)) + ")"
        layout = Layout.of_type(type_text)
    else:
        type_text = f"params {_type_name(tree, name)}"
        for path, _ in pairs:  # its layout file could not be read back
            _check_key_depth(path_keys(path), f"leaf {path}")
        _, rebuild = tree_lib.flatten(tree)
        layout = Layout(tuple(leaves), tuple(range(len(leaves))), rebuild)
    placement = Placement.of(layout, chosen)
    dtypes = [tree_lib.describe_dtype(np.dtype(a.dtype)) if a.dtype != object else "float64" for a in arrays]
    return _Plan(header_text(type_text), [p for p, _ in pairs], arrays, dtypes, layout, placement)


# --------------------------------------------------------------------------------------------
# Encoding leaves, chunk by chunk


@dataclasses.dataclass(frozen=True)
class _ChunkSite(Site):
    """Names positions of a chunk by their index in the whole leaf."""

    full_shape: tuple[int, ...] = ()
    start: int = 0
    origin: tuple[int, ...] = ()  # where the chunk's box starts in the leaf (a shard's corner)

    def at(self, shape: tuple[int, ...], flat_index: int) -> str:
        position = np.unravel_index(self.start + flat_index, self.full_shape) if self.full_shape else ()
        if self.origin:
            position = tuple(p + o for p, o in zip(position, self.origin))
        return f"{self.leaf} at index {[int(i) for i in position]}"


def _flat_chunks(array: np.ndarray, max_bytes: int):
    """(start, flat contiguous chunk) pieces of an array, each at most ``max_bytes`` (or one row)."""
    if array.ndim == 0:
        yield 0, array.reshape(1)
        return
    itemsize = max(1, array.dtype.itemsize)
    if array.flags.c_contiguous:
        flat = array.reshape(-1)
        step = max(1, max_bytes // itemsize)
        for start in range(0, flat.size, step):
            yield start, flat[start : start + step]
        return
    row = math.prod(array.shape[1:])
    rows = max(1, max_bytes // max(1, row * itemsize))
    for r in range(0, array.shape[0], rows):
        yield r * row, np.ascontiguousarray(array[r : r + rows]).reshape(-1)


def _encode_chunks(i: int, plan_: _Plan, round_to_encoding: bool, reports: dict[int, Rounding],
                   array: np.ndarray | None = None, origin: tuple[int, ...] = ()):
    """Leaf i (or the box ``array`` of it starting at ``origin``) as on-disk bytes, chunk by chunk
    (views of the caller's buffer when no conversion is needed). Refuses what its encoding does not
    hold (E9004)."""
    placement = plan_.placement
    leaf = placement.layout.leaves[i]
    if array is None:
        array = plan_.arrays[i]
    box = tuple(array.shape)
    disk = placement.disk_dtypes[i]
    name = f"leaf {leaf.path or '(root)'}"
    if leaf.is_real:
        encoding = placement.encodings[i]
        native = array.dtype == REAL_DTYPES[encoding]
        for start, chunk in _flat_chunks(array, CHUNK_BYTES):
            site = _ChunkSite(name, full_shape=box, start=start, origin=origin)
            if native:
                check_finite_encoded(chunk, encoding, site)
                yield chunk.view(disk)
                continue
            narrowed, report = narrow(to_f64(chunk, leaf=site), encoding, leaf=site,
                                      round_to_encoding=round_to_encoding)
            if report is not None:
                if report.where:
                    where = np.unravel_index(start + report.where[0], box) if box else ()
                    report.where = tuple(int(k) + (origin[a] if origin else 0) for a, k in enumerate(where))
                report.leaf = name
                if i in reports:
                    reports[i].merge(report)
                else:
                    reports[i] = report
            yield narrowed.astype(REAL_DTYPES[encoding], copy=False).view(disk)
        return
    for start, chunk in _flat_chunks(array, CHUNK_BYTES):
        site = _ChunkSite(name, full_shape=box, start=start, origin=origin)
        if chunk.dtype == disk or chunk.dtype == np.bool_:
            yield chunk.view(disk)  # every value of the dtype is below the bound
        else:
            yield to_index(chunk, leaf.bound, leaf=site)


# --------------------------------------------------------------------------------------------
# Saving


@dataclasses.dataclass
class SaveResult:
    """What :func:`save` wrote; ``sha256`` or ``xxh3_128`` is the file's digest when asked for."""

    path: str
    type_text: str
    version: int
    encodings: tuple[Encoding, ...]
    rounding: list[Rounding]
    bytes: int
    sha256: str | None = None
    layout_path: str | None = None
    xxh3_128: str | None = None

    @property
    def digest(self) -> dict[str, str]:
        """The digests computed, by algorithm (``{"xxh3_128": hex}``; empty when none was asked)."""
        return {name: getattr(self, name) for name in DIGESTS if getattr(self, name) is not None}


def _digest_algorithm(digest: bool | str) -> str | None:
    """``save``'s ``digest``: False (none), True (sha256, as ``sha256sum`` prints it), or an
    algorithm of :data:`DIGESTS`."""
    if digest is False or digest is None:
        return None
    if digest is True:
        return "sha256"
    if digest not in DIGESTS:
        raise PskdError(BAD_USAGE, f"digest={digest!r}: expected one of {sorted(DIGESTS)}, True (sha256) or False")
    return digest


def _expected_digests(path: str, expected: dict[str, str | None]) -> dict[str, str]:
    """The digests a restore or a check was given, by algorithm, as lowercase hex."""
    out = {}
    for name, value in expected.items():
        if value is None:
            continue
        if name not in DIGESTS:
            raise PskdError(BAD_USAGE, f"{path}: cannot check a {name} digest: expected one of {sorted(DIGESTS)}")
        if not isinstance(value, str):
            raise PskdError(BAD_USAGE, f"{path}: the {name} digest must be a hex string, got {value!r}")
        out[name] = value.lower()
    return out


class _Hasher:
    """A digest of a byte stream, computed on a helper thread (hashlib and xxhash release the
    GIL), so that hashing overlaps writing or reading. ``feed`` keeps a reference to each piece
    until hashed; ``hexdigest`` or ``abandon`` ends the thread."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._hash = DIGESTS[algorithm]()
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, name=f"pskd-{algorithm}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            piece = self._queue.get()
            if piece is None:
                return
            self._hash.update(piece)

    def feed(self, piece: Any) -> None:
        self._queue.put(memoryview(piece).cast("B") if not isinstance(piece, bytes) else piece)

    def hexdigest(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self._hash.hexdigest()

    def abandon(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _bytes_of(chunk: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))


def lock_path_for(path: str | os.PathLike) -> str:
    """``dir/NAME.psk.d`` → ``dir/.NAME.psk.d.lock``, the file a save of ``NAME.psk.d`` holds
    locked while it writes (and removes when it is done)."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, "." + name + ".lock")


def _open_lock(lock: str, path: str) -> int:
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        directory = os.path.dirname(os.path.abspath(path))
        raise PskdError(TRUNCATED, f"{path}: cannot create a file in {directory}: {e.strerror or e}") from None
    except ValueError:  # a NUL in the path
        raise PskdError(TRUNCATED, f"{path!r}: cannot create a file: a path holds no NUL byte") from None


@contextlib.contextmanager
def destination_lock(path: str | os.PathLike, *, wait: bool = True) -> Iterator[bool]:
    """Holds the ``flock`` of :func:`lock_path_for` ``(path)``: one save of a destination at a
    time, in any process, so that a checkpoint and its layout file always come from the same save.
    Yields True once held (waiting for another save of the destination to finish); with
    ``wait=False``, yields False at once when another save holds it.

    The lock file is removed on the way out, while still held; a save that finds the file it locked
    removed (or replaced) by then locks the new one instead, so two holders never coexist. A lock
    file left by a killed save is reused by the next save of its destination (and removed then)."""
    path = os.fspath(path)
    if fcntl is None:
        yield True
        return
    lock = lock_path_for(path)
    while True:
        fd = _open_lock(lock, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except OSError:  # a filesystem without flock: go on unlocked, as where there is no fcntl
            break
        try:
            if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except OSError:
            pass
        os.close(fd)  # removed by its last holder while this one waited: lock the current file
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


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
) -> SaveResult:
    """Saves a pytree as a one-sample ``.psk.d`` file, atomically.

    ``name`` names a ``params`` type (default: the class name of a dataclass or NamedTuple root,
    else ``Params``). ``encodings`` overrides the encoding of real leaves: one label (``"bf16"``)
    for all, a sequence in storage order, or a dict from key path to label; narrowing needs
    ``round_to_encoding=True``, and the largest error per leaf is in the result's ``rounding``.
    ``layout_file`` writes ``NAME.layout.json`` beside a ``params`` checkpoint. ``digest`` returns
    the whole file's digest, computed while writing on a second thread: ``"xxh3_128"`` (the
    faster, which a checkpoint directory records) in the result's ``xxh3_128``, ``"sha256"`` or
    True (as ``sha256sum`` prints it) in its ``sha256``.

    A save waits for another save of the same destination (in any process) to finish; a tree
    nested deeper than :data:`MAX_KEY_DEPTH` is refused (E9005), its layout could not be read back.

    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.psk.d")
    >>> result = save(path, {"w": np.ones((2, 3), np.float32), "step": np.int32(7)})
    >>> result.type_text, [e.label for e in result.encodings]
    ('params Params', ['f32', 'f64'])
    >>> restore(path, {"w": np.zeros((2, 3), np.float32), "step": np.int32(0)})["step"]
    array(7, dtype=int32)
    """
    path = os.fspath(path)
    if any(_is_global(value) for _, value in tree_lib.flatten(tree)[0]):
        return save_distributed(path, tree, name=name, encodings=encodings, round_to_encoding=round_to_encoding,
                                durable=durable, layout_file=layout_file, digest=digest)
    algorithm = _digest_algorithm(digest)
    plan_ = plan(tree, name=name, encodings=encodings)
    reports: dict[int, Rounding] = {}
    layout_path = None
    if layout_file and isinstance(parse_type(plan_.type_text), ParamsType):
        layout_path = layout_path_for(path)
    hasher = _Hasher(algorithm) if algorithm else None
    try:
        # One save of a destination at a time (its data and its layout go together), and the
        # layout is written only once every value was accepted: a refused save writes nothing.
        with destination_lock(path), atomic_output(path, durable=durable) as f:
            header = plan_.header
            f.write(header)
            if hasher:
                hasher.feed(header)
            for i in range(len(plan_.arrays)):
                for chunk in _encode_chunks(i, plan_, round_to_encoding, reports):
                    data = _bytes_of(chunk)
                    f.write(data)
                    if hasher:
                        hasher.feed(data)
            if layout_path:
                write_layout(layout_path, plan_, durable=durable)
    except BaseException:
        if hasher:
            hasher.abandon()
        raise
    encodings_ = plan_.placement.encodings
    found = {algorithm: hasher.hexdigest()} if hasher else {}
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


# --------------------------------------------------------------------------------------------
# Saving under several JAX processes


def _pwrite_all(fd: int, data: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(data):
        n = os.pwrite(fd, data[done : done + READ_PIECE], offset + done)
        if n <= 0:
            raise PskdError(TRUNCATED, f"{path}: write failed at offset {offset + done}")
        done += n


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
    """
    jax = _jax()
    multihost_utils = importlib.import_module("jax.experimental.multihost_utils")
    path = os.fspath(path)
    me = jax.process_index()
    algorithm = _digest_algorithm(digest)
    plan_ = plan(tree, name=name, encodings=encodings, keep_global=True)
    placement = plan_.placement
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.distributed.tmp")
    layout_path = layout_path_for(path) if layout_file and isinstance(parse_type(plan_.type_text), ParamsType) else None
    header = plan_.header
    error: BaseException | None = None
    # Process 0 holds the destination's lock from before the layout to the commit.
    with contextlib.ExitStack() as held:
        if me == 0:
            try:
                held.enter_context(destination_lock(path))
            except BaseException as e:  # handed to every process by _agree
                error = e
        if me == 0 and error is None:
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.ftruncate(fd, plan_.size)
                    _pwrite_all(fd, memoryview(header), 0, temporary)
                finally:
                    os.close(fd)
            except OSError as e:
                error = PskdError(TRUNCATED, f"{temporary}: {e.strerror or e}")
            except BaseException as e:  # handed to every process by _agree
                error = e
        _agree(multihost_utils, f"{path}: creating the file", error)

        reports: dict[int, Rounding] = {}
        try:
            fd = os.open(temporary, os.O_WRONLY)
            try:
                for i, value in enumerate(plan_.arrays):
                    start = len(header) + placement.offsets[i]
                    itemsize = placement.disk_dtypes[i].itemsize
                    if not _is_array_like(value) or isinstance(value, np.ndarray) or not hasattr(value, "addressable_shards"):
                        if me == 0:
                            position = start
                            for chunk in _encode_chunks(i, plan_, round_to_encoding, reports):
                                data = _bytes_of(chunk)
                                _pwrite_all(fd, data, position, temporary)
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
                                                  _encode_chunks(i, plan_, round_to_encoding, reports, box, origin)]) \
                            if box.size else np.zeros(0, np.uint8)
                        _, runs, run = _region_runs(leaf.shape, index)
                        run_bytes = run * itemsize
                        for k, element in enumerate(runs):
                            _pwrite_all(fd, memoryview(encoded[k * run_bytes : (k + 1) * run_bytes]),
                                        start + element * itemsize, temporary)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            error = PskdError(TRUNCATED, f"{temporary}: {e.strerror or e}")
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
                if layout_path:  # only now that every process accepted its values
                    write_layout(layout_path, plan_, durable=durable)
                os.replace(temporary, path)
                committed = True
                if durable:
                    fsync_directory(directory)
                if algorithm:
                    found[algorithm] = file_digest(path, algorithm)
            except OSError as e:
                error = PskdError(TRUNCATED, f"{path}: {e.strerror or e}")
            except BaseException as e:  # handed to every process by _agree
                error = e
            if not committed:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
        _agree(multihost_utils, f"{path}: committing", error)
        return SaveResult(path, plan_.type_text, 2 if any(e != Encoding.F64 for e in placement.encodings) else 1,
                          placement.encodings, [reports[i] for i in sorted(reports)], plan_.size, found.get("sha256"),
                          layout_path, found.get("xxh3_128"))


# --------------------------------------------------------------------------------------------
# The layout file


def layout_path_for(path: str | os.PathLike) -> str:
    """``dir/NAME.psk.d`` → ``dir/NAME.layout.json`` (any other name gets ``.layout.json`` added)."""
    path = os.fspath(path)
    stem = path[: -len(".psk.d")] if path.endswith(".psk.d") else path
    return stem + ".layout.json"


_KEY = re.compile(r"""\[(?P<q>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]|\[(?P<i>-?\d+)\]|\.(?P<a>[^\W\d]\w*)""")


def path_keys(path: str) -> list[str | int]:
    """A key path → its keys: ``"['blocks'][0]['w']"`` → ``['blocks', 0, 'w']``.

    Dict keys that are not strings or ints, and anything unparsable, become one string key.
    """
    keys: list[str | int] = []
    position = 0
    while position < len(path):
        match = _KEY.match(path, position)
        if match is None:
            keys.append(path[position:])
            break
        if match.group("q") is not None:
            keys.append(ast.literal_eval(match.group("q")))
        elif match.group("i") is not None:
            keys.append(int(match.group("i")))
        else:
            keys.append(match.group("a"))
        position = match.end()
    return keys


def layout_json(plan_: _Plan) -> dict:
    """The layout file's content for a planned save."""
    placement = plan_.placement
    leaves = []
    for leaf, encoding, dtype in zip(placement.layout.leaves, placement.encodings, plan_.dtypes):
        entry: dict[str, Any] = {"path": leaf.path, "keys": path_keys(leaf.path), "shape": list(leaf.shape),
                                 "dtype": dtype}
        if leaf.is_real:
            entry["encoding"] = encoding.label
        else:
            entry["bound"] = leaf.bound
        leaves.append(entry)
    return {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "type": plan_.type_text, "leaves": leaves}


def write_layout(path: str, plan_: _Plan, *, durable: bool = True) -> None:
    with atomic_output(path, durable=durable) as f:
        f.write((json.dumps(layout_json(plan_), ensure_ascii=False, indent=1) + "\n").encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class LayoutFile:
    """A layout file read back: the layout, the type it was written for, each leaf's dtype."""

    layout: Layout
    type_text: str
    dtypes: tuple[str, ...]
    keys: tuple[tuple[str | int, ...], ...]


def read_layout_file(path: str | os.PathLike) -> LayoutFile:
    """Reads ``NAME.layout.json`` (E9001 naming the file when it is not one)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            content = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise PskdError(NOT_CLOSED, f"{path}: cannot read the layout file: {getattr(e, 'strerror', None) or e}") from None
    except RecursionError:  # the JSON decoder recurses once per nested array or object
        raise PskdError(NOT_CLOSED, f"{path}: not a layout file (JSON nested too deeply)") from None
    try:
        if content.get("format") != LAYOUT_FORMAT or content.get("version") != LAYOUT_VERSION:
            raise ValueError(f"format {content.get('format')!r} version {content.get('version')!r}, "
                             f"expected {LAYOUT_FORMAT!r} version {LAYOUT_VERSION}")
        leaves, keys, dtypes = [], [], []
        for k, entry in enumerate(content["leaves"]):
            where = f"leaf {k} ({str(entry['path'])[:80]})"
            shape = tuple(int(d) for d in entry["shape"])
            bound = entry.get("bound")
            leaves.append(Leaf(str(entry["path"]), shape, int(bound) if bound is not None else None))
            keys.append(_layout_keys(entry.get("keys") or path_keys(entry["path"]), where))
            dtypes.append(str(entry.get("dtype", "")))
        type_text = str(content["type"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        # (OverflowError: int() of an infinite number, which the JSON decoder makes of 1e999)
        raise PskdError(NOT_CLOSED, f"{path}: not a layout file ({e})") from None
    return LayoutFile(Layout(tuple(leaves), tuple(range(len(leaves))), _nested_rebuild(keys)), type_text,
                      tuple(dtypes), tuple(keys))


def _layout_keys(keys: Any, where: str) -> tuple[str | int, ...]:
    """A leaf's ``keys`` in a layout file: a list of strings and integers, at most
    :data:`MAX_KEY_DEPTH` of them (ValueError otherwise)."""
    if not isinstance(keys, list):
        raise ValueError(f"{where}: keys {str(keys)[:80]} is not a list")
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ValueError(f"{where}: the key {str(key)[:80]} is not a string or an integer")
    if len(keys) > MAX_KEY_DEPTH:
        raise ValueError(f"{where}: a key path {len(keys)} keys deep (at most {MAX_KEY_DEPTH})")
    return tuple(keys)


def _check_key_depth(keys: Sequence[Any], what: str) -> None:
    """Refuses a key path deeper than :data:`MAX_KEY_DEPTH` (E9005 naming ``what``)."""
    if len(keys) > MAX_KEY_DEPTH:
        raise PskdError(MISMATCH, f"{what[:200]}: a key path {len(keys)} keys deep; a checkpoint's tree "
                                  f"nests at most {MAX_KEY_DEPTH} deep")


def read_layout(path: str | os.PathLike) -> Layout:
    """The :class:`Layout` in a layout file: leaves in storage order, rebuilt as nested dicts
    (string keys) and lists (int keys)."""
    return read_layout_file(path).layout


def find_layout(checkpoint: str | os.PathLike) -> Layout | None:
    """The layout written beside a checkpoint, or None when there is none."""
    candidate = layout_path_for(checkpoint)
    return read_layout(candidate) if os.path.exists(candidate) else None


def nest(keys: Sequence[Sequence[str | int]], values: Sequence[Any]) -> Any:
    """Nested dicts and lists from key sequences, dict keys in first-appearance order, list
    items by index: ``nest([["a", 0], ["a", 1], ["b"]], [x, y, z])`` → ``{"a": [x, y], "b": z}``."""
    if len(keys) == 1 and len(keys[0]) == 0:
        return values[0]
    root: dict = {}
    for key_path, value in zip(keys, values):
        _check_key_depth(key_path, f"the key path {_abridged(key_path)}")
        node = root
        for depth, key in enumerate(key_path):
            last = depth == len(key_path) - 1
            if last:
                if key in node:
                    raise PskdError(MISMATCH, f"the key path {list(key_path)} names a leaf twice")
                node[key] = value
            else:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise PskdError(MISMATCH, f"the key path {list(key_path)} goes through a leaf")
    return _listify(root)


def _abridged(keys: Sequence[Any]) -> str:
    """A key path for a message: its first keys when it is long."""
    keys = list(keys)
    return str(keys) if len(keys) <= 8 else str(keys[:8])[:-1] + f", … ({len(keys)} keys)]"


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _listify(v) for k, v in node.items()}
    if items and all(isinstance(k, int) and not isinstance(k, bool) for k in items) \
            and sorted(items) == list(range(len(items))):
        return [items[k] for k in range(len(items))]
    return items


def _nested_rebuild(keys: Sequence[Sequence[str | int]]):
    keys = [tuple(k) for k in keys]
    return lambda values: nest(keys, values)


# --------------------------------------------------------------------------------------------
# Restoring


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
                raise PskdError(
                    MISMATCH,
                    f"{path}: leaf {k}: the target has {want or '(root)'} where the checkpoint has "
                    f"{have or '(root)'} (leaves in declaration order)",
                )
        if len(target_paths) > len(found_paths):
            raise PskdError(MISMATCH, f"{path}: at {target_paths[len(found_paths)]}: expected by the target, "
                                      f"not in the checkpoint ({len(found_paths)} leaves)")
        raise PskdError(MISMATCH, f"{path}: at {found_paths[len(target_paths)]}: in the checkpoint, missing from "
                                  f"the target ({len(target_paths)} leaves)")
    for i, ((key, spec), leaf) in enumerate(zip(pairs, file_leaves)):
        shape = tuple(int(d) for d in getattr(spec, "shape", np.shape(spec)))
        if shape != leaf.shape:
            found = placement.value_dtype(i) if placement else None
            raise PskdError(
                MISMATCH,
                f"{path}: at {key or '(root)'}: expected {_describe(shape, _spec_dtype(spec))}, "
                f"found {tuple(leaf.shape)}" + (f" {tree_lib.describe_dtype(found)}" if found is not None else ""),
            )
        dtype = _spec_dtype(spec)
        if leaf.is_real != is_real_dtype(dtype):
            kind = "reals" if leaf.is_real else f"indices below {leaf.bound}"
            raise PskdError(MISMATCH, f"{path}: at {key or '(root)'}: expected {_describe(shape, dtype)}, "
                                      f"found {kind}")


def _spec_dtype(spec: Any) -> np.dtype:
    return np.dtype(spec.dtype) if _is_array_like(spec) else np.asarray(spec).dtype


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
        raise PskdError(
            NOT_CLOSED,
            f"{reader.path}: type {reader.header.type_text!r} needs its layout: pass a target pytree, "
            f"layout=..., or keep {os.path.basename(layout_path_for(reader.path))} beside it",
        )
    leaves = tuple(tree_lib.leaf_of_spec(p, spec) for p, spec in target_pairs)
    return Layout(leaves, tuple(range(len(leaves)))), False


def _read_exactly(fd: int, buffer: memoryview, offset: int, path: str) -> None:
    done = 0
    total = len(buffer)
    while done < total:
        n = os.preadv(fd, [buffer[done : done + READ_PIECE]], offset + done)
        if n <= 0:
            raise PskdError(TRUNCATED, f"{path}: truncated: {total - done} bytes missing at offset {offset + done}")
        done += n


def _as_bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


def _wants_jax(spec: Any) -> bool:
    if spec is None or isinstance(spec, np.ndarray) or not _is_array_like(spec):
        return False
    module = type(spec).__module__ or ""
    return module.startswith("jax") or module.startswith("jaxlib")


def _sharding_of(spec: Any) -> Any:
    return getattr(spec, "sharding", None) if _wants_jax(spec) else None


def _cast(array: np.ndarray, dtype: np.dtype, leaf: Leaf, where: str) -> np.ndarray:
    """The explicit cast a target asks for; an integer cast that would change a value is refused."""
    if array.dtype == dtype:
        return array
    if dtype.kind in "iu" and array.dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if leaf.bound is None or leaf.bound - 1 > info.max:
            high = int(array.max())
            if high > info.max:
                raise PskdError(BAD_VALUE, f"{where}: the stored value {high} does not fit the target's {dtype}")
    if dtype.kind in "iub" and leaf.is_real:
        raise PskdError(MISMATCH, f"{where}: expected {dtype}, found reals")
    return array.astype(dtype)


def _check_x64(where: str, dtype: np.dtype, asked: bool) -> None:
    jax = _jax()
    if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        stored = "f64" if dtype.kind == "f" else str(dtype)
        how = "ask for float32 in the target" if dtype.kind == "f" else "ask for a 32-bit integer dtype in the target"
        raise PskdError(
            MISMATCH,
            f"{where}: {'the target asks for' if asked else 'stored as'} {stored}, but JAX has x64 disabled: "
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
    expected = _expected_digests(path, {"xxh3_128": xxh3_128, "sha256": sha256})
    target_pairs, rebuild = _target_pairs(target) if target is not None else (None, None)
    with Reader(path) as reader:
        file_layout, from_file = _resolve_file_layout(reader, layout, target_pairs)
        reader.with_layout(file_layout)
        placement = reader.placement
        if reader.header.count != 1:
            raise PskdError(MISMATCH, f"{path}: a checkpoint holds one sample, this file holds {reader.header.count}")
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
        raise PskdError(TRUNCATED, f"{path}: cannot map: {e.strerror or e}") from None
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
        (sharded if (not as_numpy and _sharding_of(spec) is not None
                     and not _single_device(_sharding_of(spec))) else plain).append(i)
    jax_leaf = [not as_numpy and (spec is None or _wants_jax(spec)) for spec in specs]
    for i, leaf in enumerate(leaves):
        if jax_leaf[i]:
            spec = specs[i]
            dtype = _spec_dtype(spec) if spec is not None else placement.value_dtype(i)
            _check_x64(f"{path}: at {leaf.path or '(root)'}", dtype, spec is not None)
    fd = os.open(path, os.O_RDONLY)
    hashes = {name: DIGESTS[name]() for name in expected}
    try:
        header_bytes = bytearray(data_offset)
        _read_exactly(fd, memoryview(header_bytes), 0, path)
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
                _read_exactly(fd, memoryview(tail), end, path)
                for digest in hashes.values():
                    digest.update(tail)
            for name, digest in hashes.items():
                _check_digest(path, name, digest.hexdigest(), expected[name])
        for i in plain:
            if i not in streamed:
                results[i] = _finish_host(path, host.pop(i), leaves[i], specs[i], jax_leaf[i])
        for i in sharded:
            results[i] = _restore_sharded(fd, path, data_offset + placement.offsets[i], leaves[i],
                                          placement, i, specs[i], host.get(i))
    finally:
        os.close(fd)
    return rebuild(results) if rebuild is not None else file_layout.unflatten(results)


def _single_device(sharding: Any) -> bool:
    return len(sharding.device_set) == 1


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
        _read_exactly(fd, view, data_offset + placement.offsets[i] + start, path)
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
    jax = _jax()
    sharding = _sharding_of(spec)
    return jax.device_put(array, sharding) if sharding is not None else jax.device_put(array)


def _region_runs(shape: tuple[int, ...], index: tuple) -> tuple[tuple[int, ...], list[int], int]:
    """A box of a row-major tensor as contiguous runs: (box shape, element offset of each run,
    elements per run)."""
    starts, sizes = [], []
    for dim, s in zip(shape, tuple(index) + (slice(None),) * (len(shape) - len(index))):
        start, stop, step = s.indices(dim)
        if step != 1:
            raise PskdError(MISMATCH, f"a shard with step {step} along an axis")
        starts.append(start)
        sizes.append(max(0, stop - start))
    j = len(shape)
    while j > 0 and sizes[j - 1] == shape[j - 1]:
        j -= 1
    # axes j.. are whole; axis j-1 (if any) is partial and still contiguous within one run
    if j == 0:
        return tuple(sizes), [0], math.prod(shape)
    inner = math.prod(shape[j:])
    run = sizes[j - 1] * inner
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
    outer = [range(starts[k], starts[k] + sizes[k]) for k in range(j - 1)]
    base = starts[j - 1] * strides[j - 1]
    offsets = []
    for position in np.ndindex(*[len(r) for r in outer]) if outer else [()]:
        offsets.append(base + sum((starts[k] + p) * strides[k] for k, p in enumerate(position)))
    return tuple(sizes), offsets, run


def read_region(fd: int, path: str, offset: int, shape: tuple[int, ...], disk: np.dtype,
                value: np.dtype, index: tuple) -> np.ndarray:
    """The box ``index`` of a leaf stored at ``offset``, read run by run with preadv."""
    box, runs, run = _region_runs(shape, index)
    out = np.empty(box, dtype=value)
    flat = out.reshape(-1).view(np.uint8)
    run_bytes = run * disk.itemsize
    for k, start in enumerate(runs):
        if run_bytes:
            _read_exactly(fd, memoryview(flat[k * run_bytes : (k + 1) * run_bytes]), offset + start * disk.itemsize, path)
    return out


def _restore_sharded(fd: int, path: str, offset: int, leaf: Leaf, placement: Placement, i: int, spec: Any,
                     host: np.ndarray | None) -> Any:
    jax = _jax()
    sharding = _sharding_of(spec)
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


# --------------------------------------------------------------------------------------------
# Integrity


def _check_digest(path: str, algorithm: str, found: str, expected: str) -> None:
    if found != expected.lower():
        raise PskdError(
            DIGEST_MISMATCH,
            f"{path}: checkpoint digest mismatch: {algorithm} {found}, expected {expected.lower()} "
            "(the file was changed or damaged after the digest was recorded)",
        )


def file_digest(path: str | os.PathLike, algorithm: str = CHECKPOINT_DIGEST) -> str:
    """The digest of a whole file, as ``xxhsum -H2`` (``"xxh3_128"``) or ``sha256sum``
    (``"sha256"``) print it.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "empty")
    >>> open(path, "wb").close()
    >>> file_digest(path), file_digest(path, "sha256")[:16]
    ('99aa06d3014798d86001c324468d497f', 'e3b0c44298fc1c14')
    """
    if algorithm not in DIGESTS:
        raise PskdError(BAD_USAGE, f"{os.fspath(path)}: no digest {algorithm!r}: expected one of {sorted(DIGESTS)}")
    return hash_file(path, DIGESTS[algorithm](), block=CHUNK_BYTES)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a whole file, as ``sha256sum`` prints it."""
    return file_digest(path, "sha256")


def verify_file(path: str | os.PathLike, sha256: str | None = None, *, xxh3_128: str | None = None) -> str:
    """Checks a whole file against its recorded digest, ``xxh3_128`` or ``sha256`` (hex; each
    given is checked); E9013 naming the file on a mismatch. Returns the algorithm checked (the
    first given, xxh3_128 before sha256)."""
    path = os.fspath(path)
    expected = _expected_digests(path, {"xxh3_128": xxh3_128, "sha256": sha256})
    if not expected:
        raise PskdError(BAD_USAGE, f"{path}: no digest to check against: give xxh3_128=HEX or sha256=HEX")
    for algorithm, hex_digest in expected.items():
        _check_digest(path, algorithm, file_digest(path, algorithm), hex_digest)
    return next(iter(expected))


__all__ = [
    "LayoutFile",
    "CHECKPOINT_DIGEST",
    "DIGESTS",
    "MAX_KEY_DEPTH",
    "SaveResult",
    "file_digest",
    "file_sha256",
    "destination_lock",
    "find_layout",
    "layout_path_for",
    "lock_path_for",
    "nest",
    "path_keys",
    "plan",
    "read_layout",
    "read_layout_file",
    "read_region",
    "restore",
    "save",
    "save_distributed",
    "verify_file",
]
