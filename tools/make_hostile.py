"""Writes ``testdata/hostile/``: malformed and malicious inputs for every parser of the toolkit, and
``manifest.json``, the error code each must produce.

    python tools/make_hostile.py            # regenerate testdata/hostile/ (deterministic)
    python tools/make_hostile.py --check    # exit 1 if the files on disk differ from what it makes

Each case is one file (a directory for checkpoint indexes) of a *kind*, which says how the toolkit
meets it (``tests/test_hostile.py`` runs each through the API and through the ``pskd`` command):

| kind        | API                                             | command                                 |
| ----------- | ----------------------------------------------- | --------------------------------------- |
| container   | ``Reader`` over every sample, ``info_lines``    | ``pskd info FILE``                      |
| pipeline    | ``load_pipeline(root=ROOT)``, ``Reader`` of it  | ``pskd pipeline FILE --root ROOT``      |
| vocab       | ``read_vocab``, then ``encode_file``            | ``pskd encode TEXT --vocab FILE``       |
| tokens      | ``lm_windows_file(vocab=args.vocab, seq=4)``    | ``pskd lm-windows FILE --vocab V …``    |
| pack        | ``pack_file(FILE, args.type, …)``               | ``pskd pack FILE --type T …``           |
| layout      | ``read_layout_file``, ``info_lines(checkpoint)`` | ``pskd info CHECKPOINT --layout FILE``  |
| index       | ``verify_directory(DIR)``                       | ``pskd verify DIR``                     |
| safetensors | ``safetensors_to_pskd``                         | ``pskd convert FILE -o OUT.psk.d``      |

``ROOT`` is this collection's directory: pipeline cases stream files of ``_fixtures/`` and
``container/``. ``code`` is the ``E9xxx`` the toolkit must answer with, or ``null`` for an input
that is odd but valid and must be accepted. Whatever the case, nothing
may raise another exception, print a traceback, run past the time limit or allocate more than the
tests' memory limit.

The fixtures that layout and pipeline cases point at (a real ``params`` checkpoint, a small data
file) are written here too, under ``_fixtures/``; they are not cases.
"""

from __future__ import annotations

import argparse
import filecmp
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
from pskd_jax.container import write  # noqa: E402

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


class Collection:
    def __init__(self, directory: str, *, include_open: bool = False):
        self.directory = directory
        self.include_open = include_open
        self.cases: list[dict] = []

    def add(self, kind: str, name: str, content: bytes | str | dict, code: str | None, what: str,
            open_bug: str | None = None, **args) -> None:
        """One case: ``content`` is the file's bytes (text is UTF-8), or for an ``index`` case a dict
        of file name → bytes making up the directory.

        ``open_bug`` marks a case the toolkit fails today in code this collection's owner does not
        maintain (what it does instead): left out unless ``--include-open``, which writes it with
        the rest so that the owner can run the tests against it."""
        if open_bug is not None and not self.include_open:
            return
        extension = {"container": ".psk.d", "pipeline": ".pipeline", "vocab": ".json", "tokens": ".tok",
                     "pack": ".txt", "layout": ".layout.json", "index": "", "safetensors": ".safetensors"}[kind]
        relative = f"{kind}/{name}{extension}"
        path = os.path.join(self.directory, relative)
        if isinstance(content, dict):
            os.makedirs(path, exist_ok=True)
            for file_name, data in content.items():
                with open(os.path.join(path, file_name), "wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
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
    add("missing-file", 'stream "no-such.psk.d" |> batch(B = 1)', "E9002", "a path to no file")
    add("not-a-container", 'stream "not-utf8.pipeline" |> batch(B = 1)', "E9002",
        "a path to a file that is not a .psk.d")
    add("hostile-container", 'stream "../container/count-max.psk.d" |> batch(B = 1)', "E9003",
        "a path to a hostile container")


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
    add("fewer-leaves", changed(lambda d: d["leaves"].pop()), "E9005", "one leaf fewer than the checkpoint")
    add("smaller-sample", changed(lambda d: d["leaves"][0].update(shape=[1, 3])), "E9005",
        "a layout whose samples are smaller than the file's data")
    add("larger-sample", changed(lambda d: d["leaves"][0].update(shape=[3, 3])), "E9003",
        "a layout whose samples are larger than the file's data (the file reads as truncated)")
    add("keys-twice", changed(lambda d: [leaf.update(keys=["x"]) for leaf in d["leaves"]]), "E9005",
        "two leaves of one key path")
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
    add("nan", st(tensor(), np.array([1.0, np.nan], np.float32).tobytes()), "E9004", "a NaN in an f32 tensor")
    add("negative-int", st(tensor(dtype="I32"), np.array([1, -1], np.int32).tobytes()), "E9004",
        "a negative integer (indices are not negative)")
    add("order-mixed", st(json.dumps({"__metadata__": {"pskd.order": '[1, "a"]'},
                                      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), bytes(8)),
        None, "a recorded order that is not the names (ignored)")
    add("names-3000-deep", st(tensor(name=".".join(["a"] * 3000)), bytes(8)), "E9005", "a name 3000 keys deep")
    add("names-65-deep", st(tensor(name=".".join(["a"] * 65)), bytes(8)), "E9005",
        "a name 65 keys deep (64 is the most a tree nests)")
    add("names-64-deep", st(tensor(name=".".join(["a"] * 64)), bytes(8)), None, "a name 64 keys deep")


# --------------------------------------------------------------------------------------------


def fixtures(directory: str) -> None:
    """The files cases point at: a data file for pipelines, a params checkpoint for layouts."""
    path = os.path.join(directory, "_fixtures")
    os.makedirs(path, exist_ok=True)
    write(os.path.join(path, "small.psk.d"), "ℝ[]", np.arange(8, dtype=np.float64), durable=False)
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([0.5, 1.5]), "k": np.uint8(7)}
    checkpoint.save(os.path.join(path, "checkpoint.psk.d"), tree, name="Model", durable=False)
    # The layout beside it is renamed so that only an explicit --layout is ever read.
    os.replace(os.path.join(path, "checkpoint.layout.json"), os.path.join(path, "checkpoint.layout.json.good"))
    with open(os.path.join(path, "text.txt"), "w", encoding="utf-8") as f:
        f.write("ab\nba\n")


def generate(directory: str, *, include_open: bool = False) -> list[dict]:
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    fixtures(directory)
    c = Collection(directory, include_open=include_open)
    for make in (containers, pipelines, vocabularies, token_texts, pack_inputs, layouts, indexes,
                 safetensors_files):
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
    comparison = filecmp.dircmp(a, b)
    out = [*comparison.left_only, *comparison.right_only, *comparison.diff_files]
    for name, sub in comparison.subdirs.items():
        out += [f"{name}/{d}" for d in _differences(os.path.join(a, name), os.path.join(b, name))]
    return out


if __name__ == "__main__":
    main()
