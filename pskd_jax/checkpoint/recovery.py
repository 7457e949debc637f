"""What a manager does once it holds a directory's lock: remove what interrupted saves left — the
files of steps claimed under ``leftovers`` that no entry lists (on a bucket, their part objects too),
part objects of listed steps that their parts index does not reference, temporary files and save
locks no live writer holds (a step the index lists is never removed) — or, in a directory without an
index, adopt its step files (:mod:`pskd_jax.checkpoint.adoption`). Plain functions of the
directory and its index; the rules are in ``docs/checkpoints.md``.
"""

from __future__ import annotations

from pskd_jax._os import names
from pskd_jax.checkpoint.adoption import adopt
from pskd_jax.checkpoint.directory import CheckpointDirectory
from pskd_jax.checkpoint.index import INDEX, Index, load_index, write_index
from pskd_jax.checkpoint.parts import part_of


def recover(directory: CheckpointDirectory, *, digest: str, durable: bool) -> None:
    """Brings a directory the caller holds the lock of to a state its index describes: adopts the
    step files of a directory without an index (``digest``: the algorithm an adopted entry
    records), else removes what unfinished saves left; then removes stale temporary files."""
    index = load_index(directory)
    listing = directory.names()
    if not index.exists:
        adopt(directory, listing, digest=digest, durable=durable)
    else:
        remove_unfinished(directory, index, durable=durable)
        remove_unreferenced_parts(directory, listing)
    remove_stale(directory, listing)


def remove_unreferenced_parts(directory: CheckpointDirectory, listing: list[str]) -> None:
    """On a bucket: the part objects of each listed step (named exactly as a parts save of its
    file names them) that the step's committed parts index does not reference — what a save of
    the step cut off between its parts and its commit left, or a replaced save's parts whose
    removal failed. A part the index references is never removed; the parts of claimed steps are
    :func:`remove_unfinished`'s.

    Only parts in ``listing`` are candidates, and the index is read again after it was taken: a
    re-save of a listed step by another writer claims the step before it puts a part, so a part of
    it in the listing comes with its claim in that index (the step is then left alone), or with
    its committed parts index, which references it."""
    steps = {names.step_of(found[0]) for name in listing if (found := part_of(name)) is not None}
    if not steps - {None}:
        return
    index = load_index(directory)
    listed = index.listed_names()
    for step in sorted(s for s in steps if s is not None and s not in index.leftovers):
        if names.step_file(step) in listed:
            directory.remove(directory.unreferenced_parts(step, listed, listing))


def remove_unfinished(directory: CheckpointDirectory, index: Index, *, durable: bool) -> None:
    """Removes the files of the saves ``leftovers`` claims that no entry lists, once no save of
    them is under way, and drops the claims. A step the index lists is never removed: a re-save of
    it cut short after its file was replaced leaves the entry as it is, and a restore or a verify
    of it reports E9013 (its file no longer the one recorded) rather than recovery deleting it."""
    if not index.leftovers:
        return
    listed = index.listed_names()
    busy = []
    for step in index.leftovers:
        file = names.step_file(step)
        if not directory.unlisted_own(step, listed) and not directory.save_lock_exists(file):
            continue  # nothing of it is left, and no save of it is under way: the claim goes
        with directory.idle(file) as idle:
            if not idle:
                busy.append(step)
                continue
            directory.remove(directory.unlisted_own(step, listed))
    write_index(directory, index.entries, leftovers=busy, durable=durable, over=index)


def remove_stale(directory: CheckpointDirectory, listing: list[str]) -> None:
    """Temporary files of the index and of step files that no live writer holds, and the
    distributed temporaries and save locks of step files that no save holds. Only regular files."""
    temporaries: set[str] = set()
    distributed: set[str] = set()
    save_locks: set[str] = set()
    for name in listing:
        found = names.leftover(name)
        if found is None:
            continue
        kind, file = found
        step = names.step_of(file)
        if kind == "random" and (step is not None or file == INDEX):
            temporaries.add(file)
        elif step is not None and file == names.step_file(step) and directory.regular(name):  # a checkpoint's
            (distributed if kind == "distributed" else save_locks).add(file)
    for file in sorted(temporaries):
        directory.remove_stale_temporaries(file)
    for file in sorted(distributed | save_locks):
        # each save of a step holds its destination lock until it is done (and removes it then)
        with directory.idle(file) as idle:
            if idle and file in distributed:
                directory.remove_distributed_temporary(file)


__all__ = ["recover", "remove_stale", "remove_unfinished", "remove_unreferenced_parts"]
