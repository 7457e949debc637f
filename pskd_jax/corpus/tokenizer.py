"""Corpus tokenizers: bytes or a character vocabulary, and the boundary token between documents.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence
import numpy as np
from pskd_jax.format.header import encode_header
from pskd_jax.format.encodings import Encoding, index_dtype
from pskd_jax.errors import CorpusDirectoryError, PskdError, VocabularyError
from pskd_jax.data.text import CODE_POINTS, check_vocab
from pskd_jax._os.jsonfile import json_kind


BYTE_TOKENS = 256

@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """``bytes`` or ``chars`` (with its vocabulary); the boundary token is :attr:`boundary`.

    >>> t = Tokenizer.chars(["a", "b"])
    >>> t.size, t.boundary, t.vocab_size, t.sample_type, t.dtype
    (2, 2, 3, 'idx[3][]', dtype('uint8'))
    >>> Tokenizer.bytes().to_json(), Tokenizer.bytes().vocab_size
    ({'kind': 'bytes'}, 257)
    """

    kind: str
    vocab: tuple[str, ...] | None = None

    @classmethod
    def bytes(cls) -> "Tokenizer":
        return cls("bytes")

    @classmethod
    def chars(cls, vocab: Sequence[str], name: str = "vocabulary") -> "Tokenizer":
        """A character tokenizer: ``vocab`` is a list of distinct single characters (E9011 else)."""
        check_vocab(vocab, name)
        for i, token in enumerate(vocab):
            if len(token) != 1:
                raise VocabularyError(f"{name}: token {i} {token!r} has {len(token)} characters; a corpus's character "
                    "vocabulary maps one character to one token",
                )
        return cls("chars", tuple(vocab))

    @property
    def size(self) -> int:
        """Tokens before the boundary: 256 bytes, or the vocabulary's length."""
        return BYTE_TOKENS if self.kind == "bytes" else len(self.vocab)

    @property
    def boundary(self) -> int:
        return self.size

    @property
    def vocab_size(self) -> int:
        """V: every token, the boundary included."""
        return self.size + 1

    @property
    def dtype(self) -> np.dtype:
        return index_dtype(self.vocab_size)

    @property
    def sample_type(self) -> str:
        return f"idx[{self.vocab_size}][]"

    def header(self, count: int) -> bytes:
        """The ``.psk.d`` header of a shard of ``count`` tokens."""
        return encode_header(self.sample_type, count, [Encoding.F64])

    def code_point_table(self) -> np.ndarray:
        """For ``chars``: code point → token, ``vocab_size`` (one past the boundary) where unknown."""
        table = np.full(CODE_POINTS, self.vocab_size, dtype=index_dtype(self.vocab_size + 1))
        table[[ord(c) for c in self.vocab]] = np.arange(len(self.vocab))
        return table

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bytes"} if self.kind == "bytes" else {"kind": "chars", "vocab": list(self.vocab)}

    @classmethod
    def from_json(cls, data: Any, name: str) -> "Tokenizer":
        if not isinstance(data, dict) or data.get("kind") not in ("bytes", "chars"):
            got = f"the kind {json_kind(data.get('kind'))}" if isinstance(data, dict) else json_kind(data)
            raise CorpusDirectoryError(f"{name}: tokenizer must be {{\"kind\": \"bytes\"}} or "
                            f"{{\"kind\": \"chars\", \"vocab\": [...]}}, got {got}")
        if data["kind"] == "bytes":
            return cls.bytes()
        vocab = data.get("vocab")
        if not isinstance(vocab, list):
            raise CorpusDirectoryError(f"{name}: a chars tokenizer's 'vocab' is a list of characters, got "
                            f"{json_kind(vocab)}")
        for i, token in enumerate(vocab):
            if not isinstance(token, str) or len(token) != 1:
                raise CorpusDirectoryError(f"{name}: tokenizer vocab: token {i} is {json_kind(token)}, not one "
                                "character")
        try:
            return cls.chars(data.get("vocab"), f"{name}: tokenizer vocab")
        except PskdError as e:
            raise CorpusDirectoryError(e.message) from None


__all__ = ["BYTE_TOKENS", "Tokenizer"]
