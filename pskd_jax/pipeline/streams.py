"""What a pipeline's ``stream "…"`` holds, without reading its data: how many samples, of which type.

A ``.psk.d`` file answers from its header. A corpus manifest (``shards.json``) answers from the
token counts it lists, given the window length (and stride) that cut it into windows, as
:class:`pskd_jax.corpus.CorpusWindows` cuts them: no shard is opened. The manifest is checked
by the one parser every reader of it uses (:mod:`pskd_jax.data.corpus_manifest`: its fields and
its shard paths), so that what the Loader refuses is refused here in the same words; opening
the corpus itself (tokenizer, shards and their checks) is the corpus package's job.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from pskd_jax._os import names
from pskd_jax._os.checks import checked_integer
from pskd_jax._os.files import open_regular
from pskd_jax._os.jsonfile import loads_strict, read_strict
from pskd_jax.data.corpus_manifest import check_corpus_format, parse_record, shard_places
from pskd_jax.data.windows import lm_window_count, window_type
from pskd_jax.errors import CorpusDirectoryError, PipelineError, PskdError, UsageError
from pskd_jax.format.header import MAX_COUNT
from pskd_jax.format.reader import Reader
from pskd_jax.pipeline.batches import Pipeline
from pskd_jax.pipeline.mixture import Mixture
from pskd_jax.storage import Location, locate, store_for

__all__ = ["StreamFacts", "check_stream_path", "check_streams", "is_corpus_manifest", "stream_facts",
           "stream_manifest", "stream_places"]


@dataclasses.dataclass(frozen=True)
class StreamFacts:
    """A stream's samples: ``count`` of ``sample_type``; ``corpus`` when they are windows cut from
    a corpus manifest (then ``seq`` and ``stride`` cut them)."""

    path: str
    count: int
    sample_type: str
    corpus: bool = False
    seq: int | None = None
    stride: int | None = None


_JSON_LEAD = 64  # the first bytes looked at: room for a byte-order mark and a few lines of white space


def _starts_like_json(head: bytes) -> bool:
    """Whether bytes start as a JSON object or list does (after a UTF-8 byte-order mark and white
    space, which a strict reader then names): a ``.psk.d`` file starts with ``PSKD``."""
    return head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def stream_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a stream's path holds, decided once for every reader of a pipeline's streams (the
    Loader, ``pskd pipeline``, ``train_lm``): None when it is to be read as a ``.psk.d`` file (it
    does not start like JSON; a local file that cannot be read, or an object that is not there,
    is None too, and the reader of a ``.psk.d`` file names what is wrong); else the manifest's
    JSON object, checked to say it is a corpus manifest (:func:`check_corpus_format`). A stream
    that starts like JSON but is not strict JSON, or is JSON but not a corpus manifest, is E9016
    naming it and what it is instead: a JSON file is never read as a ``.psk.d`` file ("bad
    magic"), nor called a corpus before it says it is one. A store that fails to answer (a fault
    that outlasts the retries, a refusal such as 403) is its E9018 naming the URL: the answer
    was not heard. A URL the toolkit cannot serve, or an object URL without the client, is E9018
    too."""
    name = os.fspath(path)
    where = locate(name)
    if not where.is_local:
        store = store_for(where)
        found = store.head(where.key, _JSON_LEAD)
        if found is None or not _starts_like_json(found[0]):
            return None
        return check_corpus_format(loads_strict(store.get(where.key)[0], name, CorpusDirectoryError,
                                                kind="a JSON manifest"), name)
    try:
        with open_regular(where.path, UsageError) as f:
            head = f.read(_JSON_LEAD)
    except (PskdError, OSError):
        return None
    if not _starts_like_json(head):
        return None
    return check_corpus_format(read_strict(name, CorpusDirectoryError, what="the corpus manifest",
                                           kind="a JSON manifest"), name)


def is_corpus_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether a stream's path is a corpus manifest (:func:`stream_manifest`, whose E9016 and
    E9018 it raises): False means it is read as a ``.psk.d`` file."""
    return stream_manifest(path) is not None


def check_stream_path(path: str, where: str = "") -> None:
    """E9010 naming a stream's path or URL when nothing stands there or a directory does (with the
    manifest to stream instead when it is a corpus directory, or a corpus's prefix in a store); a
    URL the toolkit cannot serve, or a bucket that is not there, is E9018."""
    location = locate(path)
    if not location.is_local:
        _check_stream_object(location, path, where)
        return
    local = location.path
    if os.path.isdir(local):
        manifest = os.path.join(path, names.CORPUS_MANIFEST)
        found = os.path.isfile(os.path.join(local, names.CORPUS_MANIFEST))
        hint = f": it is a corpus directory; stream its manifest \"{manifest}\"" if found else ""
        raise PipelineError(f"{where}the stream {path!r} is a directory, not a .psk.d file or a corpus manifest{hint}")
    if not os.path.lexists(local):
        raise PipelineError(f"{where}the stream {path!r} does not exist (a relative path is joined to the "
                            "pipeline file's directory, or to the loader's base_dir, default the current directory)")


def stream_places(pipeline: Pipeline | Mixture) -> tuple[tuple[str, str], ...]:
    """Each stream a pipeline (a :class:`~pskd_jax.pipeline.Pipeline` or a
    :class:`~pskd_jax.pipeline.Mixture`) names, as ``(path, place)``: the place starts every message
    about that stream, empty for a single stream, ``TEXT:2:5: source 1: `` for a mixture's source
    (its line and column in the text, and its index). Every reader of a text takes its places from
    here, so that one stream's messages say the same wherever the text is read."""
    if not isinstance(pipeline, Mixture):
        return ((pipeline.path, ""),)
    return tuple((source.path, f"{source.where + ': ' if source.where else ''}source {i}: ")
                 for i, source in enumerate(pipeline.sources))


def check_streams(pipeline: Pipeline | Mixture) -> None:
    """:func:`check_stream_path` of every stream of ``pipeline``, each named at its place
    (:func:`stream_places`): the check the Loader, ``pskd pipeline`` and ``train_lm`` make before
    opening anything."""
    for path, where in stream_places(pipeline):
        check_stream_path(path, where)


def _check_stream_object(location: Location, url: str, where: str) -> None:
    """E9010 when no object stands at a stream's URL, as for a local path: the reader that opens it
    would say E9002 'no such object' without the stream's place in the text, and a mix with
    ``segments=True`` would call it a .psk.d file. One ranged GET (a HEAD cannot tell a missing
    bucket from a missing object); a second only when the first finds nothing."""
    store = store_for(location)
    if store.head(location.key, 1) is not None:
        return
    manifest = location.child(names.CORPUS_MANIFEST)
    found = store.head(manifest.key, 1) is not None
    hint = f": it is a corpus's prefix; stream its manifest \"{manifest.url}\"" if found else ""
    raise PipelineError(f"{where}the stream {url!r} does not exist (no object at that key){hint}")


def stream_facts(path: str | os.PathLike[str], *, seq: int | None = None, stride: int | None = None) -> StreamFacts:
    """The samples ``path`` streams: a ``.psk.d`` file's count and type, or the number of windows
    of ``seq`` tokens (every ``stride`` tokens, default ``seq``) of a corpus manifest.

    A corpus needs ``seq`` (E9012 otherwise); a manifest that is not one, or whose fields or
    shard paths the Loader would refuse, is E9016 in the Loader's words
    (:func:`~pskd_jax.data.corpus_manifest.parse_record`, :func:`~pskd_jax.data.corpus_manifest.shard_places`),
    the manifest named as :class:`~pskd_jax.corpus.CorpusWindows` names it.
    """
    name = os.fspath(path)
    manifest = stream_manifest(name)
    if manifest is None:
        with Reader(name) as reader:
            return StreamFacts(name, reader.header.count, reader.header.type_text)
    if seq is None:
        raise UsageError(f"{name} is a corpus: give the window length (--seq T, or seq=)")
    # (the bounds CorpusWindows takes: positions in the stream are int64)
    seq = checked_integer(seq, "seq", low=1, high=MAX_COUNT)
    stride = seq if stride is None else checked_integer(stride, "stride", low=1, high=MAX_COUNT)
    where = locate(name)
    record = parse_record(manifest, where.path if where.is_local else where.url)  # (named as CorpusWindows names it)
    shard_places(record, where)
    return StreamFacts(name, lm_window_count(record.tokens, seq, stride), window_type(record.vocab_size, seq), True,
                       seq, stride)
