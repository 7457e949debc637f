"""The fault proxy does what its plan says, and nothing else: checked with a plain HTTP client
against the S3 server behind it (moto takes path-style requests and does not check signatures,
but refuses reads without an Authorization header)."""

from __future__ import annotations

import http.client
import urllib.parse

import pytest

from tests.faultproxy import FaultProxy, Rule, answer, cut, drop, lost_answer, short, slow

PAYLOAD = bytes(range(256)) * 64  # 16 KiB
SIGNED = {"Authorization": "AWS4-HMAC-SHA256 Credential=pskdtestkey/20260101/us-east-1/s3/aws4_request, "
                           "SignedHeaders=host, Signature=0"}


def _request(endpoint: str, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict, bytes]:
    parsed = urllib.parse.urlsplit(endpoint)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={**SIGNED, **(headers or {})})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.fixture
def bucket_path(s3_bucket, fault_proxy) -> str:
    status, _, _ = _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/object", PAYLOAD)
    assert status == 200
    fault_proxy.plan()
    return f"/{s3_bucket.name}/object"


def test_forwards_untouched_without_a_plan(fault_proxy, bucket_path):
    status, headers, body = _request(fault_proxy.endpoint, "GET", bucket_path)
    assert (status, body) == (200, PAYLOAD) and int(headers["content-length"]) == len(PAYLOAD)
    status, _, body = _request(fault_proxy.endpoint, "GET", bucket_path, headers={"Range": "bytes=10-19"})
    assert (status, body) == (206, PAYLOAD[10:20])
    status, headers, body = _request(fault_proxy.endpoint, "HEAD", bucket_path)
    assert status == 200 and body == b"" and int(headers["content-length"]) == len(PAYLOAD)
    assert [(s.method, s.ranged, s.fault, s.status) for s in fault_proxy.seen] == [
        ("GET", False, None, 200), ("GET", True, None, 206), ("HEAD", False, None, 200)]


def test_own_answers_never_reach_the_server(fault_proxy, s3_bucket, s3_server):
    fault_proxy.plan(Rule(answer(503, retry_after="7"), method="PUT"))
    status, headers, body = _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/new", b"data")
    assert status == 503 and headers["retry-after"] == "7" and b"SlowDown" in body
    assert _request(s3_server.endpoint, "GET", f"/{s3_bucket.name}/new")[0] == 404  # not written
    fault_proxy.plan(Rule(answer(429), method="PUT"))
    status, headers, body = _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/new", b"data")
    assert status == 429 and "retry-after" not in headers


def test_a_forwarded_answer_was_done_by_the_server(fault_proxy, s3_bucket, s3_server):
    fault_proxy.plan(Rule(answer(503, forward=True), method="PUT"))
    assert _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/done", b"data")[0] == 503
    assert _request(s3_server.endpoint, "GET", f"/{s3_bucket.name}/done")[2] == b"data"


def test_an_echo_repeats_the_request_headers(fault_proxy, bucket_path):
    fault_proxy.plan(Rule(answer(500, echo=True)))
    status, _, body = _request(fault_proxy.endpoint, "GET", bucket_path, headers={"X-Probe": "seen-by-echo"})
    assert status == 500 and b"X-Probe: seen-by-echo" in body


def test_skip_and_times_count_matching_requests(fault_proxy, bucket_path):
    fault_proxy.plan(Rule(answer(503), method="GET", skip=1, times=2))
    statuses = [_request(fault_proxy.endpoint, "GET", bucket_path)[0] for _ in range(4)]
    assert _request(fault_proxy.endpoint, "HEAD", bucket_path)[0] == 200  # another method: not counted
    assert statuses == [200, 503, 503, 200]
    assert fault_proxy.faults_done() == 2 and fault_proxy.count("GET", fault="answer") == 2
    assert fault_proxy.count("GET", fault=None) == 2 and fault_proxy.count() == 5


def test_rules_match_path_and_range(fault_proxy, bucket_path):
    fault_proxy.plan(Rule(answer(500), path="elsewhere", times=None), Rule(answer(503), ranged=True, times=None))
    assert _request(fault_proxy.endpoint, "GET", bucket_path)[0] == 200
    assert _request(fault_proxy.endpoint, "GET", bucket_path, headers={"Range": "bytes=0-9"})[0] == 503
    assert _request(fault_proxy.endpoint, "GET", bucket_path + "?elsewhere=1")[0] == 500


@pytest.mark.parametrize("reset", [False, True])
def test_a_cut_sends_headers_and_part_of_the_body(fault_proxy, bucket_path, reset):
    fault_proxy.plan(Rule(cut(keep=1000, reset=reset)))
    parsed = urllib.parse.urlsplit(fault_proxy.endpoint)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    connection.request("GET", bucket_path, headers=SIGNED)
    response = connection.getresponse()
    assert response.status == 200 and int(response.getheader("Content-Length")) == len(PAYLOAD)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        response.read()
    connection.close()
    assert fault_proxy.count(fault="cut") == 1


@pytest.mark.parametrize("reset", [False, True])
def test_a_drop_answers_nothing_and_forwards_nothing(fault_proxy, s3_bucket, s3_server, reset):
    fault_proxy.plan(Rule(drop(reset=reset)))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/dropped", b"data")
    assert _request(s3_server.endpoint, "GET", f"/{s3_bucket.name}/dropped")[0] == 404
    assert [(s.fault, s.status) for s in fault_proxy.seen] == [("drop", None)]


@pytest.mark.parametrize("reset", [False, True])
def test_a_lost_answer_was_done_by_the_server(fault_proxy, s3_bucket, s3_server, reset):
    fault_proxy.plan(Rule(lost_answer(reset=reset)))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        _request(fault_proxy.endpoint, "PUT", f"/{s3_bucket.name}/landed", b"data")
    assert _request(s3_server.endpoint, "GET", f"/{s3_bucket.name}/landed")[2] == b"data"


def test_slow_and_short_answers(fault_proxy, bucket_path):
    fault_proxy.plan(Rule(slow(pause=0.001, pieces=5)))
    assert _request(fault_proxy.endpoint, "GET", bucket_path)[2] == PAYLOAD  # slow, but whole
    fault_proxy.plan(Rule(short(keep=3)))
    status, headers, body = _request(fault_proxy.endpoint, "GET", bucket_path, headers={"Range": "bytes=0-99"})
    assert (status, body, headers["content-length"]) == (206, PAYLOAD[:3], "3")
    assert headers["content-range"].startswith("bytes 0-99/")  # the server's words, not the body's


def test_a_kept_alive_connection_serves_many_requests(fault_proxy, bucket_path):
    parsed = urllib.parse.urlsplit(fault_proxy.endpoint)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    for _ in range(3):
        connection.request("GET", bucket_path, headers=SIGNED)
        assert connection.getresponse().read() == PAYLOAD
    connection.close()
    assert fault_proxy.count("GET", fault=None) == 3


def test_only_loopback_servers_are_proxied():
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://example.com:80")
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("https://127.0.0.1:443")
