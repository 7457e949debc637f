"""The index of a checkpoint directory, ``checkpoints.json``: its entries as records
(:class:`CheckpointEntry`), read strictly (versions 1 to 3) and written atomically (version 3).
The format, and what every entry is checked for, are in ``docs/checkpoints.md``.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import stat
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pskd_jax._os import names
from pskd_jax._os.checks import abridged, is_integer, mode_words
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.jsonfile import json_kind, json_text
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.errors import CheckpointDirectoryError, TruncatedError

INDEX = names.CHECKPOINT_INDEX
INDEX_FORMAT = "pskd-checkpoints"
INDEX_VERSION = 3
READ_VERSIONS = (1, 2, 3)
MAX_STEP = 2**63 - 1  # the largest step: an int64, as a training loop counts

# The keys an entry of this version has: any other is kept as it was found (``more``).
_KNOWN = ("step", "file", "layout", "type", "bytes", "digest", "layout_digest", "extra", "score", "adopted", "started",
          "committed")

MAX_EXTRA_DEPTH = 200  # lists and objects nested deeper in ``extra`` are refused (E9014)


def is_step(value: Any) -> bool:
    """Whether ``value`` is a step: an integer (not a boolean) from 0 to :data:`MAX_STEP`."""
    return is_integer(value) and bool(0 <= value <= MAX_STEP)


def check_step(value: Any) -> int:
    """``value`` as a step (a Python int); E9014 otherwise."""
    if not is_step(value):
        raise CheckpointDirectoryError(f"step {abridged(value, 80)}: a step is an integer from 0 to {MAX_STEP}")
    return int(value)


def is_score(value: Any) -> bool:
    """Whether ``value`` is a score an entry can record: a finite real (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_digest_map(digest: Any) -> bool:
    return isinstance(digest, dict) and bool(digest) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in digest.items())


def utc_time() -> str:
    """Now, as an entry records its times: UTC in ISO 8601 to the microsecond, ``Z`` for UTC
    (``2026-12-02T03:04:05.678901Z``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def is_utc_time(value: Any) -> bool:
    """Whether ``value`` is a time an entry can record: ISO 8601 text of a UTC time (offset zero,
    ``Z`` as :func:`utc_time` writes it; a local time without an offset, or one of another zone,
    is not)."""
    if not isinstance(value, str):
        return False
    try:
        return datetime.datetime.fromisoformat(value).utcoffset() == datetime.timedelta(0)
    except ValueError:
        return False


def extra_json(extra: Any) -> Any:
    """``extra`` as the index keeps it, every value exactly as given, or E9014 naming the key path
    inside ``extra`` of the first value JSON cannot keep.

    Kept: None, booleans, ``str``, Python ints of any size, finite floats, lists and tuples (as
    lists), and dicts whose keys are all ``str``. NumPy scalars become the Python value equal to
    them (``np.float32(0.1)`` the float that is exactly its value, ``np.int64`` an int, ``np.bool_``
    a boolean); a ``longdouble`` only when a float holds it exactly. Refused: a key that is not a
    ``str`` (JSON would turn ``{1: 2}`` into ``{"1": 2}``), NaN and the infinities (not JSON),
    any other type, a container inside itself, and nesting deeper than :data:`MAX_EXTRA_DEPTH`."""
    return _extra_value(extra, "extra", set())


def _extra_value(value: Any, where: str, open_: set[int]) -> Any:
    def refuse(why: str) -> CheckpointDirectoryError:
        return CheckpointDirectoryError(f"{where}: {why}: not JSON, which the index keeps extra as")

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        exact = float(value)
        if not math.isfinite(exact):
            raise refuse(f"{abridged(value)} is not a finite number" if not math.isfinite(value)
                         else f"{abridged(value)} ({type(value).__name__}) is beyond a float's range")
        if isinstance(value, np.floating) and np.dtype(type(value)).itemsize > 8 and type(value)(exact) != value:
            raise refuse(f"{abridged(value)} ({type(value).__name__}) is not exactly a float")
        return exact
    if not isinstance(value, (dict, list, tuple)):
        raise refuse(f"{abridged(value)} is of type {type(value).__name__}")
    if id(value) in open_:
        raise refuse("a container inside itself")
    if len(open_) >= MAX_EXTRA_DEPTH:
        raise refuse(f"nested deeper than {MAX_EXTRA_DEPTH} lists and objects")
    open_.add(id(value))
    try:
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise refuse(f"the key {abridged(key)} ({type(key).__name__}) is not a str (JSON would "
                                 f"turn it into the text {str(key)!r})")
            return {key: _extra_value(item, f"{where}[{key!r}]", open_) for key, item in value.items()}
        return [_extra_value(item, f"{where}[{i}]", open_) for i, item in enumerate(value)]
    finally:
        open_.discard(id(value))


@dataclasses.dataclass(frozen=True)
class CheckpointEntry:
    """One complete checkpoint of the index: its step, the digests of its whole file by algorithm,
    its type and size, whether it has a layout file, the extra JSON saved with it, the score
    ``best_fn`` gave it, whether it was adopted (rebuilt from a file found without an index), and
    when it was written: ``started`` when the save began writing, ``committed`` when its file was
    complete and the entry listed (UTC, ISO 8601, :func:`utc_time`; None in entries written
    before they were recorded, and in adopted ones), and the digests of its layout file by algorithm
    (:attr:`layout_digest`: the data's digest does not cover the layout; None in entries written
    before it was recorded).

    An entry names only its own step's files (:attr:`file`, :attr:`layout`): never the index,
    the lock, or a file of another step or program.

    >>> entry = CheckpointEntry(100, {"xxh3_128": "0" * 32}, type_text="params Params", bytes=1024,
    ...                         layout=True, extra={"epoch": 1})
    >>> entry.file, entry.layout_name
    ('step-00000100.psk.d', 'step-00000100.layout.json')
    >>> CheckpointEntry.from_json(entry.to_json(), "checkpoints.json", 0) == entry
    True
    """

    step: int
    digest: Mapping[str, str]
    type_text: str | None = None
    bytes: int | None = None
    layout: bool = False
    extra: Any = None
    score: float | None = None
    adopted: bool = False
    started: str | None = None
    committed: str | None = None
    layout_digest: Mapping[str, str] | None = None  # of the layout file, by algorithm (None: not recorded)
    more: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keys of a later writer, kept

    @property
    def file(self) -> str:
        """The name of the step's checkpoint file."""
        return names.step_file(self.step)

    @property
    def layout_name(self) -> str | None:
        """The name of the step's layout file, None when the entry lists none."""
        return names.step_layout(self.step) if self.layout else None

    @property
    def names(self) -> tuple[str, ...]:
        """The files the entry lists: its checkpoint file, and its layout file when it has one."""
        return (self.file, names.step_layout(self.step)) if self.layout else (self.file,)

    def checkable_digests(self) -> dict[str, str]:
        """The digests this version can check, by algorithm (xxh3_128 first); E9014 when the entry
        records none of them."""
        known = {name: self.digest[name] for name in DIGESTS if name in self.digest}
        if not known:
            raise CheckpointDirectoryError(f"step {self.step} {self.file}: the index records only "
                                           f"{sorted(self.digest)} digests; this version checks {sorted(DIGESTS)}")
        return known

    def checkable_layout_digests(self) -> dict[str, str] | None:
        """The digests of the layout file this version can check, by algorithm; None when the entry
        records none (written before they were, or without a layout file); E9014 when it records
        only algorithms this version does not know."""
        if self.layout_digest is None:
            return None
        known = {name: self.layout_digest[name] for name in DIGESTS if name in self.layout_digest}
        if not known:
            raise CheckpointDirectoryError(f"step {self.step} {self.layout_name}: the index records only "
                                           f"{sorted(self.layout_digest)} digests of it; this version checks "
                                           f"{sorted(DIGESTS)}")
        return known

    def to_json(self) -> dict[str, Any]:
        """The entry as version 3 writes it."""
        entry: dict[str, Any] = {"step": self.step, "file": self.file}
        if self.layout:
            entry["layout"] = names.step_layout(self.step)
        if self.type_text is not None:
            entry["type"] = self.type_text
        if self.bytes is not None:
            entry["bytes"] = self.bytes
        entry["digest"] = dict(self.digest)
        if self.layout_digest is not None:
            entry["layout_digest"] = dict(self.layout_digest)
        entry["extra"] = self.extra
        if self.score is not None:
            entry["score"] = self.score
        if self.adopted:
            entry["adopted"] = True
        if self.started is not None:
            entry["started"] = self.started
        if self.committed is not None:
            entry["committed"] = self.committed
        entry.update(self.more)
        return entry

    @classmethod
    def from_json(cls, raw: Any, path: str, k: int, version: int = INDEX_VERSION) -> CheckpointEntry:
        """Entry ``k`` of the index ``path`` (of ``version``), or E9014 naming it: its step an
        integer from 0 to 2^63 - 1, its file exactly that step's file, its layout absent, null or
        exactly that step's layout file, its digest a map of algorithm to hex (a version-1 entry's
        ``sha256`` is read as ``{"sha256": …}``), and every other field of its type."""
        def bad(why: str) -> CheckpointDirectoryError:
            return CheckpointDirectoryError(f"{path}: malformed entry {k} ({abridged(raw)}): {why}")

        if not isinstance(raw, dict):
            raise bad("an entry is an object")
        entry = dict(raw)
        if version == 1 and "digest" not in entry and "sha256" in entry:
            entry["digest"] = {"sha256": entry.pop("sha256")}
        step = entry.get("step")
        if not is_step(step):
            raise bad(f"its step {json_kind(step)} is not an integer from 0 to {MAX_STEP}")
        step = int(entry["step"])
        if entry.get("file") != names.step_file(step):
            raise bad(f"its file {json_kind(entry.get('file'))} is not {names.step_file(step)!r}, the file of "
                      f"step {step}")
        if entry.get("layout") is not None and entry["layout"] != names.step_layout(step):
            raise bad(f"its layout {json_kind(entry['layout'])} is not {names.step_layout(step)!r}, the layout "
                      f"file of step {step}")
        if not _is_digest_map(entry.get("digest")):
            raise bad(f"its digest {json_kind(entry.get('digest'))} is not a map of algorithm to hex digest")
        if entry.get("layout_digest") is not None:
            if entry.get("layout") is None:
                raise bad("it records a layout_digest, but no layout file")
            if not _is_digest_map(entry["layout_digest"]):
                raise bad(f"its layout_digest {json_kind(entry['layout_digest'])} is not a map of algorithm to hex "
                          "digest")
        if "bytes" in entry and not (is_integer(entry["bytes"]) and entry["bytes"] >= 0):
            raise bad(f"its bytes {json_kind(entry['bytes'])} is not a size")
        if "type" in entry and not isinstance(entry["type"], str):
            raise bad(f"its type {json_kind(entry['type'])} is not a string")
        if entry.get("score") is not None and not is_score(entry["score"]):
            raise bad(f"its score {json_kind(entry['score'])} is not a finite number")
        if "adopted" in entry and not isinstance(entry["adopted"], bool):
            raise bad(f"adopted is {json_kind(entry['adopted'])}, not true or false")
        for name in ("started", "committed"):
            if entry.get(name) is not None and not is_utc_time(entry[name]):
                raise bad(f"its {name} {json_kind(entry[name])} is not a UTC time in ISO 8601")
        for name, value in entry.items():  # what the index is written back with: extra, and keys kept as found
            if name == "extra" or name not in _KNOWN:
                try:
                    _extra_value(value, name, set())
                except CheckpointDirectoryError as e:  # (1e400 reads as inf, which no index holds)
                    raise bad(e.message) from None
        return cls(step, dict(entry["digest"]), type_text=entry.get("type"), bytes=entry.get("bytes"),
                   layout=entry.get("layout") is not None, extra=entry.get("extra"), score=entry.get("score"),
                   adopted=entry.get("adopted", False), started=entry.get("started"),
                   committed=entry.get("committed"), layout_digest=entry.get("layout_digest"),
                   more={key: value for key, value in entry.items() if key not in _KNOWN})


@dataclasses.dataclass(frozen=True)
class Index:
    """An index as read: its entries by increasing step, the steps whose unlisted files are the
    manager's own (``leftovers``), and whether the index exists at all."""

    entries: tuple[CheckpointEntry, ...] = ()
    leftovers: tuple[int, ...] = ()
    exists: bool = False
    tag: str | None = None  # the version read (of an index in a bucket: what its next put is conditional on)

    @property
    def steps(self) -> list[int]:
        return [entry.step for entry in self.entries]

    def entry(self, step: int) -> CheckpointEntry | None:
        """The entry of ``step``, None when the index does not list it."""
        return next((entry for entry in self.entries if entry.step == step), None)

    def listed_names(self) -> set[str]:
        """Every file the entries name (each a step's own file or layout file)."""
        return listed_names(self.entries)


def listed_names(entries: Iterable[CheckpointEntry]) -> set[str]:
    """Every file ``entries`` name."""
    return {name for entry in entries for name in entry.names}


def parse_index(path: str, content: Any) -> Index:
    """The index ``path`` holding ``content`` (its JSON value), or E9014 naming it (or the entry)."""
    if not isinstance(content, dict):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index ({json_kind(content)}, not an object)")
    version = content.get("version")
    # (a version is an int: 3.0 and True equal 3 and 1, and are refused, not read as those)
    if content.get("format") != INDEX_FORMAT or not isinstance(version, int) or isinstance(version, bool) \
            or version not in READ_VERSIONS:
        raise CheckpointDirectoryError(
            f"{path}: not a checkpoint index (format {json_kind(content.get('format'))} version "
            f"{json_kind(version)}; this version reads {INDEX_FORMAT!r} versions {list(READ_VERSIONS)})")
    listed = content.get("checkpoints")
    if not isinstance(listed, list):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index (checkpoints is {json_kind(listed)}, "
                                       "not a list)")
    entries: list[CheckpointEntry] = []
    where: dict[int, int] = {}  # step → the entry that lists it
    for k, raw in enumerate(listed):
        entry = CheckpointEntry.from_json(raw, path, k, version)
        if entry.step in where:
            raise CheckpointDirectoryError(f"{path}: malformed entry {k} ({abridged(raw)}): step {entry.step} is "
                                           f"listed twice (entries {where[entry.step]} and {k})")
        where[entry.step] = k
        entries.append(entry)
    leftovers = content.get("leftovers", []) if version >= 3 else []
    if not isinstance(leftovers, list) or not all(is_step(s) for s in leftovers):
        raise CheckpointDirectoryError(f"{path}: not a checkpoint index (leftovers {abridged(leftovers)} is "
                                       f"not a list of steps from 0 to {MAX_STEP})")
    return Index(tuple(sorted(entries, key=lambda e: e.step)), tuple(sorted(set(leftovers))), True)


def load_index(directory: CheckpointDirectory) -> Index:
    """The index of ``directory`` (an empty one, ``exists`` False, when there is none); E9014 when
    it is not a regular file or not a checkpoint index of this toolkit."""
    mode = directory.mode(INDEX)
    if mode is None:
        return Index()
    path = directory.join(INDEX)
    if not stat.S_ISREG(mode):
        raise CheckpointDirectoryError(f"{path}: the checkpoint index is {mode_words(mode)}, not a regular "
                                       "file (the manager reads and replaces only a regular file there)")
    try:
        content, tag = directory.read_index_file(INDEX, CheckpointDirectoryError, "the checkpoint index")
    except TruncatedError:  # (an index object removed since it was looked at)
        return Index()
    return dataclasses.replace(parse_index(path, content), tag=tag)


def write_index(directory: CheckpointDirectory, entries: Iterable[CheckpointEntry], *, leftovers: Iterable[int] = (),
                durable: bool = True, over: Index | None = None) -> Index:
    """Writes the index (version 3), atomically: ``entries`` by step, and the steps whose unlisted
    files are the manager's own to remove (``leftovers``); returns it as written. ``over`` is the
    index this write replaces, as read: in a bucket the put is conditional on it (only if there is
    no index, when it did not exist; only if the index is still that version), and E9014 when
    another writer changed it meanwhile."""
    entries = tuple(sorted(entries, key=lambda e: e.step))
    kept = tuple(sorted(set(leftovers)))
    content = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "leftovers": list(kept),
               "checkpoints": [entry.to_json() for entry in entries]}
    data = (json_text(content, indent=1) + "\n").encode("utf-8")
    tag = directory.write_index_file(INDEX, data, durable=durable, tag=over.tag if over is not None else None,
                                     exists=over.exists if over is not None else False)
    return Index(entries, kept, True, tag)


def read_index(directory: str | CheckpointDirectory) -> list[CheckpointEntry]:
    """The index's entries, sorted by step (an empty list when there is no index yet). E9014
    naming the index, or the entry, when it is not a checkpoint index of this toolkit."""
    return list(load_index(CheckpointDirectory.of(directory)).entries)


__all__ = ["INDEX", "INDEX_FORMAT", "INDEX_VERSION", "MAX_EXTRA_DEPTH", "MAX_STEP", "READ_VERSIONS", "CheckpointEntry",
           "Index", "check_step", "extra_json", "is_score", "is_step", "is_utc_time", "listed_names", "load_index",
           "parse_index", "read_index", "utc_time", "write_index"]
