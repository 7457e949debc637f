"""Training windows cut on the fly from a corpus's global token stream, and taken up anew while
the corpus is built or rebuilt (:meth:`CorpusWindows.refresh`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import mmap
import operator
import os
import time
from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.files import read_whole
from pskd_jax._os.jsonfile import MAX_FILE_BYTES
from pskd_jax._os.positional import pread_spans
from pskd_jax.corpus.maintain import (
    ShardProblem,
    check_shards,
    check_tokenizer,
    content_problem,
    header_problem,
    open_shard,
    shard_header,
)
from pskd_jax.corpus.manifest import Manifest, Shard, decode_manifest, parse_manifest
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.data.windows import lm_window_count, window_type
from pskd_jax.errors import BadValueError, CorpusDirectoryError, ShardMismatchError, TruncatedError, UsageError
from pskd_jax.format.reader import ACCESS_MODES

OPEN_ATTEMPTS = 20  # manifests read while a build keeps replacing it, before giving up

_largest = np.maximum.reduce  # a batch's largest token: called per batch, without ndarray.max's wrapper


@dataclasses.dataclass(eq=False)
class _OpenShard:
    """One shard as the windows hold it: its own descriptor (``pread`` and verification) and, with
    ``access="mmap"``, a map of that same file, so what is verified is what is served."""

    entry: Shard
    path: str
    file: io.FileIO  # closed when the last snapshot holding it is collected, or by close()
    header: Any
    tokens: np.ndarray  # a view of the map (mmap), or an empty array (pread)
    map: mmap.mmap | None

    @property
    def key(self) -> tuple:
        """What an entry of a newer manifest must equal for this open shard to serve it."""
        return self.path, self.entry.tokens, self.entry.documents, self.entry.sha256

    def close(self) -> None:
        if self.map is not None:
            with contextlib.suppress(BufferError, ValueError):  # a view still held: it closes with it
                self.map.close()
        self.file.close()

    def __del__(self) -> None:
        # A shard a refresh dropped closes once no snapshot (no gather in flight) holds it.
        with contextlib.suppress(Exception):
            self.close()


@dataclasses.dataclass(eq=False)
class _Snapshot:
    """Everything one state of the corpus serves windows from; replaced whole by a refresh, so a
    gather that holds one reads a consistent corpus to its end (and keeps its files open)."""

    raw: bytes  # the manifest's bytes it was opened from
    manifest: Manifest
    shards: list[_OpenShard]
    counts: np.ndarray
    offsets: np.ndarray  # shard k holds stream tokens [offsets[k], offsets[k + 1])
    bounds: np.ndarray  # searchsorted(bounds, start, "right") is the start's shard
    inside_end: np.ndarray  # a window starting before inside_end[k] fits in shard k
    total_tokens: int
    length: int
    inputs: np.ndarray
    targets: np.ndarray
    shift: np.ndarray
    fds: list[int]
    data_offsets: np.ndarray
    needed_list: list[int]  # each shard's size when whole: its data offset and its tokens


class CorpusWindows:
    """Language-model windows ``(idx[V][seq: T], idx[V][seq: T])`` cut from the global token stream.

    Window w starts at token ``w * stride`` of the stream (the shards concatenated in manifest
    order): its input is the T tokens from there, its target the same shifted by one. Windows
    cross shard boundaries freely; the samples are those ``pskd lm-windows`` writes from the
    concatenated tokens. A source for :class:`pskd_jax.loader.Loader` and a pipeline like a
    Reader: ``len``, ``[w]`` and ``gather(indices)``.

    Each shard is opened once (``access="mmap"``: and mapped). ``gather`` finds every window's
    shard with one ``searchsorted``, gathers the inputs and the targets of every window that lies
    inside a shard with one fancy index each over views spanning all the maps (see
    ``_address_views``), and assembles the few that cross a boundary from pieces. Gathered tokens
    are checked against the vocabulary size (E9004 naming the shard and the token): a damaged
    shard never hands a model an index its embedding does not have.

    Each shard's header (version, type, count) and size are checked against the manifest when it
    is opened (E9017). ``verify=True`` also reads every shard once through the descriptor it is
    served from (``workers`` threads): its sha256, every token below the vocabulary size, its
    boundary tokens equal to its documents (see :func:`pskd_jax.corpus.verify_corpus`).

    ``tokenizer`` (a :class:`Tokenizer`, or a ``tokenizer.json`` or vocabulary file) refuses a
    corpus built with another tokenizer (E9016, naming both; see :func:`check_tokenizer`).

    ``access="pread"`` reads each window's T + 1 tokens with one ``preadv`` instead (pieces for a
    window across shards), as ``Reader(access="pread")`` does: slower per window, but the shards'
    pages never join the process's resident set. A shard cut short under the windows by another
    program (the corpus's own builds never shorten a file) is E9003 naming it: under ``"pread"``
    always; under ``"mmap"`` each gather first checks the size of every shard it copies from (one
    ``fstat`` a shard the batch touches), and only a shard cut short between that check and the
    copy still kills the process with SIGBUS, as any memory map does.

    Reading while a build runs: the windows keep the corpus they opened (its files stay open
    even when a rebuild renames new shards over them) until :meth:`refresh` takes up the manifest
    as it is now. :attr:`complete` says whether the manifest is that of a finished build.
    """

    def __init__(self, manifest_path: str | os.PathLike, *, seq: int, stride: int | None = None,
                 verify: bool = False, workers: int | None = None, access: str = "mmap",
                 tokenizer: Tokenizer | str | os.PathLike | None = None):
        if access not in ACCESS_MODES:
            raise UsageError(f"{manifest_path}: access is one of {', '.join(ACCESS_MODES)}, got {access!r}")
        self.access = access
        stride = seq if stride is None else stride
        for name, value in (("seq", seq), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
        self.path = os.fspath(manifest_path)
        self.seq, self.stride = int(seq), int(stride)
        self.verify, self.workers = verify, workers
        self._closed = False
        self._expected_tokenizer = tokenizer  # checked before any shard is opened or hashed
        self._state = self._load(None, verify)
        self.tokenizer = self._state.manifest.tokenizer
        self.dtype = self.tokenizer.dtype
        # Stored tokens can reach the bound only when the dtype holds more values than the vocabulary.
        self._bound = self.tokenizer.vocab_size
        self._bounded = self._bound < 1 << (8 * self.dtype.itemsize)

    # -- opening and refreshing ------------------------------------------------------------------

    def refresh(self, *, verify: bool | None = None) -> bool:
        """Takes up the manifest as it is now (a build in progress lists more finished shards, a
        rebuild replaced some); returns whether anything changed. Shards whose entry is unchanged
        stay open as they are; the others are opened (and, with ``verify``, default the
        constructor's, verified). A gather running on another thread finishes on the corpus it
        started with. On any error (a manifest being replaced, a damaged shard) the windows keep
        the corpus they had, and the error is raised; a manifest of another tokenizer is E9016."""
        self._require_open()
        state = self._load(self._state, self.verify if verify is None else verify)
        if state is self._state:
            return False
        self._state = state
        return True

    def _read_manifest_bytes(self) -> bytes:
        return read_whole(self.path, CorpusDirectoryError, what="the corpus manifest", limit=MAX_FILE_BYTES)

    def _load(self, previous: _Snapshot | None, verify: bool) -> _Snapshot:
        """A snapshot of the manifest as it is now, reusing ``previous``'s open shards.

        A build replaces the manifest before it renames a new shard over one the manifest lists
        (see :mod:`pskd_jax.corpus.build`), so shards opened between two reads of the same
        manifest bytes are the ones it lists: a snapshot is taken only then, else tried again."""
        for attempt in range(OPEN_ATTEMPTS):
            raw = self._read_manifest_bytes()
            if previous is not None and raw == previous.raw:
                return previous
            manifest = parse_manifest(decode_manifest(raw, self.path), self.path)
            if previous is None:
                check_tokenizer(manifest, self._expected_tokenizer)
            if previous is not None and manifest.tokenizer != previous.manifest.tokenizer:
                raise CorpusDirectoryError(f"{self.path}: the corpus now has another tokenizer (vocabulary "
                                           f"{manifest.vocab_size}, was {previous.manifest.vocab_size}); windows "
                                           "cannot take it up: open the corpus anew")
            try:
                state = self._open(raw, manifest, previous, verify)
            except ShardMismatchError:
                if self._still(raw):
                    raise
                state = None  # a shard changed under a newer manifest: read that one
            if state is not None:
                if self._still(raw):
                    return state
                kept = {id(s) for s in previous.shards} if previous is not None else set()
                for shard in state.shards:
                    if id(shard) not in kept:
                        shard.close()
            time.sleep(0.001 * attempt)
        raise ShardMismatchError(f"{self.path}: the manifest changed each of the {OPEN_ATTEMPTS} times its shards "
                                 "were opened (a build replacing it very often); try again")

    def _still(self, raw: bytes) -> bool:
        try:
            return self._read_manifest_bytes() == raw
        except CorpusDirectoryError:
            return False

    def _open(self, raw: bytes, manifest: Manifest, previous: _Snapshot | None, verify: bool) -> _Snapshot:
        held = {s.key: s for s in previous.shards} if previous is not None else {}
        shards, new = [], []
        try:
            for i, entry in enumerate(manifest.shards):
                path = manifest.shard_path(i)
                shard = held.get((path, entry.tokens, entry.documents, entry.sha256))
                if shard is None:
                    shard = self._open_shard(manifest, i, path)
                    new.append(shard)
                shards.append(shard)
            if verify and new:
                fresh = {id(s) for s in new}
                check_shards(manifest, lambda i: content_problem(shards[i].file.fileno(), shards[i].path,
                                                                 shards[i].header, manifest.shards[i],
                                                                 manifest.tokenizer)
                             if id(shards[i]) in fresh else None, self.workers)
            return self._snapshot(raw, manifest, shards)
        except BaseException:
            for shard in new:
                shard.close()
            raise

    def _open_shard(self, manifest: Manifest, i: int, path: str) -> _OpenShard:
        """Opens (and with mmap access maps) shard i, checking its header and size (E9017)."""
        entry, tokenizer = manifest.shards[i], manifest.tokenizer
        try:
            fd = open_shard(path)
        except ShardProblem as e:
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: {e}") from None
        file = io.FileIO(fd, "rb", closefd=True)
        try:
            size = os.fstat(fd).st_size
            header = shard_header(fd, size, path)
            problem = header_problem(header, size, entry, tokenizer)
            if problem is not None:
                raise ShardProblem(problem)
            tokens, mapped = np.zeros(0, tokenizer.dtype), None
            if self.access == "mmap" and entry.tokens:
                mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
                tokens = np.frombuffer(mapped, tokenizer.dtype, count=entry.tokens, offset=header.data_offset)
            return _OpenShard(entry, path, file, header, tokens, mapped)
        except ShardProblem as e:
            file.close()
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: {e}") from None
        except (OSError, ValueError) as e:  # mmap of a file cut short meanwhile
            file.close()
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: cannot map it ({e})") from e

    def _snapshot(self, raw: bytes, manifest: Manifest, shards: list[_OpenShard]) -> _Snapshot:
        counts = np.array([s.entry.tokens for s in shards], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        total = int(offsets[-1])
        inputs, targets, shift = self._address_views([s.tokens for s in shards], offsets)
        data_offsets = np.array([s.header.data_offset for s in shards], dtype=np.int64)
        return _Snapshot(raw, manifest, shards, counts, offsets, offsets[1:-1], offsets[:-1] + counts - self.seq,
                         total, lm_window_count(total, self.seq, self.stride), inputs, targets, shift,
                         [s.file.fileno() for s in shards], data_offsets,
                         (data_offsets + counts * np.dtype(manifest.tokenizer.dtype).itemsize).tolist())

    def _address_views(self, tokens: list[np.ndarray], offsets: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of T-token records over every mapped shard at once, the inputs' and the targets'
        (one token on), and what turns a stream position into a record index, per shard.

        The shards are mapped at different addresses of this process. A view starts at the lowest
        mapped token and steps one token at a time (records overlap), so a record index is an
        address: record ``p + shift[k]`` of the inputs' view is tokens ``p .. p + T - 1`` of the
        stream when they lie in shard k. Only such records are ever indexed; the gaps between the
        maps are never touched. One fancy index per view then gathers a batch whose windows lie in
        any number of shards, straight into the contiguous (B, T) arrays it returns: a plain copy
        of each window's bytes (void records: never a copy of a shard, whatever its alignment).
        The maps stay valid while the snapshot's token views live: a map does not close under a view.
        """
        dtype = tokens[0].dtype if tokens else np.dtype(np.uint8)
        item = dtype.itemsize
        record = np.dtype((np.void, self.seq * item))
        live = [k for k, t in enumerate(tokens) if len(t) > self.seq]
        shift = np.zeros(len(tokens), dtype=np.int64)
        if not live:
            return np.zeros(0, dtype=record), np.zeros(0, dtype=record), shift
        address = {k: tokens[k].__array_interface__["data"][0] for k in live}
        low = min(address.values())
        # Every shard has the same header (checked when opened), so its tokens start at the same
        # offset within a page: the distance between two shards is a whole number of tokens.
        if any((a - low) % item for a in address.values()):
            raise ShardMismatchError(f"{self.path}: shards whose tokens are not aligned alike")
        high = max(address[k] + len(tokens[k]) * item for k in live)
        for k in live:
            shift[k] = (address[k] - low) // item - offsets[k]
        base = tokens[min(live, key=address.get)].view(np.uint8)
        span = (high - low) // item - self.seq  # record starts whose window, target included, ends by high
        views = [as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]), shape=(span,), strides=(item,),
                            writeable=False) for skip in (0, item)]
        return views[0], views[1], shift

    # -- the source protocol -------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The manifest the windows serve now (a newer one after :meth:`refresh`)."""
        return self._state.manifest

    @property
    def complete(self) -> bool:
        """Whether the manifest is that of a finished build (not one in progress or interrupted)."""
        return self._state.manifest.complete

    @property
    def total_tokens(self) -> int:
        return self._state.total_tokens

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def boundary(self) -> int:
        return self.tokenizer.boundary

    @property
    def type_text(self) -> str:
        """The sample type, as an ``lm-windows`` file of the same windows has it."""
        return window_type(self.vocab_size, self.seq)

    def __len__(self) -> int:
        return self._state.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``index`` as ``(inputs, targets)``, each ``(seq,)``."""
        try:
            index = operator.index(index)
        except TypeError:
            raise UsageError(f"{self.path}: a window index is an integer, got {index!r}") from None
        inputs, targets = self.gather(np.array([index], dtype=np.int64))
        return inputs[0], targets[0]

    def _require_open(self) -> None:
        if self._closed:
            raise UsageError(f"{self.path}: the windows were closed")

    def stream(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream (a fresh array)."""
        self._require_open()
        state = self._state
        if not 0 <= start <= stop <= state.total_tokens:
            raise UsageError(f"{self.path}: tokens [{start}, {stop}) are not inside the stream of "
                             f"{state.total_tokens} tokens")
        out = self._stream(state, start, stop)
        self._check_tokens(state, out, lambda i: start + i)
        return out

    def _stream(self, state: _Snapshot, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=self.dtype)
        k, at = int(np.searchsorted(state.offsets, start, side="right")) - 1, start
        while at < stop:
            if state.counts[k]:
                local = at - int(state.offsets[k])
                take = min(stop - at, int(state.counts[k]) - local)
                if self.access == "pread":
                    self._read_tokens(state, k, local, out[at - start : at - start + take])
                else:
                    self._check_still_whole(state, (k,))
                    out[at - start : at - start + take] = state.shards[k].tokens[local : local + take]
                at += take
            k += 1
        return out

    def _check_still_whole(self, state: _Snapshot, shards: Sequence[int]) -> None:
        """Refuses to copy out of the maps of ``shards`` (indices) when one was cut short since it
        was opened (E9003 naming it): touching a page past the end of a mapped file kills the
        process with SIGBUS. One ``fstat`` a shard. As for a mapped Reader, a shard cut short
        between this check and the copy still kills the process (only another program rewriting
        a shard in place does that: the corpus's builds never shorten a file); ``access="pread"``
        turns even that into E9003."""
        fds, needed = state.fds, state.needed_list
        try:
            sizes = [status.st_size for status in map(os.fstat, [fds[k] for k in shards])]
        except OSError as e:
            raise TruncatedError(f"{self.path}: cannot read a shard: {e.strerror or e}") from e
        for k, size in zip(shards, sizes):
            if size < needed[k]:
                shard = state.shards[k]
                raise TruncatedError(f"{self.path}: shard {k} {shard.path}: truncated since it was opened: {size} "
                                     f"bytes now, {needed[k]} needed for its {shard.entry.tokens} tokens")

    def _read_tokens(self, state: _Snapshot, shard: int, local: int, out: np.ndarray) -> None:
        """Tokens ``local ..`` of a shard into ``out`` with one ``preadv`` (``access="pread"``)."""
        item = self.dtype.itemsize
        pread_spans(state.fds[shard], [memoryview(out.view(np.uint8))],
                    [int(state.data_offsets[shard]) + local * item], state.shards[shard].path)

    def _check_tokens(self, state: _Snapshot, tokens: np.ndarray, position_of) -> None:
        """E9004 naming the shard and the token when a token is not below the vocabulary size
        (``position_of(i)``: the stream position of the i-th token of ``tokens`` in C order, asked
        for the first bad one only)."""
        bound = self._bound
        if not self._bounded or tokens.size == 0 or tokens.max() < bound:
            return
        flat = int(np.flatnonzero(tokens.reshape(-1) >= bound)[0])
        position = int(position_of(flat))
        k = int(np.searchsorted(state.offsets, position, side="right")) - 1
        raise BadValueError(f"{self.path}: shard {k} {state.manifest.shards[k].path}: token "
                            f"{position - int(state.offsets[k])} is {int(tokens.reshape(-1)[flat])}, not below the "
                            f"vocabulary size {bound} (a damaged shard; verify the corpus)")

    def _gather_read(self, state: _Snapshot, starts: np.ndarray, shard: np.ndarray, inside: np.ndarray
                     ) -> np.ndarray:
        """The ``(n, seq + 1)`` tokens of each window with ``access="pread"``: each window inside
        one shard read with one ``preadv`` (through ``map``), the rare one across shards from pieces."""
        n, seq, item = len(starts), self.seq, self.dtype.itemsize
        windows = np.empty((n, seq + 1), self.dtype)
        flat = memoryview(windows.reshape(-1).view(np.uint8))
        width = (seq + 1) * item
        rows = np.flatnonzero(inside).tolist()
        inner_shards = shard[inside]
        fds = [state.fds[k] for k in inner_shards.tolist()]
        offsets = state.data_offsets.take(inner_shards) + (starts[inside] - state.offsets.take(inner_shards)) * item
        pread_spans(fds, [flat[r * width : (r + 1) * width] for r in rows], offsets.tolist(), self.path)
        for row in np.flatnonzero(~inside).tolist():
            windows[row] = self._stream(state, int(starts[row]), int(starts[row]) + seq + 1)
        return windows

    def gather(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``indices`` as ``(inputs, targets)``, each ``(len(indices), seq)`` and contiguous."""
        state = self._state  # one snapshot for the whole batch, whatever a refresh does meanwhile
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
            raise UsageError(f"{self.path}: window indices are one axis of integers, got "
                             f"{indices.dtype} of shape {indices.shape}")
        n, count = len(indices), state.length
        if n and (indices.min() < -count or indices.max() >= count):
            bad = indices[(indices < -count) | (indices >= count)][0]
            raise TruncatedError(f"{self.path}: window {bad} is beyond the {count} windows of the corpus")
        self._require_open()
        seq, dtype = self.seq, self.dtype
        position = indices.astype(np.int64)
        if n and indices.min() < 0:
            position %= count
        position *= self.stride  # each window's start in the stream
        shard = state.bounds.searchsorted(position, side="right")
        inside = position < state.inside_end.take(shard)  # all T + 1 tokens in the start's shard
        if self.access == "pread":
            windows = self._gather_read(state, position, shard, inside)
            if self._bounded and n and _largest(windows, None) >= self._bound:
                self._check_tokens(state, windows, lambda i: int(position[i // (seq + 1)]) + i % (seq + 1))
            return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])
        crossing = np.flatnonzero(~inside) if n else position[:0]
        starts = position.copy() if len(crossing) else None
        position += state.shift.take(shard)  # now a record index of the views
        if len(state.inputs) and len(crossing) < n:
            touched = shard[inside]  # the shards copied from, each checked once
            distinct = np.flatnonzero(np.bincount(touched)) if len(state.shards) <= 8 * n else np.unique(touched)
            self._check_still_whole(state, distinct.tolist())
            if len(crossing):
                position[crossing] = position[np.argmax(inside)]  # any record inside: those rows are redone
            inputs = state.inputs[position].view(dtype).reshape(n, seq)
            targets = state.targets[position].view(dtype).reshape(n, seq)
        else:
            inputs, targets = np.empty((n, seq), dtype), np.empty((n, seq), dtype)
        for row in crossing.tolist():  # across a shard boundary: from pieces
            window = self._stream(state, int(starts[row]), int(starts[row]) + seq + 1)
            inputs[row], targets[row] = window[:-1], window[1:]
        # The inputs and each target's last token (the rest of the targets are inputs) below V.
        if self._bounded and n and (_largest(inputs, None) >= self._bound or _largest(targets[:, -1]) >= self._bound):
            tokens = np.concatenate([inputs, targets[:, -1:]], axis=1)
            starts = self._starts(indices, state.length)
            self._check_tokens(state, tokens, lambda i: int(starts[i // (seq + 1)]) + i % (seq + 1))
        return inputs, targets

    def _starts(self, indices: np.ndarray, count: int) -> np.ndarray:
        """Each window's first token in the stream (for an error message)."""
        return (indices.astype(np.int64) % count) * self.stride

    # -- data-loader hooks (grain, PyTorch) -----------------------------------------------------

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Windows ``indices`` as a list of ``(inputs, targets)``, read in one :meth:`gather`: the
        batched-read hook grain's ``MapDataset`` calls as ``_getitems`` and PyTorch's
        ``DataLoader`` as ``__getitems__``."""
        inputs, targets = self.gather(np.asarray(indices, dtype=np.int64) if len(indices) else
                                      np.zeros(0, dtype=np.int64))
        return [(inputs[k], targets[k]) for k in range(len(indices))]

    _getitems = __getitems__

    def __repr__(self) -> str:
        """The corpus and what identifies it, stable across processes and new sources of one
        corpus (grain checks a data loader's saved state against ``repr(data_source)``): the
        manifest's absolute path, the window shape and count, and an xxh3 of the manifest, which
        records every shard's sha256."""
        digest = DIGESTS["xxh3_128"](self.manifest.to_bytes()).hexdigest()
        return (f"CorpusWindows({os.path.abspath(self.path)!r}, seq={self.seq}, stride={self.stride}, "
                f"windows={len(self)}, type={self.type_text!r}, manifest_xxh3={digest})")

    # -- pickling (worker processes) and lifetime ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The manifest path and the window shape; the shards are opened again where unpickled."""
        return {"path": self.path, "seq": self.seq, "stride": self.stride,
                "manifest": self.manifest.to_bytes(), "access": self.access}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], seq=state["seq"], stride=state["stride"], access=state.get("access", "mmap"))
        if self.manifest.to_bytes() != state["manifest"]:
            self.close()
            raise ShardMismatchError(f"{self.path}: the manifest changed since the source was pickled")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        state, self._state = self._state, self._closed_state(self._state)
        for shard in state.shards:
            shard.close()

    def _closed_state(self, state: _Snapshot) -> _Snapshot:
        """What a closed source keeps: the manifest and the lengths, no file."""
        empty = np.zeros(0, np.uint8)
        return dataclasses.replace(state, shards=[], inputs=empty, targets=empty, fds=[], needed_list=[])

    def __enter__(self) -> "CorpusWindows":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["CorpusWindows"]
