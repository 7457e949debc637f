"""The reading commands on objects of the loopback S3 server, run as a user runs them (a fresh
``pskd`` process reaching the server through the standard AWS variables): ``corpus verify`` and
``corpus info`` of ``s3://…/shards.json`` (or its prefix), ``info``, ``export`` and ``diff`` of
``.psk.d`` objects (a checkpoint's layout object found beside it), and of a checkpoint several
processes saved (a parts index), ``convert`` included. Each prints what it prints for the same
local files (or single object); failures are E9xxx naming the URL, without a credential."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pskd_jax import checkpoint, corpus
from pskd_jax.checkpoint.parts import PartsIndex
from pskd_jax.corpus import BuildOptions
from pskd_jax.errors import PskdError
from pskd_jax.format import write
from pskd_jax.storage import resolve
from tests.faultproxy import Rule, answer
from tests.helpers import assert_code, pskd, train_lm
from tests.helpers import pskd_fails as fails
from tests.helpers import pskd_ok as ok
from tests.objectstore import KEYS

from ..checkpoint.helpers import split_into_parts
from ..corpus.helpers import make_inputs

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def upload(local, url: str) -> None:
    store, where = resolve(url)
    with open(local, "rb") as f:
        store.put(where.key, f.read())


@pytest.fixture
def corpora(tmp_path, s3_bucket):
    (tmp_path / "in").mkdir()
    inputs = [str(p) for p in make_inputs(tmp_path / "in")]
    corpus.build_corpus(inputs, tmp_path / "local", BuildOptions(durable=False))
    corpus.build_corpus(inputs, s3_bucket.url + "/c", BuildOptions(durable=False))
    return str(tmp_path / "local"), s3_bucket.url + "/c"


def test_corpus_verify_and_info_of_a_bucket(corpora, s3_bucket, tmp_path):
    local, remote = corpora
    for given in (remote + "/shards.json", remote, remote + "/"):
        (line,) = ok("corpus", "verify", given, env=s3_bucket.env)
        assert line.startswith(f"pskd: ok {remote}/shards.json: 5 shards, ")
    here = ok("corpus", "info", local, "--shards", cwd=tmp_path)
    there = ok("corpus", "info", remote + "/shards.json", "--shards", env=s3_bucket.env)
    assert there[0] == f"corpus     {remote}/shards.json" and there[1:] == here[1:]

    manifest = corpus.verify_corpus(remote + "/shards.json").manifest
    store, where = resolve(remote + "/shards.json")
    key = where.parent().child(manifest.shards[3].path).key
    data = bytearray(store.get(key)[0])
    data[-1] ^= 1
    store.put(key, bytes(data))
    message = fails("E9017", "corpus", "verify", remote, "--workers", "2", env=s3_bucket.env)
    assert f"{remote}/shards.json: shard 3 {manifest.shards[3].path}: sha256 " in message


def test_info_export_and_diff_of_objects(s3_bucket, tmp_path):
    rng = np.random.default_rng(5)
    a, b = str(tmp_path / "a.psk.d"), str(tmp_path / "b.psk.d")
    kind = "(idx[100][seq: 4], ℝ[3])"
    write(a, kind, (rng.integers(0, 100, (6, 4)), rng.standard_normal((6, 3))))
    write(b, kind, (rng.integers(0, 100, (6, 4)), rng.standard_normal((6, 3))))
    for path in (a, b):
        upload(path, f"{s3_bucket.url}/d/{path.rsplit('/', 1)[1]}")
    url_a, url_b = f"{s3_bucket.url}/d/a.psk.d", f"{s3_bucket.url}/d/b.psk.d"
    env = s3_bucket.env
    assert ok("info", url_a, "--samples", "3", env=env) == ok("info", a, "--samples", "3")
    assert ok("diff", url_a, url_b, env=env) == ok("diff", a, b)
    assert ok("diff", url_a, b, env=env) == ok("diff", a, b)  # an object against a local file
    (line,) = ok("export", url_a, "-o", tmp_path / "there.json", env=env)
    assert line == f"pskd: wrote {tmp_path / 'there.json'} (6 samples as JSON)"
    ok("export", a, "-o", tmp_path / "here.json")
    assert json.loads((tmp_path / "there.json").read_text()) == json.loads((tmp_path / "here.json").read_text())


def test_info_of_a_checkpoint_object_with_its_layout_beside_it(s3_bucket, tmp_path):
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.array(7, np.int64)}
    local = str(tmp_path / "p.psk.d")
    checkpoint.save(local, tree)
    upload(local, f"{s3_bucket.url}/ck/p.psk.d")
    upload(str(tmp_path / "p.layout.json"), f"{s3_bucket.url}/ck/p.layout.json")
    there = ok("info", f"{s3_bucket.url}/ck/p.psk.d", "--values", env=s3_bucket.env)
    here = ok("info", local, "--values")
    shown = [line for line in there if line.startswith("layout  ")]
    assert shown == [f"layout  {s3_bucket.url}/ck/p.layout.json"]  # the layout object beside it
    assert [line for line in there if line not in shown] == [line for line in here if not line.startswith("layout  ")]
    assert any(line.startswith("leaves  2") for line in there)
    out = tmp_path / "ck.json"
    ok("export", f"{s3_bucket.url}/ck/p.psk.d", "-o", out, env=s3_bucket.env)
    assert json.loads(out.read_text())["samples"][0]["w"] == tree["w"].tolist()


def test_failures_name_the_url_and_no_credential(s3_bucket, tmp_path):
    env = s3_bucket.env
    missing = f"{s3_bucket.url}/none.psk.d"
    message = fails("E9002", "info", missing, env=env)
    assert missing in message
    message = fails("E9003", "corpus", "verify", f"{s3_bucket.url}/none/shards.json", env=env)
    assert "none/shards.json" in message
    message = fails("E9018", "info", "s3://pskd-no-such-bucket-here/x.psk.d", env=env)
    assert "there is no bucket 'pskd-no-such-bucket-here'" in message  # (not a missing object's words)
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in message and KEYS["AWS_ACCESS_KEY_ID"] not in message
    result = pskd("info", "ftp://host/x.psk.d", cwd=tmp_path, env=env)
    assert result.returncode == 1 and result.stderr.startswith("pskd: E9018: ftp://host/x.psk.d")
    assert list(tmp_path.iterdir()) == []


def test_pipeline_of_a_url_streaming_nothing_names_its_place(corpora, s3_bucket, tmp_path):
    """As for a path: E9010 at the source's line and column (it was E9002 without them); a bucket
    that is not there is E9018 saying so."""
    local, remote = corpora
    text = f'mix(stream "{local}/shards.json" : 1,\n    stream "{{}}" : 1) |> batch(B = 2)'
    message = fails("E9010", "pipeline", text.format(f"{remote}/no/shards.json"), "--seq", "4", env=s3_bucket.env)
    assert f"TEXT:2:5: source 1: the stream '{remote}/no/shards.json' does not exist" in message, message
    message = fails("E9018", "pipeline", text.format("s3://pskd-no-such-bucket-here/c/shards.json"), "--seq", "4",
                    env=s3_bucket.env)
    assert "there is no bucket 'pskd-no-such-bucket-here'" in message, message


def test_train_lm_of_a_mix_with_a_url_streaming_nothing_names_its_place_as_the_loader(corpora, s3_bucket):
    """train_lm's E9010 for a mixture's object that is not there is the Loader's, line, column and
    index included (it named the URL alone)."""
    from pskd_jax.loader import Loader
    from pskd_jax.pipeline import parse_pipeline

    local, remote = corpora
    missing = f"{remote}/no/shards.json"
    text = f'mix(stream "{local}/shards.json" : 1,\n    stream "{missing}" : 1) |> batch(B = 2)'
    result = train_lm(f"--pipeline={text}", "--steps=1", "--seq=4", env=s3_bucket.env)
    assert (result.returncode, result.stdout) == (1, "")
    with pytest.raises(PskdError) as refused:
        Loader(parse_pipeline(text, source="--pipeline"), seq=4)
    assert result.stderr == f"pskd: {refused.value}\n"
    assert_code(result, "E9010", f"--pipeline:2:5: source 1: the stream '{missing}' does not exist")


def test_train_lm_whose_store_fails_to_say_what_a_stream_is_reports_the_store(faulty_bucket, fault_proxy, tmp_path):
    """A refusal (403) of the request that asks whether the stream is a corpus manifest is E9018
    naming the URL; it was read as "not a corpus", and the run was refused with a word about a
    .psk.d file (--seq "cuts a corpus's windows; … is a .psk.d file")."""
    (tmp_path / "in").mkdir()
    manifest = corpus.build_corpus([str(p) for p in make_inputs(tmp_path / "in")], faulty_bucket.url + "/c",
                                   BuildOptions(durable=False)).manifest.path
    # (the first GET is the check that something is there; the second asks whether it is JSON)
    fault_proxy.plan(Rule(answer(403), method="GET", path=r"c/shards\.json", skip=1, times=1))
    result = train_lm(f'--pipeline=stream "{manifest}" |> batch(B = 2)', "--steps=1", "--seq=4",
                      env=faulty_bucket.env)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr[-3000:]
    assert_code(result, "E9018", manifest, "403")
    assert fault_proxy.faults_done() == 1


def test_a_checkpoint_saved_in_parts_reads_as_the_single_object(s3_bucket, tmp_path):
    """A checkpoint that several processes saved (a parts index over part objects): ``info``,
    ``diff``, ``export`` and ``convert`` (an object into an object, both ways) print and write what
    they do for the same checkpoint saved as one object; a missing part is E9003 naming it."""
    rng = np.random.default_rng(3)
    tree = {"w": rng.standard_normal((30, 5)).astype(np.float32), "b": rng.standard_normal(4),
            "n": np.arange(6, dtype=np.int16)}
    one, many = f"{s3_bucket.url}/ck/one.psk.d", f"{s3_bucket.url}/ck/many.psk.d"
    checkpoint.save(one, tree)
    checkpoint.save(many, tree)
    store, where = resolve(many)
    size = store.info(where.key).size
    split_into_parts(many, [7, 100, size // 2, size - 3], [1, 0, 2, 1, 0], 3)
    env = s3_bucket.env
    here, there = ok("info", one, "--values", env=env), ok("info", many, "--values", env=env)
    assert [line.replace("/one.", "/many.") for line in here] == there
    assert f"layout  {s3_bucket.url}/ck/many.layout.json" in there
    assert ok("diff", one, many, env=env) == ok("diff", one, one, env=env)
    for name, url in (("one", one), ("many", many)):
        ok("export", url, "-o", tmp_path / f"{name}.json", env=env)
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "many.json").read_bytes()

    out = f"{s3_bucket.url}/st/many.safetensors"
    assert ok("convert", many, "-o", out, cwd=tmp_path, env=env) == [f"pskd: wrote {out} (3 tensors)"]
    ok("convert", one, "-o", tmp_path / "one.safetensors", env=env)
    from safetensors.numpy import load

    found = [load(raw) for raw in (store.get(resolve(out)[1].key)[0], (tmp_path / "one.safetensors").read_bytes())]
    assert sorted(found[0]) == sorted(found[1]) == ["b", "n", "w"]
    assert all(found[0][k].tobytes() == found[1][k].tobytes() for k in found[0])
    back = f"{s3_bucket.url}/back/b.psk.d"
    (line,) = ok("convert", out, "-o", back, cwd=tmp_path, env=env)
    assert line.startswith(f"pskd: wrote {back} (3 leaves")
    assert store.get(resolve(back)[1].key)[0] == store.get(resolve(one)[1].key)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.json", "one.json", "one.safetensors"]  # no s3: here

    part = PartsIndex.parse(store.get(where.key)[0], many).keys[2]
    store.delete(part)
    for command in (("info", many), ("convert", many, "-o", tmp_path / "x.safetensors")):
        message = fails("E9003", *command, env=env)
        assert many in message and store.url(part) in message and "missing" in message
    assert not (tmp_path / "x.safetensors").exists()


def test_outputs_to_a_bucket_and_a_stream_of_a_corpus_in_it(corpora, s3_bucket, tmp_path):
    local, remote = corpora
    env = s3_bucket.env
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(str(i % 7) for i in range(100)))
    (line,) = ok("lm-windows", "--vocab", "7", "--seq", "8", tokens, "-o", f"{remote}/w.psk.d", env=env, cwd=tmp_path)
    assert line.startswith(f"pskd: wrote {remote}/w.psk.d (12 windows ")
    ok("lm-windows", "--vocab", "7", "--seq", "8", tokens, "-o", tmp_path / "w.psk.d")
    store, where = resolve(f"{remote}/w.psk.d")
    assert store.get(where.key)[0] == (tmp_path / "w.psk.d").read_bytes()
    (line,) = ok("export", f"{remote}/w.psk.d", "-o", f"{remote}/w.json", env=env, cwd=tmp_path)
    assert line == f"pskd: wrote {remote}/w.json (12 samples as JSON)"
    ok("export", tmp_path / "w.psk.d", "-o", tmp_path / "w.json")
    assert store.get(where.parent().child("w.json").key)[0] == (tmp_path / "w.json").read_bytes()
    text = 'stream "{}" |> shuffle(seed = 3) |> batch(B = 4)'
    there = ok("pipeline", text.format(f"{remote}/shards.json"), "--seq", "16", env=env, cwd=tmp_path)
    here = ok("pipeline", text.format(f"{local}/shards.json"), "--seq", "16", cwd=tmp_path)
    assert there[1:] == here[1:] and f"stream \"{remote}/shards.json\"" in there[0]
    message = fails("E9003", "verify", f"{remote}/none.psk.d", env=env, cwd=tmp_path)  # never "0 verified"
    assert f"{remote}/none.psk.d" in message
    assert sorted(os.listdir(tmp_path)) == ["in", "local", "tokens.txt", "w.json", "w.psk.d"]


BAD_URLS = ["s3:/bkt/x", "gs:relative", "hdfs://x/y"]


@pytest.mark.parametrize("bad", BAD_URLS)
def test_every_command_refuses_a_url_it_cannot_serve_and_makes_nothing(bad, corpora, tmp_path):
    local, _ = corpora
    here = tmp_path / "cwd"
    here.mkdir()
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("1 2 3 4 5 6 7 8 9")
    document = sorted((tmp_path / "in").iterdir())[0]
    commands = [("info", f"{bad}/a.psk.d"), ("diff", f"{bad}/a.psk.d", f"{bad}/b.psk.d"),
                ("export", f"{bad}/a.psk.d", "-o", "out.json"), ("export", tmp_path / "w.psk.d", "-o", f"{bad}/o.json"),
                ("verify", bad), ("convert", f"{bad}/a.psk.d", "-o", "a.safetensors"),
                ("lm-windows", "--vocab", "10", "--seq", "4", tokens, "-o", f"{bad}/w.psk.d"),
                ("corpus", "build", document, "-o", f"{bad}/c"), ("corpus", "build", f"{bad}/in.txt", "-o", "c"),
                ("corpus", "verify", f"{bad}/shards.json"), ("corpus", "info", f"{bad}/shards.json"),
                ("corpus", "merge", f"{local}/shards.json", "-o", f"{bad}/shards.json"),
                ("corpus", "merge", f"{bad}/a/shards.json", "-o", "shards.json"),  # (a part: parsed as an argument)
                ("pipeline", f'stream "{bad}/shards.json" |> batch(B = 2)', "--seq", "4")]
    ok("lm-windows", "--vocab", "10", "--seq", "4", tokens, "-o", tmp_path / "w.psk.d")
    for command in commands:
        message = fails("E9018", *command, cwd=here)
        assert bad in message, (command, message)
        assert os.listdir(here) == [], command


def test_without_the_client_extra_every_command_names_it(s3_bucket, tmp_path):
    fake = tmp_path / "fake" / "obstore"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('obstore is not installed (test)')\n")
    env = {**s3_bucket.env, "PYTHONPATH": f"{fake.parent}{os.pathsep}{s3_bucket.env['PYTHONPATH']}"}
    here = tmp_path / "cwd"
    here.mkdir()
    url = s3_bucket.url
    (tmp_path / "doc.txt").write_text("some text\n")
    for named, command in [(f"{url}/a.psk.d", ("info", f"{url}/a.psk.d")),  # the file given, not its layout's
                           (f"{url}/a.psk.d", ("export", f"{url}/a.psk.d", "-o", "a.json")),
                           (url, ("verify", url)),
                           (f"{url}/c", ("corpus", "build", tmp_path / "doc.txt", "-o", f"{url}/c")),
                           (url, ("corpus", "verify", url)),
                           (f"{url}/c/shards.json",
                            ("pipeline", f'stream "{url}/c/shards.json" |> batch(B = 2)', "--seq", "4"))]:
        message = fails("E9018", *command, env=env, cwd=here)
        assert message.startswith(f"pskd: E9018: {named}") and "pip install 'pskd_jax[storage]'" in message, message
        assert os.listdir(here) == [], command


def test_text_inputs_read_objects_and_never_a_local_path_named_like_the_url(s3_bucket, tmp_path):
    """The text inputs (tokens, values, a vocabulary) of a URL are read from the store, with the
    output the local file gives; a local file at the path the URL looks like (``s3:/…``) is never
    read, and a URL the toolkit cannot serve is E9018 naming it."""
    url, env = s3_bucket.url, s3_bucket.env
    tokens, text, vocab = tmp_path / "tokens.txt", tmp_path / "t.txt", tmp_path / "v.json"
    tokens.write_text(" ".join(str(i % 7) for i in range(100)))
    text.write_text("abba\n")
    vocab.write_text('["\\n", "a", "b"]')
    for local in (tokens, text, vocab):
        upload(local, f"{url}/{local.name}")
    here = tmp_path / "cwd"
    (here / "s3:" / s3_bucket.name).mkdir(parents=True)  # what "s3://b/k" would be as a local path
    (here / "s3:" / s3_bucket.name / "t.txt").write_text("a decoy\n")
    assert ok("chars", f"{url}/t.txt", "-o", "-", env=env, cwd=here) == ['["\\n", "a", "b"]']
    assert ok("encode", f"{url}/t.txt", "--vocab", f"{url}/v.json", "-o", "-", env=env, cwd=here) == \
        ok("encode", text, "--vocab", f"file://{vocab}", "-o", "-", cwd=here)
    ok("lm-windows", "--vocab", "7", "--seq", "8", f"{url}/tokens.txt", "-o", here / "w.psk.d", env=env)
    ok("lm-windows", "--vocab", "7", "--seq", "8", tokens, "-o", tmp_path / "w.psk.d")
    assert (here / "w.psk.d").read_bytes() == (tmp_path / "w.psk.d").read_bytes()
    assert f"{url}/none.txt: cannot read: no such object" in fails("E9003", "chars", f"{url}/none.txt", "-o", "-",
                                                                    env=env, cwd=here)
    assert "hdfs://x/t.txt" in fails("E9018", "chars", "hdfs://x/t.txt", "-o", "-", cwd=here)
    assert sorted(os.listdir(here)) == ["s3:", "w.psk.d"]
