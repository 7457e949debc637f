"""Storage: the one place where the bytes of checkpoints and corpora are read and written.

Local files keep every guarantee they had (atomic replace, regular files only, locks); object
stores (``s3://``, ``gs://``, and ``memory://`` for tests) sit beside them behind the same small
:class:`Store` interface, through the optional client extra (``pip install 'pskd_jax[storage]'``).
Nothing above this layer needs to know which it has. See ``docs/storage.md``.

>>> store, where = resolve("memory://doc/a/b.bin")
>>> info = store.put(where.key, b"hello")
>>> store.read_ranges(where.key, [1], [4])[0].to_bytes()
b'ell'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import BinaryIO

from pskd_jax._os import files, names
from pskd_jax._os.atomic import text_output
from pskd_jax.errors import PskdError, StorageError
from pskd_jax.storage.base import (
    CREATE,
    OVERWRITE,
    Changed,
    Conflict,
    ObjectInfo,
    Store,
    Version,
    merged_ranges,
    object_digest,
    read_all,
)
from pskd_jax.storage.config import DEFAULT_OPTIONS, EXTRA, StorageOptions, redact
from pskd_jax.storage.local import LOCAL, LocalStore
from pskd_jax.storage.objects import ObjectStore  # (the client itself is imported on first use)
from pskd_jax.storage.urls import OBJECT_SCHEMES, SCHEMES, Location, is_object_url, is_url, locate

_STORES: dict[tuple[str, str, StorageOptions], Store] = {}
_STORES_LOCK = threading.Lock()
KEPT_STORES = 32  # the clients kept for reuse (the most recently made); one dropped lives while it is used


def store_for(where: Location, options: StorageOptions | None = None) -> Store:
    """The store that holds ``where``: the local file system, or a client of its bucket (made once a
    bucket and options value, then shared; the last :data:`KEPT_STORES` are kept)."""
    if where.is_local:
        return LOCAL
    options = options or DEFAULT_OPTIONS
    key = (where.scheme, where.bucket, options)  # (by value: equal options made afresh share a client)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            try:
                store = ObjectStore(where.scheme, where.bucket, options)
            except StorageError as e:  # (no client installed): the message names what was asked for
                if where.url in e.message:
                    raise
                raise StorageError(f"{where.url}: {e.message}") from None
            while len(_STORES) >= KEPT_STORES:
                del _STORES[next(iter(_STORES))]  # (the oldest: its threads end once nothing uses it)
            _STORES[key] = store
        return store


def resolve(place: str | os.PathLike[str] | Location, options: StorageOptions | None = None
            ) -> tuple[Store, Location]:
    """The store and location of a path or URL (E9018 for a URL the toolkit cannot serve, or an
    object URL without the client installed)."""
    where = locate(place)
    return store_for(where, options), where


@contextlib.contextmanager
def whole_output(place: str | os.PathLike[str] | Location, *, durable: bool = True,
                 options: StorageOptions | None = None) -> Iterator[BinaryIO]:
    """A binary file whose bytes become ``place`` once the ``with`` ends without an error: a local
    file replaced atomically (``-``: the standard output), or an object put whole. An error midway
    leaves ``place`` as it was; a URL the toolkit cannot serve (or an object URL without the
    client) is E9018 before anything is written."""
    if not isinstance(place, Location) and os.fspath(place) == names.STANDARD_STREAM:
        with text_output(names.STANDARD_STREAM, durable=durable) as f:
            yield f
        return
    store, where = resolve(place, options)
    if where.is_local:
        with text_output(where.path, durable=durable) as f:
            yield f
        return
    with tempfile.TemporaryFile() as spool:
        yield spool
        spool.flush()
        size = spool.seek(0, os.SEEK_END)
        spool.seek(0)
        store.put(where.key, iter(lambda: spool.read(8 << 20), b""), size=size)


def _after_fork_in_child() -> None:
    global _STORES_LOCK
    _STORES_LOCK = threading.Lock()
    _STORES.clear()  # a client's connections and threads do not survive a fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def input_descriptor(url: str, error: type[PskdError], what: str = "") -> int:
    """A read-only descriptor of the bytes a URL names, for the readers of local files (token,
    value and vocabulary files, a tokenizer, a layout file): a ``file://`` URL's file itself, an
    object streamed into an anonymous temporary file. E9018 for a URL the toolkit cannot serve;
    ``error`` naming the URL when no object is there."""
    store, where = resolve(url)
    if where.is_local:
        return files.open_fd(where.path, error, what)
    if store.info(where.key) is None:
        raise error(f"{url}: cannot read{f' {what}' if what else ''}: no such object")
    with tempfile.TemporaryFile() as copy:
        for chunk in store.chunks(where.key):
            copy.write(chunk)
        copy.flush()
        fd = os.dup(copy.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


files.url_descriptor = input_descriptor  # (how pskd_jax._os.files reads a URL it is given: see there)


__all__ = [
    "CREATE",
    "DEFAULT_OPTIONS",
    "EXTRA",
    "LOCAL",
    "OBJECT_SCHEMES",
    "OVERWRITE",
    "SCHEMES",
    "Changed",
    "Conflict",
    "LocalStore",
    "Location",
    "ObjectInfo",
    "ObjectStore",
    "StorageOptions",
    "Store",
    "Version",
    "input_descriptor",
    "is_object_url",
    "is_url",
    "locate",
    "merged_ranges",
    "object_digest",
    "read_all",
    "redact",
    "resolve",
    "store_for",
    "whole_output",
]
