"""What a :class:`~pskd_jax.loader.Loader` reads, from what its pipeline text streams.

``Loader(pipeline, seq=T)`` opens the ``.psk.d`` file, the corpus (its ``shards.json``, cut into
windows of ``seq`` tokens) or every source of a ``mix(…)`` that the text names, its relative
paths joined to ``base_dir`` (default: the current directory). A source passed with the text
(``Loader(source, pipeline)`` or ``source=``) is checked against it: the file it reads must be the
one the text streams, and a corpus's windows must be cut as asked (E9010 otherwise). A source with
no ``path`` (any object with ``len`` and ``gather``) is taken as the text's.

Before any batch is read the loader also refuses (E9010) what would fail later on its thread: a
batch the sharding's devices do not divide, and a batch larger than the machine's memory.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pskd_jax._os.files import same_place
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PipelineError, UsageError
from pskd_jax.format.reader import Reader
from pskd_jax.format.source import Source
from pskd_jax.loader.mixed import MixedBatches, MixedSource
from pskd_jax.pipeline.batches import Pipeline
from pskd_jax.pipeline.mixture import Mixture
from pskd_jax.pipeline.parse import load_pipeline, parse_pipeline
from pskd_jax.pipeline.streams import check_stream_path, check_streams, is_corpus_manifest, stream_places
from pskd_jax.storage.urls import is_url

__all__ = ["Opened", "WindowOptions", "check_batch_fits", "check_divides", "check_stream_path", "open_pipeline"]


@dataclasses.dataclass(frozen=True)
class WindowOptions:
    """How the sources the loader opens read: windows of a corpus (``seq``, ``stride``,
    ``segments``), and the access mode (None: each source's own default, a map for a local file
    and byte ranges for an object) and verification of every source."""

    seq: int | None = None
    stride: int | None = None
    segments: bool = False
    access: str | None = None
    verify: bool = False


@dataclasses.dataclass
class Opened:
    """The loader's source and the pipeline it walks (a mixture as :class:`MixedBatches`), and
    the sources it opened itself (closed with it)."""

    source: Any
    pipeline: Any
    owned: list[Any]
    text: Pipeline | Mixture


def as_pipeline(pipeline: Any, base_dir: str | os.PathLike[str] | None) -> Pipeline | Mixture:
    """A Pipeline or Mixture as given; text parsed with its paths joined to ``base_dir``; a path
    (``os.PathLike``) read as a pipeline file."""
    if isinstance(pipeline, (Pipeline, Mixture)):
        _check_no_base_dir(pipeline, base_dir)
        return pipeline
    if isinstance(pipeline, os.PathLike):
        return load_pipeline(pipeline, root=base_dir)
    if isinstance(pipeline, str):
        return parse_pipeline(pipeline, base_dir="." if base_dir is None else base_dir)
    raise UsageError(f"a loader's pipeline is its text, a pipeline file (a pathlib.Path), a Pipeline or a Mixture, "
                     f"got {type(pipeline).__name__}")


def _check_no_base_dir(pipeline: Pipeline | Mixture, base_dir: str | os.PathLike[str] | None) -> None:
    """E9012 for ``base_dir`` beside a Pipeline or Mixture holding a relative path: its paths are
    resolved already (by the parser), so the loader would open that path from the current
    directory, not from ``base_dir`` as a text's."""
    relative = [p for p, _ in stream_places(pipeline) if not is_url(p) and not os.path.isabs(p)]
    if base_dir is not None and relative:
        raise UsageError(f"base_dir={os.fspath(base_dir)!r} joins the paths of a pipeline's text, but {pipeline} is "
                         f"a {type(pipeline).__name__} whose paths are resolved already (its {relative[0]!r} is opened "
                         "as it is): pass the text, or parse it with parse_pipeline(text, base_dir=…)")


def _open_stream(path: str, options: WindowOptions, where: str) -> Any:
    """The source a stream's path names: windows of a corpus manifest, or a ``.psk.d`` Reader
    (a URL: a corpus when its object starts like JSON, as a local file; its reader says what else
    is wrong, and a URL the toolkit cannot serve is E9018); its path checked already
    (:func:`~pskd_jax.pipeline.streams.check_streams`)."""
    if is_corpus_manifest(path):
        if options.seq is None:
            raise UsageError(f"{where}{path} is a corpus: give the window length (Loader(…, seq=T))")
        return CorpusWindows(path, seq=options.seq, stride=options.stride, verify=options.verify,
                             access=options.access, segments=options.segments)
    if options.segments:
        raise UsageError(f"{where}segments=True needs a corpus (its manifest names the boundary token); {path} is "
                         "a .psk.d file")
    return Reader(path, access=options.access)


def _check_given(source: Any, path: str, options: WindowOptions, where: str) -> None:
    """E9010 when a source passed with the text is not what the text streams (cut as asked)."""
    given = getattr(source, "path", None)
    if not isinstance(given, (str, os.PathLike)):
        return  # (a source of its own kind: taken as the text's)
    if not same_place(given, path):
        raise PipelineError(f"{where}the text streams {path!r}, but the source given reads {os.fspath(given)!r}: "
                            "pass the source of that file, or no source (the loader then opens what the text names)")
    if isinstance(source, CorpusWindows):
        for name in ("seq", "stride"):
            asked = getattr(options, name)
            if asked is not None and asked != getattr(source, name):
                raise PipelineError(f"{where}{name}={asked} was asked, but the windows given are cut with "
                                    f"{name}={getattr(source, name)}")
        if options.segments and not source.segments:
            raise PipelineError(f"{where}segments=True was asked, but the windows given have none "
                                "(CorpusWindows(…, segments=True))")


def _check_cut_used(sources: list[Any], options: WindowOptions) -> None:
    """E9012 for ``seq`` or ``stride`` when every source is a ``.psk.d`` file: they cut a corpus's
    windows, and over samples cut already they would go unheeded."""
    if not all(isinstance(s, Reader) for s in sources):
        return
    for name in ("seq", "stride"):
        if getattr(options, name) is not None:
            raise UsageError(f"{name}= cuts a corpus's windows; {sources[0].path} is a .psk.d file of samples cut "
                             f"already (pass no {name}=)")


def _check_alike(text: Mixture, sources: list[Any]) -> None:
    """E9010 naming the first source whose samples differ from source 0's: another sample type,
    or windows with segments beside samples without."""
    types = [s.type_text if isinstance(s, CorpusWindows) else s.header.type_text if isinstance(s, Reader) else None
             for s in sources]
    if all(t is not None for t in types):
        text.check_sample_types([t for t in types if t is not None])
    segmented = [isinstance(s, CorpusWindows) and s.segments for s in sources]
    for i, flag in enumerate(segmented):
        if flag != segmented[0]:
            with_them = i if flag else 0
            raise PipelineError(f"{text.sources[i].where + ': ' if text.sources[i].where else ''}source {i} "
                                f"({text.sources[i].stream_text()}) {'has' if flag else 'has no'} segments, but "
                                f"source 0 {'has none' if flag else 'has'}: source {with_them}'s windows were opened "
                                "with segments=True; the sources of a mix give samples alike")


def open_pipeline(pipeline: Any, source: Source | Sequence[Source] | None, options: WindowOptions,
                  base_dir: str | os.PathLike[str] | None) -> Opened:
    """The loader's source and pipeline, opening what the text streams unless a source is given."""
    text = as_pipeline(pipeline, base_dir)
    if source is None:
        check_streams(text)  # (every stream's path, before any is opened)
    if isinstance(text, Pipeline):
        if source is None:
            opened = _open_stream(text.path, options, "")
            try:
                _check_cut_used([opened], options)
            except BaseException:
                opened.close()
                raise
            return Opened(opened, text, [opened], text)
        if isinstance(source, (list, tuple)):
            raise PipelineError(f"{text} streams one source, but {len(source)} sources were given")
        _check_given(source, text.path, options, "")
        _check_cut_used([source], options)
        return Opened(source, text, [], text)
    given: list[Any] | None = None
    if source is not None:
        if isinstance(source, MixedSource):
            given = list(source.sources)
        elif isinstance(source, (list, tuple)):
            given = list(source)
        else:
            raise PipelineError(f"{text} mixes {len(text.sources)} sources: pass a list of them (one a source, in the "
                                "text's order), or none")
        if len(given) != len(text.sources):
            raise PipelineError(f"{text} mixes {len(text.sources)} sources, but {len(given)} were given")
    sources: list[Any] = []
    owned: list[Any] = []
    try:
        for i, (path, where) in enumerate(stream_places(text)):
            if given is None:
                sources.append(_open_stream(path, options, where))
                owned.append(sources[-1])
            else:
                _check_given(given[i], path, options, where)
                sources.append(given[i])
        _check_cut_used(sources, options)
        _check_alike(text, sources)
        return Opened(MixedSource(sources), MixedBatches(text, [len(s) for s in sources]), owned, text)
    except BaseException:
        for s in owned:
            s.close()
        raise


def _batch_axis_shards(sharding: jax.sharding.Sharding) -> int | None:
    """How many parts a sharding cuts a batch's leading axis into (None: not known here)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = sharding.spec
        first = spec[0] if len(spec) else None
        names = () if first is None else (first,) if isinstance(first, str) else tuple(first)
        return int(np.prod([sharding.mesh.shape[name] for name in names], dtype=np.int64))
    return None


def check_divides(sharding: jax.sharding.Sharding | None, batch_size: int) -> None:
    """E9010 when the devices of ``sharding`` do not divide a batch of ``batch_size`` rows."""
    if sharding is None:
        return
    parts = _batch_axis_shards(sharding)
    devices = len(sharding.device_set)
    if parts is None:
        try:
            sharding.shard_shape((batch_size,))
            return
        except Exception as e:  # (JAX's IndivisibleError, or a sharding of more axes: left to device_put)
            if "divide" not in str(e):
                return
            parts = devices
    if batch_size % parts:
        raise PipelineError(f"batch(B = {batch_size}) does not divide over the {parts} devices that the sharding "
                            f"splits the batch axis into ({devices} devices in all): B must be a multiple of "
                            f"{parts}")


def physical_memory() -> int | None:
    """The machine's memory in bytes, None where the system does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def sample_bytes(source: Any) -> int | None:
    """The largest sample of the source (of a mixture's sources) in bytes, None when the source
    cannot say before a read (a source of its own kind)."""
    sources = source.sources if isinstance(source, MixedSource) else [source]
    sizes = [getattr(s, "_sample_bytes", None) for s in sources]
    if any(size is None for size in sizes):
        return None
    try:
        return max(size() for size in sizes if size is not None)
    except Exception:
        return None  # (a source that cannot say: its first read names why)


def check_batch_fits(source: Any, batch_size: int, in_flight: int) -> None:
    """E9010 when ``in_flight`` batches of ``batch_size`` samples (as many as the loader may hold
    at once) are more bytes than the machine's memory: they would fail with a MemoryError later."""
    sample = sample_bytes(source)
    if sample is None:
        return
    memory = physical_memory()
    need = batch_size * sample * in_flight
    if memory is not None and need > memory:
        raise PipelineError(f"batch(B = {batch_size}) of samples of {sample} bytes is {batch_size * sample} bytes a "
                            f"batch, and the loader holds up to {in_flight} batches at once ({need} bytes): more than "
                            f"this machine's {memory} bytes of memory; a smaller B (or prefetch)")
