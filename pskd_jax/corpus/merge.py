"""Merging corpus manifests: parts built apart (one process, machine or job each) become one corpus.

:func:`merge_manifests` lists the shards of several manifests, in the order given, in one new
``shards.json`` whose paths are relative to its own place: a local directory above every shard,
or a prefix of a store above every shard object (``s3://bucket/all/shards.json`` over
``s3://bucket/all/part-1/…``). The manifests and the output are of one kind of place: local
files merge into a local manifest, objects of one bucket into an object of that bucket.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from pskd_jax.corpus.inputs import file_identity
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.manifest import (
    Manifest,
    Shard,
    manifest_directory,
    manifest_object,
    object_shard,
    put_manifest,
    read_manifest,
    write_manifest,
)
from pskd_jax.errors import CorpusDirectoryError, UsageError
from pskd_jax.storage import Location, locate, resolve


def merge_manifests(manifests: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]) -> Manifest:
    """One manifest listing the shards of several, in the order given, written to ``output``.

    Every shard path is rewritten relative to ``output``'s directory (or prefix), which must hold
    them all (E9016 otherwise), and every manifest must have the same tokenizer and build options.
    A shard listed twice (one manifest given twice, or two that list one file: for local files the
    same file under any name or link) is refused (E9016): its tokens would appear twice in the
    stream. A local output is written atomically, holding the directory's build lock: a merge into
    a directory where a corpus build is running is refused (E9016). An output in a store is one
    put (seen whole or not at all); the manifests must lie in the same bucket.
    """
    if not manifests:
        raise UsageError("merge needs at least one manifest")
    where = locate(output)
    parts = [locate(m) for m in manifests]
    foreign = [p.url for p in parts if (p.scheme, p.bucket) != (where.scheme, where.bucket)]
    if foreign:
        raise UsageError(f"{foreign[0]}: a merged manifest lists shards relative to its own place, so the manifests "
                         f"merged into {where.url} lie in the same {'bucket' if not where.is_local else 'file system'}")
    read = [_read(p) for p in parts]
    first = read[0][0]
    for m, _ in read:
        _check_alike(m, first)
    if not where.is_local:
        store, _ = resolve(where)
        return put_manifest(store, where.key, first.tokenizer, shards=_rebased(read, where.parent(), where),
                            build=first.build)[0]
    # The merged file is written through a link at ``output``: its shards are relative to, and
    # its lock is, the directory the file lands in, as every reader will find them.
    root = manifest_directory(where.path)
    shards = _rebased(read, Location("file", "", root), where)
    with directory_lock(root):
        return write_manifest(where.path, first.tokenizer, shards, first.build)


def _read(place: Location) -> tuple[Manifest, list[Location]]:
    """A manifest and where each of its shards lies (paths that leave its place refused, E9016)."""
    if place.is_local:
        m = read_manifest(place.path)
        return m, [Location("file", "", os.path.abspath(m.shard_path(i))) for i in range(len(m.shards))]
    store, _ = resolve(place)
    m, _ = manifest_object(store, place.key)
    return m, [object_shard(place, s.path, f"{m.path}: shard {i}") for i, s in enumerate(m.shards)]


def _check_alike(m: Manifest, first: Manifest) -> None:
    if not (m.tokenizer.matches(first.tokenizer) and m.tokenizer.boundary == first.tokenizer.boundary):  # any path
        raise CorpusDirectoryError(f"{m.path}: its tokenizer ({m.tokenizer.describe()}) differs from "
                                   f"{first.path}'s ({first.tokenizer.describe()}); only corpora of one "
                                   "vocabulary merge")
    if not m.complete:
        raise CorpusDirectoryError(f"{m.path}: a build of this corpus is in progress or was interrupted "
                                   f"({len(m.shards)} of {m.planned_shards} shards listed); merge it once its "
                                   "build has finished")
    if m.build != first.build:
        differ = sorted(k for k in set(m.build) | set(first.build) if m.build.get(k) != first.build.get(k))
        raise CorpusDirectoryError(f"{m.path}: its build options differ from {first.path}'s ("
                                   + ", ".join(f"{k} {m.build.get(k)!r} against {first.build.get(k)!r}" for k in differ)
                                   + "); only corpora built alike merge")


def _rebased(read: list[tuple[Manifest, list[Location]]], base: Location, output: Location) -> list[Shard]:
    """Every shard, its path made relative to ``base``, the output's directory or prefix; a shard
    listed twice refused."""
    seen: dict[tuple[object, ...], str] = {}  # a shard's identity → the manifest that listed it first
    shards: list[Shard] = []
    for m, places in read:
        for i, (shard, where) in enumerate(zip(m.shards, places)):
            identity = file_identity(where)
            if identity in seen:
                raise CorpusDirectoryError(f"{m.path}: shard {i} {shard.path} is {_shown(where)}, which "
                                           f"{seen[identity]} lists already (the same file, under this name or "
                                           "another: a link); a merged corpus lists each shard once")
            seen[identity] = m.path
            shards.append(dataclasses.replace(shard, path=_relative(where, base, m, shard, output)))
    return shards


def _relative(where: Location, base: Location, m: Manifest, shard: Shard, output: Location) -> str:
    if where.is_local:
        root = base.path
        relative = os.path.relpath(where.path, root)
        if relative.split(os.sep)[0] == "..":
            raise CorpusDirectoryError(f"{m.path}: shard {shard.path} lies outside {root}, the directory of "
                                       f"{output.url}; put the merged manifest in a directory above every shard")
        return relative.replace(os.sep, "/")
    prefix = base.key + "/" if base.key else ""
    if not where.key.startswith(prefix):
        raise CorpusDirectoryError(f"{m.path}: shard {shard.path} lies outside {base.url}/, the prefix of "
                                   f"{output.url}; put the merged manifest in a prefix above every shard")
    return where.key[len(prefix):]


def _shown(where: Location) -> str:
    return os.path.realpath(where.path) if where.is_local else where.url


__all__ = ["merge_manifests"]
