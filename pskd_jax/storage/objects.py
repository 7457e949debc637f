"""A bucket of an object store (S3 and S3-compatible stores, GCS, or one process's memory) as a
:class:`pskd_jax.storage.base.Store`, through the obstore client.

The client retries what is worth retrying (429, 408 and 5xx answers, dropped connections, bodies
cut short) with exponential backoff, bounded by :class:`pskd_jax.storage.config.StorageOptions`;
what still fails is E9018 naming the URL, the operation, how many tries and how long, with every
credential removed from the client's words. A missing object is E9003, and so is a read that
comes back shorter than asked: a read returns all its bytes or raises, never part of them.
Reads of many ranges run concurrently (the client merges nearby ranges); a large read is cut
into parts read on a pool of threads, each copied straight into the caller's buffer. A put of
more than one part is a multipart upload: the object appears only when the upload completes,
and an upload whose data fails midway is aborted, leaving nothing.

A conditional put reports what happened, not what its last request heard: a try whose answer
was lost may have landed, so that its retry is refused by the put's own object. When a
conditional put that was tried more than once is refused, or fails without an answer, the
object at the key is read back, and if it holds exactly the bytes written the put is done (see
``docs/storage.md``, "Faults"). A conditional put whose connection dropped, which the client does
not retry (it cannot know whether the server acted), is retried here under the same rule.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.checks import counted
from pskd_jax.errors import PskdError, StorageError, TruncatedError
from pskd_jax.storage.base import (
    CREATE,
    OVERWRITE,
    Buffer,
    Changed,
    Conflict,
    ObjectInfo,
    Store,
    Version,
    merged_ranges,
)
from pskd_jax.storage.config import DEFAULT_OPTIONS, StorageOptions, client_store, obstore_module, redact
from pskd_jax.storage.urls import check_key_length

_POOL_LOCK = threading.Lock()
MIN_PART = 5 << 20  # S3's smallest part of a multipart upload (but the last)
MAX_PARTS = 10_000  # S3's most parts of one upload (a part numbered past it is a 400, the data sent)
_RETRIED = re.compile(r"after (\d+) retries")  # how the client's messages say it tried again
_ANSWERED = "non-2xx status code"  # how they say the server answered (a refusal, not a lost answer)
# S3's 409 ConditionalRequestConflict: another write or delete of the key was in progress. No verdict
# on the condition (the client calls it "already exists"); AWS says to try the put again.
_IN_PROGRESS = re.compile(r"status code: 409\b")
_NO_BUCKET = "<Code>NoSuchBucket</Code>"  # S3's error page for a GET of a bucket that is not there (a HEAD has none)
# A store without conditional writes (S3 itself before 2024, some S3-compatible ones) refuses the header
_NOT_IMPLEMENTED = re.compile(r"status code: 501\b")
# How they say a range started at or past the object's end (a server's 416; memory://'s own words)
_UNSATISFIABLE = re.compile(r"status code: 416\b|Wanted range starting at \d+, but object was only")
_FORBIDDEN = re.compile(r"status code: 403\b|\b403 Forbidden\b")
# (S3 answers a GET or HEAD of a key that is not there with 403, not 404, when the credentials may
# not list the bucket: a missing object then looks like a refusal, and the message says which.)
_FORBIDDEN_HINT = ("(S3 answers 403 also for an object that is not there when the credentials may not list the "
                   "bucket: s3:ListBucket)")


class ObjectStore(Store):
    """One bucket (``scheme://bucket``) of an object store; keys are the objects' keys."""

    def __init__(self, scheme: str, bucket: str, options: StorageOptions = DEFAULT_OPTIONS):
        self.scheme = scheme
        self.bucket = bucket
        self.options = options
        self._client = client_store(scheme, bucket, options)
        self._obstore = obstore_module()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._bucket_seen = False  # (an answer of the bucket's own seen: it is there)

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

    def _failed(self, key: str, what: str, error: BaseException, started: float, tries: int = 1) -> PskdError:
        if isinstance(error, PskdError):
            return error
        # Not a missing object: every key of this bucket is missing. (A GET's answer is the client's
        # 'not found', a listing's its generic error; both quote S3's error page.)
        if _NO_BUCKET in str(error):
            return StorageError(f"{self.url(key)}: cannot {what}: there is no bucket {self.bucket!r} (the store "
                                "answered NoSuchBucket)")
        if isinstance(error, FileNotFoundError):
            return TruncatedError(f"{self.url(key)}: no such object (cannot {what})")
        if _UNSATISFIABLE.search(str(error)):  # a range that starts at or past the object's end
            return TruncatedError(f"{self.url(key)}: the object ends before a range asked of it starts (cannot "
                                  f"{what}): {_client_words(error, self.options)}")
        hint = f" {_FORBIDDEN_HINT}" if self.scheme == "s3" and _FORBIDDEN.search(str(error)) else ""
        return StorageError(f"{self.url(key)}: cannot {what}: {_tried(error, started, tries, self.options)}: "
                            f"{type(error).__name__}: {_client_words(error, self.options)}{hint}")

    def _named(self, key: str, what: str) -> None:
        """Refuses the empty key before any request: it names the bucket itself, and S3 answers a
        GET of it with the bucket's listing (read as if it were an object's bytes) and a PUT with
        errors it retries; no object can be stored there. Refuses a key longer than a store takes
        too (one made from a long prefix and a step's or a shard's name)."""
        if not key:
            error = StorageError if what == "write it" else TruncatedError
            raise error(f"{self.url(key)}: names the bucket, not an object (cannot {what}): give the object's key "
                        f"({self.scheme}://{self.bucket}/KEY)")
        check_key_length(self.url(key), key)

    def _call(self, key: str, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        self._named(key, what)
        started = time.monotonic()
        try:
            return function(self._client, key, *args, **kwargs)
        except Conflict:
            raise
        except Exception as e:  # the client's errors, turned into the toolkit's
            raise self._failed(key, what, e, started) from None

    # -- reading -----------------------------------------------------------------------------------

    def info(self, key: str) -> ObjectInfo | None:
        if not key:  # (the bucket itself: no object is there)
            return None
        try:
            meta = self._call(key, "look at it", self._obstore.head)
        except TruncatedError:
            self._check_bucket(key, "look at it")
            return None
        self._bucket_seen = True
        return self._info(key, meta)

    def _check_bucket(self, key: str, what: str) -> None:
        """After S3 answered a HEAD with 'not found', which cannot tell a missing key from a
        missing bucket (a HEAD's answer has no error page): E9018 saying there is no bucket when
        that is why, from a GET of the key's first byte (whose 'not found' quotes S3's error page:
        NoSuchKey or NoSuchBucket), once a store (a bucket seen there stays there for this store's
        purposes). Any other answer is left to the caller's next request."""
        if self._bucket_seen or self.scheme != "s3":
            return
        started = time.monotonic()
        try:
            self._obstore.get(self._client, key, options={"range": (0, 1)})
        except Exception as e:
            if _NO_BUCKET in str(e):
                raise self._failed(key, what, e, started) from None
            if not isinstance(e, FileNotFoundError):
                return  # (not an answer about the bucket: nothing learnt)
        self._bucket_seen = True

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        started = time.monotonic()
        result = self._call(key, "read it", self._obstore.get)
        try:
            data = bytes(result.bytes())
        except Exception as e:
            raise self._failed(key, "read it", e, started) from None
        info = self._info(key, result.meta)
        if len(data) != info.size:  # the client checks the body's length; this is a second guard
            raise TruncatedError(f"{self.url(key)}: read {len(data)} bytes of an object of {info.size}")
        return data, info

    def head(self, key: str, size: int) -> tuple[bytes, ObjectInfo] | None:
        """One ranged GET, whose answer also says the object's size and tag (an empty object,
        which has no byte range, is looked at instead)."""
        if not key:  # (the bucket itself: no object is there)
            return None
        check_key_length(self.url(key), key)
        started = time.monotonic()
        try:
            result = self._obstore.get(self._client, key, options={"range": (0, max(1, size))})
            data = bytes(result.bytes())
        except FileNotFoundError as e:
            if _NO_BUCKET in str(e):
                raise self._failed(key, "read it", e, started) from None
            return None
        except Exception as e:
            if "range" in str(e).lower():
                return super().head(key, size)
            raise self._failed(key, "read it", e, started) from None
        info = self._info(key, result.meta)
        if len(data) != min(max(1, size), info.size):
            raise TruncatedError(f"{self.url(key)}: read {len(data)} bytes of the first {min(size, info.size)}")
        return data[:size], info

    def read_ranges(self, key: str, starts: Sequence[int], stops: Sequence[int], *,
                    coalesce: int | None = None, tag: str | None = None) -> list[Buffer]:
        if len(starts) == 0:
            return []
        starts, stops = [int(s) for s in starts], [int(s) for s in stops]
        what = f"read {len(starts)} byte ranges" if len(starts) > 1 else "read a byte range"
        self._named(key, what)
        if tag is not None:
            found = self._read_ranges_of(key, starts, stops, 1 << 20 if coalesce is None else int(coalesce), tag,
                                         what)
        else:
            merge = {} if coalesce is None else {"coalesce": int(coalesce)}
            asked = [j for j in range(len(starts)) if stops[j] > starts[j]]  # (the client refuses an empty range)
            got = self._call(key, what, self._obstore.get_ranges, starts=[starts[j] for j in asked],
                             ends=[stops[j] for j in asked], **merge) if asked else []
            found = [b""] * len(starts)
            for j, piece in zip(asked, got):
                found[j] = piece
        for start, stop, got in zip(starts, stops, found):
            if len(memoryview(got)) != stop - start:
                raise TruncatedError(f"{self.url(key)}: the object ends before byte {stop} (asked for "
                                     f"[{start}, {stop}), got {len(memoryview(got))} bytes)")
        return list(found)

    def _read_ranges_of(self, key: str, starts: list[int], stops: list[int], coalesce: int, tag: str, what: str
                        ) -> list[Buffer]:
        """The ranges read as the client's ``get_ranges`` reads them (those at most ``coalesce``
        bytes apart in one request, the requests in flight together), each request a ranged GET
        conditioned on the version ``tag`` (``If-Match``), which ``get_ranges`` cannot send: the
        same requests, :class:`Changed` when the object is another version now."""
        lows, highs, which = merged_ranges(starts, [b - a for a, b in zip(starts, stops)], coalesce)
        # The tag as the store sent it: GCS's quoted (this store keeps GCS's tags unquoted).
        condition = f'"{tag}"' if self.scheme == "gs" and not tag.startswith('"') else tag
        exceptions = self._obstore.exceptions

        def one(j: int) -> Buffer:
            started = time.monotonic()
            try:
                result = self._obstore.get(self._client, key, options={"range": (lows[j], highs[j]),
                                                                       "if_match": condition})
                return result.bytes()
            except exceptions.PreconditionError:
                raise Changed(self.url(key), tag) from None
            except Exception as e:
                raise self._failed(key, what, e, started) from None

        if len(lows) <= 1:
            got = [one(j) for j in range(len(lows))]
        else:
            futures = [self._executor().submit(one, j) for j in range(len(lows))]
            concurrent.futures.wait(futures)  # every request done before an error is raised
            got = [future.result() for future in futures]
        out: list[Buffer] = []
        for start, stop, j in zip(starts, stops, which):
            if j < 0:
                out.append(b"")
                continue
            view = memoryview(got[j]).cast("B")
            skip = start - lows[j]
            out.append(view[skip : skip + stop - start] if (skip or len(view) != stop - start) else got[j])
        return out

    def read_into(self, key: str, offset: int, out: memoryview, *, tag: str | None = None) -> None:
        out = memoryview(out).cast("B")
        total, part = len(out), self.options.part_bytes
        if total == 0:
            return
        pieces = [(s, min(s + part, total)) for s in range(0, total, part)]
        if len(pieces) == 1:
            (got,) = self.read_ranges(key, [offset], [offset + total], tag=tag)
            out[:] = memoryview(got).cast("B")
            return

        def fill(piece: tuple[int, int]) -> None:
            start, stop = piece
            (got,) = self.read_ranges(key, [offset + start], [offset + stop], tag=tag)
            np.copyto(np.frombuffer(out[start:stop], np.uint8), np.frombuffer(got, np.uint8))

        # Every part is waited for before an error is raised: no part may still be writing into
        # the caller's buffer once this returns.
        futures = [self._executor().submit(fill, piece) for piece in pieces]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    def read_spans(self, key: str, spans: Sequence[memoryview], offsets: Sequence[int]) -> None:
        """The spans cut into pieces of at most ``part_bytes``, grouped into requests of about
        that many bytes (the client merges neighbouring ranges of one call), ``concurrency`` of
        them in flight, each piece copied into its span as it arrives."""
        part = self.options.part_bytes
        pieces: list[tuple[memoryview, int]] = []
        for span, offset in zip(spans, offsets):
            span = memoryview(span).cast("B")
            pieces.extend((span[s : s + part], int(offset) + s) for s in range(0, len(span), part))
        batches: list[list[tuple[memoryview, int]]] = []
        size = part
        for piece in pieces:
            if size + len(piece[0]) > part or len(batches[-1]) >= 256:
                batches.append([])
                size = 0
            batches[-1].append(piece)
            size += len(piece[0])

        def fill(batch: list[tuple[memoryview, int]]) -> None:
            found = self.read_ranges(key, [o for _, o in batch], [o + len(v) for v, o in batch])
            for (view, _), got in zip(batch, found):
                np.copyto(np.frombuffer(view, np.uint8), np.frombuffer(got, np.uint8))

        if len(batches) <= 1:
            for batch in batches:
                fill(batch)
            return
        # Every batch is waited for before an error is raised: none may still be writing into the
        # caller's buffers once this returns.
        futures = [self._executor().submit(fill, batch) for batch in batches]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    def chunks(self, key: str, chunk_bytes: int = 8 << 20) -> Iterator[Buffer]:
        started, seen = time.monotonic(), 0
        result = self._call(key, "read it", self._obstore.get)
        size = int(result.meta["size"])
        try:
            for chunk in result.stream(min_chunk_size=chunk_bytes):
                seen += len(memoryview(chunk))
                yield chunk
        except Exception as e:
            raise self._failed(key, "read it", e, started) from None
        if seen != size:
            raise TruncatedError(f"{self.url(key)}: the stream ended after {seen} bytes of an object of {size}")

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with _POOL_LOCK:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.options.concurrency,
                                                                   thread_name_prefix="pskd-storage")
            return self._pool

    # -- writing -----------------------------------------------------------------------------------

    def put(self, key: str, data: Buffer | Iterable[Buffer], *, mode: str | Version = OVERWRITE,
            durable: bool = True, size: int | None = None) -> ObjectInfo:
        """(``durable`` is always true of a completed put: the store has the object.) The parts of
        an upload are ``part_bytes``, or larger where the object's size (one buffer's, or ``size``)
        needs more than :data:`MAX_PARTS` of them; pieces of no stated size that outgrow that many
        parts are E9018 at once (the upload aborted, nothing visible), not the server's 400 at the
        end."""
        if mode not in (OVERWRITE, CREATE) and not isinstance(mode, Version):
            raise ValueError(f"mode {mode!r}")
        self._named(key, "write it")
        single = isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) or hasattr(data, "__buffer__")
        if mode != OVERWRITE:
            whole = data if single else b"".join(_bytes(piece) for piece in data)
            return self._put_conditional(key, _bytes(whole), mode)
        if not single and (size is None or size <= _part_bytes(size, self.options)):
            data, whole = _within_one_part(data, _part_bytes(None, self.options))
            if whole is not None:  # one PUT, not an upload of one part (three requests, one left open if cut)
                data, single = whole, True
        # (mypy cannot narrow through ``single``: there, data is one buffer)
        written = [len(memoryview(data).cast("B"))] if single else [0]  # type: ignore[arg-type]
        part = _part_bytes(written[0] if single else size, self.options)
        failed: list[BaseException] = []  # the caller's own error while making the data
        if not single:
            data = _watched(data, failed, written, MAX_PARTS * part, self.url(key))
        started = time.monotonic()
        try:
            result = self._obstore.put(self._client, key, data, mode="overwrite", chunk_size=part,
                                       max_concurrency=self.options.concurrency)
        except Exception as e:
            if failed:
                raise failed[0] from None  # the upload was aborted: nothing is visible
            raise self._write_failed(key, e, started) from None
        return ObjectInfo(key, written[0], self._put_tag(result))

    def _put_conditional(self, key: str, data: bytes, mode: str | Version) -> ObjectInfo:
        """One object put under a condition, retried (when the client would not) and checked so
        that what it reports is what happened (see the module's documentation)."""
        started, tries = time.monotonic(), 0
        exceptions = self._obstore.exceptions
        while True:
            tries += 1
            try:
                result = self._obstore.put(self._client, key, data, mode=self._condition(key, mode))
                return ObjectInfo(key, len(data), self._put_tag(result))
            except Exception as e:
                error: BaseException = e
            in_progress = _IN_PROGRESS.search(str(error)) is not None
            refused = not in_progress and isinstance(error, (Conflict, exceptions.AlreadyExistsError,
                                                             exceptions.PreconditionError))
            answered = refused or _ANSWERED in str(error)
            client_retries = _client_retries(error)
            if tries > 1 or client_retries or not answered:  # an earlier try of this put may have landed
                mine = self._holding(key, data, error, started, tries)
                if mine is not None:
                    return mine
            if refused:
                raise error if isinstance(error, Conflict) else self._conflict(key, mode) from None
            if in_progress:
                if not client_retries and self._within_bounds(tries, started):  # (the client retries an If-Match)
                    time.sleep(_pause(tries, started, self.options))
                    continue
                raise self._still_in_progress(key, error, started, tries) from None
            if _NOT_IMPLEMENTED.search(str(error)):
                raise self._no_conditional_writes(key, error, started, tries) from None
            if not self._again(error, tries, started):
                raise self._write_failed(key, error, started, tries) from None
            time.sleep(_pause(tries, started, self.options))

    def _no_conditional_writes(self, key: str, error: BaseException, started: float, tries: int) -> PskdError:
        return StorageError(f"{self.url(key)}: cannot write it: the store does not implement conditional writes "
                            f"(If-None-Match, If-Match: 501 Not Implemented), which an index (checkpoints.json, "
                            f"shards.json) is committed with; nothing was written: use a store that takes them "
                            f"({_tried(error, started, tries, self.options)}: {_client_words(error, self.options)})")

    def _condition(self, key: str, mode: str | Version) -> Any:
        """The client's ``mode`` for a conditional put. GCS matches a generation, not an ETag: the
        object's generation is looked up, and a tag that no longer matches is a conflict."""
        if mode == CREATE:
            return "create"
        assert isinstance(mode, Version)
        if self.scheme != "gs":
            return {"e_tag": mode.tag}
        try:
            meta = self._obstore.head(self._client, key)
        except FileNotFoundError:
            raise Conflict(self.url(key), "the object read before is gone") from None
        if self._tag(meta) != mode.tag or not meta.get("version"):
            raise Conflict(self.url(key), "the object there changed since it was read")
        return {"e_tag": meta.get("e_tag"), "version": meta["version"]}

    def _conflict(self, key: str, mode: str | Version) -> Conflict:
        if mode == CREATE:
            return Conflict(self.url(key), "an object is there already")
        return Conflict(self.url(key), "the object there changed since it was read")

    def _holding(self, key: str, data: bytes, error: BaseException, started: float, tries: int
                 ) -> ObjectInfo | None:
        """The object at ``key`` when it holds exactly ``data`` (a try of this put landed and its
        answer was lost), else None; E9018 when the store cannot be asked."""
        try:
            meta = self._obstore.head(self._client, key)
            if int(meta["size"]) != len(data):
                return None
            result = self._obstore.get(self._client, key)
            found = result.bytes()
        except FileNotFoundError:
            return None
        except Exception as check:
            raise StorageError(f"{self.url(key)}: cannot write it: {_tried(error, started, tries, self.options)}: "
                               f"{type(error).__name__}: {_client_words(error, self.options)}; whether a try landed "
                               f"is unknown: reading the object back failed too: {_client_words(check, self.options)}"
                               ) from None
        return self._info(key, result.meta) if memoryview(found) == memoryview(data) else None

    def _still_in_progress(self, key: str, error: BaseException, started: float, tries: int) -> PskdError:
        return StorageError(f"{self.url(key)}: cannot write it: the store kept answering 409 Conflict (another write "
                            f"or delete of the object in progress), not whether the put's condition holds: "
                            f"{_tried(error, started, tries, self.options)}; this put wrote nothing: try again")

    def _write_failed(self, key: str, error: BaseException, started: float, tries: int = 1) -> PskdError:
        if isinstance(error, FileNotFoundError) and _NO_BUCKET not in str(error):
            return StorageError(f"{self.url(key)}: cannot write it: the store answered 'not found' (no bucket "
                                f"{self.bucket!r}, or an upload it no longer knows): "
                                f"{_client_words(error, self.options)}")
        return self._failed(key, "write it", error, started, tries)

    def delete(self, key: str) -> None:
        # S3's delete is a POST, which the client does not retry when its connection drops (it
        # cannot know the server did not act); deleting twice is harmless, so it is retried here.
        if not key:  # (the bucket itself: no object is there to delete)
            return
        started, tries = time.monotonic(), 0
        while True:
            tries += 1
            try:
                self._obstore.delete(self._client, key)
                return
            except FileNotFoundError:
                return
            except Exception as e:
                if not self._again(e, tries, started):
                    raise self._failed(key, "delete it", e, started, tries) from None
            time.sleep(_pause(tries, started, self.options))

    def _again(self, error: BaseException, tries: int, started: float) -> bool:
        """Whether this store tries a request again itself: when its connection dropped before an
        answer and the client, having not retried it, left that to the caller."""
        return _ANSWERED not in str(error) and not _client_retries(error) and self._within_bounds(tries, started)

    def _within_bounds(self, tries: int, started: float) -> bool:
        """Whether another try stays within the options' retries and seconds."""
        return tries <= self.options.retries and time.monotonic() - started < self.options.retry_seconds

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = prefix.rstrip("/")
        started = time.monotonic()
        try:
            listed = self._obstore.list_with_delimiter(self._client, base + "/" if base else None)
        except Exception as e:
            raise self._failed(prefix, "list it", e, started) from None
        return sorted((self._info(meta["path"], meta) for meta in listed["objects"]), key=lambda o: o.key)

    # -- version tags ------------------------------------------------------------------------------

    def _tag(self, meta: Any) -> str:
        """The version tag of an object the client described (a head, a get, a listing or a put's
        answer): its ETag. GCS quotes ETags in some answers and not in others (listings), so its
        tags are unquoted, and the same object has the same tag whichever way it was seen."""
        tag = meta.get("e_tag") or meta.get("version")
        if not tag:
            return f"{meta.get('last_modified')}-{meta.get('size')}"
        tag = str(tag)
        return tag.strip('"') if self.scheme == "gs" else tag

    def _put_tag(self, answer: Any) -> str:
        """The version tag a put was answered with; "" when the store gave none (a put's answer has
        no modification time to stand in for it, and a made-up tag would never match a read's)."""
        return self._tag(answer) if answer.get("e_tag") or answer.get("version") else ""

    def _info(self, key: str, meta: Any) -> ObjectInfo:
        return ObjectInfo(str(meta.get("path", key)), int(meta["size"]), self._tag(meta))


def _bytes(piece: Buffer) -> bytes:
    return piece if isinstance(piece, bytes) else bytes(memoryview(piece).cast("B"))


def _part_bytes(size: int | None, options: StorageOptions) -> int:
    """The part size of an upload of ``size`` bytes (None: not known): ``part_bytes``, at least
    S3's smallest part, and large enough that the object fits in :data:`MAX_PARTS` parts."""
    part = max(options.part_bytes, MIN_PART)
    return part if size is None else max(part, -(-int(size) // MAX_PARTS))


def _within_one_part(pieces: Iterable[Buffer], part: int) -> tuple[Iterable[Buffer], bytes | None]:
    """The caller's pieces, and their bytes joined when they fit in one part (else None: the
    pieces read so far chained before the rest, for a multipart upload). An error of the caller's
    while they are read here is raised before any request is made."""
    pieces = iter(pieces)
    kept: list[Buffer] = []
    held = 0
    for piece in pieces:
        kept.append(piece)
        held += len(memoryview(piece).cast("B"))
        if held > part:
            return itertools.chain(kept, pieces), None
    return kept, b"".join(_bytes(piece) for piece in kept)


def _watched(pieces: Iterable[Buffer], failed: list[BaseException], size: list[int], most: int, url: str
             ) -> Iterator[Buffer]:
    """The caller's pieces, counted into ``size[0]``, with the error that stops them kept for the
    caller; E9018 once they pass ``most`` bytes (more parts than an upload takes)."""
    try:
        for piece in pieces:
            size[0] += len(memoryview(piece).cast("B"))
            if size[0] > most:
                raise StorageError(f"{url}: cannot write it: more than {most} bytes, {MAX_PARTS} parts of "
                                   f"{most // MAX_PARTS}, the most one upload takes; give a larger part_bytes "
                                   "(StorageOptions) for objects this large")
            yield piece
    except BaseException as e:
        failed.append(e)
        raise


def _client_retries(error: BaseException) -> int:
    """How many times the client says it tried the request again (0 when it does not say)."""
    found = _RETRIED.search(str(error))
    return int(found.group(1)) if found else 0


def _tried(error: BaseException, started: float, tries: int, options: StorageOptions) -> str:
    """What was tried, in words: how many requests (when the client says) and for how long."""
    seconds = time.monotonic() - started
    words = str(error)
    if _RETRIED.search(words) or "Error performing" in words:  # the client's account of its retries
        count = tries + _client_retries(error)
        done = f"{counted(count, 'try', 'tries')} in {seconds:.1f} s"
    else:
        done = f"given up after {seconds:.1f} s"
    return f"{done} (at most {options.retries} retries within {options.retry_seconds:g} s)"


def _client_words(error: BaseException, options: StorageOptions) -> str:
    """The client's message on one line, without its debugging dump, credentials removed."""
    words = " ".join(str(error).split()).split(" Debug source:")[0]
    words = redact(words, options)
    return words if len(words) <= 400 else words[:399] + "…"


def _pause(tries: int, started: float, options: StorageOptions) -> float:
    """The backoff before this store's own next try: doubling from ``backoff_seconds``, at most 5 s
    and never past ``retry_seconds``."""
    left = options.retry_seconds - (time.monotonic() - started)
    return max(0.0, min(options.backoff_seconds * 2 ** (tries - 1), 5.0, left))


__all__ = ["ObjectStore"]
