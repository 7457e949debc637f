"""A real S3-protocol server on the loopback interface for the tests, and the places a suite runs
over (a local directory, ``memory://``, a bucket of that server).

The server is moto's (``moto[server]``, in the test extra), started once per session on
127.0.0.1 with an ephemeral port and stopped at the end; each test that asks for a bucket gets a
new one. Before any test uses it, the fixture checks that the server refuses a losing conditional
put with 412 (what the toolkit's index commits rely on): a server that does not would make every
race test meaningless. The environment the toolkit reads (``AWS_ENDPOINT_URL``, keys, region,
``AWS_ALLOW_HTTP``) is set for the test's own process (``monkeypatch``) and handed to processes the
test starts through :attr:`Bucket.env`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import urllib.request
import uuid

import pytest

from tests.helpers import ENV

__all__ = ["Bucket", "S3Server", "any_place", "s3_bucket", "s3_server"]

_BUCKETS = itertools.count()
KEYS = {"AWS_ACCESS_KEY_ID": "pskdtestkey", "AWS_SECRET_ACCESS_KEY": "pskdtestsecretvalue", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
_CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT", "AWS_DEFAULT_REGION")


@dataclasses.dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT

    @property
    def environment(self) -> dict[str, str]:
        return {**KEYS, "AWS_ENDPOINT_URL": self.endpoint}

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200, answer.status


@dataclasses.dataclass(frozen=True)
class Bucket:
    """A new bucket of the test server: ``url`` (``s3://NAME``), and ``env``, the environment of a
    process that should reach it (the tests' :data:`tests.helpers.ENV` plus the server's)."""

    server: S3Server
    name: str

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in ENV.items() if k not in _CLEARED}
        return {**env, **self.server.environment}


def _check_conditional_puts(server: S3Server) -> None:
    """The server must answer a losing conditional put with 412, through the toolkit's client."""
    import obstore
    from obstore.store import S3Store

    name = "pskd-fixture-check"
    server.create_bucket(name)
    store = S3Store(name, config={"endpoint": server.endpoint, "access_key_id": KEYS["AWS_ACCESS_KEY_ID"],
                                  "secret_access_key": KEYS["AWS_SECRET_ACCESS_KEY"], "region": KEYS["AWS_REGION"]},
                    client_options={"allow_http": True})
    obstore.put(store, "k", b"first", mode="create")
    with pytest.raises(obstore.exceptions.AlreadyExistsError) as lost:
        obstore.put(store, "k", b"second", mode="create")
    assert "412" in str(lost.value), f"the S3 server did not answer a losing conditional put with 412: {lost.value}"
    assert bytes(obstore.get(store, "k").bytes()) == b"first"


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line a request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        found = S3Server(f"http://{host}:{port}")
        _check_conditional_puts(found)
        yield found
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A new, empty bucket, with this process's environment pointing at the server."""
    name = f"pskd-{next(_BUCKETS)}-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(name)
    for variable in _CLEARED:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in s3_server.environment.items():
        monkeypatch.setenv(variable, value)
    return Bucket(s3_server, name)


@pytest.fixture(params=["local", "memory", "s3"])
def any_place(request: pytest.FixtureRequest, tmp_path) -> str:
    """A place to write under, once for each kind: a local directory, a ``memory://`` store, a
    bucket of the S3 server (each new for the test)."""
    if request.param == "local":
        return str(tmp_path)
    if request.param == "memory":
        return f"memory://test-{uuid.uuid4().hex[:12]}"
    return request.getfixturevalue("s3_bucket").url

