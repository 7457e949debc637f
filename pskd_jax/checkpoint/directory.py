"""A checkpoint directory as the manager touches it: the one place where its entries are looked at
(without following links), listed, proved idle and removed. The index, recovery, adoption and
verification take a :class:`CheckpointDirectory` value, so that another place to keep checkpoints
can stand in for a local directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from pskd_jax._os import names
from pskd_jax._os.atomic import atomic_output, remove_stale_temporaries
from pskd_jax._os.checks import mode_words
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.jsonfile import loads_strict, read_strict
from pskd_jax._os.locks import destination_lock
from pskd_jax.checkpoint.integrity import digest_of, verify_bytes
from pskd_jax.checkpoint.parts import parts_index_at, parts_named_for
from pskd_jax.checkpoint.stored import StoredFile
from pskd_jax.errors import CheckpointDirectoryError, DigestMismatchError, PskdError, TruncatedError
from pskd_jax.format.layout_file import (
    LayoutFile,
    check_belongs,
    layout_from_bytes,
    read_layout_and_bytes,
    read_layout_file,
)
from pskd_jax.format.reader import Reader
from pskd_jax.storage import CREATE, Conflict, Location, Store, Version, locate, store_for


class ListedStep(Protocol):
    """What the directory reads of an index entry (:class:`~pskd_jax.checkpoint.index.CheckpointEntry`,
    which this module cannot import: the index reads directories)."""

    @property
    def step(self) -> int: ...

    @property
    def file(self) -> str: ...

    @property
    def layout_name(self) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class CheckpointDirectory:
    """The directory ``path`` of a checkpoint manager (a path as given: it is not resolved)."""

    path: str

    @classmethod
    def of(cls, directory: str | os.PathLike[str] | CheckpointDirectory) -> CheckpointDirectory:
        """The directory (or, for an ``s3://``, ``gs://`` or ``memory://`` URL, the key prefix of
        a bucket: :class:`StoredDirectory`) at ``directory``; E9018 for a URL no store serves."""
        if isinstance(directory, CheckpointDirectory):
            return directory
        where = locate(directory)
        return cls(where.path) if where.is_local else StoredDirectory.at(where)

    @property
    def is_local(self) -> bool:
        return True

    def read_index_file(self, name: str, error: type[PskdError], what: str) -> tuple[Any, str | None]:
        """The JSON value of the index file ``name`` (a regular file, strict JSON) and its version
        tag (None on a local directory, whose writers the directory's lock orders)."""
        return read_strict(self.join(name), error, what=what), None

    def write_index_file(self, name: str, data: bytes, *, durable: bool, tag: str | None, exists: bool
                         ) -> str | None:
        """Writes the index file ``name``, atomically (the caller holds the directory's lock); its
        new tag (None here)."""
        with atomic_output(self.join(name), durable=durable) as f:
            f.write(data)
        return None

    def layout_of(self, name: str) -> LayoutFile:
        """The layout file ``name`` read (not yet proven to belong to any data file)."""
        return read_layout_file(self.join(name))

    def checked_layout(self, entry: ListedStep, digests: Mapping[str, str]) -> LayoutFile:
        """The layout file of a listed step read once and checked against the digests the index
        records of it (:meth:`check_layout_bytes`), so that what a restore uses is what was
        committed: the data file's digest does not cover it."""
        assert entry.layout_name is not None
        raw, layout_file = read_layout_and_bytes(self.join(entry.layout_name))
        self.check_layout_bytes(entry, raw, digests)
        return layout_file

    def check_layout_bytes(self, entry: ListedStep, raw: bytes, digests: Mapping[str, str]) -> None:
        """Checks the bytes of a listed step's layout file against the digests the index records of
        it; E9013 naming the step's file and the layout file when it was changed since its save."""
        assert entry.layout_name is not None
        try:
            verify_bytes(self.join(entry.layout_name), raw, digests)
        except DigestMismatchError as e:
            raise DigestMismatchError(f"step {entry.step} {self.join(entry.file)}: its layout file: "
                                      f"{e.message}") from None

    def layout_digests(self, name: str, file: str, algorithms: Iterable[str], xxh3_128: str | None) -> dict[str, str]:
        """The digests of the layout file ``name`` by algorithm, once it proves to be the step file
        ``file``'s own (E9005 naming both otherwise): what the index records of it."""
        raw, layout_file = read_layout_and_bytes(self.join(name))
        self.check_layout(layout_file, file, xxh3_128)
        return {algorithm: DIGESTS[algorithm](raw).hexdigest() for algorithm in algorithms}

    def checkpoint(self, name: str) -> Reader | StoredFile:
        """The step file ``name`` opened for its header, size and placement."""
        return Reader(self.join(name))

    def check_layout(self, layout_file: LayoutFile, name: str, xxh3_128: str | None) -> None:
        """Refuses (E9005 naming both) a layout file written for another file than ``name``."""
        check_belongs(layout_file, self.join(name), xxh3_128=xxh3_128)

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def mode(self, name: str) -> int | None:
        """The ``lstat`` mode of ``name`` in the directory (a link itself, not what it leads to),
        None when nothing is there; E9014 naming it when it cannot be looked at."""
        return found_mode(self.join(name))

    def regular(self, name: str) -> bool:
        """Whether a regular file stands at ``name`` (not a link, a directory, a FIFO, …)."""
        mode = self.mode(name)
        return mode is not None and stat.S_ISREG(mode)

    def names(self, *, missing_ok: bool = False) -> list[str]:
        """What the directory holds; E9014 when it cannot be listed (an empty list for a directory
        that does not exist, with ``missing_ok``)."""
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            if missing_ok:
                return []
            raise CheckpointDirectoryError(f"{self.path}: cannot list the directory: it does not exist") from None
        except OSError as e:
            raise CheckpointDirectoryError(f"{self.path}: cannot list the directory: {e.strerror or e}") from e

    def remove(self, dropped: Iterable[str]) -> None:
        """Removes files the index no longer lists: only regular files (the manager writes nothing
        else); a link, a directory or anything else at such a name is left alone."""
        for name in dropped:
            if not self.regular(name):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.join(name))

    def unlisted_own(self, step: int, listed: set[str]) -> list[str]:
        """The regular files of a step that no entry lists (the manager's own when the index
        claims the step under ``leftovers``), and on a bucket its unreferenced part objects."""
        return [name for name in step_names(step) if name not in listed and self.regular(name)] + \
            self.unreferenced_parts(step, listed)

    def unreferenced_parts(self, step: int, listed: set[str], listing: list[str] | None = None) -> list[str]:
        """The part objects of the step's checkpoint (named exactly as a parts save names them;
        of ``listing`` when given, else of the directory listed now) that its committed parts index
        does not reference: all of them when no entry lists the step's file. None in a local
        directory (a save from several processes there writes one file)."""
        return []

    @contextlib.contextmanager
    def idle(self, name: str) -> Iterator[bool]:
        """Holds the save lock of the step file ``name`` for a ``with`` block when no save of it is
        under way; yields False when one is, or when the lock cannot be taken (something other than
        a file at its name): the caller then leaves the step's files alone."""
        with contextlib.ExitStack() as stack:
            try:
                idle = stack.enter_context(destination_lock(self.join(name), wait=False, keep_committing=False))
            except PskdError:  # a link or a directory at the lock's name
                idle = False
            yield idle

    def readable(self, step: int, file: str, layout: str | None) -> str:
        """The path of a listed step's file, to read. Refused (E9014) when it, or its layout file,
        resolves through a symlink to somewhere outside the directory (an index reads only its own
        files), or when it is not a regular file (a FIFO would block a reader); E9003 when it is
        missing."""
        root = os.path.realpath(self.path)
        for name in (file, layout):
            if name is None:
                continue
            real = os.path.realpath(self.join(name))
            if os.path.dirname(real) != root:
                raise CheckpointDirectoryError(f"{self.path}: step {step}: {name} leads to {real}, outside "
                                               "the checkpoint directory (through a symlink)")
        path = self.join(file)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise TruncatedError(f"{path}: step {step} is listed in the checkpoint index, but its file "
                                 "is missing") from None
        except OSError as e:
            raise TruncatedError(f"{path}: step {step}: cannot read: {e.strerror or e}") from e
        if not stat.S_ISREG(mode):
            raise CheckpointDirectoryError(f"{path}: step {step}: {mode_words(mode)}, not a regular file")
        return path

    def exists(self, name: str) -> bool:
        """Whether anything stands at ``name`` (a dangling link included)."""
        return os.path.lexists(self.join(name))

    def digest(self, name: str, algorithm: str) -> str:
        """The digest of the whole file ``name`` (hex, lowercase)."""
        return digest_of(self.join(name), algorithm)

    def save_lock_exists(self, file: str) -> bool:
        """Whether the save lock of the step file ``file`` stands beside it (a save of it is under
        way, or one was killed)."""
        return found_mode(names.save_lock(self.join(file))) is not None

    def remove_stale_temporaries(self, file: str) -> None:
        """Removes the temporary files of ``file`` that no live writer holds (each writer holds its
        temporary file's ``flock`` until the rename)."""
        remove_stale_temporaries(self.join(file))

    def remove_distributed_temporary(self, file: str) -> None:
        """Removes the temporary file of a distributed save of ``file`` (once no save holds it)."""
        with contextlib.suppress(OSError):
            os.unlink(names.distributed_temporary(self.join(file)))


@dataclasses.dataclass(frozen=True)
class StoredDirectory(CheckpointDirectory):
    """A checkpoint directory that is a key prefix of a bucket (``path`` its URL). Its entries are
    the objects directly under the prefix (each a regular file, as the manager sees it); there are
    no links, temporary files or save locks on a bucket, and no rename: each object appears whole,
    and the index is written last with a conditional put (only if absent, or only if still the
    version read), so that of two writers the second is refused (E9014) instead of overwriting.
    Nothing here removes an object the index does not prove the manager's own."""

    where: Location = dataclasses.field(default=None)  # type: ignore[assignment]

    @classmethod
    def at(cls, where: Location) -> StoredDirectory:
        where = Location(where.scheme, where.bucket, where.key.rstrip("/"))
        store_for(where)  # (E9018 now for a store without its client)
        return cls(where.url, where)

    @property
    def is_local(self) -> bool:
        return False

    @property
    def store(self) -> Store:
        return store_for(self.where)

    def key(self, name: str) -> str:
        return self.where.child(name).key

    def join(self, name: str) -> str:
        return self.where.child(name).url

    def mode(self, name: str) -> int | None:
        return stat.S_IFREG | 0o644 if self.store.info(self.key(name)) is not None else None

    def names(self, *, missing_ok: bool = False) -> list[str]:
        # (a prefix with nothing under it is an empty directory: a bucket has no directories)
        return [info.key.rpartition("/")[2] for info in self.store.list(self.where.key)]

    def remove(self, dropped: Iterable[str]) -> None:
        for name in dropped:
            self.store.delete(self.key(name))

    def unreferenced_parts(self, step: int, listed: set[str], listing: list[str] | None = None) -> list[str]:
        file = names.step_file(step)
        parts = parts_named_for(self.names() if listing is None else listing, file)
        if not parts or file not in listed:
            return parts
        try:
            index = parts_index_at(self.store, self.key(file), self.join(file))
        except PskdError:  # (a damaged index: what it references cannot be told, so nothing goes)
            return []
        referenced = set(index.keys) if index is not None else set()
        return [name for name in parts if self.key(name) not in referenced]

    @contextlib.contextmanager
    def idle(self, name: str) -> Iterator[bool]:
        # No save lock on a bucket: what tells a manager's saves apart from another's is the index
        # (a step's claim must still stand when its entry is committed: see commit_step).
        yield True

    def readable(self, step: int, file: str, layout: str | None) -> str:
        if self.store.info(self.key(file)) is None:
            raise TruncatedError(f"{self.join(file)}: step {step} is listed in the checkpoint index, but its "
                                 "object is missing")
        return self.join(file)

    def exists(self, name: str) -> bool:
        return self.store.info(self.key(name)) is not None

    def save_lock_exists(self, file: str) -> bool:
        return False

    def remove_stale_temporaries(self, file: str) -> None:
        pass  # (nothing is written under a temporary name on a bucket)

    def remove_distributed_temporary(self, file: str) -> None:
        pass

    def read_index_file(self, name: str, error: type[PskdError], what: str) -> tuple[Any, str | None]:
        raw, info = self.store.get(self.key(name))
        return loads_strict(raw, self.join(name), error), info.tag

    def write_index_file(self, name: str, data: bytes, *, durable: bool, tag: str | None, exists: bool
                         ) -> str | None:
        """A conditional put: only if there is no index yet (``exists`` False), else only if the
        index is still the version ``tag`` read; E9014 when another writer changed it meanwhile."""
        mode = Version(tag) if exists and tag is not None else CREATE
        try:
            return self.store.put(self.key(name), data, mode=mode).tag
        except Conflict as e:
            raise CheckpointDirectoryError(f"{self.join(name)}: another writer changed the checkpoint index since "
                                           f"this manager read it ({e.why}); this change was not written") from None

    def layout_of(self, name: str) -> LayoutFile:
        raw, _ = self.store.get(self.key(name))
        return layout_from_bytes(raw, self.join(name))

    def checkpoint(self, name: str) -> Reader | StoredFile:
        return StoredFile(self.where.child(name), self.store)

    def check_layout(self, layout_file: LayoutFile, name: str, xxh3_128: str | None) -> None:
        StoredFile(self.where.child(name), self.store).check(layout_file, xxh3_128)


def found_mode(path: str) -> int | None:
    """The ``lstat`` mode of ``path``, None when nothing is there; E9014 naming it when it cannot be
    looked at (a NUL in it included)."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointDirectoryError(f"{path}: cannot look at it: {e.strerror or e}") from e
    except ValueError:  # a NUL in the path
        raise CheckpointDirectoryError(f"{path!r}: not a path (it holds a NUL byte)") from None


def step_names(step: int) -> tuple[str, str]:
    """The two names of a step: its checkpoint file and its layout file."""
    return names.step_file(step), names.step_layout(step)


__all__ = ["CheckpointDirectory", "StoredDirectory", "found_mode", "step_names"]
