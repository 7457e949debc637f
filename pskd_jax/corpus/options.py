"""The settings of a corpus build, as one value: :class:`BuildOptions`.

Every engine takes it — the local process pool (:func:`pskd_jax.corpus.build_corpus`), Apache Beam
(:func:`pskd_jax.corpus.build_corpus_beam`) and the one-shard step they share
(:func:`pskd_jax.corpus.build_shard`) — and it is checked once, when it is made, so a bad setting
is refused before any file is touched. See ``docs/corpus.md`` (Building).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pskd_jax._os.checks import abridged, checked_integer
from pskd_jax.corpus.manifest import BUILD_KEYS, MAX_COUNT
from pskd_jax.corpus.shard_writer import DEFAULT_CHUNK_TOKENS
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import UsageError


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How a corpus is built. The fields named in the manifest's ``build`` object
    (:data:`pskd_jax.corpus.manifest.BUILD_KEYS`: ``text_key``, ``max_document_tokens``,
    ``skip_bad``) and the tokenizer decide a shard's bytes; ``chunk_tokens`` (tokens appended
    between two updates of a shard's header count), ``workers`` (shards built at once) and
    ``durable`` (sync what is written) change how it is written, never what.

    >>> BuildOptions(max_document_tokens=512).recorded()
    {'text_key': 'text', 'max_document_tokens': 512, 'skip_bad': False}
    >>> BuildOptions(workers=0)
    Traceback (most recent call last):
    pskd_jax.errors.UsageError: E9012: workers=0: expected an integer >= 1
    """

    tokenizer: Tokenizer = dataclasses.field(default_factory=Tokenizer.bytes)
    text_key: str = "text"
    max_document_tokens: int | None = None
    skip_bad: bool = False
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    workers: int = 1
    durable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, Tokenizer):
            raise UsageError(f"tokenizer={abridged(self.tokenizer, 80)}: expected a Tokenizer (Tokenizer.bytes(), "
                             "Tokenizer.chars(vocab) or Tokenizer.from_file('tokenizer.json'))")
        if not isinstance(self.text_key, str) or not self.text_key:
            raise UsageError(f"text_key={abridged(self.text_key, 80)}: expected a non-empty string")
        limit = checked_integer(self.max_document_tokens, "max_document_tokens", low=1, none=True)
        if limit is not None and limit > MAX_COUNT:  # the manifest records it as a 64-bit count
            checked_integer(limit, "max_document_tokens", low=1, high=MAX_COUNT)
        # Normalised once here (a numpy integer becomes an int), so the manifest records plain JSON.
        object.__setattr__(self, "max_document_tokens", limit)
        object.__setattr__(self, "chunk_tokens", checked_integer(self.chunk_tokens, "chunk_tokens", low=1))
        object.__setattr__(self, "workers", checked_integer(self.workers, "workers", low=1))
        for name in ("skip_bad", "durable"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise UsageError(f"{name}={abridged(value, 80)}: expected True or False")
            object.__setattr__(self, name, bool(value))

    @classmethod
    def checked(cls, options: Any) -> BuildOptions:
        """``options`` as an engine takes it: the defaults for None, a BuildOptions as it is, and
        anything else refused (E9012)."""
        if options is None:
            return cls()
        if not isinstance(options, cls):
            raise UsageError(f"options={abridged(options, 80)}: expected a BuildOptions (or None for the defaults)")
        return options

    def recorded(self) -> dict[str, Any]:
        """The settings the manifest's ``build`` object records (and a rerun compares), in its order."""
        return {key: getattr(self, key) for key in BUILD_KEYS}

    def replace(self, **changes: Any) -> BuildOptions:
        """These options with ``changes`` (checked as a new value is)."""
        return dataclasses.replace(self, **changes)


__all__ = ["BuildOptions"]
