"""Encodings and exactness (docs/exactness.md): rounding once to f64, refusing or rounding narrowings.

The references here are exact: rationals (``fractions.Fraction``) rounded half-even by hand, so a
rounding bug in numpy, ml_dtypes or the module shows up as a difference.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError
from pskd_jax.format.encodings import (
    Encoding,
    Site,
    check_finite,
    encoding_of_dtype,
    index_dtype,
    narrow,
    round_f64_to_bf16,
    to_f64,
    to_index,
)

SETTINGS = settings(max_examples=300, deadline=None, database=None)
BF16 = np.dtype(ml_dtypes.bfloat16)


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def f64_of_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def round_half_even(value: Fraction, mantissa_bits: int, min_exponent: int, max_exponent: int) -> float:
    """``value`` rounded half-even to a binary format with ``mantissa_bits`` stored bits, normal
    exponents in [min_exponent, max_exponent] and subnormals below; ±inf past the largest finite
    number's rounding threshold. Exact: works on rationals only."""
    if value == 0:
        return 0.0
    sign = -1 if value < 0 else 1
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    assert Fraction(2) ** exponent <= magnitude < Fraction(2) ** (exponent + 1)
    quantum = Fraction(2) ** (max(exponent, min_exponent) - mantissa_bits)
    steps = magnitude / quantum
    low = math.floor(steps)
    remainder = steps - low
    if remainder > Fraction(1, 2) or (remainder == Fraction(1, 2) and low % 2 == 1):
        low += 1
    result = low * quantum
    if result >= Fraction(2) ** (max_exponent + 1):
        return sign * math.inf
    return sign * float(result)  # exact: result has at most mantissa_bits + 1 significant bits


def exact_bf16(x: float) -> float:
    return math.copysign(round_half_even(Fraction(x), 7, -126, 127), x)


def exact_f32(x: float) -> float:
    return math.copysign(round_half_even(Fraction(x), 23, -126, 127), x)


# --------------------------------------------------------------------------------------------
# Widths and names


@pytest.mark.parametrize(
    "bound, dtype",
    [
        (1, "<u1"), (2, "<u1"), (256, "<u1"),
        (257, "<u2"), (300, "<u2"), (65536, "<u2"),
        (65537, "<u4"), (2**32, "<u4"),
        (2**32 + 1, "<u8"), (2**64, "<u8"),
    ],
)
def test_index_dtype_is_the_smallest_that_holds_bound_minus_one(bound, dtype):
    assert index_dtype(bound) == np.dtype(dtype)


def test_index_dtype_beyond_64_bits():
    with pytest.raises(PskdError) as info:
        index_dtype(2**64 + 1)
    assert info.value.code == "E9004"


def test_encoding_bytes_and_labels():
    assert [(int(e), e.label) for e in Encoding] == [(0, "f64"), (1, "f32"), (2, "bf16")]
    assert Encoding.parse("bf16") is Encoding.BF16
    with pytest.raises(PskdError) as info:
        Encoding.parse("f16")
    assert info.value.code == "E9004"
    assert "'f16'" in info.value.message


@pytest.mark.parametrize(
    "dtype, encoding",
    [(np.float64, Encoding.F64), (np.float32, Encoding.F32), (np.float16, Encoding.F32),
     (BF16, Encoding.BF16), (np.longdouble, Encoding.F64)],
)
def test_encoding_of_dtype(dtype, encoding):
    assert encoding_of_dtype(dtype) is encoding


# --------------------------------------------------------------------------------------------
# Rounding to f64 once, correctly


@pytest.mark.parametrize(
    "value, expected_hex",
    [
        (Fraction(1, 3), "0x1.5555555555555p-2"),
        (Fraction(2, 3), "0x1.5555555555555p-1"),
        (Fraction(1, 10), "0x1.999999999999ap-4"),
        (Fraction(2**53 + 1), "0x1.0000000000000p+53"),  # tie → even
        (Fraction(2**53 + 3), "0x1.0000000000002p+53"),  # tie → even (up)
        (Fraction(2**54 + 3, 2), "0x1.0000000000001p+53"),  # 2^53 + 1.5, past the tie → 2^53 + 2
        (Fraction(1, 2**1074), "0x0.0000000000001p-1022"),  # smallest subnormal
        (Fraction(1, 2**1075), "0x0.0p+0"),  # half of it: tie → even (zero)
        (Fraction(3, 2**1076), "0x0.0000000000001p-1022"),  # 0.75 of it: up
        (Decimal("0.1"), "0x1.999999999999ap-4"),
        (Decimal("-0.3"), "-0x1.3333333333333p-2"),
        (Decimal("2.2250738585072011e-308"), "0x0.fffffffffffffp-1022"),
        (Decimal("9007199254740993"), "0x1.0000000000000p+53"),
        (Decimal("1e23"), "0x1.52d02c7e14af6p+76"),
        ("0.1", "0x1.999999999999ap-4"),
        ("1e23", "0x1.52d02c7e14af6p+76"),
        ("9007199254740993", "0x1.0000000000000p+53"),
        ("9007199254740995", "0x1.0000000000002p+53"),
        ("2.4703282292062328e-324", "0x0.0000000000001p-1022"),  # just above half the subnormal
        ("2.4703282292062327e-324", "0x0.0p+0"),  # just below
        ("0.30000000000000004", "0x1.3333333333334p-2"),
        ("-0", "-0x0.0p+0"),
        (2**53 + 1, "0x1.0000000000000p+53"),
        (2**64 - 1, "0x1.0000000000000p+64"),
        (10**22, "0x1.0f0cf064dd592p+73"),
        (10**23, "0x1.52d02c7e14af6p+76"),
        (-(2**63) - 1025, "-0x1.0000000000001p+63"),  # past the tie (2^63 + 1024): away from zero
    ],
)
def test_single_values_round_once_correctly(value, expected_hex):
    (got,) = to_f64([value]).tolist()
    assert f64_bits(got) == f64_bits(float.fromhex(expected_hex))


def test_decimal_strings_as_a_numpy_array():
    texts = np.array(["0.1", "1e23", "9007199254740993", "2.2250738585072011e-308", "-0.0"])
    got = to_f64(texts)
    expected = [float.fromhex(h) for h in
                ("0x1.999999999999ap-4", "0x1.52d02c7e14af6p+76", "0x1.0p+53",
                 "0x0.fffffffffffffp-1022", "-0x0.0p+0")]
    assert [f64_bits(x) for x in got.tolist()] == [f64_bits(x) for x in expected]


def test_integer_arrays_round_once():
    got = to_f64(np.array([2**53 + 1, 2**53 + 3, -(2**63)], dtype=np.int64))
    assert got.tolist() == [2.0**53, 2.0**53 + 4, -(2.0**63)]
    assert to_f64(np.array([2**64 - 1, 2**63 + 2**10], dtype=np.uint64)).tolist() == [2.0**64, 2.0**63]


def test_object_with_float():
    class HighPrecision:
        def __float__(self):
            return 0.1

    (got,) = to_f64([HighPrecision()]).tolist()
    assert f64_bits(got) == 0x3FB999999999999A


def test_longdouble_rounds_once():
    one = np.longdouble(1)
    ulp = np.longdouble(2) ** -52
    values = np.array([
        one + ulp / 2,  # a tie if longdouble is wider than f64: → 1.0 (even)
        one + 3 * ulp / 2,  # a tie: → 1 + 2ulp (even)
        one + ulp / 2 + ulp / 2**10,  # just above the tie: → 1 + ulp
        np.longdouble(1) / 3,
    ], dtype=np.longdouble)
    got = to_f64(values)
    # The exact reference: the longdouble's own rational value rounded half-even.
    expected = [float(Fraction(*v.as_integer_ratio())) for v in values]
    assert [f64_bits(x) for x in got.tolist()] == [f64_bits(x) for x in expected]
    as_objects = to_f64(list(values))
    assert [f64_bits(x) for x in as_objects.tolist()] == [f64_bits(x) for x in expected]
    if np.finfo(np.longdouble).nmant >= 63:  # x87 extended or quad: the ties are really ties
        assert got.tolist()[:3] == [1.0, 1.0 + 2.0**-51, 1.0 + 2.0**-52]


def test_overflowing_inputs_become_infinities_that_narrow_refuses():
    got = to_f64([10**400, -(10**400), Decimal("1e400"), "1e400"])
    assert got.tolist() == [math.inf, -math.inf, math.inf, math.inf]
    with pytest.raises(PskdError) as info:
        narrow(got, Encoding.F64, leaf="w", round_to_encoding=False)
    assert info.value.code == "E9004"
    assert "w at index [0]" in info.value.message


@pytest.mark.parametrize(
    "value, code, words",
    [
        ("abc", "E9004", "'abc' is not a decimal number"),
        ("0x10", "E9004", "'0x10' is not a decimal number"),
        (None, "E9004", "None is not a real number"),
        (True, "E9004", "True is not a real number"),
        (1j, "E9004", "1j is not a real number"),
    ],
)
def test_what_is_not_a_real(value, code, words):
    with pytest.raises(PskdError) as info:
        to_f64(["1.5", value], leaf="lf")
    assert info.value.code == code
    assert "lf, element 1" in info.value.message
    assert words in info.value.message


def test_booleans_for_a_real_leaf_are_a_mismatch():
    with pytest.raises(PskdError) as info:
        to_f64(np.array([True, False]), leaf="lf")
    assert info.value.code == "E9005"
    assert "lf" in info.value.message


# --------------------------------------------------------------------------------------------
# Narrowing: refused unless asked for; then half-even, once


def test_narrowing_refused_names_leaf_index_and_value():
    values = np.array([[1.0, 0.5], [0.1, 2.0]])
    with pytest.raises(PskdError) as info:
        narrow(values, Encoding.F32, leaf="leaf ['w']", round_to_encoding=False)
    assert info.value.code == "E9004"
    assert "leaf ['w'] at index [1, 0]" in info.value.message
    assert "0.1 is not a number of f32" in info.value.message
    assert "round_to_encoding=True" in info.value.message
    with pytest.raises(PskdError) as info:
        narrow(np.array([1.0, 1.0 + 2.0**-8]), Encoding.BF16, leaf="b", round_to_encoding=False)
    assert "b at index [1]" in info.value.message
    assert "1.00390625 is not a number of bf16" in info.value.message


def test_exact_narrowing_passes_bit_for_bit():
    values = np.array([1.5, -0.0, 2.0**-133, -(2.0**127) * 1.5, 3.140625])
    narrowed, report = narrow(values, Encoding.BF16, leaf="b", round_to_encoding=False)
    assert report is None
    assert narrowed.dtype == BF16
    assert narrowed.view(np.uint16).tolist() == [0x3FC0, 0x8000, 0x0001, 0xFF40, 0x4049]
    narrowed, _ = narrow(values, Encoding.F32, leaf="b", round_to_encoding=False)
    assert narrowed.dtype == np.float32
    assert narrowed.view(np.uint32).tolist() == [0x3FC00000, 0x80000000, 0x00010000, 0xFF400000, 0x40490000]


@pytest.mark.parametrize("encoding", [Encoding.F64, Encoding.F32, Encoding.BF16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_refused_in_every_encoding(encoding, bad):
    values = np.array([[0.0, 1.0], [2.0, bad]])
    for rounding in (False, True):
        with pytest.raises(PskdError) as info:
            narrow(values, encoding, leaf="leaf [1]", round_to_encoding=rounding)
        assert info.value.code == "E9004"
        assert "leaf [1] at index [1, 1]" in info.value.message
        assert "not a real number" in info.value.message


def test_check_finite_with_row_names():
    site = Site("leaf [0]", row_names=["in.txt:3", "in.txt:7"])
    with pytest.raises(PskdError) as info:
        check_finite(np.array([[1.0, 2.0], [3.0, math.nan]]), leaf=site)
    assert "in.txt:7: leaf [0] at index [1]" in info.value.message


def test_site_numbers_rows_after_earlier_batches():
    site = Site("leaf x", first_row=10)
    assert site.at((2, 3), 4) == "leaf x at index [11, 1]"


@pytest.mark.parametrize("encoding, limit", [(Encoding.F32, 2.0**128 - 2.0**103), (Encoding.BF16, 2.0**128 - 2.0**119)])
def test_beyond_the_range_is_refused_even_when_rounding(encoding, limit):
    # The rounding threshold above the largest finite number rounds to infinity (tie → even).
    for value in (limit, -limit, 1e300):
        with pytest.raises(PskdError) as info:
            narrow(np.array([1.0, value]), encoding, leaf="w", round_to_encoding=True)
        assert info.value.code == "E9004"
        assert f"beyond the range of {encoding.label}" in info.value.message
        assert "w at index [1]" in info.value.message
    below = np.nextafter(limit, 0.0)
    narrowed, report = narrow(np.array([below]), encoding, leaf="w", round_to_encoding=True)
    largest = 2.0**128 - 2.0**104 if encoding == Encoding.F32 else 2.0**128 - 2.0**120
    assert narrowed.astype(np.float64).tolist() == [largest]
    assert report.max_error == below - largest


def test_rounding_report():
    values = np.array([[1.0, 1.0 + 2.0**-9], [1.0 + 3 * 2.0**-9, -(1.0 + 2.0**-8 + 2.0**-30)]])
    narrowed, report = narrow(values, Encoding.BF16, leaf="w", round_to_encoding=True)
    # 1 + 2^-9: below half an ulp (2^-8) → 1; 1 + 3·2^-9: above → 1 + 2^-7 (error 2^-9);
    # -(1 + 2^-8 + 2^-30): just beyond the tie → -(1 + 2^-7), error 2^-8 - 2^-30, the largest.
    assert narrowed.astype(np.float64).tolist() == [[1.0, 1.0], [1.0 + 2.0**-7, -(1.0 + 2.0**-7)]]
    assert report.encoding == Encoding.BF16
    assert report.max_error == 2.0**-8 - 2.0**-30
    assert report.where == (1, 1)
    assert report.value == -(1.0 + 2.0**-8 + 2.0**-30)
    assert report.rounded == -(1.0 + 2.0**-7)
    assert "largest error" in report.describe() and "[1, 1]" in report.describe()
    _, exact = narrow(np.array([1.0, 2.0]), Encoding.F32, leaf="v", round_to_encoding=True)
    assert exact.max_error == 0.0 and exact.describe() == "v: exact in f32"


# -- round_f64_to_bf16 against the exact reference


def bf16_neighbourhood(bits: int) -> list[float]:
    """Values around bf16 number ``bits`` and the midpoint to the next: the midpoint (a tie), one
    f64 ulp either side of it (values f32 would round to the tie: the double-rounding trap), and
    values a sixteenth of a bf16 ulp either side."""
    here = float(np.array([bits], np.uint16).view(BF16).astype(np.float64)[0])
    after = float(np.array([bits + 1], np.uint16).view(BF16).astype(np.float64)[0])
    if not (math.isfinite(here) and math.isfinite(after)):
        return []
    tie = (here + after) / 2  # exact in f64
    step = (after - here) / 16
    return [here, tie, np.nextafter(tie, math.inf), np.nextafter(tie, -math.inf),
            tie + step, tie - step, here + step, after - step]


ADVERSARIAL = [
    0.0, -0.0, 1.0, -1.0,
    2.0**-134, 3 * 2.0**-134, 2.0**-134 * (1 + 2.0**-40), 2.0**-135, 5e-324, -5e-324, 1e-300,
    2.0**-126, 2.0**-126 * (1 - 2.0**-9), 2.0**-126 * (1 - 2.0**-8), 2.0**-127 * 3,
    2.0**128 - 2.0**119, np.nextafter(2.0**128 - 2.0**119, 0.0), 2.0**128 - 2.0**120, 3.4e38, 1e300,
    np.nextafter(1.0 + 2.0**-8, math.inf), 1.0 + 2.0**-8 + 2.0**-24, 1.0 + 2.0**-8 + 2.0**-25,
    1.0 + 2.0**-8 - 2.0**-53, 1.0 + 3 * 2.0**-8, 0.1, 1 / 3, math.pi, -math.e,
]
for _bits in (0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3F81, 0x4049, 0x7F7E, 0x8001, 0xBF80):
    ADVERSARIAL += bf16_neighbourhood(_bits)


def assert_matches_reference(values: np.ndarray) -> None:
    with np.errstate(over="ignore"):
        got = round_f64_to_bf16(values)
    assert got.dtype == BF16
    expected = np.array([exact_bf16(float(x)) for x in values], dtype=np.float32)
    # Every expected value is a bf16, so its f32 bits carry the bf16 bits in their upper half.
    expected_bits = (expected.view(np.uint32) >> 16).astype(np.uint16)
    mismatches = [(float(x).hex(), hex(g), hex(e)) for x, g, e in
                  zip(values, got.view(np.uint16).tolist(), expected_bits.tolist()) if g != e]
    assert not mismatches


def test_round_f64_to_bf16_adversarial():
    values = np.array(ADVERSARIAL + [-x for x in ADVERSARIAL], dtype=np.float64)
    assert_matches_reference(values)


@pytest.mark.slow
def test_round_f64_to_bf16_on_every_bf16_neighbourhood_sampled():
    rng = np.random.default_rng(20240611)
    bits = rng.integers(0, 0x7F80, size=1500).tolist()
    values = [v for b in bits for v in bf16_neighbourhood(b)]
    assert_matches_reference(np.array(values + [-v for v in values], dtype=np.float64))


@SETTINGS
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=32))
@example([2.0**-134])
@example([1.0 + 2.0**-8 + 2.0**-53])
def test_round_f64_to_bf16_any_finite_f64(values):
    assert_matches_reference(np.array(values, dtype=np.float64))


@SETTINGS
@given(st.integers(0, 2**63 - 1), st.booleans())
def test_round_f64_to_bf16_random_bit_patterns(bits, negative):
    value = f64_of_bits(bits)
    if math.isfinite(value):
        assert_matches_reference(np.array([-value if negative else value]))


@SETTINGS
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-3e38, max_value=3e38),
                min_size=1, max_size=16))
@pytest.mark.slow
def test_narrow_with_rounding_matches_the_references(values):
    array = np.array(values, dtype=np.float64)
    for encoding, reference in ((Encoding.F32, exact_f32), (Encoding.BF16, exact_bf16)):
        expected = [reference(v) for v in values]
        if not all(math.isfinite(e) for e in expected):
            with pytest.raises(PskdError):
                narrow(array, encoding, leaf="w", round_to_encoding=True)
            continue
        narrowed, report = narrow(array, encoding, leaf="w", round_to_encoding=True)
        got = narrowed.astype(np.float64).tolist()
        assert [f64_bits(g) for g in got] == [f64_bits(e) for e in expected]
        errors = [abs(Fraction(v) - Fraction(e)) for v, e in zip(values, expected)]
        assert Fraction(report.max_error) == max(errors)
        exact = all(e == 0 for e in errors)
        if not exact:
            with pytest.raises(PskdError) as info:
                narrow(array, encoding, leaf="w", round_to_encoding=False)
            assert info.value.code == "E9004"
            first = next(i for i, e in enumerate(errors) if e)
            assert f"w at index [{first}]" in info.value.message


# --------------------------------------------------------------------------------------------
# Indices


@pytest.mark.parametrize(
    "bound, values, dtype",
    [
        (2, [0, 1], "<u1"),
        (256, [0, 255], "<u1"),
        (300, [0, 299], "<u2"),
        (2**32 + 1, [0, 2**32], "<u8"),
        (2**64, [0, 2**64 - 1], "<u8"),
    ],
)
def test_indices_at_the_top_of_their_bound(bound, values, dtype):
    got = to_index(values, bound, leaf="i")
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == values
    # A value list as Python objects and as a numpy array agree.
    assert to_index(np.array(values, dtype=object), bound, leaf="i").tolist() == values


@pytest.mark.parametrize(
    "bound, values, where, shown",
    [
        (2, [0, 2], "[1]", "2 is not an index below 2"),
        (256, np.array([0, 256], np.int64), "[1]", "256 is not an index below 256"),
        (300, np.array([[5, 299], [300, 7]], np.uint16), "[1, 0]", "300 is not an index below 300"),
        (64, np.array([3, -1], np.int8), "[1]", "-1 is not an index below 64"),
        (2**64 - 1, np.array([2**64 - 1], np.uint64), "[0]", "18446744073709551615 is not an index below"),
        (2**64, [1, 2**64], "[1]", "18446744073709551616 is not an index below"),
        (2**64, [-1], "[0]", "-1 is not an index below"),
        (10, ["3", "x"], "[1]", "'x' is not an index"),
        (2**64, [-1, 2**63], "[0]", "-1 is not an index below"),
    ],
)
def test_indices_outside_their_bound_are_refused(bound, values, where, shown):
    with pytest.raises(PskdError) as info:
        to_index(values, bound, leaf="leaf [0]")
    assert info.value.code == "E9004"
    assert f"leaf [0] at index {where}" in info.value.message
    assert shown in info.value.message


def test_reals_for_an_index_leaf_are_a_mismatch():
    with pytest.raises(PskdError) as info:
        to_index(np.array([0.0, 1.0]), 4, leaf="leaf [2]")
    assert info.value.code == "E9005"
    assert "leaf [2]" in info.value.message
    assert "idx[4]" in info.value.message
    with pytest.raises(PskdError) as info:
        to_index([1, 2.0], 4, leaf="leaf [2]")
    assert info.value.code == "E9005"


def test_booleans_are_indices_below_two():
    assert to_index(np.array([True, False]), 2, leaf="m").tolist() == [1, 0]
    assert to_index(np.array([True, False]), 2, leaf="m").dtype == np.uint8
