"""Fuzz targets, one per parser of the toolkit, and the seeds each starts from.

A target takes the fuzzer's bytes and runs one parser of the toolkit on them, the way a user's file
would reach it. The contract under test: whatever the bytes, the toolkit answers with a
:class:`pskd_jax.errors.PskdError` or a result, never another exception, never a hang, never an
allocation out of proportion to the input. Where a parser accepts its input, the target also checks
what it can of the result (a round trip, a re-read), so that a wrong answer is a finding too.

Targets (``TARGETS``):

- ``container``: the bytes are a ``.psk.d`` file: header, Reader, every sample, a gather, ``info``.
- ``sample_type``: the bytes are a type text: parse, layout, header text; an accepted type must
  come back the same from its canonical text.
- ``pipeline``: the bytes are a pipeline text: parse, batches over a small file; an accepted
  pipeline must reparse to itself from ``str()``.
- ``vocab_tokens``: the first byte picks the parser: a vocabulary JSON (then encode and decode a
  text with it, which must round-trip), or a tokens text (read in two block sizes, which must
  agree, then cut into windows).
- ``pack``: the first line is a sample type, the rest ``pack`` input; an accepted file is read back.
- ``layout``: the bytes are a ``NAME.layout.json``; an accepted layout opens a real checkpoint.
- ``checkpoints_index``: the bytes are a ``checkpoints.json`` beside a real checkpoint; the index
  is read, verified and restored through the manager.
- ``safetensors``: two bytes give a data length, the rest is a safetensors header (JSON); the file
  built from them is imported with ``convert``.
- ``manifest``: the bytes are a ``shards.json`` beside the shards of a small real corpus (built
  once); ``read_manifest``, ``info_lines``, ``verify_corpus``, and ``CorpusWindows(seq=4)`` whose
  windows must be the stream of the shards' tokens (and which must open whenever verify passed).
- ``jsonl``: the first byte picks the options (skip bad documents, a character tokenizer, a limit
  of tokens per document, ``.jsonl`` / ``.txt`` / gzip-compressed ``.jsonl.gz`` / raw bytes as
  ``.jsonl.gz``), the rest is a corpus input built with ``build_corpus``; a build must agree with a
  line-by-line reading of the input (its tokens, documents and bad documents), and the corpus it
  writes must verify and give the windows of its tokens.
- ``export``: the bytes are a ``.psk.d`` file exported in chunks of 3 elements; the JSON must hold
  the stored values exactly (non-finite reals as their strings).
- ``output_path``: the first byte picks what stands at an output path (links of every sort, a
  directory, a FIFO, a device, ``-``), the second the writer; an output is written through a link
  or refused with the directory left unchanged.
- ``non_regular``: the first byte picks a non-regular file (FIFO, directory, device link, loop),
  the second one of the toolkit's readers, which must refuse it at once (E9002), never block.
- ``keys``: the bytes choose the dict keys of a tree (kinds that print alike, ``1`` and ``'1'``,
  ``True`` and ``'True'``, text that is not UTF-8, nested dicts): a save refuses it (E9005) or
  restore gives back the same keys, types and values; export holds every leaf or refuses (E9005);
  safetensors and back keeps string and int keys.
- ``diff``: two ``.psk.d`` files (byte 0: bit 0 makes b a copy of a, bit 1 makes ``diff`` read in
  blocks of 64 bytes and chunks of 3 elements; then a's length in two bytes, a, b). An accepted
  pair must give the distance an exact reference computes (fractions, NaN and ±Inf by diff's
  rule), and a file against itself 0 unless it holds a NaN.
- ``segments``: the bytes make a batch of windows of u8, u16 or u32 tokens, a boundary and a
  bound (:func:`segments_case`); the compiled scan (in each width of vectors it scans in here)
  and numpy must give a token-by-token reference's segment ids, positions and bound check, in a
  worker process (a crash of the scan is a finding, not the fuzzer's end).
- ``mixture``: the bytes make a ``mix(…)`` of 2 to 9 small real files with weights of every form
  (:func:`mixture_text`): reparse, ``batch_indices`` against iterating, within one sample of each
  share, each source's own stream, resumption from a saved state, a far batch.
- ``parts_index``: the bytes are a parts index object beside real part objects in a
  ``memory://`` store: restore gives the checkpoint or a PskdError.
- ``url``: the bytes are a path or URL: ``locate`` gives a Location whose ``url`` round-trips, or
  E9018, and no message holds a credential the environment holds.

This module is imported by ``fuzz/run.py`` (and by the regression tests); ``prepare`` makes the
fixture files a target needs in a scratch directory.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from pskd_jax import checkpoint, corpus, pipeline
from pskd_jax import data as inspection
from pskd_jax._os import atomic
from pskd_jax._os.digests import file_digest
from pskd_jax._os.names import layout_path_for
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.checkpoint import index as checkpoint_index
from pskd_jax.checkpoint import safetensors as convert
from pskd_jax.corpus import BuildOptions
from pskd_jax.corpus import build as corpus_build
from pskd_jax.data import distance as distance_module
from pskd_jax.data import export as export_module
from pskd_jax.data import pack, text, windows
from pskd_jax.data import tokens as tokens_module
from pskd_jax.errors import PskdError
from pskd_jax.format import sample_type
from pskd_jax.format.layout import Layout
from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import write, write_encoded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = os.path.join(ROOT, "testdata", "hostile")


class Finding(Exception):
    """A parser accepted its input but answered wrongly (a failed round trip or re-read)."""


class Scratch:
    """The scratch directory of one fuzzing process and the fixture files targets read."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.fixtures = os.path.join(directory, "fixtures")
        os.makedirs(self.fixtures, exist_ok=True)
        self.checkpoint = os.path.join(self.fixtures, "ck.psk.d")
        checkpoint.save(self.checkpoint, {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                          "b": [np.float64(0.5), np.uint8(7)]},
                        SaveOptions(name="Model", durable=False))
        self.index_dir = os.path.join(directory, "index")
        self.index_files = {}
        with checkpoint.CheckpointManager(os.path.join(self.fixtures, "run"),
                                          save_options=SaveOptions(durable=False)) as m:
            m.save(1, {"w": np.ones(3, np.float32)}, extra={"epoch": 1, "batch": 2})
            for name in os.listdir(m.directory):
                with open(os.path.join(m.directory, name), "rb") as f:
                    self.index_files[name] = f.read()
        self.small = os.path.join(self.fixtures, "small.psk.d")
        write(self.small, "ℝ[]", np.arange(10, dtype=np.float64), durable=False)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def corpus_dir(self) -> str:
        """A directory of real shards (built once, on first use): ``shard-00000.psk.d`` and
        ``shard-00001.psk.d`` of the bytes tokenizer (documents "hello", "ab" / "xyz", the shards of
        the hostile collection's manifest cases) and ``s.psk.d`` of the chars tokenizer
        ``CORPUS_CHARS`` (documents "ab\\nba", "b"). The valid manifests are ``bytes.json`` and
        ``chars.json``; the target writes its input as ``shards.json`` beside them."""
        directory = os.path.join(self.fixtures, "corpus")
        if os.path.exists(os.path.join(directory, "chars.json")):
            return directory
        build = os.path.join(self.fixtures, "corpus-build")
        shutil.rmtree(build, ignore_errors=True)
        os.makedirs(build)
        for name, documents in (("a.jsonl", ["hello", "ab"]), ("b.jsonl", ["xyz"]), ("c.jsonl", ["ab\nba", "b"])):
            _write(os.path.join(build, name), "".join(json.dumps({"text": d}) + "\n" for d in documents).encode())
        os.makedirs(directory, exist_ok=True)
        corpus_build.build_corpus([os.path.join(build, n) for n in ("a.jsonl", "b.jsonl")], os.path.join(build, "b"),
                                  BuildOptions(durable=False))
        corpus_build.build_corpus([os.path.join(build, "c.jsonl")], os.path.join(build, "c"),
                                  BuildOptions(tokenizer=corpus.Tokenizer.chars(CORPUS_CHARS), durable=False))
        for name in ("shard-00000.psk.d", "shard-00001.psk.d"):
            shutil.copyfile(os.path.join(build, "b", name), os.path.join(directory, name))
        shutil.copyfile(os.path.join(build, "c", "shard-00000.psk.d"), os.path.join(directory, "s.psk.d"))
        shutil.copyfile(os.path.join(build, "b", corpus.MANIFEST), os.path.join(directory, "bytes.json"))
        with open(os.path.join(build, "c", corpus.MANIFEST), "rb") as f:
            chars = f.read().replace(b'"shard-00000.psk.d"', b'"s.psk.d"')
        _write(os.path.join(directory, "chars.json"), chars)
        return directory


CORPUS_CHARS = ["a", "b", "\n"]
JSONL_CHARS = [chr(c) for c in range(32, 127)] + ["\n", "é", "漢"]


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


# --------------------------------------------------------------------------------------------
# Targets


def t_container(s: Scratch, data: bytes) -> None:
    path = _write(s.path("in.psk.d"), data)
    try:
        with Reader(path) as reader:
            if reader.placement is None:
                return
            n = len(reader)
            first = reader[0] if n else None
            for k in range(min(n, 4)):
                reader[k]
            if n:
                batch = reader.gather(np.array([0, n - 1, -1]))
                again = reader.gather([0])
                for a, b in zip(_leaves(batch), _leaves(first)):
                    if a[0].tobytes() != np.asarray(b).tobytes():
                        raise Finding("gather and getitem disagree on sample 0")
                del again
            reader.raw_data()
            _ = reader.trailing_bytes
        inspection.info_lines(path, samples=3)
    except PskdError:
        pass


def _leaves(tree) -> list:
    if isinstance(tree, tuple):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def t_sample_type(s: Scratch, data: bytes) -> None:
    type_text = data.decode("utf-8", errors="replace")
    try:
        parsed = sample_type.parse_type(type_text)
        stored = sample_type.header_text(type_text)
        if not isinstance(parsed, sample_type.ParamsType):
            layout = Layout.of_type(parsed)
            again = Layout.of_type(sample_type.format_type(parsed))
            if again.leaves != layout.leaves or again.structure != layout.structure:
                raise Finding(f"{type_text!r}: its canonical text {sample_type.format_type(parsed)!r} "
                              "has another layout")
            if Layout.of_type(stored).leaves != layout.leaves:
                raise Finding(f"{type_text!r}: its header text {stored!r} has another layout")
    except PskdError:
        pass


def t_pipeline(s: Scratch, data: bytes) -> None:
    source = data.decode("utf-8", errors="replace")
    try:
        p = pipeline.parse_pipeline(source, base_dir="")
        again = pipeline.parse_pipeline(str(p), base_dir="")
        if again != p:
            raise Finding(f"{source!r} → {str(p)!r} reparses to {again!r}")
        n = 10 + (len(data) % 50)
        per_epoch = p.batches_per_epoch(n)
        for j in range(min(per_epoch, 2)):
            p.batch_indices(n, 1, j)
        if per_epoch:
            for _, (_, indices) in zip(range(3), p.iter_batches(n)):
                if indices.min() < 0 or indices.max() >= n:
                    raise Finding(f"{p}: an index outside [0, {n})")
        path = _write(s.path("p.pipeline"), data)
        pipeline.load_pipeline(path)
    except PskdError:
        pass


def t_vocab_tokens(s: Scratch, data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 2, data[1:]
    try:
        if mode == 0:
            vocab_path = _write(s.path("v.json"), body)
            vocab = text.read_vocab(vocab_path)
            if all(len(t) == 1 for t in vocab) and vocab:
                sample = "".join(vocab[i % len(vocab)] for i in range(0, 3 * len(vocab), 2))
                source = _write(s.path("v.txt"), sample.encode("utf-8"))
                text.encode_file(source, vocab, s.path("v.tok"), chunk_size=7)
                text.decode_file(s.path("v.tok"), vocab, s.path("v.back"), chunk_size=5)
                with open(s.path("v.back"), "rb") as f:
                    if f.read() != sample.encode("utf-8"):
                        raise Finding("decode(encode(text)) differs from the text")
        else:
            path = _write(s.path("t.tok"), body)
            bound = (body[0] * 7 + 1) if body else None
            saved = tokens_module.LONG_WORD
            tokens_module.LONG_WORD = 4  # a word of more than four bytes takes the long-word path
            try:
                small = _tokens_or_error(path, chunk_size=3)
            finally:
                tokens_module.LONG_WORD = saved
            large = _tokens_or_error(path)
            if type(small) is not type(large) or (isinstance(small, np.ndarray) and not np.array_equal(small, large)) \
                    or (isinstance(small, PskdError) and small.code != large.code):
                raise Finding(f"the tokens differ with the block size: {small!r} / {large!r}")
            if isinstance(large, PskdError):
                raise large
            try:
                tokens_module.read_tokens(path, bound=bound)
            except PskdError as e:
                if bound is None or not len(large) or int(large.max()) < bound:
                    raise Finding("a bound refused tokens below it") from e
            else:
                if bound is not None and len(large) and int(large.max()) >= bound:
                    raise Finding("a bound accepted a token at or above it")
            windows.lm_windows_file(path, s.path("t.psk.d"), vocab=int(large.max()) + 1 if len(large) else 1,
                                    seq=2, stride=1)
    except PskdError:
        pass


def _tokens_or_error(path: str, **options) -> np.ndarray | PskdError:
    try:
        return tokens_module.read_tokens(path, **options)
    except PskdError as e:
        return e


def t_pack(s: Scratch, data: bytes) -> None:
    head, _, body = data.partition(b"\n")
    type_text = head.decode("utf-8", errors="replace")
    try:
        layout = Layout.of_type(type_text)
        if layout.sample_elements > 1 << 16:
            return  # a legitimate type, but its samples are not what this target fuzzes
        source = _write(s.path("pack.txt"), body)
        result = pack.pack_file(source, type_text, s.path("pack.psk.d"))
        with Reader(s.path("pack.psk.d")) as reader:
            if len(reader) != result.count:
                raise Finding("the packed file's count differs from what pack reported")
    except PskdError:
        pass


def t_layout(s: Scratch, data: bytes) -> None:
    path = _write(s.path("l.layout.json"), data)
    try:
        layout_file = checkpoint.read_layout_file(path)
        inspection.info_lines(s.checkpoint, layout=layout_file.layout)
        checkpoint.restore(s.checkpoint, layout=path, as_numpy=True)
    except PskdError:
        pass
    # The same bytes as the layout file beside a copy of the checkpoint: it must prove that it
    # belongs to the data (or be refused) before restore, info or a template reader uses it.
    beside = s.path("layout-beside.psk.d")  # (a name of its own: diff's b.psk.d is another file)
    if not os.path.exists(beside):
        shutil.copyfile(s.checkpoint, beside)
    _write(layout_path_for(beside), data)
    try:
        checkpoint.restore(beside, as_numpy=True)
        found = checkpoint.find_layout_file(beside)
        if found is None:
            raise Finding("a restore of a params checkpoint went through without the layout file beside it")
        inspection.info_lines(beside, layout=found.layout)
    except PskdError:
        pass


def t_checkpoints_index(s: Scratch, data: bytes) -> None:
    directory = s.index_dir
    os.makedirs(directory, exist_ok=True)
    for name, content in s.index_files.items():
        if name != checkpoint_index.INDEX and not os.path.exists(os.path.join(directory, name)):
            _write(os.path.join(directory, name), content)
    _write(os.path.join(directory, checkpoint_index.INDEX), data)
    try:
        checkpoint.read_index(directory)
        checkpoint.verify_directory(directory)
        with checkpoint.CheckpointManager(directory, save_options=SaveOptions(durable=False)) as m:
            m.all_steps()
            m.extra()
            m.restore(as_numpy=True)
    except PskdError:
        pass


def t_safetensors(s: Scratch, data: bytes) -> None:
    if len(data) < 2:
        return
    (length,) = struct.unpack("<H", data[:2])
    header = data[2:]
    body = struct.pack("<Q", len(header)) + header + bytes(range(256)) * (length // 256) + bytes(length % 256)
    source = _write(s.path("in.safetensors"), body)
    try:
        convert.safetensors_to_pskd(source, s.path("st.psk.d"), SaveOptions(durable=False))
        inspection.info_lines(s.path("st.psk.d"), layout=checkpoint.find_layout_file(s.path("st.psk.d")))
    except PskdError:
        pass


def t_manifest(s: Scratch, data: bytes) -> None:
    path = _write(os.path.join(s.corpus_dir, corpus.MANIFEST), data)
    try:
        manifest = corpus.read_manifest(path)
        corpus.info_lines(path, shards=True)
        try:
            corpus.verify_corpus(path, workers=1)
            verified = True
        except PskdError:
            verified = False
        try:
            windows_source = corpus.CorpusWindows(path, seq=4)
        except PskdError as e:
            if verified:
                raise Finding(f"verify passed, but the windows refuse the corpus: {e}") from e
            raise
        with windows_source as w:
            _check_windows(w, [manifest.shard_path(i) for i in range(len(manifest.shards))])
    except PskdError:
        pass


def _check_windows(w: corpus.CorpusWindows, shard_paths: list[str]) -> None:
    """The windows are the stream of the shards' tokens, read one shard at a time."""
    parts = []
    for shard_path in shard_paths:
        with Reader(shard_path) as reader:
            parts.append(np.asarray(reader.leaves()[0]).copy())
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    n = len(w)
    expected = windows.lm_window_count(len(stream), w.seq, w.stride) if len(stream) else 0
    if n != expected or w.total_tokens != len(stream):
        raise Finding(f"{n} windows over {w.total_tokens} tokens; the shards hold {len(stream)} tokens, "
                      f"{expected} windows")
    if len(stream) and int(stream.max()) >= w.vocab_size:
        raise Finding("a verified shard holds a token at or above the vocabulary size")
    if not n:
        return
    indices = np.array(sorted({0, n - 1, n // 2, 1 % n}) + [-1], dtype=np.int64)
    inputs, targets = w.gather(indices)
    for row, k in enumerate(indices.tolist()):
        start = (k % n) * w.stride
        if (inputs[row].tolist() != stream[start : start + w.seq].tolist()
                or targets[row].tolist() != stream[start + 1 : start + w.seq + 1].tolist()):
            raise Finding(f"window {k} differs from tokens {start}..{start + w.seq} of the shards")
        one_in, _ = w[k]
        if one_in.tolist() != inputs[row].tolist():
            raise Finding(f"window {k}: [] and gather disagree")


JSONL_MODES = (".jsonl", ".txt", ".jsonl.gz", "raw.jsonl.gz")
MAY_REFUSE = "bad bytes after the limit of tokens"  # the build may refuse the input, or accept its tokens


def t_jsonl(s: Scratch, data: bytes) -> None:
    if not data:
        return
    flags, body = data[0], data[1:]
    skip_bad, use_chars, limit = bool(flags & 1), bool(flags & 2), (3 if flags & 4 else None)
    mode = JSONL_MODES[(flags >> 3) % len(JSONL_MODES)]
    tokenizer = corpus.Tokenizer.chars(JSONL_CHARS) if use_chars else corpus.Tokenizer.bytes()
    folder = s.path("jsonl")
    shutil.rmtree(folder, ignore_errors=True)  # a fresh build each time (a rerun keeps shards by mtime)
    os.makedirs(folder)
    source = os.path.join(folder, "in" + (".jsonl.gz" if mode.endswith(".gz") else mode))
    if mode == ".jsonl.gz":
        import gzip
        _write(source, gzip.compress(body, compresslevel=1, mtime=0))
    else:
        _write(source, body)
    out = os.path.join(folder, "corpus")
    expected = None if mode == "raw.jsonl.gz" else _expected_corpus(body, mode, tokenizer, skip_bad, limit)
    try:
        result = corpus_build.build_corpus([source], out, BuildOptions(tokenizer=tokenizer, max_document_tokens=limit,
                                                                       skip_bad=skip_bad, durable=False))
    except PskdError as e:
        if expected is not None and expected[3] is None:
            raise Finding(f"the build refused an input a line-by-line reading accepts: {e}") from e
        if os.path.exists(os.path.join(out, corpus.MANIFEST)):
            raise Finding("a failed build left shards.json") from e
        return
    if expected is not None:
        tokens, documents, skipped, bad = expected
        if bad is not None and bad is not MAY_REFUSE:
            raise Finding(f"the build accepted an input with a bad document ({bad})")
        m = result.manifest
        with Reader(m.shard_path(0)) as reader:
            built = np.asarray(reader.leaves()[0]).tolist()
        got = (built, m.shards[0].documents, m.shards[0].skipped)
        if bad is MAY_REFUSE and got == ([], 0, 1):
            pass  # skip_bad, and the build saw the bad bytes: the document is left out
        elif got != (tokens, documents, skipped):
            raise Finding(f"the build made {len(built)} tokens, {m.shards[0].documents} documents, "
                          f"{m.shards[0].skipped} skipped; a line-by-line reading makes {len(tokens)}, "
                          f"{documents}, {skipped}")
    manifest_path = os.path.join(out, corpus.MANIFEST)
    try:
        corpus.verify_corpus(manifest_path, workers=1)
        corpus.info_lines(manifest_path, shards=True)
        with corpus.CorpusWindows(manifest_path, seq=2, stride=1) as w:
            _check_windows(w, [w.manifest.shard_path(i) for i in range(len(w.manifest.shards))])
    except PskdError as e:
        raise Finding(f"a corpus the build wrote does not read back: {e}") from e


def _expected_corpus(body: bytes, mode: str, tokenizer: corpus.Tokenizer, skip_bad: bool, limit: int | None):
    """(tokens, documents, skipped, the first bad document or None) by reading the input one line
    at a time, as the corpus_tokens docstring describes it (the build reads it in blocks)."""
    tokens: list[int] = []
    documents = skipped = 0

    def encode(text_value: str) -> list[int] | None:
        if tokenizer.kind == "bytes":
            try:
                raw = text_value.encode("utf-8")
            except UnicodeEncodeError:
                return None
            return list(raw[:limit] if limit is not None else raw)
        chars = text_value[:limit] if limit is not None else text_value
        if any(ch not in tokenizer.vocab for ch in chars):
            return None
        return [tokenizer.vocab.index(ch) for ch in chars]

    if mode == ".txt":
        try:
            doc = body.decode("utf-8")
        except UnicodeDecodeError as e:
            doc = None
            prefix = body[: e.start].decode("utf-8")
            if limit is not None and (e.start if tokenizer.kind == "bytes" else len(prefix)) >= limit:
                # A .txt document is streamed and read only up to its limit: bad bytes after it may
                # go unseen (the build then keeps the limit's tokens), or be seen in the same block.
                encoded = encode(prefix)
                return ((encoded + [tokenizer.boundary], 1, 0, MAY_REFUSE) if encoded is not None
                        else ([], 0, 1, None) if skip_bad else ([], 0, 0, "the document"))
        encoded = None if doc is None else encode(doc)
        if encoded is None:
            return ([], 0, 1, None) if skip_bad else ([], 0, 0, "the document")
        return (encoded + [tokenizer.boundary], 1, 0, None) if encoded else ([], 0, 0, None)
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    bad = None
    for number, raw_line in enumerate(body.split(b"\n"), 1):
        problem = None
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            problem = "invalid UTF-8"
        if problem is None:
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):
                if not line or line.isspace():
                    continue
                problem = "not JSON"
        if problem is None:
            if type(doc) is not dict or type(doc.get("text")) is not str:
                problem = "not an object with a string text"
            elif not doc["text"]:
                continue
            else:
                encoded = encode(doc["text"])
                if encoded is None:
                    problem = "a text the tokenizer cannot encode"
                else:
                    tokens += encoded + [tokenizer.boundary]
                    documents += 1
                    continue
        if not skip_bad:
            return tokens, documents, skipped, f"line {number}: {problem}"
        skipped += 1
    return tokens, documents, skipped, bad


def t_export(s: Scratch, data: bytes) -> None:
    """The bytes are a ``.psk.d`` file: ``export_json`` (chunks of a few elements, so that a sample
    is often written in parts), and the JSON must be the file's samples, exactly: every real the
    stored value, a non-finite one its convention string."""
    path = _write(s.path("e.psk.d"), data)
    out = s.path("e.json")
    if os.path.exists(out):
        os.unlink(out)  # (the last input's)
    saved = export_module.CHUNK_ELEMENTS
    export_module.CHUNK_ELEMENTS = 3
    try:
        count = inspection.export_json(path, out)
    except PskdError as e:
        if os.path.exists(out):
            raise Finding("a refused export left its output") from e
        return
    finally:
        export_module.CHUNK_ELEMENTS = saved
    if os.path.getsize(out) > 1 << 20:  # (parsing a JSON of millions of empty samples costs seconds)
        with open(out, "rb") as f:
            head = f.read(1 << 16)
        head = head[: head.index(b', "samples": [')] + b"}"
        if json.loads(head)["count"] != count:
            raise Finding(f"export's head gives another count than {count}")
        return
    with open(out, "rb") as f:
        exported = json.loads(f.read())
    if exported["count"] != count or len(exported["samples"]) != count:
        raise Finding(f"export wrote {len(exported['samples'])} samples of a count of {count}")
    with Reader(path) as reader:
        for k in range(min(count, 3)):
            stored = reader.gather_leaves([k])
            written = _json_leaves(exported["samples"][k], reader.placement.layout)
            for leaf, (got, want) in enumerate(zip(written, stored)):
                if _json_values(np.asarray(want[0])) != got:
                    raise Finding(f"sample {k} leaf {leaf}: exported {got!r}, stored {want[0]!r}")


def _json_leaves(sample, layout) -> list:
    """The leaves of a sample as export writes it, in storage order (tuples are lists)."""
    marks = layout.unflatten(list(range(len(layout.leaves))))
    found = [None] * len(layout.leaves)

    def walk(structure, value):
        if isinstance(structure, int):
            found[structure] = value
        elif isinstance(structure, tuple):
            for a, b in zip(structure, value):
                walk(a, b)
        elif isinstance(structure, dict):
            for key, child in structure.items():
                walk(child, value[str(key)])
        elif isinstance(structure, list):
            for a, b in zip(structure, value):
                walk(a, b)
    walk(marks, sample)
    return found


def _json_values(array: np.ndarray):
    """What export must write for an array: ints, exact floats, convention strings, nested."""
    if array.dtype.kind in "iub":
        return array.tolist()
    with np.errstate(invalid="ignore"):
        wide = array.astype(np.float64)
    flat = [float(w) if np.isfinite(w) else export_module.non_finite_text(v)
            for v, w in zip(array.reshape(-1), wide.reshape(-1))]
    return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]


OUTPUT_KINDS = ("nothing", "file", "link-file", "link-dangling", "link-dir", "link-loop", "link-device",
                "link-chain", "directory", "fifo", "dash", "link-proc", "trailing-slash", "empty", "link-dash")


def t_output_path(s: Scratch, data: bytes) -> None:
    """Byte 0 picks what stands at the output path (nothing, a file, a link to a file, a dangling
    link, a link to a directory, a loop, a link to a device or a process's descriptor, a chain, a
    directory, a FIFO, ``-``, a name ending in /, an empty name); byte 1 the writer (atomic_output,
    text_output, a Writer, export, write_vocab); the rest is what is written. Whatever stands
    there: success means the final regular target holds exactly the output and every link is still
    the link it was; a refusal (E9012, E9003) means nothing in the directory changed."""
    if len(data) < 2:
        return
    kind, how, body = OUTPUT_KINDS[data[0] % len(OUTPUT_KINDS)], data[1] % 5, data[2:]
    folder = s.path("out")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "sub"))
    target = os.path.join(folder, "sub", "target.bin")
    name = {"dash": "-", "empty": "", "trailing-slash": os.path.join(folder, "new") + "/"}.get(
        kind, os.path.join(folder, "out.bin"))
    if kind == "file":
        _write(name, b"old")
    elif kind == "link-file":
        _write(target, b"old")
        os.symlink("sub/target.bin", name)
    elif kind == "link-dangling":
        os.symlink("sub/target.bin", name)
    elif kind == "link-dir":
        os.symlink("sub", name)
    elif kind == "link-loop":
        os.symlink("out.bin", name)
    elif kind == "link-device":
        os.symlink("/dev/null", name)
    elif kind == "link-chain":
        os.symlink("second", name)
        os.symlink("sub/target.bin", os.path.join(folder, "second"))
    elif kind == "directory":
        os.makedirs(name)
    elif kind == "fifo":
        os.mkfifo(name)
    elif kind == "link-proc":
        os.symlink("/proc/self/fd/1", name)
    elif kind == "link-dash":
        os.symlink("-", name)
    before = _tree(folder)
    expected = body
    try:
        if how == 0:
            with atomic.atomic_output(name) as f:
                f.write(body)
        elif how == 1:
            if name == "-":
                return  # (would write the fuzzer's standard output)
            with atomic.text_output(name) as f:
                f.write(body)
        elif how == 2:
            values = np.frombuffer(body[: len(body) // 8 * 8], dtype=np.float64)
            values = np.where(np.isfinite(values), values, 0.0)
            write(name, "ℝ[]", values, durable=False)
            expected = None
        elif how == 3:
            if name == "-":
                return
            inspection.export_json(s.small, name)
            expected = None
        else:
            if name == "-":
                return
            text.write_vocab(name, ["a", "b"])
            expected = b'["a", "b"]\n'
    except PskdError as e:
        if e.code not in ("E9012", "E9003"):
            raise Finding(f"{kind}: refused with {e.code}: {e.message}") from e
        if _tree(folder) != before:
            raise Finding(f"{kind}: a refused output changed the directory: {before} → {_tree(folder)}") from e
        return
    if kind in ("directory", "fifo", "link-dir", "link-loop", "link-device", "link-proc", "dash", "empty"):
        raise Finding(f"{kind}: the output was written ({before} → {_tree(folder)})")
    final = os.path.realpath(name)
    if not os.path.isfile(final) or os.path.islink(final):
        raise Finding(f"{kind}: no regular file at {final} after writing")
    if expected is not None:
        with open(final, "rb") as f:
            if f.read() != expected:
                raise Finding(f"{kind}: the file holds other bytes than were written")
    links = {k: v for k, v in before.items() if v[0] == "link"}
    after = _tree(folder)
    if any(after.get(k) != v for k, v in links.items()):
        raise Finding(f"{kind}: a link changed: {links} → {after}")
    stray = [k for k in after if ".tmp" in k]
    if stray:
        raise Finding(f"{kind}: temporary files left: {stray}")


def _tree(folder: str) -> dict:
    found = {}
    for directory, dirs, files in os.walk(folder):
        for entry in dirs + files:
            full = os.path.join(directory, entry)
            key = os.path.relpath(full, folder)
            if os.path.islink(full):
                found[key] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                found[key] = ("directory",)
            elif os.path.isfile(full):
                with open(full, "rb") as f:
                    found[key] = ("file", f.read())
            else:
                found[key] = ("other",)
    return found


SPECIAL_INPUTS = ("fifo", "directory", "dev-null", "dev-zero", "loop", "dangling", "link-to-fifo")


def t_non_regular(s: Scratch, data: bytes) -> None:
    """Byte 0 picks what stands where a file is read (a FIFO, a directory, a link to /dev/null, to
    /dev/zero, to itself, to nothing, to a FIFO), byte 1 the reader (Reader in either access,
    info, export, vocabulary, tokens, lm-windows, pack, pipeline file, layout file, manifest,
    corpus input, digest, safetensors): it must answer with a PskdError at once (E9002 for what
    exists and is not a regular file), never block, never read without end."""
    if len(data) < 2:
        return
    kind = SPECIAL_INPUTS[data[0] % len(SPECIAL_INPUTS)]
    folder = s.path("special")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    readers = [
        ("in.psk.d", lambda p: Reader(p)), ("in.psk.d", lambda p: Reader(p, access="pread")),
        ("in.psk.d", lambda p: inspection.info_lines(p)),
        ("in.psk.d", lambda p: inspection.export_json(p, os.path.join(s.directory, "x.json"))),
        ("in.json", text.read_vocab), ("in.tok", tokens_module.read_tokens),
        ("in.tok", lambda p: windows.lm_windows_file(p, os.path.join(s.directory, "x.psk.d"), vocab=4, seq=2)),
        ("in.txt", lambda p: pack.pack_file(p, "ℝ[]", os.path.join(s.directory, "x.psk.d"))),
        ("in.pipeline", pipeline.load_pipeline), ("in.layout.json", checkpoint.read_layout_file),
        ("shards.json", corpus.read_manifest),
        ("in.jsonl", lambda p: corpus_build.build_corpus([p], os.path.join(s.directory, "c"),
                                                         BuildOptions(durable=False))),
        ("in.psk.d", file_digest),
        ("in.safetensors", lambda p: convert.safetensors_to_pskd(p, os.path.join(s.directory, "x.psk.d"),
                                                                SaveOptions(durable=False))),
    ]
    name, read = readers[data[1] % len(readers)]
    path = os.path.join(folder, name)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.makedirs(path)
    elif kind == "dev-null":
        os.symlink("/dev/null", path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "loop":
        os.symlink(name, path)
    elif kind == "dangling":
        os.symlink("nowhere", path)
    else:
        os.mkfifo(os.path.join(folder, "pipe"))
        os.symlink("pipe", path)
    try:
        read(path)
    except PskdError as e:
        exists = os.path.exists(path)
        if kind == "directory" and name == "in.jsonl":
            return  # (a directory of corpus inputs is an input too)
        if exists and e.code != "E9002" and not (name == "in.jsonl" and e.code == "E9015"):
            raise Finding(f"{kind} as {name}: {e.code} where a non-regular file is E9002: {e.message}") from e
        return
    if not (kind == "directory" and name == "in.jsonl"):
        raise Finding(f"{kind} as {name}: read as if it were a file")


def _fuzz_keys(data: bytes, position: int, depth: int) -> tuple[dict, int]:
    """A dict of a few leaves and subdicts whose keys ``data`` chooses (kinds that print alike
    among them: ``1`` and ``'1'``, ``True`` and ``'True'``, ``None``, floats, tuples, bytes, text
    that is not UTF-8); returns it and where its bytes end."""
    tree: dict = {}
    count = data[position] % 5 if position < len(data) else 0
    position += 1
    for k in range(count):
        if position >= len(data):
            break
        kind, position = data[position] % 9, position + 1
        chunk, position = data[position : position + 4], position + 4
        number = int.from_bytes(chunk.ljust(4, b"\0"), "little", signed=True) % 7 - 3
        key = [chunk.decode("utf-8", "surrogateescape"), number, bool(number % 2), None, number / 2,
               (number, "a"), chunk, str(number), repr(number / 2)][kind]
        if depth < 3 and position < len(data) and data[position] % 4 == 0:
            tree[key], position = _fuzz_keys(data, position + 1, depth + 1)
        else:
            tree[key] = np.full((1,), float(k))
    return tree, position


def _typed_keys(tree) -> object:
    if isinstance(tree, dict):
        return [(type(k).__name__, repr(k), _typed_keys(v)) for k, v in tree.items()]
    if isinstance(tree, (list, tuple)):
        return [_typed_keys(v) for v in tree]
    return float(np.asarray(tree).reshape(-1)[0])


def t_keys(s: Scratch, data: bytes) -> None:
    """The bytes choose a tree's dict keys (:func:`_fuzz_keys`): a save refuses it (E9005) or
    restore gives back the same keys, types and values; ``info`` lists it; ``export`` writes JSON
    holding every leaf or refuses (E9005); safetensors and back keeps the keys and containers or
    refuses."""
    tree, _ = _fuzz_keys(data, 0, 0)
    path = s.path("keys.psk.d")
    try:
        checkpoint.save(path, tree, SaveOptions(durable=False))
    except PskdError as e:
        if e.code != "E9005":
            raise Finding(f"a save of keys {_typed_keys(tree)} refused with {e}") from None
        return
    back = checkpoint.restore(path, as_numpy=True)
    if _typed_keys(back) != _typed_keys(tree):
        raise Finding(f"keys {_typed_keys(tree)} came back as {_typed_keys(back)}")
    found = checkpoint.find_layout_file(path)
    inspection.info_lines(path, layout=found, values=True)
    leaves = len(_tree_leaves(back))
    try:
        inspection.export_json(path, s.path("keys.json"), layout=found)
    except PskdError as e:
        if e.code != "E9005":
            raise
    else:
        with open(s.path("keys.json"), "rb") as f:
            written = json.loads(f.read().decode("utf-8"))["samples"][0]
        if len(_json_scalars(written)) != leaves:
            raise Finding(f"export of {_typed_keys(tree)} wrote {written}: {leaves} leaves saved")
    if not leaves:
        return
    try:
        convert.pskd_to_safetensors(path, s.path("keys.safetensors"))
        convert.safetensors_to_pskd(s.path("keys.safetensors"), s.path("keys-back.psk.d"), SaveOptions(durable=False))
    except PskdError:
        return
    again = checkpoint.restore(s.path("keys-back.psk.d"), as_numpy=True)
    if _typed_keys(again) != _typed_keys(back):
        raise Finding(f"safetensors and back turned keys {_typed_keys(back)} into {_typed_keys(again)}")


def _tree_leaves(tree) -> list:
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _tree_leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in _tree_leaves(value)]
    return [] if tree is None else [tree]


def _json_scalars(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _json_scalars(v)]
    if isinstance(value, list) and value and isinstance(value[0], (list, dict)):
        return [x for v in value for x in _json_scalars(v)]
    return [value]


TARGETS: dict[str, Callable[[Scratch, bytes], None]] = {
    "container": t_container,
    "sample_type": t_sample_type,
    "pipeline": t_pipeline,
    "vocab_tokens": t_vocab_tokens,
    "pack": t_pack,
    "layout": t_layout,
    "checkpoints_index": t_checkpoints_index,
    "safetensors": t_safetensors,
    "manifest": t_manifest,
    "jsonl": t_jsonl,
    "export": t_export,
    "output_path": t_output_path,
    "non_regular": t_non_regular,
    "keys": t_keys,
}

# Which kinds of the hostile collection seed which target (and how a file becomes an input).
HOSTILE_KINDS = {
    "container": ("container", None),
    "sample_type": ("container", "type"),
    "pipeline": ("pipeline", None),
    "vocab_tokens": (("vocab", b"\x00"), ("tokens", b"\x01")),
    "pack": ("pack", "pack"),
    "layout": ("layout", None),
    "checkpoints_index": ("index", None),
    "safetensors": ("safetensors", "safetensors"),
    "manifest": ("manifest", None),
    "jsonl": ("jsonl", "jsonl"),
    "export": (("export", None), ("container", None)),
    "output_path": (),
    "non_regular": (),
    "diff": (("diff", "diff"), ("container", "copy")),
    "keys": (),
    "segments": (),
    "mixture": (),
    "parts_index": (),
    "url": (),
}


# --------------------------------------------------------------------------------------------
# Seeds


def _container_seeds(scratch: Scratch) -> list[bytes]:
    seeds = []
    cases = [
        ("ℝ[]", np.arange(3, dtype=np.float64), None),
        ("(idx[64][seq: 4], ℝ[])", (np.arange(8).reshape(2, 4), np.array([0.5, 1.5])), None),
        ("(ℝ[2], ℝ[2], idx[3][])", (np.ones((2, 2), np.float32), np.ones((2, 2)), np.array([0, 2])),
         ["f32", "bf16", "f64"]),
        ("idx[70000][2, 2]", np.arange(8).reshape(2, 2, 2), None),
        ("bool[3]", np.array([[True, False, True]]), None),
        ("idx[4294967297][]", np.array([1, 2**32]), None),
        ("ℝ[0]", np.zeros((5, 0)), None),
    ]
    for i, (type_text, samples, encodings) in enumerate(cases):
        path = scratch.path(f"seed{i}.psk.d")
        if encodings:
            write_encoded(path, type_text, samples, encodings, round_to_encoding=True, durable=False)
        else:
            write(path, type_text, samples, durable=False)
        with open(path, "rb") as f:
            seeds.append(f.read())
    with open(scratch.checkpoint, "rb") as f:
        seeds.append(f.read())
    return seeds


def seeds(target: str, scratch: Scratch) -> list[bytes]:
    """The valid inputs a target starts from (the hostile collection is added by the runner)."""
    if target == "container":
        return _container_seeds(scratch)
    if target == "sample_type":
        return [t.encode() for t in ("ℝ[]", "R[2, 3]", "(idx[64][seq: 8], idx[64][seq: 8])", "bool[model: 4]",
                                     "params MiniGPT", "((ℝ[1], idx[2][]), bool[])", "idx[18446744073709551616][]")]
    if target == "pipeline":
        return [t.encode() for t in ('stream "a.psk.d" |> shuffle(seed = 42) |> batch(B = 4) |> take(n = 2)',
                                     'stream "d" |> batch(B = 3)', 'stream "x y"\n|> shuffle(seed=0)\n|> batch(B=1)')]
    if target == "vocab_tokens":
        vocabularies = (["\n", "a", "b"], ["é", "ß", "漢", "😀"], [])
        return [b"\x00" + json.dumps(v, ensure_ascii=False).encode() for v in vocabularies] + \
               [b"\x01" + t for t in (b"1 2 3\n", b"0\t17\r\n255 256", b"18446744073709551615", b"")]
    if target == "pack":
        return [b"(idx[10][2], R[])\n1 2 0.5\n-- comment\n\n3 4 1e-3\n", "ℝ[3]\n1 2 3\n4.5 6 7\n".encode(),
                b"bool[2]\n0 1\n1 1\n", b"idx[18446744073709551616][]\n18446744073709551615\n"]
    if target == "layout":
        return [open(layout_path_for(scratch.checkpoint), "rb").read()]
    if target == "checkpoints_index":
        return [scratch.index_files[checkpoint_index.INDEX]]
    if target == "manifest":
        out = []
        for name in ("bytes.json", "chars.json"):
            with open(os.path.join(scratch.corpus_dir, name), "rb") as f:
                out.append(f.read())
        return out
    if target == "jsonl":
        lines = b'{"text": "hello"}\n{"text": "ab", "id": 7}\n\n{"text": ""}\n'
        bad = b'{"text": "a"}\n[1]\n{"text": 2}\n{"text": "\\ud800"}\n\xff\n{"body": "c"}\n{"text": "b"}\n'
        return [bytes([flags]) + body for flags in range(0, 32, 1)
                for body in (lines, bad, "é漢 text\n".encode(), b"")]
    if target == "safetensors":
        from safetensors.numpy import save
        out = []
        for tensors in ({"a.w": np.arange(6, dtype=np.float32).reshape(2, 3), "a.b": np.zeros(2, np.float64)},
                        {"x.0": np.ones(4, np.int32), "x.1": np.array([True, False])}):
            blob = save(tensors, metadata={"pskd.order": json.dumps(list(tensors))})
            (n,) = struct.unpack("<Q", blob[:8])
            out.append(struct.pack("<H", len(blob) - 8 - n) + blob[8 : 8 + n])
        return out
    if target == "export":
        return _container_seeds(scratch) + [_nan_file()]
    if target == "output_path":
        return [bytes([k, w]) + b"data" for k in range(len(OUTPUT_KINDS)) for w in range(5)]
    if target == "non_regular":
        return [bytes([k, r]) for k in range(len(SPECIAL_INPUTS)) for r in range(14)]
    if target == "diff":
        return _diff_seeds(scratch)
    if target == "segments":
        return _segments_seeds()
    if target == "mixture":
        return _mixture_seeds(scratch)
    if target == "parts_index":
        return _parts_index_seeds(scratch)
    if target == "url":
        return _url_seeds()
    if target == "keys":  # (1 and '1', True and 'True', None and 'None', a surrogate, a nested dict)
        return [bytes([4, 1, 1, 0, 0, 0, 1, 7, 1, 0, 0, 0, 1, 2, 0, 0, 0, 0, 1]),
                bytes([3, 2, 2, 0, 0, 0, 1, 0, 97, 0, 0, 1, 3, 0, 0, 0, 0, 1]),
                bytes([2, 0, 0xFF, 0x41, 0, 0, 1, 5, 1, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 1])]
    raise KeyError(target)


def _nan_file() -> bytes:
    """A version 2 file of f64, f32 and bf16 leaves holding NaNs (payloads, signs), ±Inf."""
    from pskd_jax.format.encodings import Encoding
    from pskd_jax.format.header import encode_header
    head = encode_header("(ℝ[3], ℝ[2], ℝ[2])", 1, [Encoding.F64, Encoding.F32, Encoding.BF16])
    f64 = np.array([np.nan, -np.inf, 2.5]).tobytes()
    f32 = np.array([0x7FC00001, 0xFF800000], np.uint32).tobytes()
    bf16 = np.array([0x7F81, 0x3F80], np.uint16).tobytes()
    return head + f64 + f32 + bf16


def hostile_inputs(target: str) -> list[bytes]:
    """The hostile collection's files that fit a target, as that target's inputs."""
    manifest_path = os.path.join(HOSTILE, "manifest.json")
    if not os.path.exists(manifest_path):
        return []
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    kinds = HOSTILE_KINDS[target]
    if not kinds:
        return []
    kinds = kinds if isinstance(kinds[0], tuple) else (kinds,)
    out = []
    for case in manifest["cases"]:
        for kind, how in kinds:
            if case["kind"] != kind:
                continue
            path = os.path.join(HOSTILE, case["file"])
            if how == "diff":
                pair = [os.path.join(path, name) for name in ("a.psk.d", "b.psk.d")]
                if all(os.path.isfile(p) and not os.path.islink(p) for p in pair):
                    a, b = (_read(p) for p in pair)
                    out.append(diff_input(a, b))
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                path = os.path.join(path, corpus.MANIFEST if kind == "manifest" else checkpoint_index.INDEX)
            if not os.path.isfile(path):
                continue  # (a link to /dev/zero, to a directory, to itself: no bytes to fuzz)
            with open(path, "rb") as f:
                data = f.read()
            if how == "type":
                data = _type_of(data)
            elif how == "pack":
                data = case["args"]["type"].encode() + b"\n" + data
            elif how == "safetensors":
                data = _safetensors_input(data)
            elif how == "jsonl":
                data = _jsonl_input(case, data)
            elif how == "copy":
                data = bytes([1]) + data
            elif isinstance(how, bytes):
                data = how + data
            if data is not None:
                out.append(data)
    return out


def _jsonl_input(case: dict, data: bytes) -> bytes | None:
    """A hostile corpus input as the jsonl target's input: the flags byte of its options."""
    file, args = case["file"], case.get("args", {})
    if file.endswith(".jsonl.gz"):
        return bytes([3 << 3 | bool(args.get("skip_bad"))]) + data
    mode = 1 if file.endswith(".txt") else 0
    return bytes([mode << 3 | (2 if "vocab" in args else 0) | bool(args.get("skip_bad"))]) + data


def _type_of(data: bytes) -> bytes | None:
    if len(data) < 10 or data[:4] != b"PSKD":
        return None
    (n,) = struct.unpack("<I", data[6:10])
    return data[10 : 10 + n] if 10 + n <= len(data) else None


def _safetensors_input(data: bytes) -> bytes | None:
    if len(data) < 8:
        return None
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return None
    return struct.pack("<H", min(len(data) - 8 - n, 65535)) + data[8 : 8 + n]


def run_one(target: str, scratch: Scratch, data: bytes) -> None:
    """Runs a target on one input (what the regression tests do for every kept input)."""
    TARGETS[target](scratch, data)


def reset(scratch: Scratch) -> None:
    """Drops what a target left in the scratch directory (the fixtures stay)."""
    for name in os.listdir(scratch.directory):
        if name != "fixtures":
            path = scratch.path(name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


# --------------------------------------------------------------------------------------------
# diff


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def diff_input(a: bytes, b: bytes | None, *, small_blocks: bool = False) -> bytes:
    """Two files as the ``diff`` target's input (b None: b is a copy of a)."""
    flags = (b is None) | small_blocks << 1
    if b is None:
        return bytes([flags]) + a
    return bytes([flags]) + struct.pack("<H", min(len(a), 65535)) + a[:65535] + b


def _diff_seeds(scratch: Scratch) -> list[bytes]:
    from pskd_jax.format.encodings import Encoding
    from pskd_jax.format.header import encode_header
    out = []
    containers = _container_seeds(scratch)
    for k, a in enumerate(containers):
        out.append(diff_input(a, None, small_blocks=k % 2 == 1))
        out.append(diff_input(a, containers[(k + 1) % len(containers)]))
    for values_a, values_b in (([1e308], [-1e308]), ([np.inf, 1.0], [np.inf, 2.0]), ([np.nan, 0.0], [0.0, 0.0]),
                               ([5e-324, 1e-300], [0.0, -1e-300]), ([1.5, -2.5, 3.0], [1.5, 2.5, -3.0])):
        n = len(values_a)
        head = encode_header(f"ℝ[{n}]", 1, [Encoding.F64])
        out.append(diff_input(head + np.array(values_a).tobytes(), head + np.array(values_b).tobytes(),
                              small_blocks=True))
    mixed = encode_header("(ℝ[3], idx[5][2], ℝ[2])", 2, [Encoding.F32, Encoding.F64, Encoding.BF16])
    rows = b"".join(np.array([1, 2, 3], np.float32).tobytes() + bytes([1, 4]) + bytes.fromhex("803f0040")
                    for _ in range(2))
    out.append(diff_input(mixed + rows, mixed + rows[::-1], small_blocks=True))
    return out


def t_diff(s: Scratch, data: bytes) -> None:
    """The bytes are two files (see :func:`diff_input`): ``diff`` answers a PskdError or the exact
    distance of their real leaves."""
    if not data:
        return
    flags = data[0]
    if flags & 1:
        a = b = data[1:]
    else:
        if len(data) < 3:
            return
        (n,) = struct.unpack("<H", data[1:3])
        a, b = data[3 : 3 + n], data[3 + n :]
    path_a, path_b = _write(s.path("a.psk.d"), a), _write(s.path("b.psk.d"), b)
    saved = distance_module.BLOCK_BYTES, distance_module.CHUNK_ELEMENTS
    if flags & 2:
        distance_module.BLOCK_BYTES, distance_module.CHUNK_ELEMENTS = 64, 3
    try:
        got = inspection.diff(path_a, path_b)
    except PskdError:
        return
    finally:
        distance_module.BLOCK_BYTES, distance_module.CHUNK_ELEMENTS = saved
    for name in ("diff_norm", "a_norm", "relative"):
        value = getattr(got, name)
        if not (math.isnan(value) or value >= 0):
            raise Finding(f"{name} is {value!r}")
    if a == b and not math.isnan(got.diff_norm) and got.diff_norm != 0.0:
        raise Finding(f"a file against itself: ‖a − b‖₂ = {got.diff_norm!r}")
    want = _reference_distance(path_a, path_b)
    if want is None:
        return
    elements, diff_norm, a_norm = want
    if got.elements != elements:
        raise Finding(f"{got.elements} elements compared, the files hold {elements} real elements")
    for name, value, exact in (("‖a − b‖₂", got.diff_norm, diff_norm), ("‖a‖₂", got.a_norm, a_norm)):
        if not _close(value, exact):
            raise Finding(f"{name} = {value!r}, exactly {exact!r}")


REFERENCE_LIMIT = 4096  # real elements the exact reference computes (a fuzz input is small)


def _reference_distance(path_a: str, path_b: str) -> tuple[int, float, float] | None:
    """(real elements, ‖a − b‖₂, ‖a‖₂) of two closed-type files, computed exactly (fractions) with
    diff's rule for non-finite values; None where it does not apply (params, too many values)."""
    try:
        with Reader(path_a, access="pread") as ra, Reader(path_b, access="pread") as rb:
            if ra.placement is None or rb.placement is None:
                return None
            real = [i for i, leaf in enumerate(ra.placement.layout.leaves) if leaf.is_real]
            elements = len(ra) * sum(ra.placement.layout.leaves[i].size for i in real)
            if elements == 0 or elements > REFERENCE_LIMIT:
                return (elements, None, None) if elements == 0 else None
            everything = np.arange(len(ra))
            leaves_a, leaves_b = ra.gather_leaves(everything), rb.gather_leaves(everything)
    except PskdError:
        return None  # (a gather checks idx bounds, which diff does not read)
    with np.errstate(invalid="ignore"):  # (signalling NaNs widen to NaNs)
        x = np.concatenate([np.asarray(leaves_a[i], dtype=np.float64).ravel() for i in real])
        y = np.concatenate([np.asarray(leaves_b[i], dtype=np.float64).ravel() for i in real])
    return elements, _exact_norm(x, y), _exact_norm(x, None)


def _exact_norm(x: np.ndarray, y: np.ndarray | None) -> float:
    """‖x − y‖₂ (or ‖x‖₂) exactly, then rounded; NaN and ±Inf by diff's rule."""
    from fractions import Fraction
    other = np.zeros_like(x) if y is None else y
    if np.isnan(x).any() or (y is not None and np.isnan(y).any()):
        return math.nan
    infinite = ~np.isfinite(x) | ~np.isfinite(other)
    if (infinite & (x != other)).any() or (y is None and infinite.any()):
        return math.inf
    total = sum((Fraction(float(p)) - Fraction(float(q))) ** 2 for p, q in zip(x[~infinite], other[~infinite]))
    if total == 0:
        return 0.0
    # sqrt of a fraction, rounded: through its integer square root at a scale past f64's precision
    shift = max(0, 240 - (total.numerator.bit_length() - total.denominator.bit_length())) // 2 * 2
    root = math.isqrt(total.numerator * (1 << shift) // total.denominator)
    try:
        return math.ldexp(float(root), -shift // 2) if root < (1 << 1000) else float(Fraction(root, 1 << (shift // 2)))
    except OverflowError:
        return math.inf


def _close(value: float, exact: float | None) -> bool:
    if exact is None:
        return True
    if math.isnan(exact) or math.isnan(value):
        return math.isnan(exact) and math.isnan(value)
    if math.isinf(exact) or math.isinf(value):
        return value == exact
    return abs(value - exact) <= 1e-12 * exact + 1e-320


TARGETS["diff"] = t_diff  # (defined after the seeds it shares with the container targets)


# --------------------------------------------------------------------------------------------
# segments: the compiled scan against numpy and a plain reference, in a process of its own


SEGMENT_TOKENS = (np.uint8, np.uint16, np.uint32)
SEGMENT_LENGTHS = (1, 2, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 0)  # (T = 0: windows of nothing)


def segments_case(data: bytes) -> tuple[np.ndarray, int, int | None, str]:
    """The case the bytes make: (inputs (n, T), boundary, bound, layout of the inputs in memory).

    Byte 0: the token dtype (u8, u16, u32), the boundary's and the bound's kind; byte 1: how the
    tokens are made (the bytes as tokens, every token the boundary, an alphabet of the boundary,
    the bound's neighbours and the dtype's largest); bytes 2, 3: T (0, a length about 32's
    multiples, or any up to 300); byte 4: n (0 to 5) and the inputs' memory (C order, a slice of a wider
    array, Fortran order); bytes 5 to 8: a raw boundary; then the tokens' bytes."""
    head = data[:9].ljust(9, b"\0")
    dtype = np.dtype(SEGMENT_TOKENS[head[0] % 3])
    largest = (1 << (8 * dtype.itemsize)) - 1
    raw = int.from_bytes(head[5:9], "little")
    boundary = (raw & largest, 0, largest, raw % (2 * largest + 2), raw & 0xFF, -1 - raw % 3)[head[0] // 3 % 6]
    bound_kind = head[0] // 18 % 10
    bound = (None, 0, 1, boundary, boundary + 1, largest, largest + 1, (1 << 64) - 1, 1 << 64,
             raw & largest)[bound_kind]
    if head[2] & 0x80:
        seq = SEGMENT_LENGTHS[head[3] % len(SEGMENT_LENGTHS)]
    else:
        seq = 1 + ((head[2] << 8) | head[3]) % 300
    n, memory = head[4] % 6, ("C", "slice", "F")[head[4] // 6 % 3]
    body = data[9:]
    size = n * seq
    mode = head[1] % 4
    if mode == 0 or not body:
        raw_tokens = (body or b"\0") * (size * dtype.itemsize // max(len(body), 1) + 1)
        tokens = np.frombuffer(raw_tokens[: size * dtype.itemsize], dtype=dtype.newbyteorder("<")).astype(dtype)
    elif mode == 1:
        tokens = np.full(size, boundary & largest if boundary >= 0 else 0, dtype)
    else:
        alphabet = [boundary, boundary + 1, boundary - 1, largest, 0,
                    (bound if bound is not None else 7) - 1, bound if bound is not None else 7]
        picks = np.frombuffer((body * (size // len(body) + 1))[:size], np.uint8) % (len(alphabet) if mode == 2 else 2)
        tokens = np.array([min(max(a, 0), largest) for a in alphabet], dtype=np.uint64).astype(dtype).take(picks)
    inputs = tokens.reshape(n, seq)
    if memory == "slice":
        wide = np.zeros((n, seq + 3), dtype)
        wide[:, 1 : seq + 1] = inputs
        inputs = wide[:, 1 : seq + 1]
    elif memory == "F":
        inputs = np.asfortranarray(inputs)
    return inputs, boundary, bound, memory


def segments_reference(inputs: np.ndarray, boundary: int, bound: int | None) -> tuple[list, list, bool]:
    """Ids, positions and whether every token is below the bound, token by token (the module's rules)."""
    ids, positions = [], []
    for row in inputs.tolist():
        segment, at = 1, 0
        ids.append([])
        positions.append([])
        for token in row:
            ids[-1].append(segment)
            positions[-1].append(at)
            segment, at = (segment + 1, 0) if token == boundary else (segment, at + 1)
    below = bound is None or inputs.size == 0 or all(token < bound for row in inputs.tolist() for token in row)
    return ids, positions, below


def segments_check(data: bytes) -> None:
    """The compiled scan (where built), the numpy path and the reference agree on one case (run in
    the segments worker process: a crash of the compiled scan takes that process only)."""
    from pskd_jax.corpus import segments as segments_module

    inputs, boundary, bound, memory = segments_case(data)
    want_ids, want_positions, want_below = segments_reference(inputs, boundary, bound)
    dtype = segments_module.segment_dtype(inputs.shape[1])
    native = segments_module._native
    scans: dict[str, Any] = {"compiled": native, "numpy": None}
    if native is not None and native.VECTOR_BYTES == 32:  # (its 16-byte form too, where it scans in 32)
        scans["compiled, 16-byte vectors"] = types.SimpleNamespace(fill=lambda *args: native.fill(*args, 16),
                                                                   gather=lambda *args: native.gather(*args, 16))
    answers = {}
    for name, scan in scans.items():
        segments_module._native = scan
        try:
            got = [segments_module.segment_ids_and_positions(inputs, boundary)]
            if memory == "C":  # (segments_below takes a gather's own C-contiguous windows)
                got.append(segments_module.segments_below(inputs, boundary, bound))
        finally:
            segments_module._native = native
        answers[name] = got
        for k, answer in enumerate(got):
            ids, positions = answer[0], answer[1]
            what = f"{name} {('segment_ids_and_positions', 'segments_below')[k]} of {inputs.dtype} ({memory}) " \
                   f"{inputs.shape}, boundary {boundary}, bound {bound}"
            if ids.dtype != dtype or positions.dtype != dtype or ids.shape != inputs.shape \
                    or positions.shape != inputs.shape:
                raise Finding(f"{what}: outputs {ids.dtype}{ids.shape}, {positions.dtype}{positions.shape}")
            if ids.tolist() != want_ids:
                raise Finding(f"{what}: segment ids {ids.tolist()}, the reference {want_ids}")
            if positions.tolist() != want_positions:
                raise Finding(f"{what}: positions {positions.tolist()}, the reference {want_positions}")
            if k == 1 and answer[2] is not want_below:
                raise Finding(f"{what}: below {answer[2]!r}, the reference {want_below}")


class SegmentsCrash(Exception):
    """The process running the compiled scan died (a signal: a segfault, a bus error, an abort)."""


class SegmentsError(Exception):
    """The segments worker raised something other than a Finding or a PskdError (its traceback)."""


_WORKER = r"""
import struct, sys, traceback
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import targets
from pskd_jax.errors import PskdError
read, write = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = read.read(4)
    if len(head) < 4:
        break
    data = read.read(struct.unpack("<I", head)[0])
    try:
        targets.segments_check(data)
        status, text = 0, ""
    except targets.Finding as e:
        status, text = 1, str(e)
    except PskdError:
        status, text = 0, ""
    except BaseException:
        status, text = 2, traceback.format_exc()
    message = text.encode("utf-8", "replace")[:1 << 16]
    write.write(struct.pack("<BI", status, len(message)) + message)
    write.flush()
"""
_segments_worker: list = []  # the worker process, started on first use, started again after a crash


def _segments_process():
    import subprocess
    import sys
    if _segments_worker and _segments_worker[0].poll() is None:
        return _segments_worker[0]
    _segments_worker.clear()
    here = os.path.dirname(os.path.abspath(__file__))
    _segments_worker.append(subprocess.Popen([sys.executable, "-c", _WORKER, ROOT, here], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1")))
    return _segments_worker[0]


def t_segments(s: Scratch, data: bytes) -> None:
    """The bytes make a batch of windows (:func:`segments_case`); the compiled scan and numpy must
    give the reference's segment ids, positions and bound check, run in a worker process so that
    a crash of the compiled scan is a finding (SegmentsCrash), not the fuzzer's end."""
    worker = _segments_process()
    done = False
    try:
        worker.stdin.write(struct.pack("<I", len(data)) + data)
        worker.stdin.flush()
        head = worker.stdout.read(5)
        if len(head) < 5:
            code = worker.wait()
            raise SegmentsCrash(f"the segments worker died (exit status {code}) on this input")
        status, length = struct.unpack("<BI", head)
        text = worker.stdout.read(length).decode("utf-8", "replace")
        done = True
    except BrokenPipeError:
        raise SegmentsCrash(f"the segments worker died (exit status {worker.wait()}) before this input") from None
    finally:
        if not done and worker.poll() is None:
            worker.kill()  # (a timeout in the middle of an answer: the next input starts a fresh worker)
            worker.wait()
    if status == 1:
        raise Finding(text)
    if status == 2:
        raise SegmentsError(text)


def _segments_seeds() -> list[bytes]:
    out = []
    for dtype in range(3):
        for kind, seq, n, mode in ((0, 32, 2, 0), (0, 33, 3, 2), (1, 1, 5, 1), (2, 64, 1, 2), (3, 129, 2, 0),
                                   (4, 31, 4, 2), (0, 300, 1, 0), (5, 16, 2, 3)):
            for bound_kind in (0, 3, 4, 6, 7):
                first = dtype + 3 * kind + 18 * bound_kind
                out.append(bytes([first % 256, mode, 0x80, SEGMENT_LENGTHS.index(seq) if seq in SEGMENT_LENGTHS
                                  else 0, n + 6 * (seq % 3)]) + struct.pack("<I", 10 + dtype)
                           + bytes(k % 251 for k in range(7, 7 + 3 * seq)) * 2)
    return out


# --------------------------------------------------------------------------------------------
# mixture: a mix(…) over small real files, its batches against the rules of docs/pipeline.md


MIX_COUNTS = (1, 2, 3, 5, 7, 10, 13, 64, 100)  # samples of the files the sources stream


def _mix_files(s: Scratch) -> list[str]:
    directory = os.path.join(s.fixtures, "mix")
    paths = [os.path.join(directory, f"m{k}.psk.d") for k in range(len(MIX_COUNTS))]
    if not os.path.exists(paths[-1]):
        os.makedirs(directory, exist_ok=True)
        for path, n in zip(paths, MIX_COUNTS):
            write(path, "ℝ[]", np.arange(n, dtype=np.float64), durable=False)
    return paths


def _mix_weight(kind: int, raw: bytes, previous: str | None) -> str:
    """A weight's text by kind: an integer, a decimal, a huge integer, a tiny decimal, the weight
    before it again, leading or trailing zeros, a one-digit integer."""
    number = int.from_bytes(raw, "little")
    if kind == 0:
        return str(1 + number % 1000)
    if kind == 1:
        return f"{number % 100}.{number % 997:03d}".lstrip("0").rjust(1, "0") if number % 100 or number % 997 else "0.5"
    if kind == 2:
        return str(10 ** (10 + number % 29) + number % 7)
    if kind == 3:
        return "0." + "0" * (number % 37) + str(1 + number % 9)
    if kind == 4 and previous is not None:
        return previous
    if kind == 5:
        return f"00{1 + number % 50}.{number % 10}00"
    return str(1 + number % 9)


def mixture_text(s: Scratch, data: bytes) -> str:
    """The pipeline text the bytes make: byte 0 the number of sources (2 to 9), byte 1 B, byte 2
    take, byte 3 the layout (newlines, a trailing comma, a name); then three bytes a source: its
    weight's kind, two bytes for the weight, and whether it is shuffled (its seed)."""
    head = data[:4].ljust(4, b"\0")
    count = 2 + head[0] % 8
    paths = _mix_files(s)
    sources, previous = [], None
    for k in range(count):
        piece = data[4 + 4 * k : 8 + 4 * k].ljust(4, b"\0")
        weight = _mix_weight(piece[0] % 7, piece[1:3], previous)
        previous = weight
        shuffle = f" |> shuffle(seed = {piece[3] * 7919})" if piece[3] & 1 else ""
        sources.append(f'stream "{paths[(k + head[3] // 8) % len(paths)]}"{shuffle} : {weight}')
    joiner = ",\n    " if head[3] & 1 else ", "
    text = "mix(" + joiner.join(sources) + ("," if head[3] & 2 else "") + f") |> batch(B = {1 + head[1] % 17})"
    if head[2] % 3:
        text += f" |> take(n = {1 + head[2] // 3})"
    return ("data = " if head[3] & 4 else "") + text


def t_mixture(s: Scratch, data: bytes) -> None:
    """The bytes make a ``mix(…)`` over small real files (:func:`mixture_text`): it reparses from
    ``str()`` to itself; its batches by ``batch_indices`` are those of iterating (from the start
    and from saved states); every prefix holds each source within one sample of its share, and
    each source's samples are its own stream (its epochs in its shuffle's order)."""
    text = mixture_text(s, data)
    try:
        mix = pipeline.parse_pipeline(text, base_dir=s.fixtures)
    except PskdError:
        return  # (weights whose total the schedule refuses, E9010)
    if not isinstance(mix, pipeline.Mixture):
        raise Finding(f"{text!r} parsed as {mix!r}")
    again = pipeline.parse_pipeline(str(mix), base_dir=s.fixtures)
    if again != mix or str(again) != str(mix):
        raise Finding(f"{text!r} → {str(mix)!r} reparses to {again!r}")
    counts = [pipeline.stream_facts(source.path).count for source in mix.sources]
    size, end = mix.batch_size, mix.end_batch
    weights = [source.weight for source in mix.sources]
    scale = math.lcm(*(w.denominator for w in weights))
    integers = [int(w * scale) for w in weights]
    common = math.gcd(*integers)
    integers = [w // common for w in integers]
    total = sum(integers)
    # The first batches, iterated, checked one by one against batch_indices and the rules.
    first = min(end, max(1, 600 // size))
    iterated = []
    for (state, (sources, indices)), j in zip(mix.iter_batches(counts), range(first)):
        if state.to_json() != {"epoch": 1, "batch": j + 1}:
            raise Finding(f"{mix}: the state after batch {j} is {state.to_json()}")
        direct = mix.batch_indices(counts, 1, j)
        if direct[0].tolist() != sources.tolist() or direct[1].tolist() != indices.tolist():
            raise Finding(f"{mix}: batch {j}: batch_indices gives {direct}, iterating {(sources, indices)}")
        iterated.append((sources, indices))
    if len(iterated) != first:
        raise Finding(f"{mix}: {len(iterated)} batches iterated, {first} expected")
    stream_sources = np.concatenate([b[0] for b in iterated])
    stream_indices = np.concatenate([b[1] for b in iterated])
    _check_mix_stream(mix, counts, integers, stream_sources, stream_indices, 0, [0] * len(counts))
    # A saved state resumes exactly.
    at = data[-1] % len(iterated) if data else 0
    state = pipeline.IteratorState.from_json(json.loads(json.dumps(pipeline.IteratorState(1, at).to_json())))
    resumed = [b for b, _ in zip(mix.iter_batches(counts, state), range(len(iterated) - at))]
    for k, (state_after, (sources, indices)) in enumerate(resumed):
        want = iterated[at + k]
        if state_after.batch != at + k + 1 or sources.tolist() != want[0].tolist() \
                or indices.tolist() != want[1].tolist():
            raise Finding(f"{mix}: resumed at batch {at}, batch {at + k} differs from the uninterrupted stream")
    # Far batches: batch_indices, iterating from a state there, and the period's reference agree.
    if total <= len(stream_sources) and end > 1:
        far = int.from_bytes(data[-8:].rjust(8, b"\0"), "little") % (end - 1) + 1
        direct = mix.batch_indices(counts, 1, far)
        _, (sources, indices) = next(iter(mix.iter_batches(counts, pipeline.IteratorState(1, far))))
        if direct[0].tolist() != sources.tolist() or direct[1].tolist() != indices.tolist():
            raise Finding(f"{mix}: batch {far}: batch_indices and an iterator started there disagree")
        p = far * size
        period, phase = divmod(p, total)
        before = [period * w + int(np.count_nonzero(stream_sources[:phase] == i)) for i, w in enumerate(integers)]
        _check_mix_stream(mix, counts, integers, direct[0], direct[1], p, before)


def _check_mix_stream(mix, counts, integers, sources, indices, first: int, before: list[int]) -> None:
    """Positions ``first …`` of a mix's stream, given each source's count of earlier positions:
    each prefix within one sample of its share, each sample the source's own next one."""
    total, k = sum(integers), len(counts)
    if sources.size and not (int(sources.min()) >= 0 and int(sources.max()) < k):
        raise Finding(f"{mix}: a position takes a source outside [0, {k})")
    ones = sources[:, None] == np.arange(k)[None, :]
    # Each position's count among its source's earlier positions, and every prefix's counts (Python
    # ints where a far position's counts would not fit int64 products).
    seen = np.cumsum(ones, axis=0, dtype=np.int64)
    mine = seen[np.arange(sources.size), sources] - 1
    for i, n in enumerate(counts):
        rows = (sources == i).nonzero()[0]
        if not rows.size:
            continue
        c = [before[i] + int(m) for m in mine[rows]]
        seed = mix.sources[i].seed
        want = []
        for value in c:
            epoch, place = divmod(value, n)
            want.append(place if seed is None else
                        int(pipeline.shuffle_order(n, seed=seed, epoch=epoch + 1, start=place, stop=place + 1)[0])
                        if first else None)
        if seed is not None and not first:  # (the stream's start: a few epochs, each order made once)
            orders: dict[int, list[int]] = {}
            for j, value in enumerate(c):
                epoch, place = divmod(value, n)
                if epoch not in orders:
                    orders[epoch] = pipeline.shuffle_order(n, seed=seed, epoch=epoch + 1).tolist()
                want[j] = orders[epoch][place]
        got = indices[rows].tolist()
        if got != want:
            j = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
            raise Finding(f"{mix}: position {first + int(rows[j])} is sample {got[j]} of source {i}, its sample "
                          f"{c[j]} is {want[j]}")
    wide = object if first else np.int64  # (from the start: products below 2**31 · 2**20)
    lengths = first + np.arange(1, sources.size + 1, dtype=wide)
    for i, w in enumerate(integers):
        held = seen[:, i].astype(wide) + before[i]
        off = np.abs(held * total - lengths * w)
        if off.size and off.max() >= total:
            j = int(np.argmax(off >= total))
            raise Finding(f"{mix}: the first {lengths[j]} positions hold {held[j]} of source {i}, its share is "
                          f"{lengths[j] * w}/{total}: more than one sample off")


def _mixture_seeds(s: Scratch) -> list[bytes]:
    out = []
    for count in range(8):
        for kind in range(7):
            out.append(bytes([count, 3 + kind, kind * 5, kind]) + bytes(
                b for k in range(count + 2) for b in ((kind + k) % 7, 17 * k + 1, k, k * 3)))
    return out


# --------------------------------------------------------------------------------------------
# parts_index: a parts index object beside real part objects, in a memory:// store


PARTS_URL = f"memory://fuzz-parts-{os.getpid()}/run/ck.psk.d"  # (a store of this process's own)
_parts_fixture: dict = {}


def _parts_checkpoint() -> dict:
    """Saves a checkpoint at :data:`PARTS_URL` once and rewrites it as three part objects and a
    parts index (the cuts of a save by several processes); returns what a read must give back."""
    if _parts_fixture:
        return _parts_fixture
    from pskd_jax.checkpoint.parts import PartsIndex, part_key
    from pskd_jax.storage import resolve
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": [np.int16(-3), np.arange(5, dtype=np.uint8)]}
    digests = checkpoint.save(PARTS_URL, tree, SaveOptions(name="Model", digest="xxh3_128")).digests
    store, where = resolve(PARTS_URL)
    raw = store.get(where.key)[0]
    cuts = [0, 7, len(raw) // 3, len(raw) // 2, len(raw) - 5, len(raw)]
    owners = [0, 2, 1, 0, 2]
    held: list[list[bytes]] = [[], [], []]
    extents: list[list[tuple[int, int, int]]] = [[], [], []]
    for start, stop, owner in zip(cuts, cuts[1:], owners):
        extents[owner].append((start, stop - start, sum(map(len, held[owner]))))
        held[owner].append(raw[start:stop])
    keys = [f"{part_key(where.key, p, 3)}.0123456789ab" for p in range(3)]
    for key, pieces in zip(keys, held):
        store.put(key, b"".join(pieces))
    index = PartsIndex.of(len(raw), keys, [sum(map(len, h)) for h in held],
                          [np.asarray(e, np.int64).reshape(-1, 3) for e in extents], PARTS_URL)
    _parts_fixture.update(tree=tree, digests=digests, raw=raw, index=index.encoded(), store=store, key=where.key,
                          layout=store.get(layout_path_for(where.key))[0])
    return _parts_fixture


def t_parts_index(s: Scratch, data: bytes) -> None:
    """The bytes are the parts index object of a checkpoint whose three part objects stand beside
    it (the layout object recording this index's version, as a save leaves it): ``restore`` with
    the save's digests gives the checkpoint bit for bit or a PskdError; ``Reader``, its samples and
    ``info`` give a result or a PskdError, never another exception."""
    fixture = _parts_checkpoint()
    store, key = fixture["store"], fixture["key"]
    store.put(key, data)
    layout = json.loads(fixture["layout"])
    layout["data"]["url"], layout["data"]["tag"] = PARTS_URL, store.info(key).tag
    store.put(layout_path_for(key), json.dumps(layout).encode())
    try:
        back = checkpoint.restore(PARTS_URL, as_numpy=True, digests=fixture["digests"])
    except PskdError as e:
        if not e.code.startswith("E9"):
            raise Finding(f"a refusal without its code: {e!r}") from e
    else:
        want, got = fixture["tree"], back
        if (np.asarray(got["w"]).tobytes() != want["w"].tobytes() or np.asarray(got["b"][0]).tolist() != -3
                or np.asarray(got["b"][1]).tolist() != want["b"][1].tolist()):
            raise Finding(f"a restore through the index gave {got!r}")
    try:
        with Reader(PARTS_URL) as reader:
            if reader.placement is not None and len(reader):
                reader[0]
            reader.raw_data()
        inspection.info_lines(PARTS_URL)
    except PskdError:
        pass


def _parts_index_seeds(s: Scratch) -> list[bytes]:
    fixture = _parts_checkpoint()
    index = json.loads(fixture["index"])
    out = [fixture["index"], fixture["raw"][:200]]
    variants = [dict(index, bytes=index["bytes"] + 1), dict(index, parts=index["parts"][:2]),
                dict(index, parts=[dict(p, bytes=p["bytes"] - 1) for p in index["parts"]]),
                dict(index, parts=[dict(p, extents=[[a, n, at + 1] for a, n, at in p["extents"]])
                                   for p in index["parts"]]),
                dict(index, parts=[dict(p, key=p["key"] + "x") for p in index["parts"]])]
    out += [json.dumps(v).encode() for v in variants]
    return out


# --------------------------------------------------------------------------------------------
# url: a text as a path or URL


URL_SECRETS = {"AWS_SECRET_ACCESS_KEY": "fuzzSecretKey0123", "AWS_ACCESS_KEY_ID": "AKIAFUZZFUZZFUZZ",
               "AWS_SESSION_TOKEN": "fuzzSessionTok456"}


def t_url(s: Scratch, data: bytes) -> None:
    """The bytes are a path or URL (UTF-8, bad bytes as surrogates; byte 0 may splice in one of the
    credentials the environment holds while it runs): ``locate`` gives a Location whose ``url``
    locates to the same place, or E9018; ``resolve`` of a ``memory://`` or local place gives its
    store; no message holds a credential."""
    if not data:
        return
    secret = list(URL_SECRETS.values())[data[0] % 4] if data[0] % 4 < 3 else ""
    text = data[1:].decode("utf-8", "surrogateescape").replace("%SECRET%", secret)
    from pskd_jax import storage
    saved = {name: os.environ.get(name) for name in URL_SECRETS}
    os.environ.update(URL_SECRETS)
    try:
        try:
            where = storage.locate(text)
        except PskdError as e:
            _check_url_message(text, e)
            return
        if not isinstance(where, storage.Location):
            raise Finding(f"locate({text!r}) gave {where!r}")
        try:
            again = storage.locate(where.url)
        except PskdError as e:
            raise Finding(f"locate({text!r}) is {where!r}, whose url {where.url!r} is refused: {e}") from e
        if again != where:
            raise Finding(f"locate({text!r}) is {where!r}, its url {where.url!r} locates to {again!r}")
        try:
            where.name, where.parent(), where.child("x")
            if where.scheme in ("memory", "file"):
                store, _ = storage.resolve(text)
                if where.scheme == "memory" and where.key and not where.key.endswith("/"):
                    store.info(where.key)
        except PskdError as e:
            _check_url_message(text, e)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_url_message(text: str, error: PskdError) -> None:
    if error.code != "E9018":
        raise Finding(f"{text!r}: refused with {error.code} where a place the toolkit cannot serve is E9018: "
                      f"{error.message}")
    shown = str(error)
    for secret in URL_SECRETS.values():
        if secret in shown:
            raise Finding(f"{text!r}: the message shows a credential: {shown!r}")


def _url_seeds() -> list[bytes]:
    texts = ["s3://bucket/key.psk.d", "gs://my-bucket/a/b/shards.json", "memory://store/x/y.psk.d", "memory://s/",
             "file:///tmp/x.psk.d", "file://localhost/tmp/a%20b", "relative/path.psk.d", "./a:b", "/abs/path",
             "s3:/x", "gs:key", "ftp://host/x", "S3://Bucket/k", "s3://b/", "s3://bucket//k", "s3://bucket/a/../b",
             "memory://%SECRET%/k", "s3://%SECRET%@bucket/k", "s3://AKIA:%SECRET%@bucket/k", "file://host/x",
             "s3://bucket/" + "k" * 1100, "memory://m/\x01", "memory://m/é漢", "", "s3://", "memory://",
             "file://", "file:///%ff", "s3://bucket/%SECRET%/../k"]
    return [bytes([k % 4]) + t.encode() for k, t in enumerate(texts)] + [b"\x00memory://m/\xff\xfe"]


TARGETS.update(segments=t_segments, mixture=t_mixture, parts_index=t_parts_index, url=t_url)
