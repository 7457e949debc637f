"""The storage tests' own fixtures (kept out of the root conftest, which every folder loads): the
GCS emulator. (The fault proxy and its bucket are the root conftest's: the corpus tests use them too.)"""

from tests.objectstore import gs_bucket, gs_server  # noqa: F401 (fixtures)
