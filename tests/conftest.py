"""Shared test set-up.

- What several test files need lives once, in ``tests/helpers.py`` (paths, ``pskd`` and
  ``train_lm`` run as a user runs them, the environment of those processes, error-code checks):
  ``from tests.helpers import pskd_ok, raises``. Its asserts, and those of the folders' own helper
  modules, are rewritten by pytest like a test's, so a failing check shows its values.
- Markers (declared in pyproject.toml): ``slow`` for tests of more than a few seconds,
  ``subprocess`` for tests that start processes; ``pytest -m "not slow"`` is the inner loop.
- Tests write nothing into the working directory: Hypothesis keeps its example database and
  caches under ``.hypothesis/`` in the current directory unless told otherwise, so it is pointed at
  a directory of its own under the system's temporary directory.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import os
import subprocess
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

pytest.register_assert_rewrite("tests.helpers", "tests.format.golden", "tests.corpus.helpers",
                               "tests.checkpoint.helpers", "tests.data.files")

# (after the rewrite is registered; fixtures for every folder)
from tests.objectstore import any_place, fault_proxy, faulty_bucket, object_place, s3_bucket, s3_server  # noqa: E402, F401

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "pskd_jax-hypothesis"))


# --------------------------------------------------------------------------------------------
# The ``subprocess`` marker is kept honest: a test that starts a process (through subprocess,
# multiprocessing, concurrent.futures or os.fork, in its set-up or its body) and is not marked
# fails, so that ``pytest -m "not subprocess"`` runs in this interpreter alone.

_STARTED: list[str] = []


def _recording(function, what: str):
    @functools.wraps(function)
    def started(*args, **kwargs):
        _STARTED.append(what)
        return function(*args, **kwargs)

    return started


def pytest_configure(config) -> None:
    for owner, name in ((os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp"), (subprocess, "_fork_exec"),
                        (_posixsubprocess, "fork_exec")):
        if getattr(owner, name, None) is not None:
            setattr(owner, name, _recording(getattr(owner, name), f"{owner.__name__}.{name}"))


def _check_processes(item) -> None:
    started, _STARTED[:] = sorted(set(_STARTED)), []
    if started and item.get_closest_marker("subprocess") is None:
        raise AssertionError(f"{item.nodeid} starts processes ({', '.join(started)}) but is not marked "
                             "@pytest.mark.subprocess")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _STARTED.clear()
    result = yield
    _check_processes(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _STARTED.clear()
    result = yield
    _check_processes(item)
    return result
