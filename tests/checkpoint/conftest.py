"""`rng`: a generator seeded the same for every test that asks for it."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
