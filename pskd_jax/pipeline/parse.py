"""The pipeline text: parsing it (:func:`parse_pipeline`) and reading it from a file
(:func:`load_pipeline`) into a :class:`Pipeline`.

The grammar, how relative paths resolve, why a pipeline file may stream only inside its own
directory (or a ``root`` its reader names), and the E9010 messages are defined in
``docs/pipeline.md`` ("The text"), mixtures (``mix(…)``, :mod:`pskd_jax.pipeline.mixture`) included; the
evaluation over sample indices is in :mod:`pskd_jax.pipeline.batches`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from fractions import Fraction

from pskd_jax._os.files import read_whole
from pskd_jax.errors import PipelineError, PskdError
from pskd_jax.pipeline.batches import Pipeline
from pskd_jax.pipeline.mixture import MAX_BATCH_SIZE, MAX_SOURCES, MixSource, Mixture
from pskd_jax.pipeline.shuffle import MAX_SEED
from pskd_jax.storage.urls import is_url

MAX_PIPELINE_BYTES = 1 << 24  # far more than any pipeline text; a larger file is refused unread


__all__ = ["check_inside", "load_pipeline", "parse_pipeline"]

_STAGES = {
    "shuffle": ("seed", 0, "an integer in [0, 2**64)"),
    "batch": ("B", 1, "an integer >= 1"),
    "take": ("n", 1, "an integer >= 1"),
}

_STAGE_ORDER = tuple(_STAGES)

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<string>"[^"\r\n]*")
      | (?P<open_string>"[^"\r\n]*)
      | (?P<pipe>\|>)
      | (?P<int>[0-9]+)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[()=:,])
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_LINE_END = re.compile(r"\r\n|\r|\n")  # each ends a line, as editors count them (CRLF is one)


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # string, open_string, pipe, int, name, punct, other, end
    text: str
    line: int
    column: int

    def shown(self) -> str:
        """How an error message names what it found."""
        return "the end of the text" if self.kind == "end" else repr(self.text)

    def touches(self, following: _Token) -> bool:
        """Whether ``following`` starts right where this token ends (no space between)."""
        return following.line == self.line and following.column == self.column + len(self.text)

    def spelled(self, kind: str, text: str) -> bool:
        return self.kind == kind and self.text == text


@dataclasses.dataclass(frozen=True)
class _Source:
    """A stream as the text writes it: its path, seed, weight (in a mix) and 'stream' token."""

    path: str
    seed: int | None
    weight: Fraction | None
    token: _Token


def _tokenize(text: str) -> list[_Token]:
    """The tokens of ``text`` with 1-based line and column, whitespace dropped, an end token last."""
    tokens, line, line_start = [], 1, 0
    for match in _TOKEN.finditer(text):
        kind, start = match.lastgroup or "other", match.start()
        if kind != "space":
            tokens.append(_Token(kind, match.group(), line, start - line_start + 1))
        ends = [end.end() for end in _LINE_END.finditer(match.group())]
        if ends:
            line += len(ends)
            line_start = start + ends[-1]
    tokens.append(_Token("end", "", line, len(text) - line_start + 1))
    return tokens


class _Parser:
    """Recursive descent over the tokens; every error names where and what was expected."""

    def __init__(self, text: str, source: str):
        self.tokens = _tokenize(text)
        self.position = 0
        self.source = source
        self.where = "at the start of the pipeline"  # where the next token is, for error messages

    def peek(self) -> _Token:
        return self.tokens[self.position]

    def fail(self, token: _Token, message: str) -> PskdError:
        return PipelineError(f"{self.source}:{token.line}:{token.column}: {message}")

    def expect(self, kind: str, text: str | None, wanted: str) -> _Token:
        """The next token if it is of ``kind`` (and spelled ``text``), else an error."""
        token = self.peek()
        if token.kind != kind or (text is not None and token.text != text):
            if token.kind == "open_string":
                raise self.fail(token, f"unterminated path {token.text}: expected a closing '\"' on the same line")
            raise self.fail(token, f"expected {wanted} {self.where}, found {token.shown()}")
        self.position += 1
        return token

    def parse(self) -> tuple[_Token | None, list[_Source], dict[str, tuple[int, _Token]]]:
        """The 'mix' token (None for a single stream), the streams, and each stage's value with the
        token of its name."""
        self.binding()
        if self.peek().spelled("name", "mix"):
            return self.mixture()
        token = self.expect("name", "stream", "'stream'")
        path = self.stream_path()
        stages: dict[str, tuple[int, _Token]] = {}
        while self.peek().kind != "end":
            self.expect("pipe", None, "'|>' or the end of the pipeline")
            name_token, value = self.stage()
            self.check_order(stages, name_token)
            stages[name_token.text] = (value, name_token)
        if "batch" not in stages:
            raise self.fail(self.peek(), f"expected '|> batch(B = n)' {self.where}: every pipeline batches")
        seed = stages.pop("shuffle")[0] if "shuffle" in stages else None
        return None, [_Source(path, seed, None, token)], stages

    def stream_path(self) -> str:
        """The quoted path after 'stream'."""
        self.where = "after stream"
        path_token = self.expect("string", None, 'a quoted path ("…")')
        path = path_token.text[1:-1]
        if not path:
            raise self.fail(path_token, "expected a non-empty path between the quotes")
        if "\0" in path:
            raise self.fail(path_token, "a path holds no NUL character")
        self.where = f"after stream {path_token.text}"
        return path

    def mixture(self) -> tuple[_Token, list[_Source], dict[str, tuple[int, _Token]]]:
        """``mix(source : weight, …) |> batch(…) [|> take(…)]`` from its 'mix' token on."""
        mix_token = self.peek()
        self.position += 1
        self.where = "after mix"
        self.expect("punct", "(", "'('")
        self.where = "after mix("
        sources: list[_Source] = []
        while True:
            if len(sources) == MAX_SOURCES:
                raise self.fail(self.peek(), f"a mix names at most {MAX_SOURCES} sources")
            sources.append(self.mix_source())
            token = self.peek()
            if token.spelled("punct", ","):
                self.position += 1
                self.where = "after ','"
                if not self.peek().spelled("punct", ")"):  # a comma may end the list
                    continue
                token = self.peek()
            if not token.spelled("punct", ")"):
                raise self.fail(token, f"expected ',' or ')' {self.where}, found {token.shown()}")
            self.position += 1
            break
        if len(sources) == 1:
            raise self.fail(mix_token, "a mix of one source: a mix has two sources or more (a single source is "
                                       "written as a stream, without mix)")
        self.where = "after mix(…)"
        stages: dict[str, tuple[int, _Token]] = {}
        while self.peek().kind != "end":
            self.expect("pipe", None, "'|>' or the end of the pipeline")
            if self.peek().spelled("name", "shuffle"):
                raise self.fail(self.peek(), "shuffle after a mix: each source shuffles itself, inside the mix "
                                             '(mix(stream "…" |> shuffle(seed = s) : w, …))')
            name_token, value = self.stage(in_mix=True)
            self.check_order(stages, name_token)
            stages[name_token.text] = (value, name_token)
        if "batch" not in stages:
            raise self.fail(self.peek(), f"expected '|> batch(B = n)' {self.where}: every pipeline batches")
        return mix_token, sources, stages

    def mix_source(self) -> _Source:
        """``stream PATH [|> shuffle(seed = s)] : WEIGHT`` inside a mix."""
        token = self.peek()
        if token.spelled("name", "mix"):
            raise self.fail(token, "a mix inside a mix: the sources of a mix are streams (list the inner mix's "
                                   "streams in the outer one, each with its own weight)")
        if not token.spelled("name", "stream"):
            raise self.fail(token, f"expected a source (stream \"…\" [|> shuffle(seed = s)] : weight) {self.where}, "
                                   f"found {token.shown()}")
        self.position += 1
        path = self.stream_path()
        seed = None
        while self.peek().kind == "pipe":
            self.position += 1
            name = self.peek()
            if name.kind == "name" and name.text in ("batch", "take"):
                raise self.fail(name, f"{name.text} inside a mix's source: batch and take apply to the whole mix, "
                                      "after its ')'")
            if not name.spelled("name", "shuffle"):
                raise self.fail(name, f"expected 'shuffle' after '|>' in a mix's source, found {name.shown()}")
            if seed is not None:
                raise self.fail(name, "duplicate stage 'shuffle' in a mix's source: each stage appears once")
            seed = self.stage()[1]
        colon = self.peek()
        if not colon.spelled("punct", ":"):
            raise self.fail(colon, f"missing weight: expected ': WEIGHT' {self.where} (each source of a mix has a "
                                   f"weight), found {colon.shown()}")
        self.position += 1
        return _Source(path, seed, self.weight(), token)

    def weight(self) -> Fraction:
        """A weight after ':': digits, with a decimal point and digits, written without spaces."""
        self.where = "after ':'"
        accepted = "a positive number (such as 3 or 0.25)"
        token = self.peek()
        if token.spelled("other", "-"):
            following = self.tokens[self.position + 1]
            shown = f"-{following.text}" if following.kind == "int" and token.touches(following) else "-"
            raise self.fail(token, f"weight must be {accepted}, got {shown}")
        if token.kind != "int":
            raise self.fail(token, f"expected a weight, {accepted}, after ':', found {token.shown()}")
        self.position += 1
        text, last = token.text, token
        point = self.peek()
        if point.spelled("other", ".") and last.touches(point):
            self.position += 1
            digits = self.peek()
            if digits.kind != "int" or not point.touches(digits):
                raise self.fail(digits, f"expected the digits after the decimal point of weight {text}., found "
                                        f"{digits.shown()}")
            self.position += 1
            text, last = f"{text}.{digits.text}", digits
        after = self.peek()
        if after.kind == "name" and last.touches(after):  # (0x1, 1_000, 1e5: never the digits before them)
            if after.text[0] in "eE":
                raise self.fail(token, f"weight {text}{after.text}…: a weight has no exponent (write it in plain "
                                       "digits, such as 100000 or 0.00001)")
            raise self.fail(token, f"weight {text}{after.text}…: a weight is written in decimal digits (such as 3 "
                                   "or 0.25)")
        if len(text) > 40:
            raise self.fail(token, f"weight {text[:20]}… has {len(text)} characters: a weight has at most 40")
        value = Fraction(text)
        if value == 0:
            raise self.fail(token, f"weight must be {accepted}, got {text}")
        self.where = f"after the weight {text}"
        return value

    def binding(self) -> bool:
        """Skips ``NAME =`` before the pipeline (the name a program binds it to); whether it did."""
        first, second = self.tokens[0], self.tokens[1] if len(self.tokens) > 1 else None
        if first.kind == "name" and second is not None and second.kind == "punct" and second.text == "=":
            self.position = 2
            self.where = f"after {first.text} ="
            return True
        return False

    def stage(self, *, in_mix: bool = False) -> tuple[_Token, int]:
        """One ``name(param = INT)`` after ``|>`` (``in_mix``: after a mix's ``)``)."""
        name_token = self.peek()
        if name_token.kind != "name" or name_token.text not in _STAGES:
            raise self.fail(name_token, "expected a stage (shuffle, batch or take) after '|>', "
                                        f"found {name_token.shown()}")
        self.position += 1
        parameter, low, accepted = _STAGES[name_token.text]
        self.where = f"after {name_token.text}"
        self.expect("punct", "(", "'('")
        self.where = f"after {name_token.text}("
        self.expect("name", parameter, f"'{parameter}'")
        self.where = f"after {name_token.text}({parameter}"
        self.expect("punct", "=", "'='")
        self.where = f"after {parameter} ="
        value_token = self.expect("int", None, accepted)
        digits = value_token.text.lstrip("0")
        if len(digits) > 40:  # far beyond 2**64 (and int() refuses over 4300 digits)
            raise self.fail(value_token, f"{parameter} must be {accepted}, got {parameter} = {digits[:20]}… "
                                         f"({len(digits)} digits)")
        value = int(digits or "0")  # the digits without their leading zeros: int() counts the zeros too
        high = MAX_SEED if name_token.text == "shuffle" else None
        if value < low or (high is not None and value >= high):
            raise self.fail(value_token, f"{parameter} must be {accepted}, got {parameter} = {value}")
        if in_mix and name_token.text == "batch" and value > MAX_BATCH_SIZE:  # (a mix's stream would have none)
            raise self.fail(value_token, f"B must be at most {MAX_BATCH_SIZE} (2**63 - 1) in a mix, got B = {value}: "
                                         "a mix's positions end there, and a larger batch makes none")
        self.where = f"after {parameter} = {value}"
        self.expect("punct", ")", "')'")
        self.where = f"after {name_token.text}({parameter} = {value})"
        return name_token, value

    def check_order(self, stages: dict[str, tuple[int, _Token]], token: _Token) -> None:
        """Refuses a repeated stage and one out of the order shuffle, batch, take."""
        name = token.text
        if name in stages:
            first = stages[name][1]
            raise self.fail(token, f"duplicate stage '{name}' (first at {first.line}:{first.column}): "
                                   "each stage appears once")
        later = [s for s in stages if _STAGE_ORDER.index(s) > _STAGE_ORDER.index(name)]
        if later:
            raise self.fail(token, f"stage '{name}' must come before '{later[0]}': "
                                   "the order is stream, shuffle, batch, take")


def parse_pipeline(text: str, *, base_dir: str | os.PathLike[str] = ".",
                   source: str = "pipeline") -> Pipeline | Mixture:
    """The :class:`Pipeline` (or :class:`Mixture`) of ``text``; a relative path is joined to ``base_dir``.

    ``source`` names the text in error messages (``source:line:column: …``).

    >>> parse_pipeline('stream "d.psk.d" |> shuffle(seed = 7) |> batch(B = 2)', base_dir="/data")
    Pipeline(path='/data/d.psk.d', seed=7, batch_size=2, take=None)
    >>> parse_pipeline('data = stream "d.psk.d" |> batch(B = 2)').batch_size
    2
    >>> parse_pipeline('stream "d" |> batch(B = 2x)')
    Traceback (most recent call last):
    ...
    pskd_jax.errors.PipelineError: E9010: pipeline:1:26: expected ')' after B = 2, found 'x'
    """
    if not isinstance(text, str):
        raise PipelineError(f"{source}: a pipeline is text, got {type(text).__name__}")
    mix_token, streams, stages = _Parser(text, source).parse()
    values = {name: value for name, (value, _) in stages.items()}
    if mix_token is None:
        (stream,) = streams
        batch = stages["batch"][1]
        return Pipeline(path=_resolve(stream.path, base_dir), seed=stream.seed, batch_size=values["batch"],
                        take=values.get("take"), where=f"{source}:{batch.line}:{batch.column}")
    sources = []
    for s in streams:
        assert s.weight is not None  # (the parser asks each source of a mix for its weight)
        sources.append(MixSource(_resolve(s.path, base_dir), s.seed, s.weight,
                                 f"{source}:{s.token.line}:{s.token.column}"))
    try:
        return Mixture(tuple(sources), batch_size=values["batch"], take=values.get("take"))
    except PipelineError as e:  # the weights' total: named at the mix (a source's own fault: at the source)
        placed = e.message.startswith(f"{source}:")
        raise PipelineError(e.message if placed else f"{source}:{mix_token.line}:{mix_token.column}: {e.message}") \
            from None


def _resolve(path: str, base_dir: str | os.PathLike[str]) -> str:
    """``path`` joined to ``base_dir`` (as written: no ``..`` folded, symlinks keep their meaning);
    a URL (``s3://…``) as it is."""
    base = os.fspath(base_dir)
    return path if base in ("", ".") or is_url(path) else os.path.join(base, path)


def load_pipeline(file_path: str | os.PathLike[str], *,
                  root: str | os.PathLike[str] | None = None) -> Pipeline | Mixture:
    """The pipeline written in a UTF-8 text file; its path is relative to that file's directory.

    The file it streams must lie inside ``root`` (default: the pipeline file's directory) once
    ``..`` and symlinks are resolved; anything else is refused with E9010.
    """
    file_path = os.fspath(file_path)
    # A regular file only: a FIFO or a device is refused (E9002) at once, never waited on.
    raw = read_whole(file_path, PipelineError, what="the pipeline file", limit=MAX_PIPELINE_BYTES)
    try:
        text = raw.decode("utf-8-sig")  # (the byte-order mark some editors put first is no text)
    except UnicodeDecodeError as e:
        raise PipelineError(f"{file_path}: cannot read the pipeline file: not UTF-8 text") from e
    directory = os.path.dirname(os.path.abspath(file_path))
    pipeline = parse_pipeline(text, base_dir=directory, source=file_path)
    for path in pipeline.paths if isinstance(pipeline, Mixture) else (pipeline.path,):
        check_inside(path, directory if root is None else os.fspath(root), file_path)
    return pipeline


def check_inside(path: str, root: str, source: str) -> None:
    """Refuses (E9010) a streamed local ``path`` that is not inside ``root`` once resolved. A URL is
    taken as it is: the rule keeps a pipeline file inside the local tree it came with, and an
    object of a store is no path of that tree (realpath would make one of the current directory)."""
    if is_url(path):
        return
    resolved, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([resolved, top]) != top or resolved == top:
        raise PipelineError(f"{source}: the stream path {path!r} leads to {resolved}, outside {top}: a pipeline file "
                            "streams only files inside its directory, or inside the root it is loaded with (root=, "
                            "`pskd pipeline --root`, `train_lm --pipeline_root`); or pass the text itself")


__all__ = ["check_inside", "load_pipeline", "parse_pipeline"]
