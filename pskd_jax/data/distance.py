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

from pskd_jax.data.export import open_with_layout, plain
from pskd_jax.errors import BadValueError, MismatchError, NotClosedError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.encodings import REAL_DISK_DTYPES, REAL_DTYPES, Encoding
from pskd_jax.format.layout import Layout
from pskd_jax.format.placement import Placement
from pskd_jax.format.reader import Reader
from pskd_jax.format.sample_type import ParamsType, parse_type
from pskd_jax.format.stored_dtypes import shown_values

__all__ = ["BLOCK_BYTES", "CHUNK_ELEMENTS", "Distance", "Exact", "diff"]

CHUNK_ELEMENTS = 1 << 20  # values converted to f64 at a time, per file
BLOCK_BYTES = 1 << 23  # bytes read at a time from each file when samples are read whole


@dataclasses.dataclass(frozen=True)
class Exact:
    """The idx leaves two files share (integers, bools, key data, the bit patterns of narrow
    floats), compared exactly, element by stored element: ``elements`` compared, ``differing`` of
    them unequal, ``first`` naming the first such element and both values (as a restore gives them
    back), and ``not_compared`` the leaves paired by key path but stored differently in the two
    files (another idx bound or dtype: their patterns mean other values), each with why."""

    elements: int = 0
    differing: int = 0
    first: str | None = None
    not_compared: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Distance:
    """‖a − b‖₂ and ‖a‖₂ over the real leaves two files share, and ``relative`` = their ratio;
    ``exact``: their idx leaves compared exactly (:class:`Exact`).

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
    exact: Exact = Exact()

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
    """The distance between the real leaves of two files of one type structure and count, and
    their idx leaves compared exactly (:class:`Exact`).

    ``layout`` reads both files (a ``params`` file needs one); ``layout_a`` and ``layout_b`` give
    each file its own, so that two checkpoints pair their leaves by key path through their own
    layouts. A layout file (:class:`LayoutFile`, which must belong to its file: E9005 otherwise)
    also says what each idx leaf's elements stand for, so that the first difference shows values
    as a restore gives them back (an int8 −3 as −3) and leaves of one key path but another dtype
    are named as not compared. Two ``params`` files without a layout compare as flat vectors when
    every leaf has one encoding. Different structures, counts, or a shared key path of another
    shape are E9005.
    """
    a, forms_a = open_with_layout(path_a, layout if layout_a is None else layout_a)
    with a:
        b, forms_b = open_with_layout(path_b, layout if layout_b is None else layout_b)
        with b:
            return _distance_of(a, b, forms_a, forms_b)


def _distance_of(a: Reader, b: Reader, forms_a: list[sd.Form | None] | None,
                 forms_b: list[sd.Form | None] | None) -> Distance:
    """:func:`diff` of two open readers (each through its layout, and its leaves' forms)."""
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
    file_a, file_b = _DataFile(a, forms_a), _DataFile(b, forms_b)
    pairing = _pair_leaves(file_a, file_b)
    total, exact = _Accumulator(), _ExactCount(file_a, file_b)
    for chunk in _chunk_pairs(file_a, file_b, pairing.pairs, len(a)):
        if file_a.is_real(chunk.i):
            total.add(file_a.values(chunk.raw_a, chunk.i), file_b.values(chunk.raw_b, chunk.j), chunk.where)
        else:
            exact.add(chunk)
    return total.distance(only_a=pairing.only_a, only_b=pairing.only_b,
                          exact=exact.result(pairing.not_compared))


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


@dataclasses.dataclass(frozen=True)
class _Pairing:
    """The leaves to compare as (leaf of a, leaf of b), the key paths in one file only, and the
    paired idx leaves left uncompared (each named with why)."""

    pairs: list[tuple[int, int]]
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    not_compared: tuple[str, ...] = ()


def _pair_leaves(a: _DataFile, b: _DataFile) -> _Pairing:
    """Closed types pair leaves in order (their paths are positions); ``params`` files by key path.
    Real leaves pair with real leaves (their values are compared whatever the encodings), idx
    leaves with idx leaves of the same bound and dtype, whose stored patterns mean the same values."""
    leaves_a, leaves_b = a.placed.layout.leaves, b.placed.layout.leaves
    if not a.reader.header.is_params:
        return _Pairing(*_comparable([(i, i) for i in range(len(leaves_a))], a, b))
    by_path = {leaf.path: j for j, leaf in enumerate(leaves_b)}
    paired = []
    for i, leaf in enumerate(leaves_a):
        j = by_path.get(leaf.path)
        if j is None:
            continue
        other = leaves_b[j]
        if (leaf.shape, leaf.is_real) != (other.shape, other.is_real):
            raise MismatchError(f"leaf {leaf.path or '(root)'}: {_describe(leaf)} in {a.path}, {_describe(other)} in "
                                f"{b.path}")
        paired.append((i, j))
    paths_a = {leaf.path for leaf in leaves_a}
    only_a = tuple(leaf.path for leaf in leaves_a if leaf.path not in by_path)
    only_b = tuple(leaf.path for leaf in leaves_b if leaf.path not in paths_a)
    pairs, not_compared = _comparable(paired, a, b)
    return _Pairing(pairs, only_a, only_b, not_compared)


def _comparable(paired: list[tuple[int, int]], a: _DataFile, b: _DataFile) -> tuple[list[tuple[int, int]],
                                                                                      tuple[str, ...]]:
    """The pairs that can be compared, and why each other one cannot: two idx leaves of other
    bounds, or of other dtypes by their layout files (uint8 and int8 both store idx[256])."""
    pairs, not_compared = [], []
    for i, j in paired:
        leaf, other = a.placed.layout.leaves[i], b.placed.layout.leaves[j]
        name_a, name_b = a.dtype_name(i), b.dtype_name(j)
        if leaf.is_real or (leaf.bound == other.bound and name_a == name_b):
            pairs.append((i, j))
        else:
            if name_a == name_b:  # (a Python int of another width: its dtype name says nothing more)
                name_a, name_b = f"{name_a} as {_describe(leaf)}", f"{name_b} as {_describe(other)}"
            not_compared.append(f"{leaf.path or '(root)'} ({name_a} in a, {name_b} in b)")
    return pairs, tuple(not_compared)


def _describe(leaf) -> str:
    kind = "ℝ" if leaf.is_real else f"idx[{leaf.bound}]"
    return f"{kind}{list(leaf.shape)}"


# --- reading ------------------------------------------------------------------------------------


class _DataFile:
    """A file's samples read with positional reads of its reader's descriptor (the file whose
    header was read, whatever its name leads to now): its placement, its data region, and each
    leaf's form when a layout file gave them (None: the stored values are the values)."""

    def __init__(self, reader: Reader, forms: list[sd.Form | None] | None = None):
        self.path = reader.path
        self.reader = reader
        self.placement: Placement | None = reader.placement
        self.forms = forms

    @property
    def placed(self) -> Placement:
        """The placement of a file read through its layout (every reading but the flat comparison's)."""
        assert self.placement is not None
        return self.placement

    def is_real(self, i: int) -> bool:
        return self.placed.layout.leaves[i].is_real

    def form(self, i: int) -> sd.Form | None:
        return self.forms[i] if self.forms is not None else None

    def dtype_name(self, i: int) -> str:
        """What leaf ``i``'s elements are: its dtype by the layout file, else its stored type."""
        form = self.form(i)
        leaf = self.placed.layout.leaves[i]
        if form is not None:
            return form.dtype
        return "ℝ" if leaf.is_real else f"idx[{leaf.bound}]"

    def read(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes of the data region from ``offset`` (E9003 when the file ends first)."""
        return self.reader.read_data(offset, offset + size)

    def values(self, raw: np.ndarray, i: int) -> np.ndarray:
        """Raw bytes of real leaf ``i``'s elements (whole elements) as f64."""
        placement = self.placed
        values = raw.view(placement.disk_dtypes[i])
        if placement.value_dtype(i) != placement.disk_dtypes[i]:
            values = values.view(placement.value_dtype(i))  # bf16 is stored as its u2 bits
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a NaN: the NaN rule, not a warning
            return values.astype(np.float64)

    def stored(self, raw: np.ndarray, i: int) -> np.ndarray:
        """Raw bytes of idx leaf ``i``'s elements as the unsigned integers stored."""
        return raw.view(self.placed.disk_dtypes[i])

    def shown(self, sample: int, i: int, element: int) -> str:
        """Element ``element`` of leaf ``i`` of one sample as a restore gives it back (info's text of
        it): read on its own, or the whole leaf for a Python scalar (whose limbs make one value)."""
        form, leaf = self.form(i), self.placed.layout.leaves[i]
        where = f"{self.path}: at {leaf.path or '(root)'}, sample {sample}"
        if form is not None and form.kind == sd.KIND_PYTHON:
            stored = self.reader.leaf_range(sample, i, 0, leaf.size).reshape(leaf.shape)
            return _value_text(plain(shown_values(stored, form, where, bound=leaf.bound)))
        stored = self.reader.leaf_range(sample, i, element, element + 1)
        if form is not None and form.kind == sd.KIND_BITS:
            return _value_text(plain(shown_values(stored, form, where, bound=leaf.bound))[0])
        if form is not None and form.dtype == "bool":
            return str(bool(stored[0]))
        return str(int(stored[0]))


def _value_text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """The same elements of a pair of leaves (``i`` of a, ``j`` of b) as raw bytes of each file,
    from element ``first_element`` of sample ``first_sample`` on (a block: whole samples)."""

    i: int
    j: int
    raw_a: np.ndarray
    raw_b: np.ndarray
    path: str
    size: int
    first_sample: int
    first_element: int

    def place(self, k: int) -> tuple[int, int]:
        """(sample, element) of element k of the chunk."""
        sample, element = divmod(self.first_element + k, self.size)
        return self.first_sample + sample, element

    def where(self, k: int) -> str:
        sample, element = self.place(k)
        return f"leaf {self.path or '(root)'}, sample {sample}, element {element}"


class _ExactCount:
    """The paired idx leaves compared exactly, chunk by chunk: equal stored patterns (of one bound
    and dtype) are equal values, for integers and bools; a narrow float's pattern is compared bit
    for bit (−0 differs from +0, a NaN equals the same NaN)."""

    def __init__(self, a: _DataFile, b: _DataFile) -> None:
        self.a, self.b = a, b
        self.elements = 0
        self.differing = 0
        self.first: str | None = None

    def add(self, chunk: _Chunk) -> None:
        stored_a, stored_b = self.a.stored(chunk.raw_a, chunk.i), self.b.stored(chunk.raw_b, chunk.j)
        for file, stored, i in ((self.a, stored_a, chunk.i), (self.b, stored_b, chunk.j)):
            _check_bound(file, stored, i, chunk)
        unequal = stored_a != stored_b
        self.elements += unequal.size
        count = int(np.count_nonzero(unequal))
        if count and self.first is None:
            k = int(np.argmax(unequal))
            sample, element = chunk.place(k)
            self.first = (f"{chunk.where(k)}: a holds {self.a.shown(sample, chunk.i, element)}, "
                          f"b holds {self.b.shown(sample, chunk.j, element)}")
        self.differing += count

    def result(self, not_compared: tuple[str, ...]) -> Exact:
        return Exact(self.elements, self.differing, self.first, not_compared)


def _check_bound(file: _DataFile, stored: np.ndarray, i: int, chunk: _Chunk) -> None:
    """Refuses (E9004) a stored value at or above its leaf's bound, as every reader does: a
    damaged file, which two equal copies of would otherwise compare as equal."""
    bound = file.placed.layout.leaves[i].bound
    bad = sd.out_of_bound(stored, bound)
    if bad is not None:
        raise BadValueError(f"{file.path}: {chunk.where(bad)}: stored value {int(stored[bad])} is not below its "
                            f"bound idx[{bound}]")


def _chunk_pairs(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int) -> Iterator[_Chunk]:
    """The paired leaves' bytes as chunks of both files, in one order: by blocks of whole samples
    when a sample fits a block, else sample by sample in chunks inside each leaf."""
    if not pairs or count == 0:
        return
    elements = sum(a.placed.layout.leaves[i].size for i, _ in pairs)
    if elements == 0:  # no element in any sample: nothing to read however many samples
        return
    largest = max(a.placed.sample_bytes, b.placed.sample_bytes)
    if largest <= BLOCK_BYTES:
        yield from _by_blocks(a, b, pairs, count, max(1, BLOCK_BYTES // largest))
    else:
        yield from _inside_samples(a, b, pairs, count)


def _by_blocks(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int,
               per_block: int) -> Iterator[_Chunk]:
    size_a, size_b = a.placed.sample_bytes, b.placed.sample_bytes
    for first in range(0, count, per_block):
        n = min(per_block, count - first)
        rows_a = a.read(first * size_a, n * size_a).reshape(n, size_a)
        rows_b = b.read(first * size_b, n * size_b).reshape(n, size_b)
        for i, j in pairs:
            leaf = a.placed.layout.leaves[i]
            if leaf.size == 0:
                continue
            yield _Chunk(i, j, _leaf_columns(a, rows_a, i).reshape(-1), _leaf_columns(b, rows_b, j).reshape(-1),
                         leaf.path, leaf.size, first, 0)


def _leaf_columns(file: _DataFile, rows: np.ndarray, i: int) -> np.ndarray:
    """Leaf ``i``'s bytes in each row of whole samples, contiguous."""
    placement = file.placed
    start = placement.offsets[i]
    width = placement.layout.leaves[i].size * placement.disk_dtypes[i].itemsize
    return np.ascontiguousarray(rows[:, start : start + width])


def _inside_samples(a: _DataFile, b: _DataFile, pairs: Sequence[tuple[int, int]], count: int) -> Iterator[_Chunk]:
    for sample in range(count):
        for i, j in pairs:
            leaf = a.placed.layout.leaves[i]
            for lo in range(0, leaf.size, CHUNK_ELEMENTS):
                hi = min(lo + CHUNK_ELEMENTS, leaf.size)
                yield _Chunk(i, j, _leaf_span(a, sample, i, lo, hi), _leaf_span(b, sample, j, lo, hi),
                             leaf.path, leaf.size, sample, lo)


def _leaf_span(file: _DataFile, sample: int, i: int, lo: int, hi: int) -> np.ndarray:
    """The bytes of elements ``lo .. hi - 1`` of leaf ``i`` of one sample."""
    placement = file.placed
    item = placement.disk_dtypes[i].itemsize
    offset = sample * placement.sample_bytes + placement.offsets[i] + lo * item
    return file.read(offset, (hi - lo) * item)


def _element_namer(first: int) -> Callable[[int], str]:
    """Names value k of a chunk of the data as one vector, the chunk starting at element ``first``."""
    return lambda k: f"element {first + k} of the data"


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
    file_a, file_b = _DataFile(a), _DataFile(b)
    for start in range(0, sizes[0], step):
        size = min(step, sizes[0] - start)
        with np.errstate(invalid="ignore"):  # (a signalling NaN widens to a NaN)
            chunk_a, chunk_b = [f.read(start, size).view(disk).view(value).astype(np.float64)
                                for f in (file_a, file_b)]
        total.add(chunk_a, chunk_b, _element_namer(start // disk.itemsize))
    if encoding == Encoding.F64:
        # An idx leaf carries encoding byte 0 too: without the layout its bytes cannot be told
        # from f64 ones, and they were read as reals.
        total.notes["flat f64"] = ("without the layouts every leaf was read as f64; an idx leaf (an integer or "
                                   "bool, whose encoding byte is 0 too) would have been read as reals: supply the "
                                   "layouts for an exact comparison")
    return total.distance(without_layout=True)
