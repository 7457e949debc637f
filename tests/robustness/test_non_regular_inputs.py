"""Inputs that are not regular files (a FIFO, a directory, a device) are refused at once with E9002
naming them: nothing waits on a FIFO that has no writer, nothing reads /dev/zero without end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from pskd_jax import checkpoint, corpus, data, pipeline
from pskd_jax._os.digests import file_digest
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.checkpoint import safetensors as convert
from pskd_jax.corpus import BuildOptions
from pskd_jax.corpus import build as corpus_build
from pskd_jax.errors import PskdError
from pskd_jax.format import Reader, write


@pytest.fixture
def alarm():
    """Fails a test that blocks (on a FIFO) instead of hanging the suite."""
    def expired(signum, frame):
        raise TimeoutError("blocked on a non-regular file")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(120)  # a guard against a hang: these reads fail at once, whatever the load
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def files(tmp_path):
    write(tmp_path / "a.psk.d", "ℝ[2]", np.arange(4.0).reshape(2, 2), durable=False)
    checkpoint.save(tmp_path / "ck.psk.d", {"w": np.ones(3)}, SaveOptions(name="M", durable=False))
    (tmp_path / "v.json").write_text('["a", "b"]')
    (tmp_path / "t.txt").write_text("ab")
    (tmp_path / "good.jsonl").write_text('{"text": "hi"}\n')
    return tmp_path


def fifo(tmp_path, name: str) -> str:
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


def refused(call, *args, **kwargs) -> PskdError:
    with pytest.raises(PskdError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == "E9002", caught.value
    return caught.value


CALLS = {
    "reader": lambda d, p: Reader(p),
    "reader-pread": lambda d, p: Reader(p, access="pread"),
    "info": lambda d, p: data.info_lines(p),
    "export": lambda d, p: data.export_json(p, str(d / "o.json")),
    "diff-a": lambda d, p: data.diff(p, str(d / "a.psk.d")),
    "diff-b": lambda d, p: data.diff(str(d / "a.psk.d"), p),
    "vocab": lambda d, p: data.read_vocab(p),
    "chars": lambda d, p: data.char_vocab_file(p),
    "encode": lambda d, p: data.encode_file(p, ["a", "b"], str(d / "o.tok")),
    "decode": lambda d, p: data.decode_file(p, ["a", "b"], str(d / "o.txt")),
    "tokens": lambda d, p: data.read_tokens(p),
    "lm-windows": lambda d, p: data.lm_windows_file(p, str(d / "o.psk.d"), vocab=4, seq=2),
    "pack": lambda d, p: data.pack_file(p, "ℝ[]", str(d / "o.psk.d")),
    "pipeline-file": lambda d, p: pipeline.load_pipeline(p),
    "layout-file": lambda d, p: checkpoint.read_layout_file(p),
    "restore-layout": lambda d, p: checkpoint.restore(str(d / "ck.psk.d"), layout=p, as_numpy=True),
    "restore": lambda d, p: checkpoint.restore(p, as_numpy=True),
    "manifest": lambda d, p: corpus.read_manifest(p),
    "corpus-jsonl": lambda d, p: corpus_build.build_corpus([p], str(d / "corpus"), BuildOptions(durable=False)),
    "digest": lambda d, p: file_digest(p),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_fifo_is_refused_at_once(files, alarm, name):
    suffix = {"pipeline-file": ".pipeline", "corpus-jsonl": ".jsonl", "manifest": ".json"}.get(name, ".psk.d")
    path = fifo(files, "in" + suffix)
    error = refused(CALLS[name], files, path)
    assert path in error.message or os.path.basename(path) in error.message
    assert not os.path.exists(files / "o.json") and not os.path.exists(files / "o.psk.d")


def test_safetensors_fifo_is_refused_at_once(files, alarm):
    pytest.importorskip("safetensors")
    refused(convert.safetensors_to_pskd, fifo(files, "in.safetensors"), str(files / "o.psk.d"))
    assert not os.path.exists(files / "o.psk.d")


def test_a_fifo_as_the_layout_sidecar_is_refused_at_once(files, alarm):
    os.replace(files / "ck.layout.json", files / "kept.json")
    fifo(files, "ck.layout.json")
    refused(checkpoint.find_layout_file, str(files / "ck.psk.d"))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused(files, alarm, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    refused(Reader, device)
    refused(data.read_tokens, device)
    refused(data.read_vocab, device)


def test_a_directory_is_refused(files, alarm):
    refused(Reader, str(files))
    refused(data.read_vocab, str(files))
    refused(pipeline.load_pipeline, str(files))


def test_a_pipeline_that_streams_a_fifo_is_refused(files, alarm):
    fifo(files, "in.psk.d")
    (files / "p.pipeline").write_text('stream "in.psk.d" |> batch(B = 1)')
    p = pipeline.load_pipeline(str(files / "p.pipeline"))
    refused(Reader, p.path)


def test_a_fifo_as_a_corpus_shard(files, alarm):
    """Reading: verify and the windows name the shard (E9017); building: a FIFO at a shard's name is
    refused (E9012) and left in place, never written into."""
    built = corpus_build.build_corpus([str(files / "good.jsonl")], str(files / "c"), BuildOptions(durable=False))
    shard = built.manifest.shard_path(0)
    os.unlink(shard)
    os.mkfifo(shard)
    for call in (lambda: corpus.verify_corpus(built.manifest.path, workers=1),
                 lambda: corpus.CorpusWindows(built.manifest.path, seq=1)):
        with pytest.raises(PskdError) as caught:
            call()
        assert caught.value.code == "E9017" and "FIFO" in caught.value.message
    os.unlink(built.manifest.path)
    with pytest.raises(PskdError) as caught:
        corpus_build.build_corpus([str(files / "good.jsonl")], str(files / "c"), BuildOptions(durable=False))
    assert caught.value.code == "E9012"
    assert not os.path.isfile(shard) and os.path.exists(shard)


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_commands_refuse_a_fifo_at_once(files):
    fifo(files, "in.psk.d")
    fifo(files, "in.jsonl")
    fifo(files, "in.pipeline")
    commands = [["info", "in.psk.d"], ["export", "in.psk.d", "-o", "o.json"], ["diff", "in.psk.d", "a.psk.d"],
                ["pack", "in.jsonl", "--type", "ℝ[]", "-o", "o.psk.d"], ["pipeline", "in.pipeline"],
                ["encode", "t.txt", "--vocab", "in.jsonl", "-o", "o.tok"], ["corpus", "build", "in.jsonl", "-o", "c"],
                ["convert", "in.psk.d", "-o", "o.safetensors"], ["info", "a.psk.d", "--layout", "in.jsonl"]]
    for command in commands:
        run = subprocess.run([sys.executable, "-m", "pskd_jax.apps.pskd", *command], cwd=files, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 1 and run.stderr.startswith("pskd: E9002: "), (command, run.stderr)
        assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1
    assert not any(name.startswith("o.") for name in os.listdir(files))
