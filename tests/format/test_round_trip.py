"""Random sample types and values written by every writer and read back by both access paths,
bit for bit (hypothesis)."""

from __future__ import annotations

import math
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.format.reader import Reader
from pskd_jax.format.writer import write, write_encoded, write_stream

from .golden import BF16, bits

SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------
# Round trips over random types and values

NAMES = ["seq", "model", "R", "d", "ℝ"]


def expected_uint(bound: int) -> np.dtype:
    for limit, dtype in ((2**8, "<u1"), (2**16, "<u2"), (2**32, "<u4")):
        if bound <= limit:
            return np.dtype(dtype)
    return np.dtype("<u8")


@st.composite
def leaf_types(draw):
    """(text, kind, shape, bound): kind 'real' | 'idx' | 'bool'."""
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    named = [draw(st.none() | st.sampled_from(NAMES)) for _ in shape]
    dims = "[" + ", ".join(f"{n}: {s}" if n else str(s) for n, s in zip(named, shape)) + "]"
    kind = draw(st.sampled_from(["real", "real", "idx", "bool"]))
    if kind == "real":
        return draw(st.sampled_from(["ℝ", "R"])) + dims, kind, shape, None
    if kind == "bool":
        return "bool" + dims, kind, shape, 2
    bound = draw(st.sampled_from([1, 2, 255, 256, 257, 2**16 - 1, 2**16, 2**16 + 1, 2**32 - 1, 2**32,
                                  2**32 + 1, 2**64 - 1, 2**64]) | st.integers(1, 2**64))
    return f"idx[{bound}]{dims}", kind, shape, bound


@st.composite
def sample_types(draw, depth=0):
    """(text, leaves in storage order, build(values) → the pytree of those values)."""
    if depth >= 2 or draw(st.booleans()):
        text, kind, shape, bound = draw(leaf_types())
        return text, [(kind, shape, bound)], lambda values: values[0]
    items = draw(st.lists(sample_types(depth + 1), min_size=2, max_size=3))
    leaves = [leaf for _, item_leaves, _ in items for leaf in item_leaves]

    def build(values):
        out, start = [], 0
        for _, item_leaves, item_build in items:
            out.append(item_build(values[start:start + len(item_leaves)]))
            start += len(item_leaves)
        return tuple(out)

    return "(" + ", ".join(text for text, _, _ in items) + ")", leaves, build


def bf16_values(draw, shape):
    raw = draw(st.lists(st.integers(0, 0xFFFF).filter(lambda b: b & 0x7F80 != 0x7F80),
                        min_size=math.prod(shape), max_size=math.prod(shape)))
    return np.array(raw, np.uint16).view(BF16).reshape(shape)


@st.composite
def leaf_values(draw, kind, shape, bound, encoding, n):
    shape = (n, *shape)
    size = math.prod(shape)
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), bool).reshape(shape)
    if kind == "idx":
        edge = st.sampled_from(sorted({0, bound - 1, max(bound - 2, 0), bound // 2}))
        ints = draw(st.lists(edge | st.integers(0, bound - 1), min_size=size, max_size=size))
        return np.array(ints, dtype=expected_uint(bound)).reshape(shape)
    if encoding == "bf16":
        return bf16_values(draw, shape)
    width = 32 if encoding == "f32" else 64
    floats = st.floats(allow_nan=False, allow_infinity=False, width=width) | st.sampled_from([-0.0, 0.0])
    dtype = np.float32 if encoding == "f32" else np.float64
    return np.array(draw(st.lists(floats, min_size=size, max_size=size)), dtype).reshape(shape)


def header_size(type_text: str, leaves: int, version: int) -> int:
    return 4 + 2 + 4 + len(type_text.encode()) + 8 + (4 + leaves if version == 2 else 0)


def element_size(kind, bound, encoding) -> int:
    if kind == "real":
        return {"f64": 8, "f32": 4, "bf16": 2}[encoding]
    return expected_uint(bound).itemsize


def check_leaf(got: np.ndarray, want: np.ndarray, kind, bound, encoding):
    if kind == "real":
        assert got.dtype == {"f64": np.float64, "f32": np.float32, "bf16": BF16}[encoding]
        assert bits(got) == bits(want.astype(got.dtype))
    else:
        assert got.dtype == expected_uint(bound)
        assert got.tolist() == np.asarray(want).astype(np.uint64).tolist()


@st.composite
def files(draw):
    text, leaves, build = draw(sample_types())
    encodings = [draw(st.sampled_from(["f64", "f32", "bf16"])) if kind == "real" else "f64"
                 for kind, _, _ in leaves]
    n = draw(st.integers(0, 4))
    values = [draw(leaf_values(kind, shape, bound, enc, n)) for (kind, shape, bound), enc in zip(leaves, encodings)]
    return text, leaves, build, encodings, n, values


@pytest.mark.slow
@SETTINGS
@given(files(), st.data())
def test_round_trip_random_types(tmp_path_factory, file, data):
    text, leaves, build, encodings, n, values = file
    directory = tmp_path_factory.mktemp("rt")
    path = directory / "f.psk.d"
    how = data.draw(st.sampled_from(["write", "write_encoded", "write_encoded_f64_values", "write_stream"]))
    if how == "write":
        result = write(path, text, build(values))
    elif how == "write_encoded":
        result = write_encoded(path, text, build(values), encodings)
    elif how == "write_stream":  # two batches, split anywhere (either may be empty)
        k = data.draw(st.integers(0, n))
        batches = [build([v[:k] for v in values]), build([v[k:] for v in values])]
        result = write_stream(path, text, batches, encodings=encodings)
    else:  # f64 arrays whose values are exactly in each leaf's encoding
        widened = [v.astype(np.float64) if kind == "real" else v for v, (kind, _, _) in zip(values, leaves)]
        result = write_encoded(path, text, build(widened), encodings)
    version = 1 if all(e == "f64" for e in encodings) else 2
    stored_text = text.replace("R[", "ℝ[")
    assert (result.version, result.count, result.type_text) == (version, n, stored_text)
    assert [e.label for e in result.encodings] == encodings
    sample_bytes = sum(math.prod(shape) * element_size(kind, bound, enc)
                       for (kind, shape, bound), enc in zip(leaves, encodings))
    data_bytes = path.read_bytes()
    assert len(data_bytes) == header_size(stored_text, len(leaves), version) + n * sample_bytes
    assert data_bytes[:6] == b"PSKD" + struct.pack("<H", version)
    assert sorted(os.listdir(directory)) == ["f.psk.d"]

    with Reader(path) as reader:
        assert (reader.header.version, reader.header.type_text, len(reader)) == (version, stored_text, n)
        assert reader.sample_bytes == sample_bytes and reader.trailing_bytes == 0
        for got, want, (kind, _, bound), enc in zip(reader.leaves(), values, leaves, encodings):
            assert not got.flags.writeable
            check_leaf(got, want, kind, bound, enc)
        flat_samples = flat(reader.samples(), len(leaves))
        for got, want, (kind, _, bound), enc in zip(flat_samples, values, leaves, encodings):
            check_leaf(got, want, kind, bound, enc)
        for k in range(n):
            sample = flat(reader[k], len(leaves))
            for got, want, (kind, _, bound), enc in zip(sample, values, leaves, encodings):
                check_leaf(got, want[k], kind, bound, enc)
        if n:
            indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=8))
            gathered = flat(reader.gather(indices), len(leaves))
            for got, want, (kind, shape, bound), enc in zip(gathered, values, leaves, encodings):
                assert got.shape == (len(indices), *shape)
                check_leaf(got, want[np.array(indices, dtype=np.intp)], kind, bound, enc)

    with Reader(path, access="pread") as reader:  # the same samples read with preadv
        for k in range(n):
            sample = flat(reader[k], len(leaves))
            for got, want, (kind, _, bound), enc in zip(sample, values, leaves, encodings):
                check_leaf(got, want[k], kind, bound, enc)
        if n:  # random indices, then a run of consecutive ones (one preadv) and its reverse
            indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=8)) + list(range(n)) + list(range(n))[::-1]
            gathered = flat(reader.gather(indices), len(leaves))
            for got, want, (kind, shape, bound), enc in zip(gathered, values, leaves, encodings):
                assert got.shape == (len(indices), *shape)
                check_leaf(got, want[np.array(indices, dtype=np.intp)], kind, bound, enc)

    if version == 1 and how != "write":
        # An all-f64 file is the same bytes whichever writer wrote it.
        write(directory / "g.psk.d", text, build(values))
        assert (directory / "g.psk.d").read_bytes() == data_bytes


def flat(tree, count: int) -> list:
    """The leaves of a closed-type value in storage order (tuples only)."""
    if count == 1 and not isinstance(tree, tuple):
        return [tree]
    out = []
    for item in tree:
        out.extend(flat(item, 1) if not isinstance(item, tuple) else flat(item, 2))
    return out
