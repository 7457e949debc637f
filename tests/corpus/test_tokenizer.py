"""Tokenizers (pskd_jax.corpus.tokenizer): boundary, vocabulary size, sample type, JSON form."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.errors import PskdError


def test_tokenizers():
    assert (Tokenizer.bytes().boundary, Tokenizer.bytes().vocab_size, Tokenizer.bytes().dtype) == (256, 257, np.uint16)
    t = Tokenizer.chars(["\n", "a", "é"])
    assert (t.boundary, t.vocab_size, t.sample_type, t.dtype) == (3, 4, "idx[4][]", np.uint8)
    assert Tokenizer.from_json(t.to_json(), "m") == t
    with pytest.raises(PskdError, match="E9011.*2 characters"):
        Tokenizer.chars(["a", "bc"])
    with pytest.raises(PskdError, match="E9011.*repeats"):
        Tokenizer.chars(["a", "a"])
