"""``pskd corpus`` as a user runs it; a build killed with SIGKILL and run again; a reader beside a
writer in another process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from pskd_jax import corpus
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import PskdError
from tests.helpers import ENV, ROOT, SCRIPT, documents, pskd, wait_until
from tests.helpers import pskd_fails as fails
from tests.helpers import pskd_ok as ok


@pytest.mark.slow
@pytest.mark.subprocess
def test_build_verify_info(tmp_path):
    (tmp_path / "in").mkdir()
    documents(tmp_path / "in" / "a.jsonl", 50, 1)
    documents(tmp_path / "in" / "b.jsonl", 20, 2)
    (tmp_path / "in" / "c.txt").write_text("one document\n", encoding="utf-8")
    lines = ok("corpus", "build", "in", "-o", "out", "--workers", "2", cwd=tmp_path)
    m = corpus.read_manifest(tmp_path / "out" / "shards.json")
    assert lines[0] == (f"pskd: wrote out/shards.json (3 shards, {m.tokens} tokens, {m.documents} documents, "
                        "a vocabulary of 257 tokens with boundary 256)")
    assert lines[1].startswith("pskd: 3 shards from ") and "2 workers" in lines[1]
    # The summary names the workers that ran: no more than the shards built.
    assert "with 3 workers)" in ok("corpus", "build", "in", "-o", "out8", "--workers", "8", cwd=tmp_path)[1]
    assert [s.source["path"] for s in m.shards] == ["in/a.jsonl", "in/b.jsonl", "in/c.txt"]
    lines = ok("corpus", "verify", "out/shards.json", "--workers", "2", cwd=tmp_path)
    assert lines[0].startswith(f"pskd: ok out/shards.json: 3 shards, {m.tokens} tokens; every sha256")
    lines = ok("corpus", "info", "out/shards.json", cwd=tmp_path)
    assert lines[0] == "corpus     out/shards.json"
    assert lines[1:] == corpus.info_lines(tmp_path / "out" / "shards.json")[1:]
    assert ok("corpus", "info", "out", cwd=tmp_path)[1:] == lines[1:]  # the directory stands for its manifest
    assert ok("corpus", "verify", "out", cwd=tmp_path)[0].startswith("pskd: ok out/shards.json: ")
    lines = ok("corpus", "build", "in", "-o", "out", cwd=tmp_path)
    assert lines == [f"pskd: wrote out/shards.json (3 shards, {m.tokens} tokens, {m.documents} documents, "
                     "a vocabulary of 257 tokens with boundary 256; 3 kept from an earlier build)"]


def in_process(*args) -> list[str]:
    """A command's handler run in this process (for the checks that need no fresh interpreter)."""
    from pskd_jax.apps import pskd as cli

    parsed = cli.make_parser().parse_args([str(a) for a in args])
    return list(parsed.handler(parsed))


@pytest.mark.parametrize("flags, message", [
    (["--workers", "0"], "--workers: workers=0: expected an integer >= 1"),
    (["--chunk-tokens", "-1"], "--chunk-tokens: chunk_tokens=-1: expected an integer >= 1"),
    (["--max-document-tokens", "0"], "--max-document-tokens: max_document_tokens=0: expected an integer >= 1"),
    (["--text-key", ""], "--text-key: text_key='': expected a non-empty string"),
])
def test_a_refused_build_setting_names_its_flag_and_writes_nothing(tmp_path, flags, message):
    (tmp_path / "t.txt").write_text("abba\n", encoding="utf-8")
    with pytest.raises(PskdError, match="^E9012: " + re.escape(message)):
        in_process("corpus", "build", tmp_path / "t.txt", *flags, "-o", tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
@pytest.mark.subprocess
def test_chars_vocabulary_and_usage(tmp_path):
    (tmp_path / "t.txt").write_text("abba\nbaab\n", encoding="utf-8")
    ok("chars", tmp_path / "t.txt", "-o", tmp_path / "v.json")
    lines = in_process("corpus", "build", tmp_path / "t.txt", "--vocab", tmp_path / "v.json", "-o", tmp_path / "c",
                       "--max-document-tokens", "3")
    assert lines[0] == f"pskd: wrote {tmp_path / 'c' / 'shards.json'} (1 shard, 4 tokens, 1 document, " \
                       "a vocabulary of 4 tokens " \
                       "with boundary 3)"
    m = corpus.read_manifest(tmp_path / "c" / "shards.json")
    assert m.tokenizer == Tokenizer.chars(["\n", "a", "b"]) and (m.vocab_size, m.boundary, m.tokens) == (4, 3, 4)
    for bad in (["--tokenizer", "chars"], ["--tokenizer", "bytes", "--vocab", tmp_path / "v.json"],
                ["--workers", "0"], ["--chunk-tokens", "0"], ["--max-document-tokens", "0"]):
        with pytest.raises(PskdError, match="E9012"):
            in_process("corpus", "build", tmp_path / "t.txt", *bad, "-o", tmp_path / "d")
    (tmp_path / "u.txt").write_text("abc", encoding="utf-8")
    err = fails("E9015", "corpus", "build", tmp_path / "u.txt", "--vocab", tmp_path / "v.json", "-o", tmp_path / "d")
    assert f"{tmp_path / 'u.txt'}:1: character 'c'" in err


@pytest.mark.slow
@pytest.mark.subprocess
def test_bad_input_and_skip_bad(tmp_path):
    documents(tmp_path / "a.jsonl", 10, 1)
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n{"text": 5}\nnot json\n{"text": "y"}\n')
    err = fails("E9015", "corpus", "build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-o", tmp_path / "c")
    assert f"{tmp_path / 'b.jsonl'}:2: the 'text' value is 5, not a string" in err
    partial = corpus.read_manifest(tmp_path / "c" / "shards.json")  # the finished shard, marked in progress
    assert (partial.complete, len(partial.shards)) == (False, 1) and not (tmp_path / "c" / "shard-00001.psk.d").exists()
    lines = ok("corpus", "build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-o", tmp_path / "c", "--skip-bad")
    assert lines[1:4] == ["pskd: left out 2 bad documents (--skip-bad); the first:",
                          f"pskd:   {tmp_path / 'b.jsonl'}:2: the 'text' value is 5, not a string",
                          f"pskd:   {tmp_path / 'b.jsonl'}:3: not JSON (Expecting value, column 1); each line of "
                          "a .jsonl file is one JSON object"]
    assert "skipped    2 bad documents" in "\n".join(ok("corpus", "info", tmp_path / "c" / "shards.json"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_verify_failures(tmp_path):
    documents(tmp_path / "a.jsonl", 10, 1)
    documents(tmp_path / "b.jsonl", 10, 2)
    ok("corpus", "build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-o", tmp_path / "c")
    shard = tmp_path / "c" / "shard-00001.psk.d"
    data = bytearray(shard.read_bytes())
    data[40] ^= 0x20
    shard.write_bytes(bytes(data))
    err = fails("E9017", "corpus", "verify", tmp_path / "c" / "shards.json")
    assert "shard 1 shard-00001.psk.d: sha256" in err
    manifest = tmp_path / "c" / "shards.json"
    manifest.write_text(manifest.read_text().replace('"shard-00000.psk.d"', '"../a.jsonl"'))
    assert "shard 0: path '../a.jsonl' leaves the manifest's directory" in fails("E9016", "corpus", "verify", manifest)
    fails("E9016", "corpus", "info", tmp_path / "nothing.json")


@pytest.mark.slow
@pytest.mark.subprocess
def test_merge(tmp_path):
    assert SCRIPT is not None, "the pskd console script is not installed beside this interpreter"
    for name, n in (("a", 30), ("b", 20), ("c", 25)):
        documents(tmp_path / f"{name}.jsonl", n, ord(name))
    a, b, c, vocab = (tmp_path / n for n in ("a.jsonl", "b.jsonl", "c.jsonl", "vocab.json"))
    in_process("corpus", "build", a, b, "-o", tmp_path / "all/one")
    in_process("corpus", "build", c, "-o", tmp_path / "all/two")
    in_process("corpus", "build", a, b, c, "-o", tmp_path / "whole")
    in_process("chars", c, "-o", vocab)
    in_process("corpus", "build", c, "--vocab", vocab, "-o", tmp_path / "all/chars")
    in_process("corpus", "build", c, "--max-document-tokens", "9", "-o", tmp_path / "all/short")
    lines = ok("corpus", "merge", "all/one/shards.json", "all/two/shards.json", "-o", "all/shards.json", cwd=tmp_path,
               script=True)
    whole = corpus.read_manifest(tmp_path / "whole" / "shards.json")
    assert lines == [f"pskd: wrote all/shards.json (3 shards from 2 manifests, {whole.tokens} tokens, "
                     f"{whole.documents} documents, a vocabulary of 257 tokens with boundary 256)"]
    merged = corpus.read_manifest(tmp_path / "all" / "shards.json")
    assert [s.path for s in merged.shards] == ["one/shard-00000.psk.d", "one/shard-00001.psk.d",
                                               "two/shard-00000.psk.d"]
    assert [s.sha256 for s in merged.shards] == [s.sha256 for s in whole.shards]
    corpus.verify_corpus(tmp_path / "all" / "shards.json")
    first = (tmp_path / "all" / "shards.json").read_bytes()
    lines = in_process("corpus", "merge", tmp_path / "all/one/shards.json", tmp_path / "all/two/shards.json", "-o",
                       tmp_path / "all")
    assert lines[0].startswith(f"pskd: wrote {tmp_path / 'all' / 'shards.json'} (3 shards from 2 manifests")
    assert (tmp_path / "all" / "shards.json").read_bytes() == first  # a directory: its shards.json

    (tmp_path / "all" / "bad").mkdir()
    (tmp_path / "all" / "bad" / "shards.json").write_text('{"format": "pskd-corpus", "version": Infinity}')
    for args, what in [
        (["all/one/shards.json", "all/chars/shards.json"], "all/chars/shards.json: its tokenizer \\(chars, "),
        (["all/one/shards.json", "all/short/shards.json"],
         "all/short/shards.json: its build options differ from .*all/one/shards.json's "
         "\\(max_document_tokens 9 against None\\)"),
        (["all/one/shards.json", "all/two/shards.json", "all/one/shards.json"], "all/one/shards.json: shard 0 "
                                                                                "shard-00000.psk.d is .*, which "
                                                                                ".*all/one/shards.json lists already"),
        (["all/one/shards.json", "all/bad/shards.json"], "all/bad/shards.json: not a JSON manifest \\(Infinity"),
        (["all/one/shards.json", "all/none/shards.json"], "all/none/shards.json: cannot read the corpus manifest"),
        (["all/one/shards.json", "whole/shards.json"], "whole/shards.json: shard shard-00000.psk.d lies outside"),
    ]:
        if args[-1] in ("all/chars/shards.json", "all/bad/shards.json"):  # as a user meets them
            err = fails("E9016", "corpus", "merge", *args, "-o", "all/shards.json", cwd=tmp_path, script=True)
        else:  # the others in this process
            with pytest.raises(PskdError) as info:
                in_process("corpus", "merge", *[tmp_path / a for a in args], "-o", tmp_path / "all/shards.json")
            err = f"pskd: {info.value}"
        assert err.startswith("pskd: E9016: ") and re.search(what, err), (what, err)
    assert (tmp_path / "all" / "shards.json").read_bytes() == first  # untouched by the failed merges
    assert [n for n in os.listdir(tmp_path / "all") if n.endswith(".tmp")] == []
    err = pskd("corpus", "merge", "-o", "all/shards.json", cwd=tmp_path, script=True).stderr
    assert "the following arguments are required: PART/shards.json" in err


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_builds_of_one_directory_at_once_the_second_is_refused(tmp_path):
    """A real build holds the directory (it waits before reading its second input until the test
    lets it go: a named pipe would be refused as an input); a second build of the directory, in
    another process, is refused at once."""
    documents(tmp_path / "a.jsonl", 20, 1)
    documents(tmp_path / "b.jsonl", 20, 2)
    slow = tmp_path / "slow.jsonl"
    slow.write_text('{"text": "late"}\n')
    go = tmp_path / "go"
    out = tmp_path / "c"
    waiting = (
        "import os, sys, time\n"
        "from pskd_jax.corpus import inputs\n"
        "real, go = inputs.open_fd, sys.argv[1]\n"
        "def open_fd(path, *args, **kwargs):\n"
        "    while path.endswith('slow.jsonl') and not os.path.exists(go):\n"
        "        time.sleep(0.01)\n"
        "    return real(path, *args, **kwargs)\n"
        "inputs.open_fd = open_fd\n"
        "from pskd_jax.apps import pskd\n"
        "sys.argv = ['pskd', *sys.argv[2:]]\n"
        "pskd.run()\n")
    first = subprocess.Popen([sys.executable, "-c", waiting, str(go), "corpus", "build", str(tmp_path / "a.jsonl"),
                              str(slow), "-o", str(out)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (out / ".shards.journal").exists(), alive=first,  # written once the lock is held
                   what="the first build's journal")
        err = fails("E9016", "corpus", "build", "a.jsonl", "-o", "c", cwd=tmp_path)
        assert err == ("pskd: E9016: c: another corpus build is running in this directory (it holds "
                       "c/.pskd-corpus.lock); wait for it to finish or build into another directory\n")
        with pytest.raises(PskdError, match="E9016: .*another corpus build is running"):  # other inputs, a pool
            in_process("corpus", "build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--workers", "2", "-o", out)
        assert first.poll() is None
        go.write_text("")  # the first build reads its second input now
        stdout, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert stdout.startswith(f"pskd: wrote {out / 'shards.json'} (2 shards,")
    assert (out / ".pskd-corpus.lock").exists()  # left in place on purpose (see directory_lock)
    ok("corpus", "verify", "c/shards.json", cwd=tmp_path)
    ok("corpus", "build", "a.jsonl", "-o", "c", cwd=tmp_path)  # the directory is free again


def test_progress_bar_draws_in_place():
    import io

    from pskd_jax.apps.corpus_commands import BuildProgress

    stream = io.StringIO()
    bar = BuildProgress(stream)
    bar(5 * 10**6, 10 * 10**6, 1, 4)
    bar(10 * 10**6, 10 * 10**6, 4, 4)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r") and "50%" in text and "1/4 shards" in text and "100%" in text and "4/4 shards" in text


@pytest.mark.slow
@pytest.mark.subprocess
def test_build_and_merge_in_a_bucket(tmp_path, s3_bucket):
    """``pskd corpus build … -o s3://…`` from objects of the bucket, and ``pskd corpus merge -o
    s3://…`` (a prefix stands for its shards.json), as a user runs them."""
    from pskd_jax.storage import resolve

    store, where = resolve(s3_bucket.url)
    for name, n in (("a", 30), ("b", 20)):
        documents(tmp_path / f"{name}.jsonl", n, ord(name))
        store.put(f"raw/{name}.jsonl", (tmp_path / f"{name}.jsonl").read_bytes())
    url = s3_bucket.url
    lines = ok("corpus", "build", f"{url}/raw/a.jsonl", "-o", f"{url}/all/one", env=s3_bucket.env, cwd=tmp_path)
    assert lines[0].startswith(f"pskd: wrote {url}/all/one/shards.json (1 shard, ")
    ok("corpus", "build", f"{url}/raw/b.*", "-o", f"{url}/all/two", env=s3_bucket.env, cwd=tmp_path)
    lines = ok("corpus", "merge", f"{url}/all/one", f"{url}/all/two/shards.json", "-o", f"{url}/all",
               env=s3_bucket.env, cwd=tmp_path)
    assert lines[0].startswith(f"pskd: wrote {url}/all/shards.json (2 shards from 2 manifests, ")
    whole = corpus.build_corpus([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "whole").manifest
    merged = json.loads(store.get("all/shards.json")[0])
    assert [s["path"] for s in merged["shards"]] == ["one/shard-00000.psk.d", "two/shard-00000.psk.d"]
    assert [s["sha256"] for s in merged["shards"]] == [s.sha256 for s in whole.shards]
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "whole"]  # nothing named "s3:"
    fails("E9018", "corpus", "build", str(tmp_path / "a.jsonl"), "-o", "s3://Bad_Bucket/c", env=s3_bucket.env,
          cwd=tmp_path)
    assert "s3:" not in os.listdir(tmp_path)


def test_messages_count_one_thing_in_the_singular(tmp_path):
    """A corpus of one shard, one document and one token a document says so: "1 shard", "1
    document", "1 worker", not "1 shards"; as do pskd info of one leaf and a skipped document."""
    import numpy as np

    import pskd_jax

    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": 3}\n', encoding="utf-8")
    manifest = tmp_path / "c" / "shards.json"
    built = in_process("corpus", "build", tmp_path / "t.jsonl", "-o", tmp_path / "c", "--skip-bad")
    assert built[0].startswith(f"pskd: wrote {manifest} (1 shard, 2 tokens, 1 document, a vocabulary"), built
    assert built[1].startswith("pskd: left out 1 bad document (--skip-bad)"), built
    assert re.fullmatch(r"pskd: 1 shard from 0\.0 MB of input in .* with 1 worker\)", built[-1]), built
    (verified,) = in_process("corpus", "verify", manifest)
    assert verified.startswith(f"pskd: ok {manifest}: 1 shard, 2 tokens; every sha256"), verified
    info = in_process("corpus", "info", manifest, "--shards")
    assert "skipped    1 bad document (built with --skip-bad)" in info, info
    assert info[-1].startswith("[0] shard-00000.psk.d  2 tokens  1 document  sha256 "), info
    pskd_jax.write(tmp_path / "one.psk.d", "idx[4][]", np.arange(1, dtype=np.uint8))
    assert "sample  1 byte, 1 leaf" in in_process("info", tmp_path / "one.psk.d")
