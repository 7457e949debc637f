"""How a checkpoint stores a leaf of each dtype, and how it gives the leaf back (numpy only).

Each leaf's ``.psk.d`` type says how it is stored; the layout file records its dtype and its
*kind* (how the stored elements stand for the values). The table of dtypes, kinds and what comes
back is ``docs/checkpoint-dtypes.md``. This module knows dtypes by name and converts numpy arrays;
typed PRNG keys, which need JAX, are converted by the checkpoint package.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from pskd_jax.errors import BadValueError
from pskd_jax.format.encodings import Encoding, LazyDtypes, bfloat16_dtype, is_bfloat16

KIND_VALUE = "value"
KIND_BITS = "bits"
KIND_COMPLEX = "complex"
KIND_KEY = "key"
KIND_PYTHON = "python"
KINDS = (KIND_VALUE, KIND_BITS, KIND_COMPLEX, KIND_KEY, KIND_PYTHON)

PYTHON_TYPES = ("int", "float", "bool")  # the dtype names of the python kind

_NARROW_NAMES = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
                 "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn",
                 "float4_e2m1fn", "int1", "int2", "int4", "uint1", "uint2", "uint4")


def _narrow_dtypes() -> dict[str, np.dtype]:
    import ml_dtypes

    return {name: np.dtype(getattr(ml_dtypes, name)) for name in _NARROW_NAMES if hasattr(ml_dtypes, name)}


# ml_dtypes' one-byte types other than bfloat16 (those of them the installed ml_dtypes has):
# stored as their bit pattern. The table is made when first needed.
_NARROW: LazyDtypes[str] = LazyDtypes({}, _narrow_dtypes, _NARROW_NAMES)

_FULL_INTS = {f"{sign}int{bits}": np.dtype(f"{sign}int{bits}") for sign in ("", "u") for bits in (8, 16, 32, 64)}

_FLOATS: LazyDtypes[str] = LazyDtypes({"float64": np.dtype("<f8"), "float32": np.dtype("<f4"),
                                       "float16": np.dtype("<f2")}, lambda: {"bfloat16": bfloat16_dtype()},
                                      ("bfloat16",))

_COMPLEX: dict[str, tuple[np.dtype, Encoding]] = {"complex64": (np.dtype("<c8"), Encoding.F32),
                                                   "complex128": (np.dtype("<c16"), Encoding.F64)}

_REAL_ENCODING = {"float64": Encoding.F64, "float32": Encoding.F32, "float16": Encoding.F32, "bfloat16": Encoding.BF16}


def narrow_bits(dtype: np.dtype) -> int:
    """The bits of a one-byte ``ml_dtypes`` type (4 for int4 and float4_e2m1fn, 8 for float8)."""
    import ml_dtypes

    try:
        return int(ml_dtypes.finfo(dtype).bits)
    except (ValueError, TypeError):
        return int(ml_dtypes.iinfo(dtype).bits)


@dataclasses.dataclass(frozen=True)
class Form:
    """How leaves of one dtype are stored.

    ``dtype`` is the name the layout file records (a numpy or ``ml_dtypes`` name, ``key<impl>``
    for keys, ``int``/``float``/``bool`` for Python scalars); ``bound`` the idx bound of the stored
    leaf (None for ℝ); ``encoding`` the encoding a real stored leaf gets by default; ``trailing``
    the length of the last axis the stored leaf adds (2 for complex, the key data's width for
    keys); ``impl`` a key's implementation."""

    kind: str
    dtype: str
    bound: int | None
    encoding: Encoding | None = None
    trailing: int | None = None
    impl: str | None = None

    @property
    def is_real(self) -> bool:
        return self.bound is None

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape) + ((self.trailing,) if self.trailing is not None else ())

    def value_shape(self, stored_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the value a stored leaf of this form gives back (a Python scalar: ())."""
        if self.kind == KIND_PYTHON:
            return ()
        return tuple(stored_shape[:-1]) if self.trailing is not None else tuple(stored_shape)


def dtype_named(name: str) -> np.dtype | None:
    """The numpy dtype a layout file names (``"int32"``, ``"bfloat16"``, ``"float8_e4m3fn"``…), or None."""
    if not isinstance(name, str):
        return None
    if name in _FLOATS:
        return _FLOATS[name]
    if name in _FULL_INTS:
        return _FULL_INTS[name]
    if name in _NARROW:
        return _NARROW[name]
    if name in _COMPLEX:
        return _COMPLEX[name][0]
    if name == "bool":
        return np.dtype(bool)
    return None


def dtype_name(dtype: np.dtype) -> str:
    """The name of a dtype as a layout file records it (native byte order, ``bfloat16`` by name)."""
    dtype = np.dtype(dtype)
    if is_bfloat16(dtype):
        return "bfloat16"
    for name, known in _NARROW.items():
        if dtype == known:
            return name
    if dtype.kind in "fiuc" and dtype.byteorder not in ("=", "|"):
        dtype = dtype.newbyteorder("=")
    return str(dtype)


def form_of_dtype(dtype: Any) -> Form | None:
    """The form leaves of a numpy dtype are stored in, or None for a dtype no checkpoint holds
    (strings, objects, datetimes, records…). ``longdouble`` is rounded once to f64 (a float64)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    return _form_of(dtype)


@functools.lru_cache(maxsize=256)
def _form_of(dtype: np.dtype) -> Form | None:
    if is_bfloat16(dtype):
        return Form(KIND_VALUE, "bfloat16", None, Encoding.BF16)
    for name, known in _NARROW.items():
        if dtype == known:
            return Form(KIND_BITS, name, 2 ** narrow_bits(dtype))
    if dtype.kind == "b":
        return Form(KIND_VALUE, "bool", 2)
    if dtype.kind == "u" and dtype.itemsize in (1, 2, 4, 8):
        return Form(KIND_VALUE, f"uint{8 * dtype.itemsize}", 2 ** (8 * dtype.itemsize))
    if dtype.kind == "i" and dtype.itemsize in (1, 2, 4, 8):
        return Form(KIND_BITS, f"int{8 * dtype.itemsize}", 2 ** (8 * dtype.itemsize))
    if dtype.kind == "f":
        name = {2: "float16", 4: "float32", 8: "float64"}.get(dtype.itemsize, "float64")  # longdouble → f64
        return Form(KIND_VALUE, name, None, _REAL_ENCODING[name])
    if dtype.kind == "c" and dtype.itemsize in (8, 16):
        name = "complex64" if dtype.itemsize == 8 else "complex128"
        return Form(KIND_COMPLEX, name, None, _COMPLEX[name][1], trailing=2)
    return None


def key_form(impl: str, width: int) -> Form:
    """The form of a typed PRNG key array of implementation ``impl`` whose key data has ``width``
    uint32 words per key."""
    return Form(KIND_KEY, f"key<{impl}>", 2**32, trailing=width, impl=impl)


def python_int_form(value: int) -> tuple[Form, int]:
    """The form of a Python int, and the number of 64-bit limbs (0: one element of the form's width)."""
    for bits in (8, 16, 32, 64):
        if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return Form(KIND_PYTHON, "int", 2**bits), 0
    return Form(KIND_PYTHON, "int", 2**64), (value.bit_length() + 1 + 63) // 64


def python_form(value: Any) -> Form | None:
    """The form of a Python ``bool``, ``float`` or ``int`` scalar (None for anything else, a numpy
    scalar too: ``numpy.float64`` is a ``float`` subclass, but an array's element)."""
    if isinstance(value, np.generic):
        return None
    if isinstance(value, bool):
        return Form(KIND_PYTHON, "bool", 2)
    if isinstance(value, float):
        return Form(KIND_PYTHON, "float", None, Encoding.F64)
    if isinstance(value, int):
        return python_int_form(value)[0]
    return None


def python_int_pattern(value: int) -> np.ndarray:
    """A Python int as the stored array of its form: one unsigned element, or 64-bit limbs."""
    form, limbs = python_int_form(value)
    if not limbs:
        bound = form.bound
        assert bound is not None  # (an int's form always has one)
        bits = bound.bit_length() - 1
        return np.asarray(value % bound, dtype=f"<u{bits // 8}")
    pattern = value % (1 << (64 * limbs))
    return np.array([(pattern >> (64 * k)) & (2**64 - 1) for k in range(limbs)], dtype="<u8")


def python_int_of(stored: np.ndarray) -> int:
    """The Python int a stored pattern (one element or limbs) stands for."""
    stored = np.asarray(stored)
    if stored.ndim == 0:
        bits = 8 * stored.dtype.itemsize
        value = int(stored)
        return value - (1 << bits) if value >> (bits - 1) else value
    total = 0
    for k, limb in enumerate(stored.reshape(-1).tolist()):
        total |= int(limb) << (64 * k)
    bits = 64 * stored.size
    return total - (1 << bits) if bits and total >> (bits - 1) else total


# --------------------------------------------------------------------------------------------
# float16 ↔ f32 by bits (the hardware conversions quiet a signalling NaN)


def float16_to_float32(values: np.ndarray) -> np.ndarray:
    """float16 → float32, exactly, NaN payloads (and signalling NaNs) included."""
    values = np.asarray(values, dtype=np.float16)
    with np.errstate(invalid="ignore"):
        out = values.astype(np.float32)
    if not np.isnan(out).any():  # (the bit work only where a NaN is)
        return out
    raw = values.view(np.uint16)
    nan = ((raw & 0x7C00) == 0x7C00) & ((raw & 0x03FF) != 0)
    if nan.any():
        wide = raw.astype(np.uint32)
        bits = ((wide & 0x8000) << 16) | np.uint32(0x7F800000) | ((wide & 0x03FF) << 13)
        out.view(np.uint32)[nan] = bits[nan]
    return out


def float32_to_float16(values: np.ndarray, where: str) -> np.ndarray:
    """float32 values that are float16 values → float16, bit for bit; E9004 naming ``where`` and
    the first index that is not one (a file whose f32 leaf was not written from float16)."""
    values = np.asarray(values, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(np.float16)
    raw = values.view(np.uint32)
    if np.isnan(values).any():
        nan = ((raw & 0x7F800000) == 0x7F800000) & ((raw & 0x007FFFFF) != 0)
        bits = (((raw >> 16) & 0x8000) | 0x7C00 | ((raw >> 13) & 0x03FF)).astype(np.uint16)
        out.view(np.uint16)[nan] = bits[nan]
    back = float16_to_float32(out).view(np.uint32)
    if np.array_equal(back, raw):
        return out
    wrong = back != raw
    if wrong.any():
        flat = int(np.flatnonzero(wrong.reshape(-1))[0])
        index = [int(i) for i in np.unravel_index(flat, values.shape)] if values.shape else []
        raise BadValueError(f"{where} at index {index}: the stored f32 {float(values.reshape(-1)[flat])!r} "
                            "is not a float16 value (the leaf was saved from float16)")
    return out


# --------------------------------------------------------------------------------------------
# Values → stored elements, and back (numpy kinds: value, bits, complex)


def check_f64_range(values: np.ndarray, where: str) -> None:
    """Refuses (E9004, naming the index) a finite value that f64 cannot hold (beyond ±1.8e308) in
    an array stored as f64 although its own dtype is wider: an object array (``Fraction``,
    ``Decimal``, Python ints among other numbers) or a long double one. Stored, it would come back
    as ±inf; an infinity is one already (an IEEE infinity, ``Decimal('Infinity')``) and is kept."""
    kind, size = values.dtype.kind, values.dtype.itemsize
    if values.dtype == object:
        for k, value in enumerate(values.reshape(-1)):
            try:
                wide = float(value)
            except OverflowError:
                wide = float("inf")
            except (TypeError, ValueError):
                continue  # (refused as it is encoded, naming the leaf)
            if wide in (float("inf"), float("-inf")) and not _is_infinity(value):
                raise BadValueError(f"{where}{_at(values.shape, k)}: {_abridged_number(value)} is beyond the "
                                    "range of f64, the encoding it is stored in (it would come back as an infinity)")
    elif (kind == "f" and size > 8) or (kind == "c" and size > 16):
        with np.errstate(over="ignore", invalid="ignore"):
            parts = [values.real, values.imag] if kind == "c" else [values]
            for part in parts:
                bad = np.isinf(part.astype(np.float64)) & np.isfinite(part)
                if bad.any():
                    k = int(np.flatnonzero(bad.reshape(-1))[0])
                    raise BadValueError(f"{where}{_at(values.shape, k)}: {part.reshape(-1)[k]!r} is beyond the range "
                                        "of f64, the encoding it is stored in (it would come back as an infinity)")


def _is_infinity(value: Any) -> bool:
    try:
        return bool(value == float("inf") or value == float("-inf"))
    except (TypeError, ValueError, ArithmeticError):
        return False


def _at(shape: tuple[int, ...], flat: int) -> str:
    return f" at index {[int(i) for i in np.unravel_index(flat, shape)]}" if shape else ""


def _abridged_number(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"… ({len(text)} characters)"


def contiguous(array: np.ndarray) -> np.ndarray:
    """The array in C order, a copy only when it is not (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def to_stored(array: np.ndarray, form: Form) -> np.ndarray:
    """The elements a leaf stores, elementwise from its values (a view wherever one serves):
    a signed integer's unsigned pattern, a narrow type's bit pattern, a complex leaf's (real,
    imaginary) pairs. Value kinds come back as they are (the encoder converts real encodings)."""
    if form.kind == KIND_BITS:
        if form.dtype in _NARROW:
            pattern = contiguous(array).view(np.uint8)
            bound = form.bound
            assert bound is not None  # (a bits form always has one)
            # (a type of fewer than 8 bits keeps them low; the byte's other bits are not its value)
            return pattern if bound == 256 else pattern & np.uint8(bound - 1)
        return array.view(f"u{array.dtype.itemsize}") if array.dtype.byteorder in ("=", "|", "<") \
            else array.astype(array.dtype.newbyteorder("=")).view(f"u{array.dtype.itemsize}")
    if form.kind == KIND_COMPLEX:
        native = contiguous(np.asarray(array, dtype=_COMPLEX[form.dtype][0]))
        part = np.float32 if form.dtype == "complex64" else np.float64
        return native.reshape(-1).view(part).reshape(tuple(array.shape) + (2,))
    return array


def out_of_bound(stored: np.ndarray, bound: int | None) -> int | None:
    """The flat index of the first stored element at or above ``bound`` (None when all are below)."""
    if bound is None or stored.size == 0 or stored.dtype.kind not in "u":
        return None
    if bound >= 1 << (8 * stored.dtype.itemsize):
        return None
    over = stored.reshape(-1) >= bound
    return int(np.flatnonzero(over)[0]) if over.any() else None


def _index_text(shape: tuple[int, ...], flat: int) -> str:
    return str([int(i) for i in np.unravel_index(flat, shape)] if shape else [])


def from_stored(stored: np.ndarray, form: Form, where: str) -> np.ndarray:
    """The values of a leaf from its stored elements (views wherever they serve). Refuses, with
    E9004 naming ``where`` and the index, what the form cannot hold: a bool other than 0 or 1, a
    pattern at or above its bound, an f32 that is no float16."""
    bad = out_of_bound(stored, form.bound)
    if bad is not None:
        raise BadValueError(f"{where} at index {_index_text(stored.shape, bad)}: the stored value "
                            f"{int(stored.reshape(-1)[bad])} is not below its bound idx[{form.bound}]")
    if form.kind == KIND_BITS:
        if form.dtype in _NARROW:
            return stored.astype(np.uint8, copy=False).view(_NARROW[form.dtype])
        return stored.view(_FULL_INTS[form.dtype])
    if form.kind == KIND_COMPLEX:
        part = np.dtype(np.float32 if form.dtype == "complex64" else np.float64)
        # (parts the caller stored in another encoding: bf16 and f32 widen exactly)
        native = contiguous(stored if stored.dtype == part else stored.astype(part))
        return native.view(_COMPLEX[form.dtype][0]).reshape(stored.shape[:-1])
    if form.kind == KIND_VALUE:
        if form.dtype == "bool":
            return as_bool(stored, where)
        if form.dtype == "float16" and stored.dtype == np.float32:
            return float32_to_float16(stored, where)
    return stored


def as_bool(values: np.ndarray, where: str) -> np.ndarray:
    """Stored bool (or integer) elements as bool; E9004 naming the index of one other than 0 or 1."""
    if values.dtype == np.bool_:
        return values
    wrong = (values != 0) & (values != 1)
    if wrong.any():
        flat = int(np.flatnonzero(wrong.reshape(-1))[0])
        raise BadValueError(f"{where} at index {_index_text(values.shape, flat)}: the stored value "
                            f"{values.reshape(-1)[flat]} is not a bool (0 or 1)")
    return values.view(np.bool_) if values.dtype.itemsize == 1 else values.astype(np.bool_)


def saved_values(stored: np.ndarray, form: Form | None, where: str, *, bound: int | None = None,
                 stored_encoding: Encoding | None = None) -> Any:
    """A leaf's saved values from its stored elements, as a restore without JAX gives them back:
    an array in the saved dtype (signed and narrow integers from their patterns, bools, float8
    values, complex from pairs, float16 from its f32), key data (uint32, as stored), or — ``stored``
    being one sample's leaf — a Python scalar. ``form`` None (no layout file says more): the
    stored values, checked against ``bound``. A real leaf the caller stored in another encoding than
    its dtype's own (``stored_encoding``) gives back the stored values. Refuses (E9004 naming
    ``where`` and the index) what the form cannot hold (see :func:`from_stored`)."""
    if form is None:
        bad = out_of_bound(stored, bound)
        if bad is not None:
            raise BadValueError(f"{where} at index {_index_text(stored.shape, bad)}: the stored value "
                                f"{int(stored.reshape(-1)[bad])} is not below its bound idx[{bound}]")
        return stored
    if form.kind == KIND_KEY:
        return stored
    if form.kind == KIND_PYTHON:
        if form.dtype == "float":
            return float(stored)
        if form.dtype == "bool":
            return bool(as_bool(stored, where))
        return python_int_of(stored)
    if not restore_dtype(form, stored_encoding):
        return stored  # stored narrower than its dtype, as the caller asked: the stored values
    values = from_stored(stored, form, where)
    saved = dtype_named(form.dtype)
    if values.dtype != saved:  # a version 1 integer, stored as its value (below its bound, so it fits)
        values = values.astype(saved)
    return values


def shown_values(stored: np.ndarray, form: Form | None, where: str, *, bound: int | None = None,
                 stored_encoding: Encoding | None = None, batched: bool = False) -> Any:
    """A leaf's stored elements as info and export show them (docs/export.md): decoded
    as a restore gives them back, except key data, complex pairs and a float16 leaf's f32, which
    are shown as stored (a float16 leaf's f32 checked to hold float16 values: E9004 otherwise).
    ``batched``: ``stored`` holds the leaf of several samples under a first axis; a Python scalar
    leaf then gives one scalar a sample (a list)."""
    if form is not None and form.kind == KIND_PYTHON and batched:
        return [saved_values(row, form, f"{where}, sample {k}") for k, row in enumerate(stored)]
    if form is None or form.kind in (KIND_KEY, KIND_COMPLEX):
        return stored
    if form.kind == KIND_VALUE and form.dtype == "float16" and stored.dtype == np.float32:
        float32_to_float16(stored, where)  # (checked, shown as the f32 that holds it)
        return stored
    return saved_values(stored, form, where, bound=bound, stored_encoding=stored_encoding)


def is_narrow_integer(dtype: Any) -> bool:
    """One of ``ml_dtypes``' narrow integer types (int4, uint2, …), which numpy sees as opaque."""
    return any(dtype == known for name, known in _NARROW.items() if "int" in name)


def restore_dtype(form: Form, stored_encoding: Encoding | None) -> bool:
    """Whether a leaf recorded with ``form`` gives back the form's dtype: always, except for a real
    leaf the caller stored in another encoding than the dtype's own (``encodings=``), which gives
    back the stored encoding's values, as stored."""
    return not (form.kind == KIND_VALUE and form.is_real and stored_encoding is not None
                and stored_encoding != form.encoding)


__all__ = [
    "KINDS",
    "KIND_BITS",
    "KIND_COMPLEX",
    "KIND_KEY",
    "KIND_PYTHON",
    "KIND_VALUE",
    "PYTHON_TYPES",
    "Form",
    "as_bool",
    "check_f64_range",
    "contiguous",
    "dtype_name",
    "dtype_named",
    "float16_to_float32",
    "float32_to_float16",
    "form_of_dtype",
    "from_stored",
    "is_narrow_integer",
    "key_form",
    "narrow_bits",
    "out_of_bound",
    "python_form",
    "python_int_form",
    "python_int_of",
    "python_int_pattern",
    "restore_dtype",
    "saved_values",
    "shown_values",
    "to_stored",
]
