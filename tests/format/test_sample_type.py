"""Sample-type text: the grammar, what is refused (E9001) and where, header text, layouts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError
from pskd_jax.format.layout import Layout, Leaf
from pskd_jax.format.sample_type import (
    Dim,
    IndexType,
    ParamsType,
    RealType,
    TupleType,
    format_type,
    header_text,
    parse_type,
)

SETTINGS = settings(max_examples=200, deadline=None, database=None)


def refused(text: str) -> PskdError:
    with pytest.raises(PskdError) as info:
        parse_type(text)
    assert info.value.code == "E9001"
    return info.value


# --------------------------------------------------------------------------------------------
# What parses, and to what


def test_real_with_named_and_plain_dims():
    assert parse_type("ℝ[model: 4, 3]") == RealType((Dim(4, "model"), Dim(3)))


def test_ascii_alias_parses_as_real():
    assert parse_type("R[2]") == parse_type("ℝ[2]") == RealType((Dim(2),))


def test_scalars():
    assert parse_type("ℝ[]") == RealType(())
    assert parse_type("idx[7][]") == IndexType(7, ())
    assert Layout.of_type("ℝ[]").leaves == (Leaf("", (), None),)


def test_bool_is_idx_2():
    parsed = parse_type("bool[3]")
    assert parsed == IndexType(2, (Dim(3),), is_bool=True)
    assert Layout.of_type("bool[3]").leaves == (Leaf("", (3,), 2),)


def test_whitespace_is_free():
    assert parse_type(" ( idx [ 64 ] [ seq :8 ] ,ℝ[ ] ) ") == TupleType(
        (IndexType(64, (Dim(8, "seq"),)), RealType(()))
    )


def test_tuple_layout_paths_and_structure():
    layout = Layout.of_type("(idx[64][seq: 8], (ℝ[2, 3], bool[]))")
    assert layout.leaves == (
        Leaf("[0]", (8,), 64),
        Leaf("[1][0]", (2, 3), None),
        Leaf("[1][1]", (), 2),
    )
    assert layout.structure == (0, (1, 2))
    assert layout.unflatten(["a", "b", "c"]) == ("a", ("b", "c"))
    assert layout.sample_elements == 8 + 6 + 1


def test_unflatten_refuses_wrong_count():
    with pytest.raises(ValueError, match="2 values for 3 leaves"):
        Layout.of_type("(ℝ[], ℝ[], ℝ[])").unflatten([1, 2])


def test_idx_bounds_at_the_limits():
    assert parse_type("idx[1][]").bound == 1
    assert parse_type(f"idx[{2**64}][]").bound == 2**64


def test_params_parses_but_has_no_layout_without_template():
    assert parse_type("params MiniGPT") == ParamsType("MiniGPT")
    with pytest.raises(PskdError) as info:
        Layout.of_type("params MiniGPT")
    assert info.value.code == "E9001"
    assert "params MiniGPT" in info.value.message
    assert "layout" in info.value.message


def test_axis_names_are_any_identifier():
    parsed = parse_type("ℝ[R: 2, idx: 3, bool: 1, params: 1]")
    assert [d.name for d in parsed.dims] == ["R", "idx", "bool", "params"]


# --------------------------------------------------------------------------------------------
# What is refused, with the column


@pytest.mark.parametrize(
    "text, column, words",
    [
        ("ℝ[model: D]", 10, "symbolic"),
        ("ℝ[D]", 3, "symbolic"),
        ("ℝ[2, N]", 6, "symbolic"),
        ("...", 1, "open prefix"),
        ("…", 1, "open prefix"),
        ("(ℝ[], …)", 7, "open prefix"),
        ("ℝ[...]", 3, "open prefix"),
        ("ℝ[2, …]", 6, "open prefix"),
        ("idx[0][]", 5, "idx[0]"),
        ("idx[N][]", 5, "symbolic"),
        ("Foo", 1, "named type 'Foo'"),
        ("(ℝ[], Tokens)", 7, "named type 'Tokens'"),
        ("(ℝ[])", 1, "at least two elements"),
        ("(ℝ[], ℝ[]", 10, "expected ')', found the end of the text"),
        ("ℝ[2", 4, "expected ',' or ']', found the end of the text"),
        ("ℝ[2]]", 5, "expected the end of the type, found ']'"),
        ("ℝ[2] x", 6, "expected the end of the type, found 'x'"),
        ("ℝ[2] ℝ[2]", 6, "expected the end of the type"),
        ("ℝ", 2, "expected '[' and the dimensions"),
        ("idx[3]", 7, "expected '[' and the dimensions"),
        ("idx 3", 5, "expected '['"),
        ("ℝ[2,]", 5, "expected dimension, found ']'"),
        ("ℝ[-1]", 3, "unexpected character '-'"),
        ("ℝ[2.5]", 4, "unexpected character '.'"),
        ("", 1, "found the end of the text"),
        ("()", 2, "found ')'"),
        ("(ℝ[], params M)", 1, "params type cannot be a tuple element"),
        ("params", 7, "the name of the parameter tree"),
        (f"idx[{2**64 + 1}][]", 5, "beyond idx[2^64]"),
        ("idx[" + "9" * 41 + "][]", 5, "too large"),
    ],
)
def test_refused_with_column(text, column, words):
    error = refused(text)
    assert f"column {column}:" in error.message
    assert words in error.message
    assert repr(text) in error.message


def test_nesting_limit():
    def nested(depth: int) -> str:
        text = "ℝ[]"
        for _ in range(depth):
            text = f"({text}, idx[2][])"
        return text

    layout = Layout.of_type(nested(64))
    assert len(layout.leaves) == 65
    assert layout.leaves[0].path == "[0]" * 64
    error = refused(nested(65))
    assert "nested deeper than 64" in error.message


def test_absurd_nesting_is_refused_without_recursion_error():
    error = refused("(" * 100_000)
    assert "nested deeper than 64" in error.message


def test_sample_of_more_than_2_60_elements_is_refused():
    with pytest.raises(PskdError) as info:
        Layout.of_type("(ℝ[1073741824, 1073741824], ℝ[1])")
    assert info.value.code == "E9001"
    assert "leaf [1]" in info.value.message
    assert Layout.of_type("ℝ[1073741824, 1073741824]").sample_elements == 2**60  # the limit itself


def test_non_text_is_refused():
    with pytest.raises(PskdError) as info:
        parse_type(b"R[2]")
    assert info.value.code == "E9001"
    assert "bytes" in info.value.message


# --------------------------------------------------------------------------------------------
# Header text and canonical text


@pytest.mark.parametrize(
    "written, stored",
    [
        ("R[2]", "ℝ[2]"),
        ("ℝ[2]", "ℝ[2]"),
        ("(R[R: 2], idx[3][R: 1])", "(ℝ[R: 2], idx[3][R: 1])"),
        ("( R [ 2 ] ,  ℝ[] )", "( ℝ [ 2 ] ,  ℝ[] )"),
        ("params R", "params R"),
        ("bool[2]", "bool[2]"),
        ("(idx[64][seq: 8],R[])", "(idx[64][seq: 8],ℝ[])"),
    ],
)
def test_header_text_replaces_only_the_type_alias(written, stored):
    assert header_text(written) == stored


def test_header_text_alias_is_three_utf8_bytes():
    assert header_text("R[]").encode("utf-8") == b"\xe2\x84\x9d[]"


def test_header_text_refuses_what_does_not_parse():
    with pytest.raises(PskdError) as info:
        header_text("R[D]")
    assert info.value.code == "E9001"


def test_format_type_is_canonical():
    parsed = parse_type(" ( R[ model :4,3 ] , bool[], idx[300][ ] ) ")
    assert format_type(parsed) == "(ℝ[model: 4, 3], bool[], idx[300][])"
    assert format_type(ParamsType("MiniGPT")) == "params MiniGPT"


# --------------------------------------------------------------------------------------------
# Random closed types: rendered text → parse → the same structure; format_type round trips

AXIS_NAMES = ["seq", "model", "R", "ℝ", "idx", "bool", "params", "Δt", "x_1"]


@st.composite
def dims(draw):
    sizes = draw(st.lists(st.integers(0, 5), max_size=3))
    return tuple(Dim(s, draw(st.none() | st.sampled_from(AXIS_NAMES))) for s in sizes)


BOUNDS = st.sampled_from([1, 2, 255, 256, 257, 65536, 65537, 2**32, 2**32 + 1, 2**64]) | st.integers(1, 2**64)
LEAF_TYPES = st.one_of(
    st.builds(RealType, dims()),
    st.builds(IndexType, BOUNDS, dims()),
    st.builds(lambda d: IndexType(2, d, is_bool=True), dims()),
)
CLOSED_TYPES = st.recursive(
    LEAF_TYPES, lambda inner: st.builds(TupleType, st.lists(inner, min_size=2, max_size=4).map(tuple)),
    max_leaves=8,
)


@st.composite
def rendered(draw, parsed):
    """A text of ``parsed`` with random spacing and R/ℝ spellings, and its header text."""
    space = lambda: draw(st.sampled_from(["", " ", "  ", "\t", "\n"]))  # noqa: E731
    pieces: list[tuple[str, str]] = []  # (as written, as stored)

    def emit(text, stored=None):
        pieces.append((text, text if stored is None else stored))

    def dims_text(ds):
        emit(space() + "[")
        for i, d in enumerate(ds):
            if i:
                emit(space() + ",")
            emit(space() + (f"{d.name}{space()}:{space()}" if d.name else "") + str(d.size))
        emit(space() + "]")

    def walk(t):
        if isinstance(t, TupleType):
            emit(space() + "(")
            for i, item in enumerate(t.items):
                if i:
                    emit(space() + ",")
                walk(item)
            emit(space() + ")")
        elif isinstance(t, RealType):
            lead = space()
            alias = draw(st.sampled_from(["R", "ℝ"]))
            emit(lead + alias, lead + "ℝ")
            dims_text(t.dims)
        elif t.is_bool:
            emit(space() + "bool")
            dims_text(t.dims)
        else:
            emit(space() + f"idx{space()}[{space()}{t.bound}{space()}]")
            dims_text(t.dims)

    walk(parsed)
    emit(space())
    return "".join(w for w, _ in pieces), "".join(s for _, s in pieces)


def expected_leaves(t, path=""):
    if isinstance(t, TupleType):
        return [leaf for i, item in enumerate(t.items) for leaf in expected_leaves(item, f"{path}[{i}]")]
    shape = tuple(d.size for d in t.dims)
    return [Leaf(path, shape, None if isinstance(t, RealType) else t.bound)]


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_random_types_parse_to_their_structure(data):
    parsed = data.draw(CLOSED_TYPES)
    text, stored = data.draw(rendered(parsed))
    assert parse_type(text) == parsed
    assert header_text(text) == stored
    assert parse_type(stored) == parsed
    canonical = format_type(parsed)
    assert parse_type(canonical) == parsed
    assert format_type(parse_type(canonical)) == canonical
    assert "R[" not in canonical.replace("ℝ[", "")
    assert list(Layout.of_type(text).leaves) == expected_leaves(parsed)


@SETTINGS
@given(st.text(alphabet=st.sampled_from(list("ℝRidxbolparms()[],: 0123456789….")), max_size=20))
def test_any_text_parses_or_is_refused_with_e9001(text):
    try:
        parsed = parse_type(text)
    except PskdError as error:
        assert error.code == "E9001"
        assert re.search(r"column \d+", error.message) or "layout" in error.message
    else:
        assert parse_type(format_type(parsed)) == parsed
