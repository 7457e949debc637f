"""Shared test set-up: tests write nothing into the working directory.

Hypothesis keeps its example database and caches under ``.hypothesis/`` in the current directory
unless told otherwise; point it at a directory of its own under the system's temporary directory.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "pskd_jax-hypothesis"))
