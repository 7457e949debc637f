"""Faults between the toolkit and an object store, made by the fault proxy in front of the S3
server: throttling and dropped connections are retried with backoff and a transient fault is
invisible; a fault that persists is E9018 naming the URL and what was tried, within the bounds
the options set; a read returns all its bytes or raises; a conditional put reports what happened
even when an answer was lost; credentials never reach a message.

Every check counts the requests the proxy saw; none depends on how long anything took.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.errors import PskdError, StorageError, TruncatedError
from pskd_jax.storage import CREATE, Conflict, ObjectStore, StorageOptions, Version, objects
from tests.faultproxy import Fault, Rule, answer, cut, drop, lost_answer, short, slow
from tests.helpers import assert_code

RETRIES = 2
OPTIONS = StorageOptions(retries=RETRIES, backoff_seconds=0.001, part_bytes=1 << 16, concurrency=4)
PAYLOAD = np.random.default_rng(7).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
BIG = np.random.default_rng(8).integers(0, 256, (10 << 20) + 12_345, dtype=np.uint8).tobytes()  # two parts

THROTTLES = {"503": answer(503), "429": answer(429), "429 Retry-After": answer(429, retry_after="1"),
             "500": answer(500)}
DROPS = {"drop": drop(), "drop reset": drop(reset=True)}
CUTS = {"cut": cut(), "cut reset": cut(reset=True), "cut at 0": cut(keep=0)}


def _store(bucket, options: StorageOptions = OPTIONS) -> ObjectStore:
    return ObjectStore("s3", bucket.name, options)


def _at(bucket, key: str) -> str:
    """A pattern of the proxy that matches requests for exactly this object."""
    return re.escape(f"/{bucket.name}/{key}") + r"(\?|$)"


@dataclasses.dataclass(frozen=True)
class Operation:
    """One operation of the store: what it needs there first, the requests a fault is aimed at
    (method, path pattern, with ``{key}`` the object's), what it does and what it must give."""

    name: str
    method: str
    path: str  # "{object}": requests for the object itself; otherwise a pattern
    run: Callable[[ObjectStore, str], Any]
    check: Callable[[ObjectStore, str, Any], None]
    reads: bool = True
    what: str = "read it"
    new: bool = False  # the object is made by the operation (key + ".new"), not there before

    def target(self, key: str) -> str:
        """The key of the object the operation reads or writes."""
        return key + ".new" if self.new else key

    def rule(self, bucket, key: str, fault: Fault, times: int | None = 1) -> Rule:
        path = _at(bucket, key) if self.path == "{object}" else self.path
        return Rule(fault, method=self.method, path=path, times=times)


def _equal(expected: bytes) -> Callable[[ObjectStore, str, Any], None]:
    def check(store: ObjectStore, key: str, got: Any) -> None:
        assert bytes(got) == expected

    return check


def _read_into(store: ObjectStore, key: str) -> bytes:
    out = np.zeros(len(PAYLOAD) - 3, np.uint8)  # four parts of 64 KiB, read concurrently
    store.read_into(key, 3, memoryview(out))
    return out.tobytes()


def _written(expected: bytes) -> Callable[[ObjectStore, str, Any], None]:
    def check(store: ObjectStore, key: str, info: Any) -> None:
        data, found = store.get(key)
        assert data == expected and info.size == len(expected)
        assert info.tag == found.tag  # the tag the put reported is the object's

    return check


def _update(store: ObjectStore, key: str):
    return store.put(key, b"v2" * 100, mode=Version(store.info(key).tag))


def _deleted(store: ObjectStore, key: str, result: Any) -> None:
    assert store.info(key) is None


def _listed(store: ObjectStore, key: str, listed: Any) -> None:
    assert [o.key for o in listed] == [key]


OPERATIONS = [
    Operation("get", "GET", "{object}", lambda s, k: s.get(k)[0], _equal(PAYLOAD)),
    Operation("read_ranges", "GET", "{object}",
              lambda s, k: b"".join(bytes(r) for r in s.read_ranges(k, [5, 150_000], [70_000, 200_000])),
              _equal(PAYLOAD[5:70_000] + PAYLOAD[150_000:]), what="read 2 byte ranges"),
    Operation("read_into", "GET", "{object}", _read_into, _equal(PAYLOAD[3:]), what="read a byte range"),
    Operation("chunks", "GET", "{object}", lambda s, k: b"".join(bytes(c) for c in s.chunks(k, 1 << 15)),
              _equal(PAYLOAD)),
    Operation("info", "HEAD", "{object}", lambda s, k: s.info(k).size, lambda s, k, got: got == len(PAYLOAD),
              what="look at it"),
    Operation("list", "GET", r"list-type=2", lambda s, k: s.list(k.rpartition("/")[0]), _listed, what="list it"),
    Operation("delete", "POST", r"\?delete", lambda s, k: s.delete(k), _deleted, what="delete it"),
    Operation("put", "PUT", "{object}", lambda s, k: s.put(k, b"new" * 1000), _written(b"new" * 1000),
              reads=False, what="write it"),
    Operation("put create", "PUT", "{object}", lambda s, k: s.put(k + ".new", b"created", mode=CREATE),
              _written(b"created"), reads=False, what="write it", new=True),
    Operation("put version", "PUT", "{object}", _update, _written(b"v2" * 100), reads=False, what="write it"),
]
MULTIPART = [
    Operation("put parts: start", "POST", r"\?uploads", lambda s, k: s.put(k, [BIG[:6 << 20], BIG[6 << 20:]]),
              _written(BIG), reads=False, what="write it"),
    Operation("put parts: a part", "PUT", r"partNumber=2", lambda s, k: s.put(k, [BIG[:6 << 20], BIG[6 << 20:]]),
              _written(BIG), reads=False, what="write it"),
    Operation("put parts: complete", "POST", r"uploadId=", lambda s, k: s.put(k, [BIG[:6 << 20], BIG[6 << 20:]]),
              _written(BIG), reads=False, what="write it"),
]


def _prepared(bucket, operation: Operation) -> tuple[ObjectStore, str]:
    """A store of the bucket (through the proxy) and the key of an object of PAYLOAD."""
    store = _store(bucket)
    key = "dir/object.bin"
    store.put(key, PAYLOAD)
    return store, key


# -- transient faults: retried, invisible ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [*THROTTLES.values(), *DROPS.values()], ids=[*THROTTLES, *DROPS])
@pytest.mark.parametrize("operation", OPERATIONS, ids=[o.name for o in OPERATIONS])
def test_a_transient_fault_is_retried_and_invisible(faulty_bucket, fault_proxy, operation, fault):
    store, key = _prepared(faulty_bucket, operation)
    aimed = operation.rule(faulty_bucket, operation.target(key), fault)
    fault_proxy.plan(aimed)
    got = operation.run(store, key)
    assert fault_proxy.faults_done() == 1  # the fault was met, and then:
    assert fault_proxy.count(operation.method, aimed.path, fault=None) >= 1  # tried again, answered
    fault_proxy.plan()
    operation.check(store, operation.target(key), got)


@pytest.mark.parametrize("fault", list(CUTS.values()), ids=list(CUTS))
@pytest.mark.parametrize("operation", [o for o in OPERATIONS if o.method == "GET" and o.path == "{object}"],
                         ids=lambda o: o.name)
def test_a_read_cut_midway_is_resumed_whole(faulty_bucket, fault_proxy, operation, fault):
    store, key = _prepared(faulty_bucket, operation)
    fault_proxy.plan(operation.rule(faulty_bucket, key, fault))
    got = operation.run(store, key)
    assert fault_proxy.faults_done() == 1 and fault_proxy.count("GET", fault=None) >= 1
    operation.check(store, key, got)


@pytest.mark.slow
@pytest.mark.parametrize("fault", [answer(503), drop(reset=True), lost_answer()], ids=["503", "drop", "lost answer"])
@pytest.mark.parametrize("operation", MULTIPART, ids=[o.name for o in MULTIPART])
def test_a_multipart_put_survives_a_transient_fault(faulty_bucket, fault_proxy, operation, fault):
    store, key = _store(faulty_bucket), "big.bin"
    fault_proxy.plan(Rule(fault, method=operation.method, path=operation.path))
    info = operation.run(store, key)
    assert fault_proxy.faults_done() == 1
    fault_proxy.plan()
    operation.check(store, key, info)


def test_a_slow_answer_is_a_whole_answer(faulty_bucket, fault_proxy):
    store, key = _prepared(faulty_bucket, OPERATIONS[0])
    fault_proxy.plan(Rule(slow(pause=0.001, pieces=8), method="GET", times=None))
    assert store.get(key)[0] == PAYLOAD
    assert _read_into(store, key) == PAYLOAD[3:]
    assert fault_proxy.count("GET", fault="slow") == 5 and fault_proxy.count("GET", fault=None) == 0


# -- persistent faults: bounded, then E9018 saying what was tried -------------------------------------------------


def _persisting(operation: Operation) -> list:
    return [answer(503), answer(429), drop(reset=True)]


@pytest.mark.parametrize(("operation", "fault"),
                         [(o, f) for o in OPERATIONS for f in _persisting(o)],
                         ids=[f"{o.name}-{f.kind}{f.status if f.kind == 'answer' else ''}"
                              for o in OPERATIONS for f in _persisting(o)])
def test_a_persistent_fault_is_e9018_after_the_retries(faulty_bucket, fault_proxy, operation, fault):
    store, key = _prepared(faulty_bucket, operation)
    target = operation.target(key)
    rule = operation.rule(faulty_bucket, target, fault, times=None)
    fault_proxy.plan(rule)
    with pytest.raises(StorageError) as failed:
        operation.run(store, key)
    message = assert_code(failed, "E9018", f"cannot {operation.what}", f"at most {RETRIES} retries within 60 s")
    shown = store.url(key.rpartition("/")[0]) if operation.name == "list" else store.url(target)
    assert shown in message
    tries = fault_proxy.count(operation.method, rule.path)
    # (read_into reads four parts, each given up after its own retries, all done before it raises)
    assert tries == (4 if operation.name == "read_into" else 1) * (RETRIES + 1), fault_proxy.seen
    assert re.search(rf"\b{RETRIES + 1} tries in \d+\.\d s", message), message
    assert "Debug source" not in message  # the client's dump is left out


@pytest.mark.parametrize("fault", list(CUTS.values()), ids=list(CUTS))
@pytest.mark.parametrize("operation", [o for o in OPERATIONS if o.method == "GET" and o.path == "{object}"],
                         ids=lambda o: o.name)
def test_a_read_that_keeps_being_cut_fails_and_never_returns_part(faulty_bucket, fault_proxy, operation, fault):
    store, key = _prepared(faulty_bucket, operation)
    fault_proxy.plan(operation.rule(faulty_bucket, key, fault, times=None))
    with pytest.raises(PskdError) as failed:
        operation.run(store, key)
    assert_code(failed, "E9018", store.url(key), f"cannot {operation.what}")
    assert fault_proxy.count("GET", fault=None) == 0
    per_read = 4 if operation.name == "read_into" else 2 if operation.name == "read_ranges" else 1
    assert fault_proxy.count("GET") <= per_read * (RETRIES + 1)


def test_a_range_answered_short_is_e9003(faulty_bucket, fault_proxy):
    store, key = _prepared(faulty_bucket, OPERATIONS[0])
    fault_proxy.plan(Rule(short(keep=10), method="GET", times=None))
    with pytest.raises(TruncatedError) as failed:
        store.read_ranges(key, [100], [5000])
    assert_code(failed, "E9003", store.url(key), "got 10 bytes")
    with pytest.raises(TruncatedError):
        _read_into(store, key)


@pytest.mark.slow
def test_retry_seconds_bounds_the_retries(faulty_bucket, fault_proxy):
    """Many retries allowed but little time: the time bound ends them (the count shows it did)."""
    options = StorageOptions(retries=100, retry_seconds=0.2, backoff_seconds=0.05)
    store, key = _store(faulty_bucket, options), "dir/object.bin"
    fault_proxy.plan(Rule(answer(503), method="GET", times=None))
    with pytest.raises(StorageError) as failed:
        store.get(key)
    assert_code(failed, "E9018", store.url(key), "at most 100 retries within 0.2 s")
    assert 2 <= fault_proxy.count("GET") < 101


def test_no_retries_means_one_try(faulty_bucket, fault_proxy):
    store = _store(faulty_bucket, StorageOptions(retries=0))
    store.put("k", b"x")
    fault_proxy.plan(Rule(answer(503), times=None))
    with pytest.raises(StorageError) as failed:
        store.get("k")
    assert_code(failed, "E9018", "1 try in", "at most 0 retries")
    assert fault_proxy.count() == 1


def test_a_put_of_pieces_that_fit_in_one_part_is_one_request(faulty_bucket, fault_proxy):
    """Pieces (a save's, a shard's) whose bytes fit in one part are one PUT, as docs/storage.md
    says, not a multipart upload of one part: three requests where one does, and an open upload
    left billed if the process stops between its start and its completion. Pieces of no byte are
    one PUT of an empty object (S3 takes no upload of no part)."""
    store = _store(faulty_bucket)
    fault_proxy.plan()
    info = store.put("small.bin", iter([PAYLOAD[:1000], PAYLOAD[1000:]]))
    assert fault_proxy.count() == 1 and fault_proxy.count("PUT", _at(faulty_bucket, "small.bin")) == 1
    assert store.get("small.bin") == (PAYLOAD, info) and info.size == len(PAYLOAD)
    fault_proxy.plan()
    info = store.put("sized.bin", [PAYLOAD[:7], PAYLOAD[7:10]], size=10)
    assert fault_proxy.count() == 1 and store.get("sized.bin") == (PAYLOAD[:10], info)
    fault_proxy.plan()
    info = store.put("empty.bin", iter([]))
    assert fault_proxy.count() == 1 and store.get("empty.bin") == (b"", info)


@pytest.mark.slow
def test_a_multipart_put_that_keeps_failing_leaves_nothing(faulty_bucket, fault_proxy, s3_bucket):
    store = _store(faulty_bucket)
    fault_proxy.plan(Rule(answer(503), method="PUT", path="partNumber=2", times=None))
    with pytest.raises(StorageError) as failed:
        store.put("big.bin", [BIG[:6 << 20], BIG[6 << 20:]])
    assert_code(failed, "E9018", store.url("big.bin"), "cannot write it")
    assert fault_proxy.count("PUT", "partNumber=2") == RETRIES + 1
    assert fault_proxy.count("DELETE", "uploadId=") == 1  # the client aborted the upload: no parts are kept
    fault_proxy.plan()
    assert store.info("big.bin") is None and store.list("") == []


@pytest.mark.slow
def test_an_upload_never_has_more_parts_than_s3_takes(faulty_bucket, fault_proxy, monkeypatch):
    """S3 takes at most 10000 parts an upload and answers a part numbered past them with 400, after
    the data before it was sent (moto does too). The bound is made 3 here, for objects of a few
    parts: one whose size is known (one buffer, or pieces with ``size``) is cut into parts large
    enough to fit; pieces of no stated size that outgrow the parts are E9018 before the server sees
    a part past the bound, and nothing is visible."""
    monkeypatch.setattr(objects, "MAX_PARTS", 3)
    store = _store(faulty_bucket)  # (parts of 5 MiB, S3's smallest: four for this object)
    data = BIG + BIG[: 6 << 20]
    pieces = [data[start : start + (1 << 20)] for start in range(0, len(data), 1 << 20)]
    for written, size in ((data, None), (pieces, len(data))):
        fault_proxy.plan()
        store.put("big.bin", written, size=size)
        assert fault_proxy.count("PUT", r"partNumber=") == 3
        assert store.get("big.bin")[0] == data
    fault_proxy.plan()
    with pytest.raises(StorageError) as refused:
        store.put("unknown.bin", iter(pieces))
    assert_code(refused, "E9018", store.url("unknown.bin"), "3 parts of 5242880")
    assert fault_proxy.count("PUT", r"partNumber=4") == 0
    assert store.info("unknown.bin") is None


# -- conditional puts report what happened -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["create", "version"])
@pytest.mark.parametrize("fault", [lost_answer(), lost_answer(reset=True), answer(503, forward=True),
                                   answer(504, forward=True)],
                         ids=["lost answer", "lost answer reset", "503 after doing it", "504 after doing it"])
def test_a_conditional_put_whose_first_try_landed_is_done(faulty_bucket, fault_proxy, mode, fault):
    """The first PUT reaches the server and writes the object; its answer is lost (or is an error
    a gateway made up). The client's retry, if it makes one, is refused by the put's own object:
    the put is still reported done, with the object's tag."""
    store = _store(faulty_bucket)
    if mode == "version":
        condition: Any = Version(store.put("index.json", b'{"steps": [1]}').tag)
    else:
        condition = CREATE
    fault_proxy.plan(Rule(fault, method="PUT", path=_at(faulty_bucket, "index.json")))
    info = store.put("index.json", b'{"steps": [1, 2]}', mode=condition)
    assert fault_proxy.faults_done() == 1
    data, found = store.get("index.json")
    assert data == b'{"steps": [1, 2]}' and info.tag == found.tag and info.size == len(data)
    # and a stale condition still loses
    with pytest.raises(Conflict):
        store.put("index.json", b'{"steps": [9]}', mode=condition)


@pytest.mark.parametrize("reset", [False, True])
def test_a_conditional_put_whose_connection_dropped_is_tried_again(faulty_bucket, fault_proxy, reset):
    store = _store(faulty_bucket)
    fault_proxy.plan(Rule(drop(reset=reset), method="PUT"))
    info = store.put("index.json", b"first", mode=CREATE)
    assert fault_proxy.count("PUT", fault="drop") == 1 and fault_proxy.count("PUT", fault=None) == 1
    assert store.get("index.json")[1].tag == info.tag


def test_a_real_conflict_stays_a_conflict_through_retries(faulty_bucket, fault_proxy):
    """Another writer's index is there: our put meets a 503, is retried, and is refused; the
    object holds other bytes, so the put lost."""
    store = _store(faulty_bucket)
    store.put("index.json", b"theirs", mode=CREATE)
    fault_proxy.plan(Rule(answer(503), method="PUT"))
    with pytest.raises(Conflict):
        store.put("index.json", b"mine", mode=CREATE)
    assert fault_proxy.count("PUT") == 2
    assert store.get("index.json")[0] == b"theirs"


@pytest.mark.parametrize("mode", ["create", "version"])
def test_a_conditional_put_answered_409_is_tried_again(faulty_bucket, fault_proxy, mode):
    """S3 answers 409 ConditionalRequestConflict to a conditional put while another write or delete
    of the key is in progress: no verdict on the condition (the client calls it "already exists"),
    and AWS says to try again. The put is tried again and does what its condition says."""
    store = _store(faulty_bucket)
    condition = CREATE
    if mode == "version":
        condition = Version(store.put("index.json", b"old").tag)
    fault_proxy.plan(Rule(answer(409), method="PUT", times=1))
    info = store.put("index.json", b"mine", mode=condition)
    assert store.get("index.json") == (b"mine", info)
    assert fault_proxy.count("PUT", fault=None) == 1  # the try after the 409 reached the server


@pytest.mark.parametrize("mode", ["create", "version"])
def test_a_conditional_put_that_keeps_meeting_409_is_e9018_never_a_conflict(faulty_bucket, fault_proxy, mode):
    """A 409 that persists says nothing of the condition: E9018 saying so, not a lost race (the
    callers' E9014, E9016), and nothing written."""
    store = _store(faulty_bucket)
    condition = CREATE
    if mode == "version":
        condition = Version(store.put("index.json", b"old").tag)
    fault_proxy.plan(Rule(answer(409), method="PUT", times=None))
    with pytest.raises(StorageError) as failed:
        store.put("index.json", b"mine", mode=condition)
    assert_code(failed, "E9018", store.url("index.json"), "409 Conflict", "wrote nothing")
    assert fault_proxy.count("PUT") >= RETRIES + 1
    fault_proxy.plan()
    assert store.info("index.json") is None if mode == "create" else store.get("index.json")[0] == b"old"


@pytest.mark.parametrize("mode", ["create", "version"])
def test_a_store_without_conditional_writes_says_so(faulty_bucket, fault_proxy, mode):
    """A store that does not take If-None-Match / If-Match answers 501 Not Implemented (as S3 did
    before it had conditional writes): E9018 saying what is missing, and the object untouched."""
    store = _store(faulty_bucket)
    condition = CREATE
    if mode == "version":
        condition = Version(store.put("index.json", b"old").tag)
    fault_proxy.plan(Rule(answer(501), method="PUT", times=None))
    with pytest.raises(StorageError) as failed:
        store.put("index.json", b"mine", mode=condition)
    assert_code(failed, "E9018", store.url("index.json"), "does not implement conditional writes",
                "nothing was written")
    fault_proxy.plan()
    assert store.info("index.json") is None if mode == "create" else store.get("index.json")[0] == b"old"


def test_a_refusal_at_the_first_try_is_a_conflict_even_for_equal_bytes(faulty_bucket, fault_proxy):
    """Only a put that was tried more than once can have been refused by its own object: one
    refused at its first try lost, whatever the object there holds."""
    store = _store(faulty_bucket)
    store.put("claim", b"same", mode=CREATE)
    with pytest.raises(Conflict):
        store.put("claim", b"same", mode=CREATE)
    assert fault_proxy.count("PUT") == 2


def test_a_retried_refusal_by_equal_bytes_is_done(faulty_bucket, fault_proxy):
    """The rule's edge, as documented: a retried put refused by an object holding exactly its
    bytes cannot be told from one whose first try landed, and is reported done."""
    store = _store(faulty_bucket)
    store.put("index.json", b"same", mode=CREATE)
    fault_proxy.plan(Rule(answer(503), method="PUT"))
    assert store.put("index.json", b"same", mode=CREATE).size == 4


def test_when_the_outcome_cannot_be_learned_it_says_so(faulty_bucket, fault_proxy):
    store = _store(faulty_bucket)
    fault_proxy.plan(Rule(lost_answer(reset=True), method="PUT"), Rule(answer(503), method="HEAD", times=None))
    with pytest.raises(StorageError) as failed:
        store.put("index.json", b"mine", mode=CREATE)
    assert_code(failed, "E9018", store.url("index.json"), "cannot write it", "whether a try landed is unknown")


def test_a_conditional_put_that_keeps_dropping_is_bounded(faulty_bucket, fault_proxy):
    store = _store(faulty_bucket)
    fault_proxy.plan(Rule(drop(reset=True), method="PUT", times=None))
    with pytest.raises(StorageError) as failed:
        store.put("index.json", b"mine", mode=CREATE)
    assert_code(failed, "E9018", store.url("index.json"), "cannot write it", f"{RETRIES + 1} tries")
    assert fault_proxy.count("PUT") == RETRIES + 1
    fault_proxy.plan()
    assert store.info("index.json") is None


# -- a read never returns part of its bytes (drawn faults) --------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reads=st.sampled_from(["get", "read_ranges", "read_into", "chunks"]),
       faults=st.lists(st.tuples(st.sampled_from(["cut", "drop", "503", "429"]), st.integers(0, len(PAYLOAD)),
                                 st.booleans()), max_size=2 * (RETRIES + 2)))
def test_reads_are_whole_or_errors(faulty_bucket, fault_proxy, reads, faults):
    store, key = _store(faulty_bucket), "whole.bin"
    fault_proxy.plan()
    if store.info(key) is None:
        store.put(key, PAYLOAD)
    made = {"cut": lambda keep, reset: cut(keep=keep, reset=reset), "drop": lambda keep, reset: drop(reset=reset),
            "503": lambda keep, reset: answer(503), "429": lambda keep, reset: answer(429)}
    fault_proxy.plan(*[Rule(made[kind](keep, reset), method="GET", skip=0, times=1) for kind, keep, reset in faults])
    operation = next(o for o in OPERATIONS if o.name == reads)
    try:
        got = operation.run(store, key)
    except PskdError as e:
        assert e.code in ("E9018", "E9003")
        assert fault_proxy.faults_done() > RETRIES  # only a fault that outlasted the retries may fail a read
        return
    operation.check(store, key, got)


# -- credentials never reach a message ----------------------------------------------------------------------------


def test_messages_hold_no_credentials(faulty_bucket, fault_proxy, monkeypatch):
    """The proxy's error page echoes the request's headers (the access key's id and the session
    token travel in them); neither they nor the secret reach the E9018's text."""
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-of-the-test")
    secret = "explicit-secret-of-the-test"
    options = StorageOptions(retries=1, backoff_seconds=0.001,
                             config={"access_key_id": "AKIATESTEXPLICIT", "secret_access_key": secret})
    store = ObjectStore("s3", faulty_bucket.name, options)
    fault_proxy.plan(Rule(answer(503, echo=True), times=None))
    for attempt in (lambda: store.get("k"), lambda: store.put("k", b"x", mode=CREATE), lambda: store.list("")):
        with pytest.raises(StorageError) as failed:
            attempt()
        message = str(failed.value)
        assert "injected by the test proxy" in message  # the echo is in the message…
        for credential in ("AKIATESTEXPLICIT", secret, "session-token-of-the-test", "pskdtestsecretvalue"):
            assert credential not in message  # …but not what it echoed of the credentials
        assert "***" in message


def test_messages_hold_no_credentials_of_an_aws_profile(faulty_bucket, fault_proxy, monkeypatch, tmp_path):
    """Keys read from the shared credentials file (no key in the environment) are kept out of a
    message too, when the server's error page echoes the headers that carry them."""
    credentials = tmp_path / "credentials"
    credentials.write_text("[audit]\naws_access_key_id = AKIAPROFILEKEYID\n"
                           "aws_secret_access_key = profile-secret-words\naws_session_token = profile-session-token\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "audit")
    store = ObjectStore("s3", faulty_bucket.name, StorageOptions(retries=1, backoff_seconds=0.001))
    fault_proxy.plan(Rule(answer(503, echo=True), times=None))
    for attempt in (lambda: store.get("k"), lambda: store.put("k", b"x", mode=CREATE), lambda: store.list("")):
        with pytest.raises(StorageError) as failed:
            attempt()
        message = str(failed.value)
        assert "injected by the test proxy" in message and "***" in message
        for credential in ("AKIAPROFILEKEYID", "profile-secret-words", "profile-session-token"):
            assert credential not in message


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_403_says_that_s3_answers_it_for_a_missing_object_without_listbucket(faulty_bucket, fault_proxy, method):
    """(A store's credentials without s3:ListBucket get 403 for a key that is not there: the
    message says so, where it otherwise reads as a refusal of an object that exists.)"""
    store = _store(faulty_bucket)
    fault_proxy.plan(Rule(answer(403), method=method, path=_at(faulty_bucket, "absent.json"), times=None))
    read = store.get if method == "GET" else store.info
    with pytest.raises(StorageError, match=r"E9018: s3://.*/absent\.json: cannot .*403.*s3:ListBucket\)$"):
        read("absent.json")
    assert fault_proxy.faults_done() >= 1
