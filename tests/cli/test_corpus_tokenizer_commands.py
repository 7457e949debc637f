"""``pskd corpus build --tokenizer tokenizer.json``, ``--runner beam``, ``corpus verify --tokenizer``,
``pskd encode``/``decode --tokenizer`` and ``train_lm --tokenizer``, run as a user runs them."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")

from tests.corpus.bpe import documents, library_ids, repository_texts, train_bpe, write_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def pskd(*args, cwd=None, blocked: str | None = None) -> subprocess.CompletedProcess:
    """``pskd ARGS``; ``blocked`` names a package whose import then fails, as if not installed."""
    if blocked is None:
        command = [sys.executable, "-m", "pskd_jax.apps.pskd"]
    else:
        command = [sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None; "
                   "sys.argv[0] = 'pskd'; from pskd_jax.apps.pskd import run; run()"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, cwd=cwd or ROOT, env=ENV,
                          timeout=300)


def ok(*args, **kwargs) -> list[str]:
    result = pskd(*args, **kwargs)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout.splitlines()


def fails(code: str, *args, **kwargs) -> str:
    result = pskd(*args, **kwargs)
    assert result.returncode == 1 and result.stdout == "", (result.stdout, result.stderr)
    assert result.stderr.startswith(f"pskd: {code}: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    docs = documents(repository_texts())
    inputs = [write_jsonl(d / f"part-{i}.jsonl", docs[i::3]) for i in range(3)]
    return d, docs, inputs, train_bpe(d / "tokenizer.json"), train_bpe(d / "other.json", vocab_size=500)


def test_build_verify_info_with_a_tokenizer_json(setup, tmp_path):
    d, docs, inputs, tok, other = setup
    out = ok("corpus", "build", *inputs, "-o", tmp_path / "c", "--tokenizer", tok, "--workers", "2")
    assert "a vocabulary of 800 tokens with boundary 0" in out[0]
    manifest = json.loads((tmp_path / "c" / "shards.json").read_text())
    assert manifest["tokenizer"]["kind"] == "hf" and manifest["tokenizer"]["boundary_token"] == "<|endoftext|>"
    assert ok("corpus", "verify", tmp_path / "c", "--tokenizer", tok)[0].startswith("pskd: ok ")
    error = fails("E9016", "corpus", "verify", tmp_path / "c", "--tokenizer", other)
    assert manifest["tokenizer"]["sha256"] in error and "built with another tokenizer" in error
    assert any("tokenizer.json" in line for line in ok("corpus", "info", tmp_path / "c"))
    named = ok("corpus", "build", inputs[0], "-o", tmp_path / "n", "--tokenizer", tok, "--boundary-token", "")
    assert "a vocabulary of 801 tokens with boundary 800" in named[0]


def test_usage_errors(setup, tmp_path):
    d, docs, inputs, tok, other = setup
    fails("E9012", "corpus", "build", inputs[0], "-o", tmp_path / "a", "--boundary-token", "</s>")
    fails("E9012", "corpus", "build", inputs[0], "-o", tmp_path / "b", "--beam_options=--runner=DirectRunner")
    fails("E9011", "corpus", "build", inputs[0], "-o", tmp_path / "c", "--tokenizer", tok, "--boundary-token", "<nope>")
    fails("E9011", "corpus", "build", inputs[0], "-o", tmp_path / "d", "--tokenizer", inputs[0])
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_without_the_extras_it_is_e9012_naming_them(setup, tmp_path):
    d, docs, inputs, tok, other = setup
    error = fails("E9012", "corpus", "build", inputs[0], "-o", tmp_path / "c", "--tokenizer", tok,
                  blocked="tokenizers")
    assert "pip install 'pskd_jax[tokenizers]'" in error
    error = fails("E9012", "corpus", "build", inputs[0], "-o", tmp_path / "c", "--runner", "beam",
                  blocked="apache_beam")
    assert "pip install 'pskd_jax[beam]'" in error
    assert not (tmp_path / "c").exists()


def test_beam_runner_gives_the_local_bytes_and_prints_no_log(setup, tmp_path):
    pytest.importorskip("apache_beam")
    d, docs, inputs, tok, other = setup
    ok("corpus", "build", *inputs, "-o", tmp_path / "local", "--tokenizer", tok, "--workers", "2")
    out = ok("corpus", "build", *inputs, "-o", tmp_path / "beam", "--tokenizer", tok, "--runner", "beam",
             "--workers", "2")
    assert out[-1].endswith("with 2 workers on Apache Beam)")
    names = sorted(os.listdir(tmp_path / "local"))
    assert names == sorted(os.listdir(tmp_path / "beam"))
    for name in names:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "beam" / name).read_bytes(), name
    # A runner the options name (its value a word of its own): its workers are its own, not --workers'.
    out = ok("corpus", "build", *inputs, "-o", tmp_path / "named", "--tokenizer", tok, "--runner", "beam",
             "--workers", "2", "--beam_options", "--runner=FnApiRunner")
    assert out[-1].endswith(" MB/s on Apache Beam's FnApiRunner)")


def test_beam_runner_reports_bad_input_in_one_line(setup, tmp_path):
    pytest.importorskip("apache_beam")
    d, docs, inputs, tok, other = setup
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    error = fails("E9015", "corpus", "build", inputs[0], bad, "-o", tmp_path / "c", "--runner", "beam",
                  "--beam_options", "--direct_num_workers=2 --direct_running_mode=multi_processing")
    assert "bad.jsonl:2: the 'text' value is 3" in error
    assert not (tmp_path / "c" / "shards.json").exists()


def test_encode_and_decode_with_a_tokenizer_json(setup, tmp_path):
    d, docs, inputs, tok, other = setup
    text = docs[3] + "\ndonnées 🙂 <|endoftext|>\n"
    source = tmp_path / "t.txt"
    source.write_text(text, encoding="utf-8")
    ok("encode", source, "--tokenizer", tok, "-o", tmp_path / "t.tok")
    ids = [int(x) for x in (tmp_path / "t.tok").read_text().split()]
    assert ids == library_ids(tok, [text])[0]
    ok("decode", tmp_path / "t.tok", "--tokenizer", tok, "-o", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text(encoding="utf-8") == text
    (tmp_path / "big.tok").write_text("1 2 800\n")
    fails("E9004", "decode", tmp_path / "big.tok", "--tokenizer", tok, "-o", tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()
    both = pskd("encode", source, "--tokenizer", tok, "--vocab", tok, "-o", tmp_path / "y.tok")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_training_refuses_a_corpus_of_another_tokenizer(setup, tmp_path):
    d, docs, inputs, tok, other = setup
    ok("corpus", "build", inputs[0], "-o", tmp_path / "c", "--tokenizer", tok)
    pipeline = f'stream "{tmp_path / "c" / "shards.json"}" |> batch(B = 2)'
    result = subprocess.run([sys.executable, "-m", "pskd_jax.apps.train_lm", "--pipeline", pipeline, "--seq", "8",
                             "--steps", "1", "--tokenizer", str(other)], capture_output=True, text=True, cwd=ROOT,
                            env=ENV, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "E9016" in result.stderr and "built with another tokenizer" in result.stderr
