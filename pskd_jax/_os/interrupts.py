"""A Ctrl-C is honoured even when a library swallowed the ``KeyboardInterrupt`` it raised.

numpy's casts from text to numbers (``np.array(["1"]).astype(np.uint64)``, ``float64`` alike, as
``pack`` converts its values) run Python's signal handler inside the cast and lose the exception it
raises: the command went on and replaced its destination as though no Ctrl-C had come. With
:func:`install` (the command line calls it), the handler also records the interrupt, and
:func:`check`, called before an output is put in place and between the blocks a writer appends,
raises it again.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_interrupted = False


def _note_and_raise(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def install() -> None:
    """Records every SIGINT from now on (where Python's own handler is the one installed: a
    program that chose another keeps it), in the main thread only, as signal handlers must be."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _note_and_raise)


def check() -> None:
    """Raises ``KeyboardInterrupt`` when a SIGINT came since :func:`install`, swallowed or not."""
    if _interrupted:
        raise KeyboardInterrupt


def noted() -> bool:
    """Whether a SIGINT came since :func:`install`: what an error raised meanwhile (a library's own,
    made while a ``KeyboardInterrupt`` unwound through it) owes its being to."""
    return _interrupted


__all__ = ["check", "install", "noted"]
