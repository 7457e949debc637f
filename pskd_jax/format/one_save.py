"""Reading a local data file and its layout file of one save, while another process may save the
checkpoint again: a read of the layout is trusted only when the commit witness
(:func:`pskd_jax._os.locks.commit_witness`) is the same on both sides of it and names the very data
file the reader holds open, and is tried again otherwise. Restore, ``find_layout_file`` and the
read-only commands (info, export, diff) all pair their layout and their data so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from pskd_jax._os.locks import commit_witness
from pskd_jax.errors import MismatchError, PskdError
from pskd_jax.storage import locate

# A read that a save of its path overtakes (its layout read beside one data file, another one
# there after) reads the checkpoint again, the new one whole, at most this many times in all.
ATTEMPTS = 8
RESAVED_PAUSE = 0.005  # a read of an object overtaken waits this long, doubled each time, before reading again

_Read = TypeVar("_Read")

FileIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_ctime_ns of a local data file


def identity_of(fd: int) -> FileIdentity:
    """What tells the data file open as ``fd`` from any other: its device, inode number and size
    (as the commit witness has them), and its inode's change time — the file may not be held from
    the proof of its layout to its read, and an inode number freed meanwhile can come back with a
    later save's data of the same size; the change time it then has is that save's."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns


def of_held_file(path: str, held: FileIdentity | None, read: Callable[[], _Read]) -> tuple[bool, _Read | None]:
    """``(True, read())`` when no save of the local data file ``path`` began or ended while
    ``read()`` ran and the file standing there is the one held open (``held``: its
    :func:`identity_of`; None: none could be opened); ``(False, None)`` when a save ran meanwhile
    (another file stands there now, or a commit began or ended: the layout ``read()`` saw may be
    the other save's, whose header and size can be the same). An error of ``read()`` is raised
    unless a save ran meanwhile (what refused it may be the save's doing: a layout of new data)."""
    before = commit_witness(path)
    if before[1] != (held[:3] if held is not None else None):
        return False, None
    try:
        found = read()
    except PskdError:
        if commit_witness(path) != before:
            return False, None
        raise
    if commit_witness(path) != before:
        return False, None
    return True, found


def until_one_save(path: str, attempt: Callable[[], tuple[bool, _Read]], *, reading: str = "this restore read it",
                   again: str = "restore again") -> _Read:
    """``attempt()``'s result, tried again while it finds its layout and its data of two saves
    (``(False, …)``), :data:`ATTEMPTS` times in all; then E9005 naming ``path``, saying that it was
    saved again while ``reading`` and to ``again`` once the saves pause. An object of a store is
    tried again a little later each time: the other save's layout put may be on its way."""
    local = locate(path).is_local
    for tries in range(ATTEMPTS):
        if tries and not local:
            time.sleep(RESAVED_PAUSE * 2 ** (tries - 1))
        done, found = attempt()
        if done:
            return found
    cut = "" if local else (" (or a save of it was cut off between its data and its layout, or the object was put "
                            "again by other means: then save it again)")
    raise MismatchError(f"{path}: saved again while {reading}, {ATTEMPTS} times running: its layout "
                        f"and its data could not be read from one save{cut}, and a mix of two is never returned: "
                        f"{again} once the saves of it pause")


__all__ = ["ATTEMPTS", "RESAVED_PAUSE", "FileIdentity", "identity_of", "of_held_file", "until_one_save"]
