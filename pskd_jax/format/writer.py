"""Writing ``.psk.d`` files: whole, from a stream of batches, or leaf encoding by leaf encoding.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

import numpy as np

from pskd_jax._os import interrupts
from pskd_jax._os.atomic import check_destination, destination_for, fsync_directory, temporary_path_for
from pskd_jax.errors import MismatchError, PskdError, TruncatedError
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.encodings import (
    REAL_DTYPES,
    Encoding,
    Rounding,
    RowNames,
    Site,
    check_finite_encoded,
    encoding_of_dtype,
    narrow,
    to_f64,
    to_index,
)
from pskd_jax.format.header import VERSION_ENCODED, VERSION_F64, encode_header
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import MAX_RECORD_BYTES
from pskd_jax.format.sample_type import header_text
from pskd_jax.storage import Store, resolve


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
        parsed = None if encodings is None else [Encoding.parse(e) if isinstance(e, str) else Encoding(e)
                                                 for e in encodings]
        self.placement = Placement.of(layout, parsed, self.path)
        self.round_to_encoding = round_to_encoding
        self.durable = durable
        self.count = 0
        self.rounding: dict[int, Rounding] = {}
        self._header_length = len(self._header())
        # An object (s3://…) is written to an anonymous local file, put whole on close; a URL the
        # toolkit cannot serve is E9018 here, before anything is written. What stands at a local
        # path is looked at once: a link is written through, a FIFO, device or directory is
        # refused (E9012) before anything is written.
        store, where = resolve(self.path)
        self._object: tuple[Store, str] | None = None if where.is_local else (store, where.key)
        self._file: BinaryIO | None
        if self._object is None:
            self._destination = destination_for(where.path)
            fd, self._tmp = temporary_path_for(self._destination)
            self._file = os.fdopen(fd, "w+b")
        else:
            self._destination = self._tmp = ""
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close or abort)
        self._file.write(b"\0" * self._header_length)  # rewritten with the count on close

    def _open_file(self) -> BinaryIO:
        if self._file is None:
            raise TruncatedError(f"{self.path}: writer already closed")
        return self._file

    def _header(self) -> bytes:
        return encode_header(self.type_text, self.count, self.placement.encodings)

    def append(self, batch: Any, *, row_names: RowNames | None = None) -> None:
        """Appends a batch: a pytree of the layout, every leaf with a leading batch axis.

        ``row_names`` names each sample in error messages (pack names its input lines)."""
        interrupts.check()  # (a Ctrl-C that numpy swallowed converting the last batch stops the writing here)
        columns = self.encode_batch(batch, row_names)
        n = columns[0].shape[0] if columns else 0
        placement = self.placement
        if n == 0:
            return  # nothing to write (and numpy refuses even an empty array of records over 2^31 bytes)
        if len(columns) == 1:
            self._write(columns[0])
        elif placement.sample_bytes > MAX_RECORD_BYTES:
            # A sample larger than a numpy record: its leaves one after another (placed back to
            # back, no padding), sample by sample: no copy of the batch is made.
            for row in range(n):
                for column in columns:
                    self._write(column[row])
        elif placement.sample_bytes:
            # Leaves of no element hold no byte and are left out of the record (numpy refuses a
            # field whose empty shape has an axis beyond a C int, as idx[2][0, 3000000000]).
            present = [i for i, leaf in enumerate(placement.layout.leaves) if leaf.size]
            records = np.empty(n, dtype=_record_dtype(placement, present))
            for i in present:
                records[f"f{i}"] = columns[i]
            self._write(records)
        self.count += n

    def _write(self, array: np.ndarray) -> None:
        if array.size == 0:  # memoryview cannot cast an empty shape; there is nothing to write
            return
        try:
            self._open_file().write(np.ascontiguousarray(array).data.cast("B"))
        except OSError as e:
            self.abort()
            raise TruncatedError(f"{self.path}: write failed: {e.strerror or e}") from e

    def encode_batch(self, batch: Any, row_names: RowNames | None = None) -> list[np.ndarray]:
        """A batch → one on-disk array per leaf, shape (n, *leaf.shape), checked and encoded."""
        placement = self.placement
        layout = placement.layout
        values = _leaf_values(layout, batch, self.path)
        columns, n = [], None
        for i, (leaf, value) in enumerate(zip(layout.leaves, values)):
            array = np.asarray(value) if not isinstance(value, np.ndarray) else value
            if array.ndim == 0 or (array.dtype == object and array.ndim == 0):
                raise MismatchError(f"{self.path}: leaf {leaf.path or '(root)'}: no batch axis")
            try:
                tree_lib.check_leaf_shape(leaf, array, batched=True)
            except PskdError as e:
                raise PskdError(e.code, f"{self.path}: {e.message}") from None
            if n is None:
                n = array.shape[0]
            elif array.shape[0] != n:
                raise MismatchError(f"{self.path}: leaf {leaf.path or '(root)'} has {array.shape[0]} samples, "
                                    f"the first leaf {n}")
            site = Site(f"{self.path}: leaf {leaf.path or '(root)'}", row_names, self.count)
            columns.append(self._encode_leaf(i, leaf, array, site))
        return columns

    def _encode_leaf(self, i: int, leaf: Leaf, array: np.ndarray, where: Site) -> np.ndarray:
        placement = self.placement
        if leaf.bound is not None:  # an idx leaf
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
        file = self._open_file()
        file.flush()
        file.seek(0)
        file.write(self._header())
        file.seek(0, os.SEEK_END)
        file.flush()

    def close(self) -> WriteResult:
        """Finishes the file and puts it in place of ``path``."""
        if self._file is None:
            raise TruncatedError(f"{self.path}: writer already closed")
        try:
            interrupts.check()  # (an interrupted writer leaves its destination as it was)
            self.flush()
            if self._object is not None:
                self._put(self._file, *self._object)
                return self._result()
            if self.durable:
                os.fsync(self._file.fileno())
            check_destination(self._destination)
            os.replace(self._tmp, self._destination)  # before closing: the file's lock guards it until then
            self._file.close()
            self._file = None
        except OSError as e:
            self.abort()
            raise TruncatedError(f"{self.path}: {e.strerror or e}") from e
        except BaseException:
            self.abort()  # (a destination that became a FIFO or a directory meanwhile: E9012)
            raise
        if self.durable:
            fsync_directory(os.path.dirname(os.path.abspath(self._destination)))
        return self._result()

    def _put(self, spool: BinaryIO, store: Store, key: str) -> None:
        size = spool.seek(0, os.SEEK_END)
        spool.seek(0)
        store.put(key, iter(lambda: spool.read(8 << 20), b""), size=size)
        spool.close()
        self._file = None

    def _result(self) -> WriteResult:
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
        if self._object is not None:
            return
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.result = self.close()
        else:
            self.abort()


def _record_dtype(placement: Placement, leaves: Sequence[int]) -> np.dtype:
    """A sample as a numpy record of the given leaves (by index), each at its offset."""
    disk, layout = placement.disk_dtypes, placement.layout.leaves
    return np.dtype(
        {
            "names": [f"f{i}" for i in leaves],
            "formats": [(disk[i], layout[i].shape) if layout[i].shape else disk[i] for i in leaves],
            "offsets": [placement.offsets[i] for i in leaves],
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
            raise MismatchError(f"{path}: the tree does not match the layout: {'; '.join(problems)}")
        return [v for _, v in pairs]
    return _closed_values(layout.structure, batch, path, "")


def _closed_values(structure: Any, value: Any, path: str, key: str) -> list[Any]:
    if isinstance(structure, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(structure):
            found = (f"a {type(value).__name__} of {len(value)} values" if isinstance(value, (tuple, list))
                     else type(value).__name__)
            raise MismatchError(f"{path}: at {key or '(root)'}: expected a tuple of {len(structure)} values, "
                                f"got {found}")
        values = []
        for i, (s, v) in enumerate(zip(structure, value)):
            values.extend(_closed_values(s, v, path, f"{key}[{i}]"))
        return values
    if isinstance(value, (tuple, dict)) and not hasattr(value, "shape"):
        raise MismatchError(f"{path}: at {key or '(root)'}: expected an array, got a {type(value).__name__}")
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


__all__ = ["WriteResult", "Writer", "dtype_encodings", "resolve_layout", "write", "write_encoded", "write_stream"]
