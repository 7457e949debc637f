"""What a restore's target asks for, leaf by leaf (:class:`TargetSpec`), and the saved values made
into it: the target's dtype by an explicit cast that refuses to change a value (E9004 naming the
index), its Python scalar type, the x64 check for JAX. What comes back is in ``docs/checkpoints.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from pskd_jax._os.checks import first_true
from pskd_jax.checkpoint.jax_arrays import is_array_like, is_key_array, jax_module, key_impl_of, sharding_of, wants_jax
from pskd_jax.checkpoint.planning import leaf_name
from pskd_jax.errors import BadValueError, MismatchError
from pskd_jax.format import stored_dtypes as sd
from pskd_jax.format.layout import Leaf
from pskd_jax.format.placement import Placement


@dataclasses.dataclass
class TargetSpec:
    """A target leaf: its value shape, and its dtype (numpy), or that it is a Python scalar or a
    typed key array; where its value goes (JAX or numpy, with which sharding)."""

    shape: tuple[int, ...]
    dtype: np.dtype | None = None
    python: type | None = None
    key: tuple[str, int] | None = None  # (implementation, words per key)
    to_jax: bool = False
    sharding: Any = None

    @property
    def category(self) -> str:
        if self.key is not None:
            return "key"
        if self.python is not None:
            return {bool: "bool", int: "int", float: "real"}[self.python]
        assert self.dtype is not None  # (neither a key nor a Python scalar: an array of a dtype)
        return category(self.dtype)

    def describe(self) -> str:
        if self.key is not None:
            return f"{self.shape} key<{self.key[0]}>"
        if self.python is not None:
            return f"a Python {self.python.__name__}"
        assert self.dtype is not None  # (an array of a dtype)
        return f"{self.shape} {sd.dtype_name(self.dtype)}"


def category(dtype: np.dtype) -> str:
    return _category_of(np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _category_of(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "bool"
    if dtype.kind == "c":
        return "complex"
    if dtype.kind in "iu" or dtype.name in ("int1", "int2", "int4", "uint1", "uint2", "uint4"):
        return "int"
    return "real"


def spec_of(path: str, spec: Any, as_numpy: bool) -> TargetSpec:
    """What a target leaf asks for (E9005 naming the key path for what no restore gives)."""
    where = leaf_name(path)
    if isinstance(spec, (bool, int, float)) and not isinstance(spec, np.generic):
        return TargetSpec((), python=bool if isinstance(spec, bool) else int if isinstance(spec, int) else float)
    if is_key_array(spec):
        jax_bound = not as_numpy and wants_jax(spec)
        return TargetSpec(tuple(int(d) for d in spec.shape), key=key_impl_of(spec.dtype), to_jax=jax_bound,
                     sharding=sharding_of(spec) if jax_bound else None)
    if not is_array_like(spec):
        if isinstance(spec, (str, bytes)) or not (isinstance(spec, (complex, np.generic))):
            raise MismatchError(f"{where}: the target holds a {type(spec).__name__}, not an array, a "
                                "ShapeDtypeStruct or a Python scalar")
        spec = np.asarray(spec)
    try:
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
    except (TypeError, ValueError) as e:
        raise MismatchError(f"{where}: the target's dtype {getattr(spec, 'dtype', None)!s:.60} is not one a "
                            f"checkpoint gives back ({e})") from None
    if sd.form_of_dtype(dtype) is None:
        raise MismatchError(f"{where}: the target asks for dtype {dtype}, which no checkpoint holds")
    jax_bound = not as_numpy and wants_jax(spec)
    return TargetSpec(shape, dtype=dtype, to_jax=jax_bound, sharding=sharding_of(spec) if jax_bound else None)


# --------------------------------------------------------------------------------------------
# Values: stored elements → the saved dtype → the target's dtype


def where_of(path: str, leaf: Leaf) -> str:
    return f"{path}: at {leaf.path or '(root)'}"


def saved_values(raw: np.ndarray, leaf: Leaf, form: sd.Form | None, placement: Placement, i: int,
                  where: str) -> Any:
    """A leaf's saved values from its stored elements: an array in the saved dtype, key data
    (uint32), or a Python scalar (:func:`pskd_jax.format.stored_dtypes.saved_values`)."""
    return sd.saved_values(raw, form, where, bound=leaf.bound,
                           stored_encoding=placement.encodings[i] if leaf.is_real else None)


def _dtype_info(dtype: np.dtype):
    try:
        return np.iinfo(dtype)
    except ValueError:
        import ml_dtypes  # (a narrow integer type of its: it is imported already)

        return ml_dtypes.iinfo(dtype)


def _first(mask: np.ndarray) -> int:
    """The flat index of the first element ``mask`` marks (the caller knows there is one)."""
    found = first_true(mask)
    assert found is not None
    return found


def _index(shape: tuple[int, ...], flat: int) -> list[int]:
    return [int(k) for k in np.unravel_index(flat, shape)] if shape else []


def cast(values: np.ndarray, dtype: np.dtype, where: str, *, allow_overflow: bool) -> np.ndarray:
    """The explicit cast a target asks for. Refused (E9004, naming the index): an integer that does
    not fit, a bool other than 0 or 1, a finite value beyond a float dtype's range (unless
    ``allow_overflow``). Rounding to a narrower float is the cast asked for."""
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    target = category(dtype)
    if target == "bool":
        return sd.as_bool(values, where)
    if target == "int":
        if values.size:
            info = _dtype_info(dtype)
            wide = values.astype(np.int64) if values.dtype.kind == "b" else values
            low, high = wide.min(), wide.max()
            if int(low) < int(info.min) or int(high) > int(info.max):
                bad = _first((wide < info.min) | (wide > info.max))
                raise BadValueError(f"{where} at index {_index(values.shape, bad)}: the stored value "
                                    f"{wide.reshape(-1)[bad]} does not fit the target's {sd.dtype_name(dtype)}")
        return values.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(dtype)
    if not allow_overflow and values.size:
        parts = (values.real, out.real, values.imag, out.imag) if target == "complex" else (values, out)
        for before, after in zip(parts[::2], parts[1::2]):
            before64 = before.astype(np.float64) if before.dtype.kind != "f" or before.dtype.itemsize < 8 else before
            after64 = after.astype(np.float64)
            beyond = np.isfinite(before64) & ~np.isfinite(after64)
            if beyond.any():
                bad = _first(beyond)
                raise BadValueError(f"{where} at index {_index(values.shape, bad)}: the stored value "
                                    f"{before64.reshape(-1)[bad]!r} is beyond the range of the target's "
                                    f"{sd.dtype_name(dtype)} (restore(..., allow_overflow=True) makes it ±inf)")
    return out


def to_target(saved: Any, spec: TargetSpec | None, where: str, allow_overflow: bool) -> Any:
    """Saved values as the target leaf asks (a Python scalar, or an array of its dtype)."""
    if spec is None or spec.key is not None:
        return saved
    if spec.python is not None:
        if isinstance(saved, (bool, int, float)):
            value = saved
        else:
            value = np.asarray(saved).reshape(()).item()
        if spec.python is bool:
            return bool(sd.as_bool(np.asarray(value), where)) if not isinstance(value, bool) else value
        if spec.python is int and isinstance(value, float):
            raise MismatchError(f"{where}: expected a Python int, found a real")
        return spec.python(value)
    assert spec.dtype is not None  # (neither a key nor a Python scalar: an array of a dtype)
    if isinstance(saved, (bool, int, float)):
        return _python_to_array(saved, spec.dtype, where, allow_overflow)
    return cast(saved, spec.dtype, where, allow_overflow=allow_overflow)


def _python_to_array(value: Any, dtype: np.dtype, where: str, allow_overflow: bool) -> np.ndarray:
    if isinstance(value, int) and not isinstance(value, bool) and category(dtype) == "int":
        info = _dtype_info(dtype)
        if not int(info.min) <= value <= int(info.max):
            raise BadValueError(f"{where}: the stored value {value} does not fit the target's {sd.dtype_name(dtype)}")
        return np.asarray(value).astype(dtype)
    source = np.asarray(value, dtype=np.float64 if isinstance(value, float) else None)
    return cast(source, dtype, where, allow_overflow=allow_overflow)


def check_x64(where: str, dtype: np.dtype, asked: bool) -> None:
    jax = jax_module()
    if dtype.itemsize >= 8 and dtype.kind in "fiuc" and not jax.config.jax_enable_x64 \
            and not (dtype.kind == "c" and dtype.itemsize == 8):
        stored = {"f": "f64", "c": "complex128"}.get(dtype.kind, str(dtype))
        how = "ask for a 32-bit dtype in the target"
        raise MismatchError(f"{where}: {'the target asks for' if asked else 'stored as'} {stored}, but JAX has x64 "
                            f"disabled: enable jax_enable_x64 or {how} (an explicit cast)")


def check_jax_dtype(where: str, dtype: np.dtype, asked: bool) -> None:
    """Refuses (E9005) a leaf bound for JAX of a dtype that JAX cannot put on a device (the float6
    types of ``ml_dtypes``, which a numpy leaf may be saved as), rather than a JAX runtime error."""
    if not _jax_holds(dtype):
        raise MismatchError(f"{where}: {'the target asks for' if asked else 'stored as'} {dtype}, which JAX cannot "
                            "hold in a device array: restore it with as_numpy=True, or into a numpy target leaf")


@functools.cache
def _jax_holds(dtype: np.dtype) -> bool:
    jax = jax_module()
    try:
        jax.device_put(np.zeros(1, dtype))
    except Exception:  # (JAX raises its runtime error, or a TypeError, for a dtype it does not know)
        return False
    return True


def final_dtype(leaf: Leaf, form: sd.Form | None, spec: TargetSpec | None, placement: Placement,
                i: int) -> np.dtype | None:
    """The dtype a JAX-bound leaf will have (None for keys and Python scalars)."""
    if spec is not None:
        return spec.dtype
    if form is None:
        return placement.value_dtype(i)
    if form.kind in (sd.KIND_KEY, sd.KIND_PYTHON):
        return None
    if not sd.restore_dtype(form, placement.encodings[i] if leaf.is_real else None):
        return placement.value_dtype(i)
    return sd.dtype_named(form.dtype)


__all__ = ["TargetSpec", "cast", "category", "check_jax_dtype", "check_x64", "final_dtype", "saved_values", "spec_of",
           "to_target", "where_of"]
