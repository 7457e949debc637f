"""Training windows cut on the fly from a corpus's global token stream.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Sequence
import numpy as np
from numpy.lib.stride_tricks import as_strided
from pskd_jax.format.reader import ACCESS_MODES, Reader
from pskd_jax._os.positional import pread_spans
from pskd_jax.errors import ShardMismatchError, TruncatedError, UsageError
from pskd_jax.data.windows import lm_window_count
from pskd_jax.data.windows import window_type
from pskd_jax.corpus.maintain import check_tokenizer, shard_problem, verify_corpus
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.manifest import read_manifest


class CorpusWindows:
    """Language-model windows ``(idx[V][seq: T], idx[V][seq: T])`` cut from the global token stream.

    Window w starts at token ``w * stride`` of the stream (the shards concatenated in manifest
    order): its input is the T tokens from there, its target the same shifted by one. Windows
    cross shard boundaries freely; the samples are those ``pskd lm-windows`` writes from the
    concatenated tokens. A source for :class:`pskd_jax.loader.Loader` and a pipeline like a
    Reader: ``len``, ``[w]`` and ``gather(indices)``.

    Each shard is mapped once. ``gather`` finds every window's shard with one ``searchsorted``,
    gathers the inputs and the targets of every window that lies inside a shard with one fancy
    index each over views spanning all the maps (see ``_address_views``), and assembles the few
    that cross a boundary from pieces.
    ``verify=True`` hashes every shard first (:func:`verify_corpus`); in any case each shard's
    type, count and size are checked against the manifest when it is opened (E9017).

    ``tokenizer`` (a :class:`Tokenizer`, or a ``tokenizer.json`` or vocabulary file) refuses a
    corpus built with another tokenizer (E9016, naming both; see :func:`check_tokenizer`).

    ``access="pread"`` reads each window's T + 1 tokens with one ``preadv`` instead (pieces for a
    window across shards), as ``Reader(access="pread")`` does: slower per window, but the shards'
    pages never join the process's resident set.
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
        self.manifest = read_manifest(self.path)
        check_tokenizer(self.manifest, tokenizer)  # before any shard is hashed
        if verify:
            self.manifest = verify_corpus(self.path, workers=workers).manifest
        self.tokenizer = self.manifest.tokenizer
        self.dtype = self.tokenizer.dtype
        self._readers: list[Reader] = []
        self._tokens: list[np.ndarray] = []
        try:
            for i, shard in enumerate(self.manifest.shards):
                path = self.manifest.shard_path(i)
                problem = shard_problem(path, shard, self.tokenizer, digest=False)
                if problem is not None:
                    raise ShardMismatchError(f"{self.path}: shard {i} {shard.path}: {problem}")
                reader = Reader(path, access=access)
                self._readers.append(reader)
                self._tokens.append(reader.leaves()[0])
        except BaseException:
            self.close()
            raise
        counts = np.array([len(t) for t in self._tokens], dtype=np.int64)
        self._counts = counts
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # shard k: [off[k], off[k+1])
        self._bounds = self._offsets[1:-1]  # searchsorted(bounds, start, "right") is the start's shard
        self._inside_end = self._offsets[:-1] + counts - self.seq  # a window starting before it fits the shard
        self.total_tokens = int(self._offsets[-1])
        self._length = lm_window_count(self.total_tokens, self.seq, self.stride)
        self._inputs, self._targets, self._shift = self._address_views()
        # What access="pread" reads with, per shard: its descriptor, and where its tokens start.
        self._fds = [reader._fd for reader in self._readers]
        self._data_offsets = np.array([reader.header.data_offset for reader in self._readers], dtype=np.int64)

    def _address_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of T-token records over every shard at once, the inputs' and the targets' (one
        token on), and what turns a stream position into a record index, per shard.

        The shards are mapped at different addresses of this process. A view starts at the lowest
        mapped token and steps one token at a time (records overlap), so a record index is an
        address: record ``p + shift[k]`` of the inputs' view is tokens ``p .. p + T - 1`` of the
        stream when they lie in shard k. Only such records are ever indexed; the gaps between the
        maps are never touched. One fancy index per view then gathers a batch whose windows lie in
        any number of shards, straight into the contiguous (B, T) arrays it returns: a plain copy
        of each window's bytes (void records: never a copy of a shard, whatever its alignment).
        The maps stay valid while ``self._tokens`` (views of them) lives: a map does not close
        under a view.
        """
        item = self.dtype.itemsize
        record = np.dtype((np.void, self.seq * item))
        live = [k for k, t in enumerate(self._tokens) if len(t) > self.seq]
        shift = np.zeros(len(self._tokens), dtype=np.int64)
        if not live:
            return np.zeros(0, dtype=record), np.zeros(0, dtype=record), shift
        address = {k: self._tokens[k].__array_interface__["data"][0] for k in live}
        low = min(address.values())
        # Every shard has the same header, so its tokens start at the same offset within a page:
        # the distance between two shards is a whole number of tokens.
        if any((a - low) % item for a in address.values()):
            raise ShardMismatchError(f"{self.path}: shards whose tokens are not aligned alike")
        high = max(address[k] + len(self._tokens[k]) * item for k in live)
        for k in live:
            shift[k] = (address[k] - low) // item - self._offsets[k]
        base = self._tokens[min(live, key=address.get)].view(np.uint8)
        span = (high - low) // item - self.seq  # record starts whose window, target included, ends by high
        views = [as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]), shape=(span,), strides=(item,),
                            writeable=False) for skip in (0, item)]
        return views[0], views[1], shift

    # -- the source protocol -------------------------------------------------------------------

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
        return self._length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``index`` as ``(inputs, targets)``, each ``(seq,)``."""
        try:
            index = operator.index(index)
        except TypeError:
            raise UsageError(f"{self.path}: a window index is an integer, got {index!r}") from None
        inputs, targets = self.gather(np.array([index], dtype=np.int64))
        return inputs[0], targets[0]

    def stream(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream (a fresh array)."""
        if not 0 <= start <= stop <= self.total_tokens:
            raise UsageError(f"{self.path}: tokens [{start}, {stop}) are not inside the stream of "
                            f"{self.total_tokens} tokens")
        out = np.empty(stop - start, dtype=self.dtype)
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        k, at = first, start
        while at < stop:
            if self._counts[k]:
                local = at - int(self._offsets[k])
                take = min(stop - at, int(self._counts[k]) - local)
                if self.access == "pread":
                    self._read_tokens(k, local, out[at - start : at - start + take])
                else:
                    out[at - start : at - start + take] = self._tokens[k][local : local + take]
                at += take
            k += 1
        return out

    def _read_tokens(self, shard: int, local: int, out: np.ndarray) -> None:
        """Tokens ``local ..`` of a shard into ``out`` with one ``preadv`` (``access="pread"``)."""
        reader = self._readers[shard]
        item = self.dtype.itemsize
        pread_spans(reader._fd, [memoryview(out.view(np.uint8))], [reader.header.data_offset + local * item],
                    reader.path)

    def _gather_read(self, starts: np.ndarray, shard: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``gather`` with ``access="pread"``: each window inside one shard read with one ``preadv``
        (through ``map``), the rare one across shards from pieces."""
        n, seq, item = len(starts), self.seq, self.dtype.itemsize
        windows = np.empty((n, seq + 1), self.dtype)
        flat = memoryview(windows.reshape(-1).view(np.uint8))
        width = (seq + 1) * item
        rows = np.flatnonzero(inside).tolist()
        inner_shards = shard[inside]
        fds = [self._fds[k] for k in inner_shards.tolist()]
        offsets = self._data_offsets.take(inner_shards) + (starts[inside] - self._offsets.take(inner_shards)) * item
        pread_spans(fds, [flat[r * width : (r + 1) * width] for r in rows], offsets.tolist(), self.path)
        for row in np.flatnonzero(~inside).tolist():
            windows[row] = self.stream(int(starts[row]), int(starts[row]) + seq + 1)
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])

    def gather(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``indices`` as ``(inputs, targets)``, each ``(len(indices), seq)`` and contiguous."""
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
            raise UsageError(f"{self.path}: window indices are one axis of integers, got "
                            f"{indices.dtype} of shape {indices.shape}")
        n, count = len(indices), self._length
        if n and (indices.min() < -count or indices.max() >= count):
            bad = indices[(indices < -count) | (indices >= count)][0]
            raise TruncatedError(f"{self.path}: window {bad} is beyond the {count} windows of the corpus")
        if not self._readers and self.manifest.shards:
            raise UsageError(f"{self.path}: the windows were closed")
        seq, dtype = self.seq, self.dtype
        tokens, input_view, target_view = self._tokens, self._inputs, self._targets  # held: the maps stay open
        position = indices.astype(np.int64)
        if n and indices.min() < 0:
            position %= count
        position *= self.stride  # each window's start in the stream
        shard = self._bounds.searchsorted(position, side="right")
        inside = position < self._inside_end.take(shard)  # all T + 1 tokens in the start's shard
        if self.access == "pread":
            return self._gather_read(position, shard, inside)
        crossing = np.flatnonzero(~inside) if n else position[:0]
        starts = position.copy() if len(crossing) else position
        position += self._shift.take(shard)  # now a record index of the views
        if len(input_view) and len(crossing) < n:
            if len(crossing):
                position[crossing] = position[np.argmax(inside)]  # any record inside: those rows are redone
            inputs = input_view[position].view(dtype).reshape(n, seq)
            targets = target_view[position].view(dtype).reshape(n, seq)
        else:
            inputs, targets = np.empty((n, seq), dtype), np.empty((n, seq), dtype)
        for row in crossing.tolist():  # across a shard boundary: from pieces
            window = self.stream(int(starts[row]), int(starts[row]) + seq + 1)
            inputs[row], targets[row] = window[:-1], window[1:]
        del tokens
        return inputs, targets

    # -- pickling (worker processes) and lifetime ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The manifest path and the window shape; the shards are mapped again where unpickled."""
        return {"path": self.path, "seq": self.seq, "stride": self.stride,
                "manifest": self.manifest.to_bytes(), "access": self.access}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], seq=state["seq"], stride=state["stride"], access=state.get("access", "mmap"))
        if self.manifest.to_bytes() != state["manifest"]:
            self.close()
            raise ShardMismatchError(f"{self.path}: the manifest changed since the source was pickled")

    def close(self) -> None:
        self._inputs = self._targets = np.zeros(0, np.uint8)
        self._tokens, self._fds = [], []
        for reader in self._readers:
            reader.close()
        self._readers = []

    def __enter__(self) -> "CorpusWindows":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
