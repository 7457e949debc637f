"""`rng`: a generator seeded the same for every test that asks for it; the GCS emulator's fixtures."""

from __future__ import annotations

import numpy as np
import pytest

from tests.objectstore import gs_bucket, gs_server  # noqa: F401 (fixtures)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
