"""A bucket of an object store (S3 and S3-compatible stores, GCS, or one process's memory) as a
:class:`pskd_jax.storage.base.Store`, through the obstore client.

The client retries what is worth retrying (429 and 5xx answers, dropped connections, timeouts of
reads) with exponential backoff, bounded by :class:`pskd_jax.storage.config.StorageOptions`;
what still fails is E9018 naming the URL, the operation and how long it was tried, with every
credential removed from the client's words. A missing object is E9003. Reads of many ranges run
concurrently (the client merges nearby ranges); a large read is cut into parts read on a pool of
threads, each copied straight into the caller's buffer. A put of more than one part is a
multipart upload: the object appears only when the upload completes, and an upload whose data
fails midway is aborted, leaving nothing.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from pskd_jax.errors import PskdError, StorageError, TruncatedError
from pskd_jax.storage.base import CREATE, OVERWRITE, Buffer, Conflict, ObjectInfo, Store, Version
from pskd_jax.storage.config import DEFAULT_OPTIONS, StorageOptions, client_store, obstore_module, redact

_POOL_LOCK = threading.Lock()
MIN_PART = 5 << 20  # S3's smallest part of a multipart upload (but the last)


class ObjectStore(Store):
    """One bucket (``scheme://bucket``) of an object store; keys are the objects' keys."""

    def __init__(self, scheme: str, bucket: str, options: StorageOptions = DEFAULT_OPTIONS):
        self.scheme = scheme
        self.bucket = bucket
        self.options = options
        self._client = client_store(scheme, bucket, options)
        self._obstore = obstore_module()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The client store pickles itself; memory stores are one process's and reopen by name.
        return {"scheme": self.scheme, "bucket": self.bucket, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["scheme"], state["bucket"], state["options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ObjectStore({self.scheme}://{self.bucket})"

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    # -- errors ------------------------------------------------------------------------------------

    def _failed(self, key: str, what: str, error: BaseException, started: float) -> PskdError:
        if isinstance(error, PskdError):
            return error
        if isinstance(error, FileNotFoundError):
            return TruncatedError(f"{self.url(key)}: no such object (cannot {what})")
        seconds = time.monotonic() - started
        words = redact(" ".join(str(error).split()), self.options)
        if len(words) > 400:
            words = words[:399] + "…"
        return StorageError(f"{self.url(key)}: cannot {what}: {type(error).__name__} after {seconds:.1f} s "
                            f"(retried up to {self.options.retries} times with backoff): {words}")

    def _call(self, key: str, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return function(self._client, key, *args, **kwargs)
        except Conflict:
            raise
        except Exception as e:  # the client's errors, turned into the toolkit's
            raise self._failed(key, what, e, started) from None

    # -- reading -----------------------------------------------------------------------------------

    def info(self, key: str) -> ObjectInfo | None:
        try:
            meta = self._call(key, "look at it", self._obstore.head)
        except TruncatedError:
            return None
        return _info(key, meta)

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        result = self._call(key, "read it", self._obstore.get)
        started = time.monotonic()
        try:
            data = bytes(result.bytes())
        except Exception as e:
            raise self._failed(key, "read it", e, started) from None
        return data, _info(key, result.meta)

    def read_ranges(self, key: str, starts: Sequence[int], stops: Sequence[int]) -> list[Buffer]:
        if len(starts) == 0:
            return []
        starts, stops = [int(s) for s in starts], [int(s) for s in stops]
        found = self._call(key, f"read {len(starts)} byte ranges", self._obstore.get_ranges, starts=starts,
                           ends=stops)
        for start, stop, got in zip(starts, stops, found):
            if len(memoryview(got)) != stop - start:
                raise TruncatedError(f"{self.url(key)}: the object ends before byte {stop} (asked for "
                                     f"[{start}, {stop}), got {len(memoryview(got))} bytes)")
        return list(found)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        out = memoryview(out).cast("B")
        total, part = len(out), self.options.part_bytes
        if total == 0:
            return
        pieces = [(s, min(s + part, total)) for s in range(0, total, part)]
        if len(pieces) == 1:
            (got,) = self.read_ranges(key, [offset], [offset + total])
            out[:] = memoryview(got).cast("B")
            return

        def fill(piece: tuple[int, int]) -> None:
            start, stop = piece
            (got,) = self.read_ranges(key, [offset + start], [offset + stop])
            np.copyto(np.frombuffer(out[start:stop], np.uint8), np.frombuffer(got, np.uint8))

        for done in self._executor().map(fill, pieces):
            del done

    def chunks(self, key: str, chunk_bytes: int = 8 << 20) -> Iterator[Buffer]:
        result = self._call(key, "read it", self._obstore.get)
        started = time.monotonic()
        try:
            yield from result.stream(min_chunk_size=chunk_bytes)
        except Exception as e:
            raise self._failed(key, "read it", e, started) from None

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with _POOL_LOCK:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.options.concurrency,
                                                                   thread_name_prefix="pskd-storage")
            return self._pool

    # -- writing -----------------------------------------------------------------------------------

    def put(self, key: str, data: Buffer | Iterable[Buffer], *, mode: str | Version = OVERWRITE,
            durable: bool = True) -> ObjectInfo:
        """(``durable`` is always true of a completed put: the store has the object.)"""
        if mode == OVERWRITE:
            condition: Any = "overwrite"
        elif mode == CREATE:
            condition = "create"
        elif isinstance(mode, Version):
            condition = {"e_tag": mode.tag}
        else:
            raise ValueError(f"mode {mode!r}")
        single = isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) or hasattr(data, "__buffer__")
        if condition != "overwrite" and not single:
            data = b"".join(bytes(memoryview(piece).cast("B")) for piece in data)  # type: ignore[union-attr]
            single = True
        size = len(memoryview(data).cast("B")) if single else None
        failed: list[BaseException] = []  # the caller's own error while making the data
        if not single:
            data = _watched(data, failed)  # type: ignore[arg-type]
        started = time.monotonic()
        try:
            result = self._obstore.put(self._client, key, data, mode=condition,
                                       chunk_size=max(self.options.part_bytes, MIN_PART),
                                       max_concurrency=self.options.concurrency)
        except Exception as e:
            if failed:
                raise failed[0] from None  # the upload was aborted: nothing is visible
            exceptions = self._obstore.exceptions
            if isinstance(e, exceptions.AlreadyExistsError):
                raise Conflict(self.url(key), "an object is there already") from None
            if isinstance(e, exceptions.PreconditionError):
                raise Conflict(self.url(key), "the object there changed since it was read") from None
            if isinstance(e, FileNotFoundError):
                raise StorageError(f"{self.url(key)}: cannot write it: the store has no bucket "
                                   f"{self.bucket!r}") from None
            raise self._failed(key, "write it", e, started) from None
        if size is None:
            found = self.info(key)
            size = found.size if found is not None else 0
        return ObjectInfo(key, size, str(result.get("e_tag") or result.get("version") or ""))

    def delete(self, key: str) -> None:
        try:
            self._call(key, "delete it", self._obstore.delete)
        except TruncatedError:
            pass

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = prefix.rstrip("/")
        started = time.monotonic()
        try:
            listed = self._obstore.list_with_delimiter(self._client, base + "/" if base else None)
        except Exception as e:
            raise self._failed(prefix, "list it", e, started) from None
        return sorted((_info(meta["path"], meta) for meta in listed["objects"]), key=lambda o: o.key)


def _watched(pieces: Iterable[Buffer], failed: list[BaseException]) -> Iterator[Buffer]:
    """The caller's pieces, with the error that stops them kept for the caller."""
    try:
        yield from pieces
    except BaseException as e:
        failed.append(e)
        raise


def _info(key: str, meta: Any) -> ObjectInfo:
    tag = meta.get("e_tag") or meta.get("version") or f"{meta.get('last_modified')}-{meta.get('size')}"
    return ObjectInfo(str(meta.get("path", key)), int(meta["size"]), str(tag))


__all__ = ["ObjectStore"]
