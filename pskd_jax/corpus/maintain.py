"""Looking after a corpus: verifying its shards, describing it, merging manifests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Sequence
from pskd_jax.format.header import read_header
from pskd_jax.errors import CorpusDirectoryError, PskdError, ShardMismatchError, UsageError
from pskd_jax._os.digests import file_sha256
from pskd_jax._os.files import open_regular
from pskd_jax.corpus.lock import directory_lock
from pskd_jax.corpus.manifest import Manifest, Shard, read_manifest, write_manifest
from pskd_jax.corpus.tokenizer import Tokenizer


def shard_problem(path: str, shard: Shard, tokenizer: Tokenizer, *, digest: bool = True) -> str | None:
    """What is wrong with the shard file at ``path`` against its entry, or None when it matches:
    its type, header count, size (no trailing bytes), and (``digest``) its sha256."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        return f"missing ({e.strerror or e})"
    try:
        with open_regular(path, buffering=-1) as f:  # a FIFO or a device: refused, never waited on
            header = read_header(f, path, size)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    except PskdError as e:
        return f"not a shard ({e.message})"
    if header.type_text != tokenizer.sample_type:
        return f"type {header.type_text!r}, expected {tokenizer.sample_type!r}"
    if header.count != shard.tokens:
        return f"header count {header.count}, the manifest records {shard.tokens} tokens"
    expected = header.data_offset + shard.tokens * tokenizer.dtype.itemsize
    if size < expected:
        return f"truncated: {size} bytes, {expected} needed for {shard.tokens} tokens"
    if size > expected:
        return f"{size - expected} bytes after its {shard.tokens} tokens ({size} bytes, {expected} expected)"
    if digest:
        try:
            found = file_sha256(path)
        except PskdError as e:
            return f"unreadable ({e.message})"
        if found != shard.sha256:
            return f"sha256 {found}, the manifest records {shard.sha256}"
    return None

@dataclasses.dataclass(frozen=True)
class VerifyResult:
    manifest: Manifest
    shards: int
    tokens: int
    bytes: int

def verify_corpus(manifest_path: str | os.PathLike, *, workers: int | None = None) -> VerifyResult:
    """Hashes every shard (``workers`` threads: hashing and reading release the GIL) and checks
    its type, header count and size against the manifest; E9017 naming the first bad shard."""
    manifest = read_manifest(manifest_path)
    paths = [manifest.shard_path(i) for i in range(len(manifest.shards))]
    workers = max(1, workers or os.cpu_count() or 1)
    check = lambda i: shard_problem(paths[i], manifest.shards[i], manifest.tokenizer)  # noqa: E731
    if workers == 1 or len(paths) <= 1:
        problems = [check(i) for i in range(len(paths))]
    else:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(paths))) as pool:
            problems = list(pool.map(check, range(len(paths))))
    bad = [i for i, p in enumerate(problems) if p is not None]
    if bad:
        i = bad[0]
        others = f" (and {len(bad) - 1} more failing shard{'s' if len(bad) > 2 else ''}: " + ", ".join(
            manifest.shards[j].path for j in bad[1:6]) + (", …" if len(bad) > 6 else "") + ")" if len(bad) > 1 else ""
        raise ShardMismatchError(f"{manifest.path}: shard {i} {manifest.shards[i].path}: {problems[i]}{others}")
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
    what = "bytes" if t.kind == "bytes" else f"chars ({t.size} characters)"
    lines = [
        f"corpus     {m.path}",
        f"tokenizer  {what}; vocabulary {t.vocab_size} with boundary {t.boundary}; type {t.sample_type}",
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
    if shards:
        lines += [f"[{i}] {s.path}  {s.tokens} tokens  {s.documents} documents  sha256 {s.sha256[:16]}…"
                  for i, s in enumerate(m.shards)]
    return lines

def merge_manifests(manifests: Sequence[str | os.PathLike], output: str | os.PathLike) -> Manifest:
    """One manifest listing the shards of several, in the order given, written to ``output``.

    Every shard path is rewritten relative to ``output``'s directory, which must hold them all
    (E9016 otherwise), and every manifest must have the same tokenizer and build options. This is
    how corpora built apart (one process, machine or job per part) become one. A shard file listed
    twice (one manifest given twice, or two that list one file) is refused (E9016): its tokens
    would appear twice in the stream. The output is written atomically, holding the directory's
    build lock: a merge into a directory where a corpus build is running is refused (E9016).
    """
    if not manifests:
        raise UsageError("merge needs at least one manifest")
    output = os.fspath(output)
    root = os.path.dirname(os.path.abspath(output))
    first = read_manifest(manifests[0])
    shards: list[Shard] = []
    seen: dict[str, str] = {}  # a shard's real path → the manifest that listed it first
    for path in manifests:
        m = first if path is manifests[0] else read_manifest(path)
        if m.tokenizer != first.tokenizer:
            raise CorpusDirectoryError(f"{m.path}: its tokenizer ({_describe_tokenizer(m.tokenizer)}) differs from "
                            f"{first.path}'s ({_describe_tokenizer(first.tokenizer)}); only corpora of one "
                            "vocabulary merge")
        if m.build != first.build:
            differ = sorted(k for k in set(m.build) | set(first.build) if m.build.get(k) != first.build.get(k))
            raise CorpusDirectoryError(f"{m.path}: its build options differ from {first.path}'s ("
                            + ", ".join(f"{k} {m.build.get(k)!r} against {first.build.get(k)!r}" for k in differ)
                            + "); only corpora built alike merge")
        for i, shard in enumerate(m.shards):
            where = os.path.abspath(m.shard_path(i))
            real = os.path.realpath(where)
            if real in seen:
                raise CorpusDirectoryError(f"{m.path}: shard {i} {shard.path} is {real}, which {seen[real]} lists "
                                "already; a merged corpus lists each shard once")
            seen[real] = m.path
            relative = os.path.relpath(where, root)
            if relative.split(os.sep)[0] == "..":
                raise CorpusDirectoryError(f"{m.path}: shard {shard.path} lies outside {root}, the directory of "
                                f"{output}; put the merged manifest in a directory above every shard")
            shards.append(dataclasses.replace(shard, path=relative.replace(os.sep, "/")))
    with directory_lock(root):
        return write_manifest(output, first.tokenizer, shards, first.build)

def _describe_tokenizer(t: Tokenizer) -> str:
    if t.kind == "bytes":
        return f"bytes, vocabulary {t.vocab_size}"
    shown = "".join(t.vocab[:20])
    return f"chars, {t.size} characters {shown!r}{'…' if t.size > 20 else ''}, vocabulary {t.vocab_size}"
