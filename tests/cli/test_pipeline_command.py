"""``pskd pipeline`` run as a user runs it: the indices a pipeline feeds, and pipeline files that
stream outside their directory."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pskd_jax
from tests.helpers import pskd_fails as fails
from tests.helpers import pskd_ok as ok

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_pipeline_prints_the_indices_a_pipeline_feeds(tmp_path):
    data = tmp_path / "w.psk.d"
    pskd_jax.write(data, "ℝ[2]", np.zeros((10, 2)))
    text_file = tmp_path / "train.pipeline"
    text_file.write_text('stream "w.psk.d" |> shuffle(seed = 0) |> batch(B = 5) |> take(n = 1)\n')
    lines = ok("pipeline", text_file, "--epoch", "2", "--batches", "3")
    assert lines == [
        f'pipeline stream "{data}" |> shuffle(seed = 0) |> batch(B = 5) |> take(n = 1)',
        "samples  10 of type ℝ[2], 1 batches an epoch",
        "epoch 2 batch 0: 9 1 3 6 8",  # docs/pipeline.md: seed 0, epoch 2, n = 10 starts 9 1 3 6 8
    ]
    assert pskd_jax.shuffle_order(10, seed=0, epoch=2, start=0, stop=5).tolist() == [9, 1, 3, 6, 8]
    message = fails("E9010", "pipeline", 'stream "w.psk.d" |> batch(B = 0)')
    assert "TEXT:1:" in message


@pytest.mark.slow
def test_a_pipeline_file_streaming_outside_its_directory_is_refused(tmp_path):
    (tmp_path / "runs").mkdir()
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    text_file = tmp_path / "runs" / "train.pipeline"
    text_file.write_text('stream "../w.psk.d" |> batch(B = 5)\n')
    message = fails("E9010", "pipeline", text_file)
    assert str(text_file) in message and "outside" in message and "--root" in message
    lines = ok("pipeline", text_file, "--root", tmp_path, "--batches", "1")
    assert lines[-1] == "epoch 1 batch 0: 0 1 2 3 4"


MIX = 'mix(stream "a.psk.d" |> shuffle(seed = 0) : 2, stream "b.psk.d" |> shuffle(seed = 42) : 1) |> batch(B = 4)'


@pytest.mark.slow
def test_pipeline_prints_a_mixture_as_source_index_from_any_batch(tmp_path):
    pskd_jax.write(tmp_path / "a.psk.d", "ℝ[2]", np.zeros((10, 2)))
    pskd_jax.write(tmp_path / "b.psk.d", "ℝ[2]", np.zeros((1000, 2)))
    lines = ok("pipeline", MIX, "--batches", "2", "--start", "2", cwd=tmp_path)
    assert lines == [
        f"pipeline {MIX}",
        'source 0 stream "a.psk.d" |> shuffle(seed = 0): 10 samples, share 2/3',
        'source 1 stream "b.psk.d" |> shuffle(seed = 42): 1000 samples, share 1/3',
        "samples  of type ℝ[2], printed SOURCE:INDEX; batches without end (no take)",
        # docs/pipeline.md pins the first 16 positions of this mixture; batches 2 and 3 are 8 … 15
        "batch 2: 0:7 0:0 1:754 0:9",
        "batch 3: 0:1 1:810 0:3 0:9",
    ]
    far = ok("pipeline", MIX.replace("batch(B = 4)", "batch(B = 4) |> take(n = 10)"), "--start", "9", "--indices", "2",
             cwd=tmp_path)
    assert far[-1].startswith("batch 9: ") and far[-1].endswith(" … (4 samples)") and len(far) == 5
    message = fails("E9012", "pipeline", MIX + " |> take(n = 10)", "--start", "10", cwd=tmp_path)
    assert "--start 10: the stream has 10 batches" in message
    message = fails("E9012", "pipeline", MIX, "--epoch", "2", cwd=tmp_path)
    assert "no epochs of its own" in message
    pskd_jax.write(tmp_path / "b.psk.d", "ℝ[3]", np.zeros((5, 3)))
    message = fails("E9010", "pipeline", MIX, cwd=tmp_path)
    assert "TEXT:1:48: source 1" in message and "'ℝ[3]'" in message and "'ℝ[2]'" in message
    message = fails("E9010", "pipeline", MIX.replace(": 2", ": 0"), cwd=tmp_path)
    assert "TEXT:1:45: weight must be a positive number" in message


@pytest.mark.slow
def test_pipeline_starts_anywhere_and_cuts_a_corpus_with_seq(tmp_path):
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    lines = ok("pipeline", 'stream "w.psk.d" |> batch(B = 2)', "--start", "3", "--batches", "9", cwd=tmp_path)
    assert lines[2:] == ["epoch 1 batch 3: 6 7", "epoch 1 batch 4: 8 9"]
    manifest = tmp_path / "c" / "shards.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"format": "pskd-corpus", "version": 1, "tokenizer": {"kind": "bytes"},
                                    "vocab_size": 257, "boundary": 256,
                                    "shards": [{"path": "s.psk.d", "tokens": 100, "documents": 1,
                                                "sha256": "0" * 64}]}))
    text = 'stream "c/shards.json" |> batch(B = 3)'
    message = fails("E9012", "pipeline", text, cwd=tmp_path)
    assert "is a corpus" in message and "--seq" in message
    lines = ok("pipeline", text, "--seq", "8", "--stride", "4", "--start", "6", cwd=tmp_path)
    assert lines[1:] == ["samples  23 of type (idx[257][seq: 8], idx[257][seq: 8]), 7 batches an epoch "
                         "(windows of 8 tokens every 4 tokens)", "epoch 1 batch 6: 18 19 20"]


@pytest.mark.slow
def test_what_pipeline_refuses_prints_nothing(tmp_path):
    # An epoch the pipeline refuses, or a start past the end of a mixture's positions (2**63 - 1),
    # is refused before the header lines: no partial output, whatever batch would fail.
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    shuffled = 'stream "w.psk.d" |> shuffle(seed = 1) |> batch(B = 2)'
    for epoch in ("0", "-5", str(2**64)):
        fails("E9004", "pipeline", shuffled, "--epoch", epoch, cwd=tmp_path)
    mix = 'mix(stream "w.psk.d" : 1, stream "w.psk.d" |> shuffle(seed = 1) : 1) |> batch(B = 8)'
    last = (2**63 - 1) // 8 - 1
    message = fails("E9012", "pipeline", mix, "--start", str(last + 1), cwd=tmp_path)
    assert f"the stream has {last + 1} batches" in message
    for text in (mix, mix + f" |> take(n = {10**30})"):
        lines = ok("pipeline", text, "--start", str(last - 1), "--batches", "5", cwd=tmp_path)
        assert [line.split(":")[0] for line in lines[-2:]] == [f"batch {last - 1}", f"batch {last}"]


@pytest.mark.slow
def test_seq_and_stride_without_a_corpus_are_refused_not_ignored(tmp_path):
    # --seq and --stride cut a corpus's windows; over .psk.d files alone they went unheeded
    # (--seq -1 printed the batches), as train_lm refuses them.
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    stream = 'stream "w.psk.d" |> batch(B = 2)'
    mix = 'mix(stream "w.psk.d" : 1, stream "w.psk.d" |> shuffle(seed = 1) : 2) |> batch(B = 2)'
    for text in (stream, mix):
        for flags in (["--seq", "8"], ["--seq", "-1"], ["--stride", "0"], ["--seq", "8", "--stride", "4"]):
            message = fails("E9012", "pipeline", text, *flags, cwd=tmp_path)
            assert f"{flags[0]} cuts a corpus's windows" in message and "w.psk.d" in message, message


@pytest.mark.slow
def test_a_stream_not_there_is_the_loader_s_e9010_naming_its_place(tmp_path):
    # pskd pipeline said E9002 'cannot read' (a directory: 'not a regular file') where the Loader
    # and train_lm say E9010 naming the stream, a mix's source by its line and column.
    pskd_jax.write(tmp_path / "w.psk.d", "ℝ[2]", np.zeros((10, 2)))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "shards.json").write_text("{}")
    message = fails("E9010", "pipeline", 'stream "nowhere.psk.d" |> batch(B = 2)', cwd=tmp_path)
    assert "the stream 'nowhere.psk.d' does not exist" in message
    message = fails("E9010", "pipeline", 'stream "c" |> batch(B = 2)', "--seq", "4", cwd=tmp_path)
    assert "the stream 'c' is a directory" in message and 'stream its manifest "c/shards.json"' in message
    mix = 'mix(stream "w.psk.d" : 1,\n    stream "nowhere.psk.d" : 1) |> batch(B = 2)'
    message = fails("E9010", "pipeline", mix, cwd=tmp_path)
    assert "TEXT:2:5: source 1: the stream 'nowhere.psk.d' does not exist" in message


def _broken(data: dict, case: str) -> None:
    """One defect written into a good manifest's JSON object (its two shards s0 and s1)."""
    shards = data["shards"]
    if case == "tokenizer kind":
        data["tokenizer"] = {"kind": "words"}
    elif case == "vocab_size not an integer":
        data["vocab_size"] = 257.0
    elif case == "boundary out of range":
        data["boundary"] = 300
    elif case == "duplicate shard":
        shards[1] = dict(shards[0], path="./" + shards[0]["path"])
    elif case == "negative tokens":
        shards[0]["tokens"] = -1
    elif case == "missing sha256":
        del shards[1]["sha256"]
    elif case == "missing documents":
        del shards[0]["documents"]
    elif case == "documents over tokens":
        shards[0]["documents"] = shards[0]["tokens"] + 1
    elif case == "path escapes":
        shards[1]["path"] = "../elsewhere.psk.d"
    elif case == "path absolute":
        shards[1]["path"] = "/tmp/s1.psk.d"
    elif case == "shard not an object":
        shards[1] = "s1.psk.d"
    elif case == "hf record":
        data["tokenizer"] = {"kind": "hf", "path": "t.json", "sha256": "0" * 63, "vocab_size": 256,
                             "boundary_token": None, "boundary": 256}
    elif case == "chars vocab twice":
        data["tokenizer"] = {"kind": "chars", "vocab": ["a", "a"]}
    elif case == "build key":
        data["build"] = {"colour": "blue"}
    elif case == "in progress":
        data["in_progress"] = {"planned_shards": 1}
    else:
        raise AssertionError(case)


BROKEN_MANIFESTS = ["tokenizer kind", "vocab_size not an integer", "boundary out of range", "duplicate shard",
                    "negative tokens", "missing sha256", "missing documents", "documents over tokens",
                    "path escapes", "path absolute", "shard not an object", "hf record", "chars vocab twice",
                    "build key", "in progress"]


@pytest.mark.slow
@pytest.mark.parametrize("case", BROKEN_MANIFESTS)
def test_a_broken_manifest_is_refused_in_the_same_words_by_pipeline_the_loader_and_the_windows(tmp_path, case):
    # pskd pipeline counted a corpus's windows with checks of its own: a wrong tokenizer, boundary,
    # a shard listed twice, more documents than tokens or a path leaving the directory passed, and
    # a wrong vocab_size or count was worded otherwise than by the Loader and CorpusWindows.
    from pskd_jax import corpus
    from pskd_jax.errors import PskdError
    from tests.corpus.helpers import write_corpus

    write_corpus(tmp_path / "c", [np.arange(40) % 256, np.arange(30) % 256])
    manifest = tmp_path / "c" / "shards.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    for shard in data["shards"]:
        shard["documents"] = 1
    _broken(data, case)
    manifest.write_text(json.dumps(data), encoding="utf-8")
    text = f'stream "{manifest}" |> batch(B = 2)'
    heard = []
    for entry in (lambda: pskd_jax.Loader(text, seq=4), lambda: corpus.CorpusWindows(manifest, seq=4)):
        with pytest.raises(PskdError) as raised:
            entry()
        heard.append(f"{raised.value.code}: {raised.value.message}")
    line = fails("E9016", "pipeline", text, "--seq", "4")
    heard.append(line.strip().removeprefix("pskd: "))
    assert heard[0].startswith(f"E9016: {manifest}: "), heard
    assert heard[1:] == heard[:1] * 2, heard
