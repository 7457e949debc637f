"""Files cut short under ``diff`` and under corpus windows: E9003 naming the file, never a SIGBUS.

``diff`` opens each file once, maps neither, and reads both with positional reads of those
descriptors; ``CorpusWindows(access="mmap")`` checks the size of each shard a gather copies from
before copying. Each case runs in a child process (a SIGBUS there is a failed test, not a dead
suite), in the style of ``test_changing_files.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pskd_jax.corpus import BuildOptions
from pskd_jax.format import Reader, write
from tests.helpers import ENV

pytestmark = pytest.mark.subprocess


def run_child(script: str, *args, cwd) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode != -signal.SIGBUS, "killed by SIGBUS: " + run.stderr[-2000:]
    return run


# ``pskd diff A B`` whose A or B is cut short after its first read: the data file's reads go
# through Reader.read_data; the second one cuts the file (blocks of samples, or chunks inside a
# sample when BLOCK_BYTES is made smaller than a sample).
DIFF_CUT = """
    import os, sys
    from pskd_jax.data import distance
    from pskd_jax.format import reader as reader_module
    victim, block = sys.argv[1], int(sys.argv[2])
    distance.BLOCK_BYTES, distance.CHUNK_ELEMENTS = block, 4096
    real, calls = reader_module.Reader.read_data, []
    def cutting(self, *args):
        calls.append(1)
        if len(calls) == 3:
            os.truncate(victim, 200)
        return real(self, *args)
    reader_module.Reader.read_data = cutting
    from pskd_jax.apps import pskd
    sys.argv = ["pskd", *sys.argv[3:]]
    pskd.run()
"""


def two_files(tmp_path, rows: int = 64, width: int = 8192):
    a, b = tmp_path / "a.psk.d", tmp_path / "b.psk.d"
    values = np.arange(rows * width, dtype=np.float64).reshape(rows, width)
    write(a, f"ℝ[{width}]", values, durable=False)
    write(b, f"ℝ[{width}]", values + 1, durable=False)
    return a, b


@pytest.mark.parametrize("victim", ["a", "b"])
@pytest.mark.parametrize("how", ["blocks of samples", "inside a sample"])
def test_diff_of_a_file_cut_short_while_read_is_E9003_naming_it(tmp_path, victim, how):
    a, b = two_files(tmp_path)
    cut = a if victim == "a" else b
    block = 4 * 8192 * 8 if how == "blocks of samples" else 1024  # four samples a block, or less than one
    run = run_child(DIFF_CUT, cut, block, "diff", a, b, cwd=tmp_path)
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert run.stderr.startswith("pskd: E9003: ") and run.stderr.count("\n") == 1, run.stderr
    assert str(cut) in run.stderr and "Traceback" not in run.stderr


def test_diff_maps_neither_file(tmp_path):
    """The readers diff opens are positional: nothing of either file is ever mapped."""
    a, b = two_files(tmp_path, rows=4, width=16)
    code = """
        import sys
        from pskd_jax.data import diff
        result = diff(sys.argv[1], sys.argv[2])
        maps = [line for line in open("/proc/self/maps") if sys.argv[1] in line or sys.argv[2] in line]
        print(result.elements, len(maps))
    """
    run = run_child(code, a, b, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.split() == ["64", "0"], run.stdout + run.stderr


# Corpus windows over a shard cut short after they opened it: a mapped gather checks the size of
# each shard it copies from first.
WINDOWS_CUT = """
    import os, sys
    import numpy as np
    from pskd_jax.corpus import CorpusWindows
    from pskd_jax.errors import PskdError
    manifest, victim, how, kept = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    if kept == "none":  # (no descriptor kept: the guard is a stat of the shard's path)
        from pskd_jax._os import maps
        maps.KEPT_DESCRIPTORS._limit = lambda: 0
    with CorpusWindows(manifest, seq=8, access="mmap") as windows:
        windows.gather(np.arange(len(windows)))
        os.truncate(victim, 100)
        try:
            if how == "gather":
                windows.gather(np.arange(len(windows)))
            elif how == "getitem":  # a window of the shard cut short
                windows[0 if victim.endswith("00000.psk.d") else len(windows) - 1]
            else:
                windows.stream(0, windows.total_tokens)
        except PskdError as e:
            print(e.code, victim in e.message)
            sys.exit(0)
    print("no error")
"""


def corpus_of_two_shards(tmp_path):
    from pskd_jax import corpus
    inputs = []
    for i in range(2):
        path = tmp_path / f"in{i}.jsonl"
        path.write_text("".join(json.dumps({"text": f"document {k} of input {i} " * 20}) + "\n" for k in range(200)))
        inputs.append(path)
    built = corpus.build_corpus(inputs, tmp_path / "c", BuildOptions(durable=False))
    return built.manifest.path, [built.manifest.shard_path(i) for i in range(2)]


@pytest.mark.parametrize("kept", ["descriptor", "none"])
@pytest.mark.parametrize("shard", [0, 1])
@pytest.mark.parametrize("how", ["gather", "getitem", "stream"])
def test_mapped_windows_over_a_shard_cut_short_answer_E9003_naming_it(tmp_path, shard, how, kept):
    # A mapped shard keeps its descriptor within the process's budget (an fstat guards a copy) and
    # none beyond it (a stat of its path, while that names the mapped file): both catch the cut.
    manifest, shards = corpus_of_two_shards(tmp_path)
    run = run_child(WINDOWS_CUT, manifest, shards[shard], how, kept, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.split() == ["E9003", "True"], run.stdout + run.stderr


def test_windows_still_whole_are_served_after_the_check(tmp_path):
    """The check costs one fstat (or stat) a shard a batch touches, and a whole corpus reads as before."""
    from pskd_jax.corpus import CorpusWindows
    manifest, shards = corpus_of_two_shards(tmp_path)
    stream = []
    for path in shards:
        with Reader(path) as reader:
            stream.append(np.array(reader.leaves()[0]))
    stream = np.concatenate(stream)
    with CorpusWindows(manifest, seq=8, access="mmap") as windows, \
            CorpusWindows(manifest, seq=8, access="pread") as reference:
        indices = np.arange(len(windows))
        for got, want in zip(windows.gather(indices), reference.gather(indices)):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(windows.stream(0, windows.total_tokens), stream)

