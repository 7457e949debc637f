"""One shard of a corpus: an input file's documents in, a shard file and its manifest entry out.

:func:`build_shard` is the unit of work of every engine (the local pool, Apache Beam): a pure
function of its input and :class:`~pskd_jax.corpus.options.BuildOptions`. It joins the build's two
seams — :func:`pskd_jax.corpus.inputs.token_blocks`, the one place documents are read, and
:func:`write_shard_file`, the one place a shard's bytes are written — so a reader that reads ahead,
or a writer that hashes on another thread or puts to another store, replaces one of them only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

import numpy as np

from pskd_jax._os.digests import file_sha256
from pskd_jax.corpus.inputs import BadInput, ResetShard, source_of, token_blocks
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_writer import ShardWriter


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What :func:`build_shard` made: the manifest entry and the first bad documents it left out."""

    entry: Shard
    examples: tuple[str, ...] = ()
    kept: bool = False  # reused from an earlier build rather than written
    input_bytes: int = 0


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
                on_bytes: Callable[[int], None] | None = None) -> ShardResult:
    """Tokenizes the input file ``source`` into the shard ``shard_path``; returns its entry.

    A pure function of the input and the options: the same input always gives the same bytes. The
    entry's ``path`` is the shard's file name (a manifest beside the shard lists it as is); its
    ``source`` identifies the input. Bad input (without ``skip_bad``) is raised, E9015, and the new
    file deleted (see :func:`write_shard_file`). ``on_bytes`` hears how far into the input each
    block read ends."""
    options = BuildOptions.checked(options)
    identity = source_of(source)
    bad = BadInput(options.skip_bad)
    written = write_shard_file(shard_path, token_blocks(source, options, bad=bad, on_bytes=on_bytes), options)
    entry = Shard(os.path.basename(shard_path), written.tokens, written.documents, written.sha256, bad.count, identity)
    return ShardResult(entry, tuple(bad.examples), False, identity["size"])


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Shard ``index`` of a local build: its input, its file, and the entry an earlier build
    recorded for the same input and options (None when there is none to keep)."""

    index: int
    source: str
    shard_path: str
    options: BuildOptions
    recorded: Shard | None = None

    def run(self, on_bytes: Callable[[int], None]) -> ShardResult:
        """Builds the shard; ``on_bytes(n)`` hears each ``n`` more input bytes read."""
        done = 0

        def progress(position: int) -> None:
            nonlocal done
            on_bytes(position - done)
            done = position

        return build_shard(self.source, self.shard_path, self.options, on_bytes=progress)


__all__ = ["ShardResult", "ShardTask", "WrittenShard", "build_shard", "write_shard_file"]
