"""A step written into a checkpoint directory, as the index sees it: the claim recorded before its
files are written (so that what a crash leaves can be proved the manager's own), then its entry,
with the entries retention lets go dropped — the index first, their files after, so that the index
never names a missing file. The caller holds the directory (its lock, and the index for the call).
"""

from __future__ import annotations

import dataclasses
import stat

from pskd_jax._os import names
from pskd_jax._os.checks import mode_words
from pskd_jax.checkpoint.directory import CheckpointDirectory, step_names
from pskd_jax.checkpoint.index import CheckpointEntry, Index, listed_names, load_index, write_index
from pskd_jax.checkpoint.retention import Retention, scores_of
from pskd_jax.errors import CheckpointDirectoryError


def claim_step(directory: CheckpointDirectory, step: int, *, durable: bool) -> None:
    """Records ``step`` under the index's ``leftovers`` before its files are written; refuses
    (E9014) a step whose names hold something that is not the manager's own."""
    index = load_index(directory)
    check_names_free(directory, step, index)
    if step not in index.leftovers:
        write_index(directory, index.entries, leftovers=index.leftovers + (step,), durable=durable, over=index)


def check_names_free(directory: CheckpointDirectory, step: int, index: Index) -> None:
    """Refuses to write a step whose names hold something that is not the manager's own: not a
    regular file, or a file no entry lists and ``leftovers`` does not claim."""
    listed = index.listed_names()
    for name in step_names(step):
        mode = directory.mode(name)
        if mode is None:
            continue
        path = directory.join(name)
        if not stat.S_ISREG(mode):
            raise CheckpointDirectoryError(f"{path}: {mode_words(mode)} stands at a name of step {step}; the manager "
                                           "writes regular files there and removes nothing it did not write: "
                                           "move it away to save this step")
        if name not in listed and step not in index.leftovers:
            raise CheckpointDirectoryError(f"{path}: no index entry lists this file, so it is not the manager's to "
                                           f"replace: move it away to save step {step}")


def commit_step(directory: CheckpointDirectory, entry: CheckpointEntry, retention: Retention, *,
                durable: bool) -> None:
    """Lists ``entry`` (in place of an entry of its step), keeps what ``retention`` keeps, and
    removes the files of the entries it drops once the index no longer lists them. The dropped
    files stay claimed (``leftovers``) until they are gone, as do the claims of other steps that
    still have unlisted files."""
    index = load_index(directory)
    if entry.step not in index.leftovers:
        # The claim recorded before the files were written is gone: another manager of this place
        # (on a bucket, where no lock keeps a second one out) recovered it as an interrupted save.
        raise CheckpointDirectoryError(f"{directory.join(names.step_file(entry.step))}: step {entry.step} is no "
                                       "longer claimed in the checkpoint index (another CheckpointManager of "
                                       f"{directory.path} removed the claim); the step was not listed")
    entry = with_layout_digests(directory, entry)
    before = index.listed_names() | listed_names([entry])  # this save's files too
    candidates = [e for e in index.entries if e.step != entry.step] + [entry]
    keep = retention.kept_steps(scores_of(candidates))
    kept = [e for e in candidates if e.step in keep]
    after = listed_names(kept)
    dropped = sorted(before - after)
    # A step the new index lists is never claimed under ``leftovers`` (a claim on a listed step
    # says that a re-save of it is under way). The names a listed step no longer has — the layout
    # file of a re-save as a closed type — described the data this save replaced: they go first.
    # Those of the steps retention drops are claimed until they are gone (the index first).
    directory.remove([name for name in dropped if names.step_of(name) in keep])
    for step in index.leftovers:
        if step in keep and step != entry.step:
            directory.remove(directory.unlisted_own(step, after))
    claimed = {names.step_of(name) for name in dropped} - keep
    claimed.update(s for s in index.leftovers if s not in keep and directory.unlisted_own(s, after))
    write_index(directory, kept, leftovers=[s for s in claimed if s is not None], durable=durable, over=index)
    directory.remove([name for name in dropped if names.step_of(name) not in keep])
    # On a bucket, a step saved by several processes is a parts index and its part objects: those
    # of a dropped step go after its index object (still claimed until then); of the step just
    # listed, those its parts index does not reference (of a save of it cut off before).
    for step in sorted({s for s in map(names.step_of, dropped) if s is not None and s not in keep}):
        directory.remove(directory.unreferenced_parts(step, after))
    directory.remove(directory.unreferenced_parts(entry.step, after))


def with_layout_digests(directory: CheckpointDirectory, entry: CheckpointEntry) -> CheckpointEntry:
    """``entry`` recording the digests of its layout file too (by the algorithms of its data's), once
    the layout file proves to be its file's own: the data's digest does not cover the layout, and a
    verified restore checks both (an edited shape or key path is E9013, not the data in another
    structure)."""
    if entry.layout_name is None or entry.layout_digest is not None:
        return entry
    found = directory.layout_digests(entry.layout_name, entry.file, entry.digest, entry.digest.get("xxh3_128"))
    return dataclasses.replace(entry, layout_digest=found)


__all__ = ["check_names_free", "claim_step", "commit_step", "with_layout_digests"]
