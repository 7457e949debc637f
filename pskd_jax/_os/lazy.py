"""A package's names taken from their modules when first asked for.

A package's ``__init__`` that imported every module it exports from would make each command pay
for all of them at start-up (``pskd corpus build`` for the checkpoint code, the data kernels for
the corpus windows). :func:`lazy_names` gives it a module ``__getattr__`` that imports a name's
module the first time the name is read (``from pskd_jax.corpus import Tokenizer`` included) and
keeps the value in the package, and the ``__dir__`` that lists every name. The names themselves
are imported under ``TYPE_CHECKING`` beside it, so type checkers (and the import graph the
structure tests walk) still see where each one comes from.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(package: str, homes: Mapping[str, Sequence[str]], modules: Sequence[str] = ()
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package named ``package``: each name of ``homes[module]``
    read from ``module`` (a full module name) on first use, and each of ``modules`` (the package's
    own subpackages, by their short names) imported when read as an attribute. Any other name is
    an AttributeError naming it."""
    home = {name: module for module, names in homes.items() for name in names}
    below = frozenset(modules)
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in home:
            value = getattr(importlib.import_module(home[name]), name)
        elif name in below:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home, *below})

    return __getattr__, __dir__


__all__ = ["lazy_names"]
