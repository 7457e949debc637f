"""Corpus tokenizers — bytes, a character vocabulary, or a Hugging Face ``tokenizer.json`` — and
the boundary token between documents.

Kinds
-----
- ``bytes``: the UTF-8 bytes of the text are tokens 0..255; the boundary is 256.
- ``chars``: a character vocabulary as ``pskd chars`` writes it (token i is ``vocab[i]``, one
  character each); the boundary is ``len(vocab)``.
- ``hf``: a Hugging Face ``tokenizer.json``, run by the ``tokenizers`` package (the optional extra
  ``pskd_jax[tokenizers]``, imported on first use). A text's ids are the library's
  ``encode_batch([text], add_special_tokens=False)`` ids with ``encode_special_tokens`` set: the
  corpus puts its own boundary between documents, so no template tokens ([CLS], <s>…) are added
  around each, and a special token written in a document's text (``<|endoftext|>`` quoted in a
  text) is encoded as the text it is, never as the boundary. Padding and truncation that the file
  sets are switched off (``max_document_tokens`` is the corpus's truncation). The
  boundary is the tokenizer's own end-of-text token — the one named, else the first of
  :data:`END_OF_TEXT` that its vocabulary holds and that may be one — or, when it has none, the id
  one past its vocabulary. A token may be the boundary only when no text can be encoded to it
  (:func:`boundary_problem`): it must be a *special* token of the file, and the model itself
  must not turn the token's string into its id (a WordLevel model, or a Unigram model whose
  pieces hold the string, does: ``</s>`` quoted in a document would end it there). A named token
  that fails either test is refused (E9011, saying which); the default passes over it. The
  manifest records the file's path as given, its sha256 (by which a corpus and a
  tokenizer are matched), the tokenizer's vocabulary size and the boundary token.

The corpus's vocabulary ``V`` (``vocab_size``) counts every id, the boundary included: one more
than the tokenizer's ids when the boundary lies past them, the tokenizer's own size when the
boundary is one of its tokens. Ids are stored in the narrowest unsigned integers that hold
``V - 1`` (the ``idx[V]`` rule of the format: u16 up to 65,536 ids, u32 beyond).
"""

from __future__ import annotations

import builtins
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.files import read_whole
from pskd_jax.corpus.extras import tokenizers_module
from pskd_jax.data.corpus_manifest import BYTE_TOKENS, KINDS, MAX_VOCAB, TokenizerRecord
from pskd_jax.data.text import CODE_POINTS, check_vocab, read_vocab
from pskd_jax.errors import CorpusDirectoryError, UsageError, VocabularyError
from pskd_jax.format.encodings import Encoding, index_dtype
from pskd_jax.format.header import encode_header

#: The end-of-text tokens looked for, in this order, when no boundary token is named.
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<EOS>", "[SEP]")


@dataclasses.dataclass(frozen=True)
class Tokenizer(TokenizerRecord):
    """A corpus tokenizer: ``bytes``, ``chars`` (with its vocabulary) or ``hf`` (a
    ``tokenizer.json``); the token between documents is :attr:`boundary`. Its record in a
    manifest, and the sizes that follow from it, are :class:`~pskd_jax.data.corpus_manifest.TokenizerRecord`'s
    (``from_json`` and ``to_json`` included: the one parser of a manifest's tokenizer).

    >>> t = Tokenizer.chars(["a", "b"])
    >>> t.size, t.boundary, t.vocab_size, t.sample_type, t.dtype
    (2, 2, 3, 'idx[3][]', dtype('uint8'))
    >>> t.encode("abba").tolist(), t.decode([0, 1, 2, 1])
    ([0, 1, 1, 0], 'ab\\nb')
    >>> Tokenizer.bytes().to_json(), Tokenizer.bytes().vocab_size
    ({'kind': 'bytes'}, 257)
    """

    _native: Any = dataclasses.field(default=None, compare=False, repr=False)  # hf: the tokenizers object

    @classmethod
    def bytes(cls) -> Tokenizer:
        return cls("bytes")

    @classmethod
    def of_record(cls, record: TokenizerRecord) -> Tokenizer:
        """The tokenizer a manifest's record names (an hf one loads its tokenizer.json when first used)."""
        return record if isinstance(record, cls) else \
            cls(*(getattr(record, f.name) for f in dataclasses.fields(TokenizerRecord)))

    @classmethod
    def chars(cls, vocab: Sequence[str], name: str = "vocabulary") -> Tokenizer:
        """A character tokenizer: ``vocab`` is a list of distinct single characters (E9011 else)."""
        check_vocab(vocab, name)
        for i, token in enumerate(vocab):
            if len(token) != 1:
                raise VocabularyError(f"{name}: token {i} {token!r} has {len(token)} characters; a corpus's "
                                      f"character "
                                      "vocabulary maps one character to one token")
        return cls("chars", tuple(vocab))

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, boundary_token: str | None = None) -> Tokenizer:
        """The tokenizer of a file: a Hugging Face ``tokenizer.json``, or a character vocabulary
        (a JSON array, as ``pskd chars`` writes it).

        ``boundary_token`` (``tokenizer.json`` only) names the token that ends a document; by
        default the first of :data:`END_OF_TEXT` that the vocabulary holds, else none; ``""`` for
        none: the boundary is then the id past the tokenizer's. A file that is not a tokenizer,
        or a named token it does not hold, is E9011; a ``tokenizer.json`` without the
        ``tokenizers`` package E9012 naming the extra to install.
        """
        path = os.fspath(path)
        raw = read_whole(path, VocabularyError, what="the tokenizer")
        if raw.lstrip()[:1] == b"[":  # a JSON array: a character vocabulary
            if boundary_token is not None:
                raise UsageError(f"{path}: a character vocabulary's boundary is its size; a boundary token is "
                                 "named for a tokenizer.json only")
            return cls.chars(read_vocab(path), path)
        return cls._hf(path, raw, boundary_token)

    @classmethod
    def _hf(cls, path: str, raw: builtins.bytes, boundary_token: str | None) -> Tokenizer:  # (not cls.bytes)
        library = tokenizers_module()
        try:
            native = library.Tokenizer.from_str(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise VocabularyError(f"{path}: not UTF-8 at byte {e.start}; a tokenizer.json is UTF-8 JSON") from None
        except Exception as e:  # the library's own parse error (its type is not part of its API)
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise VocabularyError(f"{path}: not a tokenizer.json the tokenizers library reads ({reason})") from None
        _prepare(native)
        vocab = native.get_vocab(with_added_tokens=True)
        if not vocab:
            raise VocabularyError(f"{path}: the tokenizer has an empty vocabulary")
        size = max(vocab.values()) + 1
        name, boundary = _choose_boundary(native, vocab, size, boundary_token, path)
        if size + (name is None) > MAX_VOCAB:
            raise VocabularyError(f"{path}: {size} token ids (0 to {size - 1}) and a boundary past them make "
                                  f"{size + 1} tokens; a corpus stores ids in 32 bits, so at most {MAX_VOCAB}: name "
                                  "one of its special tokens as the boundary (--boundary-token)")
        return cls("hf", None, path, DIGESTS["sha256"](raw).hexdigest(), size, name, boundary, native)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a worker process) with the tokenizers object as its JSON: the library's own
        pickling drops ``encode_special_tokens``, which :func:`_prepare` sets again."""
        state = dict(self.__dict__)
        if state.get("_native") is not None:
            state["_native"] = state["_native"].to_str()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("_native"), str):
            state = dict(state, _native=_prepare(tokenizers_module().Tokenizer.from_str(state["_native"])))
        for key, value in state.items():
            object.__setattr__(self, key, value)

    # -- sizes (size, boundary, vocab_size: the record's) -----------------------------------------

    @property
    def _characters(self) -> tuple[str, ...]:
        """A chars tokenizer's vocabulary (the one kind that has one)."""
        assert self.vocab is not None
        return self.vocab

    @property
    def dtype(self) -> np.dtype:
        return index_dtype(self.vocab_size)

    @property
    def sample_type(self) -> str:
        return f"idx[{self.vocab_size}][]"

    def header(self, count: int) -> builtins.bytes:  # (not cls.bytes)
        """The ``.psk.d`` header of a shard of ``count`` tokens."""
        return encode_header(self.sample_type, count, [Encoding.F64])

    def code_point_table(self) -> np.ndarray:
        """For ``chars``: code point → token, ``vocab_size`` (one past the boundary) where unknown."""
        table = np.full(CODE_POINTS, self.vocab_size, dtype=index_dtype(self.vocab_size + 1))
        table[[ord(c) for c in self._characters]] = np.arange(len(self._characters))
        return table

    # -- the tokenizers library ------------------------------------------------------------------

    def native(self) -> Any:
        """For ``hf``: the ``tokenizers.Tokenizer``, loaded from :attr:`path` on first use when this
        tokenizer was read from a manifest (E9016 if that file's sha256 is no longer the recorded one)."""
        if self.kind != "hf":
            raise UsageError(f"a {self.kind} tokenizer has no tokenizer.json")
        if self._native is None:
            assert self.path is not None  # (an hf tokenizer has its tokenizer.json)
            loaded = Tokenizer.from_file(self.path, boundary_token=self.boundary_token or "")
            if loaded.sha256 != self.sha256 or loaded.tokens != self.tokens or loaded.boundary != self.boundary:
                raise CorpusDirectoryError(f"{self.path}: this tokenizer.json has sha256 {loaded.sha256}, but the "
                                           f"corpus was built with one of sha256 {self.sha256}")
            object.__setattr__(self, "_native", loaded._native)
        return self._native

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """For ``hf``: the ids of each text, the library's ``encode_batch(texts,
        add_special_tokens=False)`` ids (encoded together on the library's side; special tokens in
        a text encoded as text)."""
        return [e.ids for e in self.native().encode_batch_fast(texts, add_special_tokens=False)]

    # -- text ↔ ids ------------------------------------------------------------------------------

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text`` (no boundary added), as :attr:`dtype`.

        A lone surrogate (which UTF-8 cannot hold), or for ``chars`` a character outside the
        vocabulary, is E9011 naming its position."""
        if not isinstance(text, str):
            raise UsageError(f"encode takes a str, got {type(text).__name__}")
        try:
            if self.kind == "bytes":
                return np.frombuffer(text.encode("utf-8"), np.uint8).astype(self.dtype)
            if self.kind == "hf":
                text.encode("utf-8")  # the library would refuse a lone surrogate less clearly
                return np.array(self.encode_batch([text])[0], dtype=self.dtype)
            points = np.frombuffer(text.encode("utf-32-le"), "<u4")
        except UnicodeEncodeError as e:
            raise VocabularyError(f"character {e.start} of the text is a lone surrogate U+{ord(text[e.start]):04X}, "
                                  "which UTF-8 cannot encode") from None
        ids = self.code_point_table().take(points)
        if len(ids) and ids.max() > self.boundary:
            at = int(np.argmax(ids > self.boundary))
            raise VocabularyError(f"character {at} of the text, {text[at]!r} (U+{ord(text[at]):04X}), is not in the "
                                  "vocabulary")
        return ids.astype(self.dtype)

    def decode(self, ids: Sequence[int] | np.ndarray, *, boundary_text: str = "\n", errors: str = "strict") -> str:
        """The text of ``ids``. A boundary that is not one of the tokenizer's own tokens (bytes,
        chars, a tokenizer.json without an end-of-text token) becomes ``boundary_text``; an
        end-of-text token is decoded by the library as any token (special tokens kept).

        An id outside ``[0, vocab_size)`` is E9011 naming its index; for ``bytes``, bytes that are
        not UTF-8 (a window's edge may cut a character) are E9011 unless ``errors="replace"``."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise UsageError(f"decode takes one axis of integer ids, got {ids.dtype} of shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            at = int(np.flatnonzero((ids < 0) | (ids >= self.vocab_size))[0])
            raise VocabularyError(f"id {at} is {int(ids[at])}, outside the vocabulary of {self.vocab_size} ids")
        if self.kind == "hf" and self.boundary_token is not None:
            return self.native().decode(ids.tolist(), skip_special_tokens=False)
        cuts = np.flatnonzero(ids == self.boundary)
        starts = np.concatenate([[0], cuts + 1])
        ends = np.concatenate([cuts, [len(ids)]])
        return boundary_text.join(self._decode_text(ids[a:b], int(a), errors) for a, b in zip(starts, ends))

    def _decode_text(self, ids: np.ndarray, first: int, errors: str) -> str:
        """The text of ids holding no boundary (``first``: where they start, for messages)."""
        if self.kind == "chars":
            vocab = self._characters
            return "".join([vocab[i] for i in ids.tolist()])
        if self.kind == "hf":
            return self.native().decode(ids.tolist(), skip_special_tokens=False) if len(ids) else ""
        try:
            return ids.astype(np.uint8).tobytes().decode("utf-8", errors)
        except UnicodeDecodeError as e:
            raise VocabularyError(f"ids {first + e.start}..{first + e.end - 1} are bytes that are not UTF-8 "
                                  f"({e.reason}); "
                                  "decode(..., errors='replace') shows them as U+FFFD") from None

    # -- identity --------------------------------------------------------------------------------

    def matches(self, other: Tokenizer) -> bool:
        """Whether ``other`` is the same tokenizer: the same kind and, for chars, the same vocabulary,
        for hf the same tokenizer.json (its sha256), wherever it lies and whatever its boundary."""
        if self.kind != other.kind:
            return False
        return self.vocab == other.vocab if self.kind == "chars" else self.sha256 == other.sha256

    def describe(self) -> str:
        """The tokenizer in words, for messages: its kind, vocabulary and (hf) digest."""
        if self.kind == "bytes":
            return f"bytes, a vocabulary of {self.vocab_size} tokens"
        if self.kind == "chars":
            shown = "".join(self._characters[:20])
            more = "…" if self.size > 20 else ""
            return f"chars, {self.size} characters {shown!r}{more}, a vocabulary of {self.vocab_size} tokens"
        end = f"boundary {self.boundary_token!r} ({self.boundary})" if self.boundary_token is not None \
            else f"boundary {self.boundary} past its ids"
        return f"tokenizer.json {self.path} of sha256 {self.sha256}, {self.size} ids, {end}"


def _prepare(native: Any) -> Any:
    """A tokenizers object set as the corpus encodes: no padding, no truncation, and special
    tokens written in a text encoded as text (only the corpus puts a boundary in the stream)."""
    native.no_padding()
    native.no_truncation()
    native.encode_special_tokens = True
    return native


def boundary_problem(native: Any, token: str, token_id: int) -> str | None:
    """Why ``token`` (id ``token_id``) of a prepared tokenizers object cannot be the boundary
    between documents, or None when no document's text can be encoded to it.

    The corpus encodes special tokens written in a text as text, so an *added special* token
    never comes out of the added-token matcher; what remains is the model: a WordLevel model maps
    the word ``</s>`` to its id, a Unigram model matches any of its pieces in the text, and so
    the string is tried through the model in a few settings (alone, after a space, inside and
    between words, twice)."""
    added = native.get_added_tokens_decoder().get(token_id)
    if added is None or not added.special or added.content != token:
        return (f"{token!r} (id {token_id}) is an ordinary entry of the vocabulary, not a special token: a "
                "document whose text holds it would be encoded to the boundary and cut in two there")
    probes = [token, f" {token}", f"a{token}b", f"a {token} b", token + token]
    if any(token_id in e.ids for e in native.encode_batch_fast(probes, add_special_tokens=False)):
        return (f"the tokenizer's model encodes the text {token!r} to id {token_id} itself (its vocabulary holds "
                "the string as an ordinary word or piece, as WordLevel and Unigram models may), so a document "
                "quoting it would be cut in two there")
    return None


def _choose_boundary(native: Any, vocab: dict[str, int], size: int, named: str | None, path: str
                     ) -> tuple[str | None, int]:
    """The boundary token and its id: the one named, else the first usual end-of-text token the
    vocabulary holds that no text reaches (:func:`boundary_problem`), else none (the id
    ``size``); ``named == ""`` asks for none."""
    if named == "":
        return None, size
    if named is not None:
        if named not in vocab:
            held = [t for t in END_OF_TEXT if t in vocab]
            raise VocabularyError(f"{path}: no token {named!r} in the vocabulary to be the boundary; "
                                  + (f"it holds {', '.join(map(repr, held))}" if held else
                                     "it holds none of the usual end-of-text tokens (give '' for a boundary "
                                     "past its ids)"))
        problem = boundary_problem(native, named, vocab[named])
        if problem is not None:
            raise VocabularyError(f"{path}: {problem}; it cannot be the boundary between documents: name a "
                                  "special token that the text cannot reach, or '' for an id past the vocabulary")
        return named, vocab[named]
    for token in END_OF_TEXT:
        if token in vocab and boundary_problem(native, token, vocab[token]) is None:
            return token, vocab[token]
    return None, size


__all__ = ["BYTE_TOKENS", "END_OF_TEXT", "KINDS", "MAX_VOCAB", "Tokenizer", "boundary_problem"]
