"""Resuming a build: ``DIR/.shards.journal`` and the shards earlier builds finished.

The journal's first line holds the tokenizer and the recorded build options, the second the names
of the shards the build may write (``{"writes": [...]}``: its own, and those earlier records of the
place listed), then one JSON line a finished shard, appended and synced as each finishes; it is
removed once the complete manifest is written. In a store, where nothing is appended, the journal
is an object of the same lines (:class:`ObjectJournal`), put whole again as each shard finishes.
A rerun keeps a shard that the journal or a previous ``shards.json`` records for the same input
and options when its file (or object) still matches its entry.

The same records say which files at shard names are the toolkit's own (:func:`owned_shards`):
those the ``shards.json`` of the place lists, or a journal of any build of it. A build replaces or
removes only those, and refuses to start where another file stands at a name it would write. See
``docs/corpus.md`` (Building).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.files import read_whole
from pskd_jax._os.jsonfile import json_text, read_strict
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard, manifest_object, parse_manifest
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import CorpusDirectoryError, PskdError
from pskd_jax.storage import CREATE, Location, ObjectInfo, Version, resolve

JOURNAL_FORMAT = "pskd-corpus-journal"


class BuildJournal:
    """``DIR/.shards.journal``: the finished shards of the build in progress, one JSON line each."""

    def __init__(self, directory: str, options: BuildOptions):
        self.path = os.path.join(directory, names.CORPUS_JOURNAL)
        self.header = {"format": JOURNAL_FORMAT, "tokenizer": options.tokenizer.to_json(),
                       "build": options.recorded()}
        self._file: Any = None

    def _raw(self) -> bytes | None:
        """The journal's bytes, None when there is none to read."""
        try:
            return read_whole(self.path)  # a regular file only, never a FIFO waited on
        except PskdError:
            return None

    def read(self) -> dict[str, Shard]:
        """The entries of a journal written with the same tokenizer and options (a torn last line,
        from a crash while appending, is ignored, and so is the line of names the build writes)."""
        raw = self._raw()
        return {} if raw is None else self._entries(raw)

    def _entries(self, raw: bytes) -> dict[str, Shard]:
        lines = raw.split(b"\n")
        entries: dict[str, Shard] = {}
        try:
            if json.loads(lines[0]) != self.header:
                return {}
        except (ValueError, RecursionError):
            return {}
        for line in lines[1:]:
            try:  # (the "writes" line is no shard entry: Shard.from_json refuses it)
                shard = Shard.from_json(json.loads(line), self.path)
            except (ValueError, RecursionError, PskdError):
                continue
            entries[shard.path] = shard
        return entries

    def owned(self) -> set[str]:
        """The shard names the journal standing there records, whatever tokenizer and options
        its build had: those of its "writes" line and of its entries. Nothing unless its first
        line is a journal's header."""
        raw = self._raw()
        if raw is None:
            return set()
        lines = raw.split(b"\n")
        try:
            header = json.loads(lines[0])
        except (ValueError, RecursionError):
            return set()
        if not isinstance(header, dict) or header.get("format") != JOURNAL_FORMAT:
            return set()
        found: set[str] = set()
        for line in lines[1:]:
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(data, dict) and isinstance(data.get("writes"), list):
                found.update(n for n in data["writes"] if isinstance(n, str))
                continue
            try:
                found.add(Shard.from_json(data, self.path).path)
            except PskdError:
                continue
        return {n for n in found if names.shard_index(n) is not None}

    def _opening(self, entries: Sequence[Shard], writes: Iterable[str]) -> list[bytes]:
        return [self._line(self.header), self._line({"writes": sorted(set(writes))}),
                *(self._line(shard.to_json()) for shard in entries)]

    def start(self, entries: Sequence[Shard], writes: Iterable[str] = ()) -> None:
        """A fresh journal: the header, the line of shard names the build may write (``writes``:
        so that a rerun after a kill knows the files at them for the toolkit's), and ``entries``
        (a link at its name replaced, never written through); then opened for appending: the
        file just renamed into place, never a link."""
        with atomic_output(self.path, links="replace") as f:
            for line in self._opening(entries, writes):
                f.write(line)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        self._file = open(fd, "ab")  # noqa: SIM115  # appended to until close(), not within one block

    def add(self, shard: Shard) -> None:
        """Records one more finished shard, durably."""
        self._file.write(self._line(shard.to_json()))
        self._file.flush()
        os.fsync(self._file.fileno())

    def fileno(self) -> int | None:
        """The descriptor appended to (a forked pool worker closes it), None when not open."""
        return self._file.fileno() if self._file is not None else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def _line(data: Any) -> bytes:
        return (json_text(data) + "\n").encode("utf-8")  # a file name that is not UTF-8 included


class ObjectJournal(BuildJournal):
    """The journal of a build into a store: the object ``PREFIX/.shards.journal``, the same lines
    as a local journal's, put whole at :meth:`start` and again at each :meth:`add` (an object
    cannot be appended to; each put is seen whole). Losing it costs a rerun the shards it listed,
    never a wrong corpus: a kept shard is checked against its entry first."""

    def __init__(self, place: Location, options: BuildOptions):
        super().__init__("", options)
        self.where = place.child(names.CORPUS_JOURNAL)
        self.path = self.where.url
        self._store, _ = resolve(self.where)
        self._lines: list[bytes] = []

    def _raw(self) -> bytes | None:
        try:
            raw, _ = self._store.get(self.where.key)
        except PskdError:
            return None
        return raw

    def start(self, entries: Sequence[Shard], writes: Iterable[str] = ()) -> None:
        self._lines = self._opening(entries, writes)
        self._store.put(self.where.key, b"".join(self._lines))

    def add(self, shard: Shard) -> None:
        self._lines.append(self._line(shard.to_json()))
        self._store.put(self.where.key, b"".join(self._lines))

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        self._lines = []


def journal_for(place: Location, options: BuildOptions) -> BuildJournal:
    """The journal of a build into ``place``: a local directory's file, or a store's object."""
    return BuildJournal(place.path, options) if place.is_local else ObjectJournal(place, options)


def previous_manifest(place: Location) -> tuple[Manifest | None, str | Version]:
    """The ``shards.json`` standing in ``place`` (a prefix of a store) and the condition a build's
    first manifest is put under: :data:`pskd_jax.storage.CREATE` when there is none, else its
    version (so that a build started meanwhile makes one of the two lose). Something there that is
    no manifest is replaced like an old one (None, its version)."""
    store, _ = resolve(place)
    key = place.child(MANIFEST).key
    try:
        manifest, info = manifest_object(store, key)
    except CorpusDirectoryError:
        found: ObjectInfo | None = store.info(key)
        return None, (CREATE if found is None else Version(found.tag))
    except PskdError:
        if store.info(key) is None:
            return None, CREATE
        raise
    return manifest, Version(info.tag)


def local_manifest(directory: str) -> Manifest | None:
    """The ``shards.json`` standing in a local directory (finished or in progress), None when
    there is none or it is no manifest (a link at the name is read through: only the entries are
    used, never its paths outside the directory)."""
    path = os.path.join(directory, MANIFEST)
    try:
        return parse_manifest(read_strict(path, CorpusDirectoryError), path)
    except PskdError:  # none, or not one to trust
        return None


def recorded_shards(journal: BuildJournal, options: BuildOptions, previous: Manifest | None) -> dict[str, Shard]:
    """Shards finished by earlier builds with the same tokenizer and options, by file name: the
    journal's, and those of ``previous``, the ``shards.json`` a finished build (or one in
    progress) left (:func:`local_manifest`, or in a store :func:`previous_manifest`)."""
    entries: dict[str, Shard] = {}
    old = previous
    if old is not None and old.tokenizer == options.tokenizer and old.build == options.recorded():
        entries.update((s.path, s) for s in old.shards)
    entries.update(journal.read())
    return entries


def owned_shards(journal: BuildJournal, previous: Manifest | None) -> set[str]:
    """The shard names (:func:`pskd_jax._os.names.shard_name`) of a place that are provably the
    toolkit's own: those the ``shards.json`` standing there lists (``previous``, as for
    :func:`recorded_shards`) and those its journal records, whatever tokenizer and options their
    builds had. Only files at these names may be replaced or removed by a build; anything else
    at a shard's name is the user's."""
    owned = {s.path for s in previous.shards} if previous is not None else set()
    owned = {n for n in owned if names.shard_index(n) is not None}  # (a merged manifest's a/shard-… are elsewhere)
    return owned | journal.owned()


__all__ = ["JOURNAL_FORMAT", "BuildJournal", "ObjectJournal", "journal_for", "local_manifest", "owned_shards",
           "previous_manifest", "recorded_shards"]
