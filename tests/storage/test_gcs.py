"""gs:// through the client's GCS store.

- Against fake-gcs-server (the test extra's emulator, on loopback): everything the emulator
  serves of the client's protocol — reads whole, by ranges, in parts and as a stream, looks,
  listings, deletes — with objects written through the emulator's own API. The emulator does not
  take the client's writes (XML-API PUTs and multipart uploads); a test says so, so that the day
  it does, the whole store suite can run over gs:// (``any_place``).
- Against a small recording GCS stub on loopback: the requests the client's writes make — plain,
  "only if absent" (``x-goog-if-generation-match: 0``) and "only if still the generation read" —
  and that none of them asks a metadata server for a token; and, with the fault proxy in front of
  the stub, that a conditional put whose answer was lost is reported done on GCS as on S3.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.server
import socketserver
import threading
import urllib.parse

import numpy as np
import pytest

from pskd_jax.errors import StorageError, TruncatedError
from pskd_jax.storage import CREATE, Conflict, ObjectStore, StorageOptions, Version, read_all
from tests.faultproxy import FaultProxy, Rule, lost_answer
from tests.helpers import assert_code

OPTIONS = StorageOptions(retries=2, backoff_seconds=0.001, part_bytes=1 << 16, concurrency=4)
PAYLOAD = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()


# -- against the emulator (a process of its own: the tests are marked so) -------------------------------------

@pytest.fixture
def gs_store(gs_bucket) -> ObjectStore:
    return ObjectStore("gs", gs_bucket.name, OPTIONS)


@pytest.mark.subprocess
def test_reads_of_every_kind(gs_bucket, gs_store):
    gs_bucket.upload("dir/a.bin", PAYLOAD)
    data, info = gs_store.get("dir/a.bin")
    assert data == PAYLOAD and info.size == len(PAYLOAD) and info.tag
    got = gs_store.read_ranges("dir/a.bin", [0, 1000, 299_990], [10, 5000, 300_000])
    assert [bytes(g) for g in got] == [PAYLOAD[:10], PAYLOAD[1000:5000], PAYLOAD[299_990:]]
    out = np.empty(len(PAYLOAD) - 11, np.uint8)
    gs_store.read_into("dir/a.bin", 11, memoryview(out))  # five parts of 64 KiB, concurrently
    assert out.tobytes() == PAYLOAD[11:]
    assert read_all(gs_store, "dir/a.bin", len(PAYLOAD)).tobytes() == PAYLOAD
    assert b"".join(bytes(c) for c in gs_store.chunks("dir/a.bin", 1 << 15)) == PAYLOAD


@pytest.mark.subprocess
def test_a_tag_is_the_same_however_the_object_is_seen(gs_bucket, gs_store):
    """The emulator quotes ETags in its heads and not in its listings (GCS's own answers differ
    too): the store's tags are unquoted, so a listing and a look agree."""
    gs_bucket.upload("dir/a.bin", b"one")
    gs_bucket.upload("dir/b.bin", b"two")
    listed = gs_store.list("dir")
    assert [o.key for o in listed] == ["dir/a.bin", "dir/b.bin"] and [o.size for o in listed] == [3, 3]
    for seen in listed:
        assert gs_store.info(seen.key).tag == seen.tag == gs_store.get(seen.key)[1].tag
        assert '"' not in seen.tag
    assert gs_store.list("elsewhere") == []


@pytest.mark.subprocess
def test_missing_and_short_reads_are_e9003(gs_bucket, gs_store):
    assert gs_store.info("nothing") is None
    with pytest.raises(TruncatedError) as missing:
        gs_store.get("nothing")
    assert_code(missing, "E9003", "gs://", "no such object")
    gs_bucket.upload("short.bin", b"0123456789")
    with pytest.raises(TruncatedError) as short:
        gs_store.read_ranges("short.bin", [5], [20])  # the emulator answers the 5 bytes there are
    assert_code(short, "E9003", "gs://", "ends before byte 20")


@pytest.mark.subprocess
def test_delete(gs_bucket, gs_store):
    gs_bucket.upload("gone.bin", b"x")
    gs_store.delete("gone.bin")
    assert gs_store.info("gone.bin") is None
    gs_store.delete("gone.bin")  # nothing there: nothing to do


@pytest.mark.subprocess
def test_the_emulator_refuses_the_clients_writes(gs_store, gs_server):
    """What the emulator lacks, kept checked: the client's XML-API PUT is answered 400. The write
    reached the emulator (no token was asked of a metadata server) and failed with E9018."""
    with pytest.raises(StorageError) as refused:
        gs_store.put("new.bin", b"data")
    message = assert_code(refused, "E9018", "gs://", "cannot write it", gs_server.endpoint)
    assert "400" in message and "169.254.169.254" not in message and "token" not in message.lower()


# -- the requests of writes, against a recording stub ---------------------------------------------------------


class _Stub:
    """Just enough of GCS's XML API for a put, a conditional put, a look and a whole read, with
    every request recorded (method, path, headers)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.generation = 1000
        self.lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            @property
            def key(self) -> str:  # the client escapes keys (dots too): the stub keeps them plain
                return urllib.parse.unquote(self.path)

            def log_message(self, *args) -> None:
                pass

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
                with stub.lock:
                    now = stub.objects.get(self.key)
                    match = self.headers.get("x-goog-if-generation-match")
                    if match is not None and int(match) != (now[1] if now else 0):
                        return self._answer(412, b"<Error><Code>PreconditionFailed</Code></Error>")
                    stub.generation += 1
                    stub.objects[self.key] = (body, stub.generation)
                self._answer(200, b"", body, stub.generation)

            def do_GET(self) -> None:
                self._read(send=True)

            def do_HEAD(self) -> None:
                self._read(send=False)

            def _read(self, send: bool) -> None:
                stub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                found = stub.objects.get(self.key)
                if found is None:
                    return self._answer(404, b"<Error><Code>NoSuchKey</Code></Error>")
                self._answer(200, found[0] if send else b"", found[0], found[1], length=len(found[0]))

            def _answer(self, status: int, body: bytes, stored: bytes | None = None, generation: int = 0,
                        length: int | None = None) -> None:
                self.send_response(status)
                if stored is not None:
                    self.send_header("ETag", f'"{base64.b64encode(hashlib.md5(stored).digest()).decode()}"')
                    self.send_header("x-goog-generation", str(generation))
                    self.send_header("Last-Modified", email.utils.formatdate(usegmt=True))
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def puts(self) -> list[dict[str, str]]:
        return [headers for method, _, headers in self.requests if method == "PUT"]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub(monkeypatch) -> _Stub:
    found = _Stub()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", found.endpoint)
    yield found
    found.stop()


def test_a_put_is_one_unsigned_request(stub):
    store = ObjectStore("gs", "bkt", OPTIONS)
    info = store.put("dir/x.bin", b"hello")
    (put,) = stub.puts()
    assert "x-goog-if-generation-match" not in put
    assert put.get("authorization", "Bearer ").strip() == "Bearer"  # an empty token, asked of no one
    assert info.size == 5 and info.tag == store.info("dir/x.bin").tag
    assert [m for m, _, _ in stub.requests] == ["PUT", "HEAD"]


def test_conditional_puts_match_generations(stub):
    store = ObjectStore("gs", "bkt", OPTIONS)
    first = store.put("index.json", b"v1", mode=CREATE)
    assert stub.puts()[-1]["x-goog-if-generation-match"] == "0"  # only if absent
    with pytest.raises(Conflict):
        store.put("index.json", b"v1-again", mode=CREATE)
    generation = stub.objects["/bkt/index.json"][1]
    second = store.put("index.json", b"v2", mode=Version(first.tag))
    assert stub.puts()[-1]["x-goog-if-generation-match"] == str(generation)  # the generation read
    assert second.tag != first.tag and store.get("index.json")[0] == b"v2"
    before = len(stub.puts())
    with pytest.raises(Conflict):
        store.put("index.json", b"v3", mode=Version(first.tag))  # stale: refused before any PUT
    assert len(stub.puts()) == before
    assert stub.objects["/bkt/index.json"][0] == b"v2"


def test_a_generation_that_moves_between_look_and_put_loses(stub, monkeypatch):
    """Another writer replaces the object after the store looked up its generation: the PUT's
    precondition fails (412) and the put is a conflict, not an overwrite."""
    store = ObjectStore("gs", "bkt", OPTIONS)
    first = store.put("index.json", b"v1")
    looked = ObjectStore._condition

    def look_then_race(self, key, mode):
        condition = looked(self, key, mode)
        stub.objects["/bkt/" + key] = (b"theirs", stub.objects["/bkt/" + key][1] + 7)
        return condition

    monkeypatch.setattr(ObjectStore, "_condition", look_then_race)
    with pytest.raises(Conflict):
        store.put("index.json", b"mine", mode=Version(first.tag))
    assert stub.objects["/bkt/index.json"][0] == b"theirs"


@pytest.mark.parametrize("reset", [False, True])
def test_a_lost_answer_to_a_conditional_put_is_done(stub, monkeypatch, reset):
    proxy = FaultProxy(stub.endpoint).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        store = ObjectStore("gs", "bkt", OPTIONS)
        first = store.put("index.json", b"v1", mode=CREATE)
        proxy.plan(Rule(lost_answer(reset=reset), method="PUT"))
        info = store.put("index.json", b"v2", mode=Version(first.tag))
        assert proxy.faults_done() == 1
        data, found = store.get("index.json")
        assert data == b"v2" and info.tag == found.tag
    finally:
        proxy.stop()
