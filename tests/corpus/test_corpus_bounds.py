"""Windows never hand a model a token at or above the vocabulary size: a gathered window holding
one is E9004 naming the shard and the token's position in it, as ``Reader.gather`` does; with
segments as well (their scan makes the inputs' check), with each scan the install has."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np
import pytest

from pskd_jax import corpus
from pskd_jax.corpus import segments as segments_module
from pskd_jax.corpus.manifest import Shard
from pskd_jax.corpus.shard_writer import ShardWriter
from pskd_jax.corpus.tokenizer import Tokenizer
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError

B = 256


def damaged_corpus(d: pathlib.Path, pieces, bad: tuple[int, int, int], tokenizer=Tokenizer.bytes()) -> pathlib.Path:
    """Shards of ``pieces``; then token ``bad[1]`` of shard ``bad[0]`` overwritten with ``bad[2]``
    (the manifest records the damaged bytes' sha256, so only the bound can tell)."""
    d.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, tokens in enumerate(pieces):
        path = d / f"s{i}.psk.d"
        w = ShardWriter(str(path), tokenizer, durable=False)
        w.append(np.asarray(tokens, tokenizer.dtype))
        w.close()
        if i == bad[0]:
            data = bytearray(path.read_bytes())
            item = tokenizer.dtype.itemsize
            at = len(tokenizer.header(0)) + bad[1] * item
            data[at : at + item] = int(bad[2]).to_bytes(item, "little")
            path.write_bytes(bytes(data))
        shards.append(Shard(path.name, len(tokens), 0, hashlib.sha256(path.read_bytes()).hexdigest()))
    return pathlib.Path(corpus.write_manifest(d / "shards.json", tokenizer, shards).path)


PIECES = [list(range(10, 40)), list(range(50, 70)), list(range(100, 140))]
# Windows without segments and with them, by numpy's copies and passes and (where the install
# built it) by the compiled gather and scan (see test_segments.py).
KINDS = ["plain numpy", "segments numpy"] + ([] if segments_module._native is None else
                                             ["plain compiled", "segments compiled"])


@pytest.fixture(params=KINDS)
def kind(request, monkeypatch):
    """The CorpusWindows keywords of each kind, the compiled passes set for the test's length."""
    if request.param.endswith("numpy"):
        monkeypatch.setattr(segments_module, "_native", None)
    return {"segments": request.param.startswith("segments")}


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_a_gathered_token_at_or_above_the_vocabulary_is_e9004_naming_shard_and_position(tmp_path, access, kind):
    m = damaged_corpus(tmp_path / "c", PIECES, (1, 6, 300))  # stream position 30 + 6 = 36
    with CorpusWindows(m, seq=4, stride=2, access=access, **kind) as w:
        assert len(w) == (90 - 5) // 2 + 1
        clean = [i for i in range(len(w)) if not 2 * i <= 36 <= 2 * i + 4]
        w.gather(clean)  # windows that do not hold the token: served
        pattern = r"E9004: .*shards.json: shard 1 s1.psk.d: token 6 is 300, not below the vocabulary size 257"
        for index in (18, 17, 16):  # 36 as input (18: its first token; 17: its third), and 16's last target
            with pytest.raises(PskdError, match=pattern):
                w.gather([0, index, 1])
            with pytest.raises(PskdError, match=pattern):
                w[index]
        with pytest.raises(PskdError, match=pattern):
            w.stream(30, 40)
        np.testing.assert_array_equal(w.stream(0, 36), np.concatenate([PIECES[0], PIECES[1][:6]]))


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_a_bad_token_in_a_window_that_crosses_shards(tmp_path, access, kind):
    m = damaged_corpus(tmp_path / "c", PIECES, (1, 0, 65535))
    with CorpusWindows(m, seq=8, stride=1, access=access, **kind) as w:
        with pytest.raises(PskdError, match=r"E9004: .*shard 1 s1.psk.d: token 0 is 65535"):
            w.gather([25])  # tokens 25..33: shard 0's last five, shard 1's first four


def test_a_vocabulary_that_fills_its_dtype_needs_no_check(tmp_path, kind):
    t = Tokenizer.chars([chr(0x100 + i) for i in range(255)])  # V = 256 in u8: every byte is a token
    m = damaged_corpus(tmp_path / "c", [list(range(200)), list(range(50, 255))], (0, 3, 255), t)
    with CorpusWindows(m, seq=4, **kind) as w:
        inputs, *_ = w.gather([0])
        assert inputs[0].tolist() == [0, 1, 2, 255]  # 255 is the boundary: in range


def test_a_small_vocabulary_in_u8_is_checked(tmp_path, kind):
    t = Tokenizer.chars(["a", "b", "c"])  # V = 4
    m = damaged_corpus(tmp_path / "c", [[0, 1, 3, 2, 3], [0, 3]], (0, 1, 4), t)
    with CorpusWindows(m, seq=2, **kind) as w:
        with pytest.raises(PskdError,
                           match=r"E9004: .*shard 0 s0.psk.d: token 1 is 4, not below the vocabulary size 4"):
            w.gather([0])
        w.gather([1, 2])
