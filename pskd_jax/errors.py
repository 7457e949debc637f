"""The toolkit's one exception type and its codes.

Every failure the toolkit reports on purpose is a :class:`PskdError` carrying a code. The codes
E9001 to E9005 keep the meanings of the original ``.psk.d`` tool; the project's own codes follow
from E9010 for what the original did not cover.

| code  | what went wrong                                                                     |
| ----- | ----------------------------------------------------------------------------------- |
| E9001 | a sample type that is not a closed data type, or ``params M`` without its layout      |
| E9002 | not a ``.psk.d`` file: bad magic, unsupported version, unreadable path                 |
| E9003 | a truncated file, a sample index beyond the count, an I/O error                        |
| E9004 | a value outside its bound or encoding, or text that is not an index or a real          |
| E9005 | a sample whose structure does not match the layout                                    |
| E9010 | a malformed pipeline text, or a pipeline that does not fit its file                    |
| E9011 | a malformed vocabulary, or a character the vocabulary does not hold                   |
| E9012 | bad usage of a command: a missing or contradictory option                             |
| E9013 | a checkpoint whose digest differs from the one recorded when it was written           |
| E9014 | a checkpoint directory problem: a malformed index, a step it does not hold            |
| E9015 | bad corpus input: a JSONL line that is not a JSON object with a string text, invalid  |
|       | UTF-8, a character outside the corpus's character vocabulary                          |
| E9016 | a corpus directory problem: a malformed ``shards.json``, a shard path that leaves its |
|       | directory, a build already running in the directory                                   |
| E9017 | a corpus shard that does not verify: missing, truncated, or changed since recorded    |
"""

from __future__ import annotations

NOT_CLOSED = "E9001"
NOT_PSKD = "E9002"
TRUNCATED = "E9003"
BAD_VALUE = "E9004"
MISMATCH = "E9005"
BAD_PIPELINE = "E9010"
BAD_VOCAB = "E9011"
BAD_USAGE = "E9012"
DIGEST_MISMATCH = "E9013"
CHECKPOINT_DIR = "E9014"
BAD_CORPUS_INPUT = "E9015"
CORPUS_DIR = "E9016"
SHARD_MISMATCH = "E9017"

CODES = {
    NOT_CLOSED: "sample type not closed",
    NOT_PSKD: "not a .psk.d file",
    TRUNCATED: "truncated file or index out of range",
    BAD_VALUE: "value out of bound or encoding",
    MISMATCH: "structure does not match the layout",
    BAD_PIPELINE: "malformed pipeline",
    BAD_VOCAB: "bad vocabulary",
    BAD_USAGE: "bad usage",
    DIGEST_MISMATCH: "checkpoint digest mismatch",
    CHECKPOINT_DIR: "checkpoint directory problem",
    BAD_CORPUS_INPUT: "bad corpus input",
    CORPUS_DIR: "corpus directory problem",
    SHARD_MISMATCH: "corpus shard does not verify",
}


class PskdError(Exception):
    """An error of the toolkit: ``code`` is one of :data:`CODES`, ``message`` says what and where.

    >>> str(PskdError("E9003", "data.psk.d: 3 samples announced, 2 present"))
    'E9003: data.psk.d: 3 samples announced, 2 present'
    """

    def __init__(self, code: str, message: str):
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
