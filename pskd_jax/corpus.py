"""Sharded token corpora: tokenizers, the ``shards.json`` manifest, verification, training windows.

A corpus is a directory holding ``shards.json`` and the shards it lists. Building one is in
:mod:`pskd_jax.corpus_build`; this module reads, checks and serves it.

Tokens and shards
-----------------
- Tokenizers: ``bytes`` (the 256 byte values of the UTF-8 text are tokens 0..255) or ``chars`` (a
  character vocabulary as ``pskd chars`` writes it: token i is ``vocab[i]``, one character each).
  The boundary token is the tokenizer's size (256, or ``len(vocab)``), so the corpus's vocabulary
  has ``V = size + 1`` tokens.
- Every document is followed by one boundary token, the last document of a shard included: a
  shard is ``doc₀ ⟨b⟩ doc₁ ⟨b⟩ … docₙ ⟨b⟩``, so concatenating shards keeps every two documents
  apart by exactly one boundary, and ``documents`` equals the boundary tokens of a shard.
- A shard is a ``.psk.d`` file of type ``idx[V][]``: one token a sample, ``count`` its tokens.

The manifest
------------
``shards.json`` is the corpus's source of truth, a JSON object::

    {"format": "pskd-corpus", "version": 1,
     "tokenizer": {"kind": "bytes"} | {"kind": "chars", "vocab": [...]},
     "vocab_size": V, "boundary": V - 1,
     "build": {"text_key": "text", "max_document_tokens": null, "skip_bad": false},
     "shards": [{"path": "shard-00000.psk.d", "tokens": …, "documents": …, "sha256": "…",
                 "skipped": 0, "source": {"path": …, "size": …, "mtime_ns": …}}, …]}

``path`` is relative to the manifest's directory, with ``/`` separators; a path that is absolute,
holds ``..``, or resolves (through symlinks) outside that directory is refused (E9016). ``build``,
``skipped`` and ``source`` say how a shard was made (a rerun of a build uses them to keep the
shards that are up to date); readers need only the other fields. The global token stream is the
concatenation of the shards in manifest order.

The manifest is read strictly: anything but UTF-8 JSON (NaN, Infinity, a key twice in one object,
nesting deeper than the parser goes), a field of another type than the above (``1.0`` or ``true``
for an integer included), a count beyond ``2**63 - 1``, more documents than tokens, a ``build`` or
``source`` key not listed above, or a path holding a NUL byte is E9016 naming the field, never
another exception. :func:`write_manifest` refuses to write what a reader would refuse.

Errors: a malformed manifest or an unsafe path E9016; a shard that is missing, truncated, or whose
bytes or count differ from the manifest E9017, naming the shard.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import operator
import os
import re
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pskd_jax.container import ACCESS_MODES, Reader, encode_header, pread_spans, read_header
from pskd_jax.encodings import Encoding, index_dtype
from pskd_jax.errors import BAD_USAGE, CORPUS_DIR, SHARD_MISMATCH, TRUNCATED, PskdError
from pskd_jax.fileio import atomic_output, hash_file
from pskd_jax.text import CODE_POINTS, check_vocab, lm_window_count
from pskd_jax.windows import window_type

FORMAT = "pskd-corpus"
VERSION = 1
MANIFEST = "shards.json"
BYTE_TOKENS = 256


# --------------------------------------------------------------------------------------------
# Tokenizers


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """``bytes`` or ``chars`` (with its vocabulary); the boundary token is :attr:`boundary`.

    >>> t = Tokenizer.chars(["a", "b"])
    >>> t.size, t.boundary, t.vocab_size, t.sample_type, t.dtype
    (2, 2, 3, 'idx[3][]', dtype('uint8'))
    >>> Tokenizer.bytes().to_json(), Tokenizer.bytes().vocab_size
    ({'kind': 'bytes'}, 257)
    """

    kind: str
    vocab: tuple[str, ...] | None = None

    @classmethod
    def bytes(cls) -> "Tokenizer":
        return cls("bytes")

    @classmethod
    def chars(cls, vocab: Sequence[str], name: str = "vocabulary") -> "Tokenizer":
        """A character tokenizer: ``vocab`` is a list of distinct single characters (E9011 else)."""
        check_vocab(vocab, name)
        for i, token in enumerate(vocab):
            if len(token) != 1:
                raise PskdError(
                    "E9011", f"{name}: token {i} {token!r} has {len(token)} characters; a corpus's character "
                    "vocabulary maps one character to one token",
                )
        return cls("chars", tuple(vocab))

    @property
    def size(self) -> int:
        """Tokens before the boundary: 256 bytes, or the vocabulary's length."""
        return BYTE_TOKENS if self.kind == "bytes" else len(self.vocab)

    @property
    def boundary(self) -> int:
        return self.size

    @property
    def vocab_size(self) -> int:
        """V: every token, the boundary included."""
        return self.size + 1

    @property
    def dtype(self) -> np.dtype:
        return index_dtype(self.vocab_size)

    @property
    def sample_type(self) -> str:
        return f"idx[{self.vocab_size}][]"

    def header(self, count: int) -> bytes:
        """The ``.psk.d`` header of a shard of ``count`` tokens."""
        return encode_header(self.sample_type, count, [Encoding.F64])

    def code_point_table(self) -> np.ndarray:
        """For ``chars``: code point → token, ``vocab_size`` (one past the boundary) where unknown."""
        table = np.full(CODE_POINTS, self.vocab_size, dtype=index_dtype(self.vocab_size + 1))
        table[[ord(c) for c in self.vocab]] = np.arange(len(self.vocab))
        return table

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bytes"} if self.kind == "bytes" else {"kind": "chars", "vocab": list(self.vocab)}

    @classmethod
    def from_json(cls, data: Any, name: str) -> "Tokenizer":
        if not isinstance(data, dict) or data.get("kind") not in ("bytes", "chars"):
            got = f"the kind {_kind(data.get('kind'))}" if isinstance(data, dict) else _kind(data)
            raise PskdError(CORPUS_DIR, f"{name}: tokenizer must be {{\"kind\": \"bytes\"}} or "
                            f"{{\"kind\": \"chars\", \"vocab\": [...]}}, got {got}")
        if data["kind"] == "bytes":
            return cls.bytes()
        vocab = data.get("vocab")
        if not isinstance(vocab, list):
            raise PskdError(CORPUS_DIR, f"{name}: a chars tokenizer's 'vocab' is a list of characters, got "
                            f"{_kind(vocab)}")
        for i, token in enumerate(vocab):
            if not isinstance(token, str) or len(token) != 1:
                raise PskdError(CORPUS_DIR, f"{name}: tokenizer vocab: token {i} is {_kind(token)}, not one "
                                "character")
        try:
            return cls.chars(data.get("vocab"), f"{name}: tokenizer vocab")
        except PskdError as e:
            raise PskdError(CORPUS_DIR, e.message) from None


# --------------------------------------------------------------------------------------------
# The manifest


@dataclasses.dataclass(frozen=True)
class Shard:
    """One entry of ``shards.json``."""

    path: str
    tokens: int
    documents: int
    sha256: str
    skipped: int = 0
    source: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        entry = {"path": self.path, "tokens": self.tokens, "documents": self.documents, "sha256": self.sha256,
                 "skipped": self.skipped}
        if self.source is not None:
            entry["source"] = self.source
        return entry

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Shard":
        if not isinstance(data, dict):
            raise PskdError(CORPUS_DIR, f"{where}: a shard entry is an object, got {_kind(data)}")
        tokens = _count(data.get("tokens"), f"{where}: 'tokens'")
        documents = _count(data.get("documents"), f"{where}: 'documents'")
        if documents > tokens:
            raise PskdError(CORPUS_DIR, f"{where}: {documents} documents in {tokens} tokens; every document "
                            "ends with a boundary token, so a shard holds at least as many tokens as documents")
        path, digest = data.get("path"), data.get("sha256")
        if not isinstance(path, str) or not path:
            raise PskdError(CORPUS_DIR, f"{where}: 'path' must be a non-empty string, got {_kind(path)}")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise PskdError(CORPUS_DIR, f"{where}: 'sha256' must be 64 lowercase hex digits, got {_kind(digest)}")
        skipped = _count(data.get("skipped", 0), f"{where}: 'skipped'")
        source = data.get("source")
        if source is not None:
            _check_source(source, where)
        return cls(path, tokens, documents, digest, skipped, source)


PATH_MAX = 4096  # Linux's limit on a path: longer is refused before the system is asked
MAX_COUNT = (1 << 63) - 1  # a .psk.d count, and any count a manifest records, fits in a signed 64-bit integer
BUILD_KEYS = ("text_key", "max_document_tokens", "skip_bad")


def _kind(value: Any) -> str:
    """A JSON value in an error message: short, whatever its size or depth."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        n = len(value)
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {n} entr{'y' if n == 1 else 'ies'}"
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"{value[:77]!r}…"
    if isinstance(value, float):
        return f"the real number {value!r}"
    return repr(value)


def _count(value: Any, what: str) -> int:
    """An integer 0 <= value <= MAX_COUNT (not a bool, not a real such as 1.0), else E9016."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise PskdError(CORPUS_DIR, f"{what} must be an integer from 0 to 2**63 - 1, got {_kind(value)}")
    return value


def _check_source(source: Any, where: str) -> None:
    """``source``: ``{"path": str, "size": int >= 0, "mtime_ns": int}`` as a build records it."""
    if not isinstance(source, dict) or set(source) != {"path", "size", "mtime_ns"}:
        keys = sorted(source) if isinstance(source, dict) else None
        raise PskdError(CORPUS_DIR, f"{where}: 'source' must be an object of exactly 'path', 'size' and 'mtime_ns', "
                        f"got {_kind(source) if keys is None else 'the keys ' + _kind(keys)[:200]}")
    if not isinstance(source["path"], str):
        raise PskdError(CORPUS_DIR, f"{where}: 'source' 'path' must be a string, got {_kind(source['path'])}")
    _count(source["size"], f"{where}: 'source' 'size'")
    mtime = source["mtime_ns"]
    if isinstance(mtime, bool) or not isinstance(mtime, int) or not -MAX_COUNT <= mtime <= MAX_COUNT:
        raise PskdError(CORPUS_DIR, f"{where}: 'source' 'mtime_ns' must be a 64-bit integer, got {_kind(mtime)}")


def check_build(build: Any, where: str) -> dict[str, Any]:
    """The ``build`` object: any of ``text_key`` (a non-empty string), ``max_document_tokens``
    (null or an integer >= 1) and ``skip_bad`` (true or false), nothing else (E9016)."""
    if not isinstance(build, dict):
        raise PskdError(CORPUS_DIR, f"{where}: 'build' must be an object, got {_kind(build)}")
    unknown = [k for k in build if k not in BUILD_KEYS]
    if unknown:
        raise PskdError(CORPUS_DIR, f"{where}: 'build' holds {_kind(unknown[0])}; its keys are "
                        + ", ".join(map(repr, BUILD_KEYS)))
    if "text_key" in build and (not isinstance(build["text_key"], str) or not build["text_key"]):
        raise PskdError(CORPUS_DIR, f"{where}: 'build' 'text_key' must be a non-empty string, got "
                        f"{_kind(build['text_key'])}")
    limit = build.get("max_document_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_COUNT):
        raise PskdError(CORPUS_DIR, f"{where}: 'build' 'max_document_tokens' must be null or an integer >= 1, got "
                        f"{_kind(limit)}")
    if "skip_bad" in build and not isinstance(build["skip_bad"], bool):
        raise PskdError(CORPUS_DIR, f"{where}: 'build' 'skip_bad' must be true or false, got "
                        f"{_kind(build['skip_bad'])}")
    return build


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A parsed ``shards.json``; :meth:`shard_path` gives a shard's checked location."""

    path: str
    tokenizer: Tokenizer
    shards: tuple[Shard, ...]
    build: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def boundary(self) -> int:
        return self.tokenizer.boundary

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    def shard_path(self, i: int) -> str:
        """Where shard i lies, refusing a path that leaves the manifest's directory (E9016)."""
        return safe_path(self.directory, self.shards[i].path, f"{self.path}: shard {i}")

    def to_bytes(self) -> bytes:
        return manifest_bytes(self.tokenizer, self.shards, self.build)


def safe_path(directory: str, relative: str, where: str) -> str:
    """``directory/relative`` when it stays inside ``directory`` (symlinks resolved), else E9016.

    >>> safe_path("/data/c", "a/s.psk.d", "m"), safe_path("/data/c", "s.psk.d", "m")
    ('/data/c/a/s.psk.d', '/data/c/s.psk.d')
    >>> safe_path("/data/c", "../x.psk.d", "m")
    Traceback (most recent call last):
    ...
    pskd_jax.errors.PskdError: E9016: m: path '../x.psk.d' leaves the manifest's directory (it holds '..')
    """
    if len(relative) > PATH_MAX:
        raise PskdError(CORPUS_DIR, f"{where}: path {relative[:40]!r}… of {len(relative)} characters is longer "
                        f"than a path may be ({PATH_MAX})")
    if "\0" in relative:
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} holds a NUL byte, which no file name holds")
    try:
        os.fsencode(relative)
    except UnicodeError:
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} holds a lone surrogate, which no file name "
                        "of this system holds") from None
    if os.path.isabs(relative) or relative.startswith(("/", "\\")):
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} is absolute; shard paths are relative to the "
                        "manifest's directory")
    parts = relative.replace("\\", "/").split("/")
    if ".." in parts:
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} leaves the manifest's directory (it holds '..')")
    if parts[-1] in ("", "."):
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} names a directory, not a shard file")
    path = os.path.join(directory, *[p for p in parts if p not in ("", ".")])
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise PskdError(CORPUS_DIR, f"{where}: path {relative!r} resolves to {real}, outside the manifest's "
                        f"directory {root} (through a symlink)")
    return path


def manifest_json(tokenizer: Tokenizer, shards: Iterable[Shard], build: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The manifest as a JSON-ready dict, keys in their documented order."""
    data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer.to_json(),
                            "vocab_size": tokenizer.vocab_size, "boundary": tokenizer.boundary}
    if build is not None:
        data["build"] = dict(build)
    data["shards"] = [s.to_json() for s in shards]
    return data


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: Any) -> str:
    """``json.dumps`` keeping non-ASCII characters as they are, except lone surrogates (a file name
    that is not UTF-8, as Python decodes it), written as ``\\uXXXX`` escapes: the text then always
    encodes as UTF-8, and decodes back to the same value.

    >>> json_text({"path": "caf" + chr(0xDCE9) + ".txt", "é": 1})
    '{"path": "caf\\\\udce9.txt", "é": 1}'
    """
    text = json.dumps(value, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def manifest_bytes(tokenizer: Tokenizer, shards: Iterable[Shard], build: dict[str, Any] | None = None) -> bytes:
    """The manifest's bytes: one top-level key a line, one shard a line (diffable, deterministic)."""
    data = manifest_json(tokenizer, shards, build)
    entries = data.pop("shards")
    dump = json_text
    lines = [f"  {dump(k)}: {dump(v)}," for k, v in data.items()]
    body = ",\n".join(f"    {dump(e)}" for e in entries)
    text = "{\n" + "\n".join(lines) + '\n  "shards": [' + (f"\n{body}\n  " if entries else "") + "]\n}\n"
    return text.encode("utf-8")


def write_manifest(path: str | os.PathLike, tokenizer: Tokenizer, shards: Sequence[Shard],
                   build: dict[str, Any] | None = None) -> Manifest:
    """Writes ``shards.json`` atomically (the old file or the new one, never a torn one).

    What a reader would refuse is refused here first (E9016): the bytes are parsed back and every
    shard path checked before anything is written."""
    path = os.fspath(path)
    data = manifest_bytes(tokenizer, shards, build)
    manifest = parse_manifest(decode_manifest(data, path), path)
    for i in range(len(manifest.shards)):
        manifest.shard_path(i)
    with atomic_output(path) as f:
        f.write(data)
    return manifest


def parse_manifest(data: Any, path: str) -> Manifest:
    """Checks a decoded manifest (E9016 naming the field) and returns it."""
    if not isinstance(data, dict):
        raise PskdError(CORPUS_DIR, f"{path}: a corpus manifest is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise PskdError(CORPUS_DIR, f"{path}: format is {_kind(data.get('format'))}, expected {FORMAT!r}")
    version = data.get("version")
    if type(version) is not int or version != VERSION:  # not 1.0, not true
        raise PskdError(CORPUS_DIR, f"{path}: version {_kind(version)}; this reader reads version {VERSION}")
    tokenizer = Tokenizer.from_json(data.get("tokenizer"), path)
    for key, expected in (("vocab_size", tokenizer.vocab_size), ("boundary", tokenizer.boundary)):
        if type(data.get(key)) is not int or data.get(key) != expected:
            raise PskdError(CORPUS_DIR, f"{path}: {key} is {_kind(data.get(key))}, but a {tokenizer.kind} tokenizer "
                            f"of {tokenizer.size} tokens makes it {expected}")
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise PskdError(CORPUS_DIR, f"{path}: 'shards' must be a list, got {_kind(shards)}")
    build = check_build(data.get("build", {}), path)
    return Manifest(path, tokenizer, tuple(Shard.from_json(s, f"{path}: shard {i}") for i, s in enumerate(shards)),
                    build)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {_kind(twice)} appears twice in one object")
    return data


def decode_manifest(raw: bytes, path: str) -> Any:
    """The JSON value of a manifest's bytes, E9016 for anything but strict JSON: not UTF-8, not
    JSON, NaN or Infinity, a key twice in one object, nesting too deep for the parser, an integer
    of more digits than Python converts."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_constant, object_pairs_hook=_object)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        what = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise PskdError(CORPUS_DIR, f"{path}: not a JSON manifest ({what[:200]})") from None


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Reads and checks ``shards.json`` (E9016 if malformed or if a shard path leaves its directory)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PskdError(CORPUS_DIR, f"{path}: cannot read the corpus manifest: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the path
        raise PskdError(CORPUS_DIR, f"{path!r}: cannot read the corpus manifest: a path holds no NUL byte") from None
    manifest = parse_manifest(decode_manifest(raw, path), path)
    for i in range(len(manifest.shards)):
        manifest.shard_path(i)
    return manifest


# --------------------------------------------------------------------------------------------
# Verification

HASH_BLOCK = 1 << 20  # bytes hashed at a time: hashlib and the read both release the GIL


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a whole file, as ``sha256sum`` prints it (E9017 if it cannot be read)."""
    try:
        return hash_file(path, hashlib.sha256(), block=HASH_BLOCK)
    except PskdError as e:  # a shard that cannot be read does not verify
        raise PskdError(SHARD_MISMATCH, e.message) from None


def shard_problem(path: str, shard: Shard, tokenizer: Tokenizer, *, digest: bool = True) -> str | None:
    """What is wrong with the shard file at ``path`` against its entry, or None when it matches:
    its type, header count, size (no trailing bytes), and (``digest``) its sha256."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        return f"missing ({e.strerror or e})"
    try:
        with open(path, "rb") as f:
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
        raise PskdError(SHARD_MISMATCH, f"{manifest.path}: shard {i} {manifest.shards[i].path}: {problems[i]}{others}")
    header = len(manifest.tokenizer.header(0))
    size = sum(header + s.tokens * manifest.tokenizer.dtype.itemsize for s in manifest.shards)
    return VerifyResult(manifest, len(paths), manifest.tokens, size)


# --------------------------------------------------------------------------------------------
# Inspection


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
    from pskd_jax.corpus_build import directory_lock  # corpus_build imports this module

    if not manifests:
        raise PskdError(BAD_USAGE, "merge needs at least one manifest")
    output = os.fspath(output)
    root = os.path.dirname(os.path.abspath(output))
    first = read_manifest(manifests[0])
    shards: list[Shard] = []
    seen: dict[str, str] = {}  # a shard's real path → the manifest that listed it first
    for path in manifests:
        m = first if path is manifests[0] else read_manifest(path)
        if m.tokenizer != first.tokenizer:
            raise PskdError(CORPUS_DIR, f"{m.path}: its tokenizer ({_describe_tokenizer(m.tokenizer)}) differs from "
                            f"{first.path}'s ({_describe_tokenizer(first.tokenizer)}); only corpora of one "
                            "vocabulary merge")
        if m.build != first.build:
            differ = sorted(k for k in set(m.build) | set(first.build) if m.build.get(k) != first.build.get(k))
            raise PskdError(CORPUS_DIR, f"{m.path}: its build options differ from {first.path}'s ("
                            + ", ".join(f"{k} {m.build.get(k)!r} against {first.build.get(k)!r}" for k in differ)
                            + "); only corpora built alike merge")
        for i, shard in enumerate(m.shards):
            where = os.path.abspath(m.shard_path(i))
            real = os.path.realpath(where)
            if real in seen:
                raise PskdError(CORPUS_DIR, f"{m.path}: shard {i} {shard.path} is {real}, which {seen[real]} lists "
                                "already; a merged corpus lists each shard once")
            seen[real] = m.path
            relative = os.path.relpath(where, root)
            if relative.split(os.sep)[0] == "..":
                raise PskdError(CORPUS_DIR, f"{m.path}: shard {shard.path} lies outside {root}, the directory of "
                                f"{output}; put the merged manifest in a directory above every shard")
            shards.append(dataclasses.replace(shard, path=relative.replace(os.sep, "/")))
    with directory_lock(root):
        return write_manifest(output, first.tokenizer, shards, first.build)


def _describe_tokenizer(t: Tokenizer) -> str:
    if t.kind == "bytes":
        return f"bytes, vocabulary {t.vocab_size}"
    shown = "".join(t.vocab[:20])
    return f"chars, {t.size} characters {shown!r}{'…' if t.size > 20 else ''}, vocabulary {t.vocab_size}"


# --------------------------------------------------------------------------------------------
# Windows over the global token stream


class CorpusWindows:
    """Language-model windows ``(idx[V][seq: T], idx[V][seq: T])`` cut from the global token stream.

    Window w starts at token ``w * stride`` of the stream (the shards concatenated in manifest
    order): its input is the T tokens from there, its target the same shifted by one. Windows
    cross shard boundaries freely; the samples are those ``pskd lm-windows`` writes from the
    concatenated tokens. A source for :class:`pskd_jax.loader.Loader` and a pipeline like a
    Reader: ``len``, ``[w]`` and ``gather(indices)``.

    Each shard is mapped once. ``gather`` finds every window's shard with one ``searchsorted``,
    gathers the inputs and the targets of every window that lies inside a shard with one fancy
    index each over views spanning all the maps (see ``_address_views``), and assembles the few
    that cross a boundary from pieces.
    ``verify=True`` hashes every shard first (:func:`verify_corpus`); in any case each shard's
    type, count and size are checked against the manifest when it is opened (E9017).

    ``access="pread"`` reads each window's T + 1 tokens with one ``preadv`` instead (pieces for a
    window across shards), as ``Reader(access="pread")`` does: slower per window, but the shards'
    pages never join the process's resident set.
    """

    def __init__(self, manifest_path: str | os.PathLike, *, seq: int, stride: int | None = None,
                 verify: bool = False, workers: int | None = None, access: str = "mmap"):
        if access not in ACCESS_MODES:
            raise PskdError(BAD_USAGE, f"{manifest_path}: access is one of {', '.join(ACCESS_MODES)}, got {access!r}")
        self.access = access
        stride = seq if stride is None else stride
        for name, value in (("seq", seq), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise PskdError(BAD_USAGE, f"{name} must be an integer >= 1, got {value!r}")
        self.path = os.fspath(manifest_path)
        self.seq, self.stride = int(seq), int(stride)
        self.manifest = verify_corpus(self.path, workers=workers).manifest if verify else read_manifest(self.path)
        self.tokenizer = self.manifest.tokenizer
        self.dtype = self.tokenizer.dtype
        self._readers: list[Reader] = []
        self._tokens: list[np.ndarray] = []
        try:
            for i, shard in enumerate(self.manifest.shards):
                path = self.manifest.shard_path(i)
                problem = shard_problem(path, shard, self.tokenizer, digest=False)
                if problem is not None:
                    raise PskdError(SHARD_MISMATCH, f"{self.path}: shard {i} {shard.path}: {problem}")
                reader = Reader(path, access=access)
                self._readers.append(reader)
                self._tokens.append(reader.leaves()[0])
        except BaseException:
            self.close()
            raise
        counts = np.array([len(t) for t in self._tokens], dtype=np.int64)
        self._counts = counts
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # shard k: [off[k], off[k+1])
        self._bounds = self._offsets[1:-1]  # searchsorted(bounds, start, "right") is the start's shard
        self._inside_end = self._offsets[:-1] + counts - self.seq  # a window starting before it fits the shard
        self.total_tokens = int(self._offsets[-1])
        self._length = lm_window_count(self.total_tokens, self.seq, self.stride)
        self._inputs, self._targets, self._shift = self._address_views()
        # What access="pread" reads with, per shard: its descriptor, and where its tokens start.
        self._fds = [reader._fd for reader in self._readers]
        self._data_offsets = np.array([reader.header.data_offset for reader in self._readers], dtype=np.int64)

    def _address_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of T-token records over every shard at once, the inputs' and the targets' (one
        token on), and what turns a stream position into a record index, per shard.

        The shards are mapped at different addresses of this process. A view starts at the lowest
        mapped token and steps one token at a time (records overlap), so a record index is an
        address: record ``p + shift[k]`` of the inputs' view is tokens ``p .. p + T - 1`` of the
        stream when they lie in shard k. Only such records are ever indexed; the gaps between the
        maps are never touched. One fancy index per view then gathers a batch whose windows lie in
        any number of shards, straight into the contiguous (B, T) arrays it returns: a plain copy
        of each window's bytes (void records: never a copy of a shard, whatever its alignment).
        The maps stay valid while ``self._tokens`` (views of them) lives: a map does not close
        under a view.
        """
        item = self.dtype.itemsize
        record = np.dtype((np.void, self.seq * item))
        live = [k for k, t in enumerate(self._tokens) if len(t) > self.seq]
        shift = np.zeros(len(self._tokens), dtype=np.int64)
        if not live:
            return np.zeros(0, dtype=record), np.zeros(0, dtype=record), shift
        address = {k: self._tokens[k].__array_interface__["data"][0] for k in live}
        low = min(address.values())
        # Every shard has the same header, so its tokens start at the same offset within a page:
        # the distance between two shards is a whole number of tokens.
        if any((a - low) % item for a in address.values()):
            raise PskdError(SHARD_MISMATCH, f"{self.path}: shards whose tokens are not aligned alike")
        high = max(address[k] + len(self._tokens[k]) * item for k in live)
        for k in live:
            shift[k] = (address[k] - low) // item - self._offsets[k]
        base = self._tokens[min(live, key=address.get)].view(np.uint8)
        span = (high - low) // item - self.seq  # record starts whose window, target included, ends by high
        views = [as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]), shape=(span,), strides=(item,),
                            writeable=False) for skip in (0, item)]
        return views[0], views[1], shift

    # -- the source protocol -------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def boundary(self) -> int:
        return self.tokenizer.boundary

    @property
    def type_text(self) -> str:
        """The sample type, as an ``lm-windows`` file of the same windows has it."""
        return window_type(self.vocab_size, self.seq)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``index`` as ``(inputs, targets)``, each ``(seq,)``."""
        try:
            index = operator.index(index)
        except TypeError:
            raise PskdError(BAD_USAGE, f"{self.path}: a window index is an integer, got {index!r}") from None
        inputs, targets = self.gather(np.array([index], dtype=np.int64))
        return inputs[0], targets[0]

    def stream(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream (a fresh array)."""
        if not 0 <= start <= stop <= self.total_tokens:
            raise PskdError(BAD_USAGE, f"{self.path}: tokens [{start}, {stop}) are not inside the stream of "
                            f"{self.total_tokens} tokens")
        out = np.empty(stop - start, dtype=self.dtype)
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        k, at = first, start
        while at < stop:
            if self._counts[k]:
                local = at - int(self._offsets[k])
                take = min(stop - at, int(self._counts[k]) - local)
                if self.access == "pread":
                    self._read_tokens(k, local, out[at - start : at - start + take])
                else:
                    out[at - start : at - start + take] = self._tokens[k][local : local + take]
                at += take
            k += 1
        return out

    def _read_tokens(self, shard: int, local: int, out: np.ndarray) -> None:
        """Tokens ``local ..`` of a shard into ``out`` with one ``preadv`` (``access="pread"``)."""
        reader = self._readers[shard]
        item = self.dtype.itemsize
        pread_spans(reader._fd, [memoryview(out.view(np.uint8))], [reader.header.data_offset + local * item],
                    reader.path)

    def _gather_read(self, starts: np.ndarray, shard: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``gather`` with ``access="pread"``: each window inside one shard read with one ``preadv``
        (through ``map``), the rare one across shards from pieces."""
        n, seq, item = len(starts), self.seq, self.dtype.itemsize
        windows = np.empty((n, seq + 1), self.dtype)
        flat = memoryview(windows.reshape(-1).view(np.uint8))
        width = (seq + 1) * item
        rows = np.flatnonzero(inside).tolist()
        inner_shards = shard[inside]
        fds = [self._fds[k] for k in inner_shards.tolist()]
        offsets = self._data_offsets.take(inner_shards) + (starts[inside] - self._offsets.take(inner_shards)) * item
        pread_spans(fds, [flat[r * width : (r + 1) * width] for r in rows], offsets.tolist(), self.path)
        for row in np.flatnonzero(~inside).tolist():
            windows[row] = self.stream(int(starts[row]), int(starts[row]) + seq + 1)
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])

    def gather(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``indices`` as ``(inputs, targets)``, each ``(len(indices), seq)`` and contiguous."""
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
            raise PskdError(BAD_USAGE, f"{self.path}: window indices are one axis of integers, got "
                            f"{indices.dtype} of shape {indices.shape}")
        n, count = len(indices), self._length
        if n and (indices.min() < -count or indices.max() >= count):
            bad = indices[(indices < -count) | (indices >= count)][0]
            raise PskdError(TRUNCATED, f"{self.path}: window {bad} is beyond the {count} windows of the corpus")
        if not self._readers and self.manifest.shards:
            raise PskdError(BAD_USAGE, f"{self.path}: the windows were closed")
        seq, dtype = self.seq, self.dtype
        tokens, input_view, target_view = self._tokens, self._inputs, self._targets  # held: the maps stay open
        position = indices.astype(np.int64)
        if n and indices.min() < 0:
            position %= count
        position *= self.stride  # each window's start in the stream
        shard = self._bounds.searchsorted(position, side="right")
        inside = position < self._inside_end.take(shard)  # all T + 1 tokens in the start's shard
        if self.access == "pread":
            return self._gather_read(position, shard, inside)
        crossing = np.flatnonzero(~inside) if n else position[:0]
        starts = position.copy() if len(crossing) else position
        position += self._shift.take(shard)  # now a record index of the views
        if len(input_view) and len(crossing) < n:
            if len(crossing):
                position[crossing] = position[np.argmax(inside)]  # any record inside: those rows are redone
            inputs = input_view[position].view(dtype).reshape(n, seq)
            targets = target_view[position].view(dtype).reshape(n, seq)
        else:
            inputs, targets = np.empty((n, seq), dtype), np.empty((n, seq), dtype)
        for row in crossing.tolist():  # across a shard boundary: from pieces
            window = self.stream(int(starts[row]), int(starts[row]) + seq + 1)
            inputs[row], targets[row] = window[:-1], window[1:]
        del tokens
        return inputs, targets

    # -- pickling (worker processes) and lifetime ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The manifest path and the window shape; the shards are mapped again where unpickled."""
        return {"path": self.path, "seq": self.seq, "stride": self.stride,
                "manifest": self.manifest.to_bytes(), "access": self.access}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], seq=state["seq"], stride=state["stride"], access=state.get("access", "mmap"))
        if self.manifest.to_bytes() != state["manifest"]:
            self.close()
            raise PskdError(SHARD_MISMATCH, f"{self.path}: the manifest changed since the source was pickled")

    def close(self) -> None:
        self._inputs = self._targets = np.zeros(0, np.uint8)
        self._tokens, self._fds = [], []
        for reader in self._readers:
            reader.close()
        self._readers = []

    def __enter__(self) -> "CorpusWindows":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def is_manifest(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a corpus manifest (a JSON object whose format is ``pskd-corpus``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head[:1] != b"{":
                return False
            f.seek(0)
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


__all__ = [
    "BYTE_TOKENS",
    "CorpusWindows",
    "FORMAT",
    "MANIFEST",
    "Manifest",
    "Shard",
    "Tokenizer",
    "VERSION",
    "VerifyResult",
    "check_build",
    "decode_manifest",
    "file_sha256",
    "info_lines",
    "is_manifest",
    "json_text",
    "manifest_bytes",
    "merge_manifests",
    "parse_manifest",
    "read_manifest",
    "safe_path",
    "shard_problem",
    "verify_corpus",
    "write_manifest",
]
