"""``pskd verify`` and ``pskd convert`` run as a user runs them."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.digests import file_digest, file_sha256
from pskd_jax.checkpoint import CheckpointManager, SaveOptions, read_index
from pskd_jax.checkpoint.index import INDEX
from tests.helpers import pskd
from tests.helpers import pskd_fails as fails

pytestmark = pytest.mark.subprocess


@pytest.mark.slow
def test_verify_a_directory_a_step_and_a_file(tmp_path):
    manager = CheckpointManager(tmp_path / "run")
    for step in (1, 2):
        manager.save(step, {"w": np.full(64, step, np.float32)})
    result = pskd("verify", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    entry = read_index(str(tmp_path / "run"))[0]  # (its line ends with when it was written)
    assert lines[0] == f"pskd: ok step 1 step-00000001.psk.d xxh3_128 {file_digest(manager.path(1), 'xxh3_128')} " \
        f"(started {entry.started}, committed {entry.committed})"
    assert lines[-1] == f"pskd: 2 checkpoints verified in {tmp_path / 'run'}"
    assert pskd("verify", tmp_path / "run", "--step", "2").returncode == 0
    one = pskd("verify", manager.path(2))
    assert one.returncode == 0
    assert one.stdout == f"pskd: ok {manager.path(2)} xxh3_128 {file_digest(manager.path(2))}\n"
    # a flipped byte
    path = pathlib.Path(manager.path(2))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80
    path.write_bytes(bytes(data))
    message = fails("E9013", "verify", tmp_path / "run")
    assert "step-00000002.psk.d" in message
    assert "xxh3_128" in message
    fails("E9013", "verify", path)
    assert pskd("verify", tmp_path / "run", "--step", "1").returncode == 0
    fails("E9014", "verify", tmp_path / "run", "--step", "9")


@pytest.mark.slow
def test_verify_a_lone_file(tmp_path):
    result = ck.save(tmp_path / "c.psk.d", {"w": np.ones(3)}, SaveOptions(digest="xxh3_128"))
    sha = file_sha256(tmp_path / "c.psk.d")
    plain = pskd("verify", tmp_path / "c.psk.d")
    assert plain.returncode == 0 and "no recorded digest" in plain.stdout
    assert plain.stdout.startswith(f"pskd: {tmp_path / 'c.psk.d'}: xxh3_128 {result.digests['xxh3_128']} sha256 {sha} ")
    given = pskd("verify", tmp_path / "c.psk.d", "--xxh3-128", result.digests["xxh3_128"])
    xxh = result.digests["xxh3_128"]
    assert given.returncode == 0 and given.stdout == f"pskd: ok {tmp_path / 'c.psk.d'} xxh3_128 {xxh}\n"
    given = pskd("verify", tmp_path / "c.psk.d", "--sha256", sha.upper())
    assert given.returncode == 0 and given.stdout == f"pskd: ok {tmp_path / 'c.psk.d'} sha256 {sha}\n"
    both = pskd("verify", tmp_path / "c.psk.d", "--sha256", sha, "--xxh3-128", result.digests["xxh3_128"])
    assert both.returncode == 0
    assert both.stdout == f"pskd: ok {tmp_path / 'c.psk.d'} xxh3_128 {result.digests['xxh3_128']} sha256 {sha}\n"
    fails("E9013", "verify", tmp_path / "c.psk.d", "--sha256", "0" * 32)
    assert "xxh3_128" in fails("E9013", "verify", tmp_path / "c.psk.d", "--xxh3-128", "0" * 32)
    fails("E9012", "verify", tmp_path, "--xxh3-128", result.digests["xxh3_128"])


@pytest.mark.slow
def test_verify_a_directory_whose_index_records_sha256(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"w": np.full(64, 1, np.float32)})
    sha = file_sha256(tmp_path / "step-00000001.psk.d")
    entry = {"step": 1, "file": "step-00000001.psk.d", "sha256": sha}  # as versions before xxh3_128 wrote it
    (tmp_path / INDEX).write_text(json.dumps({"format": "pskd-checkpoints", "version": 1, "checkpoints": [entry]}))
    result = pskd("verify", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"pskd: ok step 1 step-00000001.psk.d sha256 {sha}"
    one = pskd("verify", tmp_path / "step-00000001.psk.d")
    assert one.returncode == 0 and one.stdout.endswith(f" sha256 {sha}\n")
    path = tmp_path / "step-00000001.psk.d"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x02
    path.write_bytes(bytes(data))
    message = fails("E9013", "verify", tmp_path)
    assert "step-00000001.psk.d" in message and "sha256" in message


@pytest.mark.slow
def test_convert_both_ways(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import ml_dtypes

    tensors = {"emb.w": np.arange(6, dtype=np.float32).reshape(2, 3), "h.0": np.ones(2, ml_dtypes.bfloat16)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "m.safetensors"))
    result = pskd("convert", tmp_path / "m.safetensors", "-o", tmp_path / "m.psk.d")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"pskd: wrote {tmp_path / 'm.psk.d'} (2 leaves of type params Params")
    info = pskd("info", tmp_path / "m.psk.d")
    assert info.returncode == 0 and "type    params Params" in info.stdout
    back = pskd("convert", tmp_path / "m.psk.d", "-o", tmp_path / "b.safetensors", "--layout",
                tmp_path / "m.layout.json")
    assert back.returncode == 0, back.stderr
    loaded = safetensors_numpy.load_file(str(tmp_path / "b.safetensors"))
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name].view(np.uint8), value.view(np.uint8))
    fails("E9012", "convert", tmp_path / "m.psk.d", "-o", tmp_path / "x.json")
    fails("E9002", "convert", tmp_path / "m.layout.json.safetensors", "-o", tmp_path / "y.psk.d")


def test_convert_names_an_integer_tensors_encoding_idx(tmp_path):
    from safetensors import numpy as safetensors_numpy

    tensors = {"w": np.ones(2, np.float32), "step": np.array([3], np.int32)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "m.safetensors"))
    result = pskd("convert", tmp_path / "m.safetensors", "-o", tmp_path / "m.psk.d")
    assert result.returncode == 0, result.stderr
    assert ", encodings f32 idx, " in result.stdout  # (the int32 leaf's encoding byte 0 is no f64)


@pytest.mark.slow
def test_info_diff_export_find_the_layout_written_beside_a_checkpoint(tmp_path):
    import json as json_lib

    import pskd_jax

    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(7)}
    pskd_jax.save(a, tree)
    pskd_jax.save(b, {"w": tree["w"] + 1, "step": np.int32(8)})
    run = pskd
    info = run("info", a, "--values")  # (a checkpoint lists its leaves; values on request)
    assert info.returncode == 0, info.stderr
    assert "[0] {'w': [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], 'step': 7}" in info.stdout
    diff = run("diff", a, b)
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.startswith(f"‖a − b‖₂ = {6 ** 0.5!r}")
    out = tmp_path / "a.json"
    assert run("export", a, "-o", out).returncode == 0
    assert json_lib.loads(out.read_text())["samples"] == [{"w": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "step": 7}]
