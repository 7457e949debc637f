"""BuildOptions (pskd_jax.corpus.options): one value for every build setting, checked once, with
refusals that name the parameter; what the manifest records comes from it."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pskd_jax import corpus
from pskd_jax.corpus.build import build_corpus
from pskd_jax.corpus.manifest import BUILD_KEYS, MAX_COUNT
from pskd_jax.corpus.options import BuildOptions
from pskd_jax.corpus.shard_writer import DEFAULT_CHUNK_TOKENS
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import UsageError

from .helpers import jsonl


def test_the_defaults_and_what_the_manifest_records():
    options = BuildOptions()
    assert (options.tokenizer, options.chunk_tokens, options.workers, options.durable) == \
        (Tokenizer.bytes(), DEFAULT_CHUNK_TOKENS, 1, True)
    assert options.recorded() == {"text_key": "text", "max_document_tokens": None, "skip_bad": False}
    assert list(options.recorded()) == list(BUILD_KEYS)  # the manifest's order
    assert set(BUILD_KEYS) <= {f.name for f in dataclasses.fields(BuildOptions)}


@pytest.mark.parametrize("changes, message", [
    ({"workers": 0}, "workers=0: expected an integer >= 1"),
    ({"workers": True}, "workers=True: expected an integer >= 1"),
    ({"workers": 2.0}, "workers=2.0: expected an integer >= 1"),
    ({"chunk_tokens": 0}, "chunk_tokens=0: expected an integer >= 1"),
    ({"chunk_tokens": "8"}, "chunk_tokens='8': expected an integer >= 1"),
    ({"max_document_tokens": 0}, "max_document_tokens=0: expected an integer >= 1, or None"),
    ({"max_document_tokens": -3}, "max_document_tokens=-3: expected an integer >= 1, or None"),
    ({"max_document_tokens": False}, "max_document_tokens=False: expected an integer >= 1, or None"),
    ({"max_document_tokens": MAX_COUNT + 1},
     f"max_document_tokens={MAX_COUNT + 1}: expected an integer from 1 to {MAX_COUNT}"),
    ({"text_key": ""}, "text_key='': expected a non-empty string"),
    ({"text_key": 5}, "text_key=5: expected a non-empty string"),
    ({"skip_bad": 1}, "skip_bad=1: expected True or False"),
    ({"durable": "yes"}, "durable='yes': expected True or False"),
    ({"tokenizer": "bytes"}, "tokenizer='bytes': expected a Tokenizer"),
])
def test_a_bad_setting_is_e9012_naming_the_parameter(changes, message):
    with pytest.raises(UsageError, match="^E9012: " + message.replace("(", r"\(").replace(")", r"\)")):
        BuildOptions(**changes)
    with pytest.raises(UsageError, match="E9012"):  # a changed copy is checked as a new value is
        BuildOptions().replace(**changes)


def test_numpy_values_become_plain_python_values():
    options = BuildOptions(max_document_tokens=np.int64(7), workers=np.uint8(2), chunk_tokens=np.int32(9),
                           skip_bad=np.bool_(True))
    assert (options.max_document_tokens, options.workers, options.chunk_tokens, options.skip_bad) == (7, 2, 9, True)
    assert all(type(v) in (int, bool) for v in (options.max_document_tokens, options.workers, options.chunk_tokens,
                                                 options.skip_bad))
    recorded = json.loads(json.dumps(options.recorded()))
    assert recorded == {"text_key": "text", "max_document_tokens": 7, "skip_bad": True}


def test_it_is_a_frozen_value_that_pickles_for_the_workers():
    options = BuildOptions(tokenizer=Tokenizer.chars(["a", "b"]), max_document_tokens=3, workers=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.replace(workers=1) == BuildOptions(tokenizer=Tokenizer.chars(["a", "b"]), max_document_tokens=3)
    assert options.replace(workers=1).recorded() == options.recorded()  # workers decide no byte


@given(st.integers(min_value=1, max_value=1 << 70))
def test_any_positive_count_of_workers_is_kept_as_given(n):
    assert BuildOptions(workers=n).workers == n


@given(st.integers(max_value=0))
def test_no_count_below_one_is_taken(n):
    with pytest.raises(UsageError, match=f"chunk_tokens={n}: expected"):
        BuildOptions(chunk_tokens=n)


def test_the_manifest_records_the_options_it_was_built_with(tmp_path):
    source = jsonl(tmp_path / "a.jsonl", ["hello", "world!"], key="body")
    options = BuildOptions(text_key="body", max_document_tokens=np.int64(3), durable=False)
    built = build_corpus([source], tmp_path / "c", options)
    assert built.manifest.build == options.recorded() == {"text_key": "body", "max_document_tokens": 3,
                                                          "skip_bad": False}
    assert corpus.read_manifest(tmp_path / "c" / "shards.json").build == options.recorded()
    assert built.manifest.tokens == 8  # "hel", "wor", a boundary after each
    # Options that change no byte keep every shard; one that does rebuilds it.
    assert build_corpus([source], tmp_path / "c", options.replace(workers=2, chunk_tokens=1)).kept == 1
    assert build_corpus([source], tmp_path / "c", options.replace(max_document_tokens=4)).built == 1


def test_every_engine_refuses_what_is_not_build_options(tmp_path):
    source = jsonl(tmp_path / "a.jsonl", ["x"])
    for call in (lambda: build_corpus([source], tmp_path / "c", {"workers": 2}),
                 lambda: corpus.build_shard(str(source), str(tmp_path / "s.psk.d"), Tokenizer.bytes())):
        with pytest.raises(UsageError, match=r"E9012: options=.*: expected a BuildOptions"):
            call()
    assert not (tmp_path / "c").exists() and not (tmp_path / "s.psk.d").exists()
    assert BuildOptions.checked(None) == BuildOptions()
