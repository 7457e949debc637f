"""The loader: batches in pipeline order on the device, sharded, across processes, resumable."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import pskd_jax
from pskd_jax.errors import PskdError
from pskd_jax.pipeline.batches import IteratorState
from pskd_jax.pipeline.parse import parse_pipeline
from tests.helpers import ENV, ROOT, free_port, run_python, wait_until

jax = pytest.importorskip("jax")
from pskd_jax.loader import Loader  # noqa: E402  (after the JAX check)

WORKER = ROOT / "tests" / "workers" / "loader_worker.py"


@pytest.fixture
def windows(tmp_path) -> pathlib.Path:
    path = tmp_path / "w.psk.d"
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 100, size=(50, 4))
    pskd_jax.write(path, "(idx[100][4], R[])", (tokens, np.arange(50.0, dtype=np.float32)))
    return path


PIPELINE = 'stream "w.psk.d" |> shuffle(seed = 3) |> batch(B = 8)'


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pskd-loader")]


def test_batches_arrive_on_the_device_in_pipeline_order(windows):
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        expected = [reader.gather(i) for _, i in pipeline.iter_batches(len(reader), epochs=2)]
        loader = Loader(reader, pipeline, epochs=2)
        got = list(loader)
    assert len(got) == 2 * (50 // 8)
    for (tokens, values), (want_tokens, want_values) in zip(got, expected):
        assert isinstance(tokens, jax.Array)
        assert np.array_equal(np.asarray(tokens), want_tokens)
        assert np.array_equal(np.asarray(values), want_values)
    assert loader.state == IteratorState(3, 0)
    assert loader_threads() == []


def test_state_after_each_batch_resumes_the_same_stream(windows):
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        whole = [np.asarray(t) for t, _ in Loader(reader, pipeline, epochs=2)]
        loader = Loader(reader, pipeline, epochs=2)
        for step, _ in enumerate(loader):
            saved = json.loads(json.dumps(loader.state.to_json()))
            rest = [np.asarray(t) for t, _ in Loader(reader, pipeline, epochs=2,
                                                     state=IteratorState.from_json(saved))]
            assert len(rest) == len(whole) - step - 1
            assert all(np.array_equal(a, b) for a, b in zip(rest, whole[step + 1 :]))


@pytest.mark.parametrize("state, words", [({"epoch": 1, "batch": 0}, "state must be an IteratorState"),
                                           (IteratorState(1, 10**6), "iterator state batch 1000000 is beyond")])
def test_a_state_no_iteration_starts_from_is_refused_when_the_loader_is_made(windows, state, words):
    """Not at the first batch (after the caller has set up a training run on it): at once, E9004,
    and no thread is left."""
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        with pytest.raises(PskdError, match=words) as raised:
            Loader(reader, pipeline, state=state)
        assert raised.value.code == "E9004" and loader_threads() == []


def test_breaking_out_or_raising_leaves_no_thread(windows):
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        for _ in Loader(reader, pipeline, prefetch=1):
            break
        assert loader_threads() == []
        with pytest.raises(RuntimeError, match="in the step"):
            for _ in Loader(reader, pipeline):
                raise RuntimeError("in the step")
        assert loader_threads() == []


def test_a_failing_source_raises_in_the_loop(windows):
    class Broken:
        def __len__(self):
            return 50

        def gather(self, indices):
            raise PskdError("E9003", "disk gone")

    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pytest.raises(PskdError, match="disk gone"):
        for _ in Loader(Broken(), pipeline):
            pass
    assert loader_threads() == []


def test_f64_leaves_are_refused_while_x64_is_disabled(tmp_path):
    path = tmp_path / "f.psk.d"
    pskd_jax.write(path, "R[2]", np.ones((16, 2)))
    pipeline = parse_pipeline('stream "f.psk.d" |> batch(B = 4)', base_dir=tmp_path)
    with pskd_jax.Reader(path) as reader, pytest.raises(PskdError, match="x64 disabled") as error:
        next(iter(Loader(reader, pipeline)))
    assert error.value.code == "E9004"


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_the_loader_keeps_ahead_of_a_slow_step(windows, prefetch):
    """While the step runs, the loader gathers and places the next batches, ``prefetch`` ahead
    in whole groups of batches: each time the loop asks, a batch is waiting. The "training
    step" here lasts until the loader has filled its queue (or has no batch left), however fast
    the machine is; nothing is timed."""
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        loader = Loader(reader, pipeline, epochs=3, prefetch=prefetch)
        assert loader.group_size == prefetch  # (groups of up to GROUP_SIZE batches)
        iterator = iter(loader)
        next(iterator)
        waiting, batches = [], 1
        while True:
            queue, producer = loader._queue, loader._thread
            wait_until(lambda: queue.full() or not producer.is_alive(), what="the loader filling its queue")
            waiting.append(loader.waiting())
            try:
                next(iterator)
            except StopIteration:
                assert waiting.pop() == 0  # (asked when no batch was left)
                break
            batches += 1
        assert batches == 3 * pipeline.batches_per_epoch(len(reader))
    # One ready each time; a full group of ``prefetch`` queued and the rest of the group being
    # taken at most.
    assert min(waiting) >= 1 and max(waiting) == 2 * prefetch - 1, waiting



class Watched:
    """A source that records each gather: the thread it ran on, its indices, and how many gathers
    ran at once."""

    def __init__(self, reader, fail_at: int | None = None):
        self.reader, self.fail_at = reader, fail_at
        self.calls: list[tuple[str, np.ndarray]] = []
        self.running = self.most_at_once = 0
        self.lock = threading.Lock()

    def __len__(self):
        return len(self.reader)

    def gather(self, indices):
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.calls.append((threading.current_thread().name, np.array(indices)))
            failing = len(self.calls) == self.fail_at
        try:
            if failing:
                raise PskdError("E9003", f"gather {self.fail_at} failed")
            return self.reader.gather(indices)
        finally:
            with self.lock:
                self.running -= 1


def test_groups_are_gathered_a_group_ahead_on_a_thread_of_their_own_one_at_a_time_in_order(windows):
    """The reads run on the loader's gathering thread, one gather at a time, in pipeline order,
    one group ahead of the group being placed: with the loop holding its first group, one group
    queued (prefetch 2: groups of 2) and the next blocked in its hand-over, one more is gathered."""
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        watched = Watched(reader)
        loader = Loader(watched, pipeline, epochs=3, prefetch=2)
        iterator = iter(loader)
        first = next(iterator)
        wait_until(lambda: len(watched.calls) == 4, what="the loader gathering a group ahead")
        # (a daemon, as the loader's own thread: a process ending mid-gather does not wait for it)
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("pskd-loader"))
        assert loader.in_flight == 4 * loader.group_size  # (the loop's, the queued, the placed, the gathered)
        rest = [np.asarray(tokens) for tokens, _ in iterator]
    assert {name for name, _ in watched.calls} == {"pskd-loader-gather"} and watched.most_at_once == 1
    expected = np.concatenate([i for _, i in pipeline.iter_batches(len(reader), epochs=3)])
    assert np.array_equal(np.concatenate([indices for _, indices in watched.calls]), expected)
    got = np.concatenate([np.asarray(first[0])] + rest)
    with pskd_jax.Reader(windows) as reader:
        assert np.array_equal(got, reader.gather(expected)[0])
    assert loader_threads() == []


def test_a_gather_failing_ahead_stops_the_loop_after_the_groups_before_it(windows):
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        watched = Watched(reader, fail_at=3)
        received = []
        with pytest.raises(PskdError, match="gather 3 failed"):
            for tokens, _ in Loader(watched, pipeline, prefetch=2):
                received.append(np.asarray(tokens))
        assert len(received) == 2 * 2  # (the two groups of two batches gathered before it)
        assert len(watched.calls) == 3  # (nothing read after the failing gather)
    assert loader_threads() == []


SHARDED = r"""
import sys, numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import pskd_jax
from pskd_jax.loader import Loader
from pskd_jax.pipeline import parse_pipeline
path = sys.argv[1]
assert len(jax.devices()) == 8
pipeline = parse_pipeline('stream "w.psk.d" |> shuffle(seed = 3) |> batch(B = 8)', base_dir=sys.argv[2])
reader = pskd_jax.Reader(path)
meshes = {
    "1d": (Mesh(np.array(jax.devices()), ("data",)), P("data")),
    "2d": (Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model")), P("data")),
}
for name, (mesh, spec) in meshes.items():
    sharding = NamedSharding(mesh, spec)
    expected = [reader.gather(i) for _, i in pipeline.iter_batches(len(reader), epochs=1)]
    loader = Loader(reader, pipeline, sharding=sharding, epochs=1)
    for (tokens, values), (want_tokens, want_values) in zip(loader, expected):
        assert tokens.sharding == sharding, tokens.sharding
        rows = {s.device: s.index[0] for s in tokens.addressable_shards}
        per_device = 8 // mesh.shape["data"]
        assert all(r.stop - r.start == per_device for r in rows.values()), rows
        assert np.array_equal(np.asarray(tokens), want_tokens)
        assert np.array_equal(np.asarray(values), want_values)
    print(name, "ok")
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_batches_land_sharded_on_a_1d_and_a_2d_mesh(windows):
    env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = run_python(SHARDED, windows, windows.parent, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["1d", "ok", "2d", "ok"]


def run_processes(n: int, data: pathlib.Path, out_dir: pathlib.Path, resume: dict | None = None) -> list[dict]:
    port = free_port()
    env = dict(ENV, JAX_PLATFORMS="cpu")
    outs = [out_dir / f"process{i}.json" for i in range(n)]
    extra = [json.dumps(resume)] if resume else []
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(i), str(n), str(port), str(data), str(outs[i]), *extra],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(n)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output[-3000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_processes_each_read_only_their_rows_and_resume_elastically(windows, tmp_path):
    pipeline = parse_pipeline(PIPELINE, base_dir=windows.parent)
    with pskd_jax.Reader(windows) as reader:
        single = [reader.gather(i)[0].tolist() for _, i in pipeline.iter_batches(len(reader), epochs=3)]
        all_indices = [i.tolist() for _, i in pipeline.iter_batches(len(reader), epochs=3)]
    two = run_processes(2, windows, tmp_path)
    for process, result in enumerate(two):
        assert result["batches"] == single[:5]
        # Each process gathered only its half of each global batch (after the one-sample probe),
        # a group of batches in one read. (The loader may have read a group ahead before the loop
        # stopped.)
        reads = [g for g in result["gathered"] if len(g) != 1]
        assert all(len(g) % 4 == 0 for g in reads)
        rows = [index for g in reads for index in g]
        assert [rows[k : k + 4] for k in range(0, 20, 4)] == [b[process * 4 : process * 4 + 4] for b in all_indices[:5]]
    # Saved under two processes after batch 3, resumed under one process with two devices.
    saved = two[0]["states"][2]
    (one,) = run_processes(1, windows, tmp_path, resume=saved)
    assert one["batches"] == single[3:8]
