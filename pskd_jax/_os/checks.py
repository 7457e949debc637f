"""The small checks and message pieces every part of the toolkit shares, each written once.

- :func:`mode_words`: what ``stat`` found at a path, in words;
- :func:`is_integer` and :func:`checked_integer`: an integer argument or JSON value in a range
  (``numpy`` integers accepted, booleans refused, one wording of the refusal);
- :func:`abridged`, :func:`abridged_list`: a value or a list shortened for a message;
- :func:`first_true`: the flat index of the first element a mask marks (the first bad value);
- :func:`not_below`: the words for an index at or above its bound.

Private to ``pskd_jax``: do not import this module from outside the package.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np

from pskd_jax.errors import PskdError, UsageError

_MODES = ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def mode_words(mode: int) -> str:
    """What an ``lstat``/``fstat`` mode is, in words.

    >>> import stat
    >>> mode_words(stat.S_IFDIR | 0o755), mode_words(stat.S_IFIFO)
    ('a directory', 'a named pipe (FIFO)')
    """
    for test, words in _MODES:
        if test(mode):
            return words
    return "not a regular file"


def integer(text: str) -> int:
    """A command line's integer: decimal ASCII digits, perhaps after one sign. ``int()`` alone
    would also take ``1_0`` (10), `` 8`` and other scripts' digits (``٨``), reading a typo as a
    number; anything else is a ValueError (argparse's ``invalid integer value``).

    >>> integer("-12"), integer("+3")
    (-12, 3)
    >>> integer("1_0")
    Traceback (most recent call last):
    ValueError: not a decimal integer: '1_0'
    """
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"not a decimal integer: {text!r}")
    return int(text)


def is_integer(value: Any) -> TypeGuard[int | np.integer]:
    """Whether ``value`` is an integer: a Python ``int`` or a numpy integer, never a boolean.

    >>> is_integer(3), is_integer(np.uint8(3)), is_integer(True), is_integer(3.0)
    (True, True, False, False)
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def range_words(low: int | None, high: int | None) -> str:
    """The words for an inclusive integer range, as the refusals say it.

    >>> range_words(1, None), range_words(0, 9), range_words(None, None)
    ('an integer >= 1', 'an integer from 0 to 9', 'an integer')
    """
    if low is not None and high is not None:
        return f"an integer from {low} to {high}"
    if low is not None:
        return f"an integer >= {low}"
    if high is not None:
        return f"an integer <= {high}"
    return "an integer"


def checked_integer(value: Any, what: str, *, low: int | None = None, high: int | None = None,
                    error: type[PskdError] = UsageError, none: bool = False) -> Any:
    """``value`` as a Python int when it is an integer from ``low`` to ``high`` (inclusive, either
    may be open); ``error`` naming ``what`` and the range otherwise. ``none=True`` lets None through.

    >>> checked_integer(np.int64(4), "B", low=1)
    4
    >>> checked_integer(0, "B", low=1)
    Traceback (most recent call last):
    pskd_jax.errors.UsageError: E9012: B=0: expected an integer >= 1
    """
    if value is None and none:
        return None
    if not is_integer(value) or (low is not None and value < low) or (high is not None and value > high):
        expected = range_words(low, high) + (", or None" if none else "")
        raise error(f"{what}={abridged(value, 80)}: expected {expected}")
    return int(value)


def abridged(value: Any, limit: int = 300) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters (a value nested too deep to print
    is named by its type).

    >>> abridged("x" * 10, 5)
    "'xxx… (12 characters)"
    """
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested too deep; an int of more digits than Python prints
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit - 1]}… ({len(text)} characters)"


def abridged_list(items: Sequence[Any], limit: int = 8, *, show: Any = str) -> str:
    """The first ``limit`` items of a list for a message, then how many there were.

    >>> abridged_list(list(range(12)), 3)
    '0, 1, 2, … (12 in all)'
    """
    shown = ", ".join(show(item) for item in items[:limit])
    return shown if len(items) <= limit else f"{shown}, … ({len(items)} in all)"


def first_true(mask: Any) -> int | None:
    """The flat (C-order) index of the first true element of ``mask``, None when there is none.

    >>> first_true(np.array([[False, False], [True, True]])), first_true(np.zeros(3, bool))
    (2, None)
    """
    flat = np.asarray(mask).reshape(-1)
    if flat.size == 0:
        return None
    at = int(np.argmax(flat))
    return at if flat[at] else None


def not_below(value: Any, bound: int) -> str:
    """The words for an index value at or above its ``idx[bound]``.

    >>> not_below(12, 10)
    '12 is not below its bound idx[10]'
    """
    return f"{value} is not below its bound idx[{bound}]"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, singular for exactly one, else ``plural`` (default ``noun + "s"``):
    the one way a message counts things.

    >>> counted(1, "shard"), counted(0, "shard"), counted(2, "leaf", "leaves"), counted(1, "bad document")
    ('1 shard', '0 shards', '2 leaves', '1 bad document')
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


__all__ = ["abridged", "abridged_list", "checked_integer", "counted", "first_true", "integer", "is_integer",
           "mode_words", "not_below", "range_words"]
