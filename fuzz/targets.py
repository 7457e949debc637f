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

This module is imported by ``fuzz/run.py`` (and by the regression tests); ``prepare`` makes the
fixture files a target needs in a scratch directory.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from typing import Callable

import numpy as np

from pskd_jax import checkpoint, convert, inspection, manager, pack, pipeline, sample_type, text, windows
from pskd_jax.container import Reader, write, write_encoded
from pskd_jax.errors import PskdError

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
                                          "b": [np.float64(0.5), np.uint8(7)]}, name="Model", durable=False)
        self.index_dir = os.path.join(directory, "index")
        self.index_files = {}
        with manager.CheckpointManager(os.path.join(self.fixtures, "run"), durable=False) as m:
            m.save(1, {"w": np.ones(3, np.float32)}, extra={"epoch": 1, "batch": 2})
            for name in os.listdir(m.directory):
                with open(os.path.join(m.directory, name), "rb") as f:
                    self.index_files[name] = f.read()
        self.small = os.path.join(self.fixtures, "small.psk.d")
        write(self.small, "ℝ[]", np.arange(10, dtype=np.float64), durable=False)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)


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
            reader.trailing_bytes
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
            layout = sample_type.Layout.of_type(parsed)
            again = sample_type.Layout.of_type(sample_type.format_type(parsed))
            if again.leaves != layout.leaves or again.structure != layout.structure:
                raise Finding(f"{type_text!r}: its canonical text {sample_type.format_type(parsed)!r} "
                              "has another layout")
            if sample_type.Layout.of_type(stored).leaves != layout.leaves:
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
            small = text.read_tokens(path, chunk_size=3)
            large = text.read_tokens(path)
            if not np.array_equal(small, large):
                raise Finding("the tokens differ with the block size")
            try:
                text.read_tokens(path, bound=bound)
            except PskdError:
                if bound is None or not len(large) or int(large.max()) < bound:
                    raise Finding("a bound refused tokens below it")
            else:
                if bound is not None and len(large) and int(large.max()) >= bound:
                    raise Finding("a bound accepted a token at or above it")
            windows.lm_windows_file(path, s.path("t.psk.d"), vocab=int(large.max()) + 1 if len(large) else 1,
                                    seq=2, stride=1)
    except PskdError:
        pass


def t_pack(s: Scratch, data: bytes) -> None:
    head, _, body = data.partition(b"\n")
    type_text = head.decode("utf-8", errors="replace")
    try:
        layout = sample_type.Layout.of_type(type_text)
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


def t_checkpoints_index(s: Scratch, data: bytes) -> None:
    directory = s.index_dir
    os.makedirs(directory, exist_ok=True)
    for name, content in s.index_files.items():
        if name != manager.INDEX and not os.path.exists(os.path.join(directory, name)):
            _write(os.path.join(directory, name), content)
    _write(os.path.join(directory, manager.INDEX), data)
    try:
        manager.read_index(directory)
        manager.verify_directory(directory)
        with manager.CheckpointManager(directory, durable=False) as m:
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
        convert.safetensors_to_pskd(source, s.path("st.psk.d"), durable=False)
        inspection.info_lines(s.path("st.psk.d"), layout=checkpoint.find_layout(s.path("st.psk.d")))
    except PskdError:
        pass


TARGETS: dict[str, Callable[[Scratch, bytes], None]] = {
    "container": t_container,
    "sample_type": t_sample_type,
    "pipeline": t_pipeline,
    "vocab_tokens": t_vocab_tokens,
    "pack": t_pack,
    "layout": t_layout,
    "checkpoints_index": t_checkpoints_index,
    "safetensors": t_safetensors,
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
}


# --------------------------------------------------------------------------------------------
# Seeds


def _container_seeds(scratch: Scratch) -> list[bytes]:
    seeds = []
    cases = [
        ("ℝ[]", np.arange(3, dtype=np.float64), None),
        ("(idx[64][seq: 4], ℝ[])", (np.arange(8).reshape(2, 4), np.array([0.5, 1.5])), None),
        ("(ℝ[2], ℝ[2], idx[3][])", (np.ones((2, 2), np.float32), np.ones((2, 2)), np.array([0, 2])), ["f32", "bf16", "f64"]),
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
        return [b"\x00" + json.dumps(v, ensure_ascii=False).encode() for v in (["\n", "a", "b"], ["é", "ß", "漢", "😀"], [])] + \
               [b"\x01" + t for t in (b"1 2 3\n", b"0\t17\r\n255 256", b"18446744073709551615", b"")]
    if target == "pack":
        return [b"(idx[10][2], R[])\n1 2 0.5\n-- comment\n\n3 4 1e-3\n", "ℝ[3]\n1 2 3\n4.5 6 7\n".encode(),
                b"bool[2]\n0 1\n1 1\n", b"idx[18446744073709551616][]\n18446744073709551615\n"]
    if target == "layout":
        return [open(checkpoint.layout_path_for(scratch.checkpoint), "rb").read()]
    if target == "checkpoints_index":
        return [scratch.index_files[manager.INDEX]]
    if target == "safetensors":
        from safetensors.numpy import save
        out = []
        for tensors in ({"a.w": np.arange(6, dtype=np.float32).reshape(2, 3), "a.b": np.zeros(2, np.float64)},
                        {"x.0": np.ones(4, np.int32), "x.1": np.array([True, False])}):
            blob = save(tensors, metadata={"pskd.order": json.dumps(list(tensors))})
            (n,) = struct.unpack("<Q", blob[:8])
            out.append(struct.pack("<H", len(blob) - 8 - n) + blob[8 : 8 + n])
        return out
    raise KeyError(target)


def hostile_inputs(target: str) -> list[bytes]:
    """The hostile collection's files that fit a target, as that target's inputs."""
    manifest_path = os.path.join(HOSTILE, "manifest.json")
    if not os.path.exists(manifest_path):
        return []
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    kinds = HOSTILE_KINDS[target]
    kinds = kinds if isinstance(kinds[0], tuple) else (kinds,)
    out = []
    for case in manifest["cases"]:
        for kind, how in kinds:
            if case["kind"] != kind:
                continue
            path = os.path.join(HOSTILE, case["file"])
            if os.path.isdir(path):
                path = os.path.join(path, manager.INDEX)
            with open(path, "rb") as f:
                data = f.read()
            if how == "type":
                data = _type_of(data)
            elif how == "pack":
                data = case["args"]["type"].encode() + b"\n" + data
            elif how == "safetensors":
                data = _safetensors_input(data)
            elif isinstance(how, bytes):
                data = how + data
            if data is not None:
                out.append(data)
    return out


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
