"""The ``.psk.d`` container: its byte layout, a reader over a memory map, and writers.

Byte layout
===========

A ``.psk.d`` file holds ``count`` samples of one sample type, all little-endian::

    offset  size       field
    0       4          magic, the bytes b"PSKD"
    4       2          version, u16: 1 or 2
    6       4          type_len, u32: length in bytes of the type text
    10      type_len   the sample type, UTF-8 (see pskd_jax.sample_type)
    ..      8          count, u64: the number of samples
    -- version 2 only --
    ..      4          leaves, u32: the number of leaves of the type
    ..      leaves     one encoding byte per leaf in storage order:
                       0 = f64 (and every idx leaf), 1 = f32, 2 = bf16
    -- then --
    data_offset        the samples, back to back, each ``sample_bytes`` long

A sample is its leaves in storage order (tuple elements left to right; a parameter tree's fields
in declaration order), each leaf a row-major tensor of:

- ``idx[N]``: the smallest of u8, u16, u32, u64 that holds N − 1;
- ``ℝ``: f64 in version 1; in version 2 the leaf's encoding (bf16 being the upper sixteen bits of
  the f32 of the same value).

Rules:

- A writer MUST write version 1 when every real leaf is f64, so that an all-f64 file is the same
  bytes whichever writer wrote it, and version 2 otherwise. A reader MUST read both.
- Sample k starts at ``data_offset + k * sample_bytes``.
- A file longer than ``count`` samples has trailing bytes (an interrupted append): readers read
  ``count`` samples and MAY report the trailing bytes. A file shorter than ``count`` samples is
  truncated (E9003).
- An idx leaf MUST carry encoding 0 in a version 2 header.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import operator
import os
import struct
from typing import Any, BinaryIO, Iterable, Sequence

import numpy as np

from pskd_jax import tree as tree_lib
from pskd_jax.encodings import (
    REAL_DISK_DTYPES,
    REAL_DTYPES,
    Encoding,
    Rounding,
    Site,
    check_finite,
    encoding_of_dtype,
    index_dtype,
    narrow,
    to_f64,
    to_index,
)
from pskd_jax.errors import BAD_USAGE, BAD_VALUE, MISMATCH, NOT_CLOSED, NOT_PSKD, TRUNCATED, PskdError
from pskd_jax.fileio import atomic_output, fsync_directory, temporary_path_for
from pskd_jax.sample_type import (
    MAX_AXES,
    MAX_INDEX_BOUND,
    MAX_SAMPLE_ELEMENTS,
    Layout,
    Leaf,
    ParamsType,
    header_text,
    parse_type,
)

MAGIC = b"PSKD"
VERSION_F64 = 1  # every real leaf f64
VERSION_ENCODED = 2  # per-leaf encodings in the header
VERSIONS = (VERSION_F64, VERSION_ENCODED)
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
MAX_TYPE_BYTES = 1 << 20  # far more than any real type; bounds what a hostile header can ask for
MAX_COUNT = 2**63 - 1  # numpy's largest axis: the most samples a reader can index
MAX_RECORD_BYTES = 2**31 - 1  # numpy's largest void item: larger samples are gathered leaf by leaf
ACCESS_MODES = ("mmap", "pread")  # how Reader.gather reaches the file (see Reader)


# --------------------------------------------------------------------------------------------
# Header


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed header. ``encodings`` has one entry per leaf (all F64 in a version 1 file whose
    layout is known; ``None`` for a version 1 ``params`` file before its layout is supplied)."""

    version: int
    type_text: str
    count: int
    encodings: tuple[Encoding, ...] | None
    data_offset: int

    @property
    def is_params(self) -> bool:
        return isinstance(parse_type(self.type_text), ParamsType)


def encode_header(type_text: str, count: int, encodings: Sequence[Encoding]) -> bytes:
    """The header bytes; version 1 when every encoding is f64, else version 2.

    >>> encode_header("ℝ[]", 3, [Encoding.F64]).hex(" ")
    '50 53 4b 44 01 00 05 00 00 00 e2 84 9d 5b 5d 03 00 00 00 00 00 00 00'
    """
    type_bytes = type_text.encode("utf-8")
    narrower = any(e != Encoding.F64 for e in encodings)
    version = VERSION_ENCODED if narrower else VERSION_F64
    parts = [MAGIC, _U16.pack(version), _U32.pack(len(type_bytes)), type_bytes, _U64.pack(count)]
    if narrower:
        parts += [_U32.pack(len(encodings)), bytes(int(e) for e in encodings)]
    return b"".join(parts)


def _read_exact(f: BinaryIO, n: int, what: str, path: str) -> bytes:
    """Reads exactly n bytes or fails saying what was expected and what was found (E9003)."""
    data = f.read(n)
    if len(data) != n:
        raise PskdError(TRUNCATED, f"{path}: truncated in the header: {what} needs {n} bytes, {len(data)} remain")
    return data


def read_header(f: BinaryIO, path: str, file_size: int) -> Header:
    """Reads and checks the header at the start of ``f``."""
    if file_size < len(MAGIC):
        raise PskdError(NOT_PSKD, f"{path}: not a .psk.d file ({file_size} bytes, no magic)")
    magic = f.read(4)
    if magic != MAGIC:
        raise PskdError(NOT_PSKD, f"{path}: not a .psk.d file (magic {magic!r}, expected b'PSKD')")
    (version,) = _U16.unpack(_read_exact(f, 2, "the version", path))
    if version not in VERSIONS:
        raise PskdError(NOT_PSKD, f"{path}: unsupported version {version} (this reader reads 1 and 2)")
    (type_len,) = _U32.unpack(_read_exact(f, 4, "the type length", path))
    if type_len > min(MAX_TYPE_BYTES, file_size):
        raise PskdError(TRUNCATED, f"{path}: a type of {type_len} bytes announced in a file of {file_size} bytes")
    raw_type = _read_exact(f, type_len, "the type", path)
    try:
        type_text = raw_type.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PskdError(NOT_PSKD, f"{path}: the type text is not UTF-8 (byte {e.start})") from None
    (count,) = _U64.unpack(_read_exact(f, 8, "the count", path))
    encodings = None
    offset = 4 + 2 + 4 + type_len + 8
    if version == VERSION_ENCODED:
        (n_leaves,) = _U32.unpack(_read_exact(f, 4, "the leaf count", path))
        if n_leaves > file_size:
            raise PskdError(TRUNCATED, f"{path}: {n_leaves} leaf encodings announced in a file of {file_size} bytes")
        raw = _read_exact(f, n_leaves, "the leaf encodings", path)
        bad = [b for b in raw if b not in tuple(Encoding)]
        if bad:
            raise PskdError(NOT_PSKD, f"{path}: encoding byte {bad[0]} (expected 0 f64, 1 f32 or 2 bf16)")
        encodings = tuple(Encoding(b) for b in raw)
        offset += 4 + n_leaves
    return Header(version, type_text, count, encodings, offset)


# --------------------------------------------------------------------------------------------
# Leaf placement shared by the reader and the writers


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each leaf sits in a sample and how its elements are stored."""

    layout: Layout
    encodings: tuple[Encoding, ...]
    offsets: tuple[int, ...]
    disk_dtypes: tuple[np.dtype, ...]
    sample_bytes: int

    @classmethod
    def of(cls, layout: Layout, encodings: Sequence[Encoding] | None, path: str = "", *,
           from_header: bool = False) -> "Placement":
        """Places the leaves. An idx leaf with a narrow encoding is a malformed header when read
        (``from_header``, E9002), and a request that does not fit the type when writing (E9005)."""
        where = f"{path}: " if path else ""
        if encodings is None or len(encodings) == 0:  # an empty list means every leaf f64
            encodings = [Encoding.F64] * len(layout.leaves)
        if len(encodings) != len(layout.leaves):
            raise PskdError(
                MISMATCH,
                f"{where}{len(encodings)} leaf encodings for a type of {len(layout.leaves)} leaves",
            )
        offsets, dtypes, position = [], [], 0
        for leaf, encoding in zip(layout.leaves, encodings):
            _check_leaf(leaf, where)
            if leaf.is_real:
                dtype = REAL_DISK_DTYPES[Encoding(encoding)]
            elif encoding != Encoding.F64:
                raise PskdError(
                    NOT_PSKD if from_header else MISMATCH,
                    f"{where}leaf {leaf.path or '(root)'} is idx[{leaf.bound}] but its encoding is "
                    f"{Encoding(encoding).label}; idx leaves carry encoding 0",
                )
            else:
                dtype = index_dtype(leaf.bound)
            offsets.append(position)
            dtypes.append(dtype)
            position += leaf.size * dtype.itemsize
        return cls(layout, tuple(Encoding(e) for e in encodings), tuple(offsets), tuple(dtypes), position)

    def value_dtype(self, i: int) -> np.dtype:
        """The dtype of leaf i's values in memory (bfloat16 for bf16, whose disk dtype is u2)."""
        leaf = self.layout.leaves[i]
        return REAL_DTYPES[self.encodings[i]] if leaf.is_real else self.disk_dtypes[i]


def pread_spans(fds: int | Sequence[int], spans: Sequence[memoryview], offsets: Sequence[int], path: str) -> None:
    """Fills each buffer of ``spans`` from its file descriptor (one for all, or one a span) at its
    offset: one ``preadv`` a span (called through ``map``: no Python loop per span), more only after
    a short read (a span past 2 GiB). E9003 when a file ends first: it was cut short since it was
    opened."""
    fds = [fds] * len(spans) if isinstance(fds, int) else fds
    try:
        done = list(map(os.preadv, fds, ([span] for span in spans), offsets))
        for fd, view, offset, got in zip(fds, spans, offsets, done):
            while got < len(view):
                more = os.preadv(fd, [view[got:]], offset + got)
                if more == 0:
                    raise PskdError(TRUNCATED, f"{path}: the file ends at byte {offset + got}, inside the "
                                               "samples it announced (cut short since it was opened)")
                got += more
    except OSError as e:
        raise PskdError(TRUNCATED, f"{path}: cannot read: {e.strerror or e}") from None


def _check_leaf(leaf: Leaf, where: str) -> None:
    """Refuses a leaf no file can hold (E9001): a layout may come from outside the type text (a
    template, a layout file), and a hostile one must fail here rather than in numpy."""
    shape, bound = leaf.shape, leaf.bound
    problem = None
    if not isinstance(shape, tuple) or len(shape) > MAX_AXES:
        problem = f"a shape of more than {MAX_AXES} axes" if isinstance(shape, tuple) else "no shape"
    elif any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d <= MAX_SAMPLE_ELEMENTS for d in shape):
        problem = f"shape {list(shape)}: every length is an integer in [0, 2^60]"
    elif bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, np.integer))
                                or not 1 <= bound <= MAX_INDEX_BOUND):
        problem = f"idx[{bound}]: an index bound is an integer in [1, 2^64]"
    if problem:
        raise PskdError(NOT_CLOSED, f"{where}leaf {leaf.path or '(root)'}: {problem}")


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides of a C-ordered array of ``shape`` (computed, never allocated)."""
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


# --------------------------------------------------------------------------------------------
# Reader


class Reader:
    """Random access to the samples of a ``.psk.d`` file through a read-only memory map.

    ``layout`` supplies the leaves of a ``params`` file: a :class:`Layout` or a template pytree
    (arrays or ``jax.ShapeDtypeStruct``s in declaration order). Closed types need none.

    ``access`` says how :meth:`gather` and indexing reach the samples:

    - ``"mmap"`` (default): records are copied out of the map, the fastest way here (~40 µs for
      64 records of 2 KiB). The pages touched stay mapped, so the process's resident set grows
      toward the file's size as training visits it (clean page cache the kernel can drop, but
      counted in RSS).
    - ``"pread"``: each run of consecutive records is read with one ``preadv`` straight into the
      batch, ~4× slower per record, and the resident set stays that of the batches in flight
      whatever the file's size. Samples over 2 GiB, and :meth:`leaves`, :meth:`samples` and
      :meth:`raw_data` (views, by design) still use the map.

    Gathered idx values are checked against their bound (E9004 names the sample and the leaf):
    a damaged file never hands a model an index its embedding does not have.

    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "w.psk.d")
    >>> _ = write(path, "(idx[64][seq: 4], ℝ[])", (np.arange(8).reshape(2, 4), np.array([0.5, 1.5])))
    >>> with Reader(path) as r:
    ...     print(len(r), r[1], r.gather([1, 0, 1])[1])
    2 (array([4, 5, 6, 7], dtype=uint8), array(1.5)) [1.5 0.5 1.5]
    """

    def __init__(self, path: str | os.PathLike, *, layout: Layout | Any | None = None, access: str = "mmap"):
        self.path = os.fspath(path)
        if access not in ACCESS_MODES:
            raise PskdError(BAD_USAGE, f"{self.path}: access is one of {', '.join(ACCESS_MODES)}, got {access!r}")
        self.access = access
        self._map = self._file = self._fd = None
        try:
            with open(self.path, "rb") as f:
                self.header = read_header(f, self.path, os.fstat(f.fileno()).st_size)
                # A file being appended to (a corpus shard, chunk by chunk) grows its data before
                # its count: the size taken after the header covers every sample the header counts.
                self.file_size = os.fstat(f.fileno()).st_size
                self._map = self._open_map(f) if self.file_size else None
                if access == "pread":  # a file object of its own owns the descriptor (closed when collected)
                    self._file = open(os.dup(f.fileno()), "rb", buffering=0)
                    self._fd = self._file.fileno()
        except OSError as e:
            raise PskdError(NOT_PSKD, f"{self.path}: cannot read: {e.strerror or e}") from None
        except ValueError:  # open() refuses a path holding a NUL byte
            raise PskdError(NOT_PSKD, f"{self.path!r}: cannot read: a path holds no NUL byte") from None
        if self.header.count > MAX_COUNT:
            self.close()
            raise PskdError(
                TRUNCATED,
                f"{self.path}: a count of {self.header.count} samples, beyond the 2^63 - 1 a reader can index",
            )
        self.layout: Layout | None = None
        self.placement: Placement | None = None
        self._views: list[np.ndarray] = []
        self._records: np.ndarray | None = None
        self._bounded: list[int] = []
        try:
            try:
                parsed = parse_type(self.header.type_text)
                own = None if isinstance(parsed, ParamsType) else Layout.of_type(parsed)
            except PskdError as e:
                raise PskdError(e.code, f"{self.path}: {e.message}") from None
            if layout is not None:
                self.with_layout(layout)
            elif own is not None:
                self.with_layout(own)
        except BaseException:
            self.close()  # a refused file leaves no map open behind it
            raise

    def _open_map(self, f: BinaryIO) -> mmap.mmap:
        try:
            return mmap.mmap(f.fileno(), self.file_size, access=mmap.ACCESS_READ)
        except ValueError:  # shorter than its size a moment ago
            raise PskdError(TRUNCATED, f"{self.path}: the file was cut short while being opened") from None

    # -- layout ------------------------------------------------------------------------------

    def with_layout(self, layout: Layout | Any) -> "Reader":
        """Supplies (or replaces) the layout; returns the reader."""
        if not isinstance(layout, Layout):
            layout = tree_lib.layout_of_template(layout)
        encodings = self.header.encodings
        if encodings is not None and len(encodings) != len(layout.leaves):
            raise PskdError(
                MISMATCH,
                f"{self.path}: the header lists {len(encodings)} leaves, the layout has {len(layout.leaves)}",
            )
        placement = Placement.of(layout, encodings, self.path, from_header=True)
        self._check_size(placement.sample_bytes)
        self._check_addressable(placement)
        self._check_params_size(placement.sample_bytes)
        self.layout, self.placement = layout, placement
        self._views = [self._leaf_view(i) for i in range(len(layout.leaves))]
        self._records = self._record_view()
        # idx leaves whose dtype holds values at or above the bound (idx[10] in u8): gathered
        # values are checked. A bound that fills its dtype (idx[256] in u8) needs no check.
        self._bounded = [i for i, (leaf, disk) in enumerate(zip(layout.leaves, placement.disk_dtypes))
                         if not leaf.is_real and leaf.bound < 1 << (8 * disk.itemsize)]
        return self

    def _check_size(self, sample_bytes: int) -> None:
        needed = self.header.data_offset + self.header.count * sample_bytes
        if needed > self.file_size:
            present = (self.file_size - self.header.data_offset) // sample_bytes if sample_bytes else 0
            raise PskdError(
                TRUNCATED,
                f"{self.path}: truncated: {self.header.count} samples of {sample_bytes} bytes announced, "
                f"{max(present, 0)} present ({self.file_size} bytes, {needed} needed)",
            )

    def _check_addressable(self, placement: Placement) -> None:
        """Refuses what no numpy array can hold: the file's size bounds every leaf with elements,
        but a leaf whose shape has an empty axis holds none, and numpy still refuses an array whose
        other axes times its item size pass 2^63 (a hostile count over an empty type)."""
        for leaf, dtype in zip(placement.layout.leaves, placement.disk_dtypes):
            span = max(self.header.count, 1) * dtype.itemsize * math.prod(d for d in leaf.shape if d)
            if span > MAX_COUNT:
                raise PskdError(
                    TRUNCATED,
                    f"{self.path}: {self.header.count} samples of leaf {leaf.path or '(root)'} "
                    f"(shape {list(leaf.shape)}) span more than the 2^63 bytes an array can address",
                )

    def _check_params_size(self, sample_bytes: int) -> None:
        """A parameter tree's layout comes from outside the file, so the file's size is its only
        witness: a params file (written whole, never appended to) must hold exactly its samples."""
        if not self.header.is_params:
            return
        data = self.file_size - self.header.data_offset
        if data != self.header.count * sample_bytes:
            raise PskdError(
                MISMATCH,
                f"{self.path}: the layout makes samples of {sample_bytes} bytes, so {self.header.count} "
                f"of them take {self.header.count * sample_bytes} bytes, but the file holds {data} bytes "
                f"of data: the layout is not the one {self.header.type_text!r} was written with",
            )

    def _require_layout(self) -> Placement:
        if self.placement is None:
            raise PskdError(
                NOT_CLOSED,
                f"{self.path}: type {self.header.type_text!r} needs its layout "
                "(Reader(path, layout=template) or reader.with_layout(...))",
            )
        return self.placement

    def _map_bytes(self) -> np.ndarray:
        """The map as bytes through ``np.frombuffer``, which holds a buffer export: while any view
        lives, closing the map fails (and is deferred) instead of leaving the view dangling."""
        return np.frombuffer(self._map, dtype=np.uint8)

    def _leaf_view(self, i: int) -> np.ndarray:
        """Leaf i of every sample as one strided array over the map (no copy)."""
        placement = self.placement
        leaf = placement.layout.leaves[i]
        disk = placement.disk_dtypes[i]
        count = self.header.count
        if self._map is None or count == 0 or placement.sample_bytes == 0:
            empty = np.zeros((count, *leaf.shape), dtype=placement.value_dtype(i))
            empty.flags.writeable = False  # read-only like a view of the map
            return empty
        inner_strides = _c_strides(leaf.shape, disk.itemsize)
        view = np.ndarray(
            (count, *leaf.shape),
            dtype=disk,
            buffer=self._map_bytes(),
            offset=self.header.data_offset + placement.offsets[i],
            strides=(placement.sample_bytes, *inner_strides),
        )
        return view.view(placement.value_dtype(i)) if disk != placement.value_dtype(i) else view

    # -- access ------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.header.count

    @property
    def sample_bytes(self) -> int:
        return self._require_layout().sample_bytes

    @property
    def trailing_bytes(self) -> int:
        """Bytes after the last sample (left by an interrupted append)."""
        return self.file_size - self.header.data_offset - self.header.count * self.sample_bytes

    def __len__(self) -> int:
        return self.header.count

    def _check_index(self, index: int) -> int:
        count = self.header.count
        position = index + count if index < 0 else index
        if not 0 <= position < count:
            raise PskdError(TRUNCATED, f"{self.path}: sample {index} is beyond the count {count}")
        return position

    def __getitem__(self, index: int) -> Any:
        """Sample ``index`` as its pytree of fresh arrays."""
        placement = self._require_layout()
        try:
            index = operator.index(index)
        except TypeError:
            raise PskdError(TRUNCATED, f"{self.path}: a sample index is an integer, got {index!r}") from None
        position = self._check_index(index)
        leaves = self._gathered_leaves(np.array([position], dtype=np.intp))
        return placement.layout.unflatten([leaf[0, ...] for leaf in leaves])  # 0-d arrays, not scalars

    def gather(self, indices: Sequence[int] | np.ndarray) -> Any:
        """The samples at ``indices``, stacked under a leading batch axis: one vectorised read per leaf."""
        return self._require_layout().layout.unflatten(self.gather_leaves(indices))

    def gather_leaves(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """:meth:`gather` as the list of leaves in storage order, each ``(len(indices), *shape)``."""
        self._require_layout()
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise PskdError(TRUNCATED, f"{self.path}: sample indices form one axis, got shape {indices.shape}")
        if indices.dtype.kind not in "iu" and indices.size:  # [] comes as float64: nothing to read
            raise PskdError(TRUNCATED, f"{self.path}: sample indices must be integers, got {indices.dtype}")
        count = self.header.count
        if indices.size and (indices.min() < -count or indices.max() >= count):
            bad = indices[(indices < -count) | (indices >= count)][0]
            raise PskdError(TRUNCATED, f"{self.path}: sample {bad} is beyond the count {count}")
        positions = indices.astype(np.intp, copy=False)
        if positions.size and positions.min() < 0:  # a negative index counts from the end
            positions = np.where(positions < 0, positions + count, positions)
        return self._gathered_leaves(positions)

    def _gathered_leaves(self, positions: np.ndarray) -> list[np.ndarray]:
        """Each leaf of the samples at ``positions`` (valid, non-negative), bounds checked."""
        placement = self.placement
        if self._records is None and self._map is not None and placement.sample_bytes and len(positions):
            # Samples too large to be one numpy record: a copy of each leaf's rows, leaf by leaf.
            leaves = [np.ascontiguousarray(view.take(positions, axis=0)) for view in self._views]
        else:
            # Whole records are gathered as opaque bytes (alignment 1: a plain copy per record, never
            # a copy of the file as numpy makes for unaligned or strided sources), then split per leaf.
            records = None
            if self._records is not None:
                records = self._read_records(positions) if self._fd is not None else self._records.take(positions)
            leaves = [self._leaf_of_records(records, i, len(positions)) for i in range(len(self._views))]
        for i in self._bounded:
            self._check_bound(i, leaves[i], positions)
        return leaves

    def _check_bound(self, i: int, values: np.ndarray, positions: np.ndarray) -> None:
        """Refuses stored idx values at or above the leaf's bound (only a damaged or hand-made file
        holds one: every writer refuses them)."""
        bound = self.placement.layout.leaves[i].bound
        if values.size == 0 or values.max() < bound:
            return
        over = values.reshape(len(values), -1).max(axis=1) >= bound
        row = int(np.argmax(over))
        leaf = self.placement.layout.leaves[i]
        raise PskdError(
            BAD_VALUE,
            f"{self.path}: sample {int(positions[row])}, leaf {leaf.path or '(root)'}: stored value "
            f"{int(values[row].max())} is not below its bound idx[{bound}]",
        )

    def _read_records(self, positions: np.ndarray) -> np.ndarray:
        """The records at ``positions`` read with ``preadv``: one call per run of consecutive
        records, straight into the batch (``access="pread"``)."""
        size = self._records.itemsize
        out = np.empty(len(positions), dtype=self._records.dtype)
        if not len(positions):
            return out
        flat = memoryview(out.view(np.uint8))
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        firsts = np.concatenate(([0], breaks)).tolist()
        ends = np.concatenate((breaks, [len(positions)])).tolist()
        spans = [flat[a * size : b * size] for a, b in zip(firsts, ends)]
        offsets = (self.header.data_offset + positions[firsts].astype(np.int64) * size).tolist()
        pread_spans(self._fd, spans, offsets, self.path)
        return out

    def _record_view(self) -> np.ndarray | None:
        """Every sample as one opaque record, or None when there is none or a sample is larger
        than the 2^31 - 1 bytes a numpy record holds (a checkpoint of several GiB)."""
        sample_bytes = self.placement.sample_bytes
        if self._map is None or sample_bytes == 0 or sample_bytes > MAX_RECORD_BYTES:
            return None
        record = np.dtype((np.void, sample_bytes))
        return np.frombuffer(self._map, dtype=record, count=self.header.count, offset=self.header.data_offset)

    def _leaf_of_records(self, records: np.ndarray | None, i: int, n: int) -> np.ndarray:
        """Leaf i of gathered records: a view when it is the whole record, else a contiguous copy."""
        placement = self.placement
        leaf = placement.layout.leaves[i]
        value_dtype = placement.value_dtype(i)
        if records is None or n == 0:
            shape = (n, *leaf.shape)
            if math.prod(d for d in shape if d) * value_dtype.itemsize > MAX_COUNT:  # numpy refuses even 0 elements
                raise PskdError(
                    TRUNCATED,
                    f"{self.path}: {n} samples of leaf {leaf.path or '(root)'} (shape {list(leaf.shape)}) span "
                    "more than the 2^63 bytes an array can address",
                )
            return np.zeros(shape, dtype=value_dtype)
        disk = placement.disk_dtypes[i]
        if len(placement.disk_dtypes) == 1:
            return records.view(disk).reshape(n, *leaf.shape).view(value_dtype)
        inner = _c_strides(leaf.shape, disk.itemsize)
        strided = np.ndarray((n, *leaf.shape), dtype=disk, buffer=records, offset=placement.offsets[i],
                             strides=(placement.sample_bytes, *inner))
        return np.ascontiguousarray(strided).view(value_dtype)

    def leaves(self) -> list[np.ndarray]:
        """Every leaf of every sample as a read-only view of the map, shape (count, *leaf.shape)."""
        self._require_layout()
        return list(self._views)

    def samples(self) -> Any:
        """All samples as one batched pytree of read-only views (no copy)."""
        return self._require_layout().layout.unflatten(self.leaves())

    def raw_data(self) -> memoryview:
        """The bytes of the ``count`` samples (whole data region if the layout is unknown)."""
        if self._map is None:
            return memoryview(b"")
        end = self.file_size
        if self.placement is not None:
            end = self.header.data_offset + self.header.count * self.placement.sample_bytes
        return memoryview(self._map)[self.header.data_offset : end]

    # -- pickling (for worker processes: grain's, multiprocessing's) ---------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The path, the layout and what identifies the file; the map is not sent, it is reopened.

        A layout built from a template rebuilds through a closure, which ``pickle`` refuses and
        ``cloudpickle`` (what grain sends workers with) accepts.
        """
        return {"path": self.path, "layout": self.layout, "header": self.header, "file_size": self.file_size,
                "access": self.access}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], layout=state["layout"], access=state.get("access", "mmap"))
        then, now = (state["header"], state["file_size"]), (self.header, self.file_size)
        if then != now:
            self.close()
            raise PskdError(
                MISMATCH,
                f"{self.path}: the file changed since the reader was pickled "
                f"(count {then[0].count}, {then[1]} bytes then; count {now[0].count}, {now[1]} bytes now)",
            )

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._views = []
        self._records = None
        if self._file is not None:
            self._file.close()
            self._file = self._fd = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # A caller still holds a view of the map; it stays valid and closes with them.
                pass
            self._map = None

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Writers


@dataclasses.dataclass
class WriteResult:
    """What a writer wrote: the header fields and, per rounded leaf, what rounding did."""

    path: str
    type_text: str
    version: int
    count: int
    encodings: tuple[Encoding, ...]
    rounding: list[Rounding]


class Writer:
    """Appends batches of samples to a new ``.psk.d`` file, replacing ``path`` whole on close.

    ``encodings`` gives each leaf's encoding in storage order (default: all f64, version 1);
    a value its encoding does not hold is refused (E9004) unless ``round_to_encoding``.
    Each batch is a pytree of the layout whose leaves carry a leading batch axis.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        sample_type: str,
        *,
        encodings: Sequence[Encoding | str] | None = None,
        layout: Layout | Any | None = None,
        round_to_encoding: bool = False,
        durable: bool = True,
    ):
        self.path = os.fspath(path)
        self.type_text = header_text(sample_type)
        layout = resolve_layout(self.type_text, layout)
        if encodings is not None:
            encodings = [Encoding.parse(e) if isinstance(e, str) else Encoding(e) for e in encodings]
        self.placement = Placement.of(layout, encodings, self.path)
        self.round_to_encoding = round_to_encoding
        self.durable = durable
        self.count = 0
        self.rounding: dict[int, Rounding] = {}
        self._header_length = len(self._header())
        fd, self._tmp = temporary_path_for(self.path)
        self._file = os.fdopen(fd, "w+b")
        self._file.write(b"\0" * self._header_length)  # rewritten with the count on close

    def _header(self) -> bytes:
        return encode_header(self.type_text, self.count, self.placement.encodings)

    def append(self, batch: Any, *, row_names: Sequence[str] | None = None) -> None:
        """Appends a batch: a pytree of the layout, every leaf with a leading batch axis.

        ``row_names`` names each sample in error messages (pack names its input lines)."""
        columns = self.encode_batch(batch, row_names)
        n = columns[0].shape[0] if columns else 0
        placement = self.placement
        if len(columns) == 1:
            self._write(columns[0])
        else:
            records = np.empty(n, dtype=_record_dtype(placement))
            for i, column in enumerate(columns):
                records[f"f{i}"] = column
            self._write(records)
        self.count += n

    def _write(self, array: np.ndarray) -> None:
        if array.size == 0:  # memoryview cannot cast an empty shape; there is nothing to write
            return
        try:
            self._file.write(memoryview(np.ascontiguousarray(array)).cast("B"))
        except OSError as e:
            self.abort()
            raise PskdError(TRUNCATED, f"{self.path}: write failed: {e.strerror or e}") from None

    def encode_batch(self, batch: Any, row_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """A batch → one on-disk array per leaf, shape (n, *leaf.shape), checked and encoded."""
        placement = self.placement
        layout = placement.layout
        values = _leaf_values(layout, batch, self.path)
        columns, n = [], None
        for i, (leaf, value) in enumerate(zip(layout.leaves, values)):
            array = np.asarray(value) if not isinstance(value, np.ndarray) else value
            if array.ndim == 0 or (array.dtype == object and array.ndim == 0):
                raise PskdError(MISMATCH, f"{self.path}: leaf {leaf.path or '(root)'}: no batch axis")
            try:
                tree_lib.check_leaf_shape(leaf, array, batched=True)
            except PskdError as e:
                raise PskdError(e.code, f"{self.path}: {e.message}") from None
            if n is None:
                n = array.shape[0]
            elif array.shape[0] != n:
                raise PskdError(
                    MISMATCH,
                    f"{self.path}: leaf {leaf.path or '(root)'} has {array.shape[0]} samples, "
                    f"the first leaf {n}",
                )
            site = Site(f"{self.path}: leaf {leaf.path or '(root)'}", row_names, self.count)
            columns.append(self._encode_leaf(i, leaf, array, site))
        return columns

    def _encode_leaf(self, i: int, leaf: Leaf, array: np.ndarray, where: Site) -> np.ndarray:
        placement = self.placement
        if not leaf.is_real:
            return to_index(array, leaf.bound, leaf=where).astype(placement.disk_dtypes[i], copy=False)
        encoding = placement.encodings[i]
        if array.dtype == REAL_DTYPES[encoding]:
            # Already exactly in its encoding: only finiteness to check, no copy to f64.
            check_finite_encoded(array, encoding, where)
            narrowed, report = array, None
        else:
            narrowed, report = narrow(
                to_f64(array, leaf=where), encoding, leaf=where, round_to_encoding=self.round_to_encoding
            )
        if report is not None:
            report.where = (self.count + report.where[0], *report.where[1:]) if report.where else ()
            if i in self.rounding:
                self.rounding[i].merge(report)
            else:
                self.rounding[i] = report
        return narrowed.astype(REAL_DTYPES[encoding], copy=False).view(placement.disk_dtypes[i])

    def flush(self) -> None:
        """Writes the data so far and rewrites the header's count (the temporary file only)."""
        self._file.flush()
        self._file.seek(0)
        self._file.write(self._header())
        self._file.seek(0, os.SEEK_END)
        self._file.flush()

    def close(self) -> WriteResult:
        """Finishes the file and puts it in place of ``path``."""
        if self._file is None:
            raise PskdError(TRUNCATED, f"{self.path}: writer already closed")
        try:
            self.flush()
            if self.durable:
                os.fsync(self._file.fileno())
            os.replace(self._tmp, self.path)  # before closing: the file's lock guards it until then
            self._file.close()
            self._file = None
        except OSError as e:
            self.abort()
            raise PskdError(TRUNCATED, f"{self.path}: {e.strerror or e}") from None
        if self.durable:
            fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        return WriteResult(
            self.path,
            self.type_text,
            VERSION_ENCODED if any(e != Encoding.F64 for e in self.placement.encodings) else VERSION_F64,
            self.count,
            self.placement.encodings,
            [self.rounding[i] for i in sorted(self.rounding)],
        )

    def abort(self) -> None:
        """Drops the temporary file; ``path`` is left as it was."""
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.result = self.close()
        else:
            self.abort()


def check_finite_encoded(values: np.ndarray, encoding: Encoding, where: Site) -> None:
    """Refuses NaN/Inf in values already in their encoding; bf16 is checked on its exponent bits."""
    if encoding == Encoding.BF16:
        exponent = values.view(np.uint16) & np.uint16(0x7F80)
        if (exponent == np.uint16(0x7F80)).any():
            check_finite(values.astype(np.float32), leaf=where)
    elif not np.isfinite(values).all():
        check_finite(values, leaf=where)


def _record_dtype(placement: Placement) -> np.dtype:
    return np.dtype(
        {
            "names": [f"f{i}" for i in range(len(placement.disk_dtypes))],
            "formats": [(d, leaf.shape) if leaf.shape else d
                        for d, leaf in zip(placement.disk_dtypes, placement.layout.leaves)],
            "offsets": list(placement.offsets),
            "itemsize": placement.sample_bytes,
        }
    )


def _leaf_values(layout: Layout, batch: Any, path: str) -> list[Any]:
    """The batch's leaves in storage order, checking its structure against the layout (E9005)."""
    if layout.rebuild is not None:
        pairs, _ = tree_lib.flatten(batch)
        paths = [p for p, _ in pairs]
        expected = [leaf.path for leaf in layout.leaves]
        if paths != expected:
            given, wanted = set(paths), set(expected)
            problems = []
            if wanted - given:
                problems.append("missing " + ", ".join(p for p in expected if p not in given)[:400])
            if given - wanted:
                problems.append("not in the layout " + ", ".join(p for p in paths if p not in wanted)[:400])
            if not problems:
                first = next(a for a, b in zip(paths, expected) if a != b)
                problems.append(f"the same leaves in another order, {first} first differs")
            raise PskdError(MISMATCH, f"{path}: the tree does not match the layout: {'; '.join(problems)}")
        return [v for _, v in pairs]
    return _closed_values(layout.structure, batch, path, "")


def _closed_values(structure: Any, value: Any, path: str, key: str) -> list[Any]:
    if isinstance(structure, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(structure):
            found = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else type(value).__name__
            raise PskdError(
                MISMATCH, f"{path}: at {key or '(root)'}: expected a tuple of {len(structure)}, got {found}"
            )
        values = []
        for i, (s, v) in enumerate(zip(structure, value)):
            values.extend(_closed_values(s, v, path, f"{key}[{i}]"))
        return values
    if isinstance(value, (tuple, dict)) and not hasattr(value, "shape"):
        raise PskdError(MISMATCH, f"{path}: at {key or '(root)'}: expected an array, got a {type(value).__name__}")
    return [value]


def dtype_encodings(layout: Layout, batch: Any, *, path: str = "") -> list[Encoding]:
    """The encoding each real leaf's dtype asks for (f32 → f32, bf16 → bf16, else f64).

    ``path`` names the file in the error a batch that does not fit the layout raises (E9005)."""
    values = _leaf_values(layout, batch, path)
    encodings = []
    for leaf, value in zip(layout.leaves, values):
        dtype = getattr(value, "dtype", None)
        encodings.append(encoding_of_dtype(dtype) if leaf.is_real and dtype is not None else Encoding.F64)
    return encodings


def resolve_layout(sample_type: str, layout: Layout | Any | None) -> Layout:
    """The layout of a type: its own for a closed type, else the one supplied (template or Layout)."""
    if layout is None:
        return Layout.of_type(sample_type)
    return layout if isinstance(layout, Layout) else tree_lib.layout_of_template(layout)


def write(path: str | os.PathLike, sample_type: str, samples: Any, *, layout: Layout | Any | None = None,
          durable: bool = True) -> WriteResult:
    """Writes ``samples`` (a batched pytree) as a new file, each real leaf in the encoding of its
    dtype: version 1 when all are f64 (the same bytes any writer writes), else version 2.

    Values of other types (ints, Fractions, Decimals, strings, longdouble) are rounded once to f64.
    """
    layout = resolve_layout(sample_type, layout)
    encodings = dtype_encodings(layout, samples, path=os.fspath(path))
    return write_encoded(path, sample_type, samples, encodings, layout=layout, durable=durable)


def write_encoded(
    path: str | os.PathLike,
    sample_type: str,
    samples: Any,
    encodings: Sequence[Encoding | str],
    *,
    round_to_encoding: bool = False,
    layout: Layout | Any | None = None,
    durable: bool = True,
) -> WriteResult:
    """Writes ``samples`` with an explicit encoding per leaf (storage order).

    A value its leaf's encoding does not hold is refused (E9004) unless ``round_to_encoding``,
    which rounds half-even and reports the largest error per leaf in the result.
    """
    with Writer(path, sample_type, encodings=encodings, layout=layout,
                round_to_encoding=round_to_encoding, durable=durable) as writer:
        writer.append(samples)
    return writer.result


def write_stream(path: str | os.PathLike, sample_type: str, batches: Iterable[Any], **options: Any) -> WriteResult:
    """Writes a file from an iterable of batches, streaming (memory of one batch at a time)."""
    with Writer(path, sample_type, **options) as writer:
        for batch in batches:
            writer.append(batch)
    return writer.result


__all__ = [
    "MAGIC",
    "Header",
    "Reader",
    "Writer",
    "WriteResult",
    "encode_header",
    "read_header",
    "write",
    "write_encoded",
    "write_stream",
    "atomic_output",
]
