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

from pskd_jax._os.checks import abridged, checked_integer, counted
from pskd_jax._os.files import _kind as file_kind
from pskd_jax._os.files import out_of_descriptors
from pskd_jax.corpus.manifest import Manifest, Shard, manifest_object, object_shard, read_manifest
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import CorpusDirectoryError, PskdError, ShardMismatchError, StorageError, UsageError
from pskd_jax.format.byte_sources import ByteSource, FileBytes, StoreBytes
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import VERSION_ENCODED, Header, read_header
from pskd_jax.storage import Location, StorageOptions, Store, locate, store_for


class ShardProblem(Exception):
    """What is wrong with one shard file, as a phrase (the caller names the shard)."""


def open_shard(path: str) -> int:
    """A read-only descriptor of the shard file at ``path``, without blocking: a FIFO, a device,
    a socket or a directory there is a :class:`ShardProblem`, as is a file that cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        what = "missing" if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP) else "unreadable"
        raise ShardProblem(f"{what} ({e.strerror or e}){out_of_descriptors(e)}") from e
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
    """What is wrong with a shard's header and size against its entry: its type, count and size (no
    trailing bytes). Both versions are read: a shard is written with version 1 (its one leaf is an
    idx), and a version 2 header is as good when it lists that leaf's encoding, byte 0."""
    if header.type_text != tokenizer.sample_type:
        return f"type {header.type_text!r}, expected {tokenizer.sample_type!r}"
    if header.version == VERSION_ENCODED and header.encodings != (Encoding.F64,):
        labels = " ".join(e.label for e in header.encodings or ())
        return (f"a version 2 header listing {len(header.encodings or ())} leaf encodings ({labels or 'none'}); a "
                "shard's one idx leaf carries encoding byte 0")
    if header.count != shard.tokens:
        return f"header count {header.count}, the manifest records {shard.tokens} tokens"
    expected = header.data_offset + shard.tokens * tokenizer.dtype.itemsize
    if size < expected:
        return f"truncated: {size} bytes, {expected} needed for {shard.tokens} tokens"
    if size > expected:
        return f"{size - expected} bytes after its {shard.tokens} tokens ({size} bytes, {expected} expected)"
    return None


def content_problem(source: ByteSource, path: str, header: Header, shard: Shard, tokenizer: Tokenizer) -> str | None:
    """Reads the whole shard once, in blocks (a file's positional reads, or an object's one
    streamed request), and checks in that one pass its sha256, that every token is below the
    vocabulary size, and that its boundary tokens number its ``documents``.

    Reading (``preadv``, the object-store client), hashing and the numpy reductions all release
    the GIL, so shards scan in parallel on threads."""
    digest = hashlib.sha256()
    dtype, bound, boundary = tokenizer.dtype, tokenizer.vocab_size, tokenizer.boundary
    item = dtype.itemsize
    start, end = header.data_offset, header.data_offset + shard.tokens * item
    checks_bound = bound < 1 << (8 * item)  # idx[256] in u8 holds no value at or above its bound
    first_bad: tuple[int, int] | None = None  # (token position, value)
    boundaries = 0
    carry = b""  # the bytes of a token cut by the end of a block
    seen = 0  # bytes hashed so far
    token = 0  # tokens scanned so far

    def scan(data: memoryview) -> None:
        nonlocal first_bad, boundaries, token
        if not len(data):
            return
        tokens = np.frombuffer(data, dtype)
        if checks_bound and first_bad is None and tokens.max() >= bound:
            at = int(np.argmax(tokens >= bound))
            first_bad = (token + at, int(tokens[at]))
        boundaries += int(np.count_nonzero(tokens == boundary))
        token += len(tokens)

    try:
        for block in source.blocks(end):
            digest.update(block)
            low, high = max(start, seen), min(end, seen + len(block))
            seen += len(block)
            if high <= low:
                continue
            data = block[low - (seen - len(block)) : high - (seen - len(block))]
            if carry:
                need = item - len(carry)
                carry += bytes(data[:need])
                data = data[need:]
                if len(carry) == item:
                    scan(memoryview(carry))
                    carry = b""
            whole = len(data) - len(data) % item
            scan(data[:whole])
            carry += bytes(data[whole:])
    except PskdError as e:
        return f"unreadable ({e.message})"
    if seen != end:
        return f"unreadable (read {seen} bytes, {end} expected)"
    found = digest.hexdigest()
    if found != shard.sha256:
        return f"sha256 {found}, the manifest records {shard.sha256}"
    if first_bad is not None:
        return (f"token {first_bad[0]} is {first_bad[1]}, not below the vocabulary size {bound} (its sha256 matches "
                "the manifest: the damage predates the manifest)")
    if boundaries != shard.documents:
        return (f"{counted(boundaries, 'boundary token')} ({boundary}), but the manifest records "
                f"{counted(shard.documents, 'document')}, "
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
    source = FileBytes(path, fd=fd)
    try:
        size = os.fstat(fd).st_size
        header = shard_header(fd, size, path)
        problem = header_problem(header, size, shard, tokenizer)
        if problem is None and digest:
            problem = content_problem(source, path, header, shard, tokenizer)
        return problem
    except ShardProblem as e:
        return str(e)
    finally:
        source.close()


def object_header(source: StoreBytes) -> Header:
    """The ``.psk.d`` header of a shard object (a :class:`ShardProblem` if it is none)."""
    try:
        return read_header(source.header_stream(), source.name, source.size())
    except PskdError as e:
        if isinstance(e, StorageError):
            raise
        raise ShardProblem(f"not a shard ({e.message})") from None


def object_shard_problem(store: Store, key: str, shard: Shard, tokenizer: Tokenizer, *,
                         digest: bool = True) -> str | None:
    """:func:`shard_problem` for a shard object of a store: its header and size (two requests),
    and with ``digest`` its content, streamed in one request. A store that keeps failing is
    E9018, raised (not a problem of the shard)."""
    try:
        source = StoreBytes(store, key, error=ShardMismatchError)
    except ShardMismatchError:
        return "missing (no such object)"
    try:
        header = object_header(source)
        problem = header_problem(header, source.size(), shard, tokenizer)
        if problem is None and digest:
            problem = content_problem(source, source.name, header, shard, tokenizer)
        return problem
    except ShardProblem as e:
        return str(e)
    finally:
        source.close()


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
        others = f" (and {counted(len(bad) - 1, 'more failing shard')}: " + ", ".join(
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
    if not isinstance(expected, (Tokenizer, str, os.PathLike)):
        raise UsageError(f"tokenizer={abridged(expected, 80)}: expected a Tokenizer, or the path of a tokenizer.json "
                         "or a VOCAB.json")
    if not isinstance(expected, Tokenizer):
        expected = Tokenizer.from_file(expected)
    if not manifest.tokenizer.matches(expected):
        raise CorpusDirectoryError(f"{manifest.path}: built with another tokenizer ({manifest.tokenizer.describe()}) "
                                   f"than the one given ({expected.describe()}); its ids mean other tokens")


def load_manifest(place: str | os.PathLike | Location, storage: StorageOptions | None = None) -> Manifest:
    """The manifest at a local path or in a store (``s3://…/shards.json``), checked (E9016; E9003
    for an object that is not there)."""
    where = locate(place)
    if where.is_local:
        return read_manifest(where.path)
    manifest, _ = manifest_object(store_for(where, storage), where.key)
    for i, shard in enumerate(manifest.shards):
        object_shard(where, shard.path, f"{manifest.path}: shard {i}")
    return manifest


OBJECT_WORKERS = 16  # shards of a store verified at once by default: requests wait on the network


def verify_corpus(manifest_path: str | os.PathLike, *, workers: int | None = None,
                  tokenizer: Tokenizer | str | os.PathLike | None = None,
                  storage: StorageOptions | None = None) -> VerifyResult:
    """Checks every shard against the manifest (``workers`` threads, default the CPUs, or 16 for
    a corpus in a store): a regular file (an object), its header and size, and in one read of each
    (a stream of one request for an object) its sha256, every token below the vocabulary size,
    and its boundary tokens equal to its documents. E9017 naming the first bad shard. The manifest
    of a build still in progress verifies (it lists finished shards only):
    ``result.manifest.complete`` says whether it is one. With ``tokenizer``, a corpus built with
    another is refused first (:func:`check_tokenizer`). ``manifest_path`` is a path or a URL
    (``s3://bucket/corpus/shards.json``, reached as ``storage`` says)."""
    workers = checked_integer(workers, "workers", low=1, none=True)  # before any file is read
    where = locate(manifest_path)
    manifest = load_manifest(where, storage)
    check_tokenizer(manifest, tokenizer)
    if where.is_local:
        paths = [manifest.shard_path(i) for i in range(len(manifest.shards))]
        check_shards(manifest, lambda i: shard_problem(paths[i], manifest.shards[i], manifest.tokenizer), workers)
    else:
        store = store_for(where, storage)
        keys = [object_shard(where, s.path, "").key for s in manifest.shards]
        check_shards(manifest, lambda i: object_shard_problem(store, keys[i], manifest.shards[i], manifest.tokenizer),
                     workers or OBJECT_WORKERS)
    header = len(manifest.tokenizer.header(0))
    size = sum(header + s.tokens * manifest.tokenizer.dtype.itemsize for s in manifest.shards)
    return VerifyResult(manifest, len(manifest.shards), manifest.tokens, size)


def info_lines(manifest_path: str | os.PathLike, *, shards: bool = False,
               storage: StorageOptions | None = None) -> list[str]:
    """``pskd corpus info``: shards, tokens, documents, the boundary's share, tokens per document.

    Read from the manifest alone (no shard is opened), a local file or an object; ``shards`` adds
    one line per shard.
    """
    m = load_manifest(manifest_path, storage)
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
        lines.append(f"skipped    {counted(skipped, 'bad document')} (built with --skip-bad)")
    if not m.complete:
        lines.append(f"building   {len(m.shards)} of {m.planned_shards} shards listed: a build is in progress (or "
                     "was interrupted; run it again to finish it)")
    if shards:
        lines += [f"[{i}] {s.path}  {counted(s.tokens, 'token')}  {counted(s.documents, 'document')}  "
                  f"sha256 {s.sha256[:16]}…" for i, s in enumerate(m.shards)]
    return lines


__all__ = ["ShardProblem", "VerifyResult", "check_shards", "check_tokenizer", "content_problem", "header_problem",
           "info_lines", "load_manifest", "object_header", "object_shard_problem", "open_shard", "shard_header",
           "shard_problem", "verify_corpus"]
