"""Read-only maps that need no descriptor kept (pskd_jax._os.maps) and the budget of descriptors
their owners may keep (pskd_jax.format.byte_sources.MappedFile)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from pskd_jax._os.maps import KEPT_DESCRIPTORS, map_read_only
from pskd_jax.format.byte_sources import MappedFile


def test_a_map_outlives_its_descriptor_and_stays_read_only(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 16)
    fd = os.open(path, os.O_RDONLY)
    mapped = map_read_only(fd, 4096)
    os.close(fd)
    assert mapped[:4].tolist() == [0, 1, 2, 3] and mapped[-1] == 255
    with pytest.raises(ValueError):
        mapped.flags.writeable = True  # (PROT_READ: a write would kill the process)
    view = mapped[10:20]
    del mapped
    gc.collect()
    assert view.tolist() == list(range(10, 20))  # (unmapped only with its last view)


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("closed", [True, False])
def test_a_mapped_file_gives_its_descriptor_back_closed_or_collected(tmp_path, closed):
    path = tmp_path / "f.bin"
    path.write_bytes(np.arange(1024, dtype=np.uint32).tobytes())
    held, opened = KEPT_DESCRIPTORS.held, descriptors()
    source = MappedFile(str(path), os.open(path, os.O_RDONLY), 4096)
    assert source.fd is not None and KEPT_DESCRIPTORS.held == held + 1 and descriptors() == opened + 1
    assert source.size() == 4096
    if closed:
        source.close()
    del source
    gc.collect()
    assert KEPT_DESCRIPTORS.held == held and descriptors() == opened


def test_beyond_the_budget_a_mapped_file_keeps_no_descriptor(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 4096)
    monkeypatch.setattr(KEPT_DESCRIPTORS, "_limit", lambda: KEPT_DESCRIPTORS.held)
    opened = descriptors()
    source = MappedFile(str(path), os.open(path, os.O_RDONLY), 4096)
    assert source.fd is None and descriptors() == opened
    os.truncate(path, 100)  # (cut short in place: its path still names the mapped file)
    assert source.size() == 100
    source.close()
