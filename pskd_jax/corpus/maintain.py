"""Looking after a corpus: verifying its shards, describing it, merging manifests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import hashlib
import io
import os
import stat
from collections.abc import Callable

import numpy as np

from pskd_jax._os.digests import BLOCK
from pskd_jax._os.files import _kind as file_kind
from pskd_jax._os.positional import read_into
from pskd_jax.corpus.manifest import Manifest, Shard, read_manifest
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import CorpusDirectoryError, PskdError, ShardMismatchError
from pskd_jax.format.header import VERSION_F64, Header, read_header


class ShardProblem(Exception):
    """What is wrong with one shard file, as a phrase (the caller names the shard)."""


def open_shard(path: str) -> int:
    """A read-only descriptor of the shard file at ``path``, without blocking: a FIFO, a device,
    a socket or a directory there is a :class:`ShardProblem`, as is a file that cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        what = "missing" if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP) else "unreadable"
        raise ShardProblem(f"{what} ({e.strerror or e})") from e
    except ValueError:  # a NUL byte (the manifest refuses one; a caller's path may hold it)
        raise ShardProblem("unreadable (a path holds no NUL byte)") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ShardProblem(f"{file_kind(mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def shard_header(fd: int, size: int, path: str) -> Header:
    """The ``.psk.d`` header of an open shard (a :class:`ShardProblem` if it is none)."""
    try:
        return read_header(io.FileIO(fd, "rb", closefd=False), path, size)
    except OSError as e:
        raise ShardProblem(f"unreadable ({e.strerror or e})") from e
    except PskdError as e:
        raise ShardProblem(f"not a shard ({e.message})") from None


def header_problem(header: Header, size: int, shard: Shard, tokenizer: Tokenizer) -> str | None:
    """What is wrong with a shard's header and size against its entry: its version (a shard is
    written with version 1, as its one leaf is an idx), type, count, and size (no trailing bytes)."""
    if header.type_text != tokenizer.sample_type:
        return f"type {header.type_text!r}, expected {tokenizer.sample_type!r}"
    if header.version != VERSION_F64:
        return (f"a version {header.version} header; a shard of type {tokenizer.sample_type!r} is written with "
                f"version {VERSION_F64}, which readers of the corpus expect")
    if header.count != shard.tokens:
        return f"header count {header.count}, the manifest records {shard.tokens} tokens"
    expected = header.data_offset + shard.tokens * tokenizer.dtype.itemsize
    if size < expected:
        return f"truncated: {size} bytes, {expected} needed for {shard.tokens} tokens"
    if size > expected:
        return f"{size - expected} bytes after its {shard.tokens} tokens ({size} bytes, {expected} expected)"
    return None


def content_problem(fd: int, path: str, header: Header, shard: Shard, tokenizer: Tokenizer) -> str | None:
    """Reads the whole shard once, in blocks, and checks in that one pass its sha256, that every
    token is below the vocabulary size, and that its boundary tokens number its ``documents``.

    Reading (``preadv``), hashing and the numpy reductions all release the GIL, so shards scan in
    parallel on threads."""
    digest = hashlib.sha256()
    dtype, bound, boundary = tokenizer.dtype, tokenizer.vocab_size, tokenizer.boundary
    item = dtype.itemsize
    end = header.data_offset + shard.tokens * item
    buffer = np.empty(max(item, min(BLOCK, end)), np.uint8)
    view = buffer.data
    checks_bound = bound < 1 << (8 * item)  # idx[256] in u8 holds no value at or above its bound
    first_bad: tuple[int, int] | None = None  # (token position, value)
    boundaries = 0
    try:
        read_into(fd, view[: header.data_offset], 0, path)
        digest.update(view[: header.data_offset])
        position = header.data_offset
        while position < end:
            n = min(len(buffer), end - position)
            read_into(fd, view[:n], position, path)
            digest.update(view[:n])
            tokens = buffer[:n].view(dtype)
            if checks_bound and first_bad is None and tokens.max() >= bound:
                at = int(np.argmax(tokens >= bound))
                first_bad = ((position - header.data_offset) // item + at, int(tokens[at]))
            boundaries += int(np.count_nonzero(tokens == boundary))
            position += n
    except PskdError as e:
        return f"unreadable ({e.message})"
    found = digest.hexdigest()
    if found != shard.sha256:
        return f"sha256 {found}, the manifest records {shard.sha256}"
    if first_bad is not None:
        return (f"token {first_bad[0]} is {first_bad[1]}, not below the vocabulary size {bound} (its sha256 matches "
                "the manifest: the damage predates the manifest)")
    if boundaries != shard.documents:
        return (f"{boundaries} boundary tokens ({boundary}), but the manifest records {shard.documents} documents, "
                "and every document ends with one")
    return None


def shard_problem(path: str, shard: Shard, tokenizer: Tokenizer, *, digest: bool = True) -> str | None:
    """What is wrong with the shard file at ``path`` against its entry, or None when it matches:
    a regular file, its header (version, type, count), its size (no trailing bytes), and with
    ``digest`` its content (:func:`content_problem`: sha256, tokens below the vocabulary size,
    boundary tokens equal to ``documents``)."""
    try:
        fd = open_shard(path)
    except ShardProblem as e:
        return str(e)
    try:
        size = os.fstat(fd).st_size
        header = shard_header(fd, size, path)
        problem = header_problem(header, size, shard, tokenizer)
        if problem is None and digest:
            problem = content_problem(fd, path, header, shard, tokenizer)
        return problem
    except ShardProblem as e:
        return str(e)
    finally:
        os.close(fd)


def check_shards(manifest: Manifest, check: Callable[[int], str | None], workers: int | None) -> None:
    """Runs ``check(i)`` for every shard of ``manifest`` (``workers`` threads, default the CPUs);
    E9017 naming the first failing shard, and how many others fail."""
    count = len(manifest.shards)
    workers = max(1, workers or os.cpu_count() or 1)
    if workers == 1 or count <= 1:
        problems = [check(i) for i in range(count)]
    else:
        with concurrent.futures.ThreadPoolExecutor(min(workers, count)) as pool:
            problems = list(pool.map(check, range(count)))
    bad = [i for i, p in enumerate(problems) if p is not None]
    if bad:
        i = bad[0]
        others = f" (and {len(bad) - 1} more failing shard{'s' if len(bad) > 2 else ''}: " + ", ".join(
            manifest.shards[j].path for j in bad[1:6]) + (", …" if len(bad) > 6 else "") + ")" if len(bad) > 1 else ""
        raise ShardMismatchError(f"{manifest.path}: shard {i} {manifest.shards[i].path}: {problems[i]}{others}")


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    manifest: Manifest
    shards: int
    tokens: int
    bytes: int


def check_tokenizer(manifest: Manifest, expected: Tokenizer | str | os.PathLike | None) -> None:
    """Refuses (E9016, naming both) a corpus built with another tokenizer than ``expected``: a
    :class:`Tokenizer`, or the path of a ``tokenizer.json`` or character vocabulary. The same
    tokenizer is the same kind and, for chars, the same vocabulary, for a tokenizer.json the same
    file contents (sha256), wherever it lies; the boundary is the manifest's."""
    if expected is None:
        return
    if not isinstance(expected, Tokenizer):
        expected = Tokenizer.from_file(expected)
    if not manifest.tokenizer.matches(expected):
        raise CorpusDirectoryError(f"{manifest.path}: built with another tokenizer ({manifest.tokenizer.describe()}) "
                                   f"than the one given ({expected.describe()}); its ids mean other tokens")


def verify_corpus(manifest_path: str | os.PathLike, *, workers: int | None = None,
                  tokenizer: Tokenizer | str | os.PathLike | None = None) -> VerifyResult:
    """Checks every shard against the manifest (``workers`` threads, default the CPUs): a regular
    file, its header and size, and in one read of each file its sha256, every token below the
    vocabulary size, and its boundary tokens equal to its documents. E9017 naming the first bad
    shard. The manifest of a build still in progress verifies (it lists finished shards only):
    ``result.manifest.complete`` says whether it is one. With ``tokenizer``, a corpus built with
    another is refused first (:func:`check_tokenizer`)."""
    manifest = read_manifest(manifest_path)
    check_tokenizer(manifest, tokenizer)
    paths = [manifest.shard_path(i) for i in range(len(manifest.shards))]
    check_shards(manifest, lambda i: shard_problem(paths[i], manifest.shards[i], manifest.tokenizer), workers)
    header = len(manifest.tokenizer.header(0))
    size = sum(header + s.tokens * manifest.tokenizer.dtype.itemsize for s in manifest.shards)
    return VerifyResult(manifest, len(paths), manifest.tokens, size)


def info_lines(manifest_path: str | os.PathLike, *, shards: bool = False) -> list[str]:
    """``pskd corpus info``: shards, tokens, documents, the boundary's share, tokens per document.

    Read from the manifest alone (no shard is opened); ``shards`` adds one line per shard.
    """
    m = read_manifest(manifest_path)
    t = m.tokenizer
    tokens, documents = m.tokens, m.documents
    what = {"bytes": "bytes", "chars": f"chars ({t.size} characters)"}.get(t.kind) \
        or f"tokenizer.json {t.path} ({t.size} ids, sha256 {t.sha256})"
    lines = [
        f"corpus     {m.path}",
        f"tokenizer  {what}; a vocabulary of {t.vocab_size} tokens with boundary {t.boundary}; type {t.sample_type}",
        f"shards     {len(m.shards)}",
        f"tokens     {tokens}",
        f"documents  {documents}",
        f"boundary   {documents / tokens:.4%} of tokens" if tokens else "boundary   -",
        f"per doc    {(tokens - documents) / documents:.1f} tokens on average, boundary excluded"
        if documents else "per doc    -",
    ]
    skipped = sum(s.skipped for s in m.shards)
    if skipped:
        lines.append(f"skipped    {skipped} bad documents (built with --skip-bad)")
    if not m.complete:
        lines.append(f"building   {len(m.shards)} of {m.planned_shards} shards listed: a build is in progress (or "
                     "was interrupted; run it again to finish it)")
    if shards:
        lines += [f"[{i}] {s.path}  {s.tokens} tokens  {s.documents} documents  sha256 {s.sha256[:16]}…"
                  for i, s in enumerate(m.shards)]
    return lines


__all__ = ["ShardProblem", "VerifyResult", "check_shards", "check_tokenizer", "content_problem", "header_problem",
           "info_lines", "open_shard", "shard_header", "shard_problem", "verify_corpus"]
