"""A corpus manifest (``shards.json``) parsed and checked from its JSON alone: the one parser of
its fields, for every reader of a manifest (``pskd pipeline``'s counts, the Loader,
:class:`~pskd_jax.corpus.CorpusWindows`, the corpus commands), so that each refuses the same
manifests in the same words (E9016 naming the file and the field).

Nothing is opened but the manifest: no shard, and no tokenizer library (a ``tokenizer.json``
record is checked as the JSON says it). Where a shard lies (:func:`shard_places`) is decided
here too, from its ``path``: inside the manifest's directory (symbolic links resolved), or an
object below the manifest's prefix. The corpus package builds its :class:`~pskd_jax.corpus.Manifest`
and :class:`~pskd_jax.corpus.Tokenizer` on these records. The fields and their rules:
``docs/corpus.md``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Self, TypeGuard

from pskd_jax._os.checks import is_integer
from pskd_jax._os.jsonfile import json_kind
from pskd_jax.data.text import check_vocab
from pskd_jax.errors import CorpusDirectoryError, PskdError
from pskd_jax.format.header import MAX_COUNT  # (a .psk.d count: any count a manifest records fits it too)
from pskd_jax.storage import Location

__all__ = ["BUILD_KEYS", "BYTE_TOKENS", "CORPUS_FORMAT", "CORPUS_VERSION", "IN_PROGRESS", "KINDS", "MAX_COUNT",
           "MAX_VOCAB", "PATH_MAX", "SOURCE_KEYS", "ManifestRecord", "Shard", "TokenizerRecord", "check_build",
           "check_corpus_format", "manifest_directory", "object_shard", "parse_record", "safe_path", "shard_places"]

CORPUS_FORMAT = "pskd-corpus"  # the "format" of a corpus manifest
CORPUS_VERSION = 1  # the version of it read here

BYTE_TOKENS = 256

#: The largest corpus vocabulary: ids are stored in at most 32 bits.
MAX_VOCAB = 1 << 32

KINDS = ("bytes", "chars", "hf")

_HF_KEYS = ("kind", "path", "sha256", "vocab_size", "boundary_token", "boundary")

PATH_MAX = 4096  # Linux's limit on a path: longer is refused before the system is asked

BUILD_KEYS = ("text_key", "max_document_tokens", "skip_bad")

SOURCE_KEYS = ({"path", "size", "mtime_ns"}, {"path", "size", "tag"})  # a local file's, an object's

IN_PROGRESS = "in_progress"  # the key that marks the manifest of a build still running


def check_corpus_format(data: Any, path: str) -> dict[str, Any]:
    """``data`` (a decoded ``shards.json``) when it says it is a corpus manifest of the version read
    here: a JSON object whose ``format`` is ``pskd-corpus`` and ``version`` 1; E9016 naming ``path``
    and what it is instead. The first check of :func:`parse_record`, and the whole check of
    :func:`~pskd_jax.pipeline.streams.stream_manifest` (which decides whether a stream is a
    corpus), so that each says the same of a JSON file that is none."""
    if not isinstance(data, dict):
        raise CorpusDirectoryError(f"{path}: a corpus manifest is a JSON object, got {json_kind(data)}")
    if data.get("format") != CORPUS_FORMAT:
        raise CorpusDirectoryError(f"{path}: format is {json_kind(data.get('format'))}, expected {CORPUS_FORMAT!r}")
    version = data.get("version")
    if type(version) is not int or version != CORPUS_VERSION:  # not 1.0, not true
        raise CorpusDirectoryError(f"{path}: version {json_kind(version)}; this reader reads version {CORPUS_VERSION}")
    return data


def _is_digest(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _count(value: Any, what: str) -> int:
    """An integer 0 <= value <= MAX_COUNT (not a bool, not a real such as 1.0), else E9016."""
    if not (is_integer(value) and 0 <= value <= MAX_COUNT):
        raise CorpusDirectoryError(f"{what} must be an integer from 0 to 2**63 - 1, got {json_kind(value)}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class TokenizerRecord:
    """A manifest's ``tokenizer`` record: its kind and what sizes the corpus's vocabulary.
    :class:`~pskd_jax.corpus.Tokenizer` is one that also encodes and decodes."""

    kind: str
    vocab: tuple[str, ...] | None = None  # chars
    path: str | None = None  # hf: the tokenizer.json as given
    sha256: str | None = None  # hf: of the tokenizer.json's bytes
    tokens: int | None = None  # hf: the tokenizer's ids are below this
    boundary_token: str | None = None  # hf: the end-of-text token that is the boundary, if any
    boundary_id: int | None = None  # hf

    @property
    def size(self) -> int:
        """The tokenizer's own ids: 256 bytes, the vocabulary's length, or a tokenizer.json's ids."""
        if self.kind == "bytes":
            return BYTE_TOKENS
        if self.kind == "chars":
            assert self.vocab is not None  # (a chars tokenizer has its vocabulary)
            return len(self.vocab)
        assert self.tokens is not None  # (an hf tokenizer knows its ids)
        return self.tokens

    @property
    def boundary(self) -> int:
        """The id after every document: the end-of-text token, else the first id past the tokenizer's."""
        if self.boundary_token is None:
            return self.size
        assert self.boundary_id is not None  # (a boundary token has its id)
        return self.boundary_id

    @property
    def vocab_size(self) -> int:
        """V: every id of the corpus, the boundary included."""
        return self.size + (self.boundary_token is None)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "bytes":
            return {"kind": "bytes"}
        if self.kind == "chars":
            assert self.vocab is not None
            return {"kind": "chars", "vocab": list(self.vocab)}
        return {"kind": "hf", "path": self.path, "sha256": self.sha256, "vocab_size": self.tokens,
                "boundary_token": self.boundary_token, "boundary": self.boundary}

    @classmethod
    def from_json(cls, data: Any, name: str) -> Self:
        """The record of ``data`` (as :meth:`to_json` writes it), of this class; E9016 naming ``name``."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            got = f"the kind {json_kind(data.get('kind'))}" if isinstance(data, dict) else json_kind(data)
            raise CorpusDirectoryError(f"{name}: tokenizer must be {{\"kind\": \"bytes\"}}, "
                                       f"{{\"kind\": \"chars\", \"vocab\": [...]}} or {{\"kind\": \"hf\", "
                                       f"\"sha256\": …}}, got {got}")
        if data["kind"] == "bytes":
            return cls("bytes")
        if data["kind"] == "hf":
            return cls._hf_from_json(data, name)
        vocab = data.get("vocab")
        if not isinstance(vocab, list):
            raise CorpusDirectoryError(f"{name}: a chars tokenizer's 'vocab' is a list of characters, got "
                                       f"{json_kind(vocab)}")
        for i, token in enumerate(vocab):
            if not isinstance(token, str) or len(token) != 1:
                raise CorpusDirectoryError(f"{name}: tokenizer vocab: token {i} is {json_kind(token)}, not one "
                                           "character")
        try:
            check_vocab(vocab, f"{name}: tokenizer vocab")
        except PskdError as e:  # (a vocabulary's E9011, here a manifest's field)
            raise CorpusDirectoryError(e.message) from None
        return cls("chars", tuple(vocab))

    @classmethod
    def _hf_from_json(cls, data: dict[str, Any], name: str) -> Self:
        """An hf record: exactly the keys :meth:`to_json` writes, each of its type (E9016 else)."""
        if set(data) != set(_HF_KEYS):
            raise CorpusDirectoryError(f"{name}: an hf tokenizer record has exactly the keys "
                                       + ", ".join(map(repr, _HF_KEYS)) + f", got {json_kind(sorted(data))[:200]}")
        path, digest, size, token, boundary = (data[k] for k in _HF_KEYS[1:])
        if not isinstance(path, str) or not path or "\0" in path:
            raise CorpusDirectoryError(f"{name}: tokenizer 'path' must be a non-empty string, got {json_kind(path)}")
        if not _is_digest(digest):
            raise CorpusDirectoryError(f"{name}: tokenizer 'sha256' must be 64 lowercase hex digits, got "
                                       f"{json_kind(digest)}")
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_VOCAB:
            raise CorpusDirectoryError(f"{name}: tokenizer 'vocab_size' must be an integer from 1 to 2**32, got "
                                       f"{json_kind(size)}")
        if token is not None and (not isinstance(token, str) or not token):
            raise CorpusDirectoryError(f"{name}: tokenizer 'boundary_token' must be null or a non-empty string, got "
                                       f"{json_kind(token)}")
        lowest, highest = (size, size) if token is None else (0, size - 1)
        if isinstance(boundary, bool) or not isinstance(boundary, int) or not lowest <= boundary <= highest:
            expected = f"{size} (past the tokenizer's ids)" if token is None else f"an id below {size}"
            raise CorpusDirectoryError(f"{name}: tokenizer 'boundary' must be {expected}, got {json_kind(boundary)}")
        if size + (token is None) > MAX_VOCAB:
            raise CorpusDirectoryError(f"{name}: {size} ids and a boundary past them do not fit in 32 bits")
        return cls("hf", None, path, digest, size, token, boundary)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One entry of ``shards.json``."""

    path: str
    tokens: int
    documents: int
    sha256: str
    skipped: int = 0
    source: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        entry = {"path": self.path, "tokens": self.tokens, "documents": self.documents, "sha256": self.sha256,
                 "skipped": self.skipped}
        if self.source is not None:
            entry["source"] = self.source
        return entry

    @classmethod
    def from_json(cls, data: Any, where: str) -> Shard:
        if not isinstance(data, dict):
            raise CorpusDirectoryError(f"{where}: a shard entry is an object, got {json_kind(data)}")
        tokens = _count(data.get("tokens"), f"{where}: 'tokens'")
        documents = _count(data.get("documents"), f"{where}: 'documents'")
        if documents > tokens:
            raise CorpusDirectoryError(f"{where}: {documents} documents in {tokens} tokens; every document "
                                       "ends with a boundary token, so a shard holds at least as many tokens as "
                                       "documents")
        path, digest = data.get("path"), data.get("sha256")
        if not isinstance(path, str) or not path:
            raise CorpusDirectoryError(f"{where}: 'path' must be a non-empty string, got {json_kind(path)}")
        if not _is_digest(digest):
            raise CorpusDirectoryError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {json_kind(digest)}")
        skipped = _count(data.get("skipped", 0), f"{where}: 'skipped'")
        source = data.get("source")
        if source is not None:
            _check_source(source, where)
        return cls(path, tokens, documents, digest, skipped, source)


def _check_source(source: Any, where: str) -> None:
    """``source``: ``{"path": str, "size": int >= 0, "mtime_ns": int}`` for a local input, or
    ``{"path": str, "size": int >= 0, "tag": str}`` (the object's version tag) for an input in a store."""
    if not isinstance(source, dict) or set(source) not in SOURCE_KEYS:
        keys = sorted(source) if isinstance(source, dict) else None
        raise CorpusDirectoryError(f"{where}: 'source' must be an object of exactly 'path', 'size' and 'mtime_ns' "
                                   "(or 'tag' for an object in a store), got "
                                   f"{json_kind(source) if keys is None else 'the keys ' + json_kind(keys)[:200]}")
    if not isinstance(source["path"], str):
        raise CorpusDirectoryError(f"{where}: 'source' 'path' must be a string, got {json_kind(source['path'])}")
    _count(source["size"], f"{where}: 'source' 'size'")
    if "tag" in source:
        if not isinstance(source["tag"], str):
            raise CorpusDirectoryError(f"{where}: 'source' 'tag' must be a string, got {json_kind(source['tag'])}")
        return
    mtime = source["mtime_ns"]
    if not (is_integer(mtime) and -MAX_COUNT <= mtime <= MAX_COUNT):
        raise CorpusDirectoryError(f"{where}: 'source' 'mtime_ns' must be a 64-bit integer, got {json_kind(mtime)}")


def check_build(build: Any, where: str) -> dict[str, Any]:
    """The ``build`` object: any of ``text_key`` (a non-empty string), ``max_document_tokens``
    (null or an integer >= 1) and ``skip_bad`` (true or false), nothing else (E9016)."""
    if not isinstance(build, dict):
        raise CorpusDirectoryError(f"{where}: 'build' must be an object, got {json_kind(build)}")
    unknown = [k for k in build if k not in BUILD_KEYS]
    if unknown:
        raise CorpusDirectoryError(f"{where}: 'build' holds {json_kind(unknown[0])}; its keys are "
                                   + ", ".join(map(repr, BUILD_KEYS)))
    if "text_key" in build and (not isinstance(build["text_key"], str) or not build["text_key"]):
        raise CorpusDirectoryError(f"{where}: 'build' 'text_key' must be a non-empty string, got "
                                   f"{json_kind(build['text_key'])}")
    limit = build.get("max_document_tokens")
    if limit is not None and not (is_integer(limit) and 1 <= limit <= MAX_COUNT):
        raise CorpusDirectoryError(f"{where}: 'build' 'max_document_tokens' must be null or an integer >= 1, got "
                                   f"{json_kind(limit)}")
    if "skip_bad" in build and not isinstance(build["skip_bad"], bool):
        raise CorpusDirectoryError(f"{where}: 'build' 'skip_bad' must be true or false, got "
                                   f"{json_kind(build['skip_bad'])}")
    return build


@dataclasses.dataclass(frozen=True)
class ManifestRecord:
    """A ``shards.json`` parsed and checked (:func:`parse_record`); its shard paths are checked
    where they are looked up (:func:`shard_places`). :class:`~pskd_jax.corpus.Manifest` is one
    whose tokenizer encodes."""

    path: str
    tokenizer: TokenizerRecord
    shards: tuple[Shard, ...]
    build: dict[str, Any] = dataclasses.field(default_factory=dict)
    planned_shards: int | None = None  # while a build runs: the shards it will list; None once finished
    writer: str | None = None  # while a build into a store runs: the token that names that build

    @property
    def complete(self) -> bool:
        """Whether no build is in progress: the manifest lists every shard its build planned."""
        return self.planned_shards is None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def boundary(self) -> int:
        return self.tokenizer.boundary

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)


def parse_record(data: Any, path: str) -> ManifestRecord:
    """A decoded manifest checked field by field (E9016 naming ``path`` and the field), in one
    order whoever reads it: the format, the tokenizer, ``vocab_size`` and ``boundary`` against
    it, the list of shards, ``build``, ``in_progress``, each shard entry, no shard listed twice."""
    data = check_corpus_format(data, path)
    tokenizer = TokenizerRecord.from_json(data.get("tokenizer"), path)
    for key, expected in (("vocab_size", tokenizer.vocab_size), ("boundary", tokenizer.boundary)):
        if type(data.get(key)) is not int or data.get(key) != expected:
            raise CorpusDirectoryError(f"{path}: {key} is {json_kind(data.get(key))}, but a {tokenizer.kind} "
                                       f"tokenizer of {tokenizer.size} tokens makes it {expected}")
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise CorpusDirectoryError(f"{path}: 'shards' must be a list, got {json_kind(shards)}")
    build = check_build(data.get("build", {}), path)
    planned, writer = _in_progress(data[IN_PROGRESS], len(shards), path) if IN_PROGRESS in data else (None, None)
    entries = tuple(Shard.from_json(s, f"{path}: shard {i}") for i, s in enumerate(shards))
    _refuse_listed_twice(entries, path)
    return ManifestRecord(path, tokenizer, entries, build, planned, writer)


def _refuse_listed_twice(shards: Sequence[Shard], path: str) -> None:
    """E9016 for two entries naming one shard (``a.psk.d`` and ``./a.psk.d`` alike): its tokens
    would appear twice in the stream, as a merge refuses them."""
    first: dict[str, int] = {}
    for i, shard in enumerate(shards):
        name = "/".join(p for p in shard.path.replace("\\", "/").split("/") if p not in ("", "."))
        if name in first:
            raise CorpusDirectoryError(f"{path}: shard {i}: path {shard.path!r} names the shard that shard "
                                       f"{first[name]} lists already ({shards[first[name]].path!r}); a corpus "
                                       "lists each shard once")
        first.setdefault(name, i)


def _in_progress(value: Any, listed: int, path: str) -> tuple[int, str | None]:
    """``in_progress``: ``{"planned_shards": N}`` with N at least the shards listed, and for a
    build into a store ``"writer"``, a string (E9016 else)."""
    if not isinstance(value, dict) or set(value) - {"writer"} != {"planned_shards"}:
        raise CorpusDirectoryError(f"{path}: {IN_PROGRESS!r} must be an object of 'planned_shards' (and 'writer'), "
                                   f"got {json_kind(value)}")
    planned = _count(value["planned_shards"], f"{path}: {IN_PROGRESS!r} 'planned_shards'")
    if planned < listed:
        raise CorpusDirectoryError(f"{path}: {IN_PROGRESS!r} plans {planned} shards but {listed} are listed")
    writer = value.get("writer")
    if writer is not None and (not isinstance(writer, str) or not writer):
        raise CorpusDirectoryError(f"{path}: {IN_PROGRESS!r} 'writer' must be a non-empty string, got "
                                   f"{json_kind(writer)}")
    return planned, writer


def manifest_directory(path: str, *, links: str = "follow") -> str:
    """The directory a manifest's shard paths are relative to: the real directory holding the
    manifest's file. A ``shards.json`` reached through symbolic links (the file itself linked
    elsewhere, or a linked directory on the way) names the shards beside its target, where its
    build wrote them, not beside the link. With ``links="replace"`` (a manifest about to be
    written over a link at ``path``, the link replaced) the file will stand at ``path`` itself.
    Every reader and writer of local shard paths goes through here (``docs/corpus.md``).

    >>> import os, tempfile
    >>> d = os.path.realpath(tempfile.mkdtemp())
    >>> os.mkdir(os.path.join(d, "real")); os.symlink("real/shards.json", os.path.join(d, "shards.json"))
    >>> manifest_directory(os.path.join(d, "shards.json")) == os.path.join(d, "real")
    True
    >>> manifest_directory(os.path.join(d, "shards.json"), links="replace") == d
    True
    """
    if links == "replace":
        return os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return os.path.dirname(os.path.realpath(path))


def safe_path(directory: str, relative: str, where: str) -> str:
    """``directory/relative`` when it stays inside ``directory`` (symlinks resolved), else E9016.

    >>> safe_path("/data/c", "a/s.psk.d", "m"), safe_path("/data/c", "s.psk.d", "m")
    ('/data/c/a/s.psk.d', '/data/c/s.psk.d')
    >>> safe_path("/data/c", "../x.psk.d", "m")
    Traceback (most recent call last):
    ...
    pskd_jax.errors.CorpusDirectoryError: E9016: m: path '../x.psk.d' leaves the manifest's directory (it holds '..')
    """
    if len(relative) > PATH_MAX:
        raise CorpusDirectoryError(f"{where}: path {relative[:40]!r}… of {len(relative)} characters is longer "
                                   f"than a path may be ({PATH_MAX})")
    if "\0" in relative:
        raise CorpusDirectoryError(f"{where}: path {relative!r} holds a NUL byte, which no file name holds")
    try:
        os.fsencode(relative)
    except UnicodeError:
        raise CorpusDirectoryError(f"{where}: path {relative!r} holds a lone surrogate, which no file name "
                                   "of this system holds") from None
    if os.path.isabs(relative) or relative.startswith(("/", "\\")):
        raise CorpusDirectoryError(f"{where}: path {relative!r} is absolute; shard paths are relative to the "
                                   "manifest's directory")
    parts = relative.replace("\\", "/").split("/")
    if ".." in parts:
        raise CorpusDirectoryError(f"{where}: path {relative!r} leaves the manifest's directory (it holds '..')")
    if parts[-1] in ("", "."):
        raise CorpusDirectoryError(f"{where}: path {relative!r} names a directory, not a shard file")
    path = os.path.join(directory, *[p for p in parts if p not in ("", ".")])
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise CorpusDirectoryError(f"{where}: path {relative!r} resolves to {real}, outside the manifest's "
                                   f"directory {root} (through a symlink)")
    return path


def object_shard(manifest: Location, relative: str, where: str) -> Location:
    """The object a manifest in a store names by ``relative`` (its ``path``): a key below the
    manifest's prefix, written with single slashes; an absolute path, an empty, ``.`` or ``..``
    part, a backslash or a control character is refused (E9016), as a store would normalise it.

    >>> from pskd_jax.storage import locate
    >>> object_shard(locate("s3://data/c/shards.json"), "shard-00000.psk.d", "m").url
    's3://data/c/shard-00000.psk.d'
    """
    parts = relative.split("/")
    if relative.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in relative \
            or any(ord(c) < 32 for c in relative):
        raise CorpusDirectoryError(f"{where}: path {relative!r} is not a key below the manifest's prefix (single "
                                   "slashes, no '.', '..' or empty parts, no backslash)")
    return manifest.parent().child(relative)


def shard_places(record: ManifestRecord, where: Location, directory: str | None = None) -> tuple[str, ...]:
    """Where each shard of ``record``, a manifest read at ``where``, lies, each checked (E9016
    naming the first that may not be read): for a local manifest a path inside ``directory``
    (default: its :func:`manifest_directory`) by :func:`safe_path`; for one in a store the URL of
    an object below its prefix by :func:`object_shard`. The readers of a manifest's shards, and
    ``pskd pipeline``, which opens none, check them here, in the manifest's order."""
    if not where.is_local:
        return tuple(object_shard(where, s.path, f"{record.path}: shard {i}").url for i, s in enumerate(record.shards))
    folder = manifest_directory(where.path) if directory is None else directory
    return tuple(safe_path(folder, s.path, f"{record.path}: shard {i}") for i, s in enumerate(record.shards))
