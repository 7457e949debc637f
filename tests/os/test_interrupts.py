"""A Ctrl-C that a library swallowed (numpy's casts from text to numbers lose the KeyboardInterrupt
their signal handler raises) still stops a writer before it puts its output in place."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import pskd_jax
from pskd_jax._os import interrupts
from pskd_jax._os.atomic import atomic_output
from pskd_jax.format import Writer


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(interrupts, "_interrupted", False)
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def swallowed_ctrl_c() -> None:
    """A SIGINT whose KeyboardInterrupt is lost, as numpy loses it."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundaries
            pass
    except KeyboardInterrupt:
        pass


def test_a_swallowed_ctrl_c_leaves_the_destination_as_it_was(installed, tmp_path):
    out = tmp_path / "out.psk.d"
    pskd_jax.write(out, "ℝ[]", [1.0])
    before = out.read_bytes()
    writer = Writer(out, "ℝ[]")
    writer.append(np.array([2.0]))
    swallowed_ctrl_c()
    with pytest.raises(KeyboardInterrupt):
        writer.append(np.array([3.0]))  # between blocks: the writing stops
    with pytest.raises(KeyboardInterrupt):
        writer.close()
    with pytest.raises(KeyboardInterrupt), atomic_output(str(tmp_path / "text.json")) as f:
        f.write(b"{}")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.psk.d"]  # no temporary file left


def test_without_a_ctrl_c_nothing_changes(installed, tmp_path):
    interrupts.check()
    pskd_jax.write(tmp_path / "a.psk.d", "ℝ[]", [1.0])
    assert pskd_jax.Reader(tmp_path / "a.psk.d")[0] == 1.0


def test_a_handler_the_program_chose_is_kept(monkeypatch):
    monkeypatch.setattr(interrupts, "_interrupted", False)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
