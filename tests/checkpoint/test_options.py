"""SaveOptions: one value for how a checkpoint is saved, checked once with messages naming the
parameter, taken by save, save_distributed, safetensors_to_pskd and the manager."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pskd_jax import checkpoint as ck
from pskd_jax.checkpoint import SaveOptions
from pskd_jax.errors import PskdError


def test_the_defaults_are_a_plain_save():
    options = SaveOptions()
    assert (options.name, options.encodings, options.round_to_encoding, options.finite_only, options.digest,
            options.layout_file, options.durable) == (None, None, False, False, None, True, True)


@pytest.mark.parametrize("field", ["round_to_encoding", "finite_only", "layout_file", "durable"])
@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_a_switch_is_true_or_false_and_named_when_not(field, value):
    with pytest.raises(PskdError) as e:
        SaveOptions(**{field: value})
    assert e.value.code == "E9012" and f"{field}=" in e.value.message and "True or False" in e.value.message


def test_numpy_booleans_are_switches():
    options = SaveOptions(durable=np.bool_(False), finite_only=np.True_)
    assert options.durable is False and options.finite_only is True


@pytest.mark.parametrize("digest", ["md5", True, False, 3, "", "SHA256"])
def test_a_digest_is_an_algorithm_or_none(digest):
    with pytest.raises(PskdError) as e:
        SaveOptions(digest=digest)
    assert e.value.code == "E9012" and "digest=" in e.value.message and "xxh3_128" in e.value.message


@pytest.mark.parametrize("name", ["1abc", "params", "idx", "", "a b", 5])
def test_a_name_is_an_identifier_of_a_params_type(name):
    with pytest.raises(PskdError) as e:
        SaveOptions(name=name)
    assert e.value.code == "E9001" and "params name" in e.value.message


@pytest.mark.parametrize("encodings", [123, object(), b"bf16"])
def test_encodings_are_a_label_a_sequence_or_a_dict(encodings):
    with pytest.raises(PskdError) as e:
        SaveOptions(encodings=encodings)
    assert e.value.code == "E9005" and "encodings=" in e.value.message


def test_encodings_are_copied_so_later_changes_do_not_reach_the_value():
    asked = {"['w']": "bf16"}
    sequence = ["f32", "bf16"]
    options, listed = SaveOptions(encodings=asked), SaveOptions(encodings=sequence)
    asked["['w']"] = "f64"
    sequence.append("f64")
    assert options.encodings == {"['w']": "bf16"} and listed.encodings == ("f32", "bf16")


def test_options_are_frozen_and_replace_checks_again():
    options = SaveOptions(name="Net")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.name = "Other"  # type: ignore[misc]
    assert options.replace(finite_only=True) == SaveOptions(name="Net", finite_only=True)
    with pytest.raises(PskdError, match="E9012.*durable="):
        options.replace(durable="no")


def test_every_save_path_takes_the_value_and_refuses_anything_else(tmp_path):
    tree = {"w": np.full(3, 0.1)}
    result = ck.save(tmp_path / "a.psk.d", tree, SaveOptions(encodings="bf16", round_to_encoding=True,
                                                              digest="xxh3_128", name="Net"))
    assert result.type_text == "params Net" and [e.label for e in result.encodings] == ["bf16"]
    assert list(result.digests) == ["xxh3_128"] and result.rounding
    back = ck.restore(tmp_path / "a.psk.d", as_numpy=True, digests=result.digests)["w"]
    assert back.dtype.name == "bfloat16"  # (a leaf saved narrower gives its stored values)
    for bad in ({"durable": False}, "bf16", 3):
        with pytest.raises(PskdError) as e:
            ck.save(tmp_path / "b.psk.d", tree, bad)  # type: ignore[arg-type]
        assert e.value.code == "E9012" and "expected SaveOptions" in e.value.message
    assert not (tmp_path / "b.psk.d").exists()
    plain = ck.save(tmp_path / "c.psk.d", tree, SaveOptions(layout_file=False))
    assert plain.layout_path is None and plain.digests == {} and not (tmp_path / "c.layout.json").exists()


def test_a_save_result_is_made_one_way(tmp_path):
    result = ck.save(tmp_path / "a.psk.d", {"w": np.ones(2, np.float32)}, SaveOptions(digest="sha256"))
    assert result.path == str(tmp_path / "a.psk.d") and result.layout_path == str(tmp_path / "a.layout.json")
    assert result.bytes == (tmp_path / "a.psk.d").stat().st_size and result.version == 2
    assert list(result.digests) == ["sha256"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.bytes = 0  # type: ignore[misc]


def test_the_plan_follows_the_options():
    planned = ck.plan({"w": np.ones(2, np.float32)}, SaveOptions(name="Net", encodings="bf16"))
    assert planned.type_text == "params Net" and [e.label for e in planned.placement.encodings] == ["bf16"]
