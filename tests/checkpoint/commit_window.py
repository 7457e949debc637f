"""A save of a local checkpoint that lands inside a reader's look-up of its layout, held in its
commit window (its layout file renamed into place, its data not yet), by hooks: the interleaving is
the same on every run (no timing). Shared by the restore and the read-only commands' tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

import pskd_jax._os.atomic as atomic
import pskd_jax._os.locks as locks
import pskd_jax.checkpoint as ck
import pskd_jax.format.layout_file as layout_file

WAIT = 60  # seconds a hook waits for the other side before letting go (a guard against a hang only)


def read_inside_a_commit_window(monkeypatch: pytest.MonkeyPatch, path: os.PathLike, new: Any,
                                read: Callable[[], Any]) -> Any:
    """``read()``'s result, while a writer thread saves ``new`` at ``path``: the reader's look-up
    for a cut-short commit (``find_layout_file``'s) starts the writer, which renames its layout into
    place and pauses before its data; it finishes once ``read()`` has returned, or as soon as the
    reader looks at the commit again, by either name (the reader then waits for the writer, whose
    lock is held). Checks that the writer did commit inside the read, without an error."""
    layout_renamed, reader_waits = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    real_cut_short, real_commit = locks.commit_cut_short, atomic.commit
    calls = []

    def save_new() -> None:
        try:
            ck.save(path, new)
        except BaseException as e:  # (reported by the main thread)
            errors.append(e)
            layout_renamed.set()

    writer = threading.Thread(target=save_new)

    def cut_short_then_the_writer_commits(data_path):
        if os.fspath(data_path) != os.fspath(path):
            return real_cut_short(data_path)
        calls.append(data_path)
        if len(calls) > 1:  # (looked at again: the writer is let go, and waited for)
            reader_waits.set()
            return real_cut_short(data_path)
        found = real_cut_short(data_path)
        writer.start()
        assert layout_renamed.wait(WAIT)
        return found

    def looked_at_again(data_path):
        if writer.is_alive():
            reader_waits.set()
        return real_cut_short(data_path)

    def commit_pausing_before_the_data(fd_file, temporary, destination, **kwargs):
        if threading.current_thread() is writer and destination.endswith(os.sep + os.path.basename(path)):
            layout_renamed.set()
            reader_waits.wait(WAIT)
        return real_commit(fd_file, temporary, destination, **kwargs)

    monkeypatch.setattr(layout_file, "commit_cut_short", cut_short_then_the_writer_commits)  # (find_layout_file's)
    monkeypatch.setattr(locks, "commit_cut_short", looked_at_again)
    monkeypatch.setattr(atomic, "commit", commit_pausing_before_the_data)
    try:
        result = read()
    finally:
        reader_waits.set()
        if writer.is_alive():
            writer.join()
    assert calls and not errors, errors  # (the writer did commit inside the read)
    return result


__all__ = ["WAIT", "read_inside_a_commit_window"]
