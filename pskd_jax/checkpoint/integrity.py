"""Checking a checkpoint against the digest recorded when it was written.
"""

from __future__ import annotations

import os

from pskd_jax._os.digests import DIGESTS, file_digest
from pskd_jax.errors import DigestMismatchError, UsageError

CHECKPOINT_DIGEST = "xxh3_128"  # the digest a checkpoint directory records (the faster one)


def digest_algorithm(digest: bool | str) -> str | None:
    """``save``'s ``digest``: False (none), True (sha256, as ``sha256sum`` prints it), or an
    algorithm of :data:`DIGESTS`."""
    if digest is False or digest is None:
        return None
    if digest is True:
        return "sha256"
    if digest not in DIGESTS:
        raise UsageError(f"digest={digest!r}: expected one of {sorted(DIGESTS)}, True (sha256) or False")
    return digest


def expected_digests(path: str, expected: dict[str, str | None]) -> dict[str, str]:
    """The digests a restore or a check was given, by algorithm, as lowercase hex."""
    out = {}
    for name, value in expected.items():
        if value is None:
            continue
        if name not in DIGESTS:
            raise UsageError(f"{path}: cannot check a {name} digest: expected one of {sorted(DIGESTS)}")
        if not isinstance(value, str):
            raise UsageError(f"{path}: the {name} digest must be a hex string, got {value!r}")
        out[name] = value.lower()
    return out


def check_digest(path: str, algorithm: str, found: str, expected: str) -> None:
    if found != expected.lower():
        raise DigestMismatchError(f"{path}: checkpoint digest mismatch: {algorithm} {found}, expected "
                                  f"{expected.lower()} "
                                  "(the file was changed or damaged after the digest was recorded)")


def verify_file(path: str | os.PathLike, sha256: str | None = None, *, xxh3_128: str | None = None) -> str:
    """Checks a whole file against its recorded digest, ``xxh3_128`` or ``sha256`` (hex; each
    given is checked); E9013 naming the file on a mismatch. Returns the algorithm checked (the
    first given, xxh3_128 before sha256)."""
    path = os.fspath(path)
    expected = expected_digests(path, {"xxh3_128": xxh3_128, "sha256": sha256})
    if not expected:
        raise UsageError(f"{path}: no digest to check against: give xxh3_128=HEX or sha256=HEX")
    for algorithm, hex_digest in expected.items():
        check_digest(path, algorithm, file_digest(path, algorithm), hex_digest)
    return next(iter(expected))


__all__ = ["CHECKPOINT_DIGEST", "check_digest", "digest_algorithm", "expected_digests", "verify_file"]
