"""pskd_jax: exact, fast ``.psk.d`` data and checkpoints for JAX.

This module holds the names the README uses: writing and reading a file, the text helpers, the
pipeline and its shuffle, the :class:`Loader`, corpora, checkpoints and the base error. Everything
else lives in its subpackage (:mod:`pskd_jax.format`, :mod:`pskd_jax.data`,
:mod:`pskd_jax.pipeline`, :mod:`pskd_jax.corpus`, :mod:`pskd_jax.checkpoint`,
:mod:`pskd_jax.errors`); ``docs/layout.md`` says what each one holds.

Importing ``pskd_jax`` imports none of its subpackages: each name is taken from its subpackage the
first time it is asked for, so a command loads only what it uses (the data tools answer at once,
a corpus build never loads the checkpoint code), and ``pskd_jax.Loader`` imports
:mod:`pskd_jax.loader` (and JAX) only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pskd_jax._os.lazy import lazy_names

if TYPE_CHECKING:
    from pskd_jax.checkpoint import CheckpointManager, Retention, SaveOptions, restore, save
    from pskd_jax.corpus import BuildOptions, CorpusWindows, Tokenizer, build_corpus, verify_corpus
    from pskd_jax.data import char_vocab, decode, diff, encode
    from pskd_jax.errors import PskdError
    from pskd_jax.format import Reader, Writer, write, write_encoded
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline import IteratorState, Pipeline, load_pipeline, parse_pipeline, shuffle_order

    __version__: str
else:  # hidden from type checkers, which then still catch a misspelt name of this module
    _names, _dir = lazy_names(__name__, {
        "pskd_jax.checkpoint": ("CheckpointManager", "Retention", "SaveOptions", "restore", "save"),
        "pskd_jax.corpus": ("BuildOptions", "CorpusWindows", "Tokenizer", "build_corpus", "verify_corpus"),
        "pskd_jax.data": ("char_vocab", "decode", "diff", "encode"),
        "pskd_jax.errors": ("PskdError",),
        "pskd_jax.format": ("Reader", "Writer", "write", "write_encoded"),
        "pskd_jax.loader": ("Loader",),
        "pskd_jax.pipeline": ("IteratorState", "Pipeline", "load_pipeline", "parse_pipeline", "shuffle_order"),
    }, modules=("_os", "storage", "errors", "format", "data", "pipeline", "corpus", "checkpoint", "loader"))

    def __getattr__(name: str) -> Any:
        """A top-level name, from its subpackage (see :mod:`pskd_jax._os.lazy`); ``__version__``,
        read from the installed metadata (the one source of the version is pyproject.toml) when
        first asked for, as reading it costs tens of milliseconds."""
        if name == "__version__":
            from importlib.metadata import version

            globals()[name] = found = version("pskd_jax")
            return found
        return _names(name)

    def __dir__() -> list[str]:
        return sorted({*_dir(), "__version__"})


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
