"""A directory of checkpoints, one a step: save (blocking or on a background thread), list,
restore (verified), keep what a retention policy says, and check each file against the digest
recorded when it was written.

The directory holds::

    checkpoints.json              the index: the complete checkpoints, their digests and extra JSON
    step-00000100.psk.d           one checkpoint a step (see pskd_jax.checkpoint)
    step-00000100.layout.json     its layout, for tools that open it without the program
    .pskd-checkpoints.lock        held by the manager that has the directory open

Opening
-------
One manager at a time has a directory open for writing: it holds ``DIR/.pskd-checkpoints.lock``
(an ``flock``) from its creation to :meth:`CheckpointManager.close`. A manager in another process
is refused at once (E9014 naming the directory). In the same process, a new manager of the same
directory (a notebook cell run twice) *takes over* from the one before: it waits for that one's
background save, takes its lock without letting go of it, and the old manager then refuses to
save (E9014, "superseded") while it can still list and restore. ``read_only=True`` opens a
directory without the lock (to list, restore and verify while another process trains);
``pskd verify`` takes no lock.

The index is the truth
----------------------
A step is complete when the index lists it: the step's file is renamed into place (atomically,
synced) *before* the index that names it is rewritten (atomically, synced), so a crash at any point
leaves the old index or the new one, never an index naming a file that is not whole.

Every entry is checked before anything is read or removed (E9014 naming the entry otherwise): its
``step`` an integer (not a boolean) from 0 to 2^63 - 1 and listed once, its ``file`` exactly that
step's file name, its ``layout`` absent, null or exactly that step's layout name, its ``digest`` a
map of algorithm to hex. An entry can therefore only ever name its own step's two files: never the
index, the lock, another step's file, or a file of another program. An index that is not a regular
file (a symbolic link, a directory, a FIFO) is refused the same way.

What the manager removes
------------------------
Only regular files it can prove are its own and no longer listed, and never the index or the
lock:

- the files of entries it drops (pruning, or a step saved again without a layout), named by the
  step alone, after the index that no longer lists them is written;
- the files of a save it began but that never reached the index (a crash), found when a manager
  next opens the directory. Before a save writes step N, the index records N under
  ``leftovers``; a file of step N that no entry lists is then the manager's own, and removed once
  no save of it is under way. A step the index lists *and* records under ``leftovers`` is a
  re-save of that step cut short: its file is kept when it still matches the recorded digest, and
  dropped with its entry when it does not (it is the unfinished save's, whose extra JSON was never
  recorded);
- temporary files of step files and of the index, and save locks of step files, that no live
  writer holds (regular files only).

Anything else in the directory is never touched: other programs' files, names that merely look
like step files (``step-1.psk.d``), symbolic links, directories or FIFOs at a step's name, and step
files no entry lists and no ``leftovers`` claims. A save of a step whose name is taken by such a
file is refused (E9014 naming it) rather than replacing it.

A directory without an index
----------------------------
A manager opening a directory that holds step files but no index *adopts* them, or refuses: it
never empties it. A step file is adopted when it proves complete on its own:

- it is a regular file named exactly as :func:`pskd_jax._os.names.step_file` names its step;
- it reads as a ``.psk.d`` file holding exactly one sample, and its size is exactly its header
  plus that sample (no byte missing, none trailing);
- a ``params`` checkpoint has its layout file beside it (without one its size proves nothing),
  and that layout file reads, makes samples of the size the file holds, and proves it was
  written with this file (:func:`pskd_jax.format.layout_file.check_belongs`: its header digest and
  size, and the whole file's xxh3_128 when it records one, so that the layout of a save of leaves
  of other shapes with the same encodings and byte total is refused); a layout file without its
  checkpoint file is not adoptable.

When every step file proves complete, the index is rebuilt from them: each entry gets the digest
of the file as found (it cannot vouch for the bytes before that), ``extra`` null and ``"adopted":
true``. When any does not, the manager is refused with E9014 naming each such file and why, and
nothing is written or removed. A read-only manager and ``pskd verify`` adopt nothing.

Retention
---------
``keep=N`` keeps the N newest steps; ``keep_period=P`` also keeps every step divisible by P;
``best_fn`` with ``best_mode`` ("min" or "max") and ``keep_best=N`` also keeps the N steps of best
score. The newest complete checkpoint is always kept. Without ``keep`` and ``keep_best`` every
step is kept. ``save_interval_steps=K`` makes :meth:`CheckpointManager.should_save` true on steps
divisible by K beyond the latest saved, and :meth:`CheckpointManager.save` a no-op on others
unless ``force=True``.

Index format (version 3)::

    {"format": "pskd-checkpoints", "version": 3, "leftovers": [300],
     "checkpoints": [{"step": 100, "file": "step-00000100.psk.d", "layout": "step-00000100.layout.json",
                      "type": "params Params", "bytes": 1048633, "digest": {"xxh3_128": "…"},
                      "extra": {…}, "score": 0.25}]}

``digest`` maps an algorithm to the hex digest of the whole file, as ``xxhsum -H2`` or
``sha256sum`` prints it. New checkpoints record ``xxh3_128`` by default, computed while the file is
written: it catches damage (a flipped byte anywhere, a torn copy) and is fast enough that a
verified restore costs little more than an unverified one (``bench/bench_manager.py`` measures
it). It is not cryptographic: a manager made with ``digest="sha256"`` records sha256 instead, for
checks that must hold against a crafted file (the digest then needs to be kept somewhere the
file's writer cannot reach). An entry may record several algorithms; a check checks every one this
version knows (``xxh3_128``, ``sha256``) and refuses an entry that records none of them (E9014).

``score`` (optional, a finite number) is what ``best_fn`` gave when the step was saved;
``adopted`` (optional) marks an entry rebuilt from a file found without an index.

Older indexes are read as they are: version 2 has no ``leftovers`` and no ``score``; version 1
entries record ``"sha256": "…"`` instead of ``digest`` (read as ``{"sha256": …}``). The next write
of the index is version 3, keeping every entry's digests. A reader of an older version refuses a
newer index rather than misreading it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
import os
import stat
import threading
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from pskd_jax._os import locks, names
from pskd_jax._os.atomic import remove_stale_temporaries
from pskd_jax._os.digests import DIGESTS, file_digest
from pskd_jax._os.jsonfile import json_kind, read_strict, write_json
from pskd_jax._os.locks import destination_lock
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint.integrity import CHECKPOINT_DIGEST, verify_file
from pskd_jax.checkpoint.jax_arrays import is_array_like, is_key_array, key_data, key_impl_of, wrap_keys
from pskd_jax.checkpoint.planning import SaveResult, plan
from pskd_jax.checkpoint.restoring import restore
from pskd_jax.checkpoint.saving import save
from pskd_jax.errors import (
    CheckpointDirectoryError,
    MismatchError,
    NotClosedError,
    PskdError,
    TruncatedError,
    UsageError,
)
from pskd_jax.format import tree as tree_lib
from pskd_jax.format.layout_file import LayoutFile, check_belongs, read_layout_file
from pskd_jax.format.reader import Reader

INDEX = names.CHECKPOINT_INDEX
INDEX_FORMAT = "pskd-checkpoints"
INDEX_VERSION = 3
_READ_VERSIONS = (1, 2, 3)
LOCK = names.CHECKPOINT_LOCK  # held by the manager that has the directory open
MAX_STEP = 2**63 - 1  # the largest step: an int64, as a training loop counts
BEST_MODES = ("min", "max")


# -- the index -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Index:
    """An index as read: its entries by increasing step, the steps whose unlisted files are the
    manager's own (``leftovers``), and whether the file exists at all."""

    entries: list[dict]
    leftovers: list[int]
    exists: bool


def _kind(mode: int) -> str:
    """What ``lstat`` found, in words."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _found(path: str) -> int | None:
    """The ``lstat`` mode of ``path`` (a link itself, not what it leads to), None when nothing is
    there; E9014 naming it when it cannot be looked at."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointDirectoryError(f"{path}: cannot look at it: {e.strerror or e}") from e
    except ValueError:  # a NUL in the path
        raise CheckpointDirectoryError(f"{path!r}: not a path (it holds a NUL byte)") from None


def _load_index(directory: str) -> _Index:
    path = os.path.join(directory, INDEX)
    mode = _found(path)
    if mode is None:
        return _Index([], [], False)
    if not stat.S_ISREG(mode):
        raise CheckpointDirectoryError(f"{path}: the checkpoint index is {_kind(mode)}, not a regular file "
                                       "(the manager reads and replaces only a regular file there)")
    return _parse_index(path, read_strict(path, CheckpointDirectoryError, what="the checkpoint index"))


def _parse_index(path: str, content: Any) -> _Index:
    if not isinstance(content, dict):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index ({json_kind(content)}, not an object)")
    version = content.get("version")
    if content.get("format") != INDEX_FORMAT or isinstance(version, bool) or version not in _READ_VERSIONS:
        raise CheckpointDirectoryError(
            f"{path}: not a checkpoint index (format {json_kind(content.get('format'))} version "
            f"{json_kind(version)}; this version reads {INDEX_FORMAT!r} versions {list(_READ_VERSIONS)})")
    listed = content.get("checkpoints")
    if not isinstance(listed, list):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index (checkpoints is {json_kind(listed)}, "
                                       "not a list)")
    entries: list[dict] = []
    where: dict[int, int] = {}  # step → the entry that lists it
    for k, raw in enumerate(listed):
        entry = _checked_entry(path, k, raw, version)
        step = entry["step"]
        if step in where:
            raise CheckpointDirectoryError(f"{path}: malformed entry {k} ({_abridged(raw)}): step {step} is "
                                           f"listed twice (entries {where[step]} and {k})")
        where[step] = k
        entries.append(entry)
    leftovers = content.get("leftovers", []) if version >= 3 else []
    if not isinstance(leftovers, list) or not all(_is_step(s) for s in leftovers):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index (leftovers {_abridged(leftovers)} is "
                                       f"not a list of steps from 0 to {MAX_STEP})")
    return _Index(sorted(entries, key=lambda e: e["step"]), sorted(set(leftovers)), True)


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def _checked_entry(path: str, k: int, raw: Any, version: int) -> dict:
    """An entry as version 3 has it, or E9014 naming it: it names its own step's files only."""
    def bad(why: str) -> CheckpointDirectoryError:
        return CheckpointDirectoryError(f"{path}: malformed entry {k} ({_abridged(raw)}): {why}")

    if not isinstance(raw, dict):
        raise bad("an entry is an object")
    entry = dict(raw)
    if version == 1 and "digest" not in entry and "sha256" in entry:
        entry["digest"] = {"sha256": entry.pop("sha256")}
    step = entry.get("step")
    if not _is_step(step):
        raise bad(f"its step {json_kind(step)} is not an integer from 0 to {MAX_STEP}")
    if entry.get("file") != names.step_file(step):
        raise bad(f"its file {json_kind(entry.get('file'))} is not {names.step_file(step)!r}, the file of step {step}")
    if entry.get("layout") is not None and entry["layout"] != names.step_layout(step):
        raise bad(f"its layout {json_kind(entry['layout'])} is not {names.step_layout(step)!r}, the layout file "
                  f"of step {step}")
    if not _is_digest_map(entry.get("digest")):
        raise bad(f"its digest {json_kind(entry.get('digest'))} is not a map of algorithm to hex digest")
    if "bytes" in entry and not (isinstance(entry["bytes"], int) and not isinstance(entry["bytes"], bool)
                                 and entry["bytes"] >= 0):
        raise bad(f"its bytes {json_kind(entry['bytes'])} is not a size")
    if "type" in entry and not isinstance(entry["type"], str):
        raise bad(f"its type {json_kind(entry['type'])} is not a string")
    if entry.get("score") is not None and not _is_score(entry["score"]):
        raise bad(f"its score {json_kind(entry['score'])} is not a finite number")
    if "adopted" in entry and not isinstance(entry["adopted"], bool):
        raise bad(f"adopted is {json_kind(entry['adopted'])}, not true or false")
    return entry


def _is_score(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _abridged(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:  # nested almost as deep as the JSON reader goes
        return json_kind(value)
    return text if len(text) <= 300 else text[:300] + "…"


def _is_digest_map(digest: Any) -> bool:
    return isinstance(digest, dict) and bool(digest) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in digest.items())


def _listed_names(entries: list[dict]) -> set[str]:
    """Every file the entries name (each a step's own file or layout, by the checks above)."""
    listed = set()
    for entry in entries:
        listed.add(entry["file"])
        if entry.get("layout"):
            listed.add(entry["layout"])
    return listed


def _step_names(step: int) -> tuple[str, str]:
    return names.step_file(step), names.step_layout(step)


def read_index(directory: str) -> list[dict]:
    """The index's entries, sorted by step (an empty list when there is no index yet), each with
    its ``digest`` by algorithm (a version-1 entry's ``sha256`` becomes ``{"sha256": …}``).
    E9014 naming the index, or the entry, when it is not a checkpoint index of this toolkit."""
    return _load_index(directory).entries


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


def write_index(directory: str, entries: list[dict], *, durable: bool = True, leftovers: Any = ()) -> None:
    """Writes the index (version 3), atomically: ``entries`` by step, and the steps whose unlisted
    files are the manager's own to remove (``leftovers``)."""
    content = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "leftovers": sorted(set(leftovers)),
               "checkpoints": sorted(entries, key=lambda e: e["step"])}
    write_json(os.path.join(directory, INDEX), content, durable=durable)


def entry_path(directory: str, entry: dict) -> str:
    """The path of an index entry's file. Refused (E9014) when it, or its layout file, resolves
    through a symlink to somewhere outside the directory (an index reads only its own files), or
    when it is not a regular file (a FIFO would block a reader); E9003 when it is missing."""
    root = os.path.realpath(directory)
    for name in (entry["file"], entry.get("layout")):
        if name is None:
            continue
        real = os.path.realpath(os.path.join(directory, name))
        if os.path.dirname(real) != root:
            raise CheckpointDirectoryError(f"{directory}: step {entry['step']}: {name} leads to {real}, outside "
                                           "the checkpoint directory (through a symlink)")
    path = os.path.join(directory, entry["file"])
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TruncatedError(f"{path}: step {entry['step']} is listed in the checkpoint index, but its file "
                             "is missing") from None
    except OSError as e:
        raise TruncatedError(f"{path}: step {entry['step']}: cannot read: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        raise CheckpointDirectoryError(f"{path}: step {entry['step']}: {_kind(mode)}, not a regular file")
    return path


def _step_names_present(directory: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(directory) if names.step_of(name) is not None)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CheckpointDirectoryError(f"{directory}: cannot list the directory: {e.strerror or e}") from e


def verify_directory(directory: str, *, step: int | None = None) -> list[dict]:
    """Checks the checkpoints of a directory (or one step) against their recorded digests (every
    algorithm an entry records that this version knows), and each step's layout file against its
    data file; returns the entries checked. E9013 names the first damaged checkpoint; E9005 (naming
    both files) a layout file written for another file — another header, size, or whole-file
    xxh3_128 —; E9001 (naming both) a listed layout file that is missing or does not read; E9014 a
    malformed index, a step the index lacks, or step files without an index (nothing to check them
    against: a manager opened on the directory adopts them)."""
    index = _load_index(directory)
    if not index.exists:
        found = _step_names_present(directory)
        if found:
            raise CheckpointDirectoryError(
                f"{directory}: no checkpoint index ({INDEX}), but {len(found)} step file"
                f"{'s' if len(found) != 1 else ''} ({', '.join(found[:4])}{', …' if len(found) > 4 else ''}): "
                "no recorded digest to check them against (a CheckpointManager opened on the directory adopts "
                "the complete ones)")
    entries = index.entries
    if step is not None:
        entries = [e for e in entries if e["step"] == step]
        if not entries:
            raise CheckpointDirectoryError(f"{directory}: no complete checkpoint for step {step}")
    for entry in entries:
        path = entry_path(directory, entry)
        digests = entry_digests(entry)
        verify_file(path, **digests)
        _verify_layout(directory, entry, path, digests)
    return entries


def _xxh3_for(path: str, layout_file: LayoutFile, known: str | None) -> str | None:
    """The whole file's xxh3_128 to prove a layout file against: the one at hand (``known``), else
    computed only when the layout file records one to compare with."""
    if known is not None:
        return known
    recorded = (layout_file.identity or {}).get("xxh3_128")
    return file_digest(path, "xxh3_128") if recorded is not None else None


def _verify_layout(directory: str, entry: dict, path: str, digests: dict[str, str]) -> None:
    """Checks that the layout file of a verified step is its own (E9005 naming both files when it
    was written for another file; E9001 naming both when the index lists one that is missing or
    does not read): by its header digest and size, and by the whole file's xxh3_128 it records.
    A step the index lists without a layout file is checked only when one lies beside it (restore
    would use it)."""
    listed = entry.get("layout")
    layout_path = os.path.join(directory, listed) if listed else layout_path_for(path)
    if not listed and not os.path.lexists(layout_path):
        return
    where = f"step {entry['step']} {path}"
    try:
        layout_file = read_layout_file(layout_path)
    except PskdError as e:
        raise NotClosedError(f"{where}: its layout file does not read: {e.message}") from None
    try:
        check_belongs(layout_file, path, xxh3_128=_xxh3_for(path, layout_file, digests.get("xxh3_128")))
    except MismatchError as e:
        raise MismatchError(f"{where}: {e.message}") from None


# -- one manager a directory ---------------------------------------------------------------------------


def _snapshot(tree: Any) -> Any:
    """A copy of the tree's leaves in host memory, so the caller may go on (and donate or overwrite
    its buffers) while the copy is written.

    A typed PRNG key array (an nnx model's ``RngState``, ``jax.random.key``), which numpy cannot
    hold, is copied as its key data and wrapped again as a key array of its implementation (a new
    buffer, which the caller's donations never reach). A leaf that does not copy is E9005 naming
    its key path."""
    pairs, rebuild = tree_lib.flatten(tree)
    copies = []
    for path, value in pairs:
        copies.append(_leaf_snapshot(path, value) if is_array_like(value) else value)  # (Python numbers: immutable)
    return rebuild(copies)


def _leaf_snapshot(path: str, value: Any) -> Any:
    where = f"leaf {path or '(root)'}"
    try:
        if is_key_array(value):
            impl, _ = key_impl_of(value.dtype)
            return wrap_keys(np.array(key_data(value), copy=True), impl)
        return np.array(value, copy=True)
    except PskdError:
        raise
    except Exception as e:  # (a deleted or donated buffer, an object numpy refuses)
        raise MismatchError(f"{where}: cannot be copied for a background save: {type(e).__name__}: "
                            f"{str(e)[:200]}") from None


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


# The writable managers of this process, by directory (device, inode): a new manager of a directory
# takes over from the one before (its lock included) instead of being refused by its own process.
_OPEN: dict[tuple[int, int], "weakref.ref[CheckpointManager]"] = {}
_OPEN_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _directory_key(directory: str) -> tuple[int, int]:
    try:
        found = os.stat(directory)
    except OSError as e:
        raise CheckpointDirectoryError(f"{directory}: cannot open the checkpoint directory: {e.strerror or e}") from e
    if not stat.S_ISDIR(found.st_mode):
        raise CheckpointDirectoryError(f"{directory}: {_kind(found.st_mode)}, not a directory")
    return found.st_dev, found.st_ino


def _check_count(what: str, value: Any) -> int | None:
    """A retention count: None, or an integer >= 1 (E9014 otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CheckpointDirectoryError(f"{what}={value!r}: expected an integer >= 1, or None")
    return int(value)


@contextlib.contextmanager
def _idle(path: str) -> Iterator[bool]:
    """Holds a step file's save lock for a ``with`` block when no save of it is under way; yields
    False when one is, or when the lock cannot be taken (something other than a file at its name):
    the caller then leaves the step's files alone."""
    with contextlib.ExitStack() as stack:
        try:
            idle = stack.enter_context(destination_lock(path, wait=False))
        except PskdError:  # a link or a directory at the lock's name
            idle = False
        yield idle


class _NotAdoptable(Exception):
    """A step file found without an index that does not prove complete (internal)."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")


class CheckpointManager:
    """Checkpoints of a training run in one directory, by step.

    >>> import numpy as np, tempfile
    >>> manager = CheckpointManager(tempfile.mkdtemp(), keep=2)
    >>> for step in (10, 20, 30):
    ...     _ = manager.save(step, {"w": np.full(3, step, np.float32)}, extra={"epoch": 1, "batch": step})
    >>> manager.all_steps(), manager.latest_step(), manager.extra()["batch"]
    ([20, 30], 30, 30)
    >>> manager.restore(as_numpy=True)["w"]  # checked against its recorded digest while read
    array([30., 30., 30.], dtype=float32)

    Retention (see the module's documentation): ``keep`` (the newest N), ``keep_period`` (also
    every step divisible by P), ``best_fn`` + ``best_mode`` + ``keep_best`` (also the N best by a
    score), the newest complete checkpoint always. ``best_fn`` is called once, when a step is
    saved, with the ``metrics`` given to :meth:`save` (or, when none were given, its ``extra``);
    it returns a real number or None (no score). A score that is not a finite number (a diverged
    run's NaN) ranks as no score. Steps without a score are kept only by the other rules.

    ``save_interval_steps``: :meth:`should_save` is true on steps divisible by it beyond the latest
    saved (and when nothing is saved yet); :meth:`save` and :meth:`save_async` do nothing on
    other steps unless ``force=True``.

    ``digest`` is the algorithm each save records in the index: ``"xxh3_128"`` (the default: it
    catches damage, and a verified restore stays fast) or ``"sha256"`` (it also holds against a
    crafted file, at a higher cost when verifying).

    The manager holds the directory's lock (:data:`LOCK`) until :meth:`close` (or the end of a
    ``with`` block): a manager of the directory in another process is refused with E9014 until
    then; a new manager of it in this process takes over (the old one then refuses to save).
    ``read_only=True`` takes no lock, removes and adopts nothing, and refuses to save.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int | None = None, keep_period: int | None = None,
                 best_fn: Callable[[Any], Any] | None = None, best_mode: str | None = None,
                 keep_best: int | None = None, save_interval_steps: int | None = None, durable: bool = True,
                 name: str | None = None, digest: str = CHECKPOINT_DIGEST, read_only: bool = False):
        if keep is not None and not isinstance(keep, bool) and isinstance(keep, (int, np.integer)) and keep < 1:
            raise CheckpointDirectoryError(f"keep={keep}: keep at least the newest checkpoint (keep >= 1, or None "
                                           f"for all)")
        self.keep = _check_count("keep", keep)
        self.keep_period = _check_count("keep_period", keep_period)
        self.keep_best = _check_count("keep_best", keep_best)
        self.save_interval_steps = _check_count("save_interval_steps", save_interval_steps)
        if best_fn is not None and not callable(best_fn):
            raise CheckpointDirectoryError(f"best_fn={best_fn!r}: expected a function of a step's metrics")
        if (best_fn is None) != (best_mode is None):
            raise CheckpointDirectoryError(f"best_fn and best_mode go together (best_mode one of {list(BEST_MODES)}: "
                                           "whether a lower or a higher score is better)")
        if best_mode is not None and best_mode not in BEST_MODES:
            raise CheckpointDirectoryError(f"best_mode={best_mode!r}: expected one of {list(BEST_MODES)}")
        if self.keep_best is not None and best_fn is None:
            raise CheckpointDirectoryError("keep_best needs best_fn and best_mode (what makes a checkpoint best)")
        if digest not in DIGESTS:
            raise UsageError(f"digest={digest!r}: expected one of {sorted(DIGESTS)}")
        self.directory = os.fspath(directory)
        self.best_fn = best_fn
        self.best_mode = best_mode
        self.durable = durable
        self.name = name
        self.digest = digest
        self.read_only = read_only
        self._lock = threading.Lock()  # the index and the directory's files
        self._saving = threading.Lock()  # held by a save from start to end (a take-over waits for it)
        self._thread: threading.Thread | None = None
        self._in_flight: int | None = None  # the step of the background save, until wait()
        self._error: BaseException | None = None
        self._closed = False
        self._superseded = False
        self._release = None  # releases the directory lock (once); also when the manager is collected
        self._pid = os.getpid()  # a forked child's copy of this manager holds nothing it may hand over
        if read_only:
            _load_index(self.directory)
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise CheckpointDirectoryError(f"{self.directory}: cannot create the directory: {e.strerror}") from e
        except ValueError:  # a NUL in the path
            raise CheckpointDirectoryError(f"{self.directory!r}: not a directory name (it holds a NUL)") from None
        key = _directory_key(self.directory)
        with _OPEN_LOCK:
            fd = self._take_directory(key)
            self._release = weakref.finalize(self, os.close, fd)
            try:
                self._recover()
            except BaseException:
                self._release()
                raise
            _OPEN[key] = weakref.ref(self)

    def _take_directory(self, key: tuple[int, int]) -> int:
        """The directory lock's descriptor: taken over from this process's manager of the directory
        when there is one still holding it, else acquired (refused when another process holds it)."""
        reference = _OPEN.get(key)
        previous = reference() if reference is not None else None
        if previous is not None and previous._pid == os.getpid():
            fd = previous._hand_over()
            if fd is not None:
                return fd
        return _lock_directory(self.directory)

    def _hand_over(self) -> int | None:
        """Waits for this manager's saves, marks it superseded and gives up its lock descriptor
        (without releasing the lock); None when it holds none (closed, or superseded already)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # its error, if any, stays for this manager's wait()
        with self._saving:
            release, self._release = self._release, None
            detached = release.detach() if release is not None else None
            if detached is None:
                return None
            self._superseded = True
        return detached[2][0]

    # -- listing ---------------------------------------------------------------------------------

    def _entries(self) -> list[dict]:
        return _load_index(self.directory).entries

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, in increasing order."""
        return [e["step"] for e in self._entries()]

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The complete step of best score (by ``best_mode``; the newer of equal scores), None when
        no step has a score."""
        scored = [(e["score"], e["step"]) for e in self._entries() if e.get("score") is not None]
        return self._ranked(scored)[0][1] if scored and self.best_mode else None

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

    def score(self, step: int | None = None) -> float | None:
        """The score ``best_fn`` gave a step (the latest by default) when it was saved, or None."""
        return self._entry(step).get("score")

    # -- saving ----------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is one to save: beyond the latest saved (or the one being saved) and,
        with ``save_interval_steps``, divisible by it. False for a manager that cannot save."""
        step = self._valid_step(step)
        if self.read_only or self._closed or self._superseded:
            return False
        latest = [s for s in (self.latest_step(), self._in_flight) if s is not None]
        if latest and step <= max(latest):
            return False
        return step % (self.save_interval_steps or 1) == 0

    def _skipped(self, step: int, force: bool) -> bool:
        return self.save_interval_steps is not None and not force and not self.should_save(step)

    def save(self, step: int, tree: Any, *, extra: Any = None, metrics: Any = None, force: bool = False,
             **options: Any) -> SaveResult | None:
        """Saves ``tree`` as ``step`` and waits until it is complete (then prunes); returns what
        was written, or None when ``save_interval_steps`` says the step is not one to save (and
        ``force`` is False).

        ``extra`` is any JSON value kept in the index with the step; ``metrics`` (any value) is
        given to ``best_fn``; ``options`` go to :func:`pskd_jax.checkpoint.save` (``encodings``,
        ``round_to_encoding``, ``name``, …)."""
        self.wait()
        step = self._check_step(step)
        if self._skipped(step, force):
            return None
        extra = self._check_extra(extra)
        score = self._score(step, metrics if metrics is not None else extra)
        return self._save(step, tree, extra, score, options)

    def save_async(self, step: int, tree: Any, *, extra: Any = None, metrics: Any = None, force: bool = False,
                   **options: Any) -> bool:
        """Snapshots ``tree`` into host memory and writes it on a background thread; returns True as
        soon as the snapshot is taken (False when the step is not one to save, as :meth:`save`
        says). One save runs at a time: a second waits for the first. Errors surface in
        :meth:`wait` (or the next save)."""
        self.wait()
        step = self._check_step(step)
        if self._skipped(step, force):
            return False
        extra = self._check_extra(extra)
        score = self._score(step, metrics if metrics is not None else extra)
        plan(tree, name=options.get("name", self.name), encodings=options.get("encodings"))
        snapshot = _snapshot(tree)

        def run() -> None:
            try:
                self._save(step, snapshot, extra, score, options)
            except BaseException as e:  # handed to the caller by wait()
                self._error = e

        self._in_flight = step
        self._thread = threading.Thread(target=run, name=f"pskd-save-{step}", daemon=False)
        self._thread.start()
        return True

    def wait(self) -> None:
        """Waits for a background save; raises its error, if any."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self._in_flight = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _check_writable(self) -> None:
        if self.read_only:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager was opened read_only; "
                                           "it does not save")
        if self._superseded:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager was superseded: a newer "
                                           "CheckpointManager of the directory, made in this process, took it over; "
                                           "save with that one")
        if self._closed:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager is closed (its lock on "
                                           "the directory released); open a new one to save")

    @staticmethod
    def _valid_step(step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step <= MAX_STEP:
            raise CheckpointDirectoryError(f"step {step!r}: a step is an integer from 0 to {MAX_STEP}")
        return int(step)

    def _check_step(self, step: Any) -> int:
        self._check_writable()
        return self._valid_step(step)

    def _check_extra(self, extra: Any) -> Any:
        try:
            return json.loads(json.dumps(extra, allow_nan=False))
        except (TypeError, ValueError, RecursionError) as e:
            raise CheckpointDirectoryError(f"extra={_abridged(extra)} is not JSON: {e}") from None

    def _score(self, step: int, metrics: Any) -> float | None:
        """``best_fn`` of a step's metrics: a finite number, or None (no best_fn, no metrics, None,
        or a score that is not finite). A failing or non-numeric ``best_fn`` is E9012 naming the
        step."""
        if self.best_fn is None or metrics is None:
            return None
        try:
            value = self.best_fn(metrics)
        except PskdError:
            raise
        except Exception as e:
            raise UsageError(f"step {step}: best_fn failed on its metrics: {type(e).__name__}: {e}") from e
        if value is None:
            return None
        if hasattr(value, "shape") and getattr(value, "shape", None) == () and hasattr(value, "item"):
            value = value.item()  # a numpy or JAX scalar
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise UsageError(f"step {step}: best_fn returned {_abridged(value)}; expected a real number or None")
        value = float(value)
        return value if math.isfinite(value) else None

    def _ranked(self, scored: list[tuple[float, int]]) -> list[tuple[float, int]]:
        """(score, step) pairs best first; of equal scores, the newer step first."""
        sign = -1.0 if self.best_mode == "min" else 1.0
        return sorted(scored, key=lambda pair: (sign * pair[0], pair[1]), reverse=True)

    def _retained(self, entries: list[dict]) -> list[dict]:
        """The entries the retention options keep (the newest always)."""
        if not entries or (self.keep is None and self.keep_best is None):
            return entries
        steps = sorted(e["step"] for e in entries)
        kept = {steps[-1]}
        if self.keep is not None:
            kept.update(steps[-self.keep:])
        if self.keep_period is not None:
            kept.update(s for s in steps if s % self.keep_period == 0)
        if self.keep_best is not None:
            scored = [(e["score"], e["step"]) for e in entries if e.get("score") is not None]
            kept.update(s for _, s in self._ranked(scored)[: self.keep_best])
        return [e for e in entries if e["step"] in kept]

    def _check_names_free(self, step: int, index: _Index) -> None:
        """Refuses to write a step whose names hold something that is not the manager's own: not a
        regular file, or a file no entry lists and ``leftovers`` does not claim."""
        listed = _listed_names(index.entries)
        for name in _step_names(step):
            path = os.path.join(self.directory, name)
            mode = _found(path)
            if mode is None:
                continue
            if not stat.S_ISREG(mode):
                raise CheckpointDirectoryError(f"{path}: {_kind(mode)} stands at a name of step {step}; the manager "
                                               "writes regular files there and removes nothing it did not write: "
                                               "move it away to save this step")
            if name not in listed and step not in index.leftovers:
                raise CheckpointDirectoryError(f"{path}: no index entry lists this file, so it is not the manager's to "
                                               f"replace: move it away to save step {step}")

    def _own_unlisted(self, step: int, listed: set[str]) -> list[str]:
        """The regular files of a step that no entry lists (candidates for removal when the step is
        one of ``leftovers``)."""
        found = []
        for name in _step_names(step):
            mode = _found(os.path.join(self.directory, name))
            if name not in listed and mode is not None and stat.S_ISREG(mode):
                found.append(name)
        return found

    def _save(self, step: int, tree: Any, extra: Any, score: float | None, options: dict) -> SaveResult:
        options = dict(options)
        options.setdefault("name", self.name)
        file = names.step_file(step)
        path = os.path.join(self.directory, file)
        with self._saving:
            self._check_writable()
            with self._lock:
                # Claim the step's names before writing them: after a crash, the next manager knows
                # the files no entry lists are this save's, and removes them.
                index = _load_index(self.directory)
                self._check_names_free(step, index)
                if step not in index.leftovers:
                    write_index(self.directory, index.entries, leftovers=index.leftovers + [step], durable=self.durable)
            result = save(path, tree, durable=self.durable, digest=self.digest, **options)
            entry = {"step": step, "file": file, "type": result.type_text, "bytes": result.bytes,
                     "digest": result.digest, "extra": extra}
            if result.layout_path:
                entry["layout"] = names.step_layout(step)
            if score is not None:
                entry["score"] = score
            with self._lock:
                index = _load_index(self.directory)
                before = _listed_names(index.entries) | _listed_names([entry])  # this save's files too
                kept = self._retained([e for e in index.entries if e["step"] != step] + [entry])
                after = _listed_names(kept)
                # The index is rewritten first and the files go after, so that the index never names
                # a missing file; the dropped files stay claimed (leftovers) until they are gone.
                dropped = sorted(before - after)
                claimed = {names.step_of(name) for name in dropped}
                claimed.update(s for s in index.leftovers if s != step and self._own_unlisted(s, after))
                write_index(self.directory, kept, leftovers=claimed, durable=self.durable)
                self._remove(dropped)
        return result

    def _remove(self, dropped: list[str]) -> None:
        """Removes files the index no longer lists: only regular files at a step's own names (the
        manager writes nothing else); a link, a directory or anything else there is left alone."""
        for name in dropped:
            path = os.path.join(self.directory, name)
            mode = _found(path)
            if mode is None or not stat.S_ISREG(mode):
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- opening: leftovers and adoption ----------------------------------------------------------

    def _recover(self) -> None:
        """Run once the lock is held: removes what interrupted saves left (see the module's
        documentation), and adopts the step files of a directory without an index."""
        with self._lock:
            index = _load_index(self.directory)
            try:
                listing = os.listdir(self.directory)
            except OSError as e:
                raise CheckpointDirectoryError(f"{self.directory}: cannot list the directory: {e.strerror}") from e
            if not index.exists:
                self._adopt(listing)
            else:
                self._remove_unfinished(index)
            self._remove_stale(listing)

    def _remove_unfinished(self, index: _Index) -> None:
        """Removes the files of the saves ``leftovers`` claims that no entry lists, once no save of
        them is under way, and drops an entry whose re-save was cut short (its file no longer the
        one recorded): the index without it is written before its file goes."""
        if not index.leftovers:
            return
        by_step = {e["step"]: e for e in index.entries}
        cut_short = {step for step in index.leftovers if step in by_step and not self._still_recorded(by_step[step])}
        entries = [e for e in index.entries if e["step"] not in cut_short]
        if cut_short:
            write_index(self.directory, entries, leftovers=index.leftovers, durable=self.durable)
        listed = _listed_names(entries)
        busy = []
        for step in index.leftovers:
            path = os.path.join(self.directory, names.step_file(step))
            if not self._own_unlisted(step, listed) and _found(names.save_lock(path)) is None:
                continue  # nothing of it is left, and no save of it is under way: the claim goes
            with _idle(path) as idle:
                if not idle:
                    busy.append(step)
                    continue
                self._remove(self._own_unlisted(step, listed))
        write_index(self.directory, entries, leftovers=busy, durable=self.durable)

    def _still_recorded(self, entry: dict) -> bool:
        """Whether a listed step's file still has the digest its entry records."""
        path = os.path.join(self.directory, entry["file"])
        mode = _found(path)
        if mode is None or not stat.S_ISREG(mode):
            return True  # nothing the manager wrote is there: leave the entry to say so when read
        digests = {name: value for name, value in entry["digest"].items() if name in DIGESTS}
        return all(file_digest(path, name) == value.lower() for name, value in digests.items())

    def _remove_stale(self, listing: list[str]) -> None:
        """Temporary files of the index and of step files that no live writer holds, and the
        distributed temporaries and save locks of step files that no save holds. Only regular
        files."""
        temporaries, distributed, save_locks = set(), set(), set()
        for name in listing:
            found = names.leftover(name)
            if found is None:
                continue
            kind, file = found
            step = names.step_of(file)
            if kind == "random" and (step is not None or file == INDEX):
                temporaries.add(file)
            elif step is not None and file == names.step_file(step):  # a checkpoint, not a layout
                mode = _found(os.path.join(self.directory, name))
                if mode is not None and stat.S_ISREG(mode):
                    (distributed if kind == "distributed" else save_locks).add(file)
        for file in sorted(temporaries):
            # atomic_output's writers hold their temporary file's flock until the rename
            remove_stale_temporaries(os.path.join(self.directory, file))
        for file in sorted(distributed | save_locks):
            # each save of a step holds its destination lock until it is done (and removes it then)
            path = os.path.join(self.directory, file)
            with _idle(path) as idle:
                if idle and file in distributed:
                    try:
                        os.unlink(names.distributed_temporary(path))
                    except OSError:
                        pass

    def _adopt(self, listing: list[str]) -> None:
        """Rebuilds the index of a directory without one from its step files, when every one
        proves complete; refuses (E9014 naming each that does not) and changes nothing otherwise."""
        steps = sorted({step for step in map(names.step_of, listing) if step is not None})
        if not steps:
            return
        entries, problems = [], []
        for step in steps:
            try:
                entries.append(self._adoptable(step))
            except _NotAdoptable as e:
                problems.append(str(e))
        if problems:
            shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
            raise CheckpointDirectoryError(
                f"{self.directory}: no checkpoint index ({INDEX}), and {len(problems)} of its step files cannot be "
                f"adopted: {shown}. Nothing was changed: move those away (or put the index back) and open it again")
        write_index(self.directory, entries, durable=self.durable)

    def _adoptable(self, step: int) -> dict:
        """The index entry of a step file that proves complete (see the module's documentation), or
        :class:`_NotAdoptable` saying why not."""
        file, layout = _step_names(step)
        path, layout_path = os.path.join(self.directory, file), os.path.join(self.directory, layout)
        with _idle(path) as idle:
            if not idle:
                raise _NotAdoptable(file, "a save of this step is under way, or its save lock cannot be taken")
            mode, layout_mode = _found(path), _found(layout_path)
            if mode is None:
                raise _NotAdoptable(layout, f"a layout file without its checkpoint {file}")
            if not stat.S_ISREG(mode):
                raise _NotAdoptable(file, f"{_kind(mode)}, not a regular file")
            if layout_mode is not None and not stat.S_ISREG(layout_mode):
                raise _NotAdoptable(layout, f"{_kind(layout_mode)}, not a regular file")
            layout_file = None
            if layout_mode is not None:
                try:
                    layout_file = read_layout_file(layout_path)
                except PskdError as e:
                    raise _NotAdoptable(layout, e.message) from None
            try:
                with Reader(path) as reader:
                    header = reader.header
                    if layout_file is not None:
                        if layout_file.type_text != header.type_text:
                            raise _NotAdoptable(layout, f"written for type {layout_file.type_text!r}, but {file} "
                                                        f"holds {header.type_text!r}")
                        try:
                            reader.with_layout(layout_file.layout)
                        except PskdError as e:
                            raise _NotAdoptable(layout, f"does not fit {file}: {e.message}") from None
                    elif reader.placement is None:
                        raise _NotAdoptable(file, f"a {header.type_text!r} checkpoint without its layout file "
                                                  f"{layout}: its size proves nothing")
                    if header.count != 1:
                        raise _NotAdoptable(file, f"{header.count} samples, where a checkpoint holds one")
                    size = header.data_offset + reader.placement.sample_bytes
                    if reader.file_size != size:
                        raise _NotAdoptable(file, f"{reader.file_size} bytes, where one sample of its type and its "
                                                  f"header take {size}")
                digest = file_digest(path, self.digest)
            except PskdError as e:
                raise _NotAdoptable(file, e.message) from None
            if layout_file is not None:
                # The layout file must be this file's own: its header digest and size, and — the
                # file being hashed anyway — the whole file's xxh3_128 when it records one (a layout
                # of leaves of other shapes with the same encodings and byte total differs only there).
                try:
                    known = digest if self.digest == "xxh3_128" else None
                    check_belongs(layout_file, path, xxh3_128=_xxh3_for(path, layout_file, known))
                except PskdError as e:
                    raise _NotAdoptable(layout, e.message) from None
            entry = {"step": step, "file": file, "type": header.type_text, "bytes": size,
                     "digest": {self.digest: digest}, "extra": None, "adopted": True}
            if layout_file is not None:
                entry["layout"] = layout
            return entry

    # -- restoring -------------------------------------------------------------------------------

    def restore(self, step: int | None = None, target: Any = None, *, verify: bool = True, **options: Any) -> Any:
        """Restores a complete step (the latest by default); see :func:`pskd_jax.checkpoint.restore`.

        The whole file is checked against the digest recorded in the index (xxh3_128, or sha256)
        while it is read, and E9013 names the checkpoint when they differ: nothing is returned from
        a file that does not verify. ``verify=False`` skips the check (and returns whatever the
        file holds now)."""
        if "xxh3_128" in options or "sha256" in options:
            raise UsageError("CheckpointManager.restore checks the digest the index records; give verify=False "
                             "to skip the check, not a digest")
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
            release, self._release = self._release, None
            if release is not None:
                release()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["BEST_MODES", "CheckpointManager", "INDEX", "INDEX_VERSION", "LOCK", "MAX_STEP", "entry_digests",
           "entry_path", "read_index", "recorded_digests", "verify_directory", "write_index"]
