"""One shard of a corpus: an input file's documents in, a shard file and its manifest entry out.

:func:`build_shard` is the unit of work of every engine (the local pool, Apache Beam): a pure
function of its input and :class:`~pskd_jax.corpus.options.BuildOptions`. It joins the build's two
seams — :func:`pskd_jax.corpus.inputs.token_blocks`, the one place documents are read, and
:func:`write_shard_file`, the one place a shard's bytes are written — so a reader that reads ahead,
or a writer that hashes on another thread, replaces one of them only.

A shard whose place is an object of a store (``s3://…/shard-00000.psk.d``) is written to a
temporary local file and put whole (a multipart upload of bounded parts): the object appears
only complete, and a rerun puts the same bytes under the same name. A build into a store holds a
:class:`BuildClaim`, checked before each put: a build that another has taken over stops, E9016,
without writing.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from pskd_jax._os.digests import file_sha256
from pskd_jax.corpus.inputs import BadInput, ResetShard, source_of, token_blocks
from pskd_jax.corpus.manifest import Shard, manifest_object
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.errors import CorpusDirectoryError, PskdError, StorageError
from pskd_jax.storage import Location, locate, resolve


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What :func:`build_shard` made: the manifest entry and the first bad documents it left out."""

    entry: Shard
    examples: tuple[str, ...] = ()
    kept: bool = False  # reused from an earlier build rather than written
    input_bytes: int = 0
    tag: str | None = None  # a shard put to a store: the object's version tag, as the put left it


@dataclasses.dataclass(frozen=True)
class BuildClaim:
    """A build into a store holds the corpus while its ``shards.json`` (at ``manifest``, a URL)
    is a manifest in progress naming ``writer``: checked before each shard is put, so that a build
    another has taken over (a rerun started meanwhile) stops instead of overwriting its shards."""

    manifest: str
    writer: str

    def check(self, shard: str) -> None:
        """E9016 when the corpus's manifest is no longer this build's manifest in progress; E9018
        when the store does not let it be read (a worker without the store's credentials, a store
        that keeps failing): that says nothing of another build."""
        store, where = resolve(self.manifest)
        try:
            manifest, _ = manifest_object(store, where.key)
            holder = manifest.writer if not manifest.complete else "none: a finished corpus"
        except StorageError as e:
            raise StorageError(f"{e.message} (read to check this build's claim before this build puts {shard}; "
                               "a process that puts shards needs the store's configuration: its credentials and "
                               "endpoint)") from None
        except PskdError as e:  # gone (E9003), or no manifest now (E9016): not this build's
            holder = f"unknown: {e.message}"
        if holder != self.writer:
            raise CorpusDirectoryError(f"{self.manifest}: another build took this corpus over while this one ran (the "
                                       f"manifest's writer is {holder}, this build is {self.writer}); {shard} was not "
                                       "written and this build's shards are not listed: run one build of a corpus at "
                                       "a time")


@dataclasses.dataclass(frozen=True)
class WrittenShard:
    """What :func:`write_shard_file` wrote: tokens, documents and the file's sha256."""

    tokens: int
    documents: int
    sha256: str


def write_shard_file(shard_path: str, blocks: Iterable[tuple[np.ndarray, int]], options: BuildOptions
                     ) -> WrittenShard:
    """Writes the token ``blocks`` (``(tokens, documents)`` pairs, as :func:`token_blocks` yields
    them) into the shard at ``shard_path``: the one place a build writes a shard's bytes.

    A new shard is written in place, one that replaces a file beside it and renamed over it
    (:mod:`pskd_jax.corpus.shard_writer`), so a reader of the old file keeps its bytes. A
    :class:`ResetShard` from the blocks (a ``.txt`` document found bad under ``skip_bad``) empties
    the shard. On any error the new file is deleted (a file that stood at ``shard_path`` before
    stays as it was) and the error raised."""
    writer = ShardWriter(shard_path, options.tokenizer, chunk_tokens=options.chunk_tokens, durable=options.durable)
    documents = 0
    try:
        try:
            for tokens, docs in blocks:
                writer.append(tokens)
                documents += docs
        except ResetShard:
            writer.reset()
            documents = 0
        count = writer.close()
    except BaseException:
        writer.abort()
        raise
    return WrittenShard(count, documents, file_sha256(shard_path))


def build_shard(source: str, shard_path: str, options: BuildOptions | None = None, *,
                on_bytes: Callable[[int], None] | None = None, claim: BuildClaim | None = None) -> ShardResult:
    """Tokenizes the input ``source`` (a path, or an object's URL) into the shard ``shard_path`` (a
    path, or an object's URL); returns its entry.

    A pure function of the input and the options: the same input always gives the same bytes. The
    entry's ``path`` is the shard's file name (a manifest beside the shard lists it as is); its
    ``source`` identifies the input. Bad input (without ``skip_bad``) is raised, E9015, and the new
    file deleted (see :func:`write_shard_file`); an object is put only once its shard is whole.
    ``on_bytes`` hears how far into the input each block read ends; ``claim`` (a build into a
    store) is checked before the put."""
    options = BuildOptions.checked(options)
    identity = source_of(source)
    bad = BadInput(options.skip_bad)
    where = locate(shard_path)
    blocks = token_blocks(source, options, bad=bad, on_bytes=on_bytes)
    tag = None
    if where.is_local:
        written = write_shard_file(where.path, blocks, options)
    else:
        written, tag = put_shard(where, blocks, options, claim)
    entry = Shard(where.name, written.tokens, written.documents, written.sha256, bad.count, identity)
    return ShardResult(entry, tuple(bad.examples), False, identity["size"], tag)


def put_shard(where: Location, blocks: Iterable[tuple[np.ndarray, int]], options: BuildOptions,
              claim: BuildClaim | None = None) -> tuple[WrittenShard, str]:
    """Writes a shard into a temporary local file, then puts it whole at ``where`` (an object of
    a store), a part at a time; returns what was written and the object's version tag."""
    store, _ = resolve(where)
    with tempfile.TemporaryDirectory(prefix="pskd-shard.") as directory:
        local = os.path.join(directory, where.name)
        written = write_shard_file(local, blocks, options.replace(durable=False))  # the store makes it durable
        if claim is not None:
            claim.check(where.url)
        parts = _file_parts(local, getattr(store, "options", None))
        info = store.put(where.key, parts, size=os.path.getsize(local))
    return written, info.tag


def _file_parts(path: str, options: object) -> Iterator[bytes]:
    """A file in parts of the store's upload size (memory holds a part or a few, never the file)."""
    part = max(getattr(options, "part_bytes", 8 << 20), 5 << 20)
    with open(path, "rb") as f:
        while piece := f.read(part):
            yield piece


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Shard ``index`` of a local build: its input and its size, its file (or object), the entry an
    earlier build recorded for the same input and options (None when there is none to keep), and
    a build into a store's claim."""

    index: int
    source: str
    shard_path: str
    options: BuildOptions
    recorded: Shard | None = None
    size: int = 0
    claim: BuildClaim | None = None

    def run(self, on_bytes: Callable[[int], None]) -> ShardResult:
        """Builds the shard; ``on_bytes(n)`` hears each ``n`` more input bytes read."""
        done = 0

        def progress(position: int) -> None:
            nonlocal done
            on_bytes(position - done)
            done = position

        return build_shard(self.source, self.shard_path, self.options, on_bytes=progress, claim=self.claim)


__all__ = ["BuildClaim", "ShardResult", "ShardTask", "WrittenShard", "build_shard", "put_shard", "write_shard_file"]
