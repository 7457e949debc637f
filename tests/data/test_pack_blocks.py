"""pack reads its input in blocks of whole lines: memory follows a block, not the input, and what
it writes (and every error it names) does not depend on where the blocks fall."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import pskd_jax
from pskd_jax.data import pack
from pskd_jax.errors import PskdError

TYPE = "(idx[10][2], ℝ[])"


def pack_bytes(tmp_path, text: str | bytes, sample_type: str = TYPE, block: int | None = None, monkeypatch=None):
    """The packed file's bytes, or the error's (code, message)."""
    source = tmp_path / "values.txt"
    source.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    out = tmp_path / "out.psk.d"
    if block is not None:
        monkeypatch.setattr(pack, "BLOCK_BYTES", block)
    try:
        pack.pack_file(str(source), sample_type, str(out))
    except PskdError as e:
        assert not out.exists()
        return e.code, e.message
    finally:
        if block is not None:
            monkeypatch.undo()
    data = out.read_bytes()
    out.unlink()
    return data


MIXED = ("-- a comment\r\n1 2 0.5\r\n\r\n3 4 1e-3\n\x0b5 6 -2\x0c7 8 .25\r9 0 10\x1c1 1 3\x1d2 2 4\x1e"
         "3 3 5\x85 4 4 6\u2028 5 5 7\u00a0\n  6 6 8  \n-- end")


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7, 11, 64])
def test_blocks_of_any_size_pack_the_same_bytes(tmp_path, monkeypatch, block):
    """Every line break str.splitlines knows, comments, empty lines and padding, cut anywhere."""
    reference = pack_bytes(tmp_path, MIXED)
    assert isinstance(reference, bytes)
    assert pack_bytes(tmp_path, MIXED, block=block, monkeypatch=monkeypatch) == reference


def test_the_mixed_text_holds_the_samples_it_says(tmp_path):
    source = tmp_path / "values.txt"
    source.write_text(MIXED, encoding="utf-8")
    pack.pack_file(str(source), TYPE, str(tmp_path / "out.psk.d"))
    with pskd_jax.Reader(tmp_path / "out.psk.d") as reader:
        indices, reals = reader.gather(np.arange(len(reader)))
    assert indices.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 0], [1, 1], [2, 2], [3, 3], [4, 4], [5, 5],
                                [6, 6]]
    assert reals.tolist() == [0.5, 1e-3, -2, 0.25, 10, 3, 4, 5, 6, 7, 8]


ERRORS = {
    "too few": "1 2 0.5\n" * 5 + "1 2\n",
    "too many": "1 2 0.5\r\n" * 5 + "1 2 3 4\r\n",
    "bad real": "1 2 0.5\n" * 5 + "1 2 1_0\n",
    "index at bound": "1 2 0.5\n" * 5 + "1 10 0.5\n",
    "nul": "1 2 0.5\n" * 5 + "1 2 3\x00\n",
    "after other breaks": "1 2 0.5\r" * 5 + "1 2 x\n",
    "not utf-8": b"1 2 0.5\n" * 5 + b"1 2 \xff\n",
    "long real": "1 2 0.5\n" * 5 + "1 2 " + "1" * 300 + "_0\n",
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_an_error_names_the_same_line_and_value_whatever_the_blocks(tmp_path, monkeypatch, name):
    reference = pack_bytes(tmp_path, ERRORS[name])
    assert isinstance(reference, tuple) and reference[0] == "E9004", reference
    assert ":6: " in reference[1] or "byte 44" in reference[1], reference
    for block in (1, 3, 8, 9, 17, 1 << 16):
        assert pack_bytes(tmp_path, ERRORS[name], block=block, monkeypatch=monkeypatch) == reference, block


def test_a_line_longer_than_a_block_is_read_whole(tmp_path, monkeypatch):
    long_real = "0." + "1" * 5000
    text = "1 2 0.5\n" + f"3 4 {long_real}\n" + "5 6 1.5"
    reference = pack_bytes(tmp_path, text)
    assert pack_bytes(tmp_path, text, block=64, monkeypatch=monkeypatch) == reference
    source = tmp_path / "values.txt"
    source.write_text(text)
    pack.pack_file(str(source), TYPE, str(tmp_path / "out.psk.d"))
    with pskd_jax.Reader(tmp_path / "out.psk.d") as reader:
        assert float(reader.gather([1])[1][0]) == float(long_real)


def peak_of(tmp_path, text: str, sample_type: str) -> int:
    source = tmp_path / "values.txt"
    source.write_text(text)
    tracemalloc.start()
    try:
        try:
            pack.pack_file(str(source), sample_type, str(tmp_path / "out.psk.d"))
        except PskdError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("text, sample_type", [
    ("10\n", "ℝ[]"),  # one short value a line: Python objects per line would take 120 × the text
    ("10\n", "ℝ[1000]"),  # lines of one value for a wide type: refused at the first
    ("1 2 0.5\n", TYPE),
])
@pytest.mark.slow
def test_memory_follows_a_block_not_the_input(tmp_path, text, sample_type):
    pack_bytes(tmp_path, text * 10, sample_type)  # (imports and caches out of the way)
    small = peak_of(tmp_path, text * 30_000, sample_type)  # several blocks
    large = peak_of(tmp_path, text * 120_000, sample_type)
    assert large < 64 * pack.BLOCK_BYTES, (small, large)
    assert large < 1.25 * small + (1 << 20), (small, large)  # four times the input, not four times the memory


def test_a_long_real_among_many_short_ones_stays_in_proportion(tmp_path):
    """One value of 200000 digits among 50000 short lines: the block holding it is a table of
    Python strings, not a fixed-width table of 200000 characters a value."""
    text = "0." + "1" * 200_000 + "\n" + "0.5\n" * 50_000
    peak = peak_of(tmp_path, text, "ℝ[]")
    assert peak < 16 * len(text) + (4 << 20), peak
    with pskd_jax.Reader(tmp_path / "out.psk.d") as reader:
        assert len(reader) == 50_001 and float(reader.gather([0])[0]) == float("0." + "1" * 200_000)
