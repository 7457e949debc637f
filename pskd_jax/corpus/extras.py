"""The optional packages of the corpus tools, imported on first use and nowhere else.

The core install has neither: a Hugging Face ``tokenizer.json`` needs ``tokenizers`` (the extra
``pskd_jax[tokenizers]``), a build on Apache Beam needs ``apache-beam`` (``pskd_jax[beam]``). Asking
for either without its package is E9012 naming the extra to install; everything else in the toolkit
imports and runs without them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pskd_jax.errors import UsageError


def _optional(module: str, extra: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"{what} needs the {module!r} package, which is not installed: "
                         f"pip install 'pskd_jax[{extra}]'") from e


def tokenizers_module() -> ModuleType:
    """The ``tokenizers`` package (E9012 naming the extra when it is missing)."""
    return _optional("tokenizers", "tokenizers", "a Hugging Face tokenizer.json")


def beam_module() -> ModuleType:
    """The ``apache_beam`` package (E9012 naming the extra when it is missing)."""
    return _optional("apache_beam", "beam", "a corpus build on Apache Beam (--runner beam)")


__all__ = ["beam_module", "tokenizers_module"]
