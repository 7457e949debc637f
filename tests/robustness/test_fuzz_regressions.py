"""Every input a fuzzer found a bug with (``fuzz/regressions/TARGET-NAME.bin``), replayed through its
target: the toolkit must now answer it with a ``PskdError`` or a result, and nothing else.

The targets are those of ``fuzz/targets.py`` (see ``fuzz/README.md``); a target also checks what it
can of an accepted input (a round trip, a re-read), so a wrong answer fails here too.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "fuzz"))

import targets

REGRESSIONS = sorted((ROOT / "fuzz" / "regressions").glob("*.bin"))
IN_A_WORKER = ("segments",)  # targets that run their input in a worker process (a crash of native code)


def target_of(path: pathlib.Path) -> str:
    """``pack-nul-token.bin`` → ``pack``: the longest target name the file name starts with."""
    names = [name for name in targets.TARGETS if path.name.startswith(name + "-")]
    assert names, f"{path.name}: the name starts with none of {sorted(targets.TARGETS)}"
    return max(names, key=len)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> targets.Scratch:
    return targets.Scratch(str(tmp_path_factory.mktemp("fuzz-scratch")))


def test_there_are_regressions():
    assert REGRESSIONS, "fuzz/regressions/ holds the inputs fuzzing found bugs with"


def _cases() -> list:
    return [pytest.param(path, marks=[pytest.mark.subprocess] if target_of(path) in IN_A_WORKER else [])
            for path in REGRESSIONS]


@pytest.mark.parametrize("path", _cases(), ids=lambda p: p.name)
def test_regression(scratch, path):
    targets.run_one(target_of(path), scratch, path.read_bytes())
