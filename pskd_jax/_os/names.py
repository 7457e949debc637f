"""Every name the toolkit gives a file on disk, built and recognised here and nowhere else.

A module that writes a file asks this one for its name; a module that lists a directory asks this
one what a name is, so the two never drift apart. The names: ``docs/files.md`` ("The names it
gives files").
"""

from __future__ import annotations

import os
import re

PSKD_SUFFIX = ".psk.d"
LAYOUT_SUFFIX = ".layout.json"
OTHER_LAYOUT_SUFFIX = ".pskd-layout.json"  # the layout of a data file whose name is not *.psk.d

STANDARD_STREAM = "-"  # an output (or input) path naming the standard output (input), never a file

CHECKPOINT_INDEX = "checkpoints.json"
CHECKPOINT_LOCK = ".pskd-checkpoints.lock"
CORPUS_MANIFEST = "shards.json"
CORPUS_LOCK = ".pskd-corpus.lock"
CORPUS_JOURNAL = ".shards.journal"

_TEMPORARY_RANDOM = "[a-z0-9_]{8}"
_STEP = re.compile(r"step-(?P<step>[0-9]{8,})(?P<suffix>\.psk\.d|\.layout\.json)")
_SHARD = re.compile(r"shard-(?P<index>[0-9]{5,})\.psk\.d")
_LEFTOVER = re.compile(r"\.(?P<file>.+)\.(?:(?P<random>" + _TEMPORARY_RANDOM + r")\.tmp"
                       r"|(?P<distributed>distributed)\.tmp|(?P<lock>lock)|(?P<before>layout-before))")
_LEFTOVER_KINDS = {"random": "random", "distributed": "distributed", "lock": "lock", "before": "layout-before"}


# -- beside any output ---------------------------------------------------------------------------


def temporary_prefix(path: str | os.PathLike) -> str:
    """The prefix :func:`tempfile.mkstemp` is given for a temporary file of ``path`` (the suffix is
    ``.tmp``)."""
    return "." + os.path.basename(os.fspath(path)) + "."


def temporary_pattern(path: str | os.PathLike) -> re.Pattern[str]:
    """The names of the temporary files of ``path`` (as :func:`temporary_prefix` makes them)."""
    return re.compile(re.escape(temporary_prefix(path)) + _TEMPORARY_RANDOM + re.escape(".tmp"))


def distributed_temporary(path: str | os.PathLike) -> str:
    """``dir/NAME`` → ``dir/.NAME.distributed.tmp``."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, f".{name}.distributed.tmp")


def save_lock(path: str | os.PathLike) -> str:
    """``dir/NAME`` → ``dir/.NAME.lock``, the lock a save of ``NAME`` holds."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, "." + name + ".lock")


def layout_before(path: str | os.PathLike) -> str:
    """``dir/NAME`` → ``dir/.NAME.layout-before``: a second name (a hard link) a save of ``NAME``
    gives the layout file it is about to replace or remove, kept only while it puts its layout
    file and its data in place, so that a reader of a save cut off between the two finds the old
    pair whole (:func:`pskd_jax._os.locks.mark_committing`)."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, "." + name + ".layout-before")


def leftover(name: str) -> tuple[str, str] | None:
    """What a hidden name beside an output is: ``("random" | "distributed" | "lock" |
    "layout-before", NAME)`` for a temporary file, a lock of ``NAME`` or the old layout file a save
    of ``NAME`` keeps while it commits (:func:`layout_before`), None for anything else.

    >>> leftover(".step-00000001.psk.d.ab12cd34.tmp"), leftover(".x.lock"), leftover("x.tmp")
    (('random', 'step-00000001.psk.d'), ('lock', 'x'), None)
    >>> leftover(".c.psk.d.layout-before")
    ('layout-before', 'c.psk.d')
    """
    match = _LEFTOVER.fullmatch(name)
    if match is None:
        return None
    group = next(k for k in _LEFTOVER_KINDS if match.group(k))
    return _LEFTOVER_KINDS[group], match.group("file")


def layout_path_for(path: str | os.PathLike) -> str:
    """The layout file of the data file ``path``, from its whole name, no two data files sharing
    one: ``dir/STEM.psk.d`` → ``dir/STEM.layout.json``; any other name gets
    :data:`OTHER_LAYOUT_SUFFIX` added (never ``.layout.json``, which a ``.psk.d`` name's layout ends
    with: ``m`` and ``m.psk.d`` have layouts of their own).

    >>> layout_path_for("ckpt/step-00000010.psk.d"), layout_path_for("model.bin"), layout_path_for("m")
    ('ckpt/step-00000010.layout.json', 'model.bin.pskd-layout.json', 'm.pskd-layout.json')
    """
    path = os.fspath(path)
    if path.endswith(PSKD_SUFFIX) and os.path.basename(path) != PSKD_SUFFIX:
        return path[: -len(PSKD_SUFFIX)] + LAYOUT_SUFFIX
    return path + OTHER_LAYOUT_SUFFIX


def older_layout_paths(path: str | os.PathLike) -> list[str]:
    """The names earlier versions gave the layout file of ``path`` (``NAME.layout.json`` beside a
    data file not named ``*.psk.d``): read when one proves to belong to the file, never written.

    >>> older_layout_paths("model.bin"), older_layout_paths("m.psk.d")
    (['model.bin.layout.json'], [])
    """
    path = os.fspath(path)
    stem = path[: -len(PSKD_SUFFIX)] if path.endswith(PSKD_SUFFIX) else path
    return [name for name in (stem + LAYOUT_SUFFIX,) if name != layout_path_for(path)]


def data_path_for(layout: str | os.PathLike) -> str | None:
    """The data file whose layout file :func:`layout_path_for` names ``layout``; None for a name
    it never gives.

    >>> data_path_for("ckpt/step-00000010.layout.json"), data_path_for("m.pskd-layout.json")
    ('ckpt/step-00000010.psk.d', 'm')
    """
    layout = os.fspath(layout)
    for suffix, data_suffix in ((OTHER_LAYOUT_SUFFIX, ""), (LAYOUT_SUFFIX, PSKD_SUFFIX)):
        if layout.endswith(suffix):
            data = layout[: -len(suffix)] + data_suffix
            return data if layout_path_for(data) == layout else None
    return None


def is_layout_name(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as a layout file is (``*.layout.json``, ``*.pskd-layout.json``)."""
    name = os.path.basename(os.fspath(path))
    return name.endswith((LAYOUT_SUFFIX, OTHER_LAYOUT_SUFFIX))


# -- checkpoint directories ------------------------------------------------------------------------


def step_file(step: int) -> str:
    """The checkpoint file of a step.

    >>> step_file(100)
    'step-00000100.psk.d'
    """
    return f"step-{step:08d}{PSKD_SUFFIX}"


def step_layout(step: int) -> str:
    """The layout file of a step."""
    return f"step-{step:08d}{LAYOUT_SUFFIX}"


def step_of(name: str) -> int | None:
    """The step whose checkpoint or layout file ``name`` is, exactly as :func:`step_file` and
    :func:`step_layout` write it; None for any other name (``step-1.psk.d`` included).

    >>> step_of("step-00000100.psk.d"), step_of("step-00000100.layout.json"), step_of("step-100.psk.d")
    (100, 100, None)
    """
    match = _STEP.fullmatch(name)
    if match is None:
        return None
    step = int(match.group("step"))
    made = step_file(step) if match.group("suffix") == PSKD_SUFFIX else step_layout(step)
    return step if made == name else None


# -- corpus directories ----------------------------------------------------------------------------


def shard_name(index: int) -> str:
    """The file of shard ``index`` (from 0) of a corpus build.

    >>> shard_name(3)
    'shard-00003.psk.d'
    """
    return f"shard-{index:05d}{PSKD_SUFFIX}"


def shard_index(name: str) -> int | None:
    """The index of a shard file named as :func:`shard_name` names it; None for any other name.

    >>> shard_index("shard-00003.psk.d"), shard_index("shard-3.psk.d"), shard_index("notes.txt")
    (3, None, None)
    """
    match = _SHARD.fullmatch(name)
    if match is None:
        return None
    index = int(match.group("index"))
    return index if shard_name(index) == name else None


# -- a cache of corpus shards ----------------------------------------------------------------------

_CACHED_SHARD = re.compile(r"(?P<sha256>[0-9a-f]{64})\.psk\.d")


def cached_shard(sha256: str) -> str:
    """The name a shard cache keeps a shard under: its sha256 (its content names it).

    >>> cached_shard("ab" * 32)[-12:], cached_shard_sha256(cached_shard("ab" * 32)) == "ab" * 32
    ('ababab.psk.d', True)
    """
    return f"{sha256}{PSKD_SUFFIX}"


def cached_shard_sha256(name: str) -> str | None:
    """The sha256 of a name :func:`cached_shard` made, None for any other name."""
    match = _CACHED_SHARD.fullmatch(name)
    return match.group("sha256") if match else None


__all__ = [
    "CHECKPOINT_INDEX",
    "CHECKPOINT_LOCK",
    "CORPUS_JOURNAL",
    "CORPUS_LOCK",
    "CORPUS_MANIFEST",
    "LAYOUT_SUFFIX",
    "OTHER_LAYOUT_SUFFIX",
    "PSKD_SUFFIX",
    "STANDARD_STREAM",
    "cached_shard",
    "cached_shard_sha256",
    "data_path_for",
    "distributed_temporary",
    "is_layout_name",
    "layout_before",
    "layout_path_for",
    "leftover",
    "older_layout_paths",
    "save_lock",
    "shard_index",
    "shard_name",
    "step_file",
    "step_layout",
    "step_of",
    "temporary_pattern",
    "temporary_prefix",
]
