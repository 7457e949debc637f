"""The Loader opens what the pipeline text streams: a .psk.d file, a corpus's windows (with segments)
or a mixture's sources; a source passed with the text is checked against it; a batch the mesh does
not divide, or one larger than the machine, is refused at construction (E9010)."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

import pskd_jax
from pskd_jax.corpus.segments import segment_ids_and_positions
from pskd_jax.corpus.windows import CorpusWindows
from pskd_jax.errors import PskdError
from pskd_jax.format.encodings import Encoding
from pskd_jax.format.header import encode_header
from pskd_jax.pipeline import IteratorState, parse_pipeline
from pskd_jax.storage import resolve
from tests.corpus.helpers import write_corpus
from tests.helpers import ENV, run_python

jax = pytest.importorskip("jax")
from pskd_jax.loader import Loader, opening  # noqa: E402  (after the JAX check)


def corpus_pieces(seed: int, shards: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    pieces = []
    for _ in range(shards):
        tokens = rng.integers(0, 256, int(rng.integers(150, 300)))
        tokens[rng.random(len(tokens)) < 0.06] = 256  # the boundary
        pieces.append(tokens)
    return pieces


@pytest.fixture
def data(tmp_path) -> pathlib.Path:
    write_corpus(tmp_path / "a", corpus_pieces(1))
    write_corpus(tmp_path / "b", corpus_pieces(2, 2))
    rng = np.random.default_rng(3)
    pskd_jax.write(tmp_path / "w.psk.d", "(idx[100][4], R[])",
                   (rng.integers(0, 100, (50, 4)), np.arange(50.0, dtype=np.float32)))
    return tmp_path


def host(batch) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in batch]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


FILE = 'stream "w.psk.d" |> shuffle(seed = 3) |> batch(B = 8)'
MIX = ('mix(stream "a/shards.json" |> shuffle(seed = 1) : 3, stream "b/shards.json" |> shuffle(seed = 2) : 1) '
       '|> batch(B = 6) |> take(n = 12)')


def test_the_loader_opens_the_file_the_text_streams(data, monkeypatch):
    with pskd_jax.Reader(data / "w.psk.d") as reader:
        pipeline = parse_pipeline(FILE, base_dir=data)
        want = [reader.gather(i) for _, i in pipeline.iter_batches(len(reader), epochs=1)]
    with Loader(FILE, base_dir=data, epochs=1) as loader:
        got = [host(b) for b in loader]
        assert isinstance(loader.source, pskd_jax.Reader) and loader.text == pipeline
    assert len(got) == len(want) == 6 and all(same(g, w) for g, w in zip(got, want))
    with pytest.raises(PskdError, match="E9012.*the reader is closed"):  # the loader opened it, and closed it
        loader.source.gather([0])
    monkeypatch.chdir(data)  # relative to the current directory by default
    with Loader(FILE, epochs=1) as loader:
        assert all(same(host(g), w) for g, w in zip(loader, want))
    with Loader(data / "p.pipeline" if (data / "p.pipeline").write_text(FILE) else None, epochs=1) as loader:
        assert all(same(host(g), w) for g, w in zip(loader, want))  # a pipeline file: relative to itself


def test_the_loader_opens_a_corpus_with_segments(data):
    text = 'stream "a/shards.json" |> shuffle(seed = 5) |> batch(B = 4)'
    with CorpusWindows(data / "a" / "shards.json", seq=16, stride=8) as windows:
        pipeline = parse_pipeline(text, base_dir=data)
        want = [windows.gather(i) for _, i in pipeline.iter_batches(len(windows), epochs=1)]
    with Loader(text, seq=16, stride=8, base_dir=data, epochs=1) as plain:
        assert all(same(host(g), w) for g, w in zip(plain, want))
    with Loader(text, seq=16, stride=8, segments=True, base_dir=data, epochs=1) as loader:
        got = [host(b) for b in loader]
    assert len(got) == len(want)
    for (inputs, targets, ids, positions), (want_inputs, want_targets) in zip(got, want):
        assert np.array_equal(inputs, want_inputs) and np.array_equal(targets, want_targets)
        want_ids, want_positions = segment_ids_and_positions(want_inputs, 256)
        assert np.array_equal(ids, want_ids) and np.array_equal(positions, want_positions)
    assert any((ids > 1).any() for _, _, ids, _ in got)


def test_the_loader_opens_what_a_url_streams_by_what_it_holds(data, object_place):
    """A manifest in a store is a corpus whatever its name, a .psk.d object a Reader; a URL the
    toolkit cannot serve is E9018 naming it."""
    (data / "doc.txt").write_text("a b c d " * 40)
    store, where = resolve(f"{object_place}/c/manifest")
    build = pskd_jax.build_corpus([str(data / "doc.txt")], f"{object_place}/c")
    store.put(where.key, store.get(where.parent().child("shards.json").key)[0])  # the manifest, under another name
    local = pskd_jax.build_corpus([str(data / "doc.txt")], str(data / "c"))
    text = 'stream "{}" |> batch(B = 4) |> take(n = 3)'
    with Loader(text.format(data / "c" / "shards.json"), seq=8, epochs=1) as loader:
        want = [host(b) for b in loader]
    for streamed in (build.manifest.path, where.url):
        with Loader(text.format(streamed), seq=8, epochs=1) as loader:
            assert isinstance(loader.source, CorpusWindows)
            assert all(same(host(g), w) for g, w in zip(loader, want)) and len(want) == 3
    pskd_jax.write(f"{object_place}/w.json", "idx[4][]", np.arange(5) % 4)  # a .psk.d, whatever its name
    with Loader('stream "{}" |> batch(B = 5)'.format(f"{object_place}/w.json"), epochs=1) as loader:
        assert isinstance(loader.source, pskd_jax.Reader)
    for bad in ("s3:/bkt/c/shards.json", "hdfs://x/shards.json"):
        with pytest.raises(PskdError, match=f"E9018: {bad}"):
            Loader(text.format(bad), seq=8, epochs=1)
    assert local.manifest.shards[0].sha256 == build.manifest.shards[0].sha256


def test_a_linked_manifest_streams_the_shards_beside_its_target(data):
    """A stream of a ``shards.json`` linked from another corpus's directory reads the shards beside
    the link's target, not those of the same names beside the link (docs/corpus.md)."""
    (data / "b" / "a.json").symlink_to(os.path.join("..", "a", "shards.json"))
    text = 'stream "{}" |> batch(B = 4) |> take(n = 5)'
    with Loader(text.format("a/shards.json"), seq=8, base_dir=data, epochs=1) as loader:
        want = [host(b) for b in loader]
    with Loader(text.format("b/a.json"), seq=8, base_dir=data, epochs=1) as loader:
        assert all(same(host(g), w) for g, w in zip(loader, want)) and len(want) == 5


def test_a_wrong_path_or_missing_seq_is_an_error_naming_it(data):
    with pytest.raises(PskdError, match="E9010: the stream '.*nowhere.psk.d' does not exist") as e:
        Loader('stream "nowhere.psk.d" |> batch(B = 2)', base_dir=data)
    assert str(data) in str(e.value)
    with pytest.raises(PskdError, match="E9010.*a directory.*stream its manifest .*a/shards.json"):
        Loader('stream "a" |> batch(B = 2)', base_dir=data)
    with pytest.raises(PskdError, match="E9012.*is a corpus: give the window length"):
        Loader('stream "a/shards.json" |> batch(B = 2)', base_dir=data)
    with pytest.raises(PskdError, match="E9012.*segments=True needs a corpus"):
        Loader(FILE, base_dir=data, segments=True)
    with pytest.raises(PskdError, match="E9010.*pipeline:1:33: source 1: the stream '.*nowhere/shards.json' does "
                                        "not exist"):
        Loader('mix(stream "a/shards.json" : 1, stream "nowhere/shards.json" : 1) |> batch(B = 2)', seq=8,
               base_dir=data)
    with pytest.raises(PskdError, match="E9012.*a loader's pipeline is its text"):
        Loader(42)


def test_a_url_streaming_nothing_is_e9010_naming_its_place_as_a_path_is(data, object_place):
    """A stream's URL with no object there was E9002 'no such object' without the stream's place
    in the text (a path's is E9010 naming it), and with segments=True E9012 calling the missing
    object a .psk.d file; a corpus's prefix streamed in place of its manifest was 'no such object'
    where a corpus directory names its manifest."""
    (data / "doc.txt").write_text("a b c d " * 40)
    pskd_jax.build_corpus([str(data / "doc.txt")], f"{object_place}/c")
    missing = f"{object_place}/nowhere/shards.json"
    mix = 'mix(stream "a/shards.json" : 1, stream "{}" : 1) |> batch(B = 2)'
    for segments in (False, True):
        with pytest.raises(PskdError, match="E9010") as e:
            Loader(mix.format(missing), seq=8, segments=segments, base_dir=data)
        assert str(e.value) == (f"E9010: pipeline:1:33: source 1: the stream {missing!r} does not exist (no object "
                                "at that key)")
    for prefix in (f"{object_place}/c", f"{object_place}/c/"):
        with pytest.raises(PskdError, match="E9010") as e:
            Loader(f'stream "{prefix}" |> batch(B = 2)', seq=8)
        assert str(e.value).endswith(f'it is a corpus\'s prefix; stream its manifest "{object_place}/c/shards.json"')
    with Loader(mix.format(f"{object_place}/c/shards.json"), seq=8, segments=True, base_dir=data) as loader:
        assert len(next(iter(loader))) == 4


@pytest.mark.parametrize("options", [{"seq": 8}, {"seq": -1}, {"stride": 0}, {"seq": 8, "stride": 4}])
def test_seq_and_stride_over_psk_d_files_alone_are_refused_not_ignored(data, options):
    """seq= and stride= cut a corpus's windows: over .psk.d files alone they went unheeded (seq=-1
    read the batches), as train_lm and pskd pipeline refuse them."""
    name = next(iter(options))
    mix = 'mix(stream "w.psk.d" : 1, stream "w.psk.d" |> shuffle(seed = 1) : 2) |> batch(B = 2)'
    for text in (FILE, mix):
        with pytest.raises(PskdError, match=f"E9012: {name}= cuts a corpus's windows; .*w.psk.d is a .psk.d file"):
            Loader(text, base_dir=data, **options)
    with pskd_jax.Reader(data / "w.psk.d") as reader, pytest.raises(PskdError, match=f"E9012: {name}= cuts"):
        Loader(reader, parse_pipeline(FILE, base_dir=data), **options)
    mixed = 'mix(stream "a/shards.json" : 1, stream "w.psk.d" : 1) |> batch(B = 2)'  # (a corpus among them: taken)
    with pytest.raises(PskdError, match="has samples of type"):
        Loader(mixed, base_dir=data, seq=4)


def test_a_source_given_is_checked_against_the_text(data):
    pipeline = parse_pipeline(FILE, base_dir=data)
    with pskd_jax.Reader(data / "w.psk.d") as reader:
        for loader in (Loader(reader, pipeline, epochs=1), Loader(FILE, source=reader, base_dir=data, epochs=1),
                       Loader(reader, FILE, base_dir=data, epochs=1)):
            with loader:
                assert loader.source is reader and len(list(loader)) == 6
        assert len(reader.gather([0, 1])[0]) == 2  # (a source given is the caller's to close)
        with pytest.raises(PskdError, match="E9010.*the text streams .*other.psk.d', but the source given reads "):
            Loader(reader, 'stream "other.psk.d" |> batch(B = 2)', base_dir=data)
        with pytest.raises(PskdError, match="E9012.*a source given twice"):
            Loader(reader, pipeline, source=reader)
    text = 'stream "a/shards.json" |> batch(B = 2)'
    with CorpusWindows(data / "a" / "shards.json", seq=8) as windows:
        with pytest.raises(PskdError, match="E9010.*seq=16 was asked, but the windows given are cut with seq=8"):
            Loader(windows, text, seq=16, base_dir=data)
        with pytest.raises(PskdError, match="E9010.*segments=True was asked"):
            Loader(windows, text, segments=True, base_dir=data)
        with Loader(windows, text, seq=8, base_dir=data, epochs=1) as loader:
            assert len(list(loader)) == len(windows) // 2


def test_base_dir_beside_a_pipeline_of_relative_paths_is_refused(data, tmp_path, monkeypatch):
    # A Pipeline's (Mixture's) paths are resolved already: base_dir would be ignored, and the
    # loader would open a file of the same name in the current directory instead.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for text in (FILE, 'mix(stream "w.psk.d" : 1, stream "w.psk.d" |> shuffle(seed = 1) : 2) |> batch(B = 2) '
                       '|> take(n = 3)'):
        with pytest.raises(PskdError, match="E9012.*base_dir=.* joins the paths of a pipeline's text"):
            Loader(parse_pipeline(text), base_dir=data)
        # (resolved already: nothing to join)
        with Loader(parse_pipeline(text, base_dir=data), base_dir=data, epochs=1) as loader:
            assert len(list(loader)) >= 1
        with Loader(text, base_dir=data, epochs=1) as loader:
            assert len(list(loader)) >= 1


def test_mixture_batches_through_the_loader_and_resume_at_every_batch(data):
    mixture = parse_pipeline(MIX, base_dir=data)
    a = CorpusWindows(data / "a" / "shards.json", seq=8, segments=True)
    b = CorpusWindows(data / "b" / "shards.json", seq=8, segments=True)
    counts = (len(a), len(b))
    want = []
    for j in range(12):
        sources, indices = mixture.batch_indices(counts, 1, j)
        rows = [a.gather(np.array([i])) if s == 0 else b.gather(np.array([i]))
                for s, i in zip(sources.tolist(), indices.tolist())]
        want.append([np.concatenate(leaf) for leaf in zip(*rows)])
    with Loader(MIX, seq=8, segments=True, base_dir=data) as loader:
        got, states = [], []
        for batch in loader:
            got.append(host(batch))
            states.append(json.loads(json.dumps(loader.state.to_json())))
    assert len(got) == 12 and all(same(g, w) for g, w in zip(got, want))
    assert len(got[0]) == 4 and got[0][2].dtype == np.int16
    for k, saved in enumerate(states):  # the state saved after each batch resumes the rest exactly
        with Loader(MIX, seq=8, segments=True, base_dir=data, state=IteratorState.from_json(saved)) as rest:
            assert all(same(host(g), w) for g, w in zip(rest, want[k + 1 :]))
    with Loader(MIX, source=[a, b], base_dir=data) as given:  # the sources given, in the text's order
        assert all(same(host(g), w) for g, w in zip(given, want))
    with pytest.raises(PskdError, match="E9010: pipeline:1:5: source 0: the text streams .*a/shards.json., "
                                        "but the source given reads .*b/shards.json"):
        Loader(MIX, source=[b, a], base_dir=data)
    with pytest.raises(PskdError, match="E9010.*mixes 2 sources, but 1 were given"):
        Loader(MIX, source=[a], base_dir=data)
    plain = CorpusWindows(data / "b" / "shards.json", seq=8)
    with pytest.raises(PskdError, match="E9010.*source 1 .* has no segments"):
        Loader(MIX, source=[a, plain], base_dir=data)
    for s in (a, b, plain):
        s.close()


def test_a_mixture_of_samples_of_two_types_is_refused_at_the_text(data):
    text = 'mix(stream "a/shards.json" : 1,\n    stream "w.psk.d" : 1) |> batch(B = 2)'
    with pytest.raises(PskdError, match=r"E9010: pipeline:2:5: source 1 \(stream \".*w.psk.d\"\) has samples of type"):
        Loader(text, seq=4, base_dir=data)


def test_a_batch_larger_than_the_machine_is_refused_at_construction(tmp_path):
    header = encode_header("ℝ[8]", 2**30, [Encoding.F64])
    (tmp_path / "huge.psk.d").write_bytes(header)
    os.truncate(tmp_path / "huge.psk.d", len(header) + 2**30 * 64)  # 64 GiB of samples, a sparse file
    with pytest.raises(PskdError, match=r"E9010.*batch\(B = 1000000000\) of samples of 64 bytes .* memory"):
        Loader('stream "huge.psk.d" |> shuffle(seed = 1) |> batch(B = 1000000000)', base_dir=tmp_path)
    (tmp_path / "empty.psk.d").write_bytes(encode_header("ℝ[0]", 2**40, [Encoding.F64]))
    with Loader('stream "empty.psk.d" |> shuffle(seed = 1) |> batch(B = 1000000000)', base_dir=tmp_path) as loader:
        assert loader.pipeline.batch_size == 10**9  # zero bytes a batch: accepted (indices read in parts)


def test_the_memory_check_counts_the_batches_in_flight(data, monkeypatch):
    monkeypatch.setattr(opening, "physical_memory", lambda: 10_000)
    # 8 samples of 8 bytes (4 u8 tokens, an f32); the default prefetch of such small batches is 32:
    # (32 in the queue + a group of 32 being placed + the group of 32 gathered ahead of it + the
    # group the loop takes from) batches in flight: 8192 bytes.
    Loader(FILE, base_dir=data).close_sources()
    refused = r"E9010.*batch\(B = 8\) of samples of 8 bytes is 64 bytes.* 128 batches.*8192 bytes"
    with pytest.raises(PskdError, match=refused):
        monkeypatch.setattr(opening, "physical_memory", lambda: 500)
        Loader(FILE, base_dir=data)


SHARDED = r"""
import sys, numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pskd_jax.errors import PskdError
from pskd_jax.loader import Loader
base = sys.argv[1]
assert len(jax.devices()) == 8
four = NamedSharding(Mesh(np.array(jax.devices()[:4]), ("data",)), P("data"))
try:
    Loader('stream "w.psk.d" |> batch(B = 6)', base_dir=base, sharding=four)
except PskdError as e:
    print("refused", e.code, "B = 6" in str(e), "the 4 devices" in str(e))
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
try:
    Loader('stream "w.psk.d" |> batch(B = 6)', base_dir=base, sharding=NamedSharding(mesh, P(("data", "model"))))
except PskdError as e:
    print("refused", e.code, "the 8 devices" in str(e))
sharding = NamedSharding(mesh, P("data"))
text = ('mix(stream "a/shards.json" |> shuffle(seed = 1) : 3, stream "b/shards.json" |> shuffle(seed = 2) : 1) '
        '|> batch(B = 8) |> take(n = 3)')
whole = [[np.asarray(x) for x in b] for b in Loader(text, seq=8, segments=True, base_dir=base)]
with Loader(text, seq=8, segments=True, base_dir=base, sharding=sharding) as loader:
    for batch, want in zip(loader, whole):
        assert len(batch) == 4
        for leaf, w in zip(batch, want):
            assert leaf.sharding == sharding, leaf.sharding
            assert all(s.data.shape[0] == 2 for s in leaf.addressable_shards)
            assert np.array_equal(np.asarray(leaf), w)
print("sharded ok")
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_indivisible_batch_is_refused_and_mixtures_with_segments_land_sharded(data):
    env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = run_python(SHARDED, data, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["refused E9010 True True", "refused E9010 True", "sharded ok"]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("segments", [False, True])
def test_mapped_corpora_read_through_one_view_as_each_alone(data, monkeypatch, segments, compiled):
    """A mixture of mapped corpora is read through one view over all their maps (by the compiled
    gather where the package has it, else numpy's fancy index): every batch, windows across
    shards (read by their own source) included, equals each source's own reads; and a refreshed
    corpus is taken up (the view made again)."""
    from pskd_jax.loader import mixed

    compiled_reads = []
    real_gathered = mixed.gathered_windows
    monkeypatch.setattr(mixed, "gathered_windows", lambda *a: compiled_reads.append(1) or real_gathered(*a)
                        if compiled else None)
    paths = [data / "a" / "shards.json", data / "b" / "shards.json"]
    mapped = [CorpusWindows(p, seq=8, stride=3, segments=segments) for p in paths]
    read = [CorpusWindows(p, seq=8, stride=3, segments=segments, access="pread") for p in paths]
    joint_reads = []
    real = mixed._joint_windows
    monkeypatch.setattr(mixed, "_joint_windows", lambda *a: joint_reads.append(real(*a)) or joint_reads[-1])
    rng = np.random.default_rng(4)
    for _ in range(40):
        which = rng.integers(0, 2, 16)
        pairs = np.stack([which, [rng.integers(0, len(mapped[s])) for s in which]], axis=1)
        want = [np.concatenate(leaf) for leaf in zip(*[mapped[s].gather([i]) for s, i in pairs.tolist()])]
        for sources in (mapped, read):
            assert same(mixed.MixedSource(sources).gather(pairs), want)
    # Every batch went through the one view: a window across shards is read by its own source.
    assert joint_reads and all(r is not None for r in joint_reads)
    assert bool(compiled_reads) is compiled  # (the mapped batches' reads asked the compiled gather)
    crossing = mixed.MixedSource(mapped)
    state = mapped[0]._now()  # a window of source 0 that starts in one shard and ends in the next
    across = next(i for i in range(len(mapped[0]))
                  if int(np.searchsorted(state.offsets, 3 * i, side="right")) - 1 < len(state.inside_end)
                  and 3 * i >= state.inside_end[int(np.searchsorted(state.offsets, 3 * i, side="right")) - 1])
    pairs = np.array([[0, across], [1, 0], [0, 0]])
    assert same(crossing.gather(pairs), [np.concatenate(leaf) for leaf in
                                         zip(*[mapped[s].gather([i]) for s, i in pairs.tolist()])])
    assert joint_reads[-1] is not None
    source = mixed.MixedSource(mapped)
    pairs = np.array([[0, 1], [1, 2], [0, 3]])
    before = source.gather(pairs)
    write_corpus(data / "b", corpus_pieces(9, 2))  # the corpus rebuilt: the view follows the refresh
    assert mapped[1].refresh()
    after = source.gather(pairs)
    assert same(after, [np.concatenate(leaf) for leaf in zip(*[mapped[s].gather([i]) for s, i in pairs.tolist()])])
    assert not same(after, before)
    for s in mapped + read:
        s.close()


def test_a_memory_error_on_the_thread_is_e9010_in_the_loop():
    class Huge:
        def __len__(self):
            return 100

        def gather(self, indices):
            raise MemoryError

    with pytest.raises(PskdError, match=r"E9010: .*batch\(B = 4\).*a batch of 4 samples does not fit in memory"):
        for _ in Loader(Huge(), 'stream "huge.psk.d" |> batch(B = 4)'):
            pass


@pytest.mark.parametrize("access", ["mmap", "pread"])
def test_a_shard_cut_short_under_a_mixture_is_named_as_its_source_names_it(data, access):
    from pskd_jax.loader import mixed

    paths = [data / "a" / "shards.json", data / "b" / "shards.json"]
    sources = [CorpusWindows(p, seq=8, access=access) for p in paths]
    reader = mixed.MixedSource(sources)
    pairs = np.array([[0, 1], [1, 0], [0, 2]])
    assert same(reader.gather(pairs), [np.concatenate(leaf) for leaf in zip(*[sources[s].gather([i])
                                                                               for s, i in pairs.tolist()])])
    shard = sorted((data / "b").glob("*.psk.d"))[0]
    os.truncate(shard, 40)  # (every window of its shard 0 past the end: refused by either access)
    with pytest.raises(PskdError, match="E9003: .*/b/(shards.json|s0.psk.d)"):  # as source 1 alone names it
        reader.gather(pairs)
    for s in sources:
        s.close()


def test_the_default_prefetch_is_sized_by_the_bytes_of_a_batch(tmp_path):
    pskd_jax.write(tmp_path / "small.psk.d", "idx[256][seq: 4]", np.zeros((64, 4), np.uint8))
    with Loader('stream "small.psk.d" |> batch(B = 8)', base_dir=tmp_path) as loader:
        assert (loader.prefetch, loader.group_size) == (32, 32)  # 32 bytes a batch: the most
    with Loader('stream "small.psk.d" |> batch(B = 8)', base_dir=tmp_path, prefetch=3) as loader:
        assert (loader.prefetch, loader.group_size) == (3, 3)
    # Samples of 2 MiB (a sparse file), 4 a batch: 8 MiB a batch, 2 of them in 16 MiB.
    header = encode_header("ℝ[524288]", 4, [Encoding.F32])
    with open(tmp_path / "large.psk.d", "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * (2 << 20))
    with Loader('stream "large.psk.d" |> batch(B = 4)', base_dir=tmp_path) as loader:
        assert (loader.prefetch, loader.group_size) == (2, 2)
        assert np.asarray(next(iter(loader))).shape == (4, 524288)


LEFT_OPEN = """
import sys
from pskd_jax.loader import Loader
text = 'mix(stream "a/shards.json" |> shuffle(seed = 1) : 3, stream "b/shards.json" : 1) |> batch(B = 4)'
for access in ("mmap", "pread"):
    loader = Loader(text, seq=8, segments=True, access=access, base_dir=sys.argv[1])
    for n, batch in enumerate(loader):
        if n == 3:
            break
    loader.close()  # (the thread stops; the corpora it opened are left for the exit to collect)
print("done")
"""


@pytest.mark.subprocess
def test_sources_left_open_at_exit_close_quietly(data):
    """A program that stops a Loader without closing the corpora it opened exits without an
    ignored exception on its standard error (objects collected at the interpreter's exit close their files with
    no module-level name, which may be gone by then)."""
    result = run_python(LEFT_OPEN, data)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
