"""Training windows cut on the fly from a corpus's global token stream: :class:`CorpusWindows`.

Each window's shard is found with one ``searchsorted`` and every window inside a shard is gathered
with one fancy index over views spanning all the shards' maps (or one positional read a window);
the few that cross a boundary are assembled from pieces. The windows are taken up anew while the
corpus is built or rebuilt (:meth:`CorpusWindows.refresh`). A corpus in an object store
(``s3://…/shards.json``) is read by byte ranges, one range a contiguous run a gather touches and
one batched call a shard, or from whole shards fetched into a local cache when a gather first
needs them (:mod:`pskd_jax.corpus.shard_copies`) and mapped like local ones. The index rules,
iteration, grain's hooks and pickling are :mod:`pskd_jax.format.source`'s. See
``docs/corpus.md`` (Training windows).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pskd_jax._os.checks import abridged, checked_integer, first_true
from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.files import out_of_descriptors
from pskd_jax._os.jsonfile import MAX_FILE_BYTES
from pskd_jax.corpus.maintain import (
    ShardProblem,
    check_shards,
    check_tokenizer,
    content_problem,
    header_problem,
    object_header,
    open_shard,
    shard_header,
)
from pskd_jax.corpus.manifest import MAX_COUNT, Manifest, Shard, decode_manifest, parse_manifest
from pskd_jax.corpus.segments import gathered_windows, segment_dtype, segments_below
from pskd_jax.corpus.shard_cache import DEFAULT_CACHE_BYTES, ShardCache
from pskd_jax.corpus.shard_copies import Copy, ShardCopies
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.data.corpus_manifest import shard_places
from pskd_jax.data.windows import lm_window_count, window_type
from pskd_jax.errors import BadValueError, CorpusDirectoryError, PskdError, ShardMismatchError, UsageError
from pskd_jax.format.byte_sources import (
    ByteSource,
    FileBytes,
    MappedFile,
    Runs,
    StoreBytes,
    cut_short,
    first_cut_short,
    read_runs,
    read_small,
)
from pskd_jax.format.reader import MAX_RECORD_BYTES
from pskd_jax.format.source import RandomAccessSource, checked_access
from pskd_jax.storage import StorageOptions, locate, store_for

OPEN_ATTEMPTS = 20  # manifests read while a build keeps replacing it, before giving up
OPEN_THREADS = 16  # shards of a store opened (looked at, their headers read) or fetched at once

_largest = np.maximum.reduce  # a batch's largest token: called per batch, without ndarray.max's wrapper


def _check_verify(verify: Any, path: str) -> None:
    """``verify`` is True or False (a string such as 'no' is no answer: it would verify)."""
    if not isinstance(verify, (bool, np.bool_)):
        raise UsageError(f"{path}: verify is True or False, got {abridged(verify, 80)}")


@dataclasses.dataclass(eq=False)
class _OpenShard:
    """One shard as the windows hold it: with ``access="pread"`` the open file (its positional
    reads and verification), with ``access="mmap"`` a map of the file and no descriptor
    (:class:`MappedFile`: verified by reads of that same file), so what is verified is what is
    served."""

    entry: Shard
    path: str  # a local path, or the shard object's URL
    bytes: ByteSource  # closed when the last snapshot holding it is collected, or by close()
    header: Any
    tokens: np.ndarray  # a view of the map (mmap), or an empty array (pread)

    @property
    def key(self) -> tuple:
        """What an entry of a newer manifest must equal for this open shard to serve it."""
        return self.path, self.entry.tokens, self.entry.documents, self.entry.sha256

    def close(self) -> None:
        self.bytes.close()

    def __del__(self) -> None:
        # A shard a refresh dropped closes once no snapshot (no gather in flight) holds it. (No
        # module-level name here: at the interpreter's exit those may already be None.)
        try:
            self.close()
        except Exception:
            pass


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
    sources: list[ByteSource]  # shard k's bytes (all files, or all objects)
    data_offsets: np.ndarray
    needed_list: list[int]  # each shard's size when whole: its data offset and its tokens
    tokens: list[np.ndarray]  # each shard's tokens as a view of its map (empty when not mapped)
    # With a local cache: (version of the copies held, this snapshot reading from them, whether
    # they are all its shards).
    local: tuple[int, _Snapshot, bool] | None = None


class CorpusWindows(RandomAccessSource):
    """Language-model windows ``(idx[V][seq: T], idx[V][seq: T])`` cut from the global token stream.

    Window w starts at token ``w * stride`` of the stream (the shards concatenated in manifest
    order): its input is the T tokens from there, its target the same shifted by one; they equal
    what ``pskd lm-windows`` writes from the concatenated tokens. A source like a Reader: ``len``,
    ``[w]`` (negative from the end), iteration and ``gather(indices)``; gathered tokens are checked
    against the vocabulary size (E9004). ``verify=True`` reads every shard once (``workers``
    threads) to check it against the manifest; ``tokenizer`` refuses a corpus built with another
    (E9016); ``access="pread"`` keeps the shards' pages out of the resident set. ``segments=True``
    gives ``(inputs, targets, segment_ids, positions)`` per window instead (packed documents:
    :mod:`pskd_jax.corpus.segments`). The details (a shard cut short, reading while a build
    runs): ``docs/corpus.md``.

    ``manifest_path`` may be a URL (``s3://bucket/corpus/shards.json``, ``gs://…``, ``memory://…``,
    reached as ``storage`` says). Without ``cache_dir`` its shards are read by byte ranges
    (``access="pread"``, the default there; ``"mmap"`` is E9012); with ``cache_dir``, a shard is
    fetched whole into that directory when a gather first needs it, its sha256 checked as it is
    filled, and read from there as a local shard is (mapped by default). The cache holds at most
    ``cache_bytes`` (least recently used shards removed); a shard that does not fit is read by
    byte ranges, so a corpus of any size is served. A local corpus ignores ``cache_dir``.
    """

    _what = "window"

    def __init__(self, manifest_path: str | os.PathLike, *, seq: int, stride: int | None = None,
                 verify: bool = False, workers: int | None = None, access: str | None = None,
                 tokenizer: Tokenizer | str | os.PathLike | None = None, storage: StorageOptions | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 segments: bool = False):
        self._where = locate(manifest_path)  # (E9018 for a URL the toolkit cannot serve)
        self.path = self._where.path if self._where.is_local else self._where.url
        if not isinstance(segments, bool):
            raise UsageError(f"{self.path}: segments is True or False, got {segments!r}")
        _check_verify(verify, self.path)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise UsageError(f"{self.path}: cache_dir is a directory's path, or None, got {abridged(cache_dir, 80)}")
        self.segments = segments
        self.storage = storage
        remote = not self._where.is_local
        self._store = store_for(self._where, storage) if remote else None
        self.cache = ShardCache(cache_dir, cache_bytes) if remote and cache_dir is not None else None
        self._copies = ShardCopies(self.cache, OPEN_THREADS) if self.cache is not None else None
        self._cache_args = (None if cache_dir is None else os.fspath(cache_dir), cache_bytes)
        self._ranged = remote and self.cache is None  # shards read by byte ranges
        if access is None:
            access = "pread" if self._ranged else "mmap"
        self.access = checked_access(access, self.path)
        if self._ranged and access == "mmap":
            raise UsageError(f"{self.path}: access='mmap' maps local shards; the shards of a corpus in a store are "
                             "read by byte ranges (access='pread', the default), or mapped from a local cache "
                             "(cache_dir=…)")
        stride = seq if stride is None else stride
        # (positions in the stream are int64: a window or a step past 2**63 - 1 tokens fits no corpus)
        self.seq = checked_integer(seq, "seq", low=1, high=MAX_COUNT)
        self.stride = checked_integer(stride, "stride", low=1, high=MAX_COUNT)
        self.verify, self.workers = verify, checked_integer(workers, "workers", low=1, none=True)
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
        if verify is not None:
            _check_verify(verify, self.path)
        state = self._load(self._state, self.verify if verify is None else verify)
        if state is self._state:
            return False
        self._state = state
        return True

    def _read_manifest_bytes(self) -> bytes:
        return read_small(self._where, CorpusDirectoryError, what="the corpus manifest", limit=MAX_FILE_BYTES,
                          storage=self.storage)

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
                raise CorpusDirectoryError(f"{self.path}: the corpus now has another tokenizer (a vocabulary "
                                           f"of {manifest.vocab_size} tokens, was {previous.manifest.vocab_size}); "
                                           "windows cannot take it up: open the corpus anew")
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
        shards: list[_OpenShard | None] = []
        wanted: list[tuple[int, str]] = []  # (index, path) of the shards to open
        new: list[_OpenShard] = []
        try:
            places = shard_places(manifest, self._where, manifest.directory if self._where.is_local else None)
            for i, (entry, path) in enumerate(zip(manifest.shards, places)):
                shard = held.get((path, entry.tokens, entry.documents, entry.sha256))
                if shard is None:
                    wanted.append((i, path))
                shards.append(shard)
            for (i, _), opened in zip(wanted, self._open_shards(manifest, wanted, new)):
                shards[i] = opened
            ready = [s for s in shards if s is not None]
            if verify and new:
                self._check_contents(manifest, ready, {id(s) for s in new})
            return self._snapshot(raw, manifest, ready)
        except BaseException:
            for shard in new:
                shard.close()
            raise

    def _check_contents(self, manifest: Manifest, shards: list[_OpenShard], which: set[int] | None = None) -> None:
        """E9017 naming the first of ``shards`` (those whose id is in ``which``; None: all) whose
        bytes are not what the manifest says, read as the windows read them."""
        check_shards(manifest, lambda i: content_problem(shards[i].bytes, shards[i].path, shards[i].header,
                                                         manifest.shards[i], manifest.tokenizer)
                     if which is None or id(shards[i]) in which else None, self.workers)

    def verify_shards(self) -> None:
        """Checks every shard the windows read now against the manifest (``verify=True`` at the
        open, later): E9017 naming the first bad one. For a caller that makes cheaper checks
        (sample types, boundaries) of several corpora first."""
        self._require_open()
        state = self._state
        self._check_contents(state.manifest, state.shards)

    def _open_shards(self, manifest: Manifest, wanted: list[tuple[int, str]], new: list[_OpenShard]
                     ) -> list[_OpenShard]:
        """The shards ``wanted`` opened, each appended to ``new`` as it opens (so that a failure
        closes those already open); a store's on threads, their requests in flight together."""
        def one(item: tuple[int, str]) -> _OpenShard:
            shard = self._open_shard(manifest, *item)
            new.append(shard)
            return shard

        if self._where.is_local or len(wanted) <= 1:
            return [one(item) for item in wanted]
        with concurrent.futures.ThreadPoolExecutor(min(OPEN_THREADS, len(wanted))) as pool:
            futures = [pool.submit(one, item) for item in wanted]
            concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def _open_shard(self, manifest: Manifest, i: int, path: str) -> _OpenShard:
        """Opens (and with mmap access maps) shard i, checking its header and size (E9017): a local
        file, or an object read by ranges (and, with a cache, copied into it when first read)."""
        if not self._where.is_local:
            return self._open_object(manifest, i, path)
        try:
            fd = open_shard(path)
        except ShardProblem as e:
            raise ShardMismatchError(f"{self.path}: shard {i} {manifest.shards[i].path}: {e}") from None
        source, header, tokens = self._open_file(manifest, i, path, fd, descriptor=False)
        return _OpenShard(manifest.shards[i], path, source, header, tokens)

    def _open_file(self, manifest: Manifest, i: int, local: str, fd: int, *, descriptor: bool = True
                   ) -> tuple[FileBytes | MappedFile, Any, np.ndarray]:
        """Shard i's file open at ``fd`` (taken over): its header checked, and with mmap access its
        tokens as a view of its map. With mmap access and not ``descriptor`` (a corpus's own
        shard, not a cache's copy) the descriptor is kept only within the process's budget (see
        :class:`MappedFile`): a corpus of any number of shards opens."""
        entry, tokenizer = manifest.shards[i], manifest.tokenizer
        source: FileBytes | MappedFile = FileBytes(local, fd=fd)
        try:
            size = os.fstat(fd).st_size
            header = shard_header(fd, size, local)
            problem = header_problem(header, size, entry, tokenizer)
            if problem is not None:
                raise ShardProblem(problem)
            tokens = np.zeros(0, tokenizer.dtype)
            if self.access == "mmap" and not descriptor:
                opened, source = source, MappedFile(local, os.dup(fd), size)  # (the copy: its own to keep or close)
                opened.close()
            if self.access == "mmap" and entry.tokens:
                mapped = source.mapped(size)
                assert mapped is not None  # (a shard of tokens is no empty file: its header said so)
                tokens = np.frombuffer(mapped, tokenizer.dtype, count=entry.tokens, offset=header.data_offset)
            return source, header, tokens
        except ShardProblem as e:
            source.close()
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: {e}") from None
        except (PskdError, OSError, ValueError) as e:  # a map of a file cut short meanwhile
            source.close()
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: cannot map it ({e})"
                                     f"{out_of_descriptors(e)}") from e

    def _open_object(self, manifest: Manifest, i: int, url: str) -> _OpenShard:
        """Shard i as an object read by byte ranges: looked at (its size) and its header read."""
        entry = manifest.shards[i]
        assert self._store is not None
        try:
            source = StoreBytes(self._store, locate(url).key, error=ShardMismatchError, changed=ShardMismatchError)
        except ShardMismatchError:
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: missing (no such object {url})") from None
        try:
            header = object_header(source)
            problem = header_problem(header, source.size(), entry, manifest.tokenizer)
            if problem is not None:
                raise ShardProblem(problem)
        except ShardProblem as e:
            source.close()
            raise ShardMismatchError(f"{self.path}: shard {i} {entry.path}: {e}") from None
        except BaseException:
            source.close()
            raise
        return _OpenShard(entry, url, source, header, np.zeros(0, manifest.tokenizer.dtype))

    def _snapshot(self, raw: bytes, manifest: Manifest, shards: list[_OpenShard]) -> _Snapshot:
        counts = np.array([s.entry.tokens for s in shards], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        total = int(offsets[-1])
        inputs, targets, shift = self._address_views([s.tokens for s in shards], offsets)
        data_offsets = np.array([s.header.data_offset for s in shards], dtype=np.int64)
        return _Snapshot(raw, manifest, shards, counts, offsets, offsets[1:-1], offsets[:-1] + counts - self.seq,
                         total, lm_window_count(total, self.seq, self.stride), inputs, targets, shift,
                         [s.bytes for s in shards], data_offsets,
                         (data_offsets + counts * np.dtype(manifest.tokenizer.dtype).itemsize).tolist(),
                         [s.tokens for s in shards])

    # -- the local cache ---------------------------------------------------------------------------

    def _touched(self, state: _Snapshot, shard: np.ndarray, crossing: np.ndarray, starts: np.ndarray) -> list[int]:
        """The shards (with tokens) that windows starting at ``starts`` touch: each one's start
        shard ``shard``, and for the ``crossing`` ones every shard up to their last token's."""
        distinct = np.flatnonzero(np.bincount(shard)) if len(state.shards) <= 8 * len(shard) else np.unique(shard)
        if not len(crossing):
            return distinct.tolist()  # (a window starts in a shard with tokens)
        last = state.bounds.searchsorted(starts[crossing] + self.seq, side="right")
        spans = [np.arange(int(a), int(b) + 1) for a, b in zip(shard[crossing], last)]
        return [k for k in np.unique(np.concatenate([distinct, *spans])).tolist() if state.counts[k]]

    def _from_copies(self, state: _Snapshot, touched: list[int]) -> tuple[_Snapshot, bool]:
        """``state`` reading from the cache's copies of its shards: those a read touches (indices
        ``touched``) fetched now where they are not held and fit (see
        :mod:`pskd_jax.corpus.shard_copies`). Returns that snapshot, and whether every shard the
        read touches is held (else the read goes by ranges to the store for the others)."""
        copies = self._copies
        assert copies is not None
        shards, needed = state.manifest.shards, state.needed_list
        wanted = [(shards[k].sha256, needed[k]) for k in touched]
        version, held = copies.obtain(wanted, lambda j: self._copy(state, touched[j]))
        local = state.local
        if local is None or local[0] != version:
            local = version, self._reading_copies(state, held), all(e.sha256 in held for e in shards if e.tokens)
            state.local = local
        return local[1], all(sha in held for sha, _ in wanted)

    def _reading_copies(self, state: _Snapshot, held: dict[str, Copy] | Any) -> _Snapshot:
        """``state`` with the held copies' files (and maps) in place of their objects."""
        shards = state.manifest.shards
        sources = [held[e.sha256].bytes if e.sha256 in held else s for e, s in zip(shards, state.sources)]
        tokens = [held[e.sha256].tokens if e.sha256 in held else t for e, t in zip(shards, state.tokens)]
        inputs, targets, shift = self._address_views(tokens, state.offsets)
        return dataclasses.replace(state, sources=sources, tokens=tokens, inputs=inputs, targets=targets, shift=shift,
                                   local=None)

    def _copy(self, state: _Snapshot, k: int) -> Copy:
        """Shard k copied into the cache (fetched and checked now unless its file is there) and
        opened from there."""
        cache, entry, shard = self.cache, state.manifest.shards[k], state.shards[k]
        assert cache is not None and self._store is not None and isinstance(shard.bytes, StoreBytes)
        fd = cache.open(self._store, shard.bytes.key, entry.sha256, shard.bytes.size(),
                        f"{self.path}: shard {k} {entry.path}")
        source, _, tokens = self._open_file(state.manifest, k, cache.path(entry.sha256), fd)
        assert isinstance(source, FileBytes)  # (a copy keeps its descriptor: the cache renews it by it)
        return Copy(entry.sha256, shard.bytes.size(), source, tokens)

    def _address_views(self, tokens: list[np.ndarray], offsets: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of T-token records over every mapped shard at once, the inputs' and the targets'
        (one token on), and what turns a stream position into a record index, per shard.

        The shards are mapped at different addresses of this process. A view starts at the lowest
        mapped token and steps one byte at a time (records overlap), so a record index is an
        address: record ``p * itemsize + shift[k]`` of the inputs' view is tokens ``p .. p + T - 1``
        of the stream when they lie in shard k. Stepping by bytes, not tokens, serves shards whose
        tokens start at different offsets within a page (a version 1 header and a version 2 one
        differ by 5 bytes). Only such records are ever indexed; the gaps between the maps are never
        touched. One fancy index per view then gathers a batch whose windows lie in any number of
        shards, straight into the contiguous (B, T) arrays it returns: a plain copy of each
        window's bytes (void records: never a copy of a shard, whatever its alignment). The maps
        stay valid while the snapshot's token views live: a map does not close under a view.
        """
        dtype = tokens[0].dtype if tokens else np.dtype(np.uint8)
        item = dtype.itemsize
        live = [k for k, t in enumerate(tokens) if len(t) > self.seq]
        shift = np.zeros(len(tokens), dtype=np.int64)
        if not live:  # (no window lies inside a mapped shard: none is gathered from these views)
            return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.uint8), shift
        if self.seq * item > MAX_RECORD_BYTES:
            raise UsageError(f"{self.path}: seq={self.seq}: a window of {self.seq * item} bytes is more than a mapped "
                             f"gather copies at once ({MAX_RECORD_BYTES}); read such windows with access='pread'")
        record = np.dtype((np.void, self.seq * item))
        address = {k: tokens[k].__array_interface__["data"][0] for k in live}
        low = min(address.values())
        high = max(address[k] + len(tokens[k]) * item for k in live)
        for k in live:
            shift[k] = (address[k] - low) - offsets[k] * item
        base = tokens[min(live, key=address.__getitem__)].view(np.uint8)
        span = (high - low) - (self.seq + 1) * item + 1  # record starts whose window, target included, ends by high
        views = [as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]), shape=(span,), strides=(1,),
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

    # -- what the source core reads (see pskd_jax.format.source) ----------------------------------

    def _now(self) -> _Snapshot:
        return self._state  # one snapshot for a whole read, whatever a refresh does meanwhile

    def _length(self, now: _Snapshot) -> int:
        return now.length

    def _check_readable(self) -> None:
        self._require_open()

    def _sample_bytes(self) -> int:
        extra = 2 * self.seq * segment_dtype(self.seq).itemsize if self.segments else 0
        return 2 * self.seq * self.dtype.itemsize + extra

    def _assemble(self, leaves: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        return tuple(leaves)  # (inputs, targets), or with segments=True (…, segment_ids, positions)

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
        if self._copies is not None and stop > start:
            first, last = state.bounds.searchsorted(np.array([start, stop - 1], np.int64), side="right").tolist()
            state, _ = self._from_copies(state, [k for k in range(first, last + 1) if state.counts[k]])
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
                if self.access == "pread" or not len(state.tokens[k]):  # (not mapped: an object's shard)
                    state.sources[k].read_at(out[at - start : at - start + take].view(np.uint8).data,
                                             int(state.data_offsets[k]) + local * self.dtype.itemsize)
                else:
                    self._check_still_whole(state, (k,))
                    out[at - start : at - start + take] = state.tokens[k][local : local + take]
                at += take
            k += 1
        return out

    def _check_still_whole(self, state: _Snapshot, shards: Sequence[int]) -> None:
        """Refuses to copy out of the maps of ``shards`` (indices) when one was cut short since it
        was opened (E9003 naming it): touching a page past the end of a mapped file kills the
        process with SIGBUS. One ``fstat``, or ``stat`` of its path, a shard (:class:`MappedFile`'s
        size); a shard cut short between this check and the copy still kills the process, as for
        a mapped Reader (see ``docs/corpus.md``)."""
        files = [state.sources[k] for k in shards]  # (mapped shards: local files)
        short = first_cut_short(files, [state.needed_list[k] for k in shards])
        if short is not None:
            k = shards[short[0]]
            shard = state.shards[k]
            raise cut_short(f"{self.path}: shard {k} {shard.path}", short[1], state.needed_list[k],
                            f"its {shard.entry.tokens} tokens")

    def _check_tokens(self, state: _Snapshot, tokens: np.ndarray, position_of: Callable[[int], int]) -> None:
        """E9004 naming the shard and the token when a token is not below the vocabulary size
        (``position_of(i)``: the stream position of the i-th token of ``tokens`` in C order, asked
        for the first bad one only)."""
        bound = self._bound
        if not self._bounded or tokens.size == 0 or tokens.max() < bound:
            return
        flat = first_true(tokens >= bound)
        assert flat is not None  # (the largest token is at or above the bound)
        position = int(position_of(flat))
        k = int(np.searchsorted(state.offsets, position, side="right")) - 1
        raise BadValueError(f"{self.path}: shard {k} {state.manifest.shards[k].path}: token "
                            f"{position - int(state.offsets[k])} is {int(tokens.reshape(-1)[flat])}, not below the "
                            f"vocabulary size {bound} (a damaged shard; verify the corpus)")

    def _gather_read(self, state: _Snapshot, starts: np.ndarray, shard: np.ndarray, inside: np.ndarray
                     ) -> np.ndarray:
        """The ``(n, seq + 1)`` tokens of each window with ``access="pread"``: each window inside
        one shard read as one run, the rare one across shards as a run in each shard it touches,
        all in one read (for shards in a store: one batched call a shard)."""
        n, seq, item = len(starts), self.seq, self.dtype.itemsize
        windows = np.empty((n, seq + 1), self.dtype)
        inner_shards = shard[inside]
        offsets = state.data_offsets.take(inner_shards) + (starts[inside] - state.offsets.take(inner_shards)) * item
        runs = Runs.of_rows(offsets, (seq + 1) * item, inner_shards, np.flatnonzero(inside))
        crossing = np.flatnonzero(~inside).tolist()
        if crossing:
            runs = self._with_pieces(state, runs, crossing, starts)
        read_runs(state.sources, runs, windows, self.path)
        return windows

    def _with_pieces(self, state: _Snapshot, runs: Runs, rows: list[int], starts: np.ndarray) -> Runs:
        """``runs`` and the pieces of the windows of ``rows`` (each across shards): one run for each
        shard a window's T + 1 tokens touch, landing at its place in the window's row."""
        item, width = self.dtype.itemsize, self.seq + 1
        offsets, lengths, places, sources = [], [], [], []
        for row in rows:
            at, stop = int(starts[row]), int(starts[row]) + width
            k = int(np.searchsorted(state.offsets, at, side="right")) - 1
            while at < stop:
                local = at - int(state.offsets[k])
                take = min(stop - at, int(state.counts[k]) - local)
                if take > 0:
                    offsets.append(int(state.data_offsets[k]) + local * item)
                    lengths.append(take * item)
                    places.append((row * width + at - int(starts[row])) * item)
                    sources.append(k)
                    at += take
                k += 1
        assert runs.sources is not None  # (of_rows was given the windows' shards)
        return Runs(np.concatenate([runs.offsets, np.array(offsets, np.int64)]),
                    np.concatenate([runs.lengths, np.array(lengths, np.int64)]),
                    np.concatenate([runs.starts, np.array(places, np.int64)]),
                    np.concatenate([runs.sources.astype(np.int64), np.array(sources, np.int64)]))

    def _rows(self, state: _Snapshot, positions: np.ndarray) -> list[np.ndarray]:
        """Windows at ``positions`` (checked, from 0) as ``[inputs, targets]``, each ``(n, seq)``
        and contiguous; with ``segments``, the inputs' segment ids and positions after them."""
        starts = positions.astype(np.int64) * self.stride  # each window's start in the stream
        inputs, targets, checked = self._window_rows(state, starts)
        leaves = self._leaves(inputs, targets) if checked is None else checked[0] if checked[1] else None
        if leaves is None:  # (a token at or above the vocabulary size: E9004 naming the first)
            seq = self.seq
            tokens = np.concatenate([inputs, targets[:, -1:]], axis=1)
            self._check_tokens(state, tokens, lambda i: int(starts[i // (seq + 1)]) + i % (seq + 1))
        assert leaves is not None
        return leaves

    def _leaves(self, inputs: np.ndarray, targets: np.ndarray) -> list[np.ndarray] | None:
        """A gathered batch's ``[inputs, targets]``, with ``segments`` the inputs' segment ids and
        positions after them; None when a token is not below the vocabulary size. The inputs and
        each target's last token are checked (the rest of the targets are inputs); with segments
        the inputs' check rides in the segments' own pass over them."""
        bounded = self._bounded and len(inputs) > 0
        if self.segments:
            ids, positions, below = segments_below(inputs, self.boundary, self._bound if bounded else None)
            leaves = [inputs, targets, ids, positions]
        else:
            below = not bounded or _largest(inputs, None) < self._bound
            leaves = [inputs, targets]
        if bounded and below:
            below = _largest(targets[:, -1]) < self._bound
        return leaves if below else None

    def _window_rows(self, state: _Snapshot, starts: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, tuple[list[np.ndarray], bool] | None]:
        """The inputs and targets of the windows from stream positions ``starts``, each ``(n, seq)``
        and contiguous, and None; or, where the compiled pass gathered them from the maps, their
        leaves (with segments) and whether their tokens are below the vocabulary size."""
        n, seq, dtype = len(starts), self.seq, self.dtype
        shard = state.bounds.searchsorted(starts, side="right")
        inside = starts < state.inside_end.take(shard)  # all T + 1 tokens in the start's shard
        crossing = np.flatnonzero(~inside) if n else starts[:0]
        held, distinct = True, None
        if self._copies is not None and n:
            local = state.local
            if local is not None and local[2] and local[0] == self._copies.version:
                state = local[1]  # every shard held: nothing to fetch, none to let go
                self._copies.renew()
            else:
                distinct = self._touched(state, shard, crossing, starts)
                state, held = self._from_copies(state, distinct)
        if self.access == "pread" or not held:  # (not held: some shards read by ranges from the store)
            windows = self._gather_read(state, starts, shard, inside)
            return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:]), None
        if len(state.inputs) and len(crossing) < n:
            if distinct is None:
                touched = shard[inside]  # the shards copied from, each checked once
                distinct = (np.flatnonzero(np.bincount(touched)) if len(state.shards) <= 8 * n
                            else np.unique(touched)).tolist()
            self._check_still_whole(state, distinct)
            records = starts * self.dtype.itemsize + state.shift.take(shard)  # a record index of the views
            if len(crossing):
                records[crossing] = records[np.argmax(inside)]  # any record inside: those rows are redone
            bound = self._bound if self._bounded else None
            checked = gathered_windows((state.inputs, state.targets), records, dtype, self.boundary, bound,
                                       self.segments)
            if checked is not None:
                inputs, targets = checked[0][:2]
                return inputs, targets, self._with_crossing(state, checked, crossing, starts)
            # (the targets first: the inputs, copied last, are still in the cache for the pass
            # over them that checks their tokens or makes their segments)
            targets = state.targets[records].view(dtype).reshape(n, seq)
            inputs = state.inputs[records].view(dtype).reshape(n, seq)
        else:
            inputs, targets = np.empty((n, seq), dtype), np.empty((n, seq), dtype)
        self._fill_crossing(state, inputs, targets, crossing, starts)
        return inputs, targets, None

    def _fill_crossing(self, state: _Snapshot, inputs: np.ndarray, targets: np.ndarray, crossing: np.ndarray,
                       starts: np.ndarray) -> None:
        """The rows of windows across a shard boundary, from the pieces in each shard."""
        seq = self.seq
        for row in crossing.tolist():
            window = self._stream(state, int(starts[row]), int(starts[row]) + seq + 1)
            inputs[row], targets[row] = window[:-1], window[1:]

    def _with_crossing(self, state: _Snapshot, checked: tuple[list[np.ndarray], bool], crossing: np.ndarray,
                       starts: np.ndarray) -> tuple[list[np.ndarray], bool]:
        """The compiled pass's leaves and answer with the rows across a shard boundary (gathered
        from another window in it) filled, checked and (with segments) scanned here."""
        if not len(crossing):
            return checked
        leaves, below = checked
        inputs, targets = leaves[0], leaves[1]
        self._fill_crossing(state, inputs, targets, crossing, starts)
        redone = self._leaves(np.ascontiguousarray(inputs[crossing]), np.ascontiguousarray(targets[crossing]))
        if redone is None:
            return leaves, False
        for leaf, rows in zip(leaves[2:], redone[2:]):
            leaf[crossing] = rows
        return leaves, below

    # -- identity and pickling (the source core's repr and worker processes) ----------------------

    def _identity(self) -> str:
        """The window shape and count, and an xxh3 of the manifest, which records every shard's sha256."""
        digest = DIGESTS["xxh3_128"](self.manifest.to_bytes()).hexdigest()
        segments = ", segments=True" if self.segments else ""
        return f"seq={self.seq}, stride={self.stride}{segments}, windows={len(self)}, type={self.type_text!r}, " \
               f"manifest_xxh3={digest}"

    def _reopen(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        extra: dict[str, Any] = {"storage": self.storage} if self.storage is not None else {}
        if self.cache is not None:
            extra.update(cache_dir=self._cache_args[0], cache_bytes=self._cache_args[1])
        return (self.path,), {"seq": self.seq, "stride": self.stride, "access": self.access, "segments": self.segments,
                             **extra}

    def _witness(self) -> bytes:
        return self.manifest.to_bytes()

    def _changed(self, then: bytes) -> PskdError:
        return ShardMismatchError(f"{self.path}: the manifest changed since the source was pickled")

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        state, self._state = self._state, self._closed_state(self._state)
        for shard in state.shards:
            shard.close()
        if self._copies is not None:
            self._copies.close()

    def _closed_state(self, state: _Snapshot) -> _Snapshot:
        """What a closed source keeps: the manifest and the lengths, no file."""
        empty = np.zeros(0, np.uint8)
        return dataclasses.replace(state, shards=[], inputs=empty, targets=empty, sources=[], needed_list=[], tokens=[],
                                   local=None)


__all__ = ["CorpusWindows"]
