"""``shards.json`` while a build runs, and the corpus directory once it is written.

:class:`ManifestPublisher` keeps the manifest listing the longest run of finished shards from the
first (marked in progress) and writes the complete one last; :func:`tidy_directory` then removes
the shards of earlier builds that the finished build no longer lists (only those an earlier record
of the place lists: :func:`pskd_jax.corpus.journal.owned_shards`). Before anything is written,
:func:`check_shard_names` refuses a build whose shard names hold files of the user's. Both engines
(the local pool, Apache Beam) use them.

In a store, every manifest is one object put under a condition: the first "only if what stood
there is still the version read" (or "only if there is none"), each later one "only if it is
still the manifest this build put last". So a build that another has taken over loses at its next
put (E9016, naming the corpus) and lists nothing more. The manifest in progress names its build
(``"writer"``), which every worker checks before it puts a shard
(:class:`pskd_jax.corpus.shard_build.BuildClaim`). The rules a reader relies on: ``docs/corpus.md``
(Building, read while writing).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Collection, Iterable, Sequence

from pskd_jax._os import names
from pskd_jax._os.atomic import fsync_directory, remove_unlocked
from pskd_jax.corpus.manifest import MANIFEST, Manifest, Shard, put_manifest, write_manifest
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_build import ShardResult
from pskd_jax.errors import CorpusDirectoryError, UsageError
from pskd_jax.storage import CREATE, Conflict, Location, Version, resolve

PUBLISH_SECONDS = 0.5  # the least time between two rewrites of shards.json during a build


def finished_prefix(results: Sequence[ShardResult | None]) -> int:
    """How many shards from the first are finished (the run a manifest in progress lists)."""
    for i, result in enumerate(results):
        if result is None:
            return i
    return len(results)


class ManifestPublisher:
    """Keeps ``DIR/shards.json`` listing the finished shards of the build in progress:
    :meth:`start` once the kept shards are known, :meth:`update` as shards finish, :meth:`finish`
    for the complete manifest. Every manifest it writes is atomic, and a link at its name is
    replaced, never written through (the name is the build's own). In a store (``place`` is a
    prefix) each is a conditional put (see the module's documentation): ``condition`` is the
    first's (:func:`pskd_jax.corpus.journal.previous_manifest`), ``writer`` the build's name."""

    def __init__(self, place: Location | str, options: BuildOptions, planned: int, *, writer: str | None = None,
                 condition: str | Version = CREATE):
        self.place = Location("file", "", place) if isinstance(place, str) else place
        self.where = self.place.child(MANIFEST)
        self.path = self.where.url
        self.options, self.planned, self.writer = options, planned, writer
        self.listed: int | None = None  # shards the manifest on disk lists, once this build wrote it
        self._last = 0.0
        self.condition = condition

    @property
    def in_store(self) -> bool:
        return not self.place.is_local

    def start(self, results: Sequence[ShardResult | None]) -> None:
        """The first manifest of the build, unless none is needed yet: every shard is kept (the
        complete one follows at once), or there is no manifest and nothing finished to list (in a
        local directory: in a store the first manifest is the build's claim, always put). From
        here on no shard the manifest lists is rebuilt: only unlisted ones are."""
        listed = finished_prefix(results)
        if listed == len(results) or (listed == 0 and not self.in_store and not os.path.lexists(self.path)):
            self.listed = 0 if listed < len(results) else None
            return
        self._write(results, listed)

    def update(self, results: Sequence[ShardResult | None], *, now: bool = False) -> None:
        """Lists the shards finished since the last rewrite, if the run from the first grew and
        :data:`PUBLISH_SECONDS` have passed (or ``now``: a build that fails lists what it
        finished)."""
        listed = finished_prefix(results)
        if self.listed is not None and self.listed < listed < len(results) \
                and (now or time.monotonic() - self._last >= PUBLISH_SECONDS):
            self._write(results, listed)

    def finish(self, results: Sequence[ShardResult]) -> Manifest:
        """The complete manifest (atomically, durably)."""
        entries = [r.entry for r in results]
        if self.in_store:
            return self._put(entries, None)
        return write_manifest(self.path, self.options.tokenizer, entries, self.options.recorded(), links="replace")

    def _write(self, results: Sequence[ShardResult | None], listed: int) -> None:
        entries = [r.entry for r in results[:listed] if r is not None]
        if self.in_store:
            self._put(entries, self.planned)
        else:
            write_manifest(self.path, self.options.tokenizer, entries, self.options.recorded(),
                           planned_shards=self.planned, durable=self.options.durable, links="replace")
        self.listed, self._last = listed, time.monotonic()

    def _put(self, entries: Sequence[Shard], planned: int | None) -> Manifest:
        store, _ = resolve(self.where)
        try:
            manifest, info = put_manifest(store, self.where.key, self.options.tokenizer, entries,
                                          self.options.recorded(), planned_shards=planned,
                                          writer=self.writer if planned is not None else None, mode=self.condition)
        except Conflict as e:
            raise CorpusDirectoryError(f"{self.path}: another build of this corpus put its manifest while this one "
                                       f"ran ({e.why}); this build's shards are not listed: run one build of a corpus "
                                       "at a time, then run it again to finish it") from None
        self.condition = Version(info.tag)
        return manifest


def check_manifest_name(path: str) -> None:
    """Refuses (E9012) a build whose ``shards.json`` name holds a directory, a FIFO or a device: the
    build replaces a manifest (a file, or a link: not followed), never removes what a user put there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UsageError(f"{path}: not a file (a directory, a FIFO or a device stands there); the build writes "
                         "its manifest there: move it away or build into another directory")


def check_shard_names(place: Location, planned: Iterable[str], owned: Collection[str]) -> None:
    """Refuses (E9012), before anything is written, a build of ``place`` (a directory, or a prefix
    of a store) when a file, a symbolic link or an object stands at a shard name it would write
    (``planned``) that is not the toolkit's own (``owned``,
    :func:`pskd_jax.corpus.journal.owned_shards`): the build would replace it. In a store the
    prefix is listed once. A directory, a FIFO or a device at a shard's name is left to the
    shard's writer, which refuses it."""
    wanted = sorted(set(planned) - set(owned))
    if not wanted:
        return
    found: list[tuple[str, str]] = []
    if place.is_local:
        for name in wanted:
            path = os.path.join(place.path, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                found.append((path, "a symbolic link"))
            elif stat.S_ISREG(mode):
                found.append((path, "a file"))
    else:
        store, _ = resolve(place)
        listed = {o.key.rpartition("/")[2] for o in store.list(place.key)}
        found = [(place.child(name).url, "an object") for name in wanted if name in listed]
    if found:
        where, what = found[0]
        more = f" (and {len(found) - 1} more at the build's other shard names)" if len(found) > 1 else ""
        raise UsageError(f"{where}: {what} stands at a shard's name{more}, and no manifest or journal of this corpus "
                         "lists it: the build will not replace it; move it away or build into another directory")


def remove_stale_shards(directory: str, keep: Collection[str], owned: Collection[str]) -> list[str]:
    """Removes the shards of earlier builds that the new manifest does not list (a build of fewer
    inputs than the last one), and the temporary files killed writers of any shard left; returns
    them. Only names an earlier record of the directory lists (``owned``) are candidates, and only
    files or links, never a directory: any other file, at a shard's name or not, is the user's."""
    try:
        listed = sorted(os.listdir(directory))
    except OSError:
        return []
    removed = remove_killed_writers(directory, listed)
    for name in listed:
        if names.shard_index(name) is None or name in keep or name not in owned:
            continue
        path = os.path.join(directory, name)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def remove_killed_writers(directory: str, listed: Collection[str] | None = None) -> list[str]:
    """Removes the temporary files that killed writers of shards left in ``directory`` (a shard's
    hidden temporary name, no writer holding its lock: a running writer's stays); returns them.
    ``listed``: the directory's names, when the caller has listed it already (one listing for
    any number of them, not one a shard)."""
    try:
        listed = sorted(os.listdir(directory)) if listed is None else listed
    except OSError:
        return []
    return remove_unlocked(directory, [name for name in listed if _shard_temporary(name)])


def _shard_temporary(name: str) -> bool:
    """Whether ``name`` is the hidden temporary name of a shard's writer."""
    left = names.leftover(name)
    return left is not None and left[0] == "random" and names.shard_index(left[1]) is not None


def tidy_directory(directory: str | Location, manifest: Manifest, owned: Collection[str]) -> None:
    """After the complete manifest: the shards of earlier builds it does not list removed (only the
    names in ``owned``, those earlier records of the place list:
    :func:`pskd_jax.corpus.journal.owned_shards`), and killed writers' temporary files; the
    journal of a build removed, the directory synced. In a store the same: objects at owned shard
    names that the manifest does not list, and the journal."""
    place = Location("file", "", directory) if isinstance(directory, str) else directory
    keep = {s.path for s in manifest.shards}
    if not place.is_local:
        _tidy_prefix(place, keep, owned)
        return
    remove_stale_shards(place.path, keep, owned)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(place.path, names.CORPUS_JOURNAL))
    fsync_directory(place.path)


def _tidy_prefix(place: Location, keep: Collection[str], owned: Collection[str]) -> None:
    store, _ = resolve(place)
    for found in store.list(place.key):
        name = found.key.rpartition("/")[2]
        if names.shard_index(name) is not None and name not in keep and name in owned:
            store.delete(found.key)
    store.delete(place.child(names.CORPUS_JOURNAL).key)


__all__ = ["PUBLISH_SECONDS", "ManifestPublisher", "check_manifest_name", "check_shard_names", "finished_prefix",
           "remove_killed_writers", "remove_stale_shards", "tidy_directory"]
