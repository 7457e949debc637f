"""pskd_jax: exact, fast ``.psk.d`` data and checkpoints for JAX.

This module holds the names the README uses: writing and reading a file, the text helpers, the
pipeline and its shuffle, the :class:`Loader`, corpora, checkpoints and the base error. Everything
else lives in its subpackage (:mod:`pskd_jax.format`, :mod:`pskd_jax.data`,
:mod:`pskd_jax.pipeline`, :mod:`pskd_jax.corpus`, :mod:`pskd_jax.checkpoint`,
:mod:`pskd_jax.errors`); ``docs/layout.md`` says what each one holds.

Importing ``pskd_jax`` does not import JAX, so the data tools answer at once: ``pskd_jax.Loader``
imports :mod:`pskd_jax.loader` (and JAX) the first time it is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pskd_jax.checkpoint import CheckpointManager, Retention, SaveOptions, restore, save
from pskd_jax.corpus import BuildOptions, CorpusWindows, Tokenizer, build_corpus, verify_corpus
from pskd_jax.data import char_vocab, decode, diff, encode
from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, Writer, write, write_encoded
from pskd_jax.pipeline import IteratorState, Pipeline, load_pipeline, parse_pipeline, shuffle_order

if TYPE_CHECKING:
    from pskd_jax.loader import Loader

    __version__: str
else:  # hidden from type checkers, which then still catch a misspelt name of this module

    def __getattr__(name: str) -> Any:
        """``pskd_jax.Loader``: its module imports JAX, so it is loaded when first asked for;
        ``__version__``: read from the installed metadata (the one source of the version is
        pyproject.toml) when first asked for, as reading it costs tens of milliseconds."""
        if name == "Loader":
            from pskd_jax.loader import Loader

            return Loader
        if name == "__version__":
            import importlib.metadata

            version = globals()["__version__"] = importlib.metadata.version("pskd_jax")
            return version
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "Loader", "__version__"})


__all__ = [
    "BuildOptions",
    "CheckpointManager",
    "CorpusWindows",
    "IteratorState",
    "Loader",
    "Pipeline",
    "PskdError",
    "Reader",
    "Retention",
    "SaveOptions",
    "Tokenizer",
    "Writer",
    "build_corpus",
    "char_vocab",
    "decode",
    "diff",
    "encode",
    "load_pipeline",
    "parse_pipeline",
    "restore",
    "save",
    "shuffle_order",
    "verify_corpus",
    "write",
    "write_encoded",
]
