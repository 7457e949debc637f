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
from pskd_jax._os.jsonfile import json_text, loads_strict, read_strict
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.data.corpus_manifest import (
    BUILD_KEYS,
    CORPUS_FORMAT,
    CORPUS_VERSION,
    IN_PROGRESS,
    MAX_COUNT,
    PATH_MAX,
    SOURCE_KEYS,
    ManifestRecord,
    Shard,
    check_build,
    manifest_directory,
    object_shard,
    parse_record,
    safe_path,
    shard_places,
)
from pskd_jax.errors import CorpusDirectoryError
from pskd_jax.pipeline.streams import stream_manifest
from pskd_jax.storage import OVERWRITE, Location, ObjectInfo, Store, Version

# The manifest's fields are parsed and its shard paths checked in pskd_jax/data/corpus_manifest.py,
# the one parser that pskd pipeline's counts (a layer below this package) use too.

FORMAT = CORPUS_FORMAT

VERSION = CORPUS_VERSION

MANIFEST = names.CORPUS_MANIFEST


@dataclasses.dataclass(frozen=True)
class Manifest(ManifestRecord):
    """A parsed ``shards.json`` whose tokenizer encodes; :meth:`shard_path` gives a shard's
    checked location."""

    tokenizer: Tokenizer

    @functools.cached_property
    def directory(self) -> str:
        """The directory its shard paths are relative to (:func:`manifest_directory`), decided
        once: every shard of one manifest read is found in the same place."""
        return manifest_directory(self.path)

    def shard_path(self, i: int) -> str:
        """Where shard i lies, refusing a path that leaves the manifest's directory (E9016)."""
        return safe_path(self.directory, self.shards[i].path, f"{self.path}: shard {i}")

    def to_bytes(self) -> bytes:
        return manifest_bytes(self.tokenizer, self.shards, self.build, planned_shards=self.planned_shards,
                              writer=self.writer)


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
    shard_places(manifest, Location("file", "", path), manifest_directory(path, links=links))  # (where it will stand)
    with atomic_output(path, durable=durable, links=links) as f:
        f.write(data)
    return manifest


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
    shard_places(manifest, Location(store.scheme, getattr(store, "bucket", ""), key) if store.scheme != "file"
                 else Location("file", "", url))
    return manifest, store.put(key, data, mode=mode)


def manifest_object(store: Store, key: str) -> tuple[Manifest, ObjectInfo]:
    """The manifest held by an object of ``store`` and what the store says of it (E9003 when
    there is none, E9016 when it is no manifest)."""
    raw, info = store.get(key)
    url = store.url(key)
    return parse_manifest(decode_manifest(raw, url), url), info


def parse_manifest(data: Any, path: str) -> Manifest:
    """Checks a decoded manifest (E9016 naming the field: :func:`~pskd_jax.data.corpus_manifest.parse_record`)
    and returns it, its tokenizer one that encodes."""
    record = parse_record(data, path)
    return Manifest(path, Tokenizer.of_record(record.tokenizer), record.shards, record.build, record.planned_shards,
                    record.writer)


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
    shard_places(manifest, Location("file", "", path), manifest.directory)
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
