"""Resuming a local build: ``DIR/.shards.journal`` and the shards earlier builds finished.

The journal's first line holds the tokenizer and the recorded build options, then one JSON line a
finished shard, appended and synced as each finishes; it is removed once the complete manifest is
written. A rerun keeps a shard that the journal or a previous ``shards.json`` records for the same
input and options when its file still matches its entry. See ``docs/corpus.md`` (Building).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output
from pskd_jax._os.files import read_whole
from pskd_jax._os.jsonfile import json_text, read_strict
from pskd_jax.corpus.manifest import MANIFEST, Shard, parse_manifest
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.errors import CorpusDirectoryError, PskdError

JOURNAL_FORMAT = "pskd-corpus-journal"


class BuildJournal:
    """``DIR/.shards.journal``: the finished shards of the build in progress, one JSON line each."""

    def __init__(self, directory: str, options: BuildOptions):
        self.path = os.path.join(directory, names.CORPUS_JOURNAL)
        self.header = {"format": JOURNAL_FORMAT, "tokenizer": options.tokenizer.to_json(),
                       "build": options.recorded()}
        self._file: Any = None

    def read(self) -> dict[str, Shard]:
        """The entries of a journal written with the same tokenizer and options (a torn last line,
        from a crash while appending, is ignored)."""
        try:
            lines = read_whole(self.path).split(b"\n")  # a regular file only, never a FIFO waited on
        except PskdError:
            return {}
        entries: dict[str, Shard] = {}
        try:
            if json.loads(lines[0]) != self.header:
                return {}
        except (ValueError, RecursionError):
            return {}
        for line in lines[1:]:
            try:
                shard = Shard.from_json(json.loads(line), self.path)
            except (ValueError, RecursionError, PskdError):
                continue
            entries[shard.path] = shard
        return entries

    def start(self, entries: Sequence[Shard]) -> None:
        """A fresh journal holding ``entries`` (a link at its name replaced, never written
        through), then opened for appending: the file just renamed into place, never a link."""
        with atomic_output(self.path, links="replace") as f:
            f.write(self._line(self.header))
            for shard in entries:
                f.write(self._line(shard.to_json()))
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


def recorded_shards(directory: str, journal: BuildJournal, options: BuildOptions) -> dict[str, Shard]:
    """Shards finished by earlier builds with the same tokenizer and options, by file name: the
    journal's, and those of a ``shards.json`` left by a finished build (or one in progress)."""
    entries: dict[str, Shard] = {}
    path = os.path.join(directory, MANIFEST)
    try:  # the entries only: the build uses its own shard paths, and replaces a link at one
        old = parse_manifest(read_strict(path, CorpusDirectoryError), path)
        if old.tokenizer == options.tokenizer and old.build == options.recorded():
            entries.update((s.path, s) for s in old.shards)
    except PskdError:  # none, or not one to trust: every shard is rebuilt
        pass
    entries.update(journal.read())
    return entries


__all__ = ["JOURNAL_FORMAT", "BuildJournal", "recorded_shards"]
