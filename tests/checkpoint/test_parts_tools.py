"""The tools that read ``.psk.d`` bytes — ``Reader``, info, export, diff, convert — on a checkpoint
several processes saved to a bucket (its object a parts index over part objects), on ``memory://``
and on the loopback S3 server: each gives exactly what it gives for the same checkpoint saved as
one object. A bad index is E9002; a part missing, cut short or replaced is E9003 (or, for a
reader's refresh, E9002) naming the index and the part, never a mix of two saves."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy

from pskd_jax import checkpoint as ck
from pskd_jax import data
from pskd_jax.checkpoint.parts import PartsIndex
from pskd_jax.data.info import iter_info_lines
from pskd_jax.format import byte_sources, write
from pskd_jax.format.byte_sources import StoreBytes, open_bytes
from pskd_jax.format.reader import Reader
from pskd_jax.storage import resolve
from tests.helpers import raises

from .helpers import split_into_parts


def _tree(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((40, 6)).astype(np.float32), "bias": rng.standard_normal(9),
            "layers": [{"w": rng.integers(-50, 50, (5, 4)).astype(np.int32)}, {"w": np.arange(7, dtype=np.uint8)}]}


def _pair(place: str, cuts: int = 9, parts: int = 3, seed: int = 0) -> tuple[str, str, bytes]:
    """The same tree saved as one object (``one``) and as a parts index over ``parts`` parts
    (``many``), the file cut at ``cuts`` random places; returns both URLs and the file's bytes."""
    tree = _tree(seed)
    one, many = f"{place}/ck/one.psk.d", f"{place}/ck/many.psk.d"
    ck.save(one, tree, ck.SaveOptions(digest="xxh3_128"))
    ck.save(many, tree, ck.SaveOptions(digest="xxh3_128"))
    store, where = resolve(many)
    size = store.info(where.key).size
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(np.arange(1, size), size=cuts, replace=False).tolist())
    raw = split_into_parts(many, chosen, rng.integers(0, parts, cuts + 1).tolist(), parts)
    assert store.get(where.key)[0].startswith(b'{"format": "pskd-parts"')
    return one, many, raw


def _index(url: str) -> PartsIndex:
    store, where = resolve(url)
    return PartsIndex.parse(store.get(where.key)[0], url)


def test_the_byte_source_of_a_parts_index_is_the_file_its_parts_hold(object_place, monkeypatch):
    one, many, raw = _pair(object_place)
    source = open_bytes(many)
    assert isinstance(source, StoreBytes) and source.parts is not None and len(source.part_tags) == 3
    assert source.size() == len(raw)
    rng = np.random.default_rng(1)
    offsets = rng.integers(0, len(raw) - 64, 40).tolist()
    lengths = rng.integers(0, 64, 40).tolist()
    spans = [bytearray(n) for n in lengths]
    source.read_spans([memoryview(s) for s in spans], offsets)
    assert [bytes(s) for s in spans] == [raw[o : o + n] for o, n in zip(offsets, lengths)]
    monkeypatch.setattr(byte_sources, "LARGE_SPAN", 100)  # large spans: each part read straight into them
    whole = bytearray(len(raw))
    source.read_at(memoryview(whole), 0)
    assert bytes(whole) == raw
    assert b"".join(bytes(b) for b in source.blocks(len(raw), 300)) == raw
    with raises("E9003", many, "ends before byte"):
        source.read_at(memoryview(bytearray(10)), len(raw) - 5)


def test_a_reader_of_a_data_file_in_many_parts_gathers_what_the_file_holds(object_place, tmp_path):
    rng = np.random.default_rng(2)
    values = (rng.integers(0, 100, (300, 8)), rng.standard_normal((300, 3)))
    local = str(tmp_path / "one.psk.d")
    write(local, "(idx[100][seq: 8], ℝ[3])", values)
    raw = (tmp_path / "one.psk.d").read_bytes()
    store, where = resolve(f"{object_place}/d/many.psk.d")
    store.put(where.key, raw)
    size = len(raw)
    cuts = sorted(rng.choice(np.arange(1, size), size=60, replace=False).tolist())
    split_into_parts(where.url, cuts, rng.integers(0, 4, 61).tolist(), 4)
    picks = rng.integers(0, 300, 500)
    with Reader(local) as a, Reader(where.url) as b:
        assert (len(a), a.file_size, a.header) == (len(b), b.file_size, b.header)
        for x, y in zip(a.gather(picks), b.gather(picks)):
            assert np.array_equal(x, y)
        assert b.refresh() == 300


def test_info_export_diff_and_convert_see_the_single_object(object_place, tmp_path):
    one, many, _ = _pair(object_place)
    layout_one, layout_many = ck.find_layout_file(one), ck.find_layout_file(many)
    assert layout_many is not None and layout_many.path.endswith("/ck/many.layout.json")
    lines = [list(iter_info_lines(url, samples=1, layout=found, values=True))
             for url, found in ((one, layout_one), (many, layout_many))]
    assert [line.replace("/one.", "/many.") for line in lines[0]] == lines[1] and len(lines[0]) > 5
    assert f"layout  {object_place}/ck/many.layout.json" in lines[1]
    counts = [data.export_json(url, str(tmp_path / f"{k}.json"), layout=found)
              for k, (url, found) in enumerate(((one, layout_one), (many, layout_many)))]
    assert counts == [1, 1] and (tmp_path / "0.json").read_bytes() == (tmp_path / "1.json").read_bytes()
    same = data.diff(one, many, layout_a=layout_one.layout, layout_b=layout_many.layout)
    assert same.diff_norm == 0.0 and same.a_norm > 0 and same.elements == 40 * 6 + 9
    assert data.diff(many, one, layout_a=layout_many.layout, layout_b=layout_one.layout) == \
        data.diff(one, one, layout_a=layout_one.layout, layout_b=layout_one.layout)

    store, _ = resolve(object_place + "/x")
    out = {}
    for name, url in (("one", one), ("many", many)):
        for there in (f"{object_place}/st/{name}.safetensors", str(tmp_path / f"{name}.safetensors")):
            assert ck.convert(url, there) == f"wrote {there} (4 tensors)"
        remote = store.get(resolve(f"{object_place}/st/{name}.safetensors")[1].key)[0]
        local = (tmp_path / f"{name}.safetensors").read_bytes()
        out[name] = [_loaded(remote), _loaded(local)]
    assert out["one"][0] == out["many"][0] == out["many"][1]
    assert not (tmp_path / "memory:").exists() and not (tmp_path / "s3:").exists()
    # ... and back, from the object, into an object: the file the single save wrote, byte for byte
    line = ck.convert(f"{object_place}/st/many.safetensors", f"{object_place}/back/b.psk.d")
    assert line.startswith(f"wrote {object_place}/back/b.psk.d (4 leaves of type params Params")
    keys = [resolve(u)[1].key for u in (one, f"{object_place}/back/b.psk.d")]
    assert store.get(keys[0])[0] == store.get(keys[1])[0]


def _loaded(raw: bytes) -> tuple:
    """A safetensors file's tensors (name, dtype, shape, bytes) and metadata: the library writes
    the metadata's entries in an order of its own, so files are compared by what they hold."""
    tensors = safetensors_numpy.load(raw)
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return (sorted((n, str(a.dtype), a.shape, a.tobytes()) for n, a in tensors.items()),
            header.get("__metadata__"))


def test_a_safetensors_object_converts_to_a_checkpoint_object(object_place, tmp_path):
    local = str(tmp_path / "src.safetensors")
    tensors = {"a.w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, 0, 1], np.uint8)}
    safetensors_numpy.save_file(tensors, local)
    store, where = resolve(f"{object_place}/in/src.safetensors")
    store.put(where.key, (tmp_path / "src.safetensors").read_bytes())
    there, here = f"{object_place}/out/c.psk.d", str(tmp_path / "c.psk.d")
    ck.convert(where.url, there)
    ck.convert(local, here)
    assert store.get(resolve(there)[1].key)[0] == (tmp_path / "c.psk.d").read_bytes()
    assert json.loads(store.get(resolve(f"{object_place}/out/c.layout.json")[1].key)[0])["safetensors"] is not None
    with raises("E9002", f"{object_place}/in/none.safetensors", "no such object"):
        ck.convert(f"{object_place}/in/none.safetensors", str(tmp_path / "x.psk.d"))
    assert not (tmp_path / "x.psk.d").exists()


def test_an_index_whose_parts_do_not_tile_the_file_is_e9002_for_every_tool(object_place):
    _, many, raw = _pair(object_place)
    store, where = resolve(many)
    index = _index(many)
    bad = index.to_json()
    bad["bytes"] = len(raw) + 1
    for content in (json.dumps(bad).encode(), b'{"format": "pskd-parts", "version": 1, "bytes": ',
                    json.dumps({**bad, "version": 2}).encode()):
        store.put(where.key, content)
        for open_it in (Reader, open_bytes, lambda u: list(iter_info_lines(u))):
            with raises("E9002", many):
                open_it(many)


@pytest.mark.parametrize("damage", ["missing", "cut short", "longer"])
def test_a_part_missing_or_not_its_size_is_e9003_naming_it(object_place, damage, tmp_path):
    _, many, _ = _pair(object_place)
    store, _ = resolve(many)
    index = _index(many)
    key = index.keys[1]
    if damage == "missing":
        store.delete(key)
    else:
        held = store.get(key)[0]
        store.put(key, held[:-1] if damage == "cut short" else held + b"\0")
    for open_it in (Reader, lambda u: ck.convert(u, str(tmp_path / "x.safetensors"))):
        with raises("E9003", many, store.url(key), "missing" if damage == "missing" else "the index lists"):
            open_it(many)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_part_replaced_under_an_open_reader_is_an_error_not_a_mix(object_place):
    _, many, raw = _pair(object_place)
    store, _ = resolve(many)
    index = _index(many)
    key = index.keys[0]
    held_by_part_0 = int(index.extents[index.extents[:, 2] == 0][0, 0])  # a file offset part 0 holds
    with Reader(many) as reader:
        source = reader._bytes
        assert isinstance(source, StoreBytes)
        held = store.get(key)[0]
        store.put(key, bytes(b ^ 0xFF for b in held))  # the same size, other bytes
        with raises("E9002", many, store.url(key), "replaced"):
            reader.refresh()
        with raises("E9003", many, store.url(key), "replaced"):
            b"".join(bytes(b) for b in source.blocks(len(raw)))
        with raises("E9003", many, store.url(key), "replaced"):  # a ranged read: held to the part's version
            source.read_spans([memoryview(bytearray(1))], [held_by_part_0])


def test_a_reader_whose_parts_a_later_save_removed_fails_e9003(object_place):
    """A later save at the same name puts new parts and index, then removes the parts it replaced:
    a reader still holding the old index gets E9003 naming the part, never the new save's bytes."""
    _, many, raw = _pair(object_place)
    store, where = resolve(many)
    old = _index(many)
    with Reader(many) as reader:
        ck.save(many, _tree(seed=7))  # (one object now)
        for key in old.keys:
            store.delete(key)
        with raises("E9003", store.url(old.keys[0])):
            reader._bytes.read_at(memoryview(bytearray(len(raw))), 0)
        with raises("E9002", many, "replaced"):
            reader.refresh()
