"""The toolkit's errors: one base class, :class:`PskdError`, and one subclass per code.

Every failure the toolkit reports on purpose is a :class:`PskdError` carrying a ``code`` and a
``message`` that names the file, key path, index or line. Catch the base class for any of them, or
a subclass for one kind::

    try:
        pskd_jax.Reader("data.psk.d")
    except pskd_jax.errors.TruncatedError as e:
        ...

The codes E9001 to E9005 keep the meanings the original ``.psk.d`` tool gave them; the toolkit's
own codes start at E9010.

| code  | class                      | what went wrong                                              |
| ----- | -------------------------- | ------------------------------------------------------------ |
| E9001 | NotClosedError             | a sample type that is not a closed data type, or a ``params``|
|       |                            | type (or layout file) without a usable layout                |
| E9002 | NotPskdError               | not a ``.psk.d`` file: bad magic or version, not a regular   |
|       |                            | file, unreadable path                                        |
| E9003 | TruncatedError             | a truncated file, a sample index beyond the count, an I/O    |
|       |                            | error                                                        |
| E9004 | BadValueError              | a value outside its bound or encoding, text that is not an   |
|       |                            | index or a real                                              |
| E9005 | MismatchError              | a structure that does not match the layout                   |
| E9010 | PipelineError              | a malformed pipeline, or one that does not fit its file      |
| E9011 | VocabularyError            | a malformed vocabulary, a character it does not hold         |
| E9012 | UsageError                 | bad usage: a missing or contradictory option, an output path |
|       |                            | that cannot be written                                       |
| E9013 | DigestMismatchError        | a checkpoint whose digest differs from the recorded one      |
| E9014 | CheckpointDirectoryError   | a checkpoint directory problem: its index, its lock          |
| E9015 | CorpusInputError           | bad corpus input: a JSONL line, invalid UTF-8, an unknown    |
|       |                            | character                                                    |
| E9016 | CorpusDirectoryError       | a corpus directory problem: ``shards.json``, a shard path,   |
|       |                            | a build already running                                      |
| E9017 | ShardMismatchError         | a shard that does not verify: missing, truncated, changed    |
| E9018 | StorageError               | a storage problem: a URL the toolkit cannot serve, an object |
|       |                            | store client not installed, a request that kept failing      |

``PskdError(code, message)`` builds the subclass of ``code``, so code that names errors by their
code and code that names them by their class raise the same objects. Two subclasses carry a
Python error as well, so that sources of samples keep Python's sequence protocol:
:class:`IndexOutOfRangeError` (E9003 and ``IndexError``) and :class:`IndexTypeError` (E9012 and
``TypeError``).
"""

from __future__ import annotations

from typing import Any

CODES = {
    "E9001": "sample type not closed",
    "E9002": "not a .psk.d file",
    "E9003": "truncated file or index out of range",
    "E9004": "value out of bound or encoding",
    "E9005": "structure does not match the layout",
    "E9010": "malformed pipeline",
    "E9011": "bad vocabulary",
    "E9012": "bad usage",
    "E9013": "checkpoint digest mismatch",
    "E9014": "checkpoint directory problem",
    "E9015": "bad corpus input",
    "E9016": "corpus directory problem",
    "E9017": "corpus shard does not verify",
    "E9018": "storage problem",
}


class PskdError(Exception):
    """An error of the toolkit: ``code`` is a key of :data:`CODES`, ``message`` says what and where.

    >>> error = PskdError("E9003", "data.psk.d: 3 samples announced, 2 present")
    >>> str(error), type(error).__name__
    ('E9003: data.psk.d: 3 samples announced, 2 present', 'TruncatedError')
    >>> str(TruncatedError("data.psk.d: cut short"))
    'E9003: data.psk.d: cut short'
    """

    code: str = ""  # each subclass sets its own; an instance keeps the code it was made with

    def __new__(cls, *args: Any, **kwargs: Any) -> PskdError:
        if cls is PskdError and args:
            cls = _BY_CODE.get(args[0], cls)
        return super().__new__(cls)

    def __init__(self, *args: str) -> None:
        # (code, message) for the base class and for unpickling; (message) for a subclass.
        if len(args) == 2:
            code, message = args
        elif len(args) == 1 and type(self).code:
            code, message = type(self).code, args[0]
        else:
            raise TypeError("PskdError(code, message), or a subclass with (message)")
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        if type(self).code and code != type(self).code:
            raise ValueError(f"{type(self).__name__} carries {type(self).code}, not {code}")
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class NotClosedError(PskdError):
    """E9001: a sample type that is not closed, or a ``params`` type without a usable layout."""

    code = "E9001"


class NotPskdError(PskdError):
    """E9002: not a ``.psk.d`` file (magic, version, not a regular file, unreadable)."""

    code = "E9002"


class TruncatedError(PskdError):
    """E9003: a truncated file, a sample index beyond the count, an I/O error."""

    code = "E9003"


class IndexOutOfRangeError(TruncatedError, IndexError):
    """E9003 that is also an ``IndexError``: an index beyond a source's samples (``reader[len(reader)]``).

    Python's sequence protocol ends a loop over ``source[i]`` at the first ``IndexError``, so an
    index out of range is both the toolkit's error and the one every loop, ``list(source)`` and
    numpy expect; ``except TruncatedError`` and ``except IndexError`` both catch it.
    """


class BadValueError(PskdError):
    """E9004: a value outside its bound or its encoding; text that is not a number."""

    code = "E9004"


class MismatchError(PskdError):
    """E9005: a structure that does not match the layout."""

    code = "E9005"


class PipelineError(PskdError):
    """E9010: a malformed pipeline, or one that does not fit its file."""

    code = "E9010"


class VocabularyError(PskdError):
    """E9011: a malformed vocabulary, or a character it does not hold."""

    code = "E9011"


class UsageError(PskdError):
    """E9012: bad usage of a command or function."""

    code = "E9012"


class IndexTypeError(UsageError, TypeError):
    """E9012 that is also a ``TypeError``: an index that is not an integer (a float, a str, a bool).

    What a Python sequence raises for ``seq[1.5]``; ``except UsageError`` and ``except TypeError``
    both catch it.
    """


class DigestMismatchError(PskdError):
    """E9013: a checkpoint whose digest differs from the one recorded."""

    code = "E9013"


class CheckpointDirectoryError(PskdError):
    """E9014: a checkpoint directory problem."""

    code = "E9014"


class CorpusInputError(PskdError):
    """E9015: bad corpus input."""

    code = "E9015"


class CorpusDirectoryError(PskdError):
    """E9016: a corpus directory problem."""

    code = "E9016"


class ShardMismatchError(PskdError):
    """E9017: a corpus shard that does not verify."""

    code = "E9017"


class StorageError(PskdError):
    """E9018: a storage problem: a URL whose scheme the toolkit cannot serve, an object-store URL
    without the client extra installed, a request refused or still failing after its retries."""

    code = "E9018"


_BY_CODE: dict[str, type[PskdError]] = {
    cls.code: cls for cls in (
        NotClosedError, NotPskdError, TruncatedError, BadValueError, MismatchError, PipelineError,
        VocabularyError, UsageError, DigestMismatchError, CheckpointDirectoryError, CorpusInputError,
        CorpusDirectoryError, ShardMismatchError, StorageError,
    )
}


def error_class(code: str) -> type[PskdError]:
    """The subclass of ``code`` (ValueError for a code that is not in :data:`CODES`)."""
    try:
        return _BY_CODE[code]
    except KeyError:
        raise ValueError(f"unknown error code {code!r}") from None


__all__ = [
    "CODES",
    "BadValueError",
    "CheckpointDirectoryError",
    "CorpusDirectoryError",
    "CorpusInputError",
    "DigestMismatchError",
    "IndexOutOfRangeError",
    "IndexTypeError",
    "MismatchError",
    "NotClosedError",
    "NotPskdError",
    "PipelineError",
    "PskdError",
    "ShardMismatchError",
    "StorageError",
    "TruncatedError",
    "UsageError",
    "VocabularyError",
    "error_class",
]
