"""`built`: a corpus of five shards from five inputs, built afresh for each test that asks for it."""

from __future__ import annotations

import pytest

from pskd_jax.corpus.build import build_corpus
from pskd_jax.corpus.options import BuildOptions

from .helpers import make_inputs


@pytest.fixture()
def built(tmp_path):
    inputs = make_inputs(tmp_path)
    build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))
    return tmp_path / "c" / "shards.json"
