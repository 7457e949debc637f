"""``diff``: the distance between the real leaves of two files.

Which files compare, how leaves pair (in order, or by key path for checkpoints), how non-finite
values count and how the sum is scaled so that nothing overflows are defined in
``docs/reference-rules.md`` ("Comparing"). Each file is opened once, never mapped, and read with
positional reads of that one descriptor (:meth:`Reader.read_data`), in blocks of whole samples or
in chunks inside a sample larger than a block, so memory stays bounded whatever the sample size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pskd_jax.errors import MismatchError, NotClosedError
from pskd_jax.format.encodings import REAL_DISK_DTYPES, REAL_DTYPES, Encoding
from pskd_jax.format.layout import Layout
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader
from pskd_jax.format.sample_type import ParamsType, parse_type

__all__ = ["BLOCK_BYTES", "CHUNK_ELEMENTS", "Distance", "diff"]

CHUNK_ELEMENTS = 1 << 20  # values converted to f64 at a time, per file
BLOCK_BYTES = 1 << 23  # bytes read at a time from each file when samples are read whole


@dataclasses.dataclass(frozen=True)
class Distance:
    """‖a − b‖₂ and ‖a‖₂ over the real leaves two files share, and ``relative`` = their ratio.

    ``relative`` is computed from the scaled sums, so it is right even where a norm is beyond
    the largest f64 (and printed as ``inf``). ``only_a`` and ``only_b`` name the leaves (key
    paths) found in one file only; ``notes`` state non-finite values and where they first are.
    """

    diff_norm: float
    a_norm: float
    elements: int
    without_layout: bool = False
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    relative: float | None = None

    def __post_init__(self) -> None:
        if self.relative is None:
            object.__setattr__(self, "relative", _ratio(self.diff_norm, self.a_norm))


def _ratio(diff_norm: float, a_norm: float) -> float:
    if math.isnan(diff_norm) or math.isnan(a_norm):
        return math.nan
    if a_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    if math.isinf(a_norm):
        return math.nan if math.isinf(diff_norm) else 0.0
    return diff_norm / a_norm


# --- the scaled 2-norm ----------------------------------------------------------------------


class _Norm:
    """A 2-norm accumulated chunk by chunk as ``2^exponent · sqrt(ssq)``: chunks come scaled by a
    power of two (exact), so neither a square nor a difference overflows, and the norm itself
    may lie beyond the f64 range."""

    def __init__(self) -> None:
        self.exponent = 0
        self.ssq = 0.0
        self.nan = False
        self.inf = False

    def add(self, scaled: np.ndarray, exponent: int) -> None:
        """Adds values given as ``scaled · 2^exponent`` (every ``|scaled| <= 2``)."""
        s = float(np.dot(scaled, scaled))
        if s == 0.0:
            return
        if self.ssq == 0.0 or exponent > self.exponent:
            self.ssq = math.ldexp(self.ssq, 2 * (self.exponent - exponent)) + s if self.ssq else s
            self.exponent = exponent
        else:
            self.ssq += math.ldexp(s, 2 * (exponent - self.exponent))

    @property
    def value(self) -> float:
        if self.nan:
            return math.nan
        if self.inf:
            return math.inf
        try:
            return math.ldexp(math.sqrt(self.ssq), self.exponent)
        except OverflowError:  # the norm is beyond the largest f64
            return math.inf

    def ratio(self, other: _Norm) -> float:
        """self / other, from the scaled sums (right where either is beyond the f64 range)."""
        if self.nan or other.nan or self.inf or other.inf or other.ssq == 0.0:
            return _ratio(self.value, other.value)
        try:
            return math.ldexp(math.sqrt(self.ssq / other.ssq), self.exponent - other.exponent)
        except OverflowError:
            return math.inf


def _scale_exponent(largest: float) -> int:
    """e with ``largest < 2^e``: values times 2^-e then lie in (-1, 1)."""
    return math.frexp(largest)[1]


def _scaled(values: np.ndarray, exponent: int) -> np.ndarray:
    """``values · 2^-exponent``, exactly (a multiplication by a power of two while it is normal)."""
    if -1000 < exponent < 1000:
        return values * math.ldexp(1.0, -exponent)
    return np.ldexp(values, -exponent)


class _Accumulator:
    """‖a − b‖₂ and ‖a‖₂ over pairs of f64 chunks, with the non-finite rule and its notes."""

    def __init__(self) -> None:
        self.diff = _Norm()
        self.a = _Norm()
        self.elements = 0
        self.notes: dict[str, str] = {}  # kind → the first place it was seen

    def add(self, a: np.ndarray, b: np.ndarray, where: Callable[[int], str]) -> None:
        """One chunk of a's values and b's at the same places; ``where(k)`` names place k."""
        self.elements += a.size
        if a.size == 0:
            return
        finite_a, finite_b = np.isfinite(a), np.isfinite(b)
        if finite_a.all() and finite_b.all():
            self._add_finite(a, b)
            return
        self._note_non_finite(a, b, finite_a, finite_b, where)
        both = finite_a & finite_b
        self._add_finite(a[both], b[both], a[finite_a])

    def _add_finite(self, a: np.ndarray, b: np.ndarray, a_alone: np.ndarray | None = None) -> None:
        """Finite pairs, and a's finite values when they are more than its paired ones.

        Each norm is scaled by its own largest value: a's by a's, a − b's by the larger of a's and
        b's. A common scale would flush a's values to zero when b's are some 2^1000 larger
        ([1e-281] against [-1e308]: ‖a‖₂ would come out 0)."""
        largest_a = _largest(a if a_alone is None else a_alone)
        largest = max(_largest(a), _largest(b))
        if largest != 0.0:
            exponent = _scale_exponent(largest)
            self.diff.add(_scaled(a, exponent) - _scaled(b, exponent), exponent)
        if largest_a != 0.0:
            exponent = _scale_exponent(largest_a)
            self.a.add(_scaled(a if a_alone is None else a_alone, exponent), exponent)

    def _note_non_finite(self, a: np.ndarray, b: np.ndarray, finite_a: np.ndarray, finite_b: np.ndarray,
                         where: Callable[[int], str]) -> None:
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if nan_a.any() or nan_b.any():
            self.diff.nan = True
            for name, mask in (("a", nan_a), ("b", nan_b)):
                if mask.any():
                    self._note(f"nan {name}", f"{name} holds NaN, so ‖a − b‖₂ is nan ({where(int(np.argmax(mask)))})")
        if nan_a.any():
            self.a.nan = True
        infinite_a = ~finite_a & ~nan_a
        if infinite_a.any():
            self.a.inf = True
            k = int(np.argmax(infinite_a))
            self._note("inf a", f"a holds {float(a[k])!r}, so ‖a‖₂ is inf ({where(k)})")
        # An infinity against a different value (a finite one, or the other infinity): a − b is
        # infinite. The same infinity on both sides differs by nothing.
        unequal = (infinite_a | (~finite_b & ~nan_b)) & ~nan_a & ~nan_b & (a != b)
        if unequal.any():
            self.diff.inf = True
            k = int(np.argmax(unequal))
            self._note("inf", f"a holds {float(a[k])!r} where b holds {float(b[k])!r}, so ‖a − b‖₂ is inf ({where(k)})")

    def _note(self, kind: str, text: str) -> None:
        self.notes.setdefault(kind, text)

    def distance(self, **extra: Any) -> Distance:
        notes = list(self.notes.values())
        if not (self.diff.nan or self.diff.inf) and math.isinf(self.diff.value):
            notes.append("‖a − b‖₂ is beyond the largest f64 (relative is exact)")
        return Distance(self.diff.value, self.a.value, self.elements, notes=tuple(notes),
                        relative=self.diff.ratio(self.a), **extra)


def _largest(values: np.ndarray) -> float:
    return float(np.max(np.abs(values))) if values.size else 0.0


# --- pairing the leaves -----------------------------------------------------------------------


def diff(path_a: str, path_b: str, *, layout: Any = None, layout_a: Any = None, layout_b: Any = None) -> Distance:
    """The distance between the real leaves of two files of one type structure and count.

    ``layout`` reads both files (a ``params`` file needs one); ``layout_a`` and ``layout_b`` give
    each file its own, so that two checkpoints pair their leaves by key path through their own
    layouts. Two ``params`` files without a layout compare as flat vectors when every leaf has one
    encoding. Different structures, counts, or a shared key path of another shape are E9005.
    """
    layout_a = layout if layout_a is None else layout_a
    layout_b = layout if layout_b is None else layout_b
    with Reader(path_a, layout=layout_a, access="pread") as a, Reader(path_b, layout=layout_b, access="pread") as b:
        _check_types(a, b)
        if len(a) != len(b):
            raise MismatchError(f"{a.path} has {len(a)} samples, {b.path} has {len(b)}")
        if a.placement is None and b.placement is None:
            return _diff_flat(a, b)
        if a.placement is None or b.placement is None:
            # Never read one file with the other's layout by default: the same leaves may lie in
            # another order, and the distance would be wrong without a word.
            missing, other = (a, b) if a.placement is None else (b, a)
            raise NotClosedError(f"{missing.path}: type {missing.header.type_text!r} needs its own layout to be "
                                 f"compared with {other.path}, which has one (the NAME.layout.json beside it)")
        pairs, only_a, only_b = _pair_leaves(a, b)
        with _DataFile(a) as file_a, _DataFile(b) as file_b:
            total = _Accumulator()
            for chunk_a, chunk_b, where in _chunk_pairs(file_a, file_b, pairs, len(a)):
                total.add(chunk_a, chunk_b, where)
        return total.distance(only_a=only_a, only_b=only_b)


def _check_types(a: Reader, b: Reader) -> None:
    """Refuses (E9005) two types of different structure; axis names and spacing do not count."""
    type_a, type_b = parse_type(a.header.type_text), parse_type(b.header.type_text)
    if isinstance(type_a, ParamsType) and isinstance(type_b, ParamsType):
        same = type_a.name == type_b.name
    elif isinstance(type_a, ParamsType) or isinstance(type_b, ParamsType):
        same = False
    else:
        same = Layout.of_type(type_a) == Layout.of_type(type_b)
    if not same:
        raise MismatchError(f"{a.path} holds {a.header.type_text!r}, {b.path} holds {b.header.type_text!r}: the types "
                            "differ in structure (axis names aside)")


def _pair_leaves(a: Reader, b: Reader) -> tuple[list[tuple[int, int]], tuple[str, ...], tuple[str, ...]]:
    """The real leaves to compare as (leaf of a, leaf of b), and the key paths in one file only.

    Closed types pair leaves in order (their paths are positions); ``params`` files by key path.
    """
    placement_a, placement_b = a.placement, b.placement
    assert placement_a is not None and placement_b is not None  # (leaves are paired when both have a layout)
    leaves_a, leaves_b = placement_a.layout.leaves, placement_b.layout.leaves
    if not a.header.is_params:
        return [(i, i) for i, leaf in enumerate(leaves_a) if leaf.is_real], (), ()
    by_path = {leaf.path: j for j, leaf in enumerate(leaves_b)}
    pairs = []
    for i, leaf in enumerate(leaves_a):
        j = by_path.get(leaf.path)
        if j is None:
            continue
        other = leaves_b[j]
        if (leaf.shape, leaf.is_real) != (other.shape, other.is_real):
            raise MismatchError(f"leaf {leaf.path or '(root)'}: {_describe(leaf)} in {a.path}, {_describe(other)} in "
                                f"{b.path}")
        if leaf.is_real:
            pairs.append((i, j))
    paths_a = {leaf.path for leaf in leaves_a}
    only_a = tuple(leaf.path for leaf in leaves_a if leaf.path not in by_path)
    only_b = tuple(leaf.path for leaf in leaves_b if leaf.path not in paths_a)
    return pairs, only_a, only_b


def _describe(leaf) -> str:
    kind = "ℝ" if leaf.is_real else f"idx[{leaf.bound}]"
    return f"{kind}{list(leaf.shape)}"


# --- reading ------------------------------------------------------------------------------------


class _DataFile:
    """A file's samples read with positional reads of its reader's descriptor (the file whose
    header was read, whatever its name leads to now): its placement and its data region."""

    def __init__(self, reader: Reader):
        self.path = reader.path
        self.reader = reader
        self.placement: Placement | None = reader.placement

    @property
    def placed(self) -> Placement:
        """The placement of a file read through its layout (every reading but the flat comparison's)."""
        assert self.placement is not None
        return self.placement

    def read(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes of the data region from ``offset`` (E9003 when the file ends first)."""
        return self.reader.read_data(offset, offset + size)

    def values(self, raw: np.ndarray, i: int) -> np.ndarray:
        """Raw bytes of leaf ``i``'s elements (whole elements) as f64."""
        placement = self.placed
        values = raw.view(placement.disk_dtypes[i])
        if placement.value_dtype(i) != placement.disk_dtypes[i]:
            values = values.view(placement.value_dtype(i))  # bf16 is stored as its u2 bits
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a NaN: the NaN rule, not a warning
            return values.astype(np.float64)

    def __enter__(self) -> _DataFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass  # (the reader owns the descriptor)


ChunkPair = tuple[np.ndarray, np.ndarray, Callable[[int], str]]


def _chunk_pairs(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int) -> Iterator[ChunkPair]:
    """The paired leaves' values as f64 chunks of both files, in one order: by blocks of whole
    samples when a sample fits a block, else sample by sample in chunks inside each leaf."""
    if not pairs or count == 0:
        return
    elements = sum(a.placed.layout.leaves[i].size for i, _ in pairs)
    if elements == 0:  # no real element in any sample: nothing to read however many samples
        return
    largest = max(a.placed.sample_bytes, b.placed.sample_bytes)
    if largest <= BLOCK_BYTES:
        yield from _by_blocks(a, b, pairs, count, max(1, BLOCK_BYTES // largest))
    else:
        yield from _inside_samples(a, b, pairs, count)


def _by_blocks(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int,
               per_block: int) -> Iterator[ChunkPair]:
    size_a, size_b = a.placed.sample_bytes, b.placed.sample_bytes
    for first in range(0, count, per_block):
        n = min(per_block, count - first)
        rows_a = a.read(first * size_a, n * size_a).reshape(n, size_a)
        rows_b = b.read(first * size_b, n * size_b).reshape(n, size_b)
        for i, j in pairs:
            leaf = a.placed.layout.leaves[i]
            if leaf.size == 0:
                continue
            yield (a.values(_leaf_columns(a, rows_a, i), i).reshape(-1),
                   b.values(_leaf_columns(b, rows_b, j), j).reshape(-1),
                   _place_namer(leaf.path, leaf.size, first, 0))


def _leaf_columns(file: _DataFile, rows: np.ndarray, i: int) -> np.ndarray:
    """Leaf ``i``'s bytes in each row of whole samples, contiguous."""
    placement = file.placed
    start = placement.offsets[i]
    width = placement.layout.leaves[i].size * placement.disk_dtypes[i].itemsize
    return np.ascontiguousarray(rows[:, start : start + width])


def _inside_samples(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int) -> Iterator[ChunkPair]:
    for sample in range(count):
        for i, j in pairs:
            leaf = a.placed.layout.leaves[i]
            for lo in range(0, leaf.size, CHUNK_ELEMENTS):
                hi = min(lo + CHUNK_ELEMENTS, leaf.size)
                yield (a.values(_leaf_span(a, sample, i, lo, hi), i), b.values(_leaf_span(b, sample, j, lo, hi), j),
                       _place_namer(leaf.path, leaf.size, sample, lo))


def _leaf_span(file: _DataFile, sample: int, i: int, lo: int, hi: int) -> np.ndarray:
    """The bytes of elements ``lo .. hi - 1`` of leaf ``i`` of one sample."""
    placement = file.placed
    item = placement.disk_dtypes[i].itemsize
    offset = sample * placement.sample_bytes + placement.offsets[i] + lo * item
    return file.read(offset, (hi - lo) * item)


def _element_namer(first: int) -> Callable[[int], str]:
    """Names value k of a chunk of the data as one vector, the chunk starting at element ``first``."""
    return lambda k: f"element {first + k} of the data"


def _place_namer(path: str, size: int, first_sample: int, first_element: int) -> Callable[[int], str]:
    """Names value k of a chunk that starts at ``first_element`` of sample ``first_sample``."""
    def where(k: int) -> str:
        sample, element = divmod(first_element + k, size)
        return f"leaf {path or '(root)'}, sample {first_sample + sample}, element {element}"
    return where


# --- without a layout ---------------------------------------------------------------------------


def _diff_flat(a: Reader, b: Reader) -> Distance:
    """Two ``params`` files without their layouts: the data as one vector, when every leaf of
    both has one encoding (the only way to know where the reals are without the layout)."""
    encodings = a.header.encodings
    if encodings != b.header.encodings:
        raise MismatchError(f"{a.path} and {b.path}: the leaf encodings differ")
    kinds = set(encodings) if encodings is not None else {Encoding.F64}
    if len(kinds) != 1:
        raise MismatchError(f"{a.path}: its leaves have several encodings; supply the layout to compare them")
    encoding = kinds.pop()
    disk, value = REAL_DISK_DTYPES[encoding], REAL_DTYPES[encoding]
    sizes = [r.file_size - r.header.data_offset for r in (a, b)]
    if sizes[0] != sizes[1] or sizes[0] % disk.itemsize:
        raise MismatchError(f"{a.path} and {b.path}: data of {sizes[0]} and {sizes[1]} bytes")
    total = _Accumulator()
    step = CHUNK_ELEMENTS * disk.itemsize
    with _DataFile(a) as file_a, _DataFile(b) as file_b:
        for start in range(0, sizes[0], step):
            size = min(step, sizes[0] - start)
            with np.errstate(invalid="ignore"):  # (a signalling NaN widens to a NaN)
                chunk_a, chunk_b = [f.read(start, size).view(disk).view(value).astype(np.float64)
                                    for f in (file_a, file_b)]
            total.add(chunk_a, chunk_b, _element_namer(start // disk.itemsize))
    return total.distance(without_layout=True)
