"""The training app run as a user runs it: loss printed, checkpoints saved, resumed exactly, on a
windows file and on a corpus."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import pskd_jax
from pskd_jax import corpus
from tests.helpers import ENV, ROOT, TIMEOUT_S, assert_code, documents, pskd, run_python, train_lm
from tests.helpers import pskd_ok as ok

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


@pytest.fixture
def windows(tmp_path) -> pathlib.Path:
    text = ("the quick brown fox jumps over the lazy dog. " * 40).encode()
    tokens = np.frombuffer(text, np.uint8) - 32
    path = tmp_path / "w.psk.d"
    starts = np.arange(0, len(tokens) - 17, 16)
    inputs = tokens[starts[:, None] + np.arange(16)]
    pskd_jax.write(path, "(idx[96][seq: 16], idx[96][seq: 16])", (inputs, tokens[starts[:, None] + np.arange(1, 17)]))
    return path


def train(windows: pathlib.Path, checkpoints: pathlib.Path, *extra: str) -> list[str]:
    pipeline = f'stream "{windows}" |> shuffle(seed = 4) |> batch(B = 8)'
    result = train_lm(f"--pipeline={pipeline}", "--width=16", "--layers=1", "--heads=2", "--log_every=2",
                      f"--checkpoint_dir={checkpoints}", *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def losses(lines: list[str]) -> dict[int, str]:
    """The logged losses by step, at the steps every run logs (multiples of --log_every=2)."""
    logged = {int(line.split()[1]): line.split()[3] for line in lines if line.startswith("step ")}
    return {step: loss for step, loss in logged.items() if step % 2 == 0}


def test_a_resumed_run_sees_the_same_batches_and_ends_bit_for_bit_equal(windows, tmp_path):
    whole = train(windows, tmp_path / "whole", "--steps=8", "--save_every=4")
    first = train(windows, tmp_path / "split", "--steps=4", "--save_every=4")
    rest = train(windows, tmp_path / "split", "--steps=8", "--save_every=4", "--resume")
    assert any(line.startswith("train: resumed at step 4") for line in rest)
    assert losses(whole) == {**losses(first), **losses(rest)}
    assert len(losses(whole)) == 4
    a = tmp_path / "whole" / sorted(os.listdir(tmp_path / "whole"))[0]
    ends = [pskd_jax.CheckpointManager(tmp_path / d).path() for d in ("whole", "split")]
    assert pathlib.Path(ends[0]).read_bytes() == pathlib.Path(ends[1]).read_bytes(), a


def test_a_file_of_the_wrong_type_is_refused_naming_both_types(tmp_path):
    path = tmp_path / "r.psk.d"
    pskd_jax.write(path, "ℝ[3]", np.ones((10, 3)))
    result = train_lm(f'--pipeline=stream "{path}" |> batch(B = 2)', "--steps=1")
    assert result.returncode == 1
    assert "E9010" in result.stderr and "ℝ[3]" in result.stderr and "Traceback" not in result.stderr


def test_train_lm_on_a_corpus(tmp_path):
    documents(tmp_path / "a.jsonl", 80, 1)
    documents(tmp_path / "b.jsonl", 60, 2)
    ok("corpus", "build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-o", tmp_path / "c")
    pipeline = f'stream "{tmp_path / "c" / "shards.json"}" |> shuffle(seed = 1) |> batch(B = 4)'
    run = lambda *extra: train_lm(f"--pipeline={pipeline}", "--width=16", "--layers=1", "--heads=2",  # noqa: E731
                                  "--steps=3", "--log_every=1", *extra)
    result = run("--seq=16", "--stride=8", "--verify_corpus")
    assert result.returncode == 0, result.stderr[-3000:]
    windows = corpus.CorpusWindows(tmp_path / "c" / "shards.json", seq=16, stride=8)
    assert f"train: {len(windows)} windows of 16 tokens over a vocabulary of 257 tokens;" in result.stdout
    assert [line.split()[:2] for line in result.stdout.splitlines() if line.startswith("step ")] == \
        [["step", "1"], ["step", "2"], ["step", "3"]]
    result = run()
    assert result.returncode == 1 and "E9012: " in result.stderr and "--seq T" in result.stderr


# --- errors: one line of the toolkit's, whenever they happen -------------------------------------------


def test_an_error_of_the_data_mid_run_is_one_line_of_its_code_without_a_traceback(windows):
    data = bytearray(windows.read_bytes())
    data[-1] = 200  # the last sample's last target (the file ends with the values): above its bound idx[96]
    windows.write_bytes(bytes(data))
    result = train_lm(f'--pipeline=stream "{windows}" |> batch(B = 1)', "--steps=200", "--width=16", "--layers=1",
                      "--heads=2")
    assert result.returncode == 1, result.stderr[-3000:]
    # (sample 111 lies beyond the 96 batches of 1 the loader holds in flight: training has started)
    assert "step     1  loss " in result.stdout
    assert result.stderr == f"pskd: E9004: {windows}: sample 111, leaf [1]: stored value 200 is not below its bound " \
        "idx[96]\n"


def test_ctrl_c_mid_run_is_one_line_and_exit_status_130(windows, tmp_path):
    """SIGINT once training has printed its first step: ``pskd: interrupted`` on stderr, no
    traceback, exit status 130 (as ``pskd`` answers one)."""
    pipeline = f'stream "{windows}" |> batch(B = 1)'
    command = [sys.executable, "-m", "pskd_jax.apps.train_lm", f"--pipeline={pipeline}", "--steps=1000000",
               "--width=16", "--layers=1", "--heads=2", "--log_every=1", f"--checkpoint_dir={tmp_path / 'c'}",
               "--save_every=5"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          env=dict(ENV, JAX_PLATFORMS="cpu")) as process:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            if line.startswith("step     1 "):
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 130, stderr[-3000:]
    assert stderr.endswith("pskd: interrupted\n") and "Traceback" not in stderr, stderr[-3000:]


def test_ctrl_c_that_a_library_turns_into_another_error_is_still_an_interrupt(windows):
    """tqdm, interrupted inside its lock, raises RuntimeError ('cannot release un-acquired lock')
    in place of the KeyboardInterrupt: still one line ``pskd: interrupted``, exit status 130 (the
    interrupt comes inside the first step's line, by hook: no timing)."""
    result = run_python("""
        import os, signal, sys, time
        import tqdm
        from pskd_jax.apps import train_lm

        def interrupted_inside(*args, **kwargs):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(60)
            except KeyboardInterrupt:
                raise RuntimeError("cannot release un-acquired lock") from None

        tqdm.tqdm.write = interrupted_inside
        sys.argv = ["train_lm", *sys.argv[1:]]
        train_lm.run()
    """, f'--pipeline=stream "{windows}" |> batch(B = 1)', "--steps=5", "--width=16", "--layers=1", "--heads=2",
        env=dict(ENV, JAX_PLATFORMS="cpu"))
    assert (result.returncode, result.stderr[-40:]) == (130, "pskd: interrupted\n"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_an_error_of_the_setup_is_one_line_of_its_code_too(tmp_path):
    missing = tmp_path / "none.psk.d"
    result = train_lm(f'--pipeline=stream "{missing}" |> batch(B = 2)', "--steps=1")
    assert result.returncode == 1 and result.stdout == ""
    assert_code(result, "E9010", f"the stream '{missing}' does not exist")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def loader_refusal(text: str, **options) -> str:
    """What the Loader says of ``text`` read as train_lm reads its --pipeline, as train_lm prints it."""
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline import parse_pipeline

    try:
        Loader(parse_pipeline(text, source="--pipeline"), **options).close()
    except pskd_jax.PskdError as e:
        return f"pskd: {e}\n"
    raise AssertionError(f"the Loader opened {text}")


def test_a_missing_stream_of_a_mix_is_named_at_its_place_as_the_loader_names_it(windows, tmp_path):
    """train_lm's E9010 for a mixture's source that is not there names its line, column and index,
    in the Loader's words (it named the path alone)."""
    for missing in (tmp_path / "none.psk.d", tmp_path):  # (nothing there; a directory)
        text = f'mix(stream "{windows}" : 1,\n    stream "{missing}" : 1) |> batch(B = 2)'
        result = train_lm(f"--pipeline={text}", "--steps=1")
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == loader_refusal(text)
        assert_code(result, "E9010", f"--pipeline:2:5: source 1: the stream '{missing}' ")



# What each of a stream's readers says of one that is no corpus manifest and no .psk.d file (the
# file's bytes; None: a directory): the Loader, `pskd pipeline` and train_lm decide what a stream is
# with one function (pipeline/streams.py's stream_manifest), so they give the same code and words.
BAD_STREAMS = {
    "JSON, no manifest": (b'{"foo": 1}', "E9016", "format is null, expected 'pskd-corpus'"),
    "JSON cut short": (b'{"format": "pskd-corpus"', "E9016", "not a JSON manifest ("),
    "a JSON list": (b"  [1, 2]", "E9016", "a corpus manifest is a JSON object, got a list of 2 entries"),
    "another version": (b'{"format": "pskd-corpus", "version": 2}', "E9016", "version 2; this reader reads"),
    "random bytes": (bytes(range(7, 250, 3)), "E9002", "not a .psk.d file (magic"),
    "empty": (b"", "E9002", "not a .psk.d file (0 bytes, no magic)"),
    "a directory": (None, "E9010", "is a directory, not a .psk.d file or a corpus manifest"),
}


@pytest.mark.parametrize("kind", sorted(BAD_STREAMS))
def test_a_stream_that_is_no_corpus_nor_psk_d_file_is_refused_alike_by_every_reader(tmp_path, kind):
    """A JSON file that is not a corpus manifest was E9016 in the Loader (E9012 "is a corpus"
    without seq) but E9002 "not a .psk.d file (magic b'{"fo'…)" in train_lm, which decided with a
    second function; random bytes with --seq were E9012 "is a .psk.d file" in train_lm only."""
    data, code, words = BAD_STREAMS[kind]
    path = tmp_path / "stream.json"
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)
    text = f'stream "{path}" |> batch(B = 2)'
    expected = loader_refusal(text, seq=4)
    assert expected.startswith(f"pskd: {code}: ") and words in expected and str(path) in expected, expected
    if data is not None and data.lstrip()[:1] in (b"{", b"["):  # (a JSON file: no seq, the same E9016)
        assert loader_refusal(text) == expected
    shown = pskd("pipeline", text, "--seq", "4")
    assert (shown.returncode, shown.stdout, shown.stderr) == (1, "", expected)
    result = train_lm(f"--pipeline={text}", "--steps=1", "--seq=4", f"--checkpoint_dir={tmp_path / 'ckpt'}")
    assert (result.returncode, result.stdout, result.stderr) == (1, "", expected)
    assert not (tmp_path / "ckpt").exists()

# --- flags no run can use: refused before anything is done ---------------------------------------------


@pytest.mark.parametrize(("flag", "message"), [
    ("--save_every=0", "--save_every=0: expected an integer >= 1"),
    ("--log_every=0", "--log_every=0: expected an integer >= 1"),
    ("--steps=-1", "--steps=-1: expected an integer >= 1"),
    ("--keep=0", "--keep=0: expected an integer >= 1"),
    ("--width=-16", "--width=-16: expected an integer >= 1"),
    ("--layers=0", "--layers=0: expected an integer >= 1"),
    ("--heads=0", "--heads=0: expected an integer >= 1"),
    ("--seq=-3", "--seq=-3: expected an integer >= 1"),
    ("--stride=0", "--stride=0: expected an integer >= 1"),
    ("--seed=-1", "--seed=-1: expected an integer >= 0"),
    ("--heads=3", "--heads=3: does not divide --width=16 (each head takes width/heads of the features)"),
    ("--learning_rate=nan", "--learning_rate=nan: expected a finite number > 0"),
    ("--learning_rate=inf", "--learning_rate=inf: expected a finite number > 0"),
    ("--learning_rate=-0.001", "--learning_rate=-0.001: expected a finite number > 0"),
    ("--learning_rate=0", "--learning_rate=0.0: expected a finite number > 0"),
])
def test_a_flag_no_run_can_use_is_refused_naming_it_before_anything_is_done(windows, tmp_path, flag, message):
    checkpoints = tmp_path / "ckpt"
    result = train_lm(f'--pipeline=stream "{windows}" |> batch(B = 4)', "--steps=2", "--width=16", "--layers=1",
                      "--heads=2", f"--checkpoint_dir={checkpoints}", flag)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"pskd: E9012: {message}\n")
    assert not checkpoints.exists()  # (the checkpoint directory is made once the flags are known good)


@pytest.mark.parametrize("flag", ["--seq=8", "--stride=4"])
def test_seq_and_stride_with_a_windows_file_are_refused_not_ignored(windows, tmp_path, flag):
    """An lm-windows file's windows are cut already: --seq or --stride would go unheeded."""
    result = train_lm(f'--pipeline=stream "{windows}" |> batch(B = 4)', "--steps=2", "--width=16", "--layers=1",
                      "--heads=2", flag)
    name = flag.split("=")[0]
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"pskd: E9012: {name} cuts a corpus's windows; {windows} is a .psk.d file of windows " \
        "cut already\n"


# --- --resume from a checkpoint whose extra JSON is not train_lm's ---------------------------------------


def resume_refused(windows: pathlib.Path, checkpoints: pathlib.Path, code: str, *fragments: str) -> None:
    """A --resume from ``checkpoints`` fails with one line ``pskd: CODE: …`` holding ``fragments``,
    and leaves the directory's checkpoint files as they were (its index is the manager's to rebuild)."""
    saved = lambda: {p.name: p.read_bytes() for p in checkpoints.iterdir() if p.name.startswith("step-")}  # noqa: E731
    before = saved()
    result = train_lm(f'--pipeline=stream "{windows}" |> batch(B = 8)', "--width=16", "--layers=1", "--heads=2",
                      "--steps=9", f"--checkpoint_dir={checkpoints}", "--resume")
    assert result.returncode == 1 and result.stdout == "", result.stderr[-3000:]
    assert_code(result, code, *fragments)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert saved() == before


def test_resume_after_the_index_was_lost_names_the_checkpoint_and_the_missing_extra(windows, tmp_path):
    train(windows, tmp_path / "ckpt", "--steps=2", "--save_every=2")
    (tmp_path / "ckpt" / "checkpoints.json").unlink()  # (the index is rebuilt from the files, without the extras)
    resume_refused(windows, tmp_path / "ckpt", "E9014", f"{tmp_path / 'ckpt' / 'step-00000002.psk.d'}: cannot "
                   "resume from it: it keeps no extra JSON")


@pytest.mark.parametrize(("extra", "wrong"), [
    ({"step": 7}, "its extra JSON {'step': 7} has no 'loader'"),
    ("run 7", "its extra JSON is 'run 7', not an object"),
    ({"step": 7, "loader": {"epoch": 1, "batch": 0}, "rng": 3}, "its extra JSON holds 'rng', which train_lm does not"),
    ({"step": 5, "loader": {"epoch": 1, "batch": 0}}, "its extra JSON's step 5 is not the checkpoint's step 7"),
    ({"step": True, "loader": {"epoch": 1, "batch": 0}}, "its extra JSON's step True is not the checkpoint's step 7"),
    ({"step": 7, "loader": {"epoch": 0, "batch": 0}}, "its extra JSON's loader: iterator state epoch must be an "
     "integer >= 1, got 0"),
])
def test_resume_from_another_programs_checkpoint_names_it_and_what_is_wrong(windows, tmp_path, extra, wrong):
    checkpoints = tmp_path / "ckpt"
    with pskd_jax.CheckpointManager(checkpoints) as manager:
        manager.save(7, {"w": np.arange(3.0)}, extra=extra)
    resume_refused(windows, checkpoints, "E9014", f"{checkpoints / 'step-00000007.psk.d'}: cannot resume from it: "
                   f"{wrong}")
