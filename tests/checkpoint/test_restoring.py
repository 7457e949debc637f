"""checkpoint.restore (pskd_jax.checkpoint.restoring): targets that do not match refused naming the key
path, explicit casts, JAX results, zero-copy views, reads on threads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax._os.digests import file_sha256
from pskd_jax.checkpoint import SaveOptions, restoring
from pskd_jax.errors import PskdError

from .helpers import BF16, bits, random_finite


def test_params_without_target_or_layout_is_e9001(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(2)}, SaveOptions(layout_file=False))
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9001" and "c.layout.json" in e.value.message
    # with a target, the target supplies the layout
    back = ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(2)})
    np.testing.assert_array_equal(back["w"], [1, 1])


# ------------------------------------------------------------------------------------------------
# Mismatches


def saved(tmp_path, **options):
    tree = {"embed": np.ones((4, 8), np.float32), "blocks": [{"w": np.ones((8, 8), np.float32)}]}
    ck.save(tmp_path / "c.psk.d", tree, SaveOptions(**options))
    return tree


def test_shape_mismatch_names_key_path_expected_and_found(tmp_path):
    saved(tmp_path)
    target = {"embed": np.ones((4, 8), np.float32), "blocks": [{"w": np.ones((8, 4), np.float32)}]}
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", target)
    assert e.value.code == "E9005"
    assert "at ['blocks'][0]['w']: expected (8, 4) float32, found (8, 8) float32" in e.value.message


def test_structure_mismatch_names_the_key_path(tmp_path):
    saved(tmp_path)
    with pytest.raises(PskdError, match=r"target not in the checkpoint: \['blocks'\]\[1\]\['w'\]"):
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32),
                                          "blocks": [{"w": np.ones((8, 8), np.float32)}] * 2})
    # matched by key path through the layout file: another order is the same tree
    back = ck.restore(tmp_path / "c.psk.d", {"blocks": [{"w": np.ones((8, 8), np.float32)}],
                                             "embed": np.ones((4, 8), np.float32)})
    assert list(back) == ["blocks", "embed"]


def test_mismatch_without_the_layout_file_is_still_refused(tmp_path):
    saved(tmp_path, layout_file=False)
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32)})
    assert e.value.code == "E9005"
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.float32),
                                          "blocks": [{"w": np.ones((8, 9), np.float32)}]})
    assert e.value.code in ("E9003", "E9005")


def test_reals_into_an_integer_target_are_refused(tmp_path):
    saved(tmp_path)
    with pytest.raises(PskdError, match=r"at \['embed'\]: expected \(4, 8\) int32, found reals"):
        ck.restore(tmp_path / "c.psk.d", {"embed": np.ones((4, 8), np.int32),
                                          "blocks": [{"w": np.ones((8, 8), np.float32)}]})


def test_target_dtype_is_an_explicit_cast(tmp_path):
    tree = {"w": np.array([1.0, 1 + 2**-30, 0.1])}
    ck.save(tmp_path / "c.psk.d", tree)
    back = ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(3, np.float32)})
    assert back["w"].dtype == np.float32
    np.testing.assert_array_equal(back["w"], tree["w"].astype(np.float32))


# ------------------------------------------------------------------------------------------------
# JAX


def test_jax_targets_and_results(tmp_path, rng):
    tree = {"w": random_finite(rng, BF16, (16, 8)), "b": random_finite(rng, np.float32, (8,)),
            "step": np.int32(11)}
    ck.save(tmp_path / "c.psk.d", tree)
    specs = {k: jax.ShapeDtypeStruct(np.shape(x), x.dtype) for k, x in tree.items()}
    back = ck.restore(tmp_path / "c.psk.d", specs)
    assert isinstance(back["w"], jax.Array) and back["w"].dtype == jnp.bfloat16
    for key in tree:
        np.testing.assert_array_equal(bits(np.asarray(back[key])), bits(np.asarray(tree[key])))
    # no target: the stored dtypes, as JAX arrays
    plain = ck.restore(tmp_path / "c.psk.d", layout=tmp_path / "c.layout.json")
    assert isinstance(plain["b"], jax.Array) and plain["step"].dtype == jnp.int32


def test_f64_into_jax_with_x64_disabled(tmp_path):
    assert not jax.config.jax_enable_x64
    ck.save(tmp_path / "c.psk.d", {"w": np.array([0.1, 2.0])})
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", layout=tmp_path / "c.layout.json")
    assert e.value.code == "E9005" and "at ['w']" in e.value.message and "x64" in e.value.message
    with pytest.raises(PskdError, match="x64"):
        ck.restore(tmp_path / "c.psk.d", {"w": jax.ShapeDtypeStruct((2,), np.float64)})
    back = ck.restore(tmp_path / "c.psk.d", {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    assert back["w"].dtype == jnp.float32 and float(back["w"][0]) == float(np.float32(0.1))
    # numpy results are not JAX's business
    assert ck.restore(tmp_path / "c.psk.d", {"w": np.zeros(2)})["w"].dtype == np.float64


# ------------------------------------------------------------------------------------------------
# Views, reads on threads, refusals of the file itself


def test_zero_copy_views_are_read_only_and_outlive_everything(tmp_path, rng):
    tree = {"w": random_finite(rng, np.float32, (64, 4)), "h": random_finite(rng, BF16, (3,))}
    ck.save(tmp_path / "c.psk.d", tree)
    views = ck.restore(tmp_path / "c.psk.d", zero_copy=True)
    assert not views["w"].flags.writeable
    with pytest.raises(ValueError):
        views["w"][0, 0] = 1
    import gc

    gc.collect()
    np.testing.assert_array_equal(bits(views["w"]), bits(tree["w"]))
    np.testing.assert_array_equal(bits(views["h"]), bits(tree["h"]))


def test_pieces_cover_the_leaves_in_order():
    assert restoring._pieces({0: 10, 1: 0, 2: 25}, None) == [(0, 0, 10), (1, 0, 0), (2, 0, 25)]
    assert restoring._pieces({0: 10, 1: 0, 2: 25}, 10) == [(0, 0, 10), (1, 0, 0), (2, 0, 10), (2, 10, 20), (2, 20, 25)]


def test_large_restore_reads_on_threads_and_hashes_in_order(tmp_path, monkeypatch, rng):
    monkeypatch.setattr(restoring, "PARALLEL_READ_BYTES", 1)
    monkeypatch.setattr(restoring, "HASH_PIECE", 1000)
    tree = {f"l{i}": random_finite(rng, np.float32, (50, 7 + i)) for i in range(6)}
    result = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(digest="xxh3_128"))
    sha = file_sha256(tmp_path / "c.psk.d")
    xxh = result.digests["xxh3_128"]
    for digests in ({"xxh3_128": xxh}, {"sha256": sha}, {"xxh3_128": xxh, "sha256": sha}, {}, None):
        back = ck.restore(tmp_path / "c.psk.d", tree, digests=digests)
        for key in tree:
            np.testing.assert_array_equal(bits(back[key]), bits(tree[key]))


def test_a_failed_verified_restore_leaves_no_thread_behind(tmp_path, rng):
    import threading

    tree = {"w": random_finite(rng, np.float32, (100,))}
    digest = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(digest="xxh3_128")).digests["xxh3_128"]
    data = (tmp_path / "c.psk.d").read_bytes()
    (tmp_path / "c.psk.d").write_bytes(data[:-1])
    before = set(threading.enumerate())  # (an object store's own pool, kept by earlier tests, is not the restore's)
    with pytest.raises(PskdError, match="E9003"):
        ck.restore(tmp_path / "c.psk.d", tree, digests={"xxh3_128": digest})
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("pskd-")]


def test_restore_refuses_a_file_that_is_not_one_sample(tmp_path):
    from pskd_jax.format.writer import write

    write(tmp_path / "d.psk.d", "ℝ[2]", np.ones((3, 2)))
    with pytest.raises(PskdError, match="one sample"):
        ck.restore(tmp_path / "d.psk.d", as_numpy=True)


def test_truncated_checkpoint_is_e9003(tmp_path):
    ck.save(tmp_path / "c.psk.d", {"w": np.ones(100, np.float32)})
    data = (tmp_path / "c.psk.d").read_bytes()
    (tmp_path / "c.psk.d").write_bytes(data[:-1])
    with pytest.raises(PskdError) as e:
        ck.restore(tmp_path / "c.psk.d", as_numpy=True)
    assert e.value.code == "E9003"
