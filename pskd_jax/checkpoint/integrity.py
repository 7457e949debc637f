"""Checking a checkpoint against the digest recorded when it was written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pskd_jax._os.checks import abridged
from pskd_jax._os.digests import DIGESTS, check_algorithm, file_digest
from pskd_jax.checkpoint.parts import PREFIX
from pskd_jax.checkpoint.stored import StoredFile
from pskd_jax.errors import DigestMismatchError, UsageError
from pskd_jax.format.layout_file import LayoutFile
from pskd_jax.storage import Location, locate, object_digest, store_for

CHECKPOINT_DIGEST = "xxh3_128"  # the digest a checkpoint directory records (the faster one)


def checked_digests(path: str, digests: Any) -> dict[str, str]:
    """The digests a restore or a check was given (a map of algorithm to hex, or None), as
    lowercase hex by algorithm in the order of :data:`DIGESTS` (xxh3_128 first); E9012 naming the
    file for anything else."""
    if digests is None:
        return {}
    if not isinstance(digests, Mapping):
        raise UsageError(f"{path}: digests={abridged(digests, 80)}: expected a map of algorithm to hex digest, "
                         f"such as {{'xxh3_128': HEX}}")
    for name, value in digests.items():
        if not isinstance(name, str) or name not in DIGESTS:
            raise UsageError(f"{path}: cannot check a {name} digest: expected one of {sorted(DIGESTS)}")
        if not isinstance(value, str):
            raise UsageError(f"{path}: the {name} digest must be a hex string, got {value!r}")
    return {name: digests[name].lower() for name in DIGESTS if name in digests}


def check_digest(path: str, algorithm: str, found: str, expected: str) -> None:
    if found != expected.lower():
        raise DigestMismatchError(f"{path}: checkpoint digest mismatch: {algorithm} {found}, expected "
                                  f"{expected.lower()} "
                                  "(the file was changed or damaged after the digest was recorded)")


def verify_data(path: str | os.PathLike, digests: Mapping[str, str]) -> str:
    """Checks a whole file's bytes (not its layout file: see
    :func:`pskd_jax.checkpoint.verification.verify_file`) against its recorded digests
    (``{"xxh3_128": HEX}``, ``{"sha256": HEX}`` or both: each given is checked); E9013 naming the
    file on a mismatch. Returns the algorithm checked (the first given, xxh3_128 before sha256)."""
    where = locate(path)
    path = where.path if where.is_local else where.url
    expected = checked_digests(path, digests)
    if not expected:
        raise UsageError(f"{path}: no digest to check against: give digests={{'xxh3_128': HEX}} or "
                         "{'sha256': HEX}")
    for algorithm, hex_digest in expected.items():
        check_digest(path, algorithm, digest_of(where, algorithm), hex_digest)
    return next(iter(expected))


def verify_bytes(path: str, data: bytes, digests: Mapping[str, str]) -> None:
    """Checks the bytes of a small file read whole (a layout file) against its recorded digests
    (each known algorithm given); E9013 naming the file on a mismatch."""
    for algorithm, hex_digest in checked_digests(path, digests).items():
        check_digest(path, algorithm, DIGESTS[algorithm](data).hexdigest(), hex_digest)


def digest_of(place: str | os.PathLike | Location, algorithm: str) -> str:
    """The digest of a whole file, or of a whole object of a store (streamed, never held whole)."""
    where = locate(place)
    if where.is_local:
        return file_digest(where.path, algorithm)
    check_algorithm(algorithm, where.url)
    store = store_for(where)
    found = store.head(where.key, len(PREFIX))
    if found is not None and found[0] == PREFIX:  # saved by several processes: the file its parts hold
        return StoredFile(where, store).digest(algorithm)
    return object_digest(store, where.key, algorithm)


def layout_xxh3(path: str, layout_file: LayoutFile, known: str | None) -> str | None:
    """The whole file's xxh3_128 to prove a layout file against: the one at hand (``known``), else
    computed only when the layout file records one to compare with."""
    if known is not None:
        return known
    recorded = (layout_file.identity or {}).get("xxh3_128")
    return digest_of(path, "xxh3_128") if recorded is not None else None


__all__ = ["CHECKPOINT_DIGEST", "check_digest", "checked_digests", "digest_of", "layout_xxh3", "verify_bytes",
           "verify_data"]
