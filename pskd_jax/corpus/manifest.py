"""Sharded token corpora: tokenizers, the ``shards.json`` manifest, verification, training windows.

A corpus is a directory holding ``shards.json`` and the shards it lists. Building one is in
:mod:`pskd_jax.corpus_build`; this module reads, checks and serves it.

Tokens and shards
-----------------
- Tokenizers: ``bytes`` (the 256 byte values of the UTF-8 text are tokens 0..255), ``chars`` (a
  character vocabulary as ``pskd chars`` writes it: token i is ``vocab[i]``, one character each),
  or ``hf`` (a Hugging Face ``tokenizer.json``; see :mod:`pskd_jax.corpus.tokenizer`). The
  boundary token is the tokenizer's size (256, or ``len(vocab)``), so the corpus's vocabulary has
  ``V = size + 1`` tokens — except for a ``tokenizer.json`` with an end-of-text token, which is the
  boundary (``V`` is then the tokenizer's own size).
- Every document is followed by one boundary token, the last document of a shard included: a
  shard is ``doc₀ ⟨b⟩ doc₁ ⟨b⟩ … docₙ ⟨b⟩``, so concatenating shards keeps every two documents
  apart by exactly one boundary, and ``documents`` equals the boundary tokens of a shard.
- A shard is a ``.psk.d`` file of type ``idx[V][]``: one token a sample, ``count`` its tokens.

The manifest
------------
``shards.json`` is the corpus's source of truth, a JSON object::

    {"format": "pskd-corpus", "version": 1,
     "tokenizer": {"kind": "bytes"} | {"kind": "chars", "vocab": [...]}
                | {"kind": "hf", "path": …, "sha256": …, "vocab_size": N, "boundary_token": "<|endoftext|>" | null,
                   "boundary": …},
     "vocab_size": V, "boundary": V - 1,
     "build": {"text_key": "text", "max_document_tokens": null, "skip_bad": false},
     "shards": [{"path": "shard-00000.psk.d", "tokens": …, "documents": …, "sha256": "…",
                 "skipped": 0, "source": {"path": …, "size": …, "mtime_ns": …}}, …]}

While a build runs, ``shards.json`` also holds ``"in_progress": {"planned_shards": N}``: the
shards listed are finished (every entry matches its file) and are the first of the N the build
will list; the key is gone once the build has finished. ``path`` is relative to the manifest's
directory (:func:`manifest_directory`: the one holding the manifest's file, links followed), with
``/`` separators; a path that is absolute,
holds ``..``, or resolves (through symlinks) outside that directory is refused (E9016). ``build``,
``skipped`` and ``source`` say how a shard was made (a rerun of a build uses them to keep the
shards that are up to date); readers need only the other fields. The global token stream is the
concatenation of the shards in manifest order.

The manifest is read strictly: anything but UTF-8 JSON (NaN, Infinity, a key twice in one object,
nesting deeper than the parser goes), a field of another type than the above (``1.0`` or ``true``
for an integer included), a count beyond ``2**63 - 1``, more documents than tokens, a ``build`` or
``source`` key not listed above, a path holding a NUL byte, or two entries naming one shard
(``a.psk.d`` and ``./a.psk.d``) is E9016 naming the field, never another exception.
:func:`write_manifest` refuses to write what a reader would refuse.

Errors: a malformed manifest or an unsafe path E9016; a shard that is missing, truncated, or whose
bytes or count differ from the manifest E9017, naming the shard.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.checks import is_integer
from pskd_jax._os.jsonfile import json_kind, json_text, loads_strict, read_strict
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import CorpusDirectoryError
from pskd_jax.pipeline.streams import CORPUS_FORMAT, CORPUS_VERSION, check_corpus_format, stream_manifest
from pskd_jax.storage import OVERWRITE, Location, ObjectInfo, Store, Version

FORMAT = CORPUS_FORMAT  # (the stream readers' and this reader's one check: check_corpus_format)

VERSION = CORPUS_VERSION

MANIFEST = names.CORPUS_MANIFEST

IN_PROGRESS = "in_progress"  # the key that marks the manifest of a build still running


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
                            "ends with a boundary token, so a shard holds at least as many tokens as documents")
        path, digest = data.get("path"), data.get("sha256")
        if not isinstance(path, str) or not path:
            raise CorpusDirectoryError(f"{where}: 'path' must be a non-empty string, got {json_kind(path)}")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise CorpusDirectoryError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {json_kind(digest)}")
        skipped = _count(data.get("skipped", 0), f"{where}: 'skipped'")
        source = data.get("source")
        if source is not None:
            _check_source(source, where)
        return cls(path, tokens, documents, digest, skipped, source)


PATH_MAX = 4096  # Linux's limit on a path: longer is refused before the system is asked

MAX_COUNT = (1 << 63) - 1  # a .psk.d count, and any count a manifest records, fits in a signed 64-bit integer

BUILD_KEYS = ("text_key", "max_document_tokens", "skip_bad")


def _count(value: Any, what: str) -> int:
    """An integer 0 <= value <= MAX_COUNT (not a bool, not a real such as 1.0), else E9016."""
    if not (is_integer(value) and 0 <= value <= MAX_COUNT):
        raise CorpusDirectoryError(f"{what} must be an integer from 0 to 2**63 - 1, got {json_kind(value)}")
    return int(value)


SOURCE_KEYS = ({"path", "size", "mtime_ns"}, {"path", "size", "tag"})  # a local file's, an object's


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
class Manifest:
    """A parsed ``shards.json``; :meth:`shard_path` gives a shard's checked location."""

    path: str
    tokenizer: Tokenizer
    shards: tuple[Shard, ...]
    build: dict[str, Any] = dataclasses.field(default_factory=dict)
    planned_shards: int | None = None  # while a build runs: the shards it will list; None once finished
    writer: str | None = None  # while a build into a store runs: the token that names that build

    @property
    def complete(self) -> bool:
        """Whether no build is in progress: the manifest lists every shard its build planned."""
        return self.planned_shards is None

    @functools.cached_property
    def directory(self) -> str:
        """The directory its shard paths are relative to (:func:`manifest_directory`), decided
        once: every shard of one manifest read is found in the same place."""
        return manifest_directory(self.path)

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

    def shard_path(self, i: int) -> str:
        """Where shard i lies, refusing a path that leaves the manifest's directory (E9016)."""
        return safe_path(self.directory, self.shards[i].path, f"{self.path}: shard {i}")

    def to_bytes(self) -> bytes:
        return manifest_bytes(self.tokenizer, self.shards, self.build, planned_shards=self.planned_shards,
                              writer=self.writer)


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


def manifest_json(tokenizer: Tokenizer, shards: Iterable[Shard], build: dict[str, Any] | None = None, *,
                  planned_shards: int | None = None, writer: str | None = None) -> dict[str, Any]:
    """The manifest as a JSON-ready dict, keys in their documented order. ``writer`` (a manifest
    in progress in a store only) names the build that writes it."""
    data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer.to_json(),
                            "vocab_size": tokenizer.vocab_size, "boundary": tokenizer.boundary}
    if build is not None:
        data["build"] = dict(build)
    if planned_shards is not None:
        data[IN_PROGRESS] = {"planned_shards": planned_shards, **({"writer": writer} if writer is not None else {})}
    data["shards"] = [s.to_json() for s in shards]
    return data


def manifest_bytes(tokenizer: Tokenizer, shards: Iterable[Shard], build: dict[str, Any] | None = None, *,
                   planned_shards: int | None = None, writer: str | None = None) -> bytes:
    """The manifest's bytes: one top-level key a line, one shard a line (diffable, deterministic)."""
    data = manifest_json(tokenizer, shards, build, planned_shards=planned_shards, writer=writer)
    entries = data.pop("shards")
    dump = json_text
    lines = [f"  {dump(k)}: {dump(v)}," for k, v in data.items()]
    body = ",\n".join(f"    {dump(e)}" for e in entries)
    text = "{\n" + "\n".join(lines) + '\n  "shards": [' + (f"\n{body}\n  " if entries else "") + "]\n}\n"
    return text.encode("utf-8")


def write_manifest(path: str | os.PathLike, tokenizer: Tokenizer, shards: Sequence[Shard],
                   build: dict[str, Any] | None = None, *, planned_shards: int | None = None,
                   durable: bool = True, links: str = "follow") -> Manifest:
    """Writes ``shards.json`` atomically (the old file or the new one, never a torn one).

    ``planned_shards`` marks the manifest of a build in progress (see the module docstring).
    What a reader would refuse is refused here first (E9016): the bytes are parsed back and every
    shard path checked before anything is written. A link at ``path`` is written through (a path
    a user names, as ``corpus merge -o``), or with ``links="replace"`` replaced (a build's own
    ``DIR/shards.json``, see :mod:`pskd_jax.corpus.build`)."""
    path = os.fspath(path)
    data = manifest_bytes(tokenizer, shards, build, planned_shards=planned_shards)
    manifest = parse_manifest(decode_manifest(data, path), path)
    directory = manifest_directory(path, links=links)  # where the file written will stand
    for i, shard in enumerate(manifest.shards):
        safe_path(directory, shard.path, f"{path}: shard {i}")
    with atomic_output(path, durable=durable, links=links) as f:
        f.write(data)
    return manifest


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


def put_manifest(store: Store, key: str, tokenizer: Tokenizer, shards: Sequence[Shard],
                 build: dict[str, Any] | None = None, *, planned_shards: int | None = None,
                 writer: str | None = None, mode: str | Version = OVERWRITE) -> tuple[Manifest, ObjectInfo]:
    """Writes ``shards.json`` as one object of ``store`` (seen whole or not at all) under ``mode``
    (a conditional put that loses raises :class:`pskd_jax.storage.Conflict` and writes nothing);
    returns the manifest and what the store says of the object. What a reader would refuse is
    refused first (E9016), as :func:`write_manifest` does."""
    url = store.url(key)
    data = manifest_bytes(tokenizer, shards, build, planned_shards=planned_shards, writer=writer)
    manifest = parse_manifest(decode_manifest(data, url), url)
    if store.scheme != "file":
        where = Location(store.scheme, getattr(store, "bucket", ""), key)
        for i, shard in enumerate(manifest.shards):
            object_shard(where, shard.path, f"{url}: shard {i}")
    else:
        for i in range(len(manifest.shards)):
            manifest.shard_path(i)
    return manifest, store.put(key, data, mode=mode)


def manifest_object(store: Store, key: str) -> tuple[Manifest, ObjectInfo]:
    """The manifest held by an object of ``store`` and what the store says of it (E9003 when
    there is none, E9016 when it is no manifest)."""
    raw, info = store.get(key)
    url = store.url(key)
    return parse_manifest(decode_manifest(raw, url), url), info


def parse_manifest(data: Any, path: str) -> Manifest:
    """Checks a decoded manifest (E9016 naming the field) and returns it."""
    data = check_corpus_format(data, path)
    tokenizer = Tokenizer.from_json(data.get("tokenizer"), path)
    for key, expected in (("vocab_size", tokenizer.vocab_size), ("boundary", tokenizer.boundary)):
        if type(data.get(key)) is not int or data.get(key) != expected:
            raise CorpusDirectoryError(f"{path}: {key} is {json_kind(data.get(key))}, but a {tokenizer.kind} tokenizer "
                            f"of {tokenizer.size} tokens makes it {expected}")
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise CorpusDirectoryError(f"{path}: 'shards' must be a list, got {json_kind(shards)}")
    build = check_build(data.get("build", {}), path)
    planned, writer = _in_progress(data[IN_PROGRESS], len(shards), path) if IN_PROGRESS in data else (None, None)
    entries = tuple(Shard.from_json(s, f"{path}: shard {i}") for i, s in enumerate(shards))
    _refuse_listed_twice(entries, path)
    return Manifest(path, tokenizer, entries, build, planned, writer)


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


def decode_manifest(raw: bytes, path: str) -> Any:
    """The JSON value of a manifest's bytes, E9016 for anything but strict JSON: not UTF-8, not
    JSON, NaN or Infinity, a key twice in one object, nesting too deep for the parser, an integer
    of more digits than Python converts."""
    return loads_strict(raw, path, CorpusDirectoryError, kind="a JSON manifest")


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Reads and checks ``shards.json`` (E9016 if malformed or if a shard path leaves its directory)."""
    path = os.fspath(path)
    data = read_strict(path, CorpusDirectoryError, what="the corpus manifest", kind="a JSON manifest")
    manifest = parse_manifest(data, path)
    for i in range(len(manifest.shards)):
        manifest.shard_path(i)
    return manifest


def is_manifest(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a local file, or an object: ``s3://…/shards.json``) is a corpus manifest: a
    JSON object whose format is ``pskd-corpus`` (of version 1). The answer of
    :func:`~pskd_jax.pipeline.streams.stream_manifest`, the one check every reader of a stream
    makes, with its E9016 (a JSON file that is not a corpus manifest) answered False. E9018 for a
    URL the toolkit cannot serve, and for a store that fails to answer: an answer not heard is no
    "not a manifest"."""
    try:
        return stream_manifest(path) is not None
    except CorpusDirectoryError:
        return False


__all__ = [
    "BUILD_KEYS",
    "FORMAT",
    "MANIFEST",
    "MAX_COUNT",
    "PATH_MAX",
    "SOURCE_KEYS",
    "VERSION",
    "Manifest",
    "Shard",
    "check_build",
    "decode_manifest",
    "is_manifest",
    "manifest_bytes",
    "manifest_directory",
    "manifest_json",
    "manifest_object",
    "object_shard",
    "parse_manifest",
    "put_manifest",
    "read_manifest",
    "safe_path",
    "write_manifest",
]
