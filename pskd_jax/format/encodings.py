"""How leaves are stored, and the exactness rules for what may be stored.

A real leaf is f64, f32 or bf16, an index leaf the narrowest unsigned integer that holds its bound;
values are rounded once, correctly, to f64, narrowing is refused unless asked for (then reported),
and NaN, ±Inf and out-of-bound indices are refused. The rules: ``docs/exactness.md``; the
encodings: ``docs/format.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np

from pskd_jax.errors import BadValueError, MismatchError

# ml_dtypes (bfloat16, float8, int4 …) takes most of a second to import: it is imported where one
# of its dtypes is first needed, not with this module. Until someone imports it no value of its
# dtypes can exist, so a test for one of them answers False at no cost meanwhile.
_BFLOAT16: list[np.dtype] = []


def bfloat16_dtype() -> np.dtype:
    """ml_dtypes' bfloat16 as a numpy dtype (importing ml_dtypes the first time)."""
    if not _BFLOAT16:
        import ml_dtypes

        _BFLOAT16.append(np.dtype(ml_dtypes.bfloat16))
    return _BFLOAT16[0]


def ml_dtypes_imported() -> bool:
    """Whether ml_dtypes is imported (by this toolkit, JAX or the caller): before it is, no array,
    scalar or dtype of its types exists."""
    return "ml_dtypes" in sys.modules


def is_bfloat16(dtype: Any) -> bool:
    """``dtype == bfloat16``, without importing ml_dtypes when it is not imported yet (only the
    name ``"bfloat16"`` could equal it then)."""
    if not ml_dtypes_imported() and not (isinstance(dtype, str) and dtype == "bfloat16"):
        return False
    return bool(dtype == bfloat16_dtype())


K = TypeVar("K", bound=Hashable)


class LazyDtypes(Mapping[K, np.dtype]):
    """A read-only table of dtypes whose entries from ml_dtypes are made the first time one of
    them is looked up: ``fixed`` holds the others, ``lazy()`` returns the rest, whose keys are
    among ``lazy_keys``. Looking up a key of ``fixed``, or one outside ``lazy_keys``, imports
    nothing; ``items()`` leaves the lazy entries out while ml_dtypes is not imported (no dtype
    could match one of them then)."""

    def __init__(self, fixed: Mapping[K, np.dtype], lazy: Callable[[], Mapping[K, np.dtype]],
                 lazy_keys: Iterable[K]):
        self._fixed = dict(fixed)
        self._lazy = lazy
        self._keys = frozenset(lazy_keys)
        self._made: dict[K, np.dtype] | None = None

    def _all(self) -> dict[K, np.dtype]:
        if self._made is None:
            self._made = {**self._fixed, **self._lazy()}
        return self._made

    def __getitem__(self, key: K) -> np.dtype:
        if key in self._fixed:
            return self._fixed[key]
        if key not in self._keys:
            raise KeyError(key)
        return self._all()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._fixed or (key in self._keys and key in self._all())

    def __iter__(self) -> Iterator[K]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def items(self) -> Any:  # (a list; the ItemsView of a Mapping would build every entry)
        return list((self._all() if self._made is not None or ml_dtypes_imported() else self._fixed).items())


def __getattr__(name: str) -> Any:
    """``bfloat16``, the module's name for ml_dtypes' bfloat16 dtype, made when first asked for."""
    if name == "bfloat16":
        return bfloat16_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Encoding(enum.IntEnum):
    """The encoding byte of a version 2 header."""

    F64 = 0
    F32 = 1
    BF16 = 2

    @property
    def label(self) -> str:
        return {0: "f64", 1: "f32", 2: "bf16"}[int(self)]

    @classmethod
    def parse(cls, name: str) -> Encoding:
        """``"f64"``, ``"f32"`` or ``"bf16"`` → the encoding."""
        for encoding in cls:
            if encoding.label == name:
                return encoding
        raise BadValueError(f"unknown encoding {name!r}; expected f64, f32 or bf16")


# The dtype of a real leaf's values in memory, by encoding, and the dtype of its bytes on disk.
REAL_DTYPES: Mapping[Encoding, np.dtype] = LazyDtypes({Encoding.F64: np.dtype("<f8"), Encoding.F32: np.dtype("<f4")},
                                                       lambda: {Encoding.BF16: bfloat16_dtype()}, (Encoding.BF16,))
REAL_DISK_DTYPES: dict[Encoding, np.dtype] = {Encoding.F64: np.dtype("<f8"), Encoding.F32: np.dtype("<f4"),
                                               Encoding.BF16: np.dtype("<u2")}
INDEX_DTYPES = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))


def index_dtype(bound: int) -> np.dtype:
    """The smallest unsigned dtype that holds ``bound - 1``.

    >>> [index_dtype(n).itemsize for n in (1, 256, 257, 2**32, 2**32 + 1, 2**64)]
    [1, 1, 2, 4, 8, 8]
    """
    for dtype in INDEX_DTYPES:
        if bound - 1 <= np.iinfo(dtype).max:
            return dtype
    raise BadValueError(f"idx[{bound}] does not fit in 64 bits")


def encoding_of_dtype(dtype: np.dtype) -> Encoding:
    """The encoding that stores a float dtype exactly (float16 goes to f32, which holds it)."""
    dtype = np.dtype(dtype)
    if is_bfloat16(dtype):
        return Encoding.BF16
    if dtype.kind == "f" and dtype.itemsize in (2, 4):  # either byte order: the value decides
        return Encoding.F32
    return Encoding.F64


def is_real_dtype(dtype: np.dtype) -> bool:
    dtype = np.dtype(dtype)
    return is_bfloat16(dtype) or np.issubdtype(dtype, np.floating)


@dataclasses.dataclass
class Rounding:
    """What rounding to a narrower encoding did to one leaf: the largest error and where."""

    leaf: str
    encoding: Encoding
    max_error: float = 0.0
    where: tuple[int, ...] = ()
    value: float = 0.0
    rounded: float = 0.0

    def merge(self, other: Rounding) -> None:
        if other.max_error > self.max_error:
            self.max_error, self.where = other.max_error, other.where
            self.value, self.rounded = other.value, other.rounded

    def describe(self) -> str:
        if self.max_error == 0.0:
            return f"{self.leaf}: exact in {self.encoding.label}"
        return (
            f"{self.leaf}: rounded to {self.encoding.label}, largest error "
            f"{self.max_error:.3g} at index {list(self.where)} ({self.value!r} → {self.rounded!r})"
        )


# --------------------------------------------------------------------------------------------
# Values in: to f64, correctly rounded, once.


def to_f64(values: Any, *, leaf: str | Site = "value") -> np.ndarray:
    """Any real values → an f64 array, each rounded once and correctly (half-even).

    Float arrays widen exactly; integer arrays and Python ints round once; ``longdouble`` rounds
    in the cast; ``Fraction``, ``Decimal`` and other objects go through their own ``__float__``,
    which for those types is correctly rounded. Strings are parsed as decimal text.

    >>> from fractions import Fraction
    >>> to_f64([Fraction(1, 3), "0.1"]).tolist()
    [0.3333333333333333, 0.1]
    """
    if hasattr(values, "__array__") and not isinstance(values, np.ndarray):
        values = np.asarray(values)
    array = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)
    if array.dtype == object:
        flat = [_object_to_float(v, leaf, i) for i, v in enumerate(array.ravel())]
        return np.asarray(flat, dtype=np.float64).reshape(array.shape)
    if array.dtype.kind in "US":
        return _parse_decimals(array, leaf)
    if array.dtype == bool:
        raise MismatchError(f"{leaf}: booleans given for a real leaf")
    if not (array.dtype.kind in "iuf" or is_bfloat16(array.dtype)):
        raise MismatchError(f"{leaf}: {array.dtype} values given for a real leaf")
    with np.errstate(over="ignore"):
        return array.astype(np.float64)


def _object_to_float(value: Any, leaf: str | Site, position: int) -> float:
    if isinstance(value, (str, bytes)):
        try:
            return float(value)
        except ValueError:
            raise BadValueError(f"{leaf}, element {position}: {value!r} is not a decimal number"
            ) from None
    if isinstance(value, bool) or not (
        isinstance(value, numbers.Real) or hasattr(value, "__float__")
    ):
        raise BadValueError(f"{leaf}, element {position}: {value!r} is not a real number")
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")
    except (ArithmeticError, ValueError, TypeError) as e:
        # Decimal("sNaN") refuses float() (a signalling NaN is no number); so may any object.
        raise BadValueError(f"{leaf}, element {position}: {_shown(value)} is not a real number ({e})") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


def _parse_decimals(array: np.ndarray, leaf: str | Site) -> np.ndarray:
    try:
        return array.astype(np.float64)
    except ValueError:
        for position, text in enumerate(array.ravel()):
            try:
                float(text)
            except ValueError:
                raise BadValueError(f"{leaf}, element {position}: {str(text)!r} is not a decimal number") from None
        raise


# --------------------------------------------------------------------------------------------
# Checks and narrowing


def _position(shape: tuple[int, ...], flat_index: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat_index, shape)) if shape else ()


class RowNames(Protocol):
    """Names the samples of a batch by row: a list of names, or an object that makes one on demand."""

    def __getitem__(self, row: int, /) -> str: ...


@dataclasses.dataclass(frozen=True)
class Site:
    """Names a leaf in messages, and the samples along its first axis when it is batched.

    ``row_names`` names each sample (``"in.txt:3"`` for pack's lines); ``first_row`` numbers the
    first sample of a batch appended after others.
    """

    leaf: str
    row_names: RowNames | None = None
    first_row: int = 0

    def at(self, shape: tuple[int, ...], flat_index: int) -> str:
        position = _position(shape, flat_index)
        if self.row_names is not None and position:
            return f"{self.row_names[position[0]]}: {self.leaf} at index {list(position[1:])}"
        if position and self.first_row:
            position = (position[0] + self.first_row, *position[1:])
        return f"{self.leaf} at index {list(position)}"

    def __str__(self) -> str:
        return self.leaf


def _site(leaf: str | Site) -> Site:
    return leaf if isinstance(leaf, Site) else Site(leaf)


def check_finite(values: np.ndarray, *, leaf: str | Site) -> None:
    """Refuses NaN and ±Inf (E9004), naming the leaf and the first bad index."""
    finite = np.isfinite(values)
    if not finite.all():
        flat = int(np.flatnonzero(~finite.ravel())[0])
        bad = values.ravel()[flat]
        raise BadValueError(f"{_site(leaf).at(values.shape, flat)}: "
                            f"{float(bad)} is not a real number (NaN and ±Inf cannot be stored)")


def check_finite_encoded(values: np.ndarray, encoding: Encoding, where: Site) -> None:
    """Refuses NaN/Inf in values already in their encoding; bf16 is checked on its exponent bits."""
    if encoding == Encoding.BF16:
        exponent = values.view(np.uint16) & np.uint16(0x7F80)
        if (exponent == np.uint16(0x7F80)).any():
            check_finite(values.astype(np.float32), leaf=where)
    elif not np.isfinite(values).all():
        check_finite(values, leaf=where)


def round_f64_to_bf16(values: np.ndarray) -> np.ndarray:
    """f64 → bf16 rounded once, half-even.

    Rounding through f32 would round twice; rounding to f32 *to odd* first keeps the sticky
    information, and f32 has more than the two extra bits that makes the second rounding exact.
    """
    as_f32 = values.astype(np.float32)
    inexact = as_f32.astype(np.float64) != values
    if inexact.any():
        # Truncate toward zero, then force the last bit to one: round-to-odd.
        overshot = np.abs(as_f32.astype(np.float64)) > np.abs(values)
        truncated = np.where(overshot, np.nextafter(as_f32, np.float32(0)), as_f32)
        odd = truncated.view(np.uint32) | np.uint32(1)
        as_f32 = np.where(inexact, odd.view(np.float32), as_f32)
    return as_f32.astype(bfloat16_dtype())


def narrow(values: np.ndarray, encoding: Encoding, *, leaf: str | Site, round_to_encoding: bool,
           allow_nonfinite: bool = False) -> tuple[np.ndarray, Rounding | None]:
    """f64 values → the leaf's encoding, exactly, or rounded when asked for (E9004 otherwise).

    NaN and ±Inf are refused unless ``allow_nonfinite`` (checkpoints keep them: ±Inf is exact in
    every encoding, a NaN stays a NaN). A finite value beyond the encoding's range is refused
    either way. Returns the encoded array (f64, f32 or bfloat16) and, when rounding was asked
    for, what it did.
    """
    if not allow_nonfinite:
        check_finite(values, leaf=leaf)
    if encoding == Encoding.F64:
        return values, None
    with np.errstate(over="ignore", invalid="ignore"):
        narrowed = values.astype(np.float32) if encoding == Encoding.F32 else round_f64_to_bf16(values)
    back = narrowed.astype(np.float64)
    finite = np.isfinite(values)
    overflow = finite & ~np.isfinite(back)
    changed = (back != values) & finite
    if overflow.any():
        flat = int(np.flatnonzero(overflow.ravel())[0])
        raise BadValueError(f"{_site(leaf).at(values.shape, flat)}: "
                            f"{float(values.ravel()[flat])!r} is beyond the range of {encoding.label}")
    if not round_to_encoding:
        if changed.any():
            flat = int(np.flatnonzero(changed.ravel())[0])
            raise BadValueError(f"{_site(leaf).at(values.shape, flat)}: "
                                f"{float(values.ravel()[flat])!r} is not a number of {encoding.label} (nearest "
                                f"{float(back.ravel()[flat])!r}); ask for rounding (round_to_encoding=True, --round) "
                                "or store the leaf in a wider encoding")
        return narrowed, None
    report = Rounding(str(leaf), encoding)
    if changed.any():
        with np.errstate(invalid="ignore"):
            errors = np.where(finite, np.abs(back - values), 0.0)
        flat = int(np.argmax(errors.ravel()))
        report.max_error = float(errors.ravel()[flat])
        report.where = _position(values.shape, flat)
        report.value = float(values.ravel()[flat])
        report.rounded = float(back.ravel()[flat])
    return narrowed, report


def to_index(values: Any, bound: int, *, leaf: str | Site) -> np.ndarray:
    """Integer values → the leaf's unsigned dtype, refusing values outside [0, bound) (E9004)."""
    dtype = index_dtype(bound)
    array = np.asarray(values)
    if array.dtype.kind == "f" and not isinstance(values, np.ndarray):
        # numpy guesses float64 for Python ints that no one integer dtype holds (-1 and 2**63,
        # or 2**64 - 1 and 0): keep them exact as objects.
        as_objects = np.asarray(values, dtype=object)
        if all(isinstance(v, (int, np.integer)) for v in as_objects.ravel()):
            array = as_objects
    if array.dtype == object:
        array = _object_indices(array, bound, leaf)
    elif array.dtype.kind in "US":
        array = _object_indices(array.astype(object), bound, leaf)
    elif array.dtype == bool:
        array = array.astype(np.uint8)
    elif array.dtype.kind not in "iu":
        raise MismatchError(f"{leaf}: {array.dtype} values given for an idx[{bound}] leaf")
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= bound:
            bad = array < 0
            if high >= bound:  # then bound - 1 < high is representable in the array's dtype
                bad |= array > bound - 1
            flat = int(np.flatnonzero(bad.ravel())[0])
            raise BadValueError(f"{_site(leaf).at(array.shape, flat)}: "
                                f"{array.ravel()[flat]} is not an index below {bound}")
    return array.astype(dtype, copy=False)


def _object_indices(array: np.ndarray, bound: int, leaf: str | Site) -> np.ndarray:
    out = np.empty(array.shape, dtype=np.uint64)
    flat_out = out.reshape(-1)
    for position, value in enumerate(array.ravel()):
        if isinstance(value, str):
            text = value.strip()
            value = int(text) if text.isdigit() and text.isascii() else value
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise BadValueError(f"{_site(leaf).at(array.shape, position)}: {value!r} is not an index")
        if not 0 <= int(value) < bound:
            raise BadValueError(f"{_site(leaf).at(array.shape, position)}: {value} is not an index below {bound}")
        flat_out[position] = int(value)
    return out


__all__ = [
    "INDEX_DTYPES",
    "REAL_DISK_DTYPES",
    "REAL_DTYPES",
    "Encoding",
    "LazyDtypes",
    "Rounding",
    "RowNames",
    "Site",
    "bfloat16_dtype",
    "check_finite",
    "check_finite_encoded",
    "encoding_of_dtype",
    "index_dtype",
    "is_bfloat16",
    "is_real_dtype",
    "ml_dtypes_imported",
    "narrow",
    "round_f64_to_bf16",
    "to_f64",
    "to_index",
]
