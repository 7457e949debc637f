"""The checkpoint manager: a directory of checkpoints, one a step — save (blocking or on a background
thread), list, restore (verified against the digest the index records), keep what a
:class:`Retention` says. The directory's layout, its index, what the manager removes and what it
adopts are described in ``docs/checkpoints.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import threading
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.checks import checked_integer
from pskd_jax.checkpoint.commit import claim_step, commit_step
from pskd_jax.checkpoint.directory import CheckpointDirectory, StoredDirectory
from pskd_jax.checkpoint.distributed import agreed, save_distributed
from pskd_jax.checkpoint.index import CheckpointEntry, check_step, extra_json, load_index, utc_time
from pskd_jax.checkpoint.integrity import CHECKPOINT_DIGEST
from pskd_jax.checkpoint.options import SaveOptions
from pskd_jax.checkpoint.options import save_options as checked_options
from pskd_jax.checkpoint.planning import SaveResult, plan
from pskd_jax.checkpoint.recovery import recover
from pskd_jax.checkpoint.restoring import restore
from pskd_jax.checkpoint.retention import Retention, scores_of
from pskd_jax.checkpoint.retention import retention as retention_of
from pskd_jax.checkpoint.saving import save
from pskd_jax.checkpoint.snapshot import host_snapshot
from pskd_jax.checkpoint.takeover import DirectoryHold, open_directory
from pskd_jax.checkpoint.verification import verify_directory
from pskd_jax.errors import CheckpointDirectoryError, UsageError


class ManagerState(enum.Enum):
    """Where a :class:`CheckpointManager` is in its life. Every state lists and restores; only an
    open manager saves."""

    OPEN = "open"  # holds the directory's lock: it saves
    READ_ONLY = "read-only"  # made with read_only=True: it took no lock, and never saves
    SUPERSEDED = "superseded"  # a newer manager of the directory, made in this process, took its lock over
    CLOSED = "closed"  # closed: its lock released


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A save checked and ready to write: its step, extra JSON, score and options."""

    step: int
    extra: Any
    score: float | None
    options: SaveOptions


class CheckpointManager:
    """Checkpoints of a training run in one directory, by step — a local directory, or a key
    prefix of a bucket (``s3://…``, ``gs://…``, ``memory://…``; ``docs/checkpoints.md``,
    "Checkpoints in a bucket", says what differs there: no lock, a conditional index).

    >>> import numpy as np, tempfile
    >>> from pskd_jax.checkpoint import Retention
    >>> manager = CheckpointManager(tempfile.mkdtemp(), retention=Retention(keep=2))
    >>> for step in (10, 20, 30):
    ...     _ = manager.save(step, {"w": np.full(3, step, np.float32)}, extra={"epoch": 1, "batch": step})
    >>> manager.all_steps(), manager.latest_step(), manager.extra()["batch"]
    ([20, 30], 30, 30)
    >>> manager.restore(as_numpy=True)["w"]  # checked against its recorded digest while read
    array([30., 30., 30.], dtype=float32)
    >>> manager.close(); manager.state
    <ManagerState.CLOSED: 'closed'>

    ``retention`` (a :class:`Retention`; default: keep every step) says which steps stay when a
    step is saved. ``save_interval_steps``: :meth:`should_save` is true on steps divisible by it
    beyond the latest saved (and when nothing is saved yet); :meth:`save` and :meth:`save_async`
    do nothing on other steps unless ``force=True``.

    ``save_options`` (a :class:`SaveOptions`) is how each step is saved. Its ``digest`` is the
    algorithm the index records for each step: ``"xxh3_128"`` when it names none (it catches damage,
    and a verified restore stays fast) or ``"sha256"`` (it also holds against a crafted file, at a
    higher cost when verifying); its ``durable`` applies to the index too.

    The manager holds the directory's lock until :meth:`close` (or the end of a ``with`` block): a
    manager of the directory in another process is refused with E9014 until then; a new manager of
    it in this process takes over (the old one is then :attr:`ManagerState.SUPERSEDED`).
    ``read_only=True`` takes no lock, removes and adopts nothing, and refuses to save.

    A manager of a bucket prefix made in every process of a multi-process JAX run saves each step
    from all of them together: every process calls :meth:`save` with its shards of the same tree,
    the step is saved as part objects and a parts index, and process 0 alone opens the prefix
    (recovery, adoption), claims and lists steps and prunes; a failure in any process fails the
    save in every one (``docs/checkpoints.md``, "Several processes, no shared file system").
    """

    def __init__(self, directory: str | os.PathLike[str], *, retention: Retention | None = None,
                 save_interval_steps: int | None = None, save_options: SaveOptions | None = None,
                 read_only: bool = False):
        self.retention = retention_of(retention)
        self.save_interval_steps = checked_integer(save_interval_steps, "save_interval_steps", low=1,
                                                   error=CheckpointDirectoryError, none=True)
        options = checked_options(save_options, "save_options")
        self.digest = options.digest or CHECKPOINT_DIGEST  # what the index records of each step
        self.save_options = options.replace(digest=self.digest)
        self._place = CheckpointDirectory.of(directory)  # (E9018 for a URL no store serves)
        self.directory = self._place.path
        self._lock = threading.Lock()  # the index and the directory's files
        self._saving = threading.Lock()  # held by a save from start to end (a take-over waits for it)
        self._state_lock = threading.Lock()  # a change of state
        self._thread: threading.Thread | None = None
        self._in_flight: int | None = None  # the step of the background save, until wait()
        self._error: BaseException | None = None
        self._hold: DirectoryHold | None = None  # the directory's lock (see takeover)
        self._state = ManagerState.READ_ONLY if read_only else ManagerState.CLOSED
        self._process, self._processes = 0, 1  # (this JAX process, of how many, saving together)
        if read_only:
            load_index(self._place)
            return
        if not self._place.is_local:
            # A bucket has no lock to hold: the index's conditional puts keep two writers from
            # overwriting each other (the loser gets E9014), and a step is listed only while its
            # claim stands (see commit_step).
            self._process, self._processes = _jax_processes()
            if self._processes > 1:  # every process made this manager: process 0 recovers for all
                agreed(f"{self.directory}: opening the checkpoints", self._recover_first)
                self._state = ManagerState.OPEN
                return
            self._recover(None)
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise CheckpointDirectoryError(f"{self.directory}: cannot create the directory: {e.strerror}") from e
        except ValueError:  # a NUL in the path
            raise CheckpointDirectoryError(f"{self.directory!r}: not a directory name (it holds a NUL)") from None
        open_directory(self.directory, self, self._recover)

    @property
    def state(self) -> ManagerState:
        return self._state

    @property
    def durable(self) -> bool:
        return self.save_options.durable

    # -- opening, and handing the directory over ----------------------------------------------------

    def _recover(self, hold: DirectoryHold | None) -> None:
        """Run once the lock is held: cleans up after interrupted saves, or adopts the step files
        of a directory without an index (:func:`pskd_jax.checkpoint.recovery.recover`)."""
        with self._lock:
            recover(self._place, digest=self.digest, durable=self.durable)
        self._hold, self._state = hold, ManagerState.OPEN

    def _recover_first(self) -> None:
        if self._process == 0:
            with self._lock:
                recover(self._place, digest=self.digest, durable=self.durable)

    def _hand_over(self) -> int | None:
        """Waits for this manager's saves, marks it superseded and gives up its lock descriptor
        (without releasing the lock); None when it holds none (closed, or superseded already)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # its error, if any, stays for this manager's wait()
        with self._saving:
            fd = self._hold.detach() if self._hold is not None else None
            if fd is None:
                return None
            with self._state_lock:
                self._state = ManagerState.SUPERSEDED
        return fd

    # -- listing ---------------------------------------------------------------------------------

    def _entries(self) -> tuple[CheckpointEntry, ...]:
        return load_index(self._place).entries

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, in increasing order."""
        return [entry.step for entry in self._entries()]

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The complete step of best score (by ``best_mode``; the newer of equal scores), None when
        no step has a score."""
        return self.retention.best_step(scores_of(self._entries()))

    def _entry(self, step: int | None) -> CheckpointEntry:
        # (checked first: True and 1.0 equal 1, so a lookup by equality would hand back step 1)
        step = check_step(step) if step is not None else None
        entries = self._entries()
        if not entries:
            raise CheckpointDirectoryError(f"{self.directory}: no complete checkpoint yet")
        if step is None:
            return entries[-1]
        for entry in entries:
            if entry.step == step:
                return entry
        raise CheckpointDirectoryError(f"{self.directory}: no complete checkpoint for step {step} "
                                       f"(complete: {[e.step for e in entries]})")

    def _readable(self, entry: CheckpointEntry) -> str:
        return self._place.readable(entry.step, entry.file, entry.layout_name)

    def path(self, step: int | None = None) -> str:
        """The file of a complete step (the latest by default)."""
        return self._readable(self._entry(step))

    def extra(self, step: int | None = None) -> Any:
        """The extra JSON saved with a step (the latest by default), e.g. the loader's state."""
        return self._entry(step).extra

    def score(self, step: int | None = None) -> float | None:
        """The score ``best_fn`` gave a step (the latest by default) when it was saved, or None."""
        return self._entry(step).score

    # -- saving ----------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is one to save: beyond the latest saved (or the one being saved) and,
        with ``save_interval_steps``, divisible by it. False for a manager that cannot save."""
        step = check_step(step)
        if self._state is not ManagerState.OPEN:
            return False
        latest = [s for s in (self.latest_step(), self._in_flight) if s is not None]
        if latest and step <= max(latest):
            return False
        return step % (self.save_interval_steps or 1) == 0

    def save(self, step: int, tree: Any, *, extra: Any = None, metrics: Any = None, force: bool = False,
             options: SaveOptions | None = None) -> SaveResult | None:
        """Saves ``tree`` as ``step`` and waits until it is complete (then prunes); returns what
        was written, or None when ``save_interval_steps`` says the step is not one to save (and
        ``force`` is False).

        ``extra`` is any JSON value kept in the index with the step; ``metrics`` (any value) is
        given to the retention's ``best_fn`` (its ``extra`` when none are given). ``options`` are
        this save's (default: the manager's ``save_options``; ``manager.save_options.replace(...)``
        changes some); their ``durable`` and ``digest`` are the manager's (E9012 otherwise)."""
        prepared = self._prepare(step, extra, metrics, force, options)
        return self._write(prepared, tree) if prepared is not None else None

    def save_async(self, step: int, tree: Any, *, extra: Any = None, metrics: Any = None, force: bool = False,
                   options: SaveOptions | None = None) -> bool:
        """Snapshots ``tree`` into host memory and writes it on a background thread; returns True as
        soon as the snapshot is taken (False when the step is not one to save, as :meth:`save`
        says). One save runs at a time: a second waits for the first. Errors surface in
        :meth:`wait` (or the next save)."""
        prepared = self._prepare(step, extra, metrics, force, options)
        if prepared is None:
            return False
        if self._processes > 1:  # (barriers on a thread would meet the training step's collectives)
            self._write(prepared, tree)
            return True
        plan(tree, prepared.options)  # what no save can write is refused while the caller is here
        snapshot = host_snapshot(tree)

        def run() -> None:
            try:
                self._write(prepared, snapshot)
            except BaseException as e:  # handed to the caller by wait()
                self._error = e

        self._in_flight = prepared.step
        self._thread = threading.Thread(target=run, name=f"pskd-save-{prepared.step}", daemon=False)
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

    def _prepare(self, step: Any, extra: Any, metrics: Any, force: bool, options: Any) -> _Prepared | None:
        """What :meth:`save` and :meth:`save_async` do first: wait for a background save, check that
        this manager saves and the step, skip a step the interval does not save, check the extra
        JSON, score the step, and settle the options. None: the step is skipped."""
        self.wait()
        self._check_writable()
        step = check_step(step)
        if self.save_interval_steps is not None and not force and not self.should_save(step):
            return None
        extra = extra_json(extra)
        score = self.retention.score(step, metrics if metrics is not None else extra)
        return _Prepared(step, extra, score, self._options_for(options))

    def _options_for(self, options: Any) -> SaveOptions:
        if options is None:
            return self.save_options
        options = checked_options(options, "options")
        if options.durable != self.durable:
            raise UsageError(f"options durable={options.durable}: this manager's saves are durable={self.durable}, "
                             "as its index is (give manager.save_options.replace(...) to change other options)")
        if options.digest not in (None, self.digest):
            raise UsageError(f"options digest={options.digest!r}: this manager records {self.digest!r} of every step "
                             "(CheckpointManager(..., save_options=SaveOptions(digest=...)) chooses it)")
        return options.replace(digest=self.digest)

    def _check_writable(self) -> None:
        state = self._state
        if state is ManagerState.READ_ONLY:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager was opened read_only; "
                                           "it does not save")
        if state is ManagerState.SUPERSEDED:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager was superseded: a newer "
                                           "CheckpointManager of the directory, made in this process, took it over; "
                                           "save with that one")
        if state is ManagerState.CLOSED:
            raise CheckpointDirectoryError(f"{self.directory}: this CheckpointManager is closed (its lock on "
                                           "the directory released); open a new one to save")

    def _write(self, prepared: _Prepared, tree: Any) -> SaveResult:
        """Claims the step in the index, saves its file, then lists it (and prunes)."""
        step = prepared.step
        if self._processes > 1:
            return self._write_together(prepared, tree)
        with self._saving:
            self._check_writable()
            started = utc_time()
            with self._lock:
                claim_step(self._place, step, durable=self.durable)
            # (``save`` through this module's name: tests stand in for it to cut a save short)
            result = save(self._place.join(names.step_file(step)), tree, options=prepared.options)
            entry = CheckpointEntry(step, dict(result.digests), type_text=result.type_text, bytes=result.bytes,
                                    layout=result.layout_path is not None, extra=prepared.extra, score=prepared.score,
                                    started=started, committed=utc_time())
            with self._lock:
                commit_step(self._place, entry, self.retention, durable=self.durable)
        return result

    def _write_together(self, prepared: _Prepared, tree: Any) -> SaveResult:
        """The save of a step by every JAX process of the run, into a bucket: process 0 claims the
        step; every process puts its part (and process 0 the parts index: see
        :func:`save_distributed`); once every part is up and the parts index is put, process 0
        lists the step (and prunes). Each phase ends at a barrier where a failure anywhere fails
        every process; the digest is in process 0's result."""
        step, first = prepared.step, self._process == 0
        where = f"{self.directory}: step {step}"
        assert isinstance(self._place, StoredDirectory)
        with self._saving:
            self._check_writable()
            started = utc_time()

            def claim() -> None:
                with self._lock:
                    claim_step(self._place, step, durable=self.durable)

            agreed(f"{where}: claiming the step", claim if first else None)
            result = save_distributed(self._place.where.child(names.step_file(step)), tree, prepared.options)

            def commit() -> None:
                entry = CheckpointEntry(step, dict(result.digests), type_text=result.type_text, bytes=result.bytes,
                                        layout=result.layout_path is not None, extra=prepared.extra,
                                        score=prepared.score, started=started, committed=utc_time())
                with self._lock:
                    commit_step(self._place, entry, self.retention, durable=self.durable)

            agreed(f"{where}: listing the step", commit if first else None)
        return result

    # -- restoring, verifying, closing -----------------------------------------------------------

    def restore(self, step: int | None = None, target: Any = None, *, verify: bool = True, **options: Any) -> Any:
        """Restores a complete step (the latest by default); ``options`` go to
        :func:`pskd_jax.checkpoint.restore` (``as_numpy``, ``partial``, …).

        The whole file is checked against the digest recorded in the index (xxh3_128, or sha256)
        while it is read, and E9013 names the checkpoint when they differ: nothing is returned from
        a file that does not verify. ``verify=False`` skips the check (and returns whatever the
        file holds now)."""
        if "digests" in options:
            raise UsageError("CheckpointManager.restore checks the digest the index records; give verify=False "
                             "to skip the check, not a digest")
        entry = self._entry(step)
        path = self._readable(entry)
        layout_digests = entry.checkable_layout_digests() if verify and "layout" not in options else None
        if layout_digests is not None and entry.layout_name is not None:
            # the layout used is the one whose digest the index records, read once (an edited shape
            # or key path would otherwise give the recorded data back under another structure)
            options["layout"] = self._place.checked_layout(entry, layout_digests)
        return restore(path, target, digests=entry.checkable_digests() if verify else None, **options)

    def verify(self, step: int | None = None) -> list[CheckpointEntry]:
        """Checks every complete checkpoint (or one step) against its recorded digests."""
        return verify_directory(self.directory, step=step)

    def close(self) -> None:
        """Waits for a background save, then releases the directory to another manager."""
        with self._state_lock:
            if self._state is ManagerState.OPEN:
                self._state = ManagerState.CLOSED
        try:
            self.wait()
        finally:
            if self._hold is not None:
                self._hold.release()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _jax_processes() -> tuple[int, int]:
    """This JAX process's index and the number of processes (0, 1 where JAX is not imported: a
    run of several processes has imported it to initialize them)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    return int(jax.process_index()), int(jax.process_count())


__all__ = ["CheckpointManager", "ManagerState"]
