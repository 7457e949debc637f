"""Random access to the samples of a ``.psk.d`` file: :class:`Reader`.

A reader checks a file's header against its size, then serves ``reader[k]``, ``gather`` (one
vectorised read per leaf or per record) and read-only views, through a memory map or positional
reads. The rules it shares with every source of samples (indices, access modes, iteration, grain's
hooks, pickling) are :mod:`pskd_jax.format.source`'s. See ``docs/format.md`` (Reading and writing).
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
from typing import Any

import numpy as np
import xxhash

from pskd_jax._os.checks import first_true, not_below
from pskd_jax._os.digests import sampled_digest
from pskd_jax._os.files import same_place
from pskd_jax.errors import (
    BadValueError,
    MismatchError,
    NotClosedError,
    NotPskdError,
    PskdError,
    TruncatedError,
    UsageError,
)
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.byte_sources import (
    ByteSource,
    FileBytes,
    Runs,
    StoreBytes,
    aligned_empty,
    cut_short,
    open_bytes,
    read_runs,
)
from pskd_jax.format.encodings import index_dtype
from pskd_jax.format.header import MAX_COUNT, Header, read_header
from pskd_jax.format.layout import Layout
from pskd_jax.format.layout_file import (
    LayoutFile,
    OtherVersion,
    check_header_belongs,
    layout_beside,
    version_of,
)
from pskd_jax.format.one_save import identity_of
from pskd_jax.format.placement import Placement, c_strides
from pskd_jax.format.sample_type import ParamsType, parse_type
from pskd_jax.format.source import RandomAccessSource, checked_access, checked_index
from pskd_jax.storage import StorageOptions, locate


def template_mismatch(template_paths: list[str], file_paths: list[str], *, listed: int = 20) -> str | None:
    """What differs between a template's key paths and a file's, both in storage order (None when
    they are the same): "same leaves, other order", or every missing and extra key path (abridged)."""
    if template_paths == file_paths:
        return None
    if sorted(template_paths) == sorted(file_paths):
        k = next(k for k, (a, b) in enumerate(zip(template_paths, file_paths)) if a != b)
        return (f"same leaves, other order: leaf {k} is {template_paths[k] or '(root)'} in the template, "
                f"{file_paths[k] or '(root)'} in the file")
    have, want = set(file_paths), set(template_paths)
    missing = [p for p in template_paths if p not in have]
    extra = [p for p in file_paths if p not in want]

    def shown(paths: list[str]) -> str:
        return ", ".join(paths[:listed]) + (f", … and {len(paths) - listed} more" if len(paths) > listed else "")

    parts = ([f"{len(missing)} key path(s) of the template not in the file: {shown(missing)}"] if missing else []) \
        + ([f"{len(extra)} key path(s) of the file not in the template: {shown(extra)}"] if extra else [])
    return "; ".join(parts)


MAX_RECORD_BYTES = 2**31 - 1  # numpy's largest void item: larger samples are gathered leaf by leaf


class Reader(RandomAccessSource):
    """Random access to the samples of a ``.psk.d`` file, through a read-only memory map
    (``access="mmap"``, the default for a local file) or positional reads (``access="pread"``).

    ``path`` is a local path or a URL (``file://``, ``s3://``, ``gs://``, ``memory://``; reached
    as ``storage`` says, default the environment's: see ``docs/storage.md``). An object in a
    store is read by byte ranges (``access="pread"``, its default); ``access="mmap"``, and the
    views of a map (:meth:`leaves`, :meth:`samples`, :meth:`raw_data`), need a local file and
    refuse an object (E9012).

    ``layout`` supplies the leaves of a ``params`` file: a :class:`Layout` or a template pytree
    (arrays or ``jax.ShapeDtypeStruct``s in declaration order); closed types need none. Indices
    follow Python's rules (negative from the end; :class:`~pskd_jax.errors.IndexOutOfRangeError`
    past the end, so ``for sample in reader`` stops). What each access mode costs, what happens to
    a file cut short under a reader, and :meth:`refresh`: ``docs/format.md``.

    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "w.psk.d")
    >>> from pskd_jax.format import write
    >>> _ = write(path, "(idx[64][seq: 4], ℝ[])", (np.arange(8).reshape(2, 4), np.array([0.5, 1.5])))
    >>> with Reader(path) as r:
    ...     print(len(r), r[1], r.gather([1, 0, 1])[1])
    2 (array([4, 5, 6, 7], dtype=uint8), array(1.5)) [1.5 0.5 1.5]
    """

    def __init__(self, path: str | os.PathLike, *, layout: Layout | Any | None = None, access: str | None = None,
                 storage: StorageOptions | None = None):
        where = locate(path)  # (E9018 for a URL the toolkit cannot serve: never a local path)
        self.path = where.url if not where.is_local else where.path
        self.storage = storage
        if access is None:
            access = "mmap" if where.is_local else "pread"
        self.access = checked_access(access, self.path)
        if access == "mmap" and not where.is_local:
            raise UsageError(f"{self.path}: access='mmap' maps a local file; an object in a store is read by byte "
                             "ranges (access='pread', the default for a URL)")
        # A regular file only: a FIFO or a device is refused (E9002) at once, never waited on.
        self._bytes = open_bytes(where, storage)
        self._views: list[np.ndarray] | None = None  # made when first needed (see _leaf_views)
        self._records: np.ndarray | None = None  # made when first needed (see _record_array)
        try:
            try:
                # A file being appended to (a corpus shard, chunk by chunk) grows its data before
                # its count: the size taken after the header covers every sample the header counts.
                self.header, self.file_size = self._read_header()
            except OSError as e:
                raise NotPskdError(f"{self.path}: cannot read: {e.strerror or e}") from e
            if access == "mmap":
                self._bytes.mapped(self.file_size)
            if self.header.count > MAX_COUNT:
                raise TruncatedError(f"{self.path}: a count of {self.header.count} samples, beyond the 2^63 - 1 a "
                                     f"reader can index")
        except BaseException:
            self.close()
            raise
        self.layout: Layout | None = None
        self.placement: Placement | None = None
        self._record: np.dtype | None = None  # a whole sample as one opaque record, if numpy holds one
        self._bounded: list[int] = []
        self._forms: tuple[sd.Form | None, ...] | None = None  # (from a LayoutFile: values as restored)
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

    def _read_header(self) -> tuple[Header, int]:
        """The header, read with plain reads of the descriptor (never through the map), and the
        file's size taken after it."""
        size = self._bytes.size()
        header = read_header(self._bytes.header_stream(), self.path, size)
        return header, self._bytes.size()

    # -- layout ------------------------------------------------------------------------------

    def with_layout(self, layout: Layout | LayoutFile | Any) -> Reader:
        """Supplies (or replaces) the layout; returns the reader. A template (not a :class:`Layout`)
        for a ``params`` file with its layout file beside it is checked against that file: the
        same key paths in the same order, the same shapes and storage (E9005 otherwise). A
        :class:`LayoutFile` (``find_layout_file(path)``) must belong to the file (E9005 naming
        both); samples then show each leaf's values as restore, info and export do (an int8 −3 as
        −3, not its stored 253); :meth:`leaves` stay the stored elements."""
        forms: tuple[sd.Form | None, ...] | None = None
        if isinstance(layout, LayoutFile):
            self.check_layout(layout)
            forms = tuple(layout.forms) if any(f is not None for f in layout.forms) else None
            layout = layout.layout
        self._forms = None
        if not isinstance(layout, Layout):
            layout = tree_lib.layout_of_template(layout)
            if self.header.is_params:
                layout = self._checked_template(layout)
        encodings = self.header.encodings
        if encodings is not None and len(encodings) != len(layout.leaves):
            raise MismatchError(f"{self.path}: the header lists {len(encodings)} leaves, the layout has "
                                f"{len(layout.leaves)} leaves")
        placement = Placement.of(layout, encodings, self.path, from_header=True)
        self._check_size(placement.sample_bytes)
        self._check_addressable(placement)
        self._check_params_size(placement.sample_bytes)
        self.layout, self.placement = layout, placement
        self._forms = forms
        self._views, self._records = None, None
        self._record = self._record_dtype()
        # idx leaves whose dtype holds values at or above the bound (idx[10] in u8): gathered
        # values are checked. A bound that fills its dtype (idx[256] in u8) needs no check.
        self._bounded = [i for i, (leaf, disk) in enumerate(zip(layout.leaves, placement.disk_dtypes))
                         if leaf.bound is not None and leaf.bound < 1 << (8 * disk.itemsize)]
        return self

    def check_layout(self, layout_file: LayoutFile) -> None:
        """Refuses (E9005 naming both) a layout file that is not this file's, checked against the
        file this reader opened and reads (its header and size), never against whatever its path
        names by then. A layout file proven to belong to this path's local data file
        (``find_layout_file``, ``read_layout_file(…, data=…)``) is taken only for the very file it
        was proven against, and an object of a store only for the version it records: a layout of
        another save is refused (:class:`OtherVersion`) even where the two saves' headers and sizes
        agree."""
        paired = layout_file.paired
        if (paired is not None and isinstance(self._bytes, FileBytes) and same_place(paired[0], self.path)
                and identity_of(self.fileno()) != paired[1]):
            raise OtherVersion(f"{layout_file.path or 'the layout'}: not the layout of {self.path}: it was read "
                               "beside another data file there, of another save: the checkpoint was saved again "
                               "between the read of its layout and the opening of its data: read it again")
        header_bytes = bytearray(self.header.data_offset)
        self._bytes.read_at(memoryview(header_bytes), 0)
        check_header_belongs(layout_file, self.path, self.header, bytes(header_bytes), self.file_size,
                             version=version_of(self._bytes))

    def _checked_template(self, template: Layout) -> Layout:
        """A template's layout checked against the layout file beside the file (one that proves it
        belongs to this file; any other is not used): the file's leaves, the template's tree."""
        try:
            beside = layout_beside(self.path)
            if beside is not None:
                self.check_layout(beside)  # (of the very file read: one there since is another save's)
        except PskdError:
            return template  # a layout file of another save, or none that reads: not used
        if beside is None:
            return template
        found = beside.layout.leaves
        problem = template_mismatch([leaf.path for leaf in template.leaves], [leaf.path for leaf in found])
        if problem is None:
            for mine, theirs in zip(template.leaves, found):
                if mine.shape != theirs.shape or mine.is_real != theirs.is_real or (
                        mine.bound is not None and theirs.bound is not None
                        and index_dtype(mine.bound) != index_dtype(theirs.bound)):
                    stored = "reals" if theirs.is_real else f"idx[{theirs.bound}]"
                    asked = "reals" if mine.is_real else f"idx[{mine.bound}]"
                    problem = (f"at {mine.path or '(root)'}: the template has {asked} of shape {list(mine.shape)}, "
                               f"the file {stored} of shape {list(theirs.shape)}")
                    break
        if problem is not None:
            raise MismatchError(f"{self.path}: the template does not match its layout file {beside.path}: {problem}")
        return Layout(found, template.structure, template.rebuild)

    def _check_size(self, sample_bytes: int) -> None:
        needed = self.header.data_offset + self.header.count * sample_bytes
        if needed > self.file_size:
            present = (self.file_size - self.header.data_offset) // sample_bytes if sample_bytes else 0
            raise TruncatedError(f"{self.path}: truncated: {self.header.count} samples of {sample_bytes} bytes "
                                 f"announced, {max(present, 0)} present ({self.file_size} bytes, {needed} needed)")

    def _check_addressable(self, placement: Placement) -> None:
        """Refuses what no numpy array can hold: the file's size bounds every leaf with elements,
        but a leaf whose shape has an empty axis holds none, and numpy still refuses an array whose
        other axes times its item size pass 2^63 (a hostile count over an empty type)."""
        for leaf, dtype in zip(placement.layout.leaves, placement.disk_dtypes):
            span = max(self.header.count, 1) * dtype.itemsize * math.prod(d for d in leaf.shape if d)
            if span > MAX_COUNT:
                raise TruncatedError(f"{self.path}: {self.header.count} samples of leaf {leaf.path or '(root)'} "
                                     f"(shape {list(leaf.shape)}) span more than the 2^63 bytes an array can address")

    def _check_params_size(self, sample_bytes: int) -> None:
        """A parameter tree's layout comes from outside the file, so the file's size is its only
        witness: a params file (written whole, never appended to) must hold exactly its samples."""
        if not self.header.is_params:
            return
        data = self.file_size - self.header.data_offset
        if data != self.header.count * sample_bytes:
            raise MismatchError(f"{self.path}: the layout makes samples of {sample_bytes} bytes, so "
                                f"{self.header.count} "
                                f"of them take {self.header.count * sample_bytes} bytes, but the file holds {data} "
                                f"bytes of data: the layout is not the one {self.header.type_text!r} was written with")

    def _require_layout(self) -> Placement:
        if self.placement is None:
            raise NotClosedError(f"{self.path}: type {self.header.type_text!r} needs its layout "
                                 "(Reader(path, layout=template) or reader.with_layout(...))")
        return self.placement

    def _require_open(self) -> ByteSource:
        if self._bytes.closed:
            raise UsageError(f"{self.path}: the reader is closed")
        return self._bytes

    def fileno(self) -> int:
        """The descriptor of the local file this reader holds open: every read through it reads
        that file, whatever its path names since. E9012 for an object of a store, or once closed."""
        source = self._require_open()
        if not isinstance(source, FileBytes):
            raise UsageError(f"{self.path}: an object of a store, read by byte ranges, has no descriptor")
        return source.fileno()

    def _mapped(self) -> mmap.mmap | None:
        """The map of the file, made now if this reader had none yet (``access="pread"`` maps only
        for the views asked of it); None for an empty file or a closed reader. E9012 for an object
        in a store, which has no map."""
        if not self._bytes.can_map:
            raise UsageError(f"{self.path}: views of the samples are views of a local file's memory map; an object in "
                             "a store is read with reader[k], gather() or read_data()")
        return self._bytes.mapped(self.file_size) if not self._bytes.closed else None

    def _map_bytes(self) -> np.ndarray:
        """The map as bytes through ``np.frombuffer``, which holds a buffer export: while any view
        lives, closing the map fails (and is deferred) instead of leaving the view dangling."""
        mapped = self._mapped()
        assert mapped is not None  # (its callers have a map: an open reader of a file with samples)
        return np.frombuffer(mapped, dtype=np.uint8)

    def _leaf_views(self) -> list[np.ndarray]:
        """Every leaf's view over the map (:meth:`_leaf_view`), built on first use and kept: a
        reader that only reads positionally (a restore, ``access="pread"``) never pays for them."""
        if self._views is None:
            self._require_open()
            self._views = [self._leaf_view(i) for i in range(len(self._require_layout().layout.leaves))]
        return self._views

    def _leaf_view(self, i: int) -> np.ndarray:
        """Leaf i of every sample as one strided array over the map (no copy)."""
        placement = self._require_layout()
        leaf = placement.layout.leaves[i]
        disk = placement.disk_dtypes[i]
        count = self.header.count
        if self._mapped() is None or count == 0 or placement.sample_bytes == 0:
            empty = np.zeros((count, *leaf.shape), dtype=placement.value_dtype(i))
            empty.flags.writeable = False  # read-only like a view of the map
            return empty
        inner_strides = c_strides(leaf.shape, disk.itemsize)
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

    # -- what the source core reads (see pskd_jax.format.source) ----------------------------------

    def _length(self, now: Any) -> int:
        return self.header.count

    def _check_readable(self) -> None:
        if self.placement is None or self._bytes.closed:  # one test on the way of every read
            self._require_layout()
            self._require_open()

    def _sample_bytes(self) -> int:
        return self._require_layout().sample_bytes

    def _assemble(self, leaves: list[np.ndarray]) -> Any:
        return self._require_layout().layout.unflatten(self._shown(leaves))  # (only after _check_readable)

    def _shown(self, leaves: list[np.ndarray]) -> list[Any]:
        """The leaves of one sample or of a batch as a layout file's forms give them back (as
        stored without one)."""
        if self._forms is None:
            return leaves
        placement = self._require_layout()
        out = []
        for i, (values, form) in enumerate(zip(leaves, self._forms)):
            leaf = placement.layout.leaves[i]
            out.append(sd.shown_values(values, form, f"{self.path}: at {leaf.path or '(root)'}", bound=leaf.bound,
                                       stored_encoding=placement.encodings[i] if leaf.is_real else None,
                                       batched=tuple(values.shape) != leaf.shape))
        return out

    def _rows(self, now: Any, positions: np.ndarray) -> list[np.ndarray]:
        """Each leaf of the samples at ``positions`` (checked, from 0), bounds checked: whole records
        as opaque bytes (alignment 1: a plain copy per record, never a copy of the file as numpy
        makes for unaligned or strided sources), split per leaf; a sample too large to be one numpy
        record, leaf by leaf."""
        placement = self._require_layout()
        leaf_count = len(placement.layout.leaves)
        if self.access == "mmap" and len(positions):
            self._check_still_whole()
        if self._record is None and placement.sample_bytes and len(positions):
            if self.access == "pread":
                leaves = [self._read_leaf_rows(i, positions) for i in range(leaf_count)]
            else:
                leaves = [self._take(view, positions) for view in self._leaf_views()]
        else:
            records = None
            if self._record is not None and len(positions):
                records = self._read_records(positions) if self.access == "pread" else \
                    self._take(self._record_array(), positions)
            leaves = [self._leaf_of_records(records, i, len(positions)) for i in range(leaf_count)]
        for i in self._bounded:
            self._check_bound(i, leaves[i], positions)
        return leaves

    @staticmethod
    def _take(view: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The rows of a view of the map at ``positions`` (checked already) in a new aligned array:
        one copy, straight into it."""
        out = aligned_empty((len(positions), *view.shape[1:]), view.dtype)
        return view.take(positions, axis=0, out=out, mode="clip")  # ("raise" would copy twice)

    def _check_still_whole(self) -> None:
        """Refuses to copy out of the map a file cut short since it was opened (E9003): its
        size a gather (one ``lseek`` of the kept descriptor). A file cut short between this check
        and the copy still kills the process; only a file rewritten in place does that (the
        toolkit's writers write a new file and rename it); ``access="pread"`` turns even that into
        E9003."""
        needed = self.header.data_offset + self.header.count * self._require_layout().sample_bytes
        size = self._bytes.size()
        if size < needed:
            raise cut_short(self.path, size, needed, f"its {self.header.count} samples")

    def _read_leaf_rows(self, i: int, positions: np.ndarray) -> np.ndarray:
        """Leaf i of the samples at ``positions``, one positional read a row: the path of samples
        too large for a numpy record under ``access="pread"``."""
        placement = self._require_layout()
        leaf, disk = placement.layout.leaves[i], placement.disk_dtypes[i]
        out = aligned_empty((len(positions), *leaf.shape), disk)
        if out.size:
            offsets = (self.header.data_offset + placement.offsets[i]
                       + positions.astype(np.int64) * placement.sample_bytes)
            read_runs([self._bytes], Runs.of_rows(offsets, out[0].nbytes), out, self.path)
        return out.view(placement.value_dtype(i))

    def leaf_range(self, index: int, i: int, start: int, stop: int) -> np.ndarray:
        """Elements ``start`` to ``stop`` (row-major, flat) of leaf ``i`` of sample ``index``, read
        on their own with a positional read (never the whole sample): what shows or writes a
        sample of a few GiB in part. idx values are checked against their bound (E9004)."""
        placement = self._require_layout()
        position = checked_index(index, self.header.count, self.path, "sample")
        leaf, disk = placement.layout.leaves[i], placement.disk_dtypes[i]
        start, stop = max(0, int(start)), min(int(stop), leaf.size)
        out = np.empty(max(0, stop - start), dtype=disk)
        if out.size:
            offset = (self.header.data_offset + position * placement.sample_bytes + placement.offsets[i]
                      + start * disk.itemsize)
            self._require_open().read_at(out.view(np.uint8).data, offset)
        values = out.view(placement.value_dtype(i))
        if i in self._bounded:
            self._check_bound(i, values.reshape(1, -1), np.array([position]))
        return values

    def read_data(self, start: int, stop: int) -> np.ndarray:
        """Bytes ``start`` to ``stop`` of the data region (what follows the header) as a fresh
        ``uint8`` array, read with a positional read of the reader's own descriptor, never through
        a map: a file cut short meanwhile is E9003 naming it. For a reader of whole files in
        bounded pieces (``diff``), with or without a layout."""
        start, stop = max(0, int(start)), max(0, int(stop))
        out = np.empty(max(0, stop - start), dtype=np.uint8)
        if out.size:
            self._require_open().read_at(out.data, self.header.data_offset + start)
        return out

    def _check_bound(self, i: int, values: np.ndarray, positions: np.ndarray) -> None:
        """Refuses stored idx values at or above the leaf's bound (only a damaged or hand-made file
        holds one: every writer refuses them)."""
        leaf = self._require_layout().layout.leaves[i]
        bound = leaf.bound
        assert bound is not None  # (only idx leaves are bounded)
        if values.size == 0 or values.max() < bound:
            return
        row = first_true(values.reshape(len(values), -1).max(axis=1) >= bound)
        raise BadValueError(f"{self.path}: sample {int(positions[row])}, leaf {leaf.path or '(root)'}: stored value "
                            f"{not_below(int(values[row].max()), bound)}")

    def _read_records(self, positions: np.ndarray) -> np.ndarray:
        """The records at ``positions``, one positional read a run of consecutive records, straight
        into the batch (``access="pread"``)."""
        record = self._record
        assert record is not None  # (read as records only when a sample is one)
        out = aligned_empty(len(positions), record)
        runs = Runs.of_records(positions, record.itemsize, self.header.data_offset)
        return read_runs([self._bytes], runs, out, self.path)

    def _record_dtype(self) -> np.dtype | None:
        """A sample as one opaque record, or None when samples are empty or larger than the
        2^31 - 1 bytes a numpy record holds (a checkpoint of several GiB)."""
        sample_bytes = self._require_layout().sample_bytes
        if sample_bytes == 0 or sample_bytes > MAX_RECORD_BYTES:
            return None
        return np.dtype((np.void, sample_bytes))

    def _record_array(self) -> np.ndarray:
        """Every sample as one opaque record, a view of the map (``access="mmap"``)."""
        if self._records is None:
            mapped, record = self._mapped(), self._record
            assert mapped is not None and record is not None  # (an open reader whose samples are records)
            self._records = np.frombuffer(mapped, dtype=record, count=self.header.count,
                                          offset=self.header.data_offset)
        return self._records

    def _leaf_of_records(self, records: np.ndarray | None, i: int, n: int) -> np.ndarray:
        """Leaf i of gathered records: a view when it is the whole record, else a contiguous copy."""
        placement = self._require_layout()
        leaf = placement.layout.leaves[i]
        value_dtype = placement.value_dtype(i)
        if records is None or n == 0:
            shape = (n, *leaf.shape)
            if math.prod(d for d in shape if d) * value_dtype.itemsize > MAX_COUNT:  # numpy refuses even 0 elements
                raise TruncatedError(f"{self.path}: {n} samples of leaf {leaf.path or '(root)'} (shape "
                                     f"{list(leaf.shape)}) span "
                                     "more than the 2^63 bytes an array can address")
            return np.zeros(shape, dtype=value_dtype)
        disk = placement.disk_dtypes[i]
        if len(placement.disk_dtypes) == 1:
            return records.view(disk).reshape(n, *leaf.shape).view(value_dtype)
        inner = c_strides(leaf.shape, disk.itemsize)
        strided = np.ndarray((n, *leaf.shape), dtype=disk, buffer=records, offset=placement.offsets[i],
                             strides=(placement.sample_bytes, *inner))
        out = aligned_empty(strided.shape, disk)
        np.copyto(out, strided)
        return out.view(value_dtype)

    def leaves(self) -> list[np.ndarray]:
        """Every leaf of every sample as a read-only view of the map, shape (count, *leaf.shape)."""
        self._require_layout()
        return list(self._leaf_views())

    def samples(self) -> Any:
        """All samples as one batched pytree of read-only views (no copy; values a layout file
        decodes, an int8 among them, in new arrays)."""
        return self._require_layout().layout.unflatten(self._shown(self.leaves()))

    def raw_data(self) -> memoryview:
        """The bytes of the ``count`` samples (whole data region if the layout is unknown)."""
        mapped = self._mapped()
        if mapped is None:
            return memoryview(b"")
        end = self.file_size
        if self.placement is not None:
            end = self.header.data_offset + self.header.count * self.placement.sample_bytes
        return memoryview(mapped)[self.header.data_offset : end]

    # -- identity and pickling (the source core's repr and worker processes) ----------------------

    def _identity(self) -> str:
        """The type, the count, the size, and an xxh3 of the header and the first and last 4 KiB
        of data (cheap; no object id, no modification time): a state grain saved over one reader
        restores over a new reader of the same file, and is refused over another."""
        key = (self.file_size, self.header.count)
        cached = self.__dict__.get("_repr_identity")
        if cached is None or cached[0] != key:
            start, end = self.header.data_offset, self.file_size
            spans = [(0, start), (start, min(4096, end - start)), (max(start, end - 4096), min(4096, end - start))]
            try:
                sampled = self._sampled(spans)
            except PskdError:  # gone or unreadable since opened: still a repr, and never equal to a readable one
                sampled = "unreadable"
            cached = (key, sampled)
            self.__dict__["_repr_identity"] = cached
        return f"type={self.header.type_text!r}, count={self.header.count}, bytes={self.file_size}, " \
               f"sampled_xxh3={cached[1]}"

    def _sampled(self, spans: list[tuple[int, int]]) -> str:
        """:func:`sampled_digest` of the file, or of an object by the same rule (its bytes read by
        ranges), so that a local copy and the object it came from digest alike."""
        if self._bytes.can_map:
            return sampled_digest(self.path, spans)
        digest = xxhash.xxh3_128()
        pieces = [np.empty(max(0, min(size, self.file_size - offset)), np.uint8) for offset, size in spans]
        self._bytes.read_spans([p.data for p in pieces], [offset for offset, _ in spans])
        for (offset, _), piece in zip(spans, pieces):
            digest.update(offset.to_bytes(8, "little"))
            digest.update(piece.data)
        return digest.hexdigest()

    def _reopen(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # A layout built from a template rebuilds through a closure, which ``pickle`` refuses and
        # ``cloudpickle`` (what grain sends workers with) accepts.
        extra = {"storage": self.storage} if self.storage is not None else {}
        return (self.path,), {"layout": self.layout, "access": self.access, **extra}

    def _witness(self) -> tuple[Any, ...]:
        if isinstance(self._bytes, StoreBytes):  # an object replaced under its key has another tag
            return self.header, self.file_size, self._bytes.info.tag
        return self.header, self.file_size

    def _changed(self, then: tuple[Any, ...]) -> PskdError:
        return MismatchError(f"{self.path}: the file changed since the reader was pickled ({then[0].count} samples, "
                             f"{then[1]} bytes then; {self.header.count} samples, {self.file_size} bytes now)")

    # -- a file that grows --------------------------------------------------------------------

    def refresh(self) -> int:
        """Takes in the samples appended since the reader opened (or last refreshed): a shard being
        built, a file being appended to. Returns the count now.

        The header is read again (plain reads of the descriptor), then the file's size; the map and
        the views are extended to the new count. Views taken before stay valid (over the old map).
        E9002 naming the file when its path now names another file (replaced, removed) or its
        header now says something else than the count; E9003 when it holds fewer samples or bytes
        than before, or than its new count needs. An object in a store never grows (it is written
        whole): its refresh looks at it again, and E9002 says when it was replaced or removed.
        """
        source = self._require_open()
        if isinstance(source, StoreBytes):
            changed = source.changed()  # (the object at the key, and the parts of a parts index)
            if changed is not None:
                raise NotPskdError(f"{changed}: open a new Reader")
            return self.header.count
        assert isinstance(source, FileBytes)
        fd = source.fileno()
        try:
            held, named = os.fstat(fd), os.stat(self.path)
        except OSError as e:
            raise NotPskdError(f"{self.path}: no longer names the file the reader opened ({e.strerror or e})") from e
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            raise NotPskdError(f"{self.path}: now names another file than the one the reader opened (replaced "
                               "since): open a new Reader")
        try:
            header, size = self._read_header()
        except OSError as e:
            raise TruncatedError(f"{self.path}: cannot read: {e.strerror or e}") from e
        before = self.header
        if dataclasses.replace(header, count=before.count) != before:
            raise NotPskdError(f"{self.path}: its header changed since the reader opened (type {header.type_text!r}, "
                               f"version {header.version}; was {before.type_text!r}, version {before.version})")
        if header.count < before.count or size < self.file_size:
            raise TruncatedError(f"{self.path}: cut short since the reader opened: {header.count} samples in "
                                 f"{size} bytes now, {before.count} in {self.file_size} before")
        if header.count > MAX_COUNT:
            raise TruncatedError(f"{self.path}: a count of {header.count} samples, beyond the 2^63 - 1 a reader can "
                                 f"index")
        if (header, size) == (before, self.file_size):
            return header.count
        old = (self.header, self.file_size)
        self.header, self.file_size = header, size
        try:
            if self.placement is not None:
                self._check_size(self.placement.sample_bytes)
                self._check_addressable(self.placement)
                self._check_params_size(self.placement.sample_bytes)
            if self.access == "mmap" or source.map is not None:
                source.mapped(size)  # the map before closes now, or with the last view taken of it
        except BaseException:
            self.header, self.file_size = old
            raise
        self._views, self._records = None, None  # made again over the new map when asked for
        return header.count

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the file and its map (a caller still holding a view of the map keeps it valid; it
        closes with them). Idempotent; ``len`` and the header stay."""
        self._views = None
        self._records = None
        self._bytes.close()


__all__ = ["MAX_RECORD_BYTES", "Reader", "template_mismatch"]
