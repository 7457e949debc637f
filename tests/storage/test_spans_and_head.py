"""Two reads every store does, for a restore: ``head`` (an object's first bytes with its size and
tag, one request where the store allows it) and ``read_spans`` (many buffers filled from their
offsets, in concurrent requests of about a part each, or an error), over a local directory,
``memory://`` and a bucket of the loopback S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from pskd_jax.errors import TruncatedError
from pskd_jax.storage import Changed, StorageOptions, locate, resolve

PAYLOAD = np.random.default_rng(3).integers(0, 256, 700_001, dtype=np.uint8)


def _put(any_place: str, name: str, data: bytes, options: StorageOptions | None = None):
    store, where = resolve(locate(any_place).child(name), options)
    store.put(where.key, data)
    return store, where.key


def test_head_gives_the_first_bytes_size_and_tag(any_place):
    store, key = _put(any_place, "h.bin", PAYLOAD.tobytes())
    data, info = store.head(key, 1000)
    assert data == PAYLOAD[:1000].tobytes() and info.size == len(PAYLOAD) and info.tag == store.info(key).tag
    assert store.head(key, 10 << 20)[0] == PAYLOAD.tobytes()  # more than there is: all of it
    empty_store, empty = _put(any_place, "e.bin", b"")
    assert empty_store.head(empty, 100)[0] == b"" and empty_store.head(empty, 100)[1].size == 0
    assert store.head(locate(any_place).child("none.bin").key, 10) is None


def test_read_spans_fills_every_span_in_parts(any_place):
    options = StorageOptions(part_bytes=1 << 16, concurrency=4)
    store, key = _put(any_place, "s.bin", PAYLOAD.tobytes(), options)
    offsets = [0, 5, 300_000, 65_536, 699_000, 1]
    sizes = [3, 200_000, 250_000, 0, 1001, 1]
    outs = [np.zeros(n, np.uint8) for n in sizes]
    store.read_spans(key, [memoryview(o) for o in outs], offsets)
    for out, offset, n in zip(outs, offsets, sizes):
        assert np.array_equal(out, PAYLOAD[offset: offset + n])
    store.read_spans(key, [], [])


def test_read_spans_past_the_end_is_e9003(any_place):
    store, key = _put(any_place, "t.bin", PAYLOAD[:1000].tobytes(), StorageOptions(part_bytes=1 << 16))
    with pytest.raises(TruncatedError):
        store.read_spans(key, [memoryview(np.zeros(100, np.uint8))], [950])


def test_ranges_read_under_a_version_tag(any_place):
    """Every request asks for the version read before (If-Match): another version is Changed."""
    store, key = _put(any_place, "v.bin", PAYLOAD.tobytes())
    tag = store.info(key).tag
    starts, stops = [0, 10, 12, 400_000, 699_990, 50], [4, 12, 20, 400_100, 700_001, 50]
    for coalesce in (0, 16, None):  # exactly the ranges; those near merged; the client's default
        got = store.read_ranges(key, starts, stops, coalesce=coalesce, tag=tag)
        assert [bytes(memoryview(g).cast("B")) for g in got] == [PAYLOAD[a:b].tobytes() for a, b in zip(starts, stops)]
    out = np.zeros(100_000, np.uint8)
    store.read_into(key, 600_001, memoryview(out), tag=tag)
    assert out.tobytes() == PAYLOAD[600_001:].tobytes()
    store.put(key, PAYLOAD[::-1].tobytes())  # another version, of the same size
    assert store.info(key).tag != tag
    with pytest.raises(Changed) as info:
        store.read_ranges(key, starts, stops, coalesce=0, tag=tag)
    assert store.url(key) in str(info.value)
    with pytest.raises(Changed):
        store.read_into(key, 0, memoryview(out), tag=tag)
    assert bytes(store.read_ranges(key, [0], [3], tag=store.info(key).tag)[0]) == PAYLOAD[::-1][:3].tobytes()
