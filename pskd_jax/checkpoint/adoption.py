"""Adopting a directory of step files found without an index: each step file that proves complete
on its own gets an entry, or — when any does not — the manager is refused (E9014 naming each such
file and why) and nothing is written or removed. What proves a step file complete is in
``docs/checkpoints.md``.
"""

from __future__ import annotations

import stat

from pskd_jax._os import names
from pskd_jax._os.checks import mode_words
from pskd_jax.checkpoint.directory import CheckpointDirectory, step_names
from pskd_jax.checkpoint.index import INDEX, CheckpointEntry, Index, write_index
from pskd_jax.checkpoint.integrity import layout_xxh3
from pskd_jax.errors import CheckpointDirectoryError, PskdError
from pskd_jax.format.layout_file import LayoutFile

SHOWN = 8  # files an adoption refusal names before counting the rest


class NotAdoptable(Exception):
    """A step file found without an index that does not prove complete (internal)."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")


def adopt(directory: CheckpointDirectory, listing: list[str], *, digest: str, durable: bool) -> None:
    """Writes the index of a directory without one from its step files when every one proves
    complete (each entry recording the file's ``digest`` as found, ``extra`` null, ``adopted``);
    refuses (E9014 naming each that does not) and changes nothing otherwise."""
    steps = sorted({step for step in map(names.step_of, listing) if step is not None})
    if not steps:
        return
    entries, problems = [], []
    for step in steps:
        try:
            entries.append(adoptable(directory, step, digest))
        except NotAdoptable as e:
            problems.append(str(e))
    if problems:
        shown = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise CheckpointDirectoryError(
            f"{directory.path}: no checkpoint index ({INDEX}), and {len(problems)} of its step files cannot be "
            f"adopted: {shown}. Nothing was changed: move those away (or put the index back) and open it again")
    write_index(directory, entries, durable=durable, over=Index())  # (only if there is still no index)


def adoptable(directory: CheckpointDirectory, step: int, digest: str) -> CheckpointEntry:
    """The entry of a step file that proves complete, or :class:`NotAdoptable` saying why not."""
    file, layout = step_names(step)
    with directory.idle(file) as idle:
        if not idle:
            raise NotAdoptable(file, "a save of this step is under way, or its save lock cannot be taken")
        mode, layout_mode = directory.mode(file), directory.mode(layout)
        if mode is None:
            raise NotAdoptable(layout, f"a layout file without its checkpoint {file}")
        if not stat.S_ISREG(mode):
            raise NotAdoptable(file, f"{mode_words(mode)}, not a regular file")
        if layout_mode is not None and not stat.S_ISREG(layout_mode):
            raise NotAdoptable(layout, f"{mode_words(layout_mode)}, not a regular file")
        layout_file = None
        if layout_mode is not None:
            try:
                layout_file = directory.layout_of(layout)
            except PskdError as e:
                raise NotAdoptable(layout, e.message) from None
        try:
            type_text, size = _complete(directory, file, layout, layout_file)
            found = directory.digest(file, digest)
        except PskdError as e:
            raise NotAdoptable(file, e.message) from None
        layout_digest = None
        if layout_file is not None:
            # The layout file must be this file's own: its header digest and size, and — the file
            # being hashed anyway — the whole file's xxh3_128 when it records one (a layout of
            # leaves of other shapes with the same encodings and byte total differs only there).
            try:
                known = found if digest == "xxh3_128" else None
                xxh3 = layout_xxh3(directory.join(file), layout_file, known)
                layout_digest = directory.layout_digests(layout, file, [digest], xxh3)
            except PskdError as e:
                raise NotAdoptable(layout, e.message) from None
        return CheckpointEntry(step, {digest: found}, type_text=type_text, bytes=size, layout=layout_file is not None,
                               adopted=True, layout_digest=layout_digest)


def _complete(directory: CheckpointDirectory, file: str, layout: str, layout_file: LayoutFile | None
              ) -> tuple[str, int]:
    """The type and size of a step file that holds one whole sample of its type (read through its
    layout file when it has one), or :class:`NotAdoptable` saying why not."""
    with directory.checkpoint(file) as reader:
        header = reader.header
        if layout_file is not None:
            if layout_file.type_text != header.type_text:
                raise NotAdoptable(layout, f"written for type {layout_file.type_text!r}, but {file} "
                                           f"holds {header.type_text!r}")
            try:
                reader.with_layout(layout_file.layout)
            except PskdError as e:
                raise NotAdoptable(layout, f"does not fit {file}: {e.message}") from None
        placement = reader.placement
        if placement is None:
            raise NotAdoptable(file, f"a {header.type_text!r} checkpoint without its layout file "
                                     f"{layout}: its size proves nothing")
        if header.count != 1:
            raise NotAdoptable(file, f"{header.count} samples, where a checkpoint holds one")
        size = header.data_offset + placement.sample_bytes
        if reader.file_size != size:
            raise NotAdoptable(file, f"{reader.file_size} bytes, where one sample of its type and its "
                                     f"header take {size}")
    return header.type_text, size


__all__ = ["NotAdoptable", "adopt", "adoptable"]
