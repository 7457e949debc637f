"""A directory of checkpoints, one a step: save (blocking or on a background thread), list,
restore, keep the last N, and check each file against the digest recorded when it was written.

The directory holds::

    checkpoints.json              the index: the complete checkpoints, their digests and extra JSON
    step-00000100.psk.d           one checkpoint a step (see pskd_jax.checkpoint)
    step-00000100.layout.json     its layout, for tools that open it without the program

One manager at a time has a directory open for writing: it holds ``DIR/.pskd-checkpoints.lock``
(an ``flock``) from its creation to :meth:`CheckpointManager.close`, and a second manager of the
same directory, in any process, is refused at once (E9014 naming the directory) instead of
interleaving its files and index with the first's. ``read_only=True`` opens a directory without the
lock (to list, restore and verify while another process trains); ``pskd verify`` takes no lock.
The lock file is not a checkpoint: nothing that lists steps reads it.

The index is the source of truth. A step is complete when the index lists it: the step's file is
renamed into place (atomically, synced) *before* the index that names it is rewritten (atomically,
synced), so a crash at any point leaves either the old index or the new one, and never an index
naming a file that is not whole. A file the index does not name (a crash between the two renames)
and temporary files are not checkpoints: they are ignored, and removed when the manager opens the
directory — a temporary file only when no live writer holds it (see :mod:`pskd_jax.fileio`), a
step's file only when no save of that step is under way. Pruning rewrites the index first and
deletes files after, and never removes the newest complete checkpoint.

Index format (version 2)::

    {"format": "pskd-checkpoints", "version": 2,
     "checkpoints": [{"step": 100, "file": "step-00000100.psk.d", "layout": "step-00000100.layout.json",
                      "type": "params Params", "bytes": 1048633, "digest": {"xxh3_128": "…"}, "extra": {…}}]}

``digest`` maps an algorithm to the hex digest of the whole file, as ``xxhsum -H2`` or
``sha256sum`` prints it. New checkpoints record ``xxh3_128`` by default, computed while the file is
written. It catches damage (a flipped byte anywhere, a torn copy), and it is fast enough — about
17 GB/s a core against sha256's 1.5 — that ``restore(..., verify=True)`` hashes the file while
reading it and takes 1.3–1.5× an unverified restore on this project's 2-core machine, where sha256
takes about 5× (``bench/bench_checkpoint.py``). It is not cryptographic: a manager made with
``digest="sha256"`` records sha256 instead, for checks that must hold against a crafted file
(the digest then needs to be kept somewhere the file's writer cannot reach).

An entry may record several algorithms; a check checks every one this version knows
(``xxh3_128``, ``sha256``) and refuses an entry that records none of them (E9014).

Version 1 indexes, written before xxh3_128, record ``"sha256": "…"`` in each entry instead of
``digest``. They are read as they are (such an entry's digest is ``{"sha256": …}``, still
verified), and the next save rewrites the index as version 2, those entries keeping their sha256
under ``digest``. A version-1 reader refuses a version-2 index rather than misreading it.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from typing import Any


import numpy as np

from pskd_jax.format import tree as tree_lib
from pskd_jax.errors import CheckpointDirectoryError, UsageError
from pskd_jax._os import locks, names
from pskd_jax._os.atomic import remove_stale_temporaries
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.jsonfile import read_strict, write_json
from pskd_jax._os.locks import destination_lock
from pskd_jax.checkpoint.integrity import CHECKPOINT_DIGEST, verify_file
from pskd_jax.checkpoint.planning import SaveResult, plan
from pskd_jax.checkpoint.restoring import restore
from pskd_jax.checkpoint.saving import save

INDEX = names.CHECKPOINT_INDEX
INDEX_FORMAT = "pskd-checkpoints"
INDEX_VERSION = 2
_READ_VERSIONS = (1, 2)
LOCK = names.CHECKPOINT_LOCK  # held by the manager that has the directory open


def read_index(directory: str) -> list[dict]:
    """The index's entries, sorted by step (an empty list when there is no index yet), each with
    its ``digest`` by algorithm (a version-1 entry's ``sha256`` becomes ``{"sha256": …}``)."""
    path = os.path.join(directory, INDEX)
    if not os.path.lexists(path):
        return []
    content = read_strict(path, CheckpointDirectoryError, what="the checkpoint index")
    try:
        version = content.get("version")
        if content.get("format") != INDEX_FORMAT or version not in _READ_VERSIONS:
            raise ValueError(f"format {content.get('format')!r} version {version!r} "
                             f"(this version reads {INDEX_FORMAT!r} versions {list(_READ_VERSIONS)})")
        entries = [_entry_of_version(dict(entry), version) for entry in content["checkpoints"]]
        for entry in entries:
            if not isinstance(entry["step"], int) or not _is_file_name(entry["file"]) \
                    or not (entry.get("layout") is None or _is_file_name(entry["layout"])) \
                    or not _is_digest_map(entry.get("digest")):
                raise ValueError(f"malformed entry {_abridged(entry)}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index ({e})") from None
    return sorted(entries, key=lambda e: e["step"])


def _is_file_name(name: Any) -> bool:
    """A name of a file of the directory itself: no directory part, no NUL (which no path holds)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "\x00" not in name \
        and os.path.basename(name) == name


def _abridged(entry: dict) -> str:
    text = repr(entry)
    return text if len(text) <= 300 else text[:300] + "…"


def _is_digest_map(digest: Any) -> bool:
    return isinstance(digest, dict) and bool(digest) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in digest.items())


def _entry_of_version(entry: dict, version: int) -> dict:
    """An entry as version 2 has it: a version-1 entry's ``sha256`` moves under ``digest``."""
    if version == 1 and "digest" not in entry and "sha256" in entry:
        entry["digest"] = {"sha256": entry.pop("sha256")}
    return entry


def entry_digests(entry: dict) -> dict[str, str]:
    """The digests of an index entry that this version can check, by algorithm (xxh3_128 first);
    E9014 when it records none of them."""
    recorded = entry["digest"]
    known = {name: recorded[name] for name in DIGESTS if name in recorded}
    if not known:
        raise CheckpointDirectoryError(f"step {entry['step']} {entry['file']}: the index records only "
                                        f"{sorted(recorded)} digests; this version checks {sorted(DIGESTS)}")
    return known


def recorded_digests(path: str | os.PathLike) -> dict[str, str]:
    """The digests the index of a checkpoint file's directory records for it (empty when the
    directory has no index, or the index does not list the file)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    for entry in read_index(directory):
        if entry["file"] == name:
            return entry_digests(entry)
    return {}


def write_index(directory: str, entries: list[dict], *, durable: bool = True) -> None:
    content = {"format": INDEX_FORMAT, "version": INDEX_VERSION,
               "checkpoints": sorted(entries, key=lambda e: e["step"])}
    write_json(os.path.join(directory, INDEX), content, durable=durable)


def entry_path(directory: str, entry: dict) -> str:
    """The path of an index entry's file, refused (E9014) when it, or its layout file, resolves
    through a symlink to somewhere outside the directory: an index reads only its own files."""
    root = os.path.realpath(directory)
    for name in (entry["file"], entry.get("layout")):
        if name is None:
            continue
        real = os.path.realpath(os.path.join(directory, name))
        if os.path.dirname(real) != root:
            raise CheckpointDirectoryError(f"{directory}: step {entry['step']}: {name} leads to {real}, outside "
                                            "the checkpoint directory (through a symlink)")
    return os.path.join(directory, entry["file"])


def verify_directory(directory: str, *, step: int | None = None) -> list[dict]:
    """Checks the checkpoints of a directory (or one step) against their recorded digests (every
    algorithm an entry records that this version knows); returns the entries checked. E9013 names
    the first damaged checkpoint, E9014 a step the index lacks."""
    entries = read_index(directory)
    if step is not None:
        entries = [e for e in entries if e["step"] == step]
        if not entries:
            raise CheckpointDirectoryError(f"{directory}: no complete checkpoint for step {step}")
    for entry in entries:
        verify_file(entry_path(directory, entry), **entry_digests(entry))
    return entries


def _snapshot(tree: Any) -> Any:
    """A copy of the tree's leaves in host memory, so the caller may go on (and donate or overwrite
    its buffers) while the copy is written."""
    pairs, rebuild = tree_lib.flatten(tree)
    copies = []
    for _, value in pairs:
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            copies.append(np.array(value, copy=True))
        else:
            copies.append(value)  # Python numbers, Fractions, Decimals: immutable
    return rebuild(copies)


def _checkpoint_of(name: str) -> str:
    """``step-00000001.layout.json`` → ``step-00000001.psk.d`` (a step's files share its lock)."""
    return names.step_file(names.step_of(name))


def _lock_directory(directory: str) -> int:
    """Takes ``DIR/.pskd-checkpoints.lock`` and returns its descriptor, or refuses at once (E9014
    naming the directory) when another manager holds it."""
    path = os.path.join(directory, LOCK)
    try:
        fd = locks.acquire(path, wait=False, error=CheckpointDirectoryError, what=directory)
    except CheckpointDirectoryError as e:
        raise CheckpointDirectoryError(f"{e.message} (to only read the checkpoints, open the directory with "
                                       "read_only=True)") from e.__cause__
    if fd is None:
        raise CheckpointDirectoryError(f"{directory}: another CheckpointManager has this checkpoint directory "
                                       f"open (it holds {path}); close it first, or open this one with "
                                       "read_only=True to only read")
    return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CheckpointDirectoryError(f"{directory}: another CheckpointManager has this checkpoint directory "
                                        f"open (it holds {path}); close it first, or open this one with "
                                        "read_only=True to only read") from None
    except OSError:
        pass  # a filesystem without flock: unlocked, as where there is no fcntl
    return fd


class CheckpointManager:
    """Checkpoints of a training run in one directory, by step.

    >>> import numpy as np, tempfile
    >>> manager = CheckpointManager(tempfile.mkdtemp(), keep=2)
    >>> for step in (10, 20, 30):
    ...     _ = manager.save(step, {"w": np.full(3, step, np.float32)}, extra={"epoch": 1, "batch": step})
    >>> manager.all_steps(), manager.latest_step(), manager.extra()["batch"]
    ([20, 30], 30, 30)
    >>> manager.restore(as_numpy=True, verify=True)["w"]
    array([30., 30., 30.], dtype=float32)

    ``digest`` is the algorithm each save records in the index: ``"xxh3_128"`` (the default: it
    catches damage, and a verified restore stays fast) or ``"sha256"`` (it also holds against a
    crafted file, at about 5× the time of an unverified restore when verifying).

    The manager holds the directory's lock (:data:`LOCK`) until :meth:`close` (or the end of a
    ``with`` block): another manager of the directory, in this process or another, is refused with
    E9014 until then. ``read_only=True`` takes no lock, removes nothing and refuses to save.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int | None = None, durable: bool = True,
                 name: str | None = None, digest: str = CHECKPOINT_DIGEST, read_only: bool = False):
        if keep is not None and keep < 1:
            raise CheckpointDirectoryError(f"keep={keep}: keep at least the newest checkpoint (keep >= 1, or None for all)")
        if digest not in DIGESTS:
            raise UsageError(f"digest={digest!r}: expected one of {sorted(DIGESTS)}")
        self.directory = os.fspath(directory)
        self.keep = keep
        self.durable = durable
        self.name = name
        self.digest = digest
        self._lock = threading.Lock()  # the index and the directory's files
        self.read_only = read_only
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._release = None  # releases the directory lock (once); also when the manager is collected
        if read_only:
            read_index(self.directory)
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise CheckpointDirectoryError(f"{self.directory}: cannot create the directory: {e.strerror}") from None
        except ValueError:  # a NUL in the path
            raise CheckpointDirectoryError(f"{self.directory!r}: not a directory name (it holds a NUL)") from None
        self._release = weakref.finalize(self, os.close, _lock_directory(self.directory))
        try:
            read_index(self.directory)  # a malformed index fails now, not at the first save
            self._remove_leftovers()
        except BaseException:
            self._release()
            raise

    # -- listing ---------------------------------------------------------------------------------

    def _entries(self) -> list[dict]:
        return read_index(self.directory)

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, in increasing order."""
        return [e["step"] for e in self._entries()]

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _entry(self, step: int | None) -> dict:
        entries = self._entries()
        if not entries:
            raise CheckpointDirectoryError(f"{self.directory}: no complete checkpoint yet")
        if step is None:
            return entries[-1]
        for entry in entries:
            if entry["step"] == step:
                return entry
        raise CheckpointDirectoryError(f"{self.directory}: no complete checkpoint for step {step} "
                                        f"(complete: {[e['step'] for e in entries]})")

    def path(self, step: int | None = None) -> str:
        """The file of a complete step (the latest by default)."""
        return entry_path(self.directory, self._entry(step))

    def extra(self, step: int | None = None) -> Any:
        """The extra JSON saved with a step (the latest by default), e.g. the loader's state."""
        return self._entry(step).get("extra")

    # -- saving ----------------------------------------------------------------------------------

    def save(self, step: int, tree: Any, *, extra: Any = None, **options: Any) -> SaveResult:
        """Saves ``tree`` as ``step`` and waits until it is complete (then prunes).

        ``extra`` is any JSON value kept in the index with the step; ``options`` go to
        :func:`pskd_jax.checkpoint.save` (``encodings``, ``round_to_encoding``, ``name``)."""
        self.wait()
        return self._save(self._check_step(step), tree, self._check_extra(extra), options)

    def save_async(self, step: int, tree: Any, *, extra: Any = None, **options: Any) -> None:
        """Snapshots ``tree`` into host memory and writes it on a background thread; returns as
        soon as the snapshot is taken. One save runs at a time: a second waits for the first.
        Errors surface in :meth:`wait` (or the next save)."""
        self.wait()
        step = self._check_step(step)
        extra = self._check_extra(extra)
        plan(tree, name=options.get("name", self.name), encodings=options.get("encodings"))
        snapshot = _snapshot(tree)

        def run() -> None:
            try:
                self._save(step, snapshot, extra, options)
            except BaseException as e:  # handed to the caller by wait()
                self._error = e

        self._thread = threading.Thread(target=run, name=f"pskd-save-{step}", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Waits for a background save; raises its error, if any."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _check_writable(self) -> None:
        if self.read_only:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager was opened read_only; "
                                            "it does not save")
        if self._closed:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager is closed (its lock on "
                                            "the directory released); open a new one to save")

    def _check_step(self, step: int) -> int:
        self._check_writable()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise CheckpointDirectoryError(f"step {step!r}: a step is an integer >= 0")
        return int(step)

    def _check_extra(self, extra: Any) -> Any:
        try:
            return json.loads(json.dumps(extra, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise CheckpointDirectoryError(f"extra={extra!r} is not JSON: {e}") from None

    def _save(self, step: int, tree: Any, extra: Any, options: dict) -> SaveResult:
        options = dict(options)
        options.setdefault("name", self.name)
        file = names.step_file(step)
        path = os.path.join(self.directory, file)
        result = save(path, tree, durable=self.durable, digest=self.digest, **options)
        entry = {"step": step, "file": file, "type": result.type_text, "bytes": result.bytes,
                 "digest": result.digest, "extra": extra}
        if result.layout_path:
            entry["layout"] = os.path.basename(result.layout_path)
        with self._lock:
            entries = sorted([e for e in read_index(self.directory) if e["step"] != step] + [entry],
                             key=lambda e: e["step"])
            # Keep the newest ``keep``: the index is rewritten first and the files go after, so the
            # index never names a missing file; the newest complete checkpoint is always kept.
            cut = 0 if self.keep is None else max(0, len(entries) - self.keep)
            write_index(self.directory, entries[cut:], durable=self.durable)
            self._delete(entries[:cut])
        return result

    def _delete(self, dropped: list[dict]) -> None:
        for entry in dropped:
            for name in (entry["file"], entry.get("layout")):
                if name:
                    try:
                        os.unlink(os.path.join(self.directory, name))
                    except FileNotFoundError:
                        pass

    def _remove_leftovers(self) -> None:
        """Removes what interrupted saves left: temporary files no live writer holds, step files
        the index does not name (when no save of that step is under way), lock files of killed
        saves. Run holding the directory lock, so no other manager is between a rename and its
        index; a plain ``checkpoint.save`` into the directory still keeps its files."""
        with self._lock:
            named = set()
            for entry in read_index(self.directory):
                named.add(entry["file"])
                if entry.get("layout"):
                    named.add(entry["layout"])
            try:
                listed = os.listdir(self.directory)
            except OSError as e:
                raise CheckpointDirectoryError(f"{self.directory}: cannot list the directory: {e.strerror}") from e
            temporaries, distributed, unnamed, save_locks = set(), set(), set(), set()
            for name in listed:
                found = names.leftover(name)
                if found is not None:
                    kind, file = found
                    step = names.step_of(file)
                    if kind == "random" and (step is not None or file == INDEX):
                        temporaries.add(file)
                    elif step is not None and file == names.step_file(step):  # a checkpoint, not a layout
                        (distributed if kind == "distributed" else save_locks).add(file)
                elif names.step_of(name) is not None and name not in named:
                    unnamed.add(name)
            for file in sorted(temporaries):
                # atomic_output's writers hold their temporary file's flock until the rename
                remove_stale_temporaries(os.path.join(self.directory, file))
            for file in sorted(distributed | save_locks | {_checkpoint_of(name) for name in unnamed}):
                # each save of a step holds its destination lock until it is done
                path = os.path.join(self.directory, file)
                with destination_lock(path, wait=False) as idle:
                    if not idle:
                        continue
                    leftovers = [names.distributed_temporary(path)] * (file in distributed)
                    leftovers += sorted(os.path.join(self.directory, n) for n in unnamed if _checkpoint_of(n) == file)
                    for leftover in leftovers:
                        try:
                            os.unlink(leftover)
                        except OSError:
                            pass

    # -- restoring -------------------------------------------------------------------------------

    def restore(self, step: int | None = None, target: Any = None, *, verify: bool = False, **options: Any) -> Any:
        """Restores a complete step (the latest by default); see :func:`pskd_jax.checkpoint.restore`.

        ``verify=True`` checks the file against the digest recorded in the index (xxh3_128, or
        sha256) while reading, and raises E9013 naming the checkpoint when they differ."""
        entry = self._entry(step)
        path = entry_path(self.directory, entry)
        return restore(path, target, **(entry_digests(entry) if verify else {}), **options)

    def verify(self, step: int | None = None) -> list[dict]:
        """Checks every complete checkpoint (or one step) against its recorded digests."""
        return verify_directory(self.directory, step=step)

    def close(self) -> None:
        """Waits for a background save, then releases the directory to another manager."""
        self._closed = True
        try:
            self.wait()
        finally:
            if self._release is not None:
                self._release()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["CheckpointManager", "INDEX", "LOCK", "entry_digests", "entry_path", "read_index", "recorded_digests",
           "verify_directory", "write_index"]
