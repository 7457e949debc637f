"""Reading corpus inputs and tokenizing their documents, a block of documents at a time.

:func:`find_inputs` turns the paths and URLs given into input files; :func:`token_blocks` is the
one place a build reads an input: it yields the input's token stream block by block, every
document followed by the boundary, bad documents reported to a :class:`BadInput`. An input may be
an object of a store (``s3://``, ``gs://``, ``memory://``): a ``.jsonl`` or ``.jsonl.gz`` object is
streamed, a ``.txt`` object (one document) is copied to a temporary file first. What a document
is, what counts as bad input and how a block is tokenized: ``docs/corpus.md`` (Building).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import gzip
import io
import itertools
import json
import os
import queue
import shutil
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pskd_jax._os.files import open_fd
from pskd_jax._os.jsonfile import json_kind
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.data.text import iter_text_blocks
from pskd_jax.errors import BadValueError, CorpusInputError, PskdError
from pskd_jax.storage import Location, is_url, locate, resolve

SUFFIXES = (".jsonl", ".jsonl.gz", ".txt")
BLOCK_BYTES = 1 << 20  # input read at a time; one block's documents are tokenized together
AHEAD = 2  # blocks read (and encoded) ahead of the one being written
EXAMPLES = 5  # bad documents quoted in a report


# --------------------------------------------------------------------------------------------
# Inputs


def find_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The input files, in order: each file as given, each directory's files sorted by path; in a
    store, each object as given, a URL ending in ``/`` for the objects directly below it (sorted by
    key), and a pattern (``*``, ``?``, ``[…]`` in the last part of its key) for the objects it
    matches there.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> for name in ("b.txt", "a/x.jsonl", "a/notes.md", ".hidden.txt"):
    ...     os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
    ...     _ = open(os.path.join(d, name), "w").write("x")
    >>> [os.path.relpath(p, d) for p in find_inputs([d])]
    ['a/x.jsonl', 'b.txt']
    """
    found: list[str] = []
    for given in [os.fspath(p) for p in inputs]:
        where = locate(given)  # E9018 for a URL the toolkit cannot serve
        if not where.is_local:
            found += _objects(given, where)
            continue
        given = where.path
        if os.path.isdir(given):
            below = []
            for root, dirs, files in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                below += [os.path.join(root, f) for f in files if not f.startswith(".") and f.endswith(SUFFIXES)]
            found += sorted(below, key=lambda p: os.path.relpath(p, given).split(os.sep))
        elif os.path.exists(given):
            if not given.endswith(SUFFIXES):
                raise CorpusInputError(f"{given}: not a .jsonl, .jsonl.gz or .txt file (or a directory of them)")
            found.append(given)
        else:
            raise CorpusInputError(f"{given}: no such file or directory")
    return found


def _objects(given: str, where: Location) -> list[str]:
    """The input objects a URL names: itself, those directly below a prefix ending in ``/``, or
    those a pattern in its last part matches (input suffixes only, hidden names passed over)."""
    store, _ = resolve(where)
    name = where.name
    if given.endswith("/") or not where.key or any(c in name for c in "*?["):
        prefix = where if given.endswith("/") or not where.key else where.parent()
        pattern = "*" if prefix is where else name
        listed = [o.key for o in store.list(prefix.key)]
        found = [prefix.child(key.rpartition("/")[2]).url for key in listed
                 if fnmatch.fnmatchcase(key.rpartition("/")[2], pattern)
                 and key.endswith(SUFFIXES) and not key.rpartition("/")[2].startswith(".")]
        _check_found(given, found, listed, prefix is where)
        return found
    if store.info(where.key) is None:
        raise CorpusInputError(f"{given}: no such object (a prefix is written with a trailing '/')")
    if not name.endswith(SUFFIXES):
        raise CorpusInputError(f"{given}: not a .jsonl, .jsonl.gz or .txt object (or a prefix ending in '/' of them)")
    return [where.url]


def _check_found(given: str, found: list[str], listed: list[str], whole_prefix: bool) -> None:
    """E9015 for a pattern that matches no input object, and for a prefix with no object directly
    below it: a store has no directories, so that prefix is what a directory not there is on a
    disk (E9015 'no such file or directory'), and a mistyped one would leave its documents out of
    the corpus without a word. A prefix holding objects but no input is a directory of other
    files: it gives no input, as on a disk."""
    if found or (whole_prefix and listed):
        return
    if whole_prefix:
        raise CorpusInputError(f"{given}: no object directly below this prefix (inputs are the objects just below "
                               "it, not those of the prefixes inside it)")
    raise CorpusInputError(f"{given}: the pattern matches no .jsonl, .jsonl.gz or .txt object (of {len(listed)} "
                           "objects directly below its prefix)")


def require_inputs(found: list[str], given: Sequence[str | os.PathLike[str]]) -> list[str]:
    """``found``, the input files of the paths ``given``, unless there is none, or one is found
    twice (E9015 naming them): a file named twice, or named and in a directory given, or reached
    through a link, would put each of its documents twice in the corpus."""
    if not found:
        raise CorpusInputError("no input files (.jsonl, .jsonl.gz, .txt) in " + ", ".join(map(str, given)))
    first: dict[tuple[object, ...], int] = {}
    for i, path in enumerate(found):
        identity = _input_identity(path)
        if identity in first:
            earlier = first[identity]
            raise CorpusInputError(f"{path}: input {i} is the file of input {earlier} ({found[earlier]}), "
                                   "under this name or another (a link, or a directory holding it); each input is "
                                   "built once, or its documents would appear twice in the corpus")
        first[identity] = i
    return found


def _input_identity(path: str) -> tuple[object, ...]:
    """An input's :func:`file_identity`; a URL only Beam serves is its own."""
    try:
        return file_identity(locate(path))
    except PskdError:  # (a URL of Beam's FileSystems, not the toolkit's: E9018 from locate)
        return ("url", path)


def file_identity(where: Location) -> tuple[object, ...]:
    """What tells one file from another: for a local file its device and inode (hard links and
    symbolic links to one file are one file), or its resolved path when it cannot be looked at;
    for an object its URL."""
    if not where.is_local:
        return ("object", where.url)
    real = os.path.realpath(where.path)
    try:
        st = os.stat(real)
    except (OSError, ValueError):
        return ("path", real)
    return ("inode", st.st_dev, st.st_ino)


def source_of(path: str) -> dict[str, Any]:
    """What identifies an input for a rerun: its path (as given), size and modification time; for
    an object of a store its URL, size and version tag."""
    if is_url(path):
        store, where = resolve(path)
        if not where.is_local:
            found = store.info(where.key)
            if found is None:
                raise CorpusInputError(f"{path}: cannot read: no such object")
            return {"path": path, "size": found.size, "tag": found.tag}
        path = where.path
    try:
        st = os.stat(path)
    except OSError as e:
        raise CorpusInputError(f"{path}: cannot read: {e.strerror or e}") from e
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class ObjectStream(io.RawIOBase):
    """An object of a store read as a stream, a chunk at a time (what ``gzip`` and the line
    reader read from): memory holds one chunk, whatever the object's size."""

    def __init__(self, url: str, chunk_bytes: int = 8 << 20):
        super().__init__()
        store, where = resolve(url)
        self._chunks = iter(store.chunks(where.key, chunk_bytes))
        self._held = memoryview(b"")
        self._position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        while not self._held:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._held = memoryview(piece).cast("B")
        n = min(len(out), len(self._held))
        out[:n] = self._held[:n]
        self._held = self._held[n:]
        self._position += n
        return n

    def tell(self) -> int:
        return self._position


@contextlib.contextmanager
def _local_copy(url: str) -> Iterator[str]:
    """A temporary local file holding the object at ``url`` (copied a chunk at a time)."""
    with tempfile.TemporaryDirectory(prefix="pskd-corpus-input.") as directory:
        local = os.path.join(directory, "input.txt")
        with ObjectStream(url) as stream, open(local, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 22)
        yield local


# --------------------------------------------------------------------------------------------
# Tokenizing documents


@dataclasses.dataclass
class BadInput:
    """Counts the documents left out under ``skip_bad`` and keeps the first few reasons."""

    skip: bool
    count: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, message: str) -> None:
        """Reports one bad document: raised (E9015), or counted when skipping."""
        if not self.skip:
            raise CorpusInputError(message + " (--skip-bad leaves such documents out)")
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(message)


class Encoder:
    """Documents → tokens, a block of documents at a time, each followed by the boundary token."""

    def __init__(self, tokenizer: Tokenizer, max_document_tokens: int | None):
        self.tokenizer = tokenizer
        self.limit = max_document_tokens
        self.table = tokenizer.code_point_table() if tokenizer.kind == "chars" else None

    def prepared(self, texts: list[str]) -> Any:
        """For ``hf``: the library's encodings of ``texts`` (the slow part of :meth:`encode`, which
        runs without the GIL, so a thread reading ahead does it), or None when the library fails on
        the block (:meth:`encode` then finds out why). None for the other kinds."""
        if self.tokenizer.kind != "hf" or not texts:
            return None
        try:
            return self.tokenizer.native().encode_batch_fast(texts, add_special_tokens=False)
        except Exception:  # the library's errors have no type of their own: encode() names them
            return None

    def encode(self, texts: list[str], prepared: Any = None) -> np.ndarray:
        """The tokens of non-empty ``texts``, a boundary after each (``prepared``: their
        :meth:`prepared` encodings, if made). Raises UnicodeEncodeError (a lone surrogate),
        ``_Unknown`` (characters outside the vocabulary), ``_Refused`` (the tokenizers library
        failed on a text) or ``_Boundary`` (a text reached the boundary id)."""
        t = self.tokenizer
        if t.kind == "hf":
            return self._encode_hf(texts, prepared)
        if t.kind == "bytes":
            parts = [s.encode("utf-8") for s in texts]
            if self.limit is not None:
                parts = [p[: self.limit] for p in parts]
            lengths = np.fromiter(map(len, parts), np.int64, len(parts))
            # A placeholder byte after each document, overwritten by the boundary: one cast and
            # one scatter of a value per document, whatever the text.
            out = np.frombuffer(b"\0".join(parts) + b"\0", np.uint8).astype(t.dtype)
        else:
            if self.limit is not None:
                texts = [s[: self.limit] for s in texts]
            lengths = np.fromiter(map(len, texts), np.int64, len(texts))
            points = np.frombuffer(b"\0\0\0\0".join([s.encode("utf-32-le") for s in texts]) + b"\0\0\0\0", "<u4")
            assert self.table is not None  # (a chars tokenizer's encoder has its table)
            out = self.table.take(points)
        ends = np.cumsum(lengths + 1) - 1
        out[ends] = t.boundary
        if self.table is not None:
            if out.max(initial=0) > t.boundary:  # the table's "unknown" is one past the boundary
                positions = np.flatnonzero(out > t.boundary)
                docs = np.searchsorted(ends, positions)
                first = np.flatnonzero(np.diff(docs, prepend=-1))  # each bad document's first unknown
                starts = np.concatenate([[0], ends + 1])
                raise _Unknown([(int(docs[j]), texts[docs[j]][positions[j] - starts[docs[j]]]) for j in first])
            out = out.astype(t.dtype, copy=False)
        return out

    def _encode_hf(self, texts: list[str], prepared: Any = None) -> np.ndarray:
        """``hf``: the block's texts encoded in one ``encode_batch`` on the library's side, each
        document's ids (a list the library builds) cut to the limit, then every id and boundary
        gathered into one array by one ``fromiter`` over the lists: no Python step per token."""
        t = self.tokenizer
        try:
            ids = [e.ids for e in prepared] if prepared is not None else t.encode_batch(texts)
        except Exception as e:  # the library's errors have no type of their own
            for s in texts:
                s.encode("utf-8")  # a lone surrogate: the UnicodeEncodeError that names it
            raise _Refused(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        if self.limit is not None:
            ids = [d[: self.limit] if len(d) > self.limit else d for d in ids]
        boundary = [t.boundary]
        total = sum(map(len, ids)) + len(ids)
        pairs = itertools.chain.from_iterable(zip(ids, itertools.repeat(boundary)))
        out = np.fromiter(itertools.chain.from_iterable(pairs), t.dtype, total)
        # The boundary id must come from here alone: a text the model encoded to it would be cut in
        # two (the tokenizer's check refuses the boundaries it can see reached; this is the guard).
        if t.boundary_token is not None and np.count_nonzero(out == t.boundary) != len(ids):
            raise _Boundary()
        return out


class _Refused(Exception):
    """The tokenizers library failed on a block of documents (its message)."""


class _Boundary(Exception):
    """A document of a block was encoded to the boundary id, which only the corpus may put there."""


class _Unknown(Exception):
    """Documents of a block holding characters outside the vocabulary: (index, first such character)."""

    def __init__(self, found: list[tuple[int, str]]):
        super().__init__(found)
        self.found = found


def _describe(ch: str) -> str:
    return f"{ch!r} (U+{ord(ch):04X})"


def _encode_checked(encoder: Encoder, texts: list[str], lines: list[int], path: str, bad: Callable[[str], None],
                    prepared: Any = None) -> tuple[np.ndarray, int]:
    """Encodes a block of documents, reporting (and, skipping, leaving out) the bad ones; returns
    the tokens and how many documents they hold.

    When the block fails, each document is encoded alone to find the bad ones, in line order: a
    block may hold documents bad in different ways (a lone surrogate, a character outside the
    vocabulary), and the first reported is the first line."""
    if not texts:
        return np.zeros(0, encoder.tokenizer.dtype), 0
    try:
        return encoder.encode(texts, prepared), len(texts)
    except (UnicodeEncodeError, _Unknown, _Refused, _Boundary):
        pass
    drop = set()
    for j, s in enumerate(texts):
        try:
            encoder.encode([s])
            continue
        except UnicodeEncodeError as e:
            message = (f"{path}:{lines[j]}: the text holds a lone surrogate U+{ord(s[e.start]):04X} (a \\u escape "
                       "that is half a pair), which UTF-8 cannot encode")
        except _Unknown as e:
            message = f"{path}:{lines[j]}: character {_describe(e.found[0][1])} is not in the vocabulary"
        except _Refused as e:
            message = f"{path}:{lines[j]}: the tokenizer failed on the text ({e})"
        except _Boundary:
            t = encoder.tokenizer
            message = (f"{path}:{lines[j]}: the text encodes to the boundary token {t.boundary_token!r} (id "
                       f"{t.boundary}), which would cut the document in two; build with another --boundary-token, "
                       "or '' for an id past the vocabulary")
        bad(message)
        drop.add(j)
    kept = [s for j, s in enumerate(texts) if j not in drop]
    return (encoder.encode(kept) if kept else np.zeros(0, encoder.tokenizer.dtype)), len(kept)


def _line_blocks(f: io.BufferedIOBase, path: str) -> Iterator[tuple[int, bytes]]:
    """``(first line number, block)``: the file in blocks of whole lines (a leading UTF-8 byte
    order mark dropped)."""
    carry: list[bytes] = []  # the start of a line longer than a block, in pieces
    line = 1
    while True:
        try:
            data = f.read(BLOCK_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            raise CorpusInputError(f"{path}: cannot read past line {line}: {e}") from e
        if not data:
            if carry:
                yield line, b"".join(carry)
            return
        if line == 1 and not carry and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        cut = data.rfind(b"\n") + 1
        if not cut:
            carry.append(data)
            continue
        block = b"".join([*carry, data[:cut]]) if carry else data[:cut]
        carry = [data[cut:]] if cut < len(data) else []
        yield line, block
        line += block.count(b"\n")


def _gives_twice(line: str, key: str) -> bool:
    """Whether the JSON object on ``line`` (one that parses) gives ``key`` twice at its top level.
    The pairs hook meets the objects inside first and the line's own object last."""
    last: list[list[str]] = [[]]

    def pairs(items: list[tuple[str, Any]]) -> dict:
        last[0] = [k for k, _ in items]
        return dict(items)

    json.loads(line, object_pairs_hook=pairs)
    return last[0].count(key) > 1


def _jsonl_texts(path: str, block: bytes, first: int, key: str, bad: Callable[[str], None]
                 ) -> tuple[list[str], list[int]]:
    """The documents of a block of JSONL lines and their line numbers (bad lines reported)."""
    try:
        lines = block.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
        for j, raw in enumerate(block.split(b"\n")):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                bad(f"{path}:{first + j}: invalid UTF-8 at byte {e.start} of the line "
                    f"(0x{raw[e.start:e.end].hex()}: {e.reason}); the input must be UTF-8")
                lines.append("")
    texts, numbers = [], []
    loads = json.loads
    quoted = json.dumps(key)  # (the key as a line spells it: a line holding it twice is looked at again)
    for j, line in enumerate(lines):
        try:
            doc = loads(line)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested too deep
            if line and not line.isspace():
                bad(f"{path}:{first + j}: not JSON ({getattr(e, 'msg', e)}, column {getattr(e, 'colno', '?')}); "
                    "each line of a .jsonl file is one JSON object")
            continue
        if type(doc) is not dict:
            bad(f"{path}:{first + j}: a JSON {type(doc).__name__}, not an object with a {key!r} key")
            continue
        if line.count(quoted) > 1 and _gives_twice(line, key):
            bad(f"{path}:{first + j}: the {key!r} key twice in one object (JSON would keep the last and drop "
                "the first without a word)")
            continue
        text = doc.get(key)
        if type(text) is not str:
            if key not in doc:
                shown = ", ".join(map(repr, list(doc)[:5])) or "none"
                bad(f"{path}:{first + j}: no {key!r} key (keys: {shown}); name the text key with --text-key")
            else:
                bad(f"{path}:{first + j}: the {key!r} value is {json_kind(text)}, not a string")
            continue
        if text:
            texts.append(text)
            numbers.append(first + j)
    return texts, numbers


def token_blocks(path: str, options: BuildOptions, *, bad: BadInput | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Yields ``(tokens, documents)`` for an input file, block by block: its token stream under
    ``options`` (its tokenizer, ``text_key`` and ``max_document_tokens``), each document followed by
    the boundary. Bad documents go to ``bad`` (default: raised, E9015). ``on_bytes`` hears how far
    into the file (in bytes, compressed bytes for ``.gz``) each block ends."""
    bad = bad if bad is not None else BadInput(False)
    encoder = Encoder(options.tokenizer, options.max_document_tokens)
    url = is_url(path) and not locate(path).is_local
    if path.endswith(".txt"):
        if not url:
            yield from _txt_tokens(locate(path).path, encoder, bad, on_bytes)
            return
        with _local_copy(path) as local:
            try:
                yield from _txt_tokens(local, encoder, _Renamed(bad, local, path), on_bytes)
            except PskdError as e:  # name the object, not its copy
                raise type(e)(e.message.replace(local, path)) from None
        return
    # A regular file only: a FIFO or a device is refused (E9002) at once, never waited on.
    raw: Any = ObjectStream(path) if url else open(open_fd(locate(path).path, CorpusInputError), "rb")  # noqa: SIM115 (closed by the with below)
    if path.endswith(".gz"):
        raw = _not_empty_gzip(raw, path)
    with raw, (gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else contextlib.nullcontext(raw)) as f:
        ahead = _ReadAhead(f, raw, path, options.text_key, encoder)
        try:
            for block in ahead:
                for message in block.messages:  # in the order a reader on this thread would report them
                    bad(message)
                tokens, documents = _encode_checked(encoder, block.texts, block.lines, path, bad, block.prepared)
                if on_bytes is not None:
                    on_bytes(block.end)
                yield tokens, documents
        finally:
            ahead.close()  # before the file is closed: the thread reads it


def _not_empty_gzip(raw: Any, path: str) -> Any:
    """``raw``, buffered; E9015 when it holds no byte at all. Python's gzip reads an empty file as
    an empty stream, where every gzip stream holds at least its header and trailer: a download
    cut short to nothing would build an empty shard without a word."""
    buffered = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
    if not buffered.peek(1):
        buffered.close()
        raise CorpusInputError(f"{path}: an empty file, not a gzip stream (one holds at least its header and "
                               "trailer): a download cut short?")
    return buffered


@dataclasses.dataclass
class _Block:
    """A block of a JSONL input as the thread reading ahead leaves it: its documents and their
    lines, the bad lines it found (in order, not yet reported), where in the file it ends, and
    for a ``tokenizer.json`` the library's encodings of its documents."""

    texts: list[str]
    lines: list[int]
    messages: list[str]
    end: int
    prepared: Any = None


class _ReadAhead:
    """The blocks of a JSONL input, read, parsed and (for a ``tokenizer.json``) encoded on a thread
    of their own, :data:`AHEAD` blocks ahead of the one being written. The tokenizers library
    releases the GIL while it encodes, so encoding block k+1 overlaps with turning block k's ids
    into tokens, hashing and writing them. Bad lines are handed over as messages and reported by
    the consumer, so that what is raised or counted, and in which order, is what a single thread
    would do; an error of the thread (an unreadable file) is raised where its block would be."""

    def __init__(self, f: Any, raw: Any, path: str, key: str, encoder: Encoder):
        self._queue: queue.Queue[_Block | BaseException | None] = queue.Queue(AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(f, raw, path, key, encoder),
                                        name="pskd-corpus-read-ahead", daemon=True)
        self._thread.start()

    def _read(self, f: Any, raw: Any, path: str, key: str, encoder: Encoder) -> None:
        try:
            for first, data in _line_blocks(f, path):
                messages: list[str] = []
                texts, lines = _jsonl_texts(path, data, first, key, messages.append)
                if not self._hand(_Block(texts, lines, messages, raw.tell(), encoder.prepared(texts))):
                    return
            self._hand(None)
        except BaseException as e:  # raised on the consumer's side, in its place
            self._hand(e)

    def _hand(self, item: _Block | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[_Block]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _txt_tokens(path: str, encoder: Encoder, bad: Callable[[str], None], on_bytes: Callable[[int], None] | None
                ) -> Iterator[tuple[np.ndarray, int]]:
    """A ``.txt`` file as one document, streamed. A bad document raises ``ResetShard`` under skip_bad
    once tokens may have been yielded (the caller then empties the shard)."""
    t = encoder.tokenizer
    if t.kind == "hf":
        yield from _txt_tokens_whole(path, encoder, bad, on_bytes)
        return
    limit = encoder.limit
    produced, lines = 0, 1
    try:
        for offset, block, points in iter_text_blocks(path, chunk_size=BLOCK_BYTES):
            if t.kind == "bytes":
                tokens = np.frombuffer(block, np.uint8)
                if limit is not None:
                    tokens = tokens[: limit - produced]
                tokens = tokens.astype(t.dtype)
            else:
                if limit is not None:
                    points = points[: limit - produced]
                assert encoder.table is not None  # (a chars tokenizer's encoder has its table)
                tokens = encoder.table.take(points)
                if len(tokens) and tokens.max() > t.boundary:
                    position = int(np.argmax(tokens > t.boundary))
                    text = block.decode("utf-8")
                    line = lines + text[:position].count("\n")
                    bad(f"{path}:{line}: character {_describe(text[position])} is not in the vocabulary")
                    raise ResetShard()
                tokens = tokens.astype(t.dtype, copy=False)
            lines += block.count(b"\n")
            produced += len(tokens)
            if on_bytes is not None:
                on_bytes(offset + len(block))
            yield tokens, 0
            if limit is not None and produced >= limit:
                break
    except PskdError as e:
        if not isinstance(e, BadValueError):  # invalid UTF-8 (E9004 from the text kernels) is bad input here
            raise
        bad(e.message)
        raise ResetShard() from None
    if produced:
        yield np.array([t.boundary], dtype=t.dtype), 1


def _txt_tokens_whole(path: str, encoder: Encoder, bad: Callable[[str], None], on_bytes: Callable[[int], None] | None
                      ) -> Iterator[tuple[np.ndarray, int]]:
    """A ``.txt`` document for a ``tokenizer.json``: read whole and encoded in one call, then cut
    to the limit (the ids of a part of a text need not be the first ids of the whole: a tokenizer
    merges across any cut)."""
    blocks, end = [], 0
    try:
        for offset, block, _ in iter_text_blocks(path, chunk_size=BLOCK_BYTES):
            blocks.append(block)
            end = offset + len(block)
    except PskdError as e:
        if not isinstance(e, BadValueError):  # invalid UTF-8 (E9004 from the text kernels) is bad input here
            raise
        bad(e.message)
        raise ResetShard() from None
    text = b"".join(blocks).decode("utf-8")
    del blocks
    if on_bytes is not None:
        on_bytes(end)
    if not text:
        return
    try:
        tokens = encoder.encode([text])
    except _Refused as e:
        bad(f"{path}:1: the tokenizer failed on the text ({e})")
        raise ResetShard() from None
    except _Boundary:
        t = encoder.tokenizer
        bad(f"{path}:1: the text encodes to the boundary token {t.boundary_token!r} (id {t.boundary}), which would "
            "cut the document in two; build with another --boundary-token, or '' for an id past the vocabulary")
        raise ResetShard() from None
    yield tokens, 1


class _Renamed:
    """A :class:`BadInput` hearing of bad documents in a copy of an input, under the input's name."""

    def __init__(self, bad: BadInput, local: str, url: str):
        self.bad, self.local, self.url = bad, local, url

    def __call__(self, message: str) -> None:
        self.bad(message.replace(self.local, self.url))


class ResetShard(Exception):
    """A ``.txt`` document turned out bad under skip_bad: its shard goes back to empty."""


__all__ = [
    "BLOCK_BYTES",
    "EXAMPLES",
    "SUFFIXES",
    "BadInput",
    "Encoder",
    "ObjectStream",
    "ResetShard",
    "file_identity",
    "find_inputs",
    "require_inputs",
    "source_of",
    "token_blocks",
]
