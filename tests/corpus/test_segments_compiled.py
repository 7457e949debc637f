"""The compiled scan of packed segments (pskd_jax/corpus/_segments.c) itself: built where a
compiler is, its own checks of its buffers, and its token-by-token form (what a compiler
without GCC's vector types builds). That its arrays equal the definition's is
tests/corpus/test_segments.py's, which runs each of its tests with both scans."""

from __future__ import annotations

import platform
import types
from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from pskd_jax.corpus import segments
from tests.helpers import C_COMPILER_FOUND, run_python

COMPILED = segments._native  # (None where the package was built without a C compiler)
# Only a machine without a C compiler (or Python's headers) has no compiled scan to test: where
# one is found the first test below requires the scan to be built, so these never skip there.
NEEDS_THE_SCAN = pytest.mark.skipif(COMPILED is None, reason="no C compiler here: the package runs on numpy's scan")
NEEDS_A_COMPILER = pytest.mark.skipif(not C_COMPILER_FOUND, reason="no C compiler or Python headers here")


def test_the_compiled_scan_is_built_where_a_compiler_is():
    """Where a C compiler and Python's headers are, the install (setup.py) built the scan: a
    failed build, which setup.py lets pass so that an install without a compiler works, is
    caught here."""
    assert COMPILED is not None or not C_COMPILER_FOUND, \
        "a C compiler is here but pskd_jax.corpus._segments is not built: reinstall (pip install -e .), read its errors"


@NEEDS_THE_SCAN
def test_the_compiled_scan_checks_what_keeps_it_inside_its_buffers():
    inputs = np.zeros((2, 8), np.uint16)
    out = np.empty((2, 2, 8), np.int16)
    assert COMPILED.fill(inputs, 9, 8, out, 1) is True
    assert out[0].tolist() == [[1] * 8] * 2 and out[1].tolist() == [list(range(8))] * 2
    with pytest.raises(TypeError, match="tokens of 8 bytes"):
        COMPILED.fill(np.zeros((2, 8), np.int64), 9, 8, np.empty((2, 2, 8), np.int16), 1)
    with pytest.raises(TypeError, match="outputs of 8 bytes"):
        COMPILED.fill(inputs, 9, 8, np.empty((2, 2, 8), np.int64), 1)
    with pytest.raises(ValueError, match="not whole windows"):
        COMPILED.fill(inputs, 9, 5, np.empty((2, 2, 8), np.int16), 1)
    with pytest.raises(ValueError, match="not whole windows"):
        COMPILED.fill(inputs, 9, 8, np.empty((2, 8), np.int16), 1)
    with pytest.raises(ValueError, match="does not fit"):
        COMPILED.fill(inputs, 1 << 16, 8, np.empty((2, 2, 8), np.int16), 1)
    with pytest.raises(ValueError, match="not C-contiguous"):  # (numpy's own refusal of the buffer)
        COMPILED.fill(np.zeros((2, 16), np.uint16)[:, ::2], 9, 8, np.empty((2, 2, 8), np.int16), 1)
    with pytest.raises(BufferError, match="read-only|not writable"):
        COMPILED.fill(inputs, 9, 8, bytes(64), 1)
    with pytest.raises(OverflowError):  # (a bound is an unsigned 64-bit integer)
        COMPILED.fill(inputs, 9, 8, out, -1)


@NEEDS_THE_SCAN
def test_the_compiled_scan_uses_avx2s_vectors_where_the_processor_has_them():
    """32-byte vectors where the processor has AVX2 (x86-64 Linux: its flags say), else 16; a
    width asked for is 16, or 32 where it runs; any other is refused."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    used = COMPILED.VECTOR_BYTES
    if platform.machine() in ("x86_64", "AMD64") and flags:
        assert used == (32 if "avx2" in flags else 16)
    else:
        assert used in (16, 32)
    inputs = np.array([[5, 9, 6, 7, 9] * 20], np.uint16)
    want = np.empty((2, 1, 100), np.int16)
    COMPILED.fill(inputs, 9, 100, want, 1 << 16, 16)
    for width in (16, COMPILED.VECTOR_BYTES):
        out = np.empty((2, 1, 100), np.int16)
        assert COMPILED.fill(inputs, 9, 100, out, 1 << 16, width) is True and np.array_equal(out, want)
    for width in (0, 8, 64, -2):
        with pytest.raises(ValueError, match=f"vectors of {width} bytes are not scanned here"):
            COMPILED.fill(inputs, 9, 100, want, 1 << 16, width)


@NEEDS_THE_SCAN
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_the_compiled_scans_bound_check_finds_one_token_anywhere(dtype):
    """fill's answer (every token below the bound) against numpy's, for one token at the bound
    or just below it at every place of windows around the blocks of 32 (in a block's vectors
    and in a window's last tokens, taken one by one), and for bounds beyond the tokens' range."""
    top = int(np.iinfo(dtype).max)
    for seq in (1, 15, 16, 31, 32, 33, 47, 64, 70):
        for bound in (1, 2, 200, top, top + 1, 1 << 40, (1 << 64) - 1):
            for place in range(2 * seq):
                inputs = np.zeros((2, seq), dtype)
                inputs[:, ::5] = 3 % bound if bound < 4 else 3  # (boundaries among them)
                for token in (t for t in (bound - 1, bound) if 0 <= t <= top):
                    inputs.flat[place] = token
                    for width in {16, COMPILED.VECTOR_BYTES}:
                        out = np.empty((2, 2, seq), np.int16)
                        assert COMPILED.fill(inputs, 3, seq, out, bound, width) is bool(inputs.max() < bound), \
                            (seq, bound, place, token, width)
    assert COMPILED.fill(np.zeros((1, 4), dtype), 3, 4, np.empty((2, 1, 4), np.int16), 0) is False
    assert COMPILED.fill(np.zeros((0, 4), dtype), 3, 4, np.empty((2, 0, 4), np.int16), 0) is True


def record_views(tokens: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of ``seq``-token records a byte apart over ``tokens``, the inputs' and the targets'
    (one token on), as CorpusWindows makes them over its maps."""
    item = tokens.dtype.itemsize
    base = tokens.view(np.uint8)
    span = len(base) - (seq + 1) * item + 1
    record = np.dtype((np.void, seq * item))
    return tuple(as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]), shape=(span,), strides=(1,),
                            writeable=False) for skip in (0, item))


@NEEDS_THE_SCAN
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("seq", [1, 7, 32, 33, 100, 40000])
def test_the_compiled_gather_equals_numpys_copies_checks_and_scan(dtype, seq):
    """gather's rows, bound check and segments against numpy's fancy index of the same views,
    the vocabulary check and fill, for every token width, both output widths (T above 32767
    takes int32), with and without segments, in each width of vectors."""
    rng = np.random.default_rng(seq)
    item = np.dtype(dtype).itemsize
    tokens = rng.integers(0, 200, 3 * seq + 50).astype(dtype)
    tokens[rng.random(len(tokens)) < 0.05] = 250
    views = record_views(tokens, seq)
    positions = rng.integers(0, len(tokens) - seq, 5)
    records = positions.astype(np.int64) * item
    want_inputs = views[0][records].view(dtype).reshape(5, seq)
    want_targets = views[1][records].view(dtype).reshape(5, seq)
    out_dtype = segments.segment_dtype(seq)
    want_out = np.empty((2, 5, seq), out_dtype)
    COMPILED.fill(want_inputs, 250, seq, want_out, 1 << 40)
    for bound in (None, 200, 250, 251, int(tokens[positions[2] + seq]), 1 << 40):
        limit = (1 << 64) - 1 if bound is None else bound
        below = bound is None or bool(max(want_inputs.max(), want_targets[:, -1].max()) < bound)
        for width in {16, COMPILED.VECTOR_BYTES}:
            for segmented in (False, True):
                inputs, targets = np.empty((5, seq), dtype), np.empty((5, seq), dtype)
                out = np.empty((2, 5, seq), out_dtype) if segmented else None
                got = COMPILED.gather(views[0], views[1], records, inputs, targets, out, 250, limit, width)
                assert got is below, (bound, width, segmented)
                assert np.array_equal(inputs, want_inputs) and np.array_equal(targets, want_targets)
                assert out is None or np.array_equal(out, want_out)


@NEEDS_THE_SCAN
def test_the_compiled_gather_checks_what_keeps_it_inside_its_buffers():
    tokens = np.arange(40, dtype=np.uint16)
    views = record_views(tokens, 4)
    records = np.array([0, 2, 60], np.int64)
    inputs, targets, out = np.zeros((3, 4), np.uint16), np.zeros((3, 4), np.uint16), np.zeros((2, 3, 4), np.int16)

    def gather(*changed, **named):
        args = dict(zip(["views0", "views1", "records", "inputs", "targets", "out", "boundary", "bound"],
                        [views[0], views[1], records, inputs, targets, out, 9, 1 << 16]))
        args.update(named)
        return COMPILED.gather(*args.values(), *changed)

    assert gather() is True and inputs[2].tolist() == [30, 31, 32, 33] and targets[2].tolist() == [31, 32, 33, 34]
    assert out[0].tolist() == [[1, 1, 1, 1]] * 3  # (no boundary: 9 is not a token at these places)
    inputs[:] = 0
    with pytest.raises(IndexError, match="record 72 of row 1 is outside the views' 71 records"):
        gather(records=np.array([0, 72, 4], np.int64))
    assert not inputs.any()  # (refused before anything is copied)
    with pytest.raises(IndexError, match="record -2 of row 0"):
        gather(records=np.array([-2, 0, 4], np.int64))
    with pytest.raises(TypeError, match="records are int64"):
        gather(records=records.astype(np.int32))
    with pytest.raises(TypeError, match="tokens of 8 bytes"):
        gather(inputs=np.zeros((3, 1), np.int64), targets=np.zeros((3, 1), np.int64))
    with pytest.raises(ValueError, match="are what is gathered"):
        gather(inputs=np.zeros((2, 4), np.uint16))
    with pytest.raises(ValueError, match="are what is gathered"):
        gather(views0=record_views(tokens, 5)[0])
    with pytest.raises(ValueError, match="does not fit"):
        gather(boundary=1 << 16)
    with pytest.raises(ValueError, match="not twice the rows' tokens"):
        gather(out=np.zeros((2, 3, 3), np.int16))
    with pytest.raises(ValueError, match="not twice the rows' tokens"):
        gather(out=np.zeros((2, 3, 4), np.int64))
    read_only = np.zeros((3, 4), np.uint16)
    read_only.setflags(write=False)
    with pytest.raises((BufferError, ValueError), match="read-only|not writable"):  # (numpy's own refusal)
        gather(targets=read_only)
    with pytest.raises(ValueError, match="vectors of 8 bytes"):
        gather(8)


@NEEDS_THE_SCAN
@pytest.mark.parametrize("with_segments", [False, True])
def test_a_mapped_corpus_gathers_by_the_compiled_pass_and_pread_by_its_reads(tmp_path, monkeypatch, with_segments):
    """A mapped corpus's gather is one call of the compiled gather (the same leaves as numpy's
    copies and passes); one read with access="pread" is not."""
    from pskd_jax.corpus import CorpusWindows

    from .helpers import write_corpus

    path = write_corpus(tmp_path / "c", [np.arange(3000) % 257, np.arange(500) % 200])
    calls = []
    counted = types.SimpleNamespace(fill=COMPILED.fill, gather=lambda *args: calls.append(1) or COMPILED.gather(*args))
    batch = np.array([0, 5, 40, 44, 3000 // 16])  # (window 187 crosses into the second shard)
    for access, wanted in (("mmap", 1), ("pread", 0)):
        with CorpusWindows(path, seq=16, access=access, segments=with_segments) as windows:
            monkeypatch.setattr(segments, "_native", None)
            expected = windows.gather(batch)
            monkeypatch.setattr(segments, "_native", counted)
            calls.clear()
            got = windows.gather(batch)
            assert len(calls) == wanted, access
            assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


@pytest.mark.slow
@pytest.mark.subprocess
@NEEDS_A_COMPILER
@pytest.mark.parametrize("macro", ["PSKD_SEGMENTS_BY_TOKEN", "PSKD_SEGMENTS_PORTABLE"])
def test_the_scans_other_forms_equal_numpys(tmp_path, macro):
    """The compiled scan as other compilers and processors build it: token by token (a compiler
    without GCC's vector types, MSVC: PSKD_SEGMENTS_BY_TOKEN), and in vectors with the boundaries
    of a block found from the compares' words (a processor other than x86, which has no
    movemask: PSKD_SEGMENTS_PORTABLE); built here with the macro, loaded in a fresh process in
    place of the installed one, and compared with numpy's on windows of every length around the
    blocks of 32, in each width of vectors, by fill and by gather."""
    source = Path(segments.__file__).with_name("_segments.c")
    build = run_python(f"""
        from setuptools import Extension, setup
        setup(script_args=["-q", "build_ext", "--build-lib", {str(tmp_path)!r},
                           "--build-temp", {str(tmp_path / "t")!r}],
              ext_modules=[Extension("pskd_jax.corpus._segments", [{str(source)!r}],
                                     define_macros=[({macro!r}, "1")])])
        """, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    (built,) = (tmp_path / "pskd_jax" / "corpus").glob("_segments.*")
    check = run_python("""
        import importlib.machinery, importlib.util, sys, types
        import numpy as np
        from numpy.lib.stride_tricks import as_strided
        from pskd_jax.corpus import segments
        spec = importlib.util.spec_from_file_location(
            "pskd_jax.corpus._segments", sys.argv[1], loader=importlib.machinery.ExtensionFileLoader(
                "pskd_jax.corpus._segments", sys.argv[1]))
        scan = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scan)
        assert scan.__file__ == sys.argv[1]
        assert (scan.VECTOR_BYTES == 0) == (sys.argv[2] == "PSKD_SEGMENTS_BY_TOKEN"), scan.VECTOR_BYTES
        narrowest = 16 if scan.VECTOR_BYTES else 0
        narrow = types.SimpleNamespace(fill=lambda *a: scan.fill(*a, narrowest),
                                       gather=lambda *a: scan.gather(*a, narrowest))
        rng = np.random.default_rng(3)
        for dtype in (np.uint8, np.uint16, np.uint32):
            for seq in (1, 31, 32, 33, 64, 100, 40000):
                inputs = rng.integers(0, 200, (3, seq)).astype(dtype)
                inputs[rng.random(inputs.shape) < 0.05] = 250
                for bound in (None, 250, 251, int(inputs.max()), int(inputs.max()) + 1):
                    segments._native = None
                    want = segments.segments_below(inputs, 250, bound)
                    for form in (scan, narrow):
                        segments._native = form
                        got = segments.segments_below(inputs, 250, bound)
                        assert got[2] == want[2], (dtype, seq, bound)
                        same = all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got[:2], want[:2]))
                        assert same, (dtype, seq)
                # gather: windows of a stream of these tokens, against numpy's copies and the scan above
                stream = np.concatenate([inputs.reshape(-1), inputs.reshape(-1)[:1]])
                item, base = stream.dtype.itemsize, stream.view(np.uint8)
                record = np.dtype((np.void, seq * item))
                views = [as_strided(np.ndarray((1,), dtype=record, buffer=base[skip:]),
                                    shape=(len(base) - (seq + 1) * item + 1,), strides=(1,), writeable=False)
                         for skip in (0, item)]
                records = np.arange(3, dtype=np.int64) * seq * item
                for form in (scan, narrow):
                    segments._native = form
                    leaves, below = segments.gathered_windows(tuple(views), records, stream.dtype, 250, None, True)
                    assert below and np.array_equal(leaves[0], inputs), (dtype, seq)
                    segments._native = None
                    ids, positions = segments.segment_ids_and_positions(inputs, 250)
                    assert np.array_equal(leaves[2], ids) and np.array_equal(leaves[3], positions), (dtype, seq)
        print("same")
        """, built, macro)
    assert check.returncode == 0 and check.stdout.strip() == "same", check.stderr[-3000:]
