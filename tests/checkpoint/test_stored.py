"""save and restore at any place: a local path, ``file://``, ``memory://`` and a bucket of the
loopback S3 server — the same bytes, the layout object beside the data, digests checked, and no
URL ever turned into a local directory."""

from __future__ import annotations

import os
import textwrap

import ml_dtypes
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.names import layout_path_for
from pskd_jax.errors import PskdError
from pskd_jax.storage import locate, resolve
from tests.helpers import ENV, raises, run_python


def _tree():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((33, 17)).astype(np.float32),
            "h": rng.standard_normal((5, 4)).astype(ml_dtypes.bfloat16),
            "ids": rng.integers(-5, 1000, (9,)).astype(np.int32),
            "step": np.int64(-3), "lr": 0.25, "flag": True, "empty": np.zeros((0, 3), np.float32)}


def _same(a, b):
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.tobytes() == y.tobytes(), key


def _object(url: str) -> bytes:
    store, where = resolve(url)
    return store.get(where.key)[0]


def _place(any_place: str, name: str) -> str:
    where = locate(any_place).child(name)
    return where.url


def test_save_restore_round_trip_with_layout_object(any_place, tmp_path):
    url = _place(any_place, "ckpt.psk.d")
    tree = _tree()
    result = ck.save(url, tree, ck.SaveOptions(digest="xxh3_128", encodings={"['w']": "bf16"}, round_to_encoding=True))
    local = ck.save(tmp_path / "same.psk.d", tree,
                    ck.SaveOptions(digest="xxh3_128", encodings={"['w']": "bf16"}, round_to_encoding=True))
    assert _object(url) == (tmp_path / "same.psk.d").read_bytes()  # the same bytes wherever saved
    assert result.digests == local.digests and result.bytes == local.bytes
    assert result.layout_path == locate(url).parent().child(os.path.basename(layout_path_for(url))).url
    assert _object(result.layout_path)  # the layout object, beside the data
    back = ck.restore(url, as_numpy=True)  # by its layout object
    assert back["lr"] == 0.25 and back["flag"] is True
    np.testing.assert_array_equal(back["w"].astype(np.float32), tree["w"].astype(ml_dtypes.bfloat16).astype(np.float32))
    _same({k: v for k, v in back.items() if k != "w"}, {k: v for k, v in tree.items() if k != "w"})
    verified = ck.restore(url, tree, digests=result.digests)  # into a target, checked while read
    assert verified["ids"].dtype == np.int32
    part = ck.restore(url, {"ids": tree["ids"], "step": tree["step"]}, partial=True, digests=result.digests)
    _same(part, {"ids": tree["ids"], "step": tree["step"]})
    assert ck.restore(url, tree, layout=result.layout_path)["step"] == -3  # a layout given by URL


def test_file_urls_are_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = "file://" + str(tmp_path / "f.psk.d")
    ck.save(url, {"a": np.arange(3)})
    assert (tmp_path / "f.psk.d").is_file() and not os.path.exists("file:")
    assert ck.restore(url, as_numpy=True)["a"].tolist() == [0, 1, 2]


def test_digest_mismatch_returns_nothing(any_place):
    url = _place(any_place, "d.psk.d")
    tree = {"w": np.arange(1000, dtype=np.float32)}
    digests = ck.save(url, tree, ck.SaveOptions(digest="sha256")).digests
    store, where = resolve(url)
    data = bytearray(store.get(where.key)[0])
    data[-1] ^= 1
    store.put(where.key, bytes(data))  # damaged: the same size, one bit changed
    if where.is_local:
        with raises("E9013", url):
            ck.restore(url, tree, digests=digests)
        with raises("E9013", url):
            ck.restore(url, as_numpy=True, digests=digests)
        return
    # An object put again by other means is another version than the one its layout records:
    # refused before any value is read (the layout may be the previous save's).
    for target in (tree, None):
        with raises("E9005", url, "saved again while this restore read it", "put again"):
            ck.restore(url, target, as_numpy=True, digests=digests)


def test_missing_short_and_foreign_objects(any_place):
    missing = _place(any_place, "none.psk.d")
    with raises("E9002", missing):
        ck.restore(missing, {"w": np.zeros(3)})
    url = _place(any_place, "s.psk.d")
    ck.save(url, {"w": np.arange(100, dtype=np.float32)})
    store, where = resolve(url)
    store.put(where.key, store.get(where.key)[0][:-8])  # cut short
    with pytest.raises(PskdError) as info:
        ck.restore(url, as_numpy=True)
    assert info.value.code in ("E9003", "E9005") and url in info.value.message
    store.put(where.key, b"not a checkpoint at all")
    with raises("E9002", url):
        ck.restore(url, {"w": np.zeros(100, np.float32)})


def test_refused_save_leaves_nothing(any_place):
    url = _place(any_place, "nan.psk.d")
    with raises("E9004"):
        ck.save(url, {"w": np.array([1.0, np.nan])}, ck.SaveOptions(finite_only=True))
    store, where = resolve(url)
    assert store.info(where.key) is None and store.info(layout_path_for(where.key)) is None
    big = {"a": np.ones(3 << 20, np.float32), "b": np.array([np.inf], np.float32)}  # refused after a part or two
    with raises("E9004"):
        ck.save(url, big, ck.SaveOptions(finite_only=True))
    assert store.list(locate(url).parent().key) == []


def test_closed_save_removes_only_a_layout_object(any_place):
    url = _place(any_place, "c.psk.d")
    store, where = resolve(url)
    ck.save(url, {"w": np.ones(4, np.float32)})
    beside = layout_path_for(where.key)
    assert store.info(beside) is not None
    ck.save(url, {"w": np.ones(4, np.float32)}, ck.SaveOptions(layout_file=False))
    assert store.info(beside) is None  # the layout of the data it replaced
    if locate(url).is_local:
        return  # (a local file named like a layout: the sidecar-naming work of issue 20 class 1)
    store.put(beside, b"my own notes")
    ck.save(url, {"w": np.ones(4, np.float32)}, ck.SaveOptions(layout_file=False))
    assert store.get(beside)[0] == b"my own notes"  # not a layout file: not the toolkit's


def test_a_save_reads_the_whole_object_where_its_layout_goes(object_place, monkeypatch):
    """The save looks at the object at its layout's key with one read of its first bytes, and
    reads the rest when the object is longer: its own layout is replaced, anything else refused."""
    from pskd_jax.checkpoint import layout_file

    url = _place(object_place, "long.psk.d")
    store, where = resolve(url)
    beside = layout_path_for(where.key)
    tree = {"w": np.arange(6, dtype=np.float32), "step": np.int64(4)}
    ck.save(url, tree)
    monkeypatch.setattr(layout_file, "LAYOUT_HEAD_BYTES", 64)  # (a layout is longer than that)
    assert len(store.get(beside)[0]) > 64
    tree["step"] = np.int64(5)
    ck.save(url, tree)  # its own layout, known once read whole
    assert ck.restore(url, as_numpy=True)["step"] == 5
    foreign = b'{"notes": "' + b"x" * 200 + b'"}'
    store.put(beside, foreign)
    with raises("E9012", "another object stands there"):
        ck.save(url, tree)
    assert store.get(beside)[0] == foreign


def test_object_replaced_while_read_is_refused(object_place, monkeypatch):
    # (a local restore reads one open file: a replace does not reach it)
    url = _place(object_place, "r.psk.d")
    ck.save(url, {"w": np.arange(64, dtype=np.float32)})
    store, where = resolve(url)
    original = type(store).read_spans

    def racing(self, key, spans, offsets):
        original(self, key, spans, offsets)
        # another save of the same name and size, meanwhile: other bytes (an S3 ETag is the MD5 of
        # the bytes, so the same bytes put again are the same version, and harmless to read)
        replaced = bytearray(self.get(key)[0])
        replaced[-1] ^= 1
        self.put(key, bytes(replaced))
    monkeypatch.setattr(type(store), "read_spans", racing)
    with raises("E9003", url, "replaced"):
        ck.restore(url, {"w": np.zeros(64, np.float32)})


def test_conversions_read_and_write_objects(tmp_path):
    from safetensors.numpy import load

    url = "memory://conv/x.psk.d"
    ck.save(url, {"w": np.arange(3, dtype=np.float32)})
    ck.convert(url, tmp_path / "x.safetensors")  # an object to a file
    ck.save(tmp_path / "l.psk.d", {"w": np.arange(3, dtype=np.float32)})
    ck.convert(tmp_path / "l.psk.d", "memory://conv/out.safetensors")  # a file to an object, one put
    store, where = resolve("memory://conv/out.safetensors")
    assert load(store.get(where.key)[0])["w"].tolist() == load((tmp_path / "x.safetensors").read_bytes())["w"].tolist()
    assert not (tmp_path / "memory:").exists()
    ck.convert(tmp_path / "x.safetensors", "memory://conv/back.psk.d")  # (a save: to a store too)
    assert ck.restore("memory://conv/back.psk.d", as_numpy=True)["w"].tolist() == [0, 1, 2]
    with raises("E9018", "ftp://host/x.psk.d"):
        ck.convert("ftp://host/x.psk.d", tmp_path / "y.safetensors")
    assert not (tmp_path / "y.safetensors").exists()


def test_zero_copy_needs_a_local_file():
    url = "memory://zc/x.psk.d"
    ck.save(url, {"w": np.arange(3)})
    with raises("E9012", "zero_copy"):
        ck.restore(url, zero_copy=True)


URLS = ["ftp://host/x.psk.d", "hdfs://nn/x.psk.d", "s3://B/x.psk.d", "gs://a//b.psk.d", "az://c/x"]


@pytest.mark.parametrize("url", URLS)
def test_no_url_becomes_a_local_directory(url, tmp_path, monkeypatch):
    """Every entry point of the checkpoint package given a URL it cannot serve: E9018 naming it,
    and the working directory untouched (no ``ftp:``, ``s3:`` directory)."""
    monkeypatch.chdir(tmp_path)
    tree = {"w": np.arange(3, dtype=np.float32)}
    calls = [lambda: ck.save(url, tree), lambda: ck.restore(url, tree), lambda: ck.restore(url),
             lambda: ck.restore(f"{tmp_path}/x.psk.d", tree, layout=url),
             lambda: ck.CheckpointManager(url), lambda: ck.CheckpointManager(url, read_only=True),
             lambda: ck.verify_directory(url), lambda: ck.read_index(url), lambda: ck.verify_file(url, {"sha256": "0"}),
             lambda: ck.recorded_digests(url), lambda: ck.convert(url, "out.safetensors"),
             lambda: ck.convert("in.safetensors", url), lambda: ck.pskd_to_safetensors(url, "out.safetensors"),
             lambda: ck.safetensors_to_pskd(url, "out.psk.d"), lambda: ck.save_distributed(url, tree)]
    ck.save(f"{tmp_path}/x.psk.d", tree)
    before = sorted(os.listdir(tmp_path))
    for call in calls:
        with raises("E9018", url.split("/")[0].rstrip(":") if "://" in url else url):
            call()
    assert sorted(os.listdir(tmp_path)) == before


SHARDED = textwrap.dedent(
    """
    import sys
    import jax, numpy as np, ml_dtypes
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from pskd_jax import checkpoint as ck
    from pskd_jax.storage import ObjectStore

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    host = {"rows": rng.standard_normal((16, 6)).astype(np.float32),
            "cols": rng.standard_normal((6, 8)).astype(ml_dtypes.bfloat16),
            "grid": rng.standard_normal((8, 4, 3)).astype(np.float32),
            "replicated": rng.standard_normal((5,)).astype(np.float32), "scalar": np.float32(3.5)}
    specs = {"rows": P("x"), "cols": P(None, "y"), "grid": P("x", "y"), "replicated": P(), "scalar": P()}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    url = sys.argv[1]
    digests = ck.save(url, {k: jax.device_put(v, shardings[k]) for k, v in host.items()},
                      ck.SaveOptions(digest="xxh3_128")).digests
    read = []
    original = ObjectStore.read_spans
    def counting(self, key, spans, offsets):
        read.append(sum(len(s) for s in spans))
        return original(self, key, spans, offsets)
    ObjectStore.read_spans = counting
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in host.items()}
    for verify in (None, digests):
        read.clear()
        back = ck.restore(url, target, digests=verify)
        for k, v in host.items():
            assert back[k].sharding == shardings[k], k
            got, want = np.asarray(back[k]).reshape(-1), np.asarray(v).reshape(-1)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        data = sum(np.asarray(v).nbytes for v in host.values())
        # one call, each distinct box read once (verified: every leaf whole, for the digest)
        assert len(read) == 1 and read[0] == data, (read, data)
    print("ok")
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_restore_into_sharded_arrays_reads_only_their_boxes(kind, tmp_path, request):
    env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    if kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        env, url = dict(bucket.env, XLA_FLAGS=env["XLA_FLAGS"], JAX_PLATFORMS="cpu"), f"{bucket.url}/sharded.psk.d"
    else:
        url = "memory://sharded/ckpt.psk.d"
    result = run_python(SHARDED, url, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.subprocess
def test_restore_and_verify_from_gcs(gs_bucket, tmp_path):
    """gs:// through the GCS emulator, which takes reads but not the client's writes: the objects
    are uploaded through its own API, then restored, verified and checked as on S3."""
    tree = _tree()
    result = ck.save(tmp_path / "g.psk.d", tree, ck.SaveOptions(digest="xxh3_128"))
    gs_bucket.upload("run/g.psk.d", (tmp_path / "g.psk.d").read_bytes())
    gs_bucket.upload("run/g.layout.json", (tmp_path / "g.layout.json").read_bytes())
    url = f"{gs_bucket.url}/run/g.psk.d"
    _same({k: v for k, v in ck.restore(url, tree, digests=result.digests).items() if k != "lr"},
          {k: v for k, v in tree.items() if k != "lr"})
    assert ck.restore(url, as_numpy=True)["lr"] == 0.25
    ck.verify_file(url, result.digests)
    with raises("E9013", url):
        ck.verify_file(url, {"xxh3_128": "0" * 32})


def test_only_the_manager_makes_a_directory_and_only_for_a_local_place():
    """The one call in pskd_jax/checkpoint/ that makes a directory is the manager's, after the
    place was parsed (``CheckpointDirectory.of``: E9018 for a URL no store serves) and found local:
    no path from a URL reaches it."""
    import ast
    import pathlib

    import pskd_jax.checkpoint

    found = []
    for source in sorted(pathlib.Path(pskd_jax.checkpoint.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("makedirs", "mkdir", "mkdtemp"):
                found.append((source.name, node.lineno))
    assert [name for name, _ in found] == ["manager.py"], found
    text = (pathlib.Path(pskd_jax.checkpoint.__file__).parent / "manager.py").read_text()
    before = text[: text.index("os.makedirs")]
    assert "CheckpointDirectory.of(directory)" in before and "if not self._place.is_local:" in before


def test_a_save_states_its_size_so_that_its_upload_fits_the_parts(object_place, monkeypatch):
    """S3 takes at most 10000 parts an upload; a save knows its object's size and says it, so
    that the parts are made large enough (the bound is made 1 here: a save of more than one part
    that did not say its size would be E9018)."""
    from pskd_jax.storage import objects

    monkeypatch.setattr(objects, "MAX_PARTS", 1)
    url = _place(object_place, "big.psk.d")
    tree = {"w": np.arange(9 << 18, dtype=np.float32)}  # 9 MiB: two parts of 8 MiB
    ck.save(url, tree)
    assert np.array_equal(ck.restore(url, as_numpy=True)["w"], tree["w"])


def test_a_save_of_parts_never_puts_its_layout_over_another_object(object_place):
    """The save of a tree spread over JAX processes into a bucket (parts and a parts index; run
    here by one process) looks at its layout's key first, as a single save does: anything but
    this checkpoint's layout there is refused before anything is put, and left as it was; its own
    layout of the data replaced is replaced, or removed by a save that writes none."""
    url = _place(object_place, "parts.psk.d")
    store, where = resolve(url)
    beside = layout_path_for(where.key)
    notes = b'{"notes": "the user\'s own, at the name a layout would take"}'
    store.put(beside, notes)
    tree = {"w": np.arange(6, dtype=np.float32), "step": np.int64(4)}
    with raises("E9012", store.url(beside), "another object stands there"):
        ck.save_distributed(url, tree)
    assert store.get(beside)[0] == notes
    assert [o.key for o in store.list(where.parent().key)] == [beside]  # no part, no index
    store.delete(beside)
    ck.save_distributed(url, tree)
    assert store.info(beside) is not None
    ck.save_distributed(url, tree, ck.SaveOptions(layout_file=False))
    assert store.info(beside) is None  # its own layout, of the data replaced
    assert ck.restore(url, tree)["step"] == 4
