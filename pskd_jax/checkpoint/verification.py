"""Checking a checkpoint directory against its index: every listed file against the digests
recorded when it was written, and each step's layout file against its data file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pskd_jax._os import names
from pskd_jax._os.checks import counted
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, CheckpointEntry, check_step, load_index
from pskd_jax.checkpoint.integrity import checked_digests, layout_xxh3, verify_data
from pskd_jax.errors import CheckpointDirectoryError, MismatchError, NotClosedError, PskdError
from pskd_jax.format.layout_file import read_layout_and_bytes
from pskd_jax.storage import locate


def verify_directory(directory: str | os.PathLike, *, step: int | None = None) -> list[CheckpointEntry]:
    """Checks the checkpoints of a directory (or one step) against their recorded digests (every
    algorithm an entry records that this version knows), and each step's layout file against its
    data file; returns the entries checked. E9013 names the first damaged checkpoint; E9005 (naming
    both files) a layout file written for another file — another header, size, or whole-file
    xxh3_128 —; E9001 (naming both) a listed layout file that is missing or does not read; E9014 a
    malformed index, a step the index lacks, or step files without an index (nothing to check them
    against: a manager opened on the directory adopts them)."""
    place = CheckpointDirectory.of(directory)
    index = load_index(place)
    if not index.exists:
        found = sorted(name for name in place.names(missing_ok=True) if names.step_of(name) is not None)
        if found:
            raise CheckpointDirectoryError(
                f"{place.path}: no checkpoint index ({INDEX}), but {counted(len(found), 'step file')} "
                f"({', '.join(found[:4])}{', …' if len(found) > 4 else ''}): "
                "no recorded digest to check them against (a CheckpointManager opened on the directory adopts "
                "the complete ones)")
    entries = list(index.entries)
    if step is not None:
        step = check_step(step)  # (True and 1.0 equal 1: refused, not taken for step 1)
        entries = [entry for entry in entries if entry.step == step]
        if not entries:
            raise CheckpointDirectoryError(f"{place.path}: no complete checkpoint for step {step}")
    for entry in entries:
        path = place.readable(entry.step, entry.file, entry.layout_name)
        digests = entry.checkable_digests()
        verify_data(path, digests)
        _verify_layout(place, entry, path, digests)
    return entries


def verify_file(path: str | os.PathLike, digests: Mapping[str, str]) -> str:
    """Checks a whole file against its recorded digests (``{"xxh3_128": HEX}``, ``{"sha256": HEX}``
    or both: each given is checked); E9013 naming the file on a mismatch. Returns the algorithm
    checked (the first given, xxh3_128 before sha256).

    A step file that its directory's checkpoint index lists (a :class:`CheckpointManager`'s) has
    its layout file checked too, as :func:`verify_directory` and the manager's verified restore
    check it: its own (E9005 naming both otherwise), and — where the index records the layout
    file's digest — unchanged since its save (E9013 naming the step file and the layout file: the
    data's digest does not cover it). A file no index lists has no recorded layout to compare."""
    checked = verify_data(path, digests)
    listed = _listed_step(path)
    if listed is not None:
        place, entry = listed
        readable = place.readable(entry.step, entry.file, entry.layout_name)
        _verify_layout(place, entry, readable, checked_digests(readable, digests))
    return checked


def _verify_layout(directory: CheckpointDirectory, entry: CheckpointEntry, path: str, digests: dict[str, str]) -> None:
    """Checks that the layout file of a verified step is its own (E9005 naming both files when it
    was written for another file; E9001 naming both when the index lists one that is missing or
    does not read): by its header digest and size, and by the whole file's xxh3_128 it records;
    E9013 naming it when the index records its digest and it was changed since.
    A step the index lists without a layout file is checked only when one lies beside it (restore
    would use it)."""
    listed = entry.layout_name
    name = listed or os.path.basename(names.layout_path_for(entry.file))
    if not listed and not directory.exists(name):
        return
    where = f"step {entry.step} {path}"
    try:
        raw, layout_file = read_layout_and_bytes(directory.join(name))
    except PskdError as e:
        raise NotClosedError(f"{where}: its layout file does not read: {e.message}") from None
    try:
        directory.check_layout(layout_file, entry.file, layout_xxh3(path, layout_file, digests.get("xxh3_128")))
    except MismatchError as e:
        raise MismatchError(f"{where}: {e.message}") from None
    layout_digests = entry.checkable_layout_digests() if listed else None
    if layout_digests is not None:  # its own, but changed since its save (an edited shape or key path)
        directory.check_layout_bytes(entry, raw, layout_digests)


def recorded_digests(path: str | os.PathLike) -> dict[str, str]:
    """The digests the index of a checkpoint file's directory records for it (empty when the
    directory has no index, or the index does not list the file)."""
    listed = _listed_step(path)
    return listed[1].checkable_digests() if listed is not None else {}


def _listed_step(path: str | os.PathLike) -> tuple[CheckpointDirectory, CheckpointEntry] | None:
    """The directory of a checkpoint file and the entry its index lists the file under; None when
    the directory has no index, or the index does not list the file (E9014 for a malformed one)."""
    where = locate(path)
    if where.is_local:
        directory, name = os.path.split(os.path.abspath(where.path))
    else:
        directory, name = where.parent().url, where.name
    place = CheckpointDirectory.of(directory)
    for entry in load_index(place).entries:
        if entry.file == name:
            return place, entry
    return None


__all__ = ["recorded_digests", "verify_directory", "verify_file"]
