"""Work and memory follow the bytes present and the output asked for, never a header's claims:
a count of empty samples, a sample of gigabytes, a batch of 10^9, a word of megabytes, a sparse
file of 100 GiB. Memory is measured with tracemalloc (numpy reports its buffers to it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from pskd_jax import data, pipeline
from pskd_jax.data import export, text, tokens
from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, Writer, write
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import encode_header

MiB = 1 << 20


def peak(call, *args, runs: int = 3, **kwargs) -> tuple[object, int]:
    """(what the call returned or raised, the peak of its allocations in bytes): the least of
    ``runs`` calls, each its own outputs anew. tracemalloc counts every thread's allocations, and
    this process may host other tests' servers (the in-process S3 server serving a request still
    in flight): their bytes are not the call's, and they do not come in every run."""
    least, result = None, None
    for _ in range(runs):
        tracemalloc.start()
        try:
            try:
                result = call(*args, **kwargs)
            except PskdError as e:
                result = e
            used = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        least = used if least is None else min(least, used)
    assert least is not None
    return result, least


def sparse(path, head: bytes, size: int) -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def test_export_refuses_a_count_of_empty_samples_no_byte_backs(tmp_path):
    path = tmp_path / "empty.psk.d"
    path.write_bytes(encode_header("ℝ[0]", 2**40, [Encoding.F64]))
    error, used = peak(data.export_json, str(path), str(tmp_path / "out.json"))
    assert isinstance(error, PskdError) and error.code == "E9003" and str(path) in error.message
    assert used < 4 * MiB and os.listdir(tmp_path) == ["empty.psk.d"]
    assert data.info_lines(str(path))[1] == "count   1099511627776"


def test_export_of_empty_samples_within_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "empty.psk.d"
    path.write_bytes(encode_header("(ℝ[0], idx[3][2, 0])", 1000, [Encoding.F64, Encoding.F64]))
    monkeypatch.setattr(export, "MAX_EMPTY_SAMPLES", 1000)
    assert data.export_json(str(path), str(tmp_path / "out.json")) == 1000
    assert json.loads((tmp_path / "out.json").read_text())["samples"] == [[[], [[], []]]] * 1000
    monkeypatch.setattr(export, "MAX_EMPTY_SAMPLES", 999)
    with pytest.raises(PskdError, match="E9003"):
        data.export_json(str(path), str(tmp_path / "out2.json"))


def test_info_of_a_sample_of_gigabytes_reads_what_it_shows(tmp_path):
    path = tmp_path / "huge.psk.d"
    head = encode_header("(ℝ[200000000], idx[300][3])", 1, [Encoding.F64, Encoding.F64])
    sparse(path, head, len(head) + 1_600_000_000 + 6)
    lines, used = peak(data.info_lines, str(path))
    assert lines[-1] == "[0] ([" + ", ".join(["0.0"] * 64) + ", … (200000000 elements, shape [200000000])], [0, 0, 0])"
    assert used < 4 * MiB


@pytest.mark.parametrize("chunk", [1, 5, 6, 7, 30, 1 << 20])
def test_export_streams_a_large_sample_in_parts_and_writes_the_same_json(tmp_path, monkeypatch, chunk):
    path = tmp_path / "s.psk.d"
    write(path, "(ℝ[3, 2, 5], idx[7][6], ℝ[])", (np.arange(60.0).reshape(2, 3, 2, 5) / 3,
                                                  np.arange(12).reshape(2, 6) % 7, np.array([0.5, -1.0])),
          durable=False)
    data.export_json(str(path), str(tmp_path / "whole.json"))
    monkeypatch.setattr(export, "CHUNK_ELEMENTS", chunk)
    data.export_json(str(path), str(tmp_path / "parts.json"))
    assert (tmp_path / "parts.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


@pytest.mark.slow
def test_export_of_a_large_sample_holds_a_chunk_not_the_sample(tmp_path, monkeypatch):
    path = tmp_path / "s.psk.d"
    write(path, "ℝ[512, 512]", np.ones((1, 512, 512)), durable=False)  # 2 MiB of data
    monkeypatch.setattr(export, "CHUNK_ELEMENTS", 4096)
    _, used = peak(data.export_json, str(path), str(tmp_path / "out.json"))
    assert used < 1 * MiB
    assert np.array(json.loads((tmp_path / "out.json").read_text())["samples"]).shape == (1, 512, 512)


def test_writing_no_samples_of_a_type_of_gigabytes(tmp_path):
    for type_text in ("ℝ[300000000]", "(ℝ[300000000], idx[3][])"):
        path = tmp_path / "zero.psk.d"
        with Writer(path, type_text) as writer:
            leaves = [np.zeros((0, 300000000))] if "idx" not in type_text else (np.zeros((0, 300000000)),
                                                                                  np.zeros(0, np.uint8))
            writer.append(leaves[0] if "idx" not in type_text else leaves)
        with Reader(path) as reader:
            assert len(reader) == 0 and reader.sample_bytes >= 2_400_000_000


@pytest.mark.slow
def test_a_tokens_word_without_whitespace_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "word.tok"
    path.write_bytes(b"1" * (32 * MiB))
    error, used = peak(data.read_tokens, str(path))
    assert isinstance(error, PskdError) and error.code == "E9004" and "33554432 digits" in error.message
    assert used < 2 * MiB
    path.write_bytes(b"0" * (32 * MiB) + b"7 8\n9")  # zero padding of any length is a token
    values, used = peak(data.read_tokens, str(path))
    assert values.tolist() == [7, 8, 9] and used < 6 * MiB


def test_a_long_word_is_the_same_tokens_in_any_block_size(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "LONG_WORD", 8)
    content = b"1 " + b"0" * 100 + b"42\n" + b"0" * 50 + b" 3 " + b"0" * 20 + b"18446744073709551615"
    path = tmp_path / "t.tok"
    path.write_bytes(content)
    for chunk in (1, 3, 16, 1 << 17):
        assert data.read_tokens(str(path), chunk_size=chunk).tolist() == [1, 42, 0, 3, 2**64 - 1]
    path.write_bytes(b"1 " + b"0" * 100 + b"4x2 5")
    with pytest.raises(PskdError, match="E9004: .*t.tok:1: '0000"):
        data.read_tokens(str(path), chunk_size=3)


def test_a_sparse_tokens_file_claims_no_memory_before_its_tokens(tmp_path):
    path = tmp_path / "sparse.tok"
    with open(path, "wb") as f:
        f.write(b"1 2 3 ")
        f.truncate(100 << 30)  # 100 GiB of NUL bytes, none on disk
    error, used = peak(data.read_tokens, str(path))
    assert isinstance(error, PskdError) and error.code == "E9004"
    assert used < 32 * MiB


def test_decode_of_long_tokens_makes_its_text_in_parts(tmp_path, monkeypatch):
    vocab = ["a" * 1000, "b", "é" * 300]
    ids = np.random.default_rng(0).integers(0, 3, 2000)
    (tmp_path / "t.tok").write_text(" ".join(map(str, ids)))
    data.decode_file(str(tmp_path / "t.tok"), vocab, str(tmp_path / "whole.txt"))
    monkeypatch.setattr(text, "DECODE_PART_BYTES", 4096)
    _, used = peak(data.decode_file, str(tmp_path / "t.tok"), vocab, str(tmp_path / "parts.txt"))
    assert (tmp_path / "parts.txt").read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert used < 1 * MiB  # (the whole text is 1.3 MB)


def test_a_part_of_a_batch(tmp_path):
    p = pipeline.Pipeline("e.psk.d", seed=7, batch_size=10**9)
    n = 2**40
    head, used = peak(p.batch_indices, n, 1, 3, stop=5)
    assert len(head) == 5 and used < 1 * MiB
    small = pipeline.Pipeline("e.psk.d", seed=7, batch_size=10)
    whole = small.batch_indices(1000, 2, 3)
    assert np.array_equal(np.concatenate([small.batch_indices(1000, 2, 3, start=a, stop=min(a + 3, 10))
                                          for a in range(0, 10, 3)]), whole)
    numbers = list(zip(range(25), small.iter_batch_numbers(1000, epochs=3)))
    assert [(e, j) for _, (_, e, j) in numbers][:3] == [(1, 0), (1, 1), (1, 2)]
    for (state, e, j), (state2, indices) in zip((x for _, x in numbers), small.iter_batches(1000, epochs=3)):
        assert state == state2 and np.array_equal(small.batch_indices(1000, e, j), indices)
    with pytest.raises(PskdError):
        small.batch_indices(1000, 1, 0, start=4, stop=2)


@pytest.mark.subprocess
@pytest.mark.slow
def test_pskd_pipeline_of_a_batch_of_a_billion_prints_a_bounded_line(tmp_path):
    (tmp_path / "e.psk.d").write_bytes(encode_header("ℝ[0]", 2**40, [Encoding.F64]))
    (tmp_path / "p.pipeline").write_text('stream "e.psk.d" |> shuffle(seed = 1) |> batch(B = 1000000000)')

    # The address space is bounded by the child itself, before the command runs: a preexec_fn
    # would make subprocess fork this multithreaded (JAX) process and run Python in the copy.
    limited = ("import resource, runpy, sys; "
               "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY)); "
               "sys.argv = ['pskd', *sys.argv[1:]]; runpy.run_module('pskd_jax.apps.pskd', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", limited, "pipeline", "p.pipeline", "--indices", "3"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 6 and lines[2].endswith("… (1000000000 indices)") and len(lines[2].split()) == 10


def test_the_loader_gathers_a_large_batch_in_parts(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    from pskd_jax.loader import loader as loader_module
    path = tmp_path / "d.psk.d"
    write(path, "(idx[100][2], idx[1000][])", (np.arange(200).reshape(100, 2) % 100, np.arange(100) * 3),
          durable=False)
    p = pipeline.Pipeline(str(path), seed=3, batch_size=16)
    with Reader(path) as reader:
        whole = [np.asarray(b[1]).tolist() for b in loader_module.Loader(reader, p, epochs=2)]
        monkeypatch.setattr(loader_module, "PART_ROWS", 5)
        parts = [np.asarray(b[1]).tolist() for b in loader_module.Loader(reader, p, epochs=2)]
    assert parts == whole and len(whole) == 12 and len(whole[0]) == 16
