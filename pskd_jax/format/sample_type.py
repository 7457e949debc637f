"""Sample-type text → a parsed type → a :class:`Layout` of leaves.

The grammar, and which types are closed (every other one is refused with E9001), are defined in
``docs/format.md`` ("The sample-type grammar"). ``params M`` parses, but its leaves are known only
from a template pytree or a layout file (:meth:`Layout.from_template`).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterator, Mapping

from pskd_jax.errors import NotClosedError, PskdError

MAX_NESTING = 64

MAX_INDEX_BOUND = 2**64

# A sample larger than this cannot be addressed by a u64 file offset times any useful count.
MAX_SAMPLE_ELEMENTS = 2**60

# numpy holds at most 64 axes, and a leaf read from a file gains one (the sample axis).
MAX_AXES = 63


@dataclasses.dataclass(frozen=True)
class Dim:
    """One axis of a leaf: its length and, for documentation only, its name."""

    size: int
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class RealType:
    dims: tuple[Dim, ...]


@dataclasses.dataclass(frozen=True)
class IndexType:
    bound: int
    dims: tuple[Dim, ...]
    is_bool: bool = False


@dataclasses.dataclass(frozen=True)
class TupleType:
    items: tuple[SampleType, ...]


@dataclasses.dataclass(frozen=True)
class ParamsType:
    name: str


SampleType = RealType | IndexType | TupleType | ParamsType

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<int>[0-9]+)
      | (?P<ident>[^\W\d]\w*)
      | (?P<ellipsis>\.\.\.|…)
      | (?P<punct>[\[\](),:])
    """,
    re.VERBOSE,
)


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # "int", "ident", "ellipsis", "punct", "end"
    text: str
    column: int  # 1-based, in characters


def _tokenize(text: str) -> Iterator[_Token]:
    """The tokens of ``text``, made one at a time (a hostile megabyte of ``(`` is refused at the
    65th, never held as a million tokens), then an end token."""
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise _error(text, position + 1, f"unexpected character {text[position]!r}")
        kind = match.lastgroup
        assert kind is not None  # (every alternative of the pattern is a named group)
        if kind != "space":
            yield _Token(kind, match.group(), position + 1)
        position = match.end()
    yield _Token("end", "", len(text) + 1)


def _shown(text: str) -> str:
    """A type text as messages quote it: at most 80 characters."""
    return repr(text) if len(text) <= 80 else repr(text[:80]) + f"… ({len(text)} characters)"


def _error(text: str, column: int, what: str) -> PskdError:
    return NotClosedError(f"sample type {_shown(text)}, column {column}: {what}")


class _Parser:
    def __init__(self, text: str, symbols: Mapping[str, int] | None = None):
        self.text = text
        self._tokens = _tokenize(text)
        self._ahead: collections.deque[_Token] = collections.deque()
        self.symbols = symbols or {}

    def peek(self, k: int = 0) -> _Token:
        """The token k places ahead (the end token once the text is used up)."""
        while len(self._ahead) <= k:
            token = next(self._tokens, None)
            if token is None:
                return self._ahead[-1]  # the end token
            self._ahead.append(token)
        return self._ahead[k]

    def take(self) -> _Token:
        token = self.peek()
        if token.kind != "end":
            self._ahead.popleft()
        return token

    def fail(self, token: _Token, expected: str) -> PskdError:
        found = "the end of the text" if token.kind == "end" else repr(token.text)
        return _error(self.text, token.column, f"expected {expected}, found {found}")

    def expect(self, text: str) -> _Token:
        token = self.take()
        if token.text != text or token.kind not in ("punct", "ident"):
            raise self.fail(token, repr(text))
        return token

    def integer(self, what: str) -> int:
        token = self.take()
        if token.kind == "ellipsis":
            raise _error(self.text, token.column, "an open prefix is not a closed data type")
        if token.kind == "ident" and token.text in self.symbols:
            return self.symbols[token.text]
        if token.kind == "ident":
            raise _error(
                self.text, token.column,
                f"the symbolic {what} {token.text!r} is not a closed data type; write a number",
            )
        if token.kind != "int":
            raise self.fail(token, what)
        if len(token.text) > 40:  # far beyond any bound or length a file can hold
            raise _error(self.text, token.column, f"the {what} {token.text[:20]}… is too large")
        return int(token.text)

    def sample_type(self, depth: int) -> SampleType:
        if depth > MAX_NESTING:
            raise _error(self.text, self.peek().column, f"types nested deeper than {MAX_NESTING}")
        token = self.take()
        if token.kind == "ident" and token.text in ("ℝ", "R"):
            return RealType(self.dims())
        if token.kind == "ident" and token.text == "idx":
            self.expect("[")
            bound_token = self.peek()
            bound = self.integer("index bound")
            if bound == 0:
                raise _error(self.text, bound_token.column, "idx[0] has no values")
            if bound > MAX_INDEX_BOUND:
                raise _error(self.text, bound_token.column, f"idx[{bound}] is beyond idx[2^64]")
            self.expect("]")
            return IndexType(bound, self.dims())
        if token.kind == "ident" and token.text == "bool":
            return IndexType(2, self.dims(), is_bool=True)
        if token.kind == "ident" and token.text == "params":
            name = self.take()
            if name.kind != "ident":
                raise self.fail(name, "the name of the parameter tree after 'params'")
            return ParamsType(name.text)
        if token.text == "(":
            items = [self.sample_type(depth + 1)]
            while self.peek().text == ",":
                self.take()
                items.append(self.sample_type(depth + 1))
            self.expect(")")
            if len(items) < 2:
                raise _error(self.text, token.column, "a tuple needs at least two elements")
            if any(isinstance(item, ParamsType) for item in items):
                raise _error(self.text, token.column, "a params type cannot be a tuple element")
            return TupleType(tuple(items))
        if token.kind == "ellipsis":
            raise _error(self.text, token.column, "an open prefix is not a closed data type")
        if token.kind == "ident":
            raise _error(
                self.text, token.column,
                f"the named type {token.text!r} is not a closed data type "
                "(expected ℝ[…], idx[N][…], bool[…], a tuple or params NAME)",
            )
        raise self.fail(token, "a sample type (ℝ[…], idx[N][…], bool[…], a tuple or params NAME)")

    def dims(self) -> tuple[Dim, ...]:
        opening = self.peek()
        if opening.text != "[":
            raise self.fail(opening, "'[' and the dimensions ('[]' for a scalar)")
        self.take()
        dims: list[Dim] = []
        if self.peek().text == "]":
            self.take()
            return ()
        while True:
            if len(dims) == MAX_AXES:
                raise _error(self.text, self.peek().column, f"a leaf of more than {MAX_AXES} axes")
            dims.append(self.dim())
            token = self.take()
            if token.text == "]":
                return tuple(dims)
            if token.text != ",":
                raise self.fail(token, "',' or ']'")

    def dim(self) -> Dim:
        token = self.peek()
        if token.kind == "ident" and self.peek(1).text == ":":
            self.take()
            self.take()
            return Dim(self.integer(f"length of axis {token.text!r}"), token.text)
        return Dim(self.integer("dimension"))

    def whole(self) -> SampleType:
        parsed = self.sample_type(0)
        end = self.take()
        if end.kind != "end":
            raise self.fail(end, "the end of the type")
        return parsed


def parse_type(text: str, *, symbols: Mapping[str, int] | None = None) -> SampleType:
    """Parses a sample type, refusing what is not a closed data type (E9001).

    ``symbols`` binds symbolic dimensions, as ``batch(B = 32)`` binds ``B`` in a batch type.

    >>> parse_type("idx[64][seq: 8]")
    IndexType(bound=64, dims=(Dim(size=8, name='seq'),), is_bool=False)
    >>> parse_type("ℝ[B, 2]", symbols={"B": 32}).dims
    (Dim(size=32, name=None), Dim(size=2, name=None))
    """
    if not isinstance(text, str):
        raise NotClosedError(f"a sample type is text, got {type(text).__name__}")
    return _Parser(text, symbols).whole()


def header_text(text: str) -> str:
    """The text a header stores for ``text``: as written, with the ASCII alias ``R`` as ``ℝ``.

    >>> header_text("(R[2], idx[3][])")
    '(ℝ[2], idx[3][])'
    """
    _Parser(text).whole()
    tokens = list(_tokenize(text))  # the text parsed: its tokens are as many as its leaves need
    pieces = []
    last = 0
    for index, token in enumerate(tokens):
        # ``R`` is the real type only where a type starts: not as an axis name (followed by ':')
        # nor as the name after ``params``.
        if token.kind == "ident" and token.text == "R":
            following = tokens[index + 1].text
            previous = tokens[index - 1].text if index else ""
            if following == "[" and previous != "params":
                pieces.append(text[last : token.column - 1])
                pieces.append("ℝ")
                last = token.column
    pieces.append(text[last:])
    return "".join(pieces)


def format_type(parsed: SampleType) -> str:
    """Canonical text of a parsed type (used to name types the program builds)."""
    if isinstance(parsed, ParamsType):
        return f"params {parsed.name}"
    if isinstance(parsed, TupleType):
        return "(" + ", ".join(format_type(item) for item in parsed.items) + ")"
    dims = "[" + ", ".join(f"{d.name}: {d.size}" if d.name else str(d.size) for d in parsed.dims) + "]"
    if isinstance(parsed, RealType):
        return "ℝ" + dims
    if parsed.is_bool:
        return "bool" + dims
    return f"idx[{parsed.bound}]" + dims


__all__ = [
    "MAX_AXES",
    "MAX_INDEX_BOUND",
    "MAX_NESTING",
    "MAX_SAMPLE_ELEMENTS",
    "Dim",
    "IndexType",
    "ParamsType",
    "RealType",
    "SampleType",
    "TupleType",
    "format_type",
    "header_text",
    "parse_type",
]
