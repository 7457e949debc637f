"""Partial restore: the key paths a target names, and only their bytes read."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions, restoring
from pskd_jax.errors import PskdError


def train_state():
    return {"params": {"w": np.arange(1000, dtype=np.float32).reshape(10, 100), "b": np.ones(100, np.float32)},
            "opt": {"mu": np.zeros((10, 100), np.float32), "nu": np.zeros((10, 100), np.float32),
                    "count": np.int32(-3)},
            "step": 12}


@pytest.fixture
def counted_reads(monkeypatch):
    """The bytes every positional read of a restore asks for."""
    sizes: list[int] = []
    real = restoring.read_into

    def counting(fd, view, offset, path):
        sizes.append(len(view))
        return real(fd, view, offset, path)

    monkeypatch.setattr(restoring, "read_into", counting)
    return sizes


def test_partial_restores_the_subset_the_target_names(tmp_path):
    ck.save(tmp_path / "c.psk.d", train_state())
    back = ck.restore(tmp_path / "c.psk.d", {"params": {"b": np.zeros(100, np.float32), "w": np.zeros((10, 100),
                                                                                                   np.float32)}},
                      partial=True, as_numpy=True)
    assert list(back) == ["params"] and list(back["params"]) == ["b", "w"]
    np.testing.assert_array_equal(back["params"]["w"], train_state()["params"]["w"])
    one = ck.restore(tmp_path / "c.psk.d", {"opt": {"count": np.int32(0)}, "step": 0}, partial=True)
    assert int(one["opt"]["count"]) == -3 and one["step"] == 12 and type(one["step"]) is int


def test_partial_reads_only_the_bytes_of_the_leaves_asked_for(tmp_path, counted_reads):
    ck.save(tmp_path / "c.psk.d", train_state())
    header = len(ck.plan(train_state()).header)
    ck.restore(tmp_path / "c.psk.d", {"params": {"b": np.zeros(100, np.float32)}}, partial=True, as_numpy=True)
    assert sum(counted_reads) == header + 400  # the header, and b's 100 float32
    counted_reads.clear()
    ck.restore(tmp_path / "c.psk.d", {"opt": {"count": np.int32(0)}}, partial=True, as_numpy=True)
    assert sum(counted_reads) == header + 4


def test_partial_restore_does_not_read_a_damaged_leaf_it_does_not_ask_for(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(3, np.float32), "mask": np.array([True, False])})
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-1] = 9  # mask[1] is no longer a bool
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    assert ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(3, np.float32)}, partial=True)["w"].tolist() == [1, 1, 1]
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9004" and "['mask'] at index [1]" in e.value.message


def test_a_verified_partial_restore_hashes_the_whole_file(tmp_path):
    result = ck.save(tmp_path / "c.psk.d", train_state(), SaveOptions(digest="xxh3_128"))
    back = ck.restore(tmp_path / "c.psk.d", {"opt": {"nu": np.ones((10, 100), np.float32)}}, partial=True,
                      as_numpy=True, digests=result.digests)
    assert back["opt"]["nu"].sum() == 0
    data = bytearray((tmp_path / "c.psk.d").read_bytes())
    data[-1000] ^= 1  # in a leaf not asked for
    (tmp_path / "c.psk.d").write_bytes(bytes(data))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"opt": {"nu": np.ones((10, 100), np.float32)}}, partial=True,
                   as_numpy=True, digests=result.digests)
    assert e.value.code == "E9013"


def test_partial_still_names_what_the_checkpoint_lacks(tmp_path):
    ck.save(tmp_path / "c.psk.d", train_state())
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"params": {"kernel": np.zeros(3)}}, partial=True)
    assert e.value.code == "E9005" and "['params']['kernel']" in e.value.message
    assert "not in the checkpoint" in e.value.message
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", partial=True)
    assert e.value.code == "E9012"
