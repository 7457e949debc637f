"""A checkpoint that is an object of a store (``s3://``, ``gs://``, ``memory://``), as a restore
plans its read: the object's header and size, read by byte ranges, its layout placed and checked
as a :class:`pskd_jax.format.reader.Reader` places a local file's, and the layout object beside
it (``NAME.layout.json``), proven to belong to it. Nothing here maps or opens a local file; the
bytes come through :mod:`pskd_jax.storage`. See ``docs/checkpoints.md`` ("Checkpoints in a bucket").
"""

from __future__ import annotations

import io
import math
from typing import Any

from pskd_jax._os.digests import DIGESTS
from pskd_jax._os.names import layout_path_for
from pskd_jax.errors import MismatchError, NotPskdError, TruncatedError
from pskd_jax.format.header import MAX_COUNT, MAX_TYPE_BYTES, Header, read_header
from pskd_jax.format.layout import Layout
from pskd_jax.format.layout_file import LayoutFile, check_header_belongs, layout_from_bytes
from pskd_jax.format.parts_index import PartsIndex, index_of
from pskd_jax.format.placement import Placement
from pskd_jax.storage import Location, Store, store_for

HEAD_BYTES = 64 << 10  # the first read of an object: a header of any ordinary type fits in it


class StoredFile:
    """The header of the checkpoint object at ``where`` (E9002 when there is none or it is not
    a ``.psk.d`` object, E9003 when it is cut short), its size and version tag, and — once
    :meth:`with_layout` is given one — where its leaves are (``placement``). ``xxh3_128``: the
    whole object's digest the caller verifies its reads against (a verified restore), which a
    layout recording it proves it belongs to (see :meth:`check`)."""

    def __init__(self, where: Location, store: Store | None = None, *, xxh3_128: str | None = None):
        self.where = where
        self.xxh3_128 = xxh3_128  # (the digest the caller checks every byte read against, if any)
        self.store = store if store is not None else store_for(where)
        self.key = where.key
        self.path = where.url  # (what messages name, as a reader's path)
        found = self.store.head(self.key, HEAD_BYTES)  # (its size, tag and first bytes: one request)
        if found is None:
            raise NotPskdError(f"{self.path}: cannot read: no such object")  # (as for a missing file)
        head, info = found
        self.file_size, self.tag = info.size, info.tag
        self.parts: PartsIndex | None = None
        found_index = index_of(self.store, self.key, head, info, self.path)
        if found_index is not None:  # saved by several processes: a parts index (see parts_index.py)
            self.parts, info = found_index
            self.file_size, self.tag = self.parts.size, info.tag
            head = self._read(0, min(HEAD_BYTES, self.file_size))
        self.header = self._parse(head)
        if self.header.data_offset > len(head):  # a type text longer than the first read
            head = self._read(0, self.header.data_offset)
            self.header = self._parse(head)
        self.header_bytes = head[: self.header.data_offset]
        if self.header.count > MAX_COUNT:
            raise TruncatedError(f"{self.path}: a count of {self.header.count} samples, beyond the 2^63 - 1 a "
                                 f"reader can index")
        self.layout: Layout | None = None
        self.placement: Placement | None = None

    def _parse(self, head: bytes) -> Header:
        try:
            return read_header(io.BytesIO(head), self.path, self.file_size)
        except TruncatedError:
            if len(head) >= min(self.file_size, MAX_TYPE_BYTES + 64):
                raise
            # the first read ended inside a long type text: read as much as the header can take
            head = self._read(0, min(self.file_size, MAX_TYPE_BYTES + 64))
            return read_header(io.BytesIO(head), self.path, self.file_size)

    def _read(self, start: int, stop: int) -> bytes:
        out = bytearray(max(0, stop - start))
        if out:
            self.read_spans([memoryview(out)], [start])
        return bytes(out)

    def read_spans(self, spans: list[memoryview], offsets: list[int]) -> None:
        """Fills each span with the checkpoint file's bytes from its offset: from the object, or
        from the part objects that hold them."""
        if self.parts is not None:
            self.parts.read_spans(self.store, self.path, spans, offsets)
        else:
            self.store.read_spans(self.key, spans, offsets)

    def digest(self, algorithm: str, piece: int = 16 << 20) -> str:
        """The digest of the whole checkpoint file, read in order a piece at a time."""
        digest = DIGESTS[algorithm]()
        buffer = bytearray(min(piece, max(1, self.file_size)))
        for start in range(0, self.file_size, len(buffer)):
            view = memoryview(buffer)[: min(len(buffer), self.file_size - start)]
            self.read_spans([view], [start])
            digest.update(view)
        return digest.hexdigest()

    def with_layout(self, layout: Layout) -> StoredFile:
        """Places ``layout``'s leaves in the object, with a reader's checks: as many leaves as the
        header lists, the samples within the object, a ``params`` object exactly its samples."""
        encodings = self.header.encodings
        if encodings is not None and len(encodings) != len(layout.leaves):
            raise MismatchError(f"{self.path}: the header lists {len(encodings)} leaves, the layout has "
                                f"{len(layout.leaves)}")
        placement = Placement.of(layout, encodings, self.path, from_header=True)
        sample_bytes = placement.sample_bytes
        needed = self.header.data_offset + self.header.count * sample_bytes
        if needed > self.file_size:
            raise TruncatedError(f"{self.path}: truncated: {self.header.count} samples of {sample_bytes} bytes "
                                 f"announced ({self.file_size} bytes, {needed} needed)")
        for leaf, dtype in zip(layout.leaves, placement.disk_dtypes):
            if max(self.header.count, 1) * dtype.itemsize * math.prod(d for d in leaf.shape if d) > MAX_COUNT:
                raise TruncatedError(f"{self.path}: leaf {leaf.path or '(root)'} spans more than the 2^63 bytes an "
                                     "array can address")
        if self.header.is_params and needed != self.file_size:
            raise MismatchError(f"{self.path}: the layout makes samples of {sample_bytes} bytes, but the object "
                                f"holds {self.file_size - self.header.data_offset} bytes of data: the layout is not "
                                f"the one {self.header.type_text!r} was written with")
        self.layout, self.placement = layout, placement
        return self

    def layout_key(self) -> str:
        return layout_path_for(self.key)

    def beside(self) -> LayoutFile | None:
        """The layout object beside this one, proven to belong to it (E9005 naming both when it
        does not), or None when there is none."""
        key = self.layout_key()
        try:
            raw, _ = self.store.get(key)  # (one request: a missing object is E9003)
        except TruncatedError:
            if self.store.info(key) is None:
                return None
            raise
        found = layout_from_bytes(raw, self.store.url(key))
        self.check(found)
        return found

    def layout_at(self, store: Store, key: str, xxh3_128: str | None = None) -> LayoutFile:
        """The layout object ``key`` of ``store``, proven to belong to this checkpoint."""
        raw, _ = store.get(key)
        found = layout_from_bytes(raw, store.url(key))
        self.check(found, xxh3_128)
        return found

    def check(self, layout_file: LayoutFile, xxh3_128: str | None = None) -> None:
        """Refuses (E9005 naming both) a layout file written for another object, or for another
        version of this one (:class:`~pskd_jax.format.layout_file.OtherVersion`: saved again
        since this object was opened, or before its layout was put)."""
        check_header_belongs(layout_file, self.path, self.header, self.header_bytes, self.file_size,
                             xxh3_128=xxh3_128, version=(self.path, self.tag), verified_by=self.xxh3_128)

    def close(self) -> None:
        pass

    def __enter__(self) -> StoredFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["HEAD_BYTES", "StoredFile"]
