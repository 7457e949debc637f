"""Writes ``testdata/hostile/``: malformed and malicious inputs for every parser of the toolkit, and
``manifest.json``, the error code each must produce.

    python tools/make_hostile.py            # regenerate testdata/hostile/ (deterministic)
    python tools/make_hostile.py --check    # exit 1 if the files on disk differ from what it makes

Each case is one file (a directory for checkpoint indexes) of a *kind*, which says how the toolkit
meets it (``tests/robustness/test_hostile.py`` runs each through the API and through the ``pskd`` command):

| kind        | API                                             | command                                 |
| ----------- | ----------------------------------------------- | --------------------------------------- |
| container   | ``Reader`` over every sample, ``info_lines``    | ``pskd info FILE``                      |
| pipeline    | ``load_pipeline(root=ROOT)``, ``check_batches`` | ``pskd pipeline FILE --root ROOT``      |
|             | of its file's sample count                      |                                         |
| vocab       | ``read_vocab``, then ``encode_file``            | ``pskd encode TEXT --vocab FILE``       |
| tokens      | ``lm_windows_file(vocab=args.vocab, seq=4)``    | ``pskd lm-windows FILE --vocab V …``    |
| pack        | ``pack_file(FILE, args.type, …)``               | ``pskd pack FILE --type T …``           |
| layout      | ``read_layout_file``, ``info_lines(checkpoint)`` | ``pskd info CHECKPOINT --layout FILE``  |
| index       | ``verify_directory(DIR)`` (``open``: after a    | ``pskd verify DIR``                     |
|             | ``CheckpointManager`` opened and closed on DIR) |                                         |
| safetensors | ``safetensors_to_pskd``                         | ``pskd convert FILE -o OUT.psk.d``      |
| manifest    | ``read_manifest``, ``info_lines``,              | ``pskd corpus verify DIR/shards.json``, |
|             | ``verify_corpus``, ``CorpusWindows(seq=4)``     | ``pskd corpus info DIR/shards.json``    |
| jsonl       | ``build_corpus([FILE], OUT)``, then read back   | ``pskd corpus build FILE -o OUT``       |
| export      | ``export_json(FILE, OUT.json)``                 | ``pskd export FILE -o OUT.json``        |
| output      | ``export_json(SMALL, DIR/out.json)``            | ``pskd export SMALL -o DIR/out.json``   |
| diff        | ``diff(DIR/a.psk.d, DIR/b.psk.d)``              | ``pskd diff DIR/a.psk.d DIR/b.psk.d``   |
| checkpoint  | ``restore``, ``info_lines``, a ``Reader`` given | ``pskd export DIR/DATA -o OUT.json``    |
|             | ``find_layout_file``, then ``export_json`` or   | (``pskd convert DIR/DATA -o             |
|             | ``pskd_to_safetensors`` and back                | OUT.safetensors``)                      |
| into        | ``safetensors_to_pskd(DIR/in.safetensors,       | ``pskd convert DIR/in.safetensors -o    |
|             | DIR/out.psk.d)``, then ``restore``              | DIR/out.psk.d``                         |

``ROOT`` is this collection's directory: pipeline cases stream files of ``_fixtures/`` and
``container/``. ``code`` is the ``E9xxx`` the toolkit must answer with, or ``null`` for an input
that is odd but valid and must be accepted. Whatever the case, nothing
may raise another exception, print a traceback, run past the time limit or allocate more than the
tests' memory limit.

A ``manifest`` case is a directory: its ``shards.json`` and the shard files it lists (some of
them symbolic links, which git stores as links). Its ``code`` is the first error of the API's
steps; each step answers with that code or succeeds (``info`` and ``CorpusWindows`` do not hash
the shards, so a changed byte is E9017 for ``verify`` alone, and ``info`` reads no shard at all:
it fails only on E9016 cases). A ``jsonl`` case is a corpus input; its ``args`` may name a
character vocabulary (``vocab``, relative to this directory) or ask for ``skip_bad``.

An ``index`` case is a directory: ``checkpoints.json`` and the step files beside it. With
``args.open`` a manager is opened on it first (its recovery removes only what an interrupted
save of its own left), on a copy: the files ``args.kept`` names (every step the index lists)
must be left exactly as they were, through the API and the command alike, whatever the answer.

A ``diff`` case is a directory holding ``a.psk.d`` and ``b.psk.d`` (either may be a link). Its
``args`` may hold ``expect``: what an accepted pair must give (``diff_norm``, ``a_norm``,
``relative``, ``elements``; the strings ``"inf"`` and ``"nan"`` for those values), checked on the
API side; the command must print no warning.

An ``output`` case is a directory whose ``out.json`` (a link to a device, a descriptor, a
directory, itself) is the output path a command is given: it is run on a copy of the directory
(links copied as links), which must be left exactly as it was. Links to ``/dev/zero`` in the other
kinds are inputs that are not regular files: refused at once (E9002), never read.

A ``checkpoint`` case is a directory: a data file (``args.data``, by default ``m.psk.d``) and the
files beside it. Through the API it is restored, listed by ``info_lines`` and read by a ``Reader``
given ``find_layout_file``'s answer (whose integer and bool leaves must show what restore gives),
then exported (``args.command`` ``export``, the default) or converted to safetensors and back
(``convert``: the keys must come back as they were); ``args.paths`` lists key paths its layout
must hold. An ``into`` case is a directory holding ``in.safetensors`` and whatever stands where
``out.psk.d`` and its layout go; it is run on a copy, which a refused save must leave exactly as
it was (and an accepted one must leave ``args.kept`` as they were); ``args.keys`` are the keys
the restored tree must have.

The fixtures that layout, pipeline and jsonl cases point at (a real ``params`` checkpoint, a small
data file, a character vocabulary, a symbolic link to ``/etc/passwd``) are written here too,
under ``_fixtures/``; they are not cases.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pskd_jax import checkpoint  # noqa: E402
from pskd_jax._os.digests import file_digest  # noqa: E402
from pskd_jax._os.names import layout_path_for  # noqa: E402
from pskd_jax.checkpoint import SaveOptions  # noqa: E402
from pskd_jax.corpus.tokenizer import Tokenizer  # noqa: E402
from pskd_jax.format.writer import write  # noqa: E402

OUT = os.path.join(ROOT, "testdata", "hostile")

MAGIC = b"PSKD"
U16, U32, U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")


def header(type_text: str | bytes, count: int, *, version: int = 1, encodings: bytes | None = None,
           leaves: int | None = None, type_len: int | None = None) -> bytes:
    """A header, each field as given (so that a case can make any of them lie)."""
    raw = type_text.encode("utf-8") if isinstance(type_text, str) else type_text
    parts = [MAGIC, U16.pack(version), U32.pack(len(raw) if type_len is None else type_len), raw, U64.pack(count)]
    if encodings is not None:
        parts += [U32.pack(len(encodings) if leaves is None else leaves), encodings]
    return b"".join(parts)


class Link:
    """A symbolic link to ``target`` (as written: relative to the link's directory, or absolute)."""

    def __init__(self, target: str):
        self.target = target


class Collection:
    def __init__(self, directory: str, *, include_open: bool = False):
        self.directory = directory
        self.include_open = include_open
        self.cases: list[dict] = []

    def add(self, kind: str, name: str, content: bytes | str | dict, code: str | None, what: str,
            open_bug: str | None = None, extension: str | None = None, **args) -> None:
        """One case: ``content`` is the file's bytes (text is UTF-8), or for an ``index`` or
        ``manifest`` case a dict of file name (``/`` for a subdirectory) → bytes making up the
        directory, or → :class:`Link` for a symbolic link.

        ``open_bug`` marks a case the toolkit fails today in code this collection's owner does not
        maintain (what it does instead): left out unless ``--include-open``, which writes it with
        the rest so that the owner can run the tests against it."""
        if open_bug is not None and not self.include_open:
            return
        if extension is None:
            extension = {"container": ".psk.d", "pipeline": ".pipeline", "vocab": ".json", "tokens": ".tok",
                         "pack": ".txt", "layout": ".layout.json", "index": "", "safetensors": ".safetensors",
                         "manifest": "", "jsonl": ".jsonl", "export": ".psk.d", "output": "", "diff": "",
                         "checkpoint": "", "into": ""}[kind]
        relative = f"{kind}/{name}{extension}"
        path = os.path.join(self.directory, relative)
        if isinstance(content, dict):
            os.makedirs(path, exist_ok=True)
            for file_name, data in content.items():
                target = os.path.join(path, *file_name.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if isinstance(data, Link):
                    os.symlink(data.target, target)
                    continue
                with open(target, "wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
        elif isinstance(content, Link):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(content.target, path)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
        case = {"file": relative, "kind": kind, "code": code, "what": what}
        if open_bug is not None:
            case["open"] = open_bug
        if args:
            case["args"] = args
        self.cases.append(case)


# --------------------------------------------------------------------------------------------
# The cases


def containers(c: Collection) -> None:
    add = lambda name, data, code, what: c.add("container", name, data, code, what)  # noqa: E731
    add("empty", b"", "E9002", "a zero-length file")
    add("magic-only", MAGIC, "E9003", "only the magic")
    add("magic-short", b"PSK", "E9002", "three bytes of the magic")
    add("bad-magic", b"PSKX" + header("ℝ[]", 0)[4:], "E9002", "a wrong magic")
    add("version-only", MAGIC + U16.pack(1), "E9003", "the magic and the version, nothing else")
    add("version-0", header("ℝ[]", 0, version=0), "E9002", "version 0")
    add("version-3", header("ℝ[]", 0, version=3), "E9002", "version 3")
    add("version-ffff", header("ℝ[]", 0, version=0xFFFF), "E9002", "version 65535")
    add("type-len-max", MAGIC + U16.pack(1) + U32.pack(2**32 - 1) + b"R[]", "E9003",
        "a type length of 2^32 - 1 in a file of a few bytes")
    add("type-len-beyond-limit", MAGIC + U16.pack(1) + U32.pack((1 << 20) + 1) + b"R[]" + bytes(64), "E9003",
        "a type length over the 1 MiB any reader accepts")
    add("type-len-past-end", header("ℝ[]", 0, type_len=40), "E9003", "a type length running past the end")
    add("type-not-utf8", header(b"\xff\xfe[]", 0), "E9002", "a type text that is not UTF-8")
    add("type-surrogate", header(b"\xed\xa0\x80[]", 0), "E9002", "a type text holding an encoded surrogate")
    add("type-empty", header("", 0), "E9001", "an empty type text")
    add("type-nul", header("ℝ[]\x00", 0), "E9001", "a NUL after the type")
    add("type-nested-5000", header("(" * 5000 + "ℝ[]" + ", ℝ[])" * 5000, 0), "E9001",
        "a type nested 5000 deep")
    add("type-open-parens-512kib", header("(" * (1 << 19), 0), "E9001",
        "a type of 512 KiB of '(' (the parser must not hold half a million tokens)")
    add("type-axes-100", header("ℝ[" + ", ".join(["1"] * 100) + "]", 1) + bytes(8), "E9001",
        "a leaf of 100 axes (numpy holds 64)")
    add("idx-bound-2-64-plus-1", header("idx[18446744073709551617][]", 1) + bytes(8), "E9001",
        "an idx bound of 2^64 + 1")
    add("idx-bound-41-digits", header("idx[" + "9" * 41 + "][]", 1) + bytes(8), "E9001",
        "an idx bound of 41 digits")
    add("idx-bound-5000-digits", header("idx[" + "9" * 5000 + "][]", 1), "E9001",
        "an idx bound of 5000 digits (int() refuses over 4300)")
    add("idx-0", header("idx[0][]", 1) + bytes(1), "E9001", "idx[0]")
    add("dims-product-overflow", header("ℝ[4294967296, 4294967296]", 1) + bytes(8), "E9001",
        "dimensions whose product is 2^64 elements")
    add("dims-product-2-60", header("ℝ[1073741824, 1073741824]", 1) + bytes(8), "E9003",
        "2^60 elements a sample (8 EiB), announced in a file of 46 bytes")
    add("empty-axis-huge-other", header("ℝ[0, 1152921504606846977]", 1), "E9001",
        "an empty leaf whose other axis is 2^60 + 1 (numpy refuses such shapes)")
    add("symbolic-dim", header("ℝ[model: D]", 0), "E9001", "a symbolic dimension")
    add("open-prefix", header("ℝ[…, 3]", 0), "E9001", "an open prefix")
    add("named-type", header("Foo", 0), "E9001", "a bare named type")
    add("one-tuple", header("(ℝ[])", 0), "E9001", "a tuple of one element")
    add("params-in-tuple", header("(params M, ℝ[])", 0), "E9001", "a params type as a tuple element")
    add("count-max", header("ℝ[]", 2**64 - 1) + bytes(16), "E9003",
        "a count of 2^64 - 1 samples of 8 bytes (the byte size overflows 64 bits)")
    add("count-far-beyond", header("idx[256][]", 10**12) + bytes(10), "E9003",
        "a count of 10^12 one-byte samples in a file of 10")
    add("count-max-empty-type", header("ℝ[0]", 2**64 - 1), "E9003",
        "a count of 2^64 - 1 samples of an empty type")
    add("count-2-62-empty-type", header("ℝ[0]", 2**62), "E9003",
        "2^62 samples of an empty type (numpy cannot shape them)")
    add("one-byte-short", header("(idx[64][4], ℝ[])", 2) + bytes(23), "E9003", "the data one byte short")
    two = "(ℝ[2], idx[3][])"
    add("v2-leaves-fewer", header(two, 0, version=2, encodings=bytes([1])), "E9005",
        "version 2, one encoding for a type of two leaves")
    add("v2-leaves-more", header(two, 0, version=2, encodings=bytes([1, 0, 0])), "E9005",
        "version 2, three encodings for a type of two leaves")
    add("v2-leaves-max", header(two, 0, version=2, encodings=b"\x01\x00", leaves=2**32 - 1), "E9003",
        "version 2, a leaf count of 2^32 - 1")
    add("v2-leaves-past-end", header(two, 0, version=2, encodings=b"\x01", leaves=2), "E9003",
        "version 2, the encoding table cut short")
    add("v2-encoding-3", header(two, 0, version=2, encodings=bytes([3, 0])), "E9002", "an encoding byte of 3")
    add("v2-encoding-255", header(two, 0, version=2, encodings=bytes([255, 0])), "E9002", "an encoding byte of 255")
    add("v2-f32-on-idx", header(two, 1, version=2, encodings=bytes([1, 1])) + bytes(16), "E9002",
        "an f32 encoding on an idx leaf")
    add("v2-bf16-on-idx", header(two, 1, version=2, encodings=bytes([1, 2])) + bytes(16), "E9002",
        "a bf16 encoding on an idx leaf")
    add("params-v2-no-layout", header("params Model", 1, version=2, encodings=bytes([1, 0])) + bytes(12), None,
        "a params file without its layout: info prints the header and says the layout is needed")
    add("trailing-bytes", header("idx[10][2]", 1) + bytes(2) + b"junk", None,
        "trailing bytes after the last sample (an interrupted append)")
    add("count-0-huge-sample", header("ℝ[1099511627776]", 0), None, "no samples of a type of 2^40 reals")
    add("flat-20000-leaves-v2", header("(" + ", ".join(["ℝ[]"] * 20000) + ")", 0, version=2,
                                       encodings=bytes([1]) * 20000), None,
        "version 2, a tuple of 20000 leaves and no samples")


def pipelines(c: Collection) -> None:
    add = lambda name, text, code, what: c.add("pipeline", name, text, code, what)  # noqa: E731
    data = "../_fixtures/small.psk.d"
    add("empty", "", "E9010", "an empty pipeline")
    add("stream-only", "stream", "E9010", "'stream' and nothing else")
    add("unterminated", 'stream "x |> batch(B = 1)', "E9010", "a path without its closing quote")
    add("no-batch", f'stream "{data}"', "E9010", "no batch stage")
    add("seed-2-64", f'stream "{data}" |> shuffle(seed = 18446744073709551616) |> batch(B = 2)', "E9010",
        "a seed of 2^64")
    add("seed-5000-digits", f'stream "{data}" |> shuffle(seed = {"7" * 5000}) |> batch(B = 2)', "E9010",
        "a seed of 5000 digits")
    add("batch-0", f'stream "{data}" |> batch(B = 0)', "E9010", "B = 0")
    add("batch-negative", f'stream "{data}" |> batch(B = -1)', "E9010", "B = -1")
    add("duplicate-stage", f'stream "{data}" |> batch(B = 1) |> batch(B = 1)', "E9010", "a stage twice")
    add("stage-order", f'stream "{data}" |> batch(B = 1) |> shuffle(seed = 1)', "E9010", "shuffle after batch")
    add("take-10000-times", f'stream "{data}" |> batch(B = 1)' + " |> take(n = 1)" * 10000, "E9010",
        "take repeated 10000 times")
    add("not-utf8", b'stream "\xff\xfe" |> batch(B = 1)', "E9010", "a pipeline file that is not UTF-8")
    add("nul-in-path", 'stream "a\x00b" |> batch(B = 1)', "E9010", "a NUL in the path")
    add("spaces-then-junk", " " * 100000 + "@", "E9010", "100000 spaces and a stray character")
    add("missing-file", 'stream "no-such.psk.d" |> batch(B = 1)', "E9010", "a path to no file")
    add("not-a-container", 'stream "not-utf8.pipeline" |> batch(B = 1)', "E9002",
        "a path to a file that is not a .psk.d")
    add("hostile-container", 'stream "../container/count-max.psk.d" |> batch(B = 1)', "E9003",
        "a path to a hostile container")
    add("escape-dotdot", 'stream "../../x.psk.d" |> batch(B = 1)', "E9010",
        "a path leaving the collection's directory through '..'")
    add("escape-absolute", 'stream "/etc/passwd" |> batch(B = 1)', "E9010", "an absolute path outside the collection")
    add("escape-symlink", 'stream "../_fixtures/outside.psk.d" |> batch(B = 1)', "E9010",
        "a path to a symbolic link inside the collection that leads outside it (to /etc/passwd)")
    add("escape-root-itself", 'stream "..' + '" |> batch(B = 1)', "E9010",
        "a path to the collection's directory itself")


def vocabularies(c: Collection) -> None:
    add = lambda name, text, code, what: c.add("vocab", name, text, code, what)  # noqa: E731
    add("empty", "", "E9011", "an empty file")
    add("not-json", "['a', 'b']", "E9011", "single-quoted strings")
    add("object", '{"a": 0}', "E9011", "an object")
    add("nan", "NaN", "E9011", "NaN")
    add("nested-100000", "[" * 100000, "E9011", "arrays nested 100000 deep")
    add("int-5000-digits", "[" + "1" * 5000 + "]", "E9011", "a number of 5000 digits")
    add("duplicate", '["a", "b", "a"]', "E9011", "a token twice")
    add("empty-token", '["a", ""]', "E9011", "an empty token")
    add("non-string", '["a", 1]', "E9011", "a number among the tokens")
    add("lone-surrogate", '["a", "\\ud800"]', "E9011", "a lone surrogate")
    add("not-utf8", b'["a", "\xff"]', "E9011", "a vocabulary file that is not UTF-8")
    add("bom", "\ufeff[\"a\"]", "E9011", "a byte order mark before the JSON")
    add("multi-char", '["ab", "\\n"]', "E9011", "a token of two characters (encode maps characters)")
    add("missing-char", '["a", "\\n"]', "E9011", "a vocabulary without a character of the text")


def token_texts(c: Collection) -> None:
    add = lambda name, text, code, what: c.add("tokens", name, text, code, what, vocab=64)  # noqa: E731
    add("letters", "1 2 x 3", "E9004", "a letter among the tokens")
    add("negative", "1 -2 3", "E9004", "a negative token")
    add("decimal", "1 2.5 3", "E9004", "a decimal")
    add("beyond-vocab", "1 64 3", "E9004", "a token at the vocabulary size")
    add("2-64", "1 18446744073709551616", "E9004", "a token of 2^64")
    add("5000-digits", "1 " + "9" * 5000, "E9004", "a token of 5000 digits")
    add("leading-zeros", "0" * 30 + "7 " * 10, None, "a token with 30 leading zeros (it is 7)")
    add("not-utf8", b"1 2 \xff", "E9004", "a byte that is not UTF-8")
    add("nul", "1 2\x003", "E9004", "a NUL between tokens")
    add("arabic-digits", "1 \u0661", "E9004", "an Arabic-Indic digit")
    add("whitespace-only", " \t\r\n" * 50000, None, "200000 bytes of whitespace")
    add("empty", "", None, "an empty file (no windows)")


def pack_inputs(c: Collection) -> None:
    def add(name, text, code, what, type_text="(idx[10][2], ℝ[])"):
        c.add("pack", name, text, code, what, type=type_text)

    add("too-few", "1 2\n", "E9004", "two values for a sample of three")
    add("too-many", "1 2 3 4\n", "E9004", "four values for a sample of three")
    add("letters", "1 2 abc\n", "E9004", "a word for a real")
    add("index-at-bound", "1 10 0.5\n", "E9004", "an index at its bound")
    add("index-negative", "-1 2 0.5\n", "E9004", "a negative index")
    add("index-real", "1.5 2 0.5\n", "E9004", "a decimal for an index")
    add("nan", "1 2 nan\n", "E9004", "NaN")
    add("inf", "1 2 -inf\n", "E9004", "-inf")
    add("overflow", "1 2 1e999\n", "E9004", "a decimal beyond f64")
    add("hex", "1 2 0x10\n", "E9004", "a hexadecimal real")
    add("nul", "1 2 3\x00\n", "E9004", "a NUL after a value")
    add("not-utf8", b"1 2 \xff\n", "E9004", "a byte that is not UTF-8")
    add("index-5000-digits", "1 " + "9" * 5000 + " 0.5\n", "E9004", "an index of 5000 digits")
    add("long-real-among-many", "1 2 " + "1" * 200000 + "\n" + "1 2 0.5\n" * 20000, "E9004",
        "a real of 200000 digits among 20000 short lines (as fixed-width text: 48 GB)")
    add("short-lines-120k", "10\n" * 120_000, None,
        "120000 lines of one short value (as Python objects a line: 120 × the text; read in blocks)", type_text="ℝ[]")
    add("wide-type-one-value-lines", "10\n" * 100_000, "E9004",
        "100000 lines of one value for a type of 1000 (refused at the first line, before the rest is held)",
        type_text="ℝ[1000]")
    add("long-valid-real-among-many", "0." + "1" * 100_000 + "\n" + "0.5\n" * 50_000, None,
        "a valid real of 100000 digits among 50000 short ones", type_text="ℝ[]")
    add("empty-leaf-axis-beyond-c-int", "6\n", None,
        "a sample beside an empty leaf of shape [21111110010, 0] (numpy refuses such a record field; a fuzz finding)",
        type_text="(idx[1][21111110010, 0], ℝ[])")
    add("no-samples", "-- only a comment\n\n", None, "no sample lines: an empty file", type_text="ℝ[]")
    add("open-type", "1\n", "E9001", "a symbolic type", type_text="ℝ[D]")


def layouts(c: Collection) -> None:
    with open(os.path.join(c.directory, "_fixtures", "checkpoint.layout.json.good"), encoding="utf-8") as f:
        good = json.load(f)

    def add(name, content, code, what, **options):
        c.add("layout", name, content if isinstance(content, (str, bytes)) else json.dumps(content), code, what,
              **options)

    def changed(change):
        content = json.loads(json.dumps(good))
        change(content)
        return content

    add("empty", "", "E9001", "an empty file")
    add("not-json", "{format: 1}", "E9001", "not JSON")
    add("not-utf8", b'{"format": "\xff"}', "E9001", "not UTF-8")
    add("list", "[]", "E9001", "a list")
    add("wrong-format", changed(lambda d: d.update(format="other")), "E9001", "another format")
    add("wrong-version", changed(lambda d: d.update(version=99)), "E9001", "version 99")
    add("leaves-number", changed(lambda d: d.update(leaves=3)), "E9001", "leaves is a number")
    add("shape-5000-digits", '{"format": "pskd-layout", "version": 1, "type": "params Model", "leaves": '
        '[{"path": "[\'w\']", "shape": [' + "1" * 5000 + ']}]}', "E9001", "a length of 5000 digits")
    add("shape-negative", changed(lambda d: d["leaves"][0].update(shape=[-2, -3])), "E9001", "negative lengths")
    add("shape-2-70", changed(lambda d: d["leaves"][0].update(shape=[2**70])), "E9001", "a length of 2^70")
    add("shape-100-axes", changed(lambda d: d["leaves"][0].update(shape=[1] * 100)), "E9001", "100 axes")
    add("bound-0", changed(lambda d: d["leaves"][2].update(bound=0)), "E9001", "an index bound of 0")
    add("bound-2-65", changed(lambda d: d["leaves"][2].update(bound=2**65)), "E9001", "an index bound of 2^65")
    add("fewer-leaves", changed(lambda d: [d["leaves"].pop(), d["tree"]["dict"].pop()]), "E9005",
        "one leaf fewer than the checkpoint")
    add("smaller-sample", changed(lambda d: d["leaves"][0].update(shape=[1, 3])), "E9005",
        "a layout whose samples are smaller than the file's data")
    add("larger-sample", changed(lambda d: d["leaves"][0].update(shape=[3, 3])), "E9003",
        "a layout whose samples are larger than the file's data (the file reads as truncated)")
    add("keys-twice", changed(lambda d: [leaf.update(keys=["x"]) for leaf in d["leaves"]]), "E9001",
        "two leaves of one key path (keys that are not their paths' keys)")
    add("shape-fraction", changed(lambda d: d["leaves"][0].update(shape=[2.7, 3])), "E9001", "a length of 2.7")
    add("shape-true", changed(lambda d: d["leaves"][0].update(shape=[True, 3])), "E9001", "a length of true")
    add("bound-true", changed(lambda d: d["leaves"][2].update(bound=True)), "E9001", "an index bound of true")
    add("dtype-int8-of-u8", changed(lambda d: d["leaves"][2].update(dtype="int8")), "E9001",
        "dtype int8 for a leaf stored as plain values below 256 (200 would read as -56)")
    add("dtype-float16-of-f64", changed(lambda d: d["leaves"][1].update(dtype="float16")), None,
        "dtype float16 for a leaf stored in f64: read as the stored f64 (1e10 never becomes inf)")
    add("kind-unknown", changed(lambda d: d["leaves"][0].update(kind="pattern")), "E9001", "an unknown kind")
    add("tree-other-paths", changed(lambda d: d["tree"]["dict"].reverse()), "E9001",
        "a tree that puts the leaves at other key paths")
    add("data-missing", changed(lambda d: d.pop("data")), "E9001", "no record of the data file it belongs to")
    add("data-bytes-true", changed(lambda d: d["data"].update(bytes=True)), "E9001", "a data size of true")
    add("nested-100000", "[" * 100000, "E9001", "arrays nested 100000 deep")
    add("keys-unhashable", changed(lambda d: d["leaves"][0].update(keys=[[1, 2]])), "E9001",
        "a key that is a list")
    add("bound-infinity", changed(lambda d: d["leaves"][2].update(bound=float("inf"))), "E9001",
        "an index bound of Infinity (found by fuzzing as 184467440737E551615)")
    add("keys-5000-deep", changed(lambda d: d["leaves"][0].update(keys=["k"] * 5000)), "E9001",
        "a key path 5000 keys deep")
    add("keys-65-deep", changed(lambda d: d["leaves"][0].update(keys=["k"] * 65)), "E9001",
        "a key path 65 keys deep (64 is the most a tree nests)")
    add("keys-string", changed(lambda d: d["leaves"][0].update(keys="w")), "E9001", "keys that are a string")


def indexes(c: Collection) -> None:
    def add(name, content, code, what, **options):
        files = {"checkpoints.json": content if isinstance(content, (str, bytes)) else json.dumps(content)}
        c.add("index", name, files, code, what, **options)

    def index(entries):
        return {"format": "pskd-checkpoints", "version": 1, "checkpoints": entries}

    add("empty", "", "E9014", "an empty index")
    add("not-json", "{checkpoints: []}", "E9014", "not JSON")
    add("not-utf8", b'{"format": "\xff"}', "E9014", "not UTF-8")
    add("list", "[]", "E9014", "a list")
    add("wrong-format", {"format": "other", "version": 1, "checkpoints": []}, "E9014", "another format")
    add("checkpoints-number", {"format": "pskd-checkpoints", "version": 1, "checkpoints": 3}, "E9014",
        "checkpoints is a number")
    add("entry-string", index(["step-1"]), "E9014", "an entry that is a string")
    add("step-float", index([{"step": 1.5, "file": "a.psk.d", "sha256": "0" * 64}]), "E9014", "a step of 1.5")
    add("file-parent", index([{"step": 1, "file": "../escape.psk.d", "sha256": "0" * 64}]), "E9014",
        "a file in the parent directory")
    add("file-absolute", index([{"step": 1, "file": "/etc/passwd", "sha256": "0" * 64}]), "E9014",
        "an absolute file path")
    add("file-missing", index([{"step": 1, "file": "step-00000001.psk.d", "sha256": "0" * 64}]), "E9003",
        "a file the directory does not hold")
    add("nested-100000", "[" * 100000, "E9014", "arrays nested 100000 deep")
    add("file-nul", index([{"step": 1, "file": "a\u0000b", "sha256": "0" * 64}]), "E9014",
        "a NUL in a file name")
    add("file-dot-dot", index([{"step": 1, "file": "..", "sha256": "0" * 64}]), "E9014", "a file name of '..'")
    add("layout-nul", index([{"step": 1, "file": "a.psk.d", "layout": "a\u0000b", "sha256": "0" * 64}]),
        "E9014", "a NUL in a layout file name")
    linked = json.dumps(index([{"step": 1, "file": "step-00000001.psk.d", "sha256": "0" * 64}]))
    c.add("index", "file-symlink-out", {"checkpoints.json": linked, "step-00000001.psk.d": Link("/etc/passwd")},
          "E9014", "a step file that is a symbolic link leading outside the directory")


# Checkpoint indexes whose entries name what is not their own step's files (the manager's
# ownership rules: issue 12), each beside real step files that must never be touched.

def manager_indexes(c: Collection) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        steps = {}
        for step in (1, 2):
            path = os.path.join(scratch, f"step-{step:08d}.psk.d")
            checkpoint.save(path, {"w": np.full(3, step, np.float32)}, SaveOptions(durable=False))
            with open(path, "rb") as f, open(layout_path_for(path), "rb") as g:
                steps[step] = (f.read(), g.read(), file_digest(path, "xxh3_128"))

    def files(*present):
        found = {}
        for step in present:
            data, layout, _ = steps[step]
            found[f"step-{step:08d}.psk.d"] = data
            found[f"step-{step:08d}.layout.json"] = layout
        return found

    def entry(which, **changes):
        made = {"step": which, "file": f"step-{which:08d}.psk.d", "layout": f"step-{which:08d}.layout.json",
                "type": "params Params", "bytes": len(steps[which][0]), "digest": {"xxh3_128": steps[which][2]},
                "extra": None}
        made.update(changes)
        return made

    def add(name, entries, code, what, *, version=3, extra_files=None, **top):
        content = {"format": "pskd-checkpoints", "version": version, "checkpoints": entries, **top}
        directory = {"checkpoints.json": json.dumps(content), **files(1, 2), **(extra_files or {})}
        c.add("index", "manager-" + name, directory, code, what)

    add("duplicate-steps", [entry(1), entry(1)], "E9014", "step 1 listed twice")
    add("step-true", [entry(1, step=True), entry(2)], "E9014", 'a step of true (a boolean, not 1)')
    add("step-negative", [entry(1, step=-1), entry(2)], "E9014", "a step of -1")
    add("step-beyond-int64", [entry(1, step=2**63, file=f"step-{2**63}.psk.d"), entry(2)], "E9014",
        "a step of 2^63, beyond an int64")
    add("layout-is-index", [entry(1, layout="checkpoints.json"), entry(2)], "E9014",
        "an entry whose layout names the index itself (pruning it would delete the index)")
    add("layout-is-lock", [entry(1, layout=".pskd-checkpoints.lock"), entry(2)], "E9014",
        "an entry whose layout names the manager's lock file")
    add("file-shared", [entry(1), entry(2, file="step-00000001.psk.d")], "E9014",
        "two entries sharing one file (pruning one would delete the other's data)")
    add("file-other-step", [entry(1, file="step-00000002.psk.d", layout="step-00000002.layout.json")], "E9014",
        "step 1's entry naming step 2's files")
    add("file-unpadded", [entry(1, file="step-1.psk.d"), entry(2)], "E9014",
        "a file name the manager never writes for its step")
    add("file-other-program", [entry(1, file="notes.txt"), entry(2)], "E9014", "an entry naming another program's file",
        extra_files={"notes.txt": "notes\n"})
    add("leftovers-not-steps", [entry(1), entry(2)], "E9014", "leftovers that are not a list of steps",
        leftovers=[True, "3"])
    add("digest-not-a-map", [entry(1, digest="0" * 32), entry(2)], "E9014", "a digest that is a string")
    add("score-not-a-number", [entry(1, score="best"), entry(2)], "E9014", "a score that is a string")
    add("version-2-foreign-files", [entry(1), entry(2)], None,
        "a good version 2 index beside other programs' files and a step-like name of its own making",
        version=2, extra_files={"notes.txt": "notes\n", "step-1.psk.d": "not a step file", "step-00000003.psk.d~": ""})
    c.add("index", "manager-index-a-directory", {"checkpoints.json/inside.json": "{}", **files(1)}, "E9014",
          "an index that is a directory")
    c.add("index", "manager-index-a-symlink", {"checkpoints.json": Link("/etc/passwd"), **files(1)}, "E9014",
          "an index that is a symbolic link")
    c.add("index", "manager-no-index", files(1, 2), "E9014",
          "step files without an index: nothing to verify them against (a manager adopts them)")
    re_saves_and_leftovers(c, steps, files, entry)
    written_times_and_extra(c, steps, files, entry)


# Issue 20, class 4: a step the index lists is never removed by a manager's recovery, whatever
# ``leftovers`` says and whatever became of its files; a damaged one is reported. Each case is
# opened by a manager first (its recovery), then verified; the files ``kept`` names stay as
# they were (see the generator's ``index`` kind).

_ALL_STEP_FILES = ["step-00000001.psk.d", "step-00000001.layout.json", "step-00000002.psk.d",
                   "step-00000002.layout.json"]


def re_saves_and_leftovers(c: Collection, steps, files, entry) -> None:
    def add(name, present, code, what, *, leftovers=(), kept=None, entries=None):
        content = {"format": "pskd-checkpoints", "version": 3, "leftovers": list(leftovers),
                   "checkpoints": [entry(1), entry(2)] if entries is None else entries}
        kept = [n for n in _ALL_STEP_FILES if n in present] if kept is None else kept
        c.add("index", "manager-" + name, {"checkpoints.json": json.dumps(content), **present}, code, what,
              open=True, kept=kept)

    good = files(1, 2)
    data = steps[1][0]
    changed = bytearray(data)
    changed[-2] ^= 1
    damaged = {"truncated": (data[:-3], "three bytes short"), "byte-changed": (bytes(changed), "one byte changed")}
    for label, (bad, how) in damaged.items():
        add(f"listed-step-{label}", {**good, "step-00000001.psk.d": bad}, "E9013",
            f"a listed step's file {how}: reported (its digest), never removed")
        add(f"listed-step-{label}-in-leftovers", {**good, "step-00000001.psk.d": bad}, "E9013",
            f"a listed step also under leftovers (a re-save cut short), its file {how}: reported, not removed",
            leftovers=[1])
    without_layout = {k: v for k, v in good.items() if k != "step-00000001.layout.json"}
    add("listed-step-layout-missing", without_layout, "E9001",
        "a listed step whose layout file is gone: reported (the listed layout does not read), its data file kept")
    add("listed-step-layout-missing-in-leftovers", without_layout, "E9001",
        "a listed step under leftovers whose layout file is gone: its data file kept", leftovers=[1])
    add("listed-step-data-missing-in-leftovers", {k: v for k, v in good.items() if k != "step-00000001.psk.d"},
        "E9003", "a listed step under leftovers whose data file is gone: its layout file kept", leftovers=[1])
    add("listed-step-in-leftovers", good, None,
        "a listed step also named under leftovers (the claim of a re-save that finished): kept, the claim dropped",
        leftovers=[1, 2])
    add("leftover-unlisted-step", {**good, **{n.replace("00000002", "00000003"): v for n, v in files(2).items()}},
        None, "an unlisted step under leftovers (a save cut short): its files the manager's own to remove, the "
        "listed steps kept", leftovers=[3])
    add("leftover-unlisted-and-listed-damaged",
        {**good, "step-00000001.psk.d": data[:-3], **{n.replace("00000002", "00000003"): v
                                                       for n, v in files(2).items()}},
        "E9013", "leftovers naming a damaged listed step and an unlisted one: only the unlisted one's files go",
        leftovers=[1, 3])


# Issue 20, classes 4 and 8: when a step was written (``started``, ``committed``: UTC in ISO
# 8601, optional), and ``extra`` (and keys of a later writer, kept as found) holding what JSON
# cannot keep as the toolkit writes it.

def written_times_and_extra(c: Collection, steps, files, entry) -> None:
    def add(name, entries, code, what, *, text=None):
        content = {"format": "pskd-checkpoints", "version": 3, "leftovers": [], "checkpoints": entries}
        c.add("index", "manager-" + name, {"checkpoints.json": json.dumps(content) if text is None else text,
                                           **files(1, 2)}, code, what, open=True, kept=list(_ALL_STEP_FILES))

    when = {"started": "2026-12-02T03:04:05.678901Z", "committed": "2026-12-02T03:04:06.012345Z"}
    add("times-valid", [entry(1, **when), entry(2, **when)], None, "entries with the times a save records")
    add("times-absent", [entry(1), entry(2)], None,
        "entries of an index written before the times were recorded: read, never refused")
    add("times-null", [entry(1, started=None, committed=None), entry(2)], None, "times that are null")
    add("times-seconds", [entry(1, started="2026-12-02T03:04:05Z", committed="2026-12-02T03:04:06Z"), entry(2)],
        None, "times to the second, with Z")
    for name, value, what in (
            ("started-not-a-time", "yesterday", "a started time of 'yesterday'"),
            ("started-number", 1764644645, "a started time that is a number (seconds since 1970)"),
            ("started-empty", "", "an empty started time"),
            ("started-no-offset", "2026-12-02T03:04:05", "a started time without its offset (a local time)"),
            ("started-offset-plus-5", "2026-12-02T08:04:05+05:00", "a started time in another zone than UTC"),
            ("committed-month-13", "2026-13-02T03:04:05Z", "a committed time of month 13"),
            ("committed-list", ["2026-12-02T03:04:05Z"], "a committed time that is a list"),
            ("committed-date-only", "2026-12-02Z", "a committed date without its time")):
        field = name.split("-")[0]
        add(f"entry-{name}", [entry(1, **{**when, field: value}), entry(2)], "E9014", what + ": E9014 naming the entry")
    base = json.dumps({"format": "pskd-checkpoints", "version": 3, "leftovers": [],
                       "checkpoints": [entry(1, extra="EXTRA"), entry(2)]})
    for name, raw, code, what in (
            ("extra-1e400", '{"loss": 1e400}', "E9014",
             "extra holding 1e400 (parsed as inf, which the index cannot be written back with)"),
            ("extra-minus-1e400-nested", '{"a": [0, {"b": -1e400}]}', "E9014", "extra holding -1e400 deep inside"),
            ("extra-nan", '{"loss": NaN}', "E9014", "extra holding NaN"),
            ("extra-key-twice", '{"epoch": 1, "epoch": 2}', "E9014", "a key twice in extra (JSON keeps one)"),
            ("extra-nested-201", "[" * 201 + "]" * 201, "E9014",
             "extra nested 201 deep (a save refuses over 200)"),
            ("extra-nested-200", "[" * 200 + "]" * 200, None, "extra nested as deep as a save keeps"),
            ("extra-int-4000-digits", "9" * 4000, None, "an integer of 4000 digits in extra (kept exactly)"),
            ("extra-int-5000-digits", "9" * 5000, "E9014", "an integer of 5000 digits (int() refuses over 4300)"),
            ("extra-lone-surrogate", '{"name": "\\ud800"}', None, "a lone surrogate escaped in extra (kept escaped)"),
            ("extra-loader-state", '{"loader": {"epoch": 1, "batch": 7, "seed": 18446744073709551615}}', None,
             "extra holding a loader's state")):
        add(name, [], code, what, text=base.replace('"EXTRA"', raw))
    later = json.dumps({"format": "pskd-checkpoints", "version": 3, "leftovers": [],
                        "checkpoints": [entry(1, later="LATER"), entry(2)]})
    add("later-key-1e400", [], "E9014", "a key of a later writer holding 1e400 (kept as found: not writable)",
        text=later.replace('"LATER"', "1e400"))
    add("later-key-kept", [], None, "a key of a later writer: kept as found", text=later.replace('"LATER"', '{"x": 1}'))


# Corpus manifests (shards.json) and the shards they list.

def _shard(tokenizer: Tokenizer, documents: list[str], *, count: int | None = None) -> bytes:
    """A shard's bytes: the documents' tokens, a boundary after each (as a build writes them)."""
    tokens: list[int] = []
    for doc in documents:
        if tokenizer.kind == "bytes":
            tokens += list(doc.encode("utf-8"))
        else:
            tokens += [tokenizer.vocab.index(ch) for ch in doc]
        tokens.append(tokenizer.boundary)
    data = np.array(tokens, dtype=tokenizer.dtype).tobytes()
    return tokenizer.header(len(tokens) if count is None else count) + data


def _entry(path: str, data: bytes, documents: int, tokenizer: Tokenizer, **changes) -> dict:
    header = len(tokenizer.header(0))
    entry = {"path": path, "tokens": (len(data) - header) // tokenizer.dtype.itemsize, "documents": documents,
             "sha256": hashlib.sha256(data).hexdigest(), "skipped": 0}
    entry.update(changes)
    return entry


def _manifest_text(tok: Tokenizer, entries: list, **changes) -> str:
    data = {"format": "pskd-corpus", "version": 1, "tokenizer": tok.to_json(),
            "vocab_size": tok.vocab_size, "boundary": tok.boundary,
            "build": {"text_key": "text", "max_document_tokens": None, "skip_bad": False}, "shards": entries}
    data.update(changes)
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def manifests(c: Collection) -> None:
    def add(name, files, code, what):
        c.add("manifest", name, files, code, what)

    t = Tokenizer.bytes()
    s0, s1 = _shard(t, ["hello", "ab"]), _shard(t, ["xyz"])
    e0, e1 = _entry("shard-00000.psk.d", s0, 2, t), _entry("shard-00001.psk.d", s1, 1, t)
    shards = {"shard-00000.psk.d": s0, "shard-00001.psk.d": s1}

    def corpus(entries=None, files=None, text=None, **changes):
        """A two-shard corpus, its manifest's entries, files or top-level fields changed."""
        entries = [dict(e0), dict(e1)] if entries is None else entries
        return {"shards.json": _manifest_text(t, entries, **changes) if text is None else text,
                **(shards if files is None else files)}

    def entry0(**changes):
        return [dict(e0, **changes), dict(e1)]

    # Valid corpora: every step succeeds.
    add("valid", corpus(), None, "two shards of the bytes tokenizer (13 tokens, windows cross the shards)")
    chars = Tokenizer.chars(["a", "b", "\n"])
    sc = _shard(chars, ["ab\nba", "b"])
    add("valid-chars", {"shards.json": _manifest_text(chars, [_entry("s.psk.d", sc, 2, chars)]), "s.psk.d": sc},
        None, "a chars tokenizer of 3 characters (shards of idx[4][])")
    add("valid-no-shards", {"shards.json": _manifest_text(t, [])}, None, "no shards: no tokens, no windows")
    empty = _shard(t, [])
    add("valid-empty-shard", corpus([_entry("empty.psk.d", empty, 0, t), dict(e1)],
                                    {"empty.psk.d": empty, "shard-00001.psk.d": s1}), None, "a shard of 0 tokens")
    add("valid-subdirectory", corpus([dict(e0, path="sub/a/shard-00000.psk.d"), dict(e1, path="./shard-00001.psk.d")],
                                     {"sub/a/shard-00000.psk.d": s0, "shard-00001.psk.d": s1}), None,
        "shard paths in a subdirectory and after './'")
    add("valid-symlink-inside", corpus(files={"data/s0.psk.d": s0, "shard-00000.psk.d": Link("data/s0.psk.d"),
                                              "shard-00001.psk.d": s1}), None,
        "a shard that is a symbolic link to a file inside the directory")
    add("same-shard-twice", corpus([dict(e0), dict(e0)], {"shard-00000.psk.d": s0}), "E9016",
        "one shard listed twice (its tokens would appear twice in the stream: refused, as merge refuses it)")

    # Malformed manifests: E9016 for every step.
    add("no-manifest", {"notes.txt": "no shards.json here\n"}, "E9016", "a directory without shards.json")
    add("empty", corpus(text=""), "E9016", "an empty shards.json")
    add("not-json", corpus(text="{format: 'pskd-corpus'}"), "E9016", "not JSON")
    add("not-utf8", corpus(text=_manifest_text(t, [e0]).encode("utf-8").replace(b"pskd-corpus", b"pskd-\xff")),
        "E9016", "a byte that is not UTF-8")
    add("bom", corpus(text="\ufeff" + _manifest_text(t, [e0, e1])), "E9016", "a byte order mark before the JSON")
    add("list", corpus(text="[]"), "E9016", "a list")
    add("nested-100000", corpus(text="[" * 100000 + "]" * 100000), "E9016", "arrays nested 100000 deep")
    add("nested-in-build", corpus(text=_manifest_text(t, [e0, e1]).replace(
        '"skip_bad": false', '"skip_bad": ' + "[" * 100000 + "]" * 100000)), "E9016",
        "a build field nested 100000 deep")
    add("tokens-nan", corpus(text=_manifest_text(t, [e0, e1]).replace('"tokens": 9', '"tokens": NaN')), "E9016",
        "a token count of NaN")
    add("documents-infinity",
        corpus(text=_manifest_text(t, [e0, e1]).replace('"documents": 2', '"documents": Infinity')), "E9016",
        "a document count of Infinity")
    add("tokens-negative-infinity",
        corpus(text=_manifest_text(t, [e0, e1]).replace('"tokens": 9', '"tokens": -Infinity')), "E9016",
        "a token count of -Infinity")
    add("tokens-real", corpus(entry0(tokens=9.0)), "E9016", "a token count of 9.0")
    add("tokens-bool", corpus(entry0(tokens=True)), "E9016", "a token count of true")
    add("tokens-string", corpus(entry0(tokens="9")), "E9016", "a token count that is a string")
    add("tokens-negative", corpus(entry0(tokens=-1)), "E9016", "a negative token count")
    add("tokens-2-63", corpus(entry0(tokens=2**63)), "E9016", "a token count of 2^63")
    add("tokens-5000-digits",
        corpus(text=_manifest_text(t, [e0, e1]).replace('"tokens": 9', '"tokens": ' + "9" * 5000)), "E9016",
        "a token count of 5000 digits (int() refuses over 4300)")
    add("documents-beyond-tokens", corpus(entry0(documents=10)), "E9016", "more documents than tokens")
    add("format-other", corpus(format="other"), "E9016", "another format")
    add("version-real", corpus(version=1.0), "E9016", "version 1.0")
    add("version-2", corpus(version=2), "E9016", "version 2")
    add("vocab-size-wrong", corpus(vocab_size=256), "E9016", "a vocabulary size that is not the tokenizer's")
    add("boundary-wrong", corpus(boundary=0), "E9016", "a boundary that is not the tokenizer's")
    add("tokenizer-unknown", corpus(tokenizer={"kind": "words"}), "E9016", "an unknown tokenizer")
    add("tokenizer-multichar", corpus(tokenizer={"kind": "chars", "vocab": ["ab"]}, vocab_size=2, boundary=1),
        "E9016", "a chars vocabulary of a two-character token")
    add("tokenizer-duplicate", corpus(tokenizer={"kind": "chars", "vocab": ["a", "a"]}, vocab_size=3, boundary=2),
        "E9016", "a chars vocabulary of one character twice")
    add("tokenizer-surrogate", corpus(text=_manifest_text(t, [e0, e1]).replace(
        '{"kind": "bytes"}', '{"kind": "chars", "vocab": ["\\ud800"]}').replace(
        '"vocab_size": 257', '"vocab_size": 2').replace('"boundary": 256', '"boundary": 1')), "E9016",
        "a chars vocabulary of a lone surrogate")
    add("shards-object", corpus(shards={}), "E9016", "shards that are an object")
    add("shard-entry-string", corpus(["shard-00000.psk.d"]), "E9016", "a shard entry that is a string")
    add("path-number", corpus(entry0(path=0)), "E9016", "a shard path that is a number")
    add("path-empty", corpus(entry0(path="")), "E9016", "an empty shard path")
    add("sha256-uppercase", corpus(entry0(sha256=e0["sha256"].upper())), "E9016", "a sha256 in capitals")
    add("sha256-short", corpus(entry0(sha256="0" * 63)), "E9016", "a sha256 of 63 digits")
    twice = '"format": "pskd-corpus", "format": "pskd-corpus"'
    add("key-twice", corpus(text=_manifest_text(t, [e0, e1]).replace('"format": "pskd-corpus"', twice)), "E9016",
        "a top-level key twice")
    add("entry-key-twice", corpus(text=_manifest_text(t, [e0, e1]).replace('"tokens": 9', '"tokens": 9, "tokens": 9')),
        "E9016", "a key twice in a shard entry")
    add("build-unknown-key", corpus(build={"text_key": "text", "tokenizer_speed": 1}), "E9016", "an unknown build key")
    add("source-wrong", corpus(entry0(source={"path": 1})), "E9016", "a source that is not what a build records")
    add("path-absolute", corpus(entry0(path="/etc/passwd")), "E9016", "an absolute shard path")
    add("path-dotdot", corpus(entry0(path="../valid/shard-00000.psk.d")), "E9016",
        "a shard path through '..' (to a good shard of another case)")
    add("path-dotdot-inner", corpus(entry0(path="sub/../../valid/shard-00000.psk.d"),
                                    {**shards, "sub/keep.txt": "a directory for the path to go through\n"}),
        "E9016", "a shard path that goes down, then up out of the directory")
    add("path-backslash-dotdot", corpus(entry0(path="..\\valid\\shard-00000.psk.d")), "E9016",
        "a shard path through '..' written with backslashes")
    add("path-nul", corpus(entry0(path="shard-00000.psk.d\u0000.txt")), "E9016", "a NUL in a shard path")
    add("path-surrogate", corpus(text=_manifest_text(t, [e0, e1]).replace('"shard-00000.psk.d"', '"s\\ud800.psk.d"')),
        "E9016", "a lone high surrogate in a shard path (no file name holds it)")
    add("path-not-utf8-missing", corpus(text=_manifest_text(t, [e0, e1]).replace('"shard-00000.psk.d"',
                                                                                 '"s\\udce9.psk.d"')), "E9017",
        "a shard path of a byte that is not UTF-8 (0xe9, as Python escapes it), a file the directory does not hold")
    add("path-5000-chars", corpus(entry0(path="a/" * 2500 + "s.psk.d")), "E9016", "a shard path of 5000 characters")
    add("path-dot", corpus(entry0(path=".")), "E9016", "a shard path naming the directory itself")
    add("path-trailing-slash", corpus(entry0(path="shard-00000.psk.d/")), "E9016", "a shard path ending in '/'")
    add("symlink-to-etc", corpus(files={"shard-00000.psk.d": Link("/etc/passwd"), "shard-00001.psk.d": s1}), "E9016",
        "a shard that is a symbolic link to /etc/passwd")
    add("symlink-to-sibling", corpus(files={"shard-00000.psk.d": Link("../valid/shard-00000.psk.d"),
                                            "shard-00001.psk.d": s1}), "E9016",
        "a shard that is a symbolic link to a good shard outside the directory")
    add("symlink-directory-out", corpus(entry0(path="sub/shard-00000.psk.d"),
                                        {"sub": Link("../valid"), "shard-00001.psk.d": s1}), "E9016",
        "a shard path through a symbolic link to a directory outside")
    add("symlink-dangling-out", corpus(files={"shard-00000.psk.d": Link("../no-such-case/s.psk.d"),
                                              "shard-00001.psk.d": s1}), "E9016",
        "a shard that is a dangling symbolic link leading outside")

    # Shards that do not verify: E9017 (the manifest itself is good).
    add("shard-missing", corpus(files={"shard-00001.psk.d": s1}), "E9017", "a shard the directory does not hold")
    add("shard-truncated", corpus(files={"shard-00000.psk.d": s0[:-3], "shard-00001.psk.d": s1}), "E9017",
        "a shard three bytes short")
    add("shard-trailing", corpus(files={"shard-00000.psk.d": s0 + b"\0\0", "shard-00001.psk.d": s1}), "E9017",
        "a shard with two bytes after its tokens")
    other = Tokenizer.chars(["h", "e", "l", "o", "a", "b"])
    wrong_type = _shard(other, ["hello", "ab"])
    add("shard-wrong-type", corpus(files={"shard-00000.psk.d": wrong_type, "shard-00001.psk.d": s1}), "E9017",
        "a shard of idx[7][] in a corpus of idx[257][]")
    add("shard-count-lie", corpus(files={"shard-00000.psk.d": _shard(t, ["hello", "ab"], count=8),
                                         "shard-00001.psk.d": s1}), "E9017",
        "a shard whose header counts 8 tokens where the manifest records 9")
    add("shard-count-2-62", corpus(entry0(tokens=2**62), {"shard-00000.psk.d": _shard(t, ["hello", "ab"], count=2**62),
                                                          "shard-00001.psk.d": s1}), "E9017",
        "a shard of 2^62 tokens in header and manifest, 9 present")
    add("tokens-max-twice", corpus([dict(e0, tokens=2**63 - 1), dict(e1, tokens=2**63 - 1)]), "E9017",
        "two shards of 2^63 - 1 tokens each (the sum passes 64 bits), files of a few")
    add("shard-not-pskd", corpus(files={"shard-00000.psk.d": b"not a shard at all", "shard-00001.psk.d": s1}),
        "E9017", "a shard that is not a .psk.d file")
    add("shard-empty-file", corpus(files={"shard-00000.psk.d": b"", "shard-00001.psk.d": s1}), "E9017",
        "a shard file of 0 bytes")
    add("shard-is-directory", corpus(files={"shard-00000.psk.d/keep.txt": "a directory, not a shard\n",
                                            "shard-00001.psk.d": s1}), "E9017", "a shard path naming a directory")
    changed = bytearray(s0)
    changed[-2] ^= 1
    add("shard-changed-byte", corpus(files={"shard-00000.psk.d": bytes(changed), "shard-00001.psk.d": s1}), "E9017",
        "a token changed since the manifest was written (only verify hashes: info accepts it; windows refuse the "
        "token, 257 >= V, with E9004)")
    add("symlink-dangling-inside", corpus(files={"shard-00000.psk.d": Link("nowhere.psk.d"),
                                                 "shard-00001.psk.d": s1}), "E9017",
        "a shard that is a dangling symbolic link inside the directory")
    add("symlink-loop", corpus(files={"shard-00000.psk.d": Link("loop.psk.d"), "loop.psk.d": Link("shard-00000.psk.d"),
                                      "shard-00001.psk.d": s1}), "E9017", "a shard that is a loop of symbolic links")

    # Damage a manifest written after it cannot hide: verify reads tokens and boundaries, not only the hash.
    rehashed = bytearray(s0)
    rehashed[len(t.header(0)) + 2 : len(t.header(0)) + 4] = (300).to_bytes(2, "little")
    add("shard-token-300-rehashed", corpus([_entry("shard-00000.psk.d", bytes(rehashed), 2, t), dict(e1)],
                                           {"shard-00000.psk.d": bytes(rehashed), "shard-00001.psk.d": s1}), "E9017",
        "token 2 is 300 >= V, the sha256 recorded after the damage (verify reads the tokens; windows refuse "
        "the token with E9004)")
    add("documents-disagree", corpus(entry0(documents=1)), "E9017",
        "a shard of 2 boundary tokens whose entry records 1 document")
    v2 = s0[:4] + (2).to_bytes(2, "little") + s0[6 : len(t.header(0))] + (1).to_bytes(4, "little") + b"\x00" \
        + s0[len(t.header(0)) :]
    add("shard-version-2", corpus([_entry("shard-00000.psk.d", v2, 2, t, tokens=9), dict(e1)],
                                  {"shard-00000.psk.d": v2, "shard-00001.psk.d": s1}), None,
        "a shard with a valid version 2 header, its sha256 recorded: read as a shard (every reader reads both "
        "versions)")
    def version_2(shard: bytes, encodings: bytes, leaves: int | None = None, tokenizer: Tokenizer = t) -> bytes:
        """``shard`` (of ``tokenizer``) with a version 2 header listing ``encodings`` (``leaves``: the
        count it claims)."""
        head = len(tokenizer.header(0))
        count = len(encodings) if leaves is None else leaves
        return shard[:4] + (2).to_bytes(2, "little") + shard[6:head] + count.to_bytes(4, "little") + encodings \
            + shard[head:]

    for name, encodings, leaves, what in (
            ("two-encodings", b"\x00\x00", None, "two leaf encodings for the one idx leaf"),
            ("no-encodings", b"", None, "no leaf encoding at all"),
            ("encoding-f32", b"\x01", None, "encoding byte 1 (f32) on the idx leaf"),
            ("encoding-bf16", b"\x02", None, "encoding byte 2 (bf16) on the idx leaf"),
            ("encoding-255", b"\xff", None, "encoding byte 255"),
            ("leaves-claimed-2", b"\x00", 2, "a leaf count of 2 with one encoding byte")):
        bad = version_2(s0, encodings, leaves)
        add(f"shard-version-2-{name}", corpus([_entry("shard-00000.psk.d", bad, 2, t, tokens=9), dict(e1)],
                                              {"shard-00000.psk.d": bad, "shard-00001.psk.d": s1}), "E9017",
            f"a shard with a version 2 header of {what}, its sha256 recorded: refused naming the shard")
    both = version_2(s1, b"\x00")
    add("shard-version-2-both", corpus([_entry("shard-00000.psk.d", v2, 2, t, tokens=9),
                                        _entry("shard-00001.psk.d", both, 1, t, tokens=4)],
                                       {"shard-00000.psk.d": v2, "shard-00001.psk.d": both}), None,
        "both shards with version 2 headers (windows cross from one to the other)")
    v2_chars = version_2(sc, b"\x00", tokenizer=chars)
    add("valid-chars-version-2", {"shards.json": _manifest_text(chars, [_entry("s.psk.d", v2_chars, 2, chars,
                                                                               tokens=len(sc) - len(chars.header(0)))]),
                                  "s.psk.d": v2_chars}, None,
        "a chars tokenizer's shard (idx[4][]) with a version 2 header")
    add("valid-in-progress", corpus(in_progress={"planned_shards": 5}), None,
        "the manifest of a build in progress: 2 of 5 shards finished and listed")
    add("in-progress-fewer-planned", corpus(in_progress={"planned_shards": 1}), "E9016",
        "a manifest in progress that plans fewer shards than it lists")
    add("in-progress-not-object", corpus(in_progress=True), "E9016", "in_progress that is not an object")


# Two tokenizer.json files whose model encodes the text "</s>" to the id of "</s>" (issue 20,
# class 6): a WordLevel model where it is an ordinary word, and a Unigram (SentencePiece's kind)
# where it is a piece and the special token. Written by hand, so that the collection does not
# change with the tokenizers library's own way of saving.
_SPECIAL = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
BOUNDARY_TOKENIZERS = {
    "words-tokenizer.json": {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "</s>": 1, "a": 2, "b": 3}, "unk_token": "[UNK]"}},
    "unigram-tokenizer.json": {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 1, "content": "</s>", **_SPECIAL}], "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "post_processor": None, "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                            "split": True},
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                  "vocab": [["<unk>", 0.0], ["</s>", -1.25], ["\u2581", -2.0], ["a", -2.0], ["b", -2.0],
                            ["<", -2.0], ["/", -2.0], ["s", -2.0], [">", -2.0]]}},
}


# JSONL (and .txt) corpus inputs.

def jsonl_inputs(c: Collection) -> None:
    def add(name, content, code, what, extension=None, **args):
        c.add("jsonl", name, content, code, what, extension=extension, **args)

    vocab = "_fixtures/corpus-vocab.json"
    add("valid", '{"text": "hello"}\n{"text": "ab", "id": 7}\n', None, "two documents")
    add("valid-blank-lines-crlf", '\n{"text": "a"}\r\n\r\n  \n{"text": "b"}', None,
        "blank lines, CRLF endings, no newline at the end")
    add("valid-bom", '\ufeff{"text": "a"}\n', None, "a byte order mark at the start")
    add("valid-empty", "", None, "an empty file (a shard of 0 tokens)")
    add("valid-empty-text", '{"text": ""}\n', None, "an empty text (no document)")
    add("valid-escaped-nul", '{"text": "a\\u0000b"}\n', None, "an escaped NUL in a text (a byte like any other)")
    add("valid-surrogate-pair", '{"text": "\\ud83d\\ude00"}\n', None, "an escaped surrogate pair (one character)")
    add("valid-line-1-5-mib", '{"text": "' + "ab" * (3 << 18) + '"}\n{"text": "c"}\n', None,
        "a line of 1.5 MiB (longer than a read block) and a short one")
    add("valid-chars", '{"text": "ab"}\n{"text": "ba"}\n', None, "a chars tokenizer", vocab=vocab)
    add("valid-skip-bad", b'{"text": "a"}\n[1]\n{"text": 2}\n{"text": "\\ud800"}\n\xff\n{"text": "b"}\n', None,
        "bad lines of every sort with --skip-bad: left out and counted", skip_bad=True)
    add("valid-skip-bad-two-ways", '{"text": "ab"}\n{"text": "abc"}\n{"text": "a\\ud800"}\n', None,
        "a character outside the vocabulary and a lone surrogate in one block, with --skip-bad (found by "
        "fuzzing: the second escaped as an internal exception)", vocab=vocab, skip_bad=True)
    add("two-ways", '{"text": "ab"}\n{"text": "abc"}\n{"text": "a\\ud800"}\n', "E9015",
        "a character outside the vocabulary, then a lone surrogate", vocab=vocab)
    add("not-object", '{"text": "a"}\n[1, 2]\n', "E9015", "a line that is a list")
    add("string-line", '"just a text"\n', "E9015", "a line that is a string")
    add("number-line", "42\n", "E9015", "a line that is a number")
    add("no-text", '{"body": "a"}\n', "E9015", "an object without a text key")
    add("text-number", '{"text": 5}\n', "E9015", "a text that is a number")
    add("text-null", '{"text": null}\n', "E9015", "a text that is null")
    add("text-list", '{"text": ["a"]}\n', "E9015", "a text that is a list")
    add("not-json", '{text: "a"}\n', "E9015", "a line that is not JSON")
    add("truncated-line", '{"text": "a"}\n{"text": "b', "E9015", "a last line cut short")
    add("not-utf8", b'{"text": "a\xffb"}\n', "E9015", "a byte that is not UTF-8")
    add("overlong-utf8", b'{"text": "\xc0\xafb"}\n', "E9015", "an overlong UTF-8 encoding of '/'")
    add("encoded-surrogate", b'{"text": "\xed\xa0\x80"}\n', "E9015", "a surrogate encoded as UTF-8 bytes")
    add("lone-surrogate", '{"text": "\\ud800"}\n', "E9015", "an escaped lone surrogate (UTF-8 cannot hold it)")
    add("lone-low-surrogate", '{"text": "a\\udc00b"}\n', "E9015", "an escaped lone low surrogate")
    add("raw-nul-in-string", '{"text": "a\x00b"}\n', "E9015", "a raw NUL inside a string (JSON escapes controls)")
    add("raw-nul-line", '\x00{"text": "a"}\n', "E9015", "a NUL before the object")
    add("bom-second-line", '{"text": "a"}\n\ufeff{"text": "b"}\n', "E9015", "a byte order mark on the second line")
    add("nested-100000", "[" * 100000 + "\n", "E9015", "arrays nested 100000 deep")
    add("nested-in-object", '{"text": "a", "x": ' + "[" * 100000 + "]" * 100000 + "}\n", "E9015",
        "an object holding arrays nested 100000 deep")
    add("int-5000-digits", '{"text": "a", "n": ' + "1" * 5000 + "}\n", "E9015",
        "a number of 5000 digits beside the text (int() refuses over 4300)")
    add("bad-after-long-line", '{"text": "' + "x" * (3 << 18) + '"}\n[]\n', "E9015",
        "a bad line after a line of 768 KiB")
    add("char-not-in-vocab", '{"text": "ab"}\n{"text": "abc"}\n', "E9015", "a character outside a chars vocabulary",
        vocab=vocab)
    add("gzip-truncated", gzip.compress(b'{"text": "a"}\n' * 100, compresslevel=0, mtime=0)[:200], "E9015",
        "a gzip stream cut short", extension=".jsonl.gz")
    add("gzip-not-gzip", '{"text": "a"}\n', "E9015", "a .jsonl.gz file that is not gzip", extension=".jsonl.gz")
    add("gzip-valid", gzip.compress(b'{"text": "a"}\n{"text": "b"}\n', compresslevel=0, mtime=0), None,
        "a gzip input", extension=".jsonl.gz")
    add("txt-not-utf8", b"ab\xffcd\n", "E9015", "a .txt document that is not UTF-8", extension=".txt")
    add("txt-valid", "one document\nof two lines\n", None, "a .txt document", extension=".txt")
    quoted = '{"text": "a </s> b"}\n{"text": "</s>"}\n{"text": "a</s>b"}\n'
    for model, fixture in (("word", "_fixtures/words-tokenizer.json"), ("piece", "_fixtures/unigram-tokenizer.json")):
        add(f"boundary-{model}-in-text", quoted, None,
            f"texts quoting '</s>', which a {model} of the tokenizer's model encodes to its id: the default boundary "
            "passes over it (an id past the vocabulary) and every document stays whole", tokenizer=fixture)
        add(f"boundary-{model}-named", quoted, "E9011",
            f"--boundary-token '</s>', which the tokenizer's model reaches from text (a {model} of it): refused "
            "naming why", tokenizer=fixture, boundary_token="</s>")
        add(f"boundary-{model}-ordinary-named", quoted, "E9011",
            "--boundary-token 'a', an ordinary entry of the vocabulary", tokenizer=fixture, boundary_token="a")


def safetensors_files(c: Collection) -> None:
    def st(header_json: bytes | str, data: bytes = b"", length: int | None = None) -> bytes:
        raw = header_json.encode("utf-8") if isinstance(header_json, str) else header_json
        return U64.pack(len(raw) if length is None else length) + raw + data

    def tensor(dtype="F32", shape=(2,), offsets=(0, 8), name="a"):
        return json.dumps({name: {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}})

    add = lambda name, data, code, what, **options: c.add("safetensors", name, data, code, what, **options)  # noqa: E731
    add("empty", b"", "E9002", "an empty file")
    add("header-len-max", st("{}", length=2**64 - 1), "E9002", "a header length of 2^64 - 1")
    add("header-not-json", st("{a: 1}"), "E9002", "a header that is not JSON")
    add("header-nested", st('{"a":' + "[" * 100000 + "]" * 100000 + "}"), "E9002", "a header nested 100000 deep")
    add("dtype-unknown", st(tensor(dtype="X9"), bytes(8)), "E9002", "an unknown dtype")
    add("shape-overflow", st(tensor(shape=(2**40, 2**40)), bytes(8)), "E9002",
        "a shape whose product overflows")
    add("offsets-past-end", st(tensor(offsets=(0, 1 << 40)), bytes(8)), "E9002", "offsets beyond the file")
    add("offsets-short", st(tensor(offsets=(0, 4)), bytes(4)), "E9002", "offsets shorter than the shape")
    add("no-tensors", st("{}"), "E9005", "no tensors")
    add("leaf-and-node", st(json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                        "a.b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}),
                            bytes(8)), "E9005", "a name that is a leaf and a node (a and a.b)")
    # (a refused import leaves no file: neither OUT.psk.d nor OUT.layout.json)
    add("nan", st(tensor(), np.array([1.0, np.nan], np.float32).tobytes()), None,
        "a NaN in an f32 tensor (kept, as a checkpoint keeps it)")
    add("negative-int", st(tensor(dtype="I32"), np.array([1, -1], np.int32).tobytes()), None,
        "a negative integer (stored as its two's-complement pattern)")
    add("bool-2", st(tensor(dtype="BOOL", offsets=(0, 2)), bytes([1, 2])), "E9004", "a BOOL byte that is 2")
    add("order-mixed", st(json.dumps({"__metadata__": {"pskd.order": '[1, "a"]'},
                                      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), bytes(8)),
        None, "a recorded order that is not the names (ignored)")
    add("names-3000-deep", st(tensor(name=".".join(["a"] * 3000)), bytes(8)), "E9005", "a name 3000 keys deep")
    add("names-65-deep", st(tensor(name=".".join(["a"] * 65)), bytes(8)), "E9005",
        "a name 65 keys deep (64 is the most a tree nests)")
    add("names-64-deep", st(tensor(name=".".join(["a"] * 64)), bytes(8)), None, "a name 64 keys deep")
    twice = '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' \
            '"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    add("name-twice", st(twice), "E9002", "a header naming one tensor twice (neither may be dropped)")
    add("metadata-key-twice", st('{"__metadata__": {"k": "1", "k": "2"}, ' + tensor()[1:], bytes(8)), "E9002",
        "a metadata key given twice")
    add("type-no-params-name", st(json.dumps({"__metadata__": {"pskd.type": "params 1bad name!"},
                                              "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}),
                                  bytes(8)), None, "a recorded type no params type can have (ignored)")
    add("empty-tensor-huge-axes", st(tensor(shape=(0, 2**62), offsets=(0, 0))), "E9005",
        "an empty tensor whose other axis no array holds")
    add("empty-tensor-70-axes", st(tensor(shape=(0,) + (1,) * 69, offsets=(0, 0))), "E9005",
        "an empty tensor of 70 axes")


# Files that are not regular files, claims no byte backs, non-finite reals, output paths.

DEVICE = "/dev/zero"  # a device that reads without end: an input must refuse it, not read it


def changing_and_special_files(c: Collection) -> None:
    """Inputs that are links to a device, a directory or themselves (E9002: refused at once, never
    read), long words and padding in tokens texts, counts of empty samples, batches of 10^9."""
    for kind in ("container", "tokens", "vocab", "pack", "layout", "safetensors", "jsonl"):
        args = {"vocab": 64} if kind == "tokens" else {"type": "ℝ[]"} if kind == "pack" else {}
        c.add(kind, "link-to-dev-zero", Link(DEVICE), "E9002",
              "a link to /dev/zero (a device: refused at once, never read)", **args)
    c.add("container", "link-to-directory", Link("."), "E9002", "a link to its own directory")
    c.add("container", "link-loop", Link("link-loop.psk.d"), "E9002", "a link to itself")
    c.add("container", "link-to-dev-null", Link("/dev/null"), "E9002", "a link to /dev/null (a device)")
    c.add("container", "count-2-40-empty-type", header("ℝ[0]", 2**40), None,
          "2^40 samples of an empty type (info shows two, reads nothing)")
    c.add("container", "nan-inf-f64", header("ℝ[3]", 1) + np.array([np.nan, np.inf, -np.inf]).tobytes(), None,
          "NaN, Infinity and -Infinity in an f64 file written by another tool (info prints them)")
    payloads = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], np.uint32).tobytes()  # payload, negative, signalling
    c.add("container", "nan-payloads-f32-bf16",
          header("(ℝ[3], ℝ[2])", 1, version=2, encodings=bytes([1, 2])) + payloads + bytes.fromhex("c17f01ff"), None,
          "NaNs with payloads, a negative NaN and a signalling NaN in f32 and bf16 (info shows their bits)")
    add = lambda name, text, code, what: c.add("tokens", name, text, code, what, vocab=64)  # noqa: E731
    add("word-256-kib", "1" * (1 << 18), "E9004", "one word of 256 KiB of digits (read in linear time)")
    add("zero-padded-256-kib", "0" * (1 << 18) + "7 3\n", None, "a token of 256 KiB of zero padding (it is 7)")
    add("zeros-then-letter-256-kib", "1 " + "0" * (1 << 18) + "x 3", "E9004", "a letter after 256 KiB of zeros")
    add("zero-padded-4400", "0" * 4400 + "1 2", None,
        "a token of 4400 zeros then 1 (int() refuses text of over 4300 digits)")
    c.add("pipeline", "batch-billion-over-empty-samples",
          'stream "../_fixtures/empty-2-40.psk.d" |> shuffle(seed = 1) |> batch(B = 1000000000)', None,
          "batches of 10^9 over 2^40 empty samples (pskd pipeline prints 1024 indices a batch)")
    c.add("pipeline", "batch-billion-over-8-samples",
          'stream "../_fixtures/small.psk.d" |> shuffle(seed = 1) |> batch(B = 1000000000)', "E9010",
          "batches of 10^9 over a file of 8 samples: no batch at all (refused as a training run refuses it, "
          "before anything is held)")
    c.add("pipeline", "batch-2-40-over-2-40-empty-samples",
          'stream "../_fixtures/empty-2-40.psk.d" |> batch(B = 1099511627776)', None,
          "one batch of 2^40 empty samples (its indices are never held at once)")
    c.add("pipeline", "stream-a-directory", 'stream "../_fixtures" |> batch(B = 1)', "E9010",
          "a pipeline that streams a directory")


def exports(c: Collection) -> None:
    """``pskd export`` of files written by other tools: non-finite reals are strings (export's
    convention), a count no byte backs is refused."""
    add = lambda name, data, code, what: c.add("export", name, data, code, what)  # noqa: E731
    add("nan-inf-f64", header("ℝ[3]", 2) + np.array([np.nan, np.inf, -np.inf, 1.5, -0.0, 5e-324]).tobytes(), None,
        "NaN, Infinity, -Infinity among f64 values: written as the strings \"NaN\", \"Infinity\", \"-Infinity\"")
    add("nan-payloads-f32-bf16", header("(ℝ[3], ℝ[2])", 1, version=2, encodings=bytes([1, 2]))
        + np.array([0x7FC00001, 0xFFC00000, 0x7F800001], np.uint32).tobytes() + bytes.fromhex("c17f01ff"), None,
        "NaNs with payloads and signs in f32 and bf16: written as \"NaN:0x…\" with their stored bits")
    add("empty-2-40", header("ℝ[0]", 2**40), "E9003", "2^40 samples of an empty type: no byte backs the count")
    add("empty-1000", header("(ℝ[0], idx[3][2, 0])", 1000), None, "1000 samples of an empty type")
    add("index-beyond-bound", header("idx[10][]", 3) + bytes([1, 2, 12]), "E9004", "a stored index above its bound")
    add("truncated", header("ℝ[2]", 3) + bytes(40), "E9003", "three samples announced, two and a half present")
    add("params-no-layout", header("params Model", 1) + bytes(8), "E9001", "a params file and no layout")
    add("link-to-dev-zero", Link(DEVICE), "E9002", "a link to /dev/zero")


def outputs(c: Collection) -> None:
    """What stands at ``-o``: each case is a directory holding ``out.json``, which ``pskd export``
    of a small file is asked to write; it must be refused (E9012) and the directory left as it was
    (the tests run each on a copy)."""
    add = lambda name, target, what: c.add("output", name, {"out.json": Link(target)}, "E9012", what)  # noqa: E731
    add("link-to-dev-null", "/dev/null", "a link to /dev/null (as root, replacing it would break the system)")
    add("link-to-dev-stdout", "/dev/stdout", "a link to /dev/stdout (a process's descriptor)")
    add("link-to-proc-fd", "/proc/self/fd/1", "a link to /proc/self/fd/1")
    add("link-to-directory", ".", "a link to its own directory")
    add("link-loop", "out.json", "a link to itself")
    c.add("output", "link-chain-to-device", {"out.json": Link("second"), "second": Link("/dev/zero")}, "E9012",
          "a link to a link to /dev/zero")


def diffs(c: Collection) -> None:
    """``pskd diff`` of pairs written by other tools: numbers at the edge of f64, non-finite
    values, counts no byte backs, samples larger than the file, structures that differ."""
    def pair(a: bytes | Link, b: bytes | Link | None = None) -> dict:
        return {"a.psk.d": a, "b.psk.d": a if b is None else b}

    def reals(type_text: str, values, count: int = 1) -> bytes:
        return header(type_text, count) + np.asarray(values, dtype="<f8").tobytes()

    def add(name, content, code, what, **expect):
        c.add("diff", name, content, code, what, **({"expect": expect} if expect else {}))

    inf, nan = "inf", "nan"
    add("1e308-against-minus-1e308", pair(reals("ℝ[]", [1e308]), reals("ℝ[]", [-1e308])), None,
        "[1e308] against [-1e308]: ‖a − b‖₂ = 2e308 is beyond f64 (inf), relative exactly 2 "
        "(scaled before subtracting)",
        diff_norm=inf, a_norm=1e308, relative=2.0, elements=1)
    add("1e200-squares", pair(reals("ℝ[1000]", [1e200] * 1000), reals("ℝ[1000]", [-1e200] * 1000)), None,
        "a thousand 1e200 against -1e200: squares beyond f64, relative exactly 2", relative=2.0, elements=1000)
    add("subnormal", pair(reals("ℝ[2]", [5e-324, 0.0]), reals("ℝ[2]", [0.0, 0.0])), None,
        "the smallest subnormal against 0: scaled, not flushed to zero", diff_norm=5e-324, a_norm=5e-324,
        relative=1.0)
    add("inf-against-itself", pair(reals("ℝ[3]", [np.inf, -np.inf, 1.5])), None,
        "±Inf against the same file: equal infinities differ by 0 (no NaN, no numpy warning)",
        diff_norm=0.0, a_norm=inf, relative=0.0, elements=3)
    add("inf-against-finite", pair(reals("ℝ[2]", [1.0, 2.0]), reals("ℝ[2]", [1.0, np.inf])), None,
        "an infinity in b where a is finite: ‖a − b‖₂ is inf", diff_norm=inf, a_norm=5.0 ** 0.5, relative=inf)
    add("inf-against-minus-inf", pair(reals("ℝ[]", [np.inf]), reals("ℝ[]", [-np.inf])), None,
        "+Inf against -Inf: ‖a − b‖₂ is inf", diff_norm=inf, a_norm=inf, relative=nan)
    add("nan-in-a", pair(reals("ℝ[3]", [np.nan, 1.0, 2.0]), reals("ℝ[3]", [0.0, 1.0, 2.0])), None,
        "a NaN in a: ‖a − b‖₂ and ‖a‖₂ are nan, said in a note", diff_norm=nan, a_norm=nan, relative=nan)
    add("nan-against-itself", pair(reals("ℝ[2]", [np.nan, 1.0])), None,
        "NaN against the same file: nan, not 0 (a NaN equals nothing)", diff_norm=nan, relative=nan)
    payloads = header("(ℝ[2], ℝ[2])", 1, version=2, encodings=bytes([1, 2])) \
        + np.array([0x7FC00001, 0x3F800000], np.uint32).tobytes() + bytes.fromhex("c1ff803f")
    add("nan-payloads-f32-bf16", pair(payloads), None, "NaNs with payloads in f32 and bf16 against themselves",
        diff_norm=nan, elements=4)
    signalling = header("ℝ[2]", 1, version=2, encodings=bytes([1])) + np.array([0x7F800001, 0x3F800000],
                                                                                  np.uint32).tobytes()
    add("signalling-nan-f32", pair(signalling), None,
        "a signalling NaN in f32 against itself: widened to f64 without a numpy warning", diff_norm=nan, elements=2)
    add("tiny-a-against-huge-b", pair(reals("ℝ[]", [-9.812829121142502e-281]), reals("ℝ[]", [-1e308])), None,
        "[-9.8e-281] against [-1e308]: ‖a‖₂ scaled by a's own largest value, not flushed to 0 by b's (a fuzz finding)",
        a_norm=9.812829121142502e-281, diff_norm=1e308, relative=inf)
    add("zeros-against-ones", pair(reals("ℝ[2]", [0.0, 0.0]), reals("ℝ[2]", [1.0, 1.0])), None,
        "‖a‖₂ = 0 and ‖a − b‖₂ > 0: relative inf", a_norm=0.0, relative=inf)
    add("empty-2-40", pair(header("ℝ[0]", 2**40)), None,
        "2^40 samples of an empty type against themselves: nothing to read, nothing to loop over", elements=0,
        diff_norm=0.0)
    add("empty-2-40-against-2-39", pair(header("ℝ[0]", 2**40), header("ℝ[0]", 2**39)), "E9005",
        "2^40 empty samples against 2^39: the counts differ")
    add("sample-beyond-file", pair(header("ℝ[137438953472]", 1) + bytes(64)), "E9003",
        "one sample of 2^37 reals (1 TiB) claimed by a file of a hundred bytes")
    add("no-samples-of-a-huge-type", pair(header("ℝ[1099511627776]", 0)), None,
        "no samples of a type of 2^40 reals: nothing to read", elements=0)
    add("count-beyond-data", pair(reals("ℝ[2]", [1.0, 2.0], count=1000)), "E9003",
        "1000 samples announced, one present")
    add("b-cut-short", pair(reals("ℝ[2]", [1.0, 2.0, 3.0, 4.0], count=2),
                            reals("ℝ[2]", [1.0, 2.0, 3.0, 4.0], count=2)[:-5]), "E9003", "b one sample and a bit short")
    add("types-differ", pair(reals("ℝ[2]", [1.0, 2.0]), reals("ℝ[3]", [1.0, 2.0, 3.0])), "E9005",
        "ℝ[2] against ℝ[3]")
    add("counts-differ", pair(reals("ℝ[]", [1.0, 2.0], count=2), reals("ℝ[]", [1.0], count=1)), "E9005",
        "two samples against one")
    add("axis-names-differ", pair(reals("ℝ[model: 2]", [1.0, 2.0]), reals("R[2]", [1.0, 3.0])), None,
        "ℝ[model: 2] against R[2]: one type, axis names aside", diff_norm=1.0, elements=2)
    add("idx-beside-reals", pair(header("(idx[10][2], ℝ[])", 1) + bytes([3, 4]) + np.array([2.0]).tobytes(),
                                 header("(idx[10][2], ℝ[])", 1) + bytes([9, 9]) + np.array([3.0]).tobytes()), None,
        "only real leaves count: the idx leaf is not compared", diff_norm=1.0, elements=1)
    add("b-link-to-dev-zero", pair(reals("ℝ[]", [1.0]), Link(DEVICE)), "E9002", "b is a link to /dev/zero")
    add("b-not-pskd", pair(reals("ℝ[]", [1.0]), b"not a psk.d file at all"), "E9002", "b is not a .psk.d file")


# Checkpoints beside other files (issue 20): sidecar names, keys that print alike, values on the way.


def _saved(tree, name: str = "m.psk.d", **options) -> tuple[bytes, bytes | None]:
    """The data file and layout file (None: none) a save of ``tree`` as ``name`` writes."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, name)
        checkpoint.save(path, tree, SaveOptions(durable=False, **options))
        with open(path, "rb") as f:
            data = f.read()
        beside = layout_path_for(path)
        layout = None
        if os.path.exists(beside):
            with open(beside, "rb") as f:
                layout = f.read()
    return data, layout


def _edited_layout(layout: bytes, change) -> bytes:
    content = json.loads(layout)
    change(content)
    return (json.dumps(content, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _init_false_tree():
    import dataclasses

    @dataclasses.dataclass
    class Model:
        w: np.ndarray
        steps: np.ndarray = dataclasses.field(init=False, default=None)

    model = Model(np.arange(3, dtype=np.float32))
    model.steps = np.int64(41)
    return model


def checkpoints_beside(c: Collection) -> None:
    """A checkpoint directory's files as a user may leave them: a data file and the files beside it
    (old-name layouts, another file's layout, notes), keys that print alike, values a reader of
    the layout file must show as restore gives them (see the generator's ``checkpoint`` kind)."""
    def add(name, files, code, what, **args):
        c.add("checkpoint", name, files, code, what, **args)

    tree_a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.int8(-3)}
    tree_b = {"v": np.ones(4)}
    a, a_layout = _saved(tree_a)
    b, b_layout = _saved(tree_b)
    plain_a, plain_a_layout = _saved(tree_a, "m")
    add("old-name-layout", {"m": plain_a, "m.layout.json": plain_a_layout}, None,
        "a checkpoint m with its layout under the name an earlier version gave it (m.layout.json): read, "
        "as it proves to belong", data="m")
    add("old-name-layout-of-another", {"m": plain_a, "m.layout.json": b_layout}, "E9001",
        "a checkpoint m and, as m.layout.json, another checkpoint's layout: passed over (m has no layout)", data="m")
    add("m-and-m-psk-d", {"m": plain_a, "m.pskd-layout.json": plain_a_layout, "m.psk.d": b,
                          "m.layout.json": b_layout}, None,
        "checkpoints m and m.psk.d side by side, each with a layout of its own")
    add("m-and-m-psk-d-plain", {"m": plain_a, "m.pskd-layout.json": plain_a_layout, "m.psk.d": b,
                                "m.layout.json": b_layout}, None,
        "checkpoints m and m.psk.d side by side: m read through m.pskd-layout.json", data="m")
    add("layout-of-another", {"m.psk.d": a, "m.layout.json": b_layout}, "E9005",
        "the layout of another checkpoint beside m.psk.d")
    closed, _ = _saved(np.arange(3, dtype=np.float32))
    add("notes-beside-closed", {"m.psk.d": closed, "m.layout.json": b"my notes\n"}, None,
        "a closed-type checkpoint with a user's notes at m.layout.json (never read, never removed)")
    for pair, label in (((1, "1"), "1-and-str-1"), ((True, "True"), "true-and-str-true"),
                        ((None, "None"), "none-and-str-none"), ((1.5, "1.5"), "1-5-and-str-1-5")):
        data, layout = _saved({"k": {pair[0]: np.ones(2), pair[1]: np.zeros(2)}})
        add(f"keys-{label}", {"m.psk.d": data, "m.layout.json": layout}, "E9005",
            f"keys {pair[0]!r} and {pair[1]!r}: restored as two keys; export refuses (JSON writes both as "
            f"{str(pair[0])!r}) rather than drop one")
    surrogate = b"name-\xff".decode("utf-8", "surrogateescape")
    data, layout = _saved({surrogate: np.ones(2), "w": np.zeros(1)})
    add("key-not-utf8", {"m.psk.d": data, "m.layout.json": layout}, None,
        "a key that is not UTF-8 text (a surrogate-escaped file name): shown escaped")
    data, layout = _saved({"m": _init_false_tree()})
    add("dataclass-init-false", {"m.psk.d": data, "m.layout.json": layout}, None,
        "a dataclass with an init=False field: the field is saved", paths=["['m'].w", "['m'].steps"])
    data, layout = _saved({"k": np.zeros((0, 2), np.uint32), "w": np.ones(1)})

    def as_keys(content):
        leaf = content["leaves"][0]
        leaf.update(dtype="key<threefry2x32>", kind="key", impl="threefry2x32")
    add("keys-zero-size", {"m.psk.d": data, "m.layout.json": _edited_layout(layout, as_keys)}, None,
        "a zero-size array of typed PRNG keys (no division by its size)")
    data, layout = _saved({"a": np.array([-3, 5, -128], np.int8), "n": -7, "u": np.array([True, False])})
    add("int8-minus-3", {"m.psk.d": data, "m.layout.json": layout}, None,
        "an int8 -3: a reader given the layout file shows -3, as restore does (not its stored 253)")
    for name, tree, code, what in (
            ("python-int-2-64-minus-1", {"n": 2**64 - 1}, None, "a Python int 2^64 - 1: safetensors' U64 holds it"),
            ("python-int-2-64", {"n": 2**64}, "E9004", "a Python int 2^64: beyond what safetensors holds"),
            ("empty-tree", {}, "E9005", "a tree of no leaves: refused on the way out, as on the way back"),
            ("string-keys-0-1", {"0": np.ones(1), "1": np.zeros(1)}, None,
             "string keys '0' and '1': come back strings (pskd.keys records their types)"),
            ("leaf-named-metadata", {"__metadata__": np.ones(1), "w": np.zeros(1)}, "E9005",
             "a leaf named __metadata__, the name safetensors keeps for itself: refused before writing")):
        data, layout = _saved(tree)
        files = {"m.psk.d": data}
        if layout is not None:
            files["m.layout.json"] = layout
        add(f"convert-{name}", files, code, what + " (psk.d → safetensors → psk.d)", command="convert")


def saves_beside(c: Collection) -> None:
    """``pskd convert IN.safetensors -o out.psk.d`` into a directory where files already stand:
    only the toolkit's own layout of out.psk.d is replaced; anything else refuses the save before
    anything is written (see the generator's ``into`` kind)."""
    source = _safetensors_bytes({"w": np.arange(3, dtype=np.float32)})

    def add(name, files, code, what, **args):
        c.add("into", name, {"in.safetensors": source, **files}, code, what, **args)

    a, a_layout = _saved({"x": np.ones(2)})
    b, b_layout = _saved({"y": np.zeros(5)})
    plain, plain_layout = _saved({"x": np.ones(2)}, "out")
    add("notes-at-layout", {"out.layout.json": b"my notes about out\n"}, "E9012",
        "a user's notes where out.psk.d's layout goes: kept, the save refused")
    add("directory-at-destination", {"out.psk.d/kept.txt": b"x"}, "E9012",
        "a directory at the destination: refused before any layout is written")
    add("directory-at-layout", {"out.layout.json/kept.txt": b"x"}, "E9012",
        "a directory where the layout goes")
    add("data-named-like-layout", {"out.layout.json": a}, "E9012",
        "a checkpoint named out.layout.json: never overwritten by out.psk.d's layout")
    add("another-checkpoints-layout", {"out.psk.d": a, "out.layout.json": b_layout}, "E9012",
        "another checkpoint's layout where out.psk.d's goes: kept")
    add("own-layout", {"out.psk.d": a, "out.layout.json": a_layout}, None,
        "out.psk.d's own layout: replaced with the new one", kept=["in.safetensors"])
    add("layout-of-a-save-cut-short", {"out.psk.d": a, "out.layout.json": _edited_layout(
        b_layout, lambda d: d["data"].update(name="out.psk.d"))}, None,
        "a layout recording out.psk.d as its data file, of another save (one cut short): the toolkit's own",
        kept=["in.safetensors"])
    add("plain-neighbour-old-layout", {"out": plain, "out.layout.json": plain_layout}, "E9012",
        "a checkpoint out with its layout under the old name out.layout.json: a save of out.psk.d keeps it")
    add("plain-neighbour", {"out": plain, "out.pskd-layout.json": plain_layout}, None,
        "a checkpoint out with its layout out.pskd-layout.json: out.psk.d gets a layout of its own",
        kept=["in.safetensors", "out", "out.pskd-layout.json"])
    keyed = _safetensors_bytes({"0": np.ones(1, np.float32), "1": np.zeros(1, np.float32)},
                               {"pskd.keys": json.dumps({"0": ["0"], "1": ["1"]})})
    c.add("into", "string-keys", {"in.safetensors": keyed}, None,
          "names 0 and 1 recorded as string keys: restored as the strings '0' and '1'", keys=["0", "1"])


def _safetensors_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    """A safetensors file written by hand (the optional package is not needed to make the cases)."""
    entries: dict = {"__metadata__": metadata} if metadata else {}
    offset, data = 0, b""
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        entries[name] = {"dtype": {"float32": "F32", "float64": "F64"}[str(array.dtype)], "shape": list(array.shape),
                         "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(entries).encode("utf-8")
    return U64.pack(len(text)) + text + data


# --------------------------------------------------------------------------------------------


def fixtures(directory: str) -> None:
    """The files cases point at: a data file for pipelines, a params checkpoint for layouts."""
    path = os.path.join(directory, "_fixtures")
    os.makedirs(path, exist_ok=True)
    write(os.path.join(path, "small.psk.d"), "ℝ[]", np.arange(8, dtype=np.float64), durable=False)
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([0.5, 1.5]), "k": np.uint8(7)}
    checkpoint.save(os.path.join(path, "checkpoint.psk.d"), tree, SaveOptions(name="Model", durable=False))
    # The layout beside it is renamed so that only an explicit --layout is ever read.
    os.replace(os.path.join(path, "checkpoint.layout.json"), os.path.join(path, "checkpoint.layout.json.good"))
    with open(os.path.join(path, "text.txt"), "w", encoding="utf-8") as f:
        f.write("ab\nba\n")
    with open(os.path.join(path, "corpus-vocab.json"), "w", encoding="utf-8") as f:
        f.write('["a", "b"]\n')
    for name, tokenizer in BOUNDARY_TOKENIZERS.items():
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            f.write(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    # A link leading outside the collection: what a pipeline may not stream through.
    os.symlink("/etc/passwd", os.path.join(path, "outside.psk.d"))
    # 2^40 samples of an empty type: a count no byte backs (a pipeline's batches of 10^9 over it).
    with open(os.path.join(path, "empty-2-40.psk.d"), "wb") as f:
        f.write(header("ℝ[0]", 2**40))


def generate(directory: str, *, include_open: bool = False) -> list[dict]:
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    fixtures(directory)
    c = Collection(directory, include_open=include_open)
    for make in (containers, pipelines, vocabularies, token_texts, pack_inputs, layouts, indexes,
                 manager_indexes, safetensors_files, manifests, jsonl_inputs, changing_and_special_files, exports,
                 outputs, diffs, checkpoints_beside, saves_beside):
        make(c)
    manifest = {
        "generator": "tools/make_hostile.py",
        "about": "each file of this directory and the error code the toolkit must answer it with "
                 "(null: valid, must be accepted); see the generator's docstring for how each kind is run",
        "cases": c.cases,
    }
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return c.cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with testdata/hostile/ instead of writing")
    parser.add_argument("--include-open", action="store_true",
                        help="also write the cases of known open bugs (the tests then fail on them)")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as scratch:
            fresh = os.path.join(scratch, "hostile")
            generate(fresh)
            different = _differences(fresh, OUT)
        if different:
            print("testdata/hostile/ is stale: " + ", ".join(different[:10]))
            sys.exit(1)
        print("testdata/hostile/ is up to date")
        return
    cases = generate(OUT, include_open=args.include_open)
    kinds: dict[str, int] = {}
    for case in cases:
        kinds[case["kind"]] = kinds.get(case["kind"], 0) + 1
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT, ROOT)}: "
          + ", ".join(f"{n} {k}" for k, n in kinds.items()))


def _differences(a: str, b: str) -> list[str]:
    """The entries that differ between two trees, symbolic links compared as links (their targets,
    never followed: a case's link may lead to /etc or to nothing)."""
    def entries(root: str) -> dict[str, tuple]:
        found = {}
        for directory, dirs, files in os.walk(root):  # os.walk does not descend into linked directories
            for name in dirs + files:
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                if os.path.islink(path):
                    found[relative] = ("link", os.readlink(path))
                elif os.path.isdir(path):
                    found[relative] = ("directory",)
                else:
                    with open(path, "rb") as f:
                        found[relative] = ("file", hashlib.sha256(f.read()).hexdigest())
        return found

    left, right = entries(a), entries(b)
    return sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))


if __name__ == "__main__":
    main()
