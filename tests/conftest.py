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

import os
import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

pytest.register_assert_rewrite("tests.helpers", "tests.format.golden", "tests.corpus.helpers",
                               "tests.checkpoint.helpers", "tests.data.files")

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "pskd_jax-hypothesis"))
