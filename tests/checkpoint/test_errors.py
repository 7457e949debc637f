"""No raw TypeError or ValueError escapes save or restore, whatever the tree, target or option;
every refusal names the key path."""

from __future__ import annotations

import datetime
import decimal
import fractions
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions, restoring
from pskd_jax.errors import PskdError

HOSTILE_LEAVES = st.one_of(
    st.integers(-(2**300), 2**300), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.complex_numbers(),
    st.text(max_size=5), st.binary(max_size=5), st.none(),
    st.sampled_from([
        fractions.Fraction(1, 3), decimal.Decimal("sNaN"), decimal.Decimal("NaN"), decimal.Decimal("-Infinity"),
        decimal.Decimal("1e999999"), object(), {1, 2}, frozenset(), len, datetime.date(2020, 1, 1), Ellipsis,
        np.array(["a", "b"]), np.array([b"x"]), np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), np.array([object(), 1], dtype=object),
        np.array([1, "x"], dtype=object), np.array([True, 2], dtype=object), np.array([1.5, None], dtype=object),
        np.array([2**70, -1], dtype=object), np.zeros((0, 3), np.int8), np.float128(1) if hasattr(np, "float128")
        else np.longdouble(1), np.clongdouble(1j), np.array([1 + 2j], np.complex64), np.zeros(2, ml_dtypes.int4),
        jax.ShapeDtypeStruct((2,), np.float32), jax.random.key(0), np.timedelta64(1, "s"), np.void(b"ab"),
        np.ma.masked_array([1, 2], mask=[0, 1]), memoryview(b"abc"), bytearray(b"x"),
    ]),
)

FUZZ_EXAMPLES = int(os.environ.get("PSKD_FUZZ_EXAMPLES", "300"))  # (more for a longer search)

KEYS = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.sampled_from([(1, 2), 1.5, True, None, "a.b", "'", "]["]))


def trees(leaves=HOSTILE_LEAVES):
    return st.recursive(leaves, lambda children: st.one_of(
        st.lists(children, max_size=3), st.lists(children, max_size=3).map(tuple),
        st.dictionaries(KEYS, children, max_size=3)), max_leaves=8)


def only_pskd_errors(action):
    try:
        return action()
    except PskdError as e:
        assert e.message and e.code.startswith("E9")
        assert restoring.GUARDED not in e.message, e.message  # refused at its root, not by the last guard
        return e


OPTIONS = st.fixed_dictionaries({}, optional={
    "encodings": st.sampled_from([None, "bf16", "f16", 123, ["f32"], {"nothing": "f32"}, object()]),
    "name": st.sampled_from([None, "Net", "1abc", 5, "params", ""]),
    "round_to_encoding": st.booleans(), "finite_only": st.booleans(),
    "digest": st.sampled_from([None, True, "xxh3_128", "sha256", "md5", 3]),
})


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@pytest.mark.slow
@given(tree=trees(), options=OPTIONS)
def test_save_and_restore_raise_only_pskd_errors(tmp_path_factory, tree, options):
    path = tmp_path_factory.mktemp("fuzz") / "c.psk.d"
    saved = only_pskd_errors(lambda: ck.save(path, tree, ck.SaveOptions(**options)))
    if isinstance(saved, PskdError) or not path.exists():
        return
    only_pskd_errors(lambda: ck.restore(path))
    only_pskd_errors(lambda: ck.restore(path, as_numpy=True))
    only_pskd_errors(lambda: ck.restore(path, zero_copy=True))
    only_pskd_errors(lambda: ck.restore(path, tree))
    only_pskd_errors(lambda: ck.restore(path, tree, partial=True, as_numpy=True))


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=trees(), partial=st.booleans(), allow_overflow=st.booleans())
def test_restore_into_a_hostile_target_raises_only_pskd_errors(tmp_path_factory, target, partial, allow_overflow):
    path = tmp_path_factory.mktemp("fuzz") / "c.psk.d"
    ck.save(path, {"a": np.arange(3, dtype=np.int8) - 1, "b": [0.5, np.float32(2)], "": True, "k": jax.random.key(1)})
    only_pskd_errors(lambda: ck.restore(path, target, partial=partial, allow_overflow=allow_overflow))
    only_pskd_errors(lambda: ck.restore(path, target, partial=partial, as_numpy=True))
    only_pskd_errors(lambda: ck.restore(path, layout=target))


@pytest.mark.parametrize("tree, where", [
    ({"a": {"b": "text"}}, "['a']['b']"),
    ({"x": [1, object()]}, "['x'][1]"),
    ({"d": np.array(["2020-01-01"], dtype="datetime64[D]")}, "['d']"),
    ({"s": jax.ShapeDtypeStruct((2,), np.float32)}, "['s']"),
    ({"o": np.array([1, 2**70], dtype=object)}, "['o']"),
    ({"f": decimal.Decimal("sNaN")}, "['f']"),
    ({"n": [np.array([np.nan])]}, "['n'][0]"),
])
def test_every_refusal_names_the_key_path(tmp_path, tree, where):
    with pytest.raises(PskdError) as e:
        ck.save(tmp_path / "c.psk.d", tree, SaveOptions(finite_only=True))
    assert where in e.value.message
    assert not (tmp_path / "c.psk.d").exists()
