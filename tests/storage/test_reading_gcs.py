"""Reading ``.psk.d`` files and corpora from gs:// through the GCS emulator (fake-gcs-server, the
test extra's; skipped where it is not installed): objects are written through the emulator's own
API (it does not take the client's writes, see ``docs/storage.md``), then read by the toolkit
by byte ranges, through the same code as on S3."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax.corpus import BuildOptions, CorpusWindows
from pskd_jax.format import Reader, write
from tests.corpus.helpers import make_inputs
from tests.helpers import raises

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # (the emulator is a process of its own)


def test_a_reader_and_windows_over_gs(gs_bucket, tmp_path):
    path = str(tmp_path / "w.psk.d")
    rng = np.random.default_rng(2)
    data = (rng.integers(0, 500, (40, 6)), rng.standard_normal(40))
    write(path, "(idx[500][seq: 6], ℝ[])", data)
    with open(path, "rb") as f:
        gs_bucket.upload("d/w.psk.d", f.read())
    with Reader(f"{gs_bucket.url}/d/w.psk.d") as reader, Reader(path) as local:
        for got, want in zip(reader.gather([3, 4, 5, 39, 0]), local.gather([3, 4, 5, 39, 0])):
            np.testing.assert_array_equal(got, want)

    (tmp_path / "in").mkdir()
    inputs = [str(p) for p in make_inputs(tmp_path / "in")]
    corpus.build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))
    for name in os.listdir(tmp_path / "c"):
        if name.endswith((".psk.d", ".json")):
            gs_bucket.upload(f"c/{name}", (tmp_path / "c" / name).read_bytes())
    url = f"{gs_bucket.url}/c/shards.json"
    assert corpus.verify_corpus(url).shards == 5
    with CorpusWindows(url, seq=8) as there, CorpusWindows(tmp_path / "c" / "shards.json", seq=8) as here, \
            CorpusWindows(url, seq=8, cache_dir=tmp_path / "cache") as cached:
        batch = np.random.default_rng(4).integers(0, len(here), 32)
        for a, b, c in zip(there.gather(batch), here.gather(batch), cached.gather(batch)):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(c, b)
    with raises("E9016", "no such object"):
        CorpusWindows(f"{gs_bucket.url}/none/shards.json", seq=8)
