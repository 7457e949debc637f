"""Pipeline text, and its evaluation over sample indices: epochs, batches, take, iterator state.

The text (whitespace, newlines included, is free between tokens)::

    pipeline := "stream" PATH ["|>" "shuffle" "(" "seed" "=" INT ")"]
                              "|>" "batch" "(" "B" "=" INT ")"
                              ["|>" "take" "(" "n" "=" INT ")"]
    PATH     := '"' any characters but '"' and newline '"'     -- no escapes
    INT      := decimal digits

for example ``stream "train.psk.d" |> shuffle(seed = 42) |> batch(B = 32) |> take(n = 100)``.
A relative path is relative to the file that holds the text (:func:`load_pipeline`) or to the
base directory the caller names (:func:`parse_pipeline`). A pipeline *file* may only stream a file
inside its own directory, or inside a wider ``root`` its reader names: no absolute path, ``..`` or
symlink takes it elsewhere (a pipeline file found in a shared directory must not make the toolkit
read ``/etc/shadow``). Text the caller passes itself names any path, like any argument. ``seed`` is in ``[0, 2**64)``, ``B`` and
``n`` are at least 1. Text that does not parse is refused with E9010, naming the line and column
and what was expected there.

Evaluation over a file of ``n`` samples, epochs numbered from 1: position ``p`` of epoch ``e``
holds sample ``π_e(p)`` (:mod:`pskd_jax.shuffle`; the identity without ``shuffle``); batch ``j``
holds positions ``jB .. jB + B - 1``; the incomplete last group is dropped and ``take(n = k)``
keeps the first ``k`` batches of each epoch. An :class:`IteratorState` ``(epoch, batch)`` names the
next batch to produce, so saving it after a batch and restoring it resumes the exact stream.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Iterator

import numpy as np

from pskd_jax.errors import BAD_PIPELINE, BAD_VALUE, PskdError
from pskd_jax.sample_type import Dim, Layout, Leaf, SampleType, TupleType, format_type, parse_type
from pskd_jax.shuffle import MAX_N, MAX_SEED, Permutation

# Stage name → (parameter name, smallest value, what is accepted), in the order stages must come.
BLOCK_POSITIONS = 1 << 14  # positions whose order the iterator computes in one pass

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


# --- the pipeline and its state ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IteratorState:
    """The next batch an iterator produces: batch index ``batch`` (from 0) of epoch ``epoch``.

    >>> IteratorState(2, 5).to_json()
    {'epoch': 2, 'batch': 5}
    >>> IteratorState.from_json({'epoch': 2, 'batch': 5})
    IteratorState(epoch=2, batch=5)
    """

    epoch: int = 1
    batch: int = 0

    def __post_init__(self) -> None:
        for name, low in (("epoch", 1), ("batch", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise PskdError(BAD_VALUE, f"iterator state {name} must be an integer >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers become ints, for JSON

    def to_json(self) -> dict[str, int]:
        """A dict for ``json.dumps``."""
        return {"epoch": self.epoch, "batch": self.batch}

    @classmethod
    def from_json(cls, data: Any) -> IteratorState:
        """The state of a :meth:`to_json` dict (as ``json.loads`` gives it back)."""
        if not isinstance(data, dict) or set(data) != {"epoch", "batch"}:
            raise PskdError(BAD_VALUE, f"an iterator state is a dict with keys 'epoch' and 'batch', got {data!r}")
        return cls(epoch=data["epoch"], batch=data["batch"])


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """``stream path [|> shuffle(seed)] |> batch(B) [|> take(n)]`` over sample indices.

    ``path`` is resolved against the base directory (or the pipeline file's directory).

    >>> p = Pipeline("data.psk.d", seed=None, batch_size=4, take=None)
    >>> p.batches_per_epoch(10), p.batch_indices(10, epoch=1, j=1).tolist()
    (2, [4, 5, 6, 7])
    """

    path: str
    seed: int | None
    batch_size: int
    take: int | None = None

    def __post_init__(self) -> None:
        # The parser checks the text; these checks cover a Pipeline built directly.
        object.__setattr__(self, "batch_size", _check_stage_value("batch_size", self.batch_size, 1))
        if self.take is not None:
            object.__setattr__(self, "take", _check_stage_value("take", self.take, 1))
        if self.seed is not None:
            object.__setattr__(self, "seed", _check_stage_value("seed", self.seed, 0, MAX_SEED))

    def __str__(self) -> str:
        stages = [f'stream "{self.path}"']
        if self.seed is not None:
            stages.append(f"shuffle(seed = {self.seed})")
        stages.append(f"batch(B = {self.batch_size})")
        if self.take is not None:
            stages.append(f"take(n = {self.take})")
        return " |> ".join(stages)

    def batches_per_epoch(self, n: int) -> int:
        """floor(n / B) complete batches, at most ``take`` of them.

        >>> Pipeline("x", seed=1, batch_size=3, take=2).batches_per_epoch(10)
        2
        """
        n = _check_count(n)
        full = n // self.batch_size
        return full if self.take is None else min(full, self.take)

    def batch_indices(self, n: int, epoch: int, j: int) -> np.ndarray:
        """The sample indices of batch ``j`` (from 0) of ``epoch`` (from 1): π_epoch(jB + i) for
        i < B, or jB + i without a shuffle.

        int64 (uint64 only when ``n > 2**63``), shape ``(B,)``.
        """
        count = self.batches_per_epoch(n)
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 1:
            raise PskdError(BAD_VALUE, f"epoch must be an integer >= 1 (epochs count from 1), got epoch={epoch!r}")
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < count:
            raise PskdError(BAD_VALUE, f"batch index j must be in [0, {count}) for {self} over {n} samples, got j={j!r}")
        return self._indices(n, int(epoch), int(j))

    def iter_batches(
        self, n: int, state: IteratorState | None = None, *, epochs: int | None = None
    ) -> Iterator[tuple[IteratorState, np.ndarray]]:
        """Yields ``(state, indices)`` for every batch from ``state`` on (default: epoch 1, batch 0).

        The yielded state names the batch *after* the one yielded: save it once the batch is
        used, and a new iterator started from it continues with the next batch. The stream runs
        over epochs 1, 2, … forever, or up to and including epoch ``epochs``.
        """
        count = self.batches_per_epoch(n)
        if count == 0:
            raise PskdError(
                BAD_PIPELINE,
                f"{self} makes no batch of {self.batch_size} from {n} samples: "
                f"the file needs at least {self.batch_size} samples, or a smaller B",
            )
        state = IteratorState() if state is None else state
        if not isinstance(state, IteratorState):
            raise PskdError(BAD_VALUE, f"state must be an IteratorState (IteratorState.from_json), got {state!r}")
        if state.batch > count:
            raise PskdError(
                BAD_VALUE,
                f"iterator state batch {state.batch} is beyond the {count} batches of an epoch of {self} over {n} samples",
            )
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0):
            raise PskdError(BAD_VALUE, f"epochs must be an integer >= 0 (the last epoch to produce), got {epochs!r}")
        return self._iterate(n, count, state, epochs)

    def _iterate(
        self, n: int, count: int, state: IteratorState, epochs: int | None
    ) -> Iterator[tuple[IteratorState, np.ndarray]]:
        epoch, j = state.epoch, state.batch
        # The order is computed for a block of batches at once: one vectorised pass over
        # BLOCK_POSITIONS positions costs little more than over one batch's (SPEC §5 is random
        # access, so a block is as exact as batch by batch), and memory stays O(block).
        per_block = max(1, BLOCK_POSITIONS // self.batch_size)
        while epochs is None or epoch <= epochs:
            while j < count:
                block = min(per_block, count - j)
                indices = self._indices(n, epoch, j, block).reshape(block, self.batch_size)
                for k in range(block):
                    following = IteratorState(epoch, j + 1) if j + 1 < count else IteratorState(epoch + 1, 0)
                    yield following, indices[k]
                    j += 1
            epoch, j = epoch + 1, 0

    def check_batch_type(self, sample_type: str, batch_type: str) -> None:
        """Checks a file's sample type against the batch type a step expects (E9010 otherwise).

        The batch type is the sample type with a leading batch axis on every leaf, written with
        the symbol ``B`` that ``batch(B = n)`` binds (or with n itself).

        >>> p = Pipeline("d.psk.d", seed=None, batch_size=32)
        >>> p.check_batch_type("(idx[64][seq: 8], ℝ[])", "(idx[64][B, seq: 8], ℝ[B])")
        >>> p.check_batch_type("ℝ[3]", "ℝ[B, 4]")
        Traceback (most recent call last):
        ...
        pskd_jax.errors.PskdError: E9010: batch(B = 32) over samples of type 'ℝ[3]' gives batches of type 'ℝ[32, 3]', but the step expects 'ℝ[B, 4]' (= 'ℝ[32, 4]')
        """
        sample = Layout.of_type(sample_type)
        batch = Layout.of_type(parse_type(batch_type, symbols={"B": self.batch_size}))
        stacked = [Leaf(leaf.path, (self.batch_size, *leaf.shape), leaf.bound) for leaf in sample.leaves]
        if sample.structure != batch.structure or stacked != list(batch.leaves):
            given = format_type(_with_batch_axis(parse_type(sample_type), self.batch_size))
            expected = format_type(parse_type(batch_type, symbols={"B": self.batch_size}))
            raise PskdError(
                BAD_PIPELINE,
                f"batch(B = {self.batch_size}) over samples of type {sample_type!r} gives batches of type "
                f"{given!r}, but the step expects {batch_type!r} (= {expected!r})",
            )

    def _indices(self, n: int, epoch: int, j: int, batches: int = 1) -> np.ndarray:
        """π_epoch(jB .. (j + batches)B - 1) without argument checks."""
        dtype = np.int64 if n <= 2**63 else np.uint64
        positions = np.arange(self.batch_size * batches, dtype=dtype)
        positions += dtype(j * self.batch_size)
        if self.seed is None:
            return positions
        return _permutation(n, self.seed, epoch)(positions)


def _with_batch_axis(parsed: SampleType, batch_size: int) -> SampleType:
    """The type of a batch: a leading axis of ``batch_size`` on every leaf."""
    if isinstance(parsed, TupleType):
        return TupleType(tuple(_with_batch_axis(item, batch_size) for item in parsed.items))
    return dataclasses.replace(parsed, dims=(Dim(batch_size), *parsed.dims))


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> Permutation:
    """The permutation of an epoch, kept: deriving its keys costs ~100 µs, a batch far less."""
    return Permutation(n, seed=seed, epoch=epoch)


def _check_stage_value(name: str, value: Any, low: int, high: int | None = None) -> int:
    """A stage's value as an int in [low, high), or PskdError(BAD_PIPELINE) saying what fits."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (high and value >= high):
        accepted = f"an integer in [{low}, 2**64)" if high else f"an integer >= {low}"
        raise PskdError(BAD_PIPELINE, f"{name} must be {accepted}, got {name}={value!r}")
    return int(value)


def _check_count(n: Any) -> int:
    """The number of samples as an int in [0, 2**64]."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_N:
        raise PskdError(BAD_VALUE, f"n (the number of samples) must be an integer in [0, 2**64], got n={n!r}")
    return int(n)


# --- parsing ----------------------------------------------------------------------------------


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
        return PskdError(BAD_PIPELINE, f"{self.source}:{token.line}:{token.column}: {message}")

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
    >>> parse_pipeline('stream "d" |> batch(B = 2x)')
    Traceback (most recent call last):
    ...
    pskd_jax.errors.PskdError: E9010: pipeline:1:26: expected ')' after B = 2, found 'x'
    """
    if not isinstance(text, str):
        raise PskdError(BAD_PIPELINE, f"{source}: a pipeline is text, got {type(text).__name__}")
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
    try:
        with open(file_path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:  # ValueError: not UTF-8 (UnicodeDecodeError), or a NUL in the path
        reason = e.strerror if isinstance(e, OSError) else (
            "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "a path holds no NUL byte")
        raise PskdError(BAD_PIPELINE, f"{file_path}: cannot read the pipeline file: {reason}") from e
    directory = os.path.dirname(os.path.abspath(file_path))
    pipeline = parse_pipeline(text, base_dir=directory, source=file_path)
    check_inside(pipeline.path, directory if root is None else os.fspath(root), file_path)
    return pipeline


def check_inside(path: str, root: str, source: str) -> None:
    """Refuses (E9010) a streamed ``path`` that is not inside ``root`` once resolved."""
    resolved, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([resolved, top]) != top or resolved == top:
        raise PskdError(
            BAD_PIPELINE,
            f"{source}: the stream path {path!r} leads to {resolved}, outside {top}: a pipeline file "
            "streams only files inside its directory, or inside the root it is loaded with (root=, "
            "`pskd pipeline --root`, `train_lm --pipeline_root`); or pass the text itself",
        )
