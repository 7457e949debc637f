"""Trees walked whole (issue 20, class 3): every field a node exposes is saved or the save is
refused naming it; a dataclass's ``init=False`` fields included; zero-size typed PRNG key arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pskd_jax.checkpoint import restore, save
from pskd_jax.errors import MismatchError
from pskd_jax.format.tree import flatten
from tests.helpers import pskd_ok


def _dataclass(flags: list[bool], frozen: bool):
    fields = [(f"f{k}", np.ndarray, dataclasses.field(init=init, default=None)) for k, init in enumerate(flags)]
    return dataclasses.make_dataclass("Made", fields, frozen=frozen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.booleans(), min_size=1, max_size=5), frozen=st.booleans())
def test_every_dataclass_field_is_saved(tmp_path, flags, frozen):
    kind = _dataclass(flags, frozen)
    made = kind(**{f"f{k}": np.full((2,), float(k)) for k, init in enumerate(flags) if init})
    for k, init in enumerate(flags):
        if not init:
            object.__setattr__(made, f"f{k}", np.full((2,), 100.0 + k))
    assert [p for p, _ in flatten(made)[0]] == [f".f{k}" for k in range(len(flags))]
    path = tmp_path / "d.psk.d"
    save(path, made)
    back = restore(path, as_numpy=True)
    assert list(back) == [f"f{k}" for k in range(len(flags))]
    for k, init in enumerate(flags):
        assert back[f"f{k}"][0] == (float(k) if init else 100.0 + k)
    template = kind(**{f"f{k}": np.zeros((2,)) for k, init in enumerate(flags) if init})
    for k, init in enumerate(flags):
        if not init:
            object.__setattr__(template, f"f{k}", np.zeros((2,)))
    again = restore(path, template, as_numpy=True)
    assert type(again) is kind
    for k, init in enumerate(flags):
        assert getattr(again, f"f{k}")[0] == (float(k) if init else 100.0 + k)


def test_a_field_with_no_value_is_refused_by_name(tmp_path):
    @dataclasses.dataclass
    class Unset:
        w: np.ndarray
        derived: np.ndarray = dataclasses.field(init=False)

    with pytest.raises(MismatchError, match=r"derived") as caught:
        save(tmp_path / "u.psk.d", {"model": Unset(np.ones(2))})
    assert "['model'].derived" in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_post_init_values_are_not_recomputed_on_restore(tmp_path):
    @dataclasses.dataclass
    class Counted:
        w: np.ndarray
        steps: np.ndarray = dataclasses.field(init=False)

        def __post_init__(self):
            self.steps = np.int64(0)

    c = Counted(np.ones(3))
    c.steps = np.int64(41)
    save(tmp_path / "c.psk.d", c)
    assert restore(tmp_path / "c.psk.d", Counted(np.zeros(3)), as_numpy=True).steps == 41


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3), (0, 0)])
def test_zero_size_typed_key_arrays(tmp_path, shape):
    jax = pytest.importorskip("jax")
    keys = jax.random.wrap_key_data(np.zeros(shape + (2,), np.uint32), impl="threefry2x32")
    path = tmp_path / "k.psk.d"
    save(path, {"k": keys, "w": np.ones(2)})
    back = restore(path, {"k": keys, "w": np.zeros(2)})
    assert back["k"].shape == shape and jax.dtypes.issubdtype(back["k"].dtype, jax.dtypes.prng_key)
    assert restore(path, as_numpy=True)["k"].shape == shape + (2,)


@pytest.mark.subprocess
def test_cli_info_of_init_false_fields(tmp_path):
    @dataclasses.dataclass
    class WithDerived:
        w: np.ndarray
        derived: np.ndarray = dataclasses.field(init=False, default=None)

    made = WithDerived(np.ones(2))
    made.derived = np.full((3,), 2.0)
    save(tmp_path / "m.psk.d", made)
    out = "\n".join(pskd_ok("info", tmp_path / "m.psk.d"))
    assert ".derived" in out and ".w" in out
