"""The pipeline text: parsing it (:func:`parse_pipeline`) and reading it from a file
(:func:`load_pipeline`) into a :class:`Pipeline`.

The grammar, how relative paths resolve, why a pipeline file may stream only inside its own
directory (or a ``root`` its reader names), and the E9010 messages are defined in
``docs/pipeline.md`` ("The text"); the evaluation over sample indices is in
:mod:`pskd_jax.pipeline.batches`.
"""

from __future__ import annotations

import dataclasses
import os
import re

from pskd_jax._os.files import read_whole
from pskd_jax.errors import PipelineError, PskdError
from pskd_jax.pipeline.batches import Pipeline
from pskd_jax.pipeline.shuffle import MAX_SEED

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
      | (?P<string>"[^"\n]*")
      | (?P<open_string>"[^"\n]*)
      | (?P<pipe>\|>)
      | (?P<int>[0-9]+)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[()=])
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # string, open_string, pipe, int, name, punct, other, end
    text: str
    line: int
    column: int

    def shown(self) -> str:
        """How an error message names what it found."""
        return "the end of the text" if self.kind == "end" else repr(self.text)


def _tokenize(text: str) -> list[_Token]:
    """The tokens of ``text`` with 1-based line and column, whitespace dropped, an end token last."""
    tokens, line, line_start = [], 1, 0
    for match in _TOKEN.finditer(text):
        kind, start = match.lastgroup or "other", match.start()
        if kind != "space":
            tokens.append(_Token(kind, match.group(), line, start - line_start + 1))
        newlines = match.group().count("\n")
        if newlines:
            line += newlines
            line_start = start + match.group().rindex("\n") + 1
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

    def parse(self) -> tuple[str, dict[str, tuple[int, _Token]]]:
        """The path as written and each stage's value with the token of its name."""
        self.binding()
        self.expect("name", "stream", "'stream'")
        self.where = "after stream"
        path_token = self.expect("string", None, 'a quoted path ("…")')
        path = path_token.text[1:-1]
        if not path:
            raise self.fail(path_token, "expected a non-empty path between the quotes")
        if "\0" in path:
            raise self.fail(path_token, "a path holds no NUL character")
        self.where = f"after stream {path_token.text}"
        stages: dict[str, tuple[int, _Token]] = {}
        while self.peek().kind != "end":
            self.expect("pipe", None, "'|>' or the end of the pipeline")
            name_token, value = self.stage()
            self.check_order(stages, name_token)
            stages[name_token.text] = (value, name_token)
        if "batch" not in stages:
            raise self.fail(self.peek(), f"expected '|> batch(B = n)' {self.where}: every pipeline batches")
        return path, stages

    def binding(self) -> bool:
        """Skips ``NAME =`` before the pipeline (the name a program binds it to); whether it did."""
        first, second = self.tokens[0], self.tokens[1] if len(self.tokens) > 1 else None
        if first.kind == "name" and second is not None and second.kind == "punct" and second.text == "=":
            self.position = 2
            self.where = f"after {first.text} ="
            return True
        return False

    def stage(self) -> tuple[_Token, int]:
        """One ``name(param = INT)`` after ``|>``."""
        name_token = self.peek()
        if name_token.kind != "name" or name_token.text not in _STAGES:
            raise self.fail(name_token, f"expected a stage (shuffle, batch or take) after '|>', found {name_token.shown()}")
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
        value = int(value_token.text)
        high = MAX_SEED if name_token.text == "shuffle" else None
        if value < low or (high is not None and value >= high):
            raise self.fail(value_token, f"{parameter} must be {accepted}, got {parameter} = {value}")
        self.where = f"after {parameter} = {value}"
        self.expect("punct", ")", "')'")
        self.where = f"after {name_token.text}({parameter} = {value})"
        return name_token, value

    def check_order(self, stages: dict[str, tuple[int, _Token]], token: _Token) -> None:
        """Refuses a repeated stage and one out of the order shuffle, batch, take."""
        name = token.text
        if name in stages:
            first = stages[name][1]
            raise self.fail(token, f"duplicate stage '{name}' (first at {first.line}:{first.column}): each stage appears once")
        later = [s for s in stages if _STAGE_ORDER.index(s) > _STAGE_ORDER.index(name)]
        if later:
            raise self.fail(token, f"stage '{name}' must come before '{later[0]}': the order is stream, shuffle, batch, take")


def parse_pipeline(text: str, *, base_dir: str | os.PathLike[str] = ".", source: str = "pipeline") -> Pipeline:
    """The :class:`Pipeline` of ``text``; a relative path is joined to ``base_dir``.

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
    path, stages = _Parser(text, source).parse()
    values = {name: value for name, (value, _) in stages.items()}
    return Pipeline(
        path=_resolve(path, base_dir),
        seed=values.get("shuffle"),
        batch_size=values["batch"],
        take=values.get("take"),
    )


def _resolve(path: str, base_dir: str | os.PathLike[str]) -> str:
    """``path`` joined to ``base_dir`` (as written: no ``..`` folded, symlinks keep their meaning)."""
    base = os.fspath(base_dir)
    return path if base in ("", ".") else os.path.join(base, path)


def load_pipeline(file_path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Pipeline:
    """The pipeline written in a UTF-8 text file; its path is relative to that file's directory.

    The file it streams must lie inside ``root`` (default: the pipeline file's directory) once
    ``..`` and symlinks are resolved; anything else is refused with E9010.
    """
    file_path = os.fspath(file_path)
    # A regular file only: a FIFO or a device is refused (E9002) at once, never waited on.
    raw = read_whole(file_path, PipelineError, what="the pipeline file", limit=MAX_PIPELINE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PipelineError(f"{file_path}: cannot read the pipeline file: not UTF-8 text") from e
    directory = os.path.dirname(os.path.abspath(file_path))
    pipeline = parse_pipeline(text, base_dir=directory, source=file_path)
    check_inside(pipeline.path, directory if root is None else os.fspath(root), file_path)
    return pipeline


def check_inside(path: str, root: str, source: str) -> None:
    """Refuses (E9010) a streamed ``path`` that is not inside ``root`` once resolved."""
    resolved, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([resolved, top]) != top or resolved == top:
        raise PipelineError(f"{source}: the stream path {path!r} leads to {resolved}, outside {top}: a pipeline file "
                            "streams only files inside its directory, or inside the root it is loaded with (root=, "
                            "`pskd pipeline --root`, `train_lm --pipeline_root`); or pass the text itself")


__all__ = ["check_inside", "load_pipeline", "parse_pipeline"]
