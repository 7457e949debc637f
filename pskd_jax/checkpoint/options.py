"""What a save is asked to do, as one value: :class:`SaveOptions`, taken by :func:`save`,
:func:`save_distributed`, :func:`safetensors_to_pskd` and the checkpoint manager.

The options are checked once, when the value is made, with messages that name the parameter; see
``docs/checkpoints.md``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from pskd_jax._os.checks import abridged
from pskd_jax._os.digests import DIGESTS
from pskd_jax.errors import MismatchError, NotClosedError, UsageError
from pskd_jax.format.encodings import Encoding

_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_RESERVED = ("params", "idx", "bool", "R", "ℝ")  # words of the type grammar
_SWITCHES = ("round_to_encoding", "finite_only", "layout_file", "durable")


def is_params_name(name: Any) -> bool:
    """Whether ``name`` can name a ``params`` type: an identifier that is no word of the grammar."""
    return isinstance(name, str) and bool(_IDENTIFIER.fullmatch(name)) and name not in _RESERVED


def check_params_name(name: Any) -> str:
    """``name`` when it can name a ``params`` type; E9001 otherwise."""
    if not is_params_name(name):
        raise NotClosedError(f"params name {name!r:.80}: expected an identifier such as 'MiniGPT'")
    return name


def check_digest_name(digest: Any) -> str | None:
    """``digest``: None (no digest) or an algorithm of :data:`pskd_jax._os.digests.DIGESTS`; E9012
    naming the parameter otherwise."""
    if digest is None or (isinstance(digest, str) and digest in DIGESTS):
        return digest
    raise UsageError(f"digest={abridged(digest, 80)}: expected one of {sorted(DIGESTS)}, or None for no digest")


def _checked_encodings(encodings: Any) -> Any:
    """``encodings`` as a save takes it (None, one label, a sequence in storage order, or a dict
    from key path to label), copied so that the caller's later changes do not reach the value.
    The labels themselves are checked against the tree, when it is planned."""
    if encodings is None or isinstance(encodings, (str, Encoding)):
        return encodings
    if isinstance(encodings, Mapping):
        return dict(encodings)
    if isinstance(encodings, (bytes, bytearray)):
        raise MismatchError(f"encodings={encodings!r:.80}: expected a label, a sequence or a dict")
    try:
        return tuple(encodings)
    except TypeError:
        raise MismatchError(f"encodings={encodings!r:.80}: expected a label, a sequence or a dict") from None


@dataclasses.dataclass(frozen=True)
class SaveOptions:
    """How a checkpoint is saved.

    - ``name``: the ``params`` type's name (default: the class name of a dataclass or NamedTuple
      root, else ``Params``);
    - ``encodings``: the encoding of real leaves: one label (``"bf16"``) for all, a sequence in
      storage order, or a dict from key path to label; narrowing needs ``round_to_encoding=True``
      (half-even, the largest error per leaf reported in the result's ``rounding``);
    - ``finite_only``: refuse NaN and ±Inf (E9004 naming the key path and index) instead of saving
      them bit for bit;
    - ``digest``: the whole file's digest to compute while writing, in the result's ``digests``:
      ``"xxh3_128"`` (fast; what a checkpoint directory records), ``"sha256"`` (as ``sha256sum``
      prints it) or None;
    - ``layout_file``: write ``NAME.layout.json`` beside a ``params`` checkpoint;
    - ``durable``: sync the file and its directory before returning.

    >>> SaveOptions(encodings="bf16", round_to_encoding=True, digest="sha256").encodings
    'bf16'
    >>> SaveOptions(durable="yes")
    Traceback (most recent call last):
    pskd_jax.errors.UsageError: E9012: SaveOptions durable='yes': expected True or False
    """

    name: str | None = None
    encodings: Any = None
    round_to_encoding: bool = False
    finite_only: bool = False
    digest: str | None = None
    layout_file: bool = True
    durable: bool = True

    def __post_init__(self) -> None:
        for switch in _SWITCHES:
            value = getattr(self, switch)
            if not isinstance(value, (bool, np.bool_)):
                raise UsageError(f"SaveOptions {switch}={abridged(value, 80)}: expected True or False")
            object.__setattr__(self, switch, bool(value))
        if self.name is not None:
            check_params_name(self.name)
        check_digest_name(self.digest)
        object.__setattr__(self, "encodings", _checked_encodings(self.encodings))

    def replace(self, **changes: Any) -> SaveOptions:
        """These options with some changed (checked again)."""
        return dataclasses.replace(self, **changes)


def save_options(options: Any, what: str = "options") -> SaveOptions:
    """``options`` as :class:`SaveOptions` (None: the defaults); E9012 naming ``what`` otherwise."""
    if options is None:
        return SaveOptions()
    if not isinstance(options, SaveOptions):
        raise UsageError(f"{what}={abridged(options, 80)}: expected SaveOptions(...) or None")
    return options


__all__ = ["SaveOptions", "check_digest_name", "check_params_name", "is_params_name", "save_options"]
