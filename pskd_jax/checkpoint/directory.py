"""A checkpoint directory as the manager touches it: the one place where its entries are looked at
(without following links), listed, proved idle and removed. The index, recovery, adoption and
verification take a :class:`CheckpointDirectory` value, so that another place to keep checkpoints
can stand in for a local directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Iterable, Iterator

from pskd_jax._os import names
from pskd_jax._os.atomic import remove_stale_temporaries
from pskd_jax._os.checks import mode_words
from pskd_jax._os.digests import file_digest
from pskd_jax._os.locks import destination_lock
from pskd_jax.errors import CheckpointDirectoryError, PskdError, TruncatedError


@dataclasses.dataclass(frozen=True)
class CheckpointDirectory:
    """The directory ``path`` of a checkpoint manager (a path as given: it is not resolved)."""

    path: str

    @classmethod
    def of(cls, directory: str | os.PathLike[str] | CheckpointDirectory) -> CheckpointDirectory:
        return directory if isinstance(directory, CheckpointDirectory) else cls(os.fspath(directory))

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def mode(self, name: str) -> int | None:
        """The ``lstat`` mode of ``name`` in the directory (a link itself, not what it leads to),
        None when nothing is there; E9014 naming it when it cannot be looked at."""
        return found_mode(self.join(name))

    def regular(self, name: str) -> bool:
        """Whether a regular file stands at ``name`` (not a link, a directory, a FIFO, …)."""
        mode = self.mode(name)
        return mode is not None and stat.S_ISREG(mode)

    def names(self, *, missing_ok: bool = False) -> list[str]:
        """What the directory holds; E9014 when it cannot be listed (an empty list for a directory
        that does not exist, with ``missing_ok``)."""
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            if missing_ok:
                return []
            raise CheckpointDirectoryError(f"{self.path}: cannot list the directory: it does not exist") from None
        except OSError as e:
            raise CheckpointDirectoryError(f"{self.path}: cannot list the directory: {e.strerror or e}") from e

    def remove(self, dropped: Iterable[str]) -> None:
        """Removes files the index no longer lists: only regular files (the manager writes nothing
        else); a link, a directory or anything else at such a name is left alone."""
        for name in dropped:
            if not self.regular(name):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.join(name))

    def unlisted_own(self, step: int, listed: set[str]) -> list[str]:
        """The regular files of a step that no entry lists (the manager's own when the index
        claims the step under ``leftovers``)."""
        return [name for name in step_names(step) if name not in listed and self.regular(name)]

    @contextlib.contextmanager
    def idle(self, name: str) -> Iterator[bool]:
        """Holds the save lock of the step file ``name`` for a ``with`` block when no save of it is
        under way; yields False when one is, or when the lock cannot be taken (something other than
        a file at its name): the caller then leaves the step's files alone."""
        with contextlib.ExitStack() as stack:
            try:
                idle = stack.enter_context(destination_lock(self.join(name), wait=False))
            except PskdError:  # a link or a directory at the lock's name
                idle = False
            yield idle

    def readable(self, step: int, file: str, layout: str | None) -> str:
        """The path of a listed step's file, to read. Refused (E9014) when it, or its layout file,
        resolves through a symlink to somewhere outside the directory (an index reads only its own
        files), or when it is not a regular file (a FIFO would block a reader); E9003 when it is
        missing."""
        root = os.path.realpath(self.path)
        for name in (file, layout):
            if name is None:
                continue
            real = os.path.realpath(self.join(name))
            if os.path.dirname(real) != root:
                raise CheckpointDirectoryError(f"{self.path}: step {step}: {name} leads to {real}, outside "
                                               "the checkpoint directory (through a symlink)")
        path = self.join(file)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise TruncatedError(f"{path}: step {step} is listed in the checkpoint index, but its file "
                                 "is missing") from None
        except OSError as e:
            raise TruncatedError(f"{path}: step {step}: cannot read: {e.strerror or e}") from e
        if not stat.S_ISREG(mode):
            raise CheckpointDirectoryError(f"{path}: step {step}: {mode_words(mode)}, not a regular file")
        return path

    def exists(self, name: str) -> bool:
        """Whether anything stands at ``name`` (a dangling link included)."""
        return os.path.lexists(self.join(name))

    def digest(self, name: str, algorithm: str) -> str:
        """The digest of the whole file ``name`` (hex, lowercase)."""
        return file_digest(self.join(name), algorithm)

    def save_lock_exists(self, file: str) -> bool:
        """Whether the save lock of the step file ``file`` stands beside it (a save of it is under
        way, or one was killed)."""
        return found_mode(names.save_lock(self.join(file))) is not None

    def remove_stale_temporaries(self, file: str) -> None:
        """Removes the temporary files of ``file`` that no live writer holds (each writer holds its
        temporary file's ``flock`` until the rename)."""
        remove_stale_temporaries(self.join(file))

    def remove_distributed_temporary(self, file: str) -> None:
        """Removes the temporary file of a distributed save of ``file`` (once no save holds it)."""
        with contextlib.suppress(OSError):
            os.unlink(names.distributed_temporary(self.join(file)))


def found_mode(path: str) -> int | None:
    """The ``lstat`` mode of ``path``, None when nothing is there; E9014 naming it when it cannot be
    looked at (a NUL in it included)."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointDirectoryError(f"{path}: cannot look at it: {e.strerror or e}") from e
    except ValueError:  # a NUL in the path
        raise CheckpointDirectoryError(f"{path!r}: not a path (it holds a NUL byte)") from None


def step_names(step: int) -> tuple[str, str]:
    """The two names of a step: its checkpoint file and its layout file."""
    return names.step_file(step), names.step_layout(step)


__all__ = ["CheckpointDirectory", "found_mode", "step_names"]
