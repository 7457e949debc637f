"""``export``: the samples of a file as JSON, every real exact.

The JSON, the strings that stand for non-finite reals, and the values a checkpoint's leaves are
shown as (:func:`shown_values`, shared with ``info``) are defined in ``docs/export.md``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from pskd_jax.errors import BadValueError, MismatchError, TruncatedError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.encodings import is_bfloat16
from pskd_jax.format.keypaths import check_json_keys
from pskd_jax.format.layout_file import LayoutFile, OtherVersion, layout_after
from pskd_jax.format.one_save import until_one_save
from pskd_jax.format.reader import Reader
from pskd_jax.format.stored_dtypes import shown_values
from pskd_jax.storage import whole_output

CHUNK_ELEMENTS = 1 << 20  # bounds the memory of export, whatever the file's size

#: The most samples that hold no data (a type of empty leaves) export writes: their count is a
#: header's claim with no byte behind it, and each still costs JSON text.
MAX_EMPTY_SAMPLES = 1 << 24

#: The quiet NaN of each encoding, sign bit clear: written "NaN"; any other NaN (and every NaN
#: of another dtype: float16, float8…) shows its bits.
_QUIET_NAN = {np.dtype("<f8"): 0x7FF8000000000000, np.dtype("<f4"): 0x7FC00000}
_BF16_QUIET_NAN = 0x7FC0  # (bf16 apart: its dtype is made when ml_dtypes is first needed)
_UNSIGNED = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


def non_finite_text(value: Any) -> str:
    """The JSON string export writes for a non-finite real of a float dtype (see the module's
    docstring): ``"Infinity"``, ``"-Infinity"``, ``"NaN"``, or ``"NaN:0x…"`` with the stored bits.

    >>> non_finite_text(np.float32("-inf")), non_finite_text(np.float64("nan"))
    ('-Infinity', 'NaN')
    >>> non_finite_text(np.array([0x7FF8000000000001], np.uint64).view(np.float64)[0])
    'NaN:0x7ff8000000000001'
    """
    scalar = np.asarray(value)
    with np.errstate(invalid="ignore"):  # a signalling NaN widens quietly (its bits are shown)
        wide = float(scalar.astype(np.float64))
    if wide == float("inf"):
        return "Infinity"
    if wide == float("-inf"):
        return "-Infinity"
    size = scalar.dtype.itemsize
    bits = int(scalar.reshape(1).view(_UNSIGNED[size])[0])
    quiet = _BF16_QUIET_NAN if is_bfloat16(scalar.dtype) else _QUIET_NAN.get(scalar.dtype)
    return "NaN" if bits == quiet else f"NaN:0x{bits:0{2 * size}x}"


def _reals(value: np.ndarray) -> Any:
    """A real array as Python floats holding the stored values exactly (bf16 and f32 widen
    exactly), the non-finite ones as the strings of :func:`non_finite_text`."""
    with np.errstate(invalid="ignore"):  # a signalling NaN widens quietly (its bits are shown)
        wide = value.astype(np.float64)
    if wide.size == 0 or np.isfinite(wide).all():
        return wide.tolist()
    if wide.ndim == 0:
        return non_finite_text(value)
    mixed = wide.astype(object)
    for where in zip(*np.nonzero(~np.isfinite(wide))):
        mixed[where] = non_finite_text(value[where])
    return mixed.tolist()


def plain(value: Any) -> Any:
    """A sample's pytree → plain Python (lists, tuples, dicts, ints, floats) for printing or JSON.

    Reals become Python floats holding the stored value exactly (bf16 and f32 widen exactly);
    a non-finite real becomes its string (:func:`non_finite_text`).
    """
    if isinstance(value, np.ndarray):
        if sd.is_narrow_integer(value.dtype):  # (int4 and its kin: numpy sees opaque bytes)
            return value.astype(np.int64).tolist()
        if value.dtype.kind in "fV" or is_bfloat16(value.dtype):
            return _reals(value)
        return value.tolist()
    if isinstance(value, np.floating) or (isinstance(value, np.generic) and is_bfloat16(value.dtype)):
        return _reals(np.asarray(value))
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return non_finite_text(np.float64(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {f: plain(getattr(value, f)) for f in value._fields}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        # (two keys of one JSON text, 1 and '1': refused, E9005 naming both, never one dropped)
        return dict(zip(check_json_keys(list(value), "a sample's tree"), (plain(v) for v in value.values())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def open_with_layout(path: str, layout: Any) -> tuple[Reader, list[sd.Form | None] | None]:
    """A reader of ``path`` (positional reads) through ``layout``, and each leaf's form when
    ``layout`` is a layout file; None for other layouts. A layout file is proven to belong to the
    file the reader opened — of an object, the very version it reads — not to whatever the path
    names by then (E9005 naming both otherwise). One looked up for the file
    (``find_layout_file(path)``, ``read_layout_file(…, data=path)``) before a save of it landed
    (:class:`~pskd_jax.format.layout_file.OtherVersion`) is looked up again and the new pair read
    whole, as a restore does (E9005 when saves overtake it
    :data:`~pskd_jax.format.one_save.ATTEMPTS` times running); one not looked up is refused. The
    caller closes the reader."""
    if not isinstance(layout, LayoutFile):
        return Reader(path, layout=layout, access="pread"), None
    current: list[LayoutFile | None] = [layout]

    def attempt() -> tuple[bool, tuple[Reader, list[sd.Form | None] | None] | None]:
        found = current[0]
        if found is None:  # (looked up again: none stands beside the data now)
            return True, (Reader(path, access="pread"), None)
        try:
            return True, _opened_through(path, found)
        except OtherVersion as e:
            current[0] = layout_after(e, found)  # (a layout given as it is: refused)
            return False, None

    opened = until_one_save(path, attempt, reading="its layout file was looked up and its data read",
                            again="read it again")
    assert opened is not None  # (an attempt that is done has its reader)
    return opened


def _opened_through(path: str, layout: LayoutFile) -> tuple[Reader, list[sd.Form | None]]:
    """A reader of ``path`` through the layout file ``layout``, proven against the file it opened."""
    reader = Reader(path, access="pread")
    try:
        reader.check_layout(layout)
        reader.with_layout(layout.layout)
    except BaseException:
        reader.close()
        raise
    return reader, list(layout.forms) or [None] * len(layout.layout.leaves)


def _dumps(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a key that is no UTF-8 text (a surrogate-escaped file name): escaped
        return json.dumps(value, ensure_ascii=True, allow_nan=False).encode("utf-8")


def export_json(path: str, output: str, *, layout: Any = None) -> int:
    """Writes the samples of ``path`` as JSON to ``output``; returns the number of samples.

    ``{"type": …, "version": …, "encodings": […], "count": n, "samples": […]}``: tensors as
    nested lists, tuples as lists, parameter trees as objects. Every real is the shortest decimal
    that reads back to the stored value (Python's float repr), so a reader in f64 gets the exact
    number; a non-finite real is a string (docs/export.md gives the convention).

    ``output`` ``-`` writes the standard output (once the JSON is complete). The file is read with
    positional reads (a file cut short meanwhile is E9003, the output left as it was), a chunk of
    at most :data:`CHUNK_ELEMENTS` elements at a time, a sample larger than that leaf by leaf and
    row by row: memory stays bounded whatever the sizes. A count of samples that hold no data
    beyond :data:`MAX_EMPTY_SAMPLES` is refused (E9003): the header claims them, no byte backs them.

    ``layout`` reads a ``params`` file: a :class:`LayoutFile` (which must belong to the file: E9005
    naming both otherwise; its leaves' values are then shown as docs/export.md says), a
    :class:`Layout` or a template (the stored values).
    """
    try:
        return _export(path, output, layout)
    except MismatchError as e:
        own = isinstance(layout, LayoutFile) and layout.path and e.message.startswith(layout.path)
        if e.message.startswith(path) or own:  # (a layout file refused names both files already)
            raise
        raise MismatchError(f"{path}: {e.message}") from None


def _export(path: str, output: str, layout: Any) -> int:
    reader, forms = open_with_layout(path, layout)
    with reader:
        placement = reader.placement
        if placement is None:
            reader.sample_bytes  # noqa: B018  (raises E9001 naming what is missing)
        assert placement is not None
        count = len(reader)
        if placement.sample_bytes == 0 and count > MAX_EMPTY_SAMPLES:
            raise TruncatedError(f"{path}: {count} samples of type {reader.header.type_text!r}, which hold no data: "
                                 f"the header claims them with no byte behind them; export writes at most "
                                 f"{MAX_EMPTY_SAMPLES} such samples")
        head = {
            "type": reader.header.type_text,
            "version": reader.header.version,
            "encodings": list(placement.labels),
            "count": count,
        }
        with whole_output(output) as f:
            f.write(_dumps(head)[:-1])
            f.write(b', "samples": [')
            for k, run in enumerate(_sample_runs(reader, ShownLeaves(reader, forms))):
                if k:
                    f.write(b", ")
                if isinstance(run, bytes):
                    f.write(run)
                else:
                    for piece in run:
                        f.write(piece)
            f.write(b"]}\n")
        return count


class ShownLeaves:
    """Each leaf of a reader's samples as :func:`shown_values` shows it (as stored where no layout
    file gave its form)."""

    def __init__(self, reader: Reader, forms: list[sd.Form | None] | None):
        placement = reader.placement
        assert placement is not None  # (shown only by a reader that has its layout)
        self.reader, self.placement = reader, placement
        self.forms = forms or [None] * len(placement.layout.leaves)

    def leaf(self, i: int, stored: np.ndarray, *, batched: bool = False) -> Any:
        form = self.forms[i]
        if form is None:
            return stored
        placement = self.placement
        leaf = placement.layout.leaves[i]
        where = f"{self.reader.path}: at {leaf.path or '(root)'}"
        shown = shown_values(stored, form, where, bound=leaf.bound,
                             stored_encoding=placement.encodings[i] if leaf.is_real else None, batched=batched)
        for value in (shown if isinstance(shown, list) else [shown]):
            _check_decimal(value, where)
        return shown

    def whole(self, i: int) -> bool:
        """Whether leaf i is read whole, never in blocks (a Python scalar: its limbs make one value)."""
        form = self.forms[i]
        return form is not None and form.kind == sd.KIND_PYTHON


MAX_DECIMAL_BITS = 10000  # a Python int wider than this is checked to have a decimal text


def _check_decimal(value: Any, where: str) -> None:
    """Refuses (E9004) a Python int too long for Python's decimal text (beyond
    ``sys.get_int_max_str_digits()``): JSON and info write integers in decimal."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_DECIMAL_BITS:
        try:
            str(value)
        except ValueError:
            raise BadValueError(f"{where}: a Python int of {value.bit_length()} bits, more digits than Python "
                                "writes in decimal") from None


def _sample_runs(reader: Reader, shown: ShownLeaves) -> Iterator[bytes | Iterator[bytes]]:
    """The samples' JSON, a run of consecutive samples at a time: the bytes of a chunk of samples
    (separated by ", "), or an iterator of the pieces of one sample larger than a chunk (read leaf
    by leaf, row by row)."""
    layout = shown.placement.layout
    count = len(reader)
    per_sample = layout.sample_elements
    if per_sample == 0:
        if count:
            one = _dumps(plain(reader[0]))  # every sample is the same empty structure
            block = b", ".join([one] * min(count, 1 << 16))
            whole, rest = divmod(count, 1 << 16)
            yield from (block for _ in range(whole))
            if rest:
                yield b", ".join([one] * rest)
        return
    if per_sample > CHUNK_ELEMENTS:
        for k in range(count):
            yield _large_sample(reader, k, shown)
        return
    step = max(1, CHUNK_ELEMENTS // per_sample)
    for start in range(0, count, step):
        # gathered, not viewed: idx values are checked against their bound (E9004)
        chunk = reader.gather_leaves(np.arange(start, min(start + step, count)))
        columns = [plain(shown.leaf(i, leaf, batched=True)) for i, leaf in enumerate(chunk)]
        yield b", ".join(_dumps(plain(layout.unflatten(list(row)))) for row in zip(*columns))


_MARK = "\ue000pskd-leaf-{}\ue001"


def _large_sample(reader: Reader, k: int, shown: ShownLeaves) -> Iterator[bytes]:
    """Sample ``k``'s JSON in pieces: its structure with each leaf written in place, a large leaf
    a block of rows at a time (positional reads of those rows alone)."""
    layout = shown.placement.layout
    skeleton = _dumps(plain(layout.unflatten([_MARK.format(i) for i in range(len(layout.leaves))]))).decode("utf-8")
    for i in range(len(layout.leaves)):
        mark = json.dumps(_MARK.format(i), ensure_ascii=False)
        if mark not in skeleton:  # (a skeleton written escaped: a key that is no UTF-8 text)
            mark = json.dumps(_MARK.format(i))
        before, after = skeleton.split(mark, 1)
        yield before.encode("utf-8")
        yield from _leaf_text(reader, k, i, shown)
        skeleton = after
    yield skeleton.encode("utf-8")


def _leaf_text(reader: Reader, k: int, i: int, shown: ShownLeaves) -> Iterator[bytes]:
    """Leaf ``i`` of sample ``k`` as nested JSON lists, read a block of innermost rows at a time."""
    leaf = shown.placement.layout.leaves[i]
    shape = leaf.shape
    if leaf.size <= CHUNK_ELEMENTS or not shape or shown.whole(i):
        yield _dumps(plain(shown.leaf(i, reader.leaf_range(k, i, 0, leaf.size).reshape(shape))))
        return
    if len(shape) == 1:  # one row: its elements a block at a time
        yield b"["
        for first in range(0, leaf.size, CHUNK_ELEMENTS):
            values = plain(shown.leaf(i, reader.leaf_range(k, i, first, first + CHUNK_ELEMENTS)))
            yield ((", " if first else "") + json.dumps(values, allow_nan=False)[1:-1]).encode("utf-8")
        yield b"]"
        return
    width = shape[-1]
    rows = leaf.size // width
    outer = shape[:-1]
    # spans[j]: how many innermost rows one step of outer axis j covers; its list opens before a
    # row r with r % spans[j] == 0 and closes after one with (r + 1) % spans[j] == 0. The outermost
    # list (all the rows) is written around the blocks.
    spans = [int(np.prod(outer[j:], dtype=object)) for j in range(1, len(outer))]
    per_block = max(1, CHUNK_ELEMENTS // width)
    yield b"["
    for first in range(0, rows, per_block):
        last = min(first + per_block, rows)
        values = shown.leaf(i, reader.leaf_range(k, i, first * width, last * width).reshape(last - first, width))
        pieces = []
        for r, row in zip(range(first, last), plain(values)):
            opening = sum(1 for s in spans if r % s == 0)
            closing = sum(1 for s in spans if (r + 1) % s == 0)
            pieces.append(("" if r == 0 else ", ") + "[" * opening + json.dumps(row, allow_nan=False)
                          + "]" * closing)
        yield "".join(pieces).encode("utf-8")
    yield b"]"


__all__ = [
    "CHUNK_ELEMENTS",
    "MAX_DECIMAL_BITS",
    "MAX_EMPTY_SAMPLES",
    "ShownLeaves",
    "export_json",
    "non_finite_text",
    "open_with_layout",
    "plain",
    "shown_values",
]
