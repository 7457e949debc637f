"""The storage tests' own fixtures (kept out of the root conftest, which every folder loads): the
fault proxy in front of the S3 server and a bucket behind it, and the GCS emulator."""

from tests.objectstore import fault_proxy, faulty_bucket, gs_bucket, gs_server  # noqa: F401 (fixtures)
