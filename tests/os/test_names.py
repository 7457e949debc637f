"""On-disk names (pskd_jax._os.names): every name built is recognised as what it is and gives back
what it was built from; near misses (other widths, suffixes, cases, characters) are not recognised."""

from __future__ import annotations

import os
import tempfile

import pytest

from pskd_jax._os import names

STEPS = [0, 1, 7, 99, 12345678, 99999999, 100000000, 2**40, 10**20]
SHARDS = [0, 1, 42, 99999, 100000, 1234567, 10**12]


@pytest.mark.parametrize("step", STEPS)
def test_step_files_and_layouts_round_trip(step):
    assert names.step_of(names.step_file(step)) == step
    assert names.step_of(names.step_layout(step)) == step
    assert names.step_file(step).endswith(names.PSKD_SUFFIX)
    assert names.step_layout(step).endswith(names.LAYOUT_SUFFIX)
    assert names.layout_path_for(names.step_file(step)) == names.step_layout(step)


def test_step_names_sort_in_step_order_up_to_eight_digits():
    steps = [0, 1, 9, 10, 99, 100, 12345678, 99999999]
    assert sorted(names.step_file(s) for s in reversed(steps)) == [names.step_file(s) for s in steps]


@pytest.mark.parametrize("name", [
    "step-1.psk.d", "step-0000001.psk.d", "step-000000001.psk.d", "step-00000001.psk", "step-00000001.psk.d.tmp",
    "step-00000001.layout.json.bak", "step-00000001.layout", "Step-00000001.psk.d", "STEP-00000001.PSK.D",
    "step--0000001.psk.d", "step-+0000001.psk.d", "step-0000000a.psk.d", "step-00000001 .psk.d",
    " step-00000001.psk.d", "step-00000001.psk.d ", "step-00000001.psk.d\n", ".step-00000001.psk.d",
    "step_00000001.psk.d", "step-０００００００1.psk.d", "step-00000001.psk.d.layout.json", "step-.psk.d",
    "step-00000001", "checkpoints.json", "",
])
def test_near_misses_are_not_steps(name):
    assert names.step_of(name) is None


@pytest.mark.parametrize("index", SHARDS)
def test_shard_names_round_trip(index):
    assert names.shard_index(names.shard_name(index)) == index
    assert names.step_of(names.shard_name(index)) is None


@pytest.mark.parametrize("name", [
    "shard-1.psk.d", "shard-0001.psk.d", "shard-000001.psk.d", "shard-00001.psk", "shard-00001.psk.d.tmp",
    "shards-00001.psk.d", "Shard-00001.psk.d", "shard-0000a.psk.d", "shard--0001.psk.d", ".shard-00001.psk.d",
    "shard-00001.psk.d ", "shard-０００01.psk.d", "shard-.psk.d", "shards.json", "",
])
def test_near_misses_are_not_shards(name):
    assert names.shard_index(name) is None


def test_the_reserved_names_are_neither_steps_nor_shards():
    reserved = [names.CHECKPOINT_INDEX, names.CHECKPOINT_LOCK, names.CORPUS_MANIFEST, names.CORPUS_LOCK,
                names.CORPUS_JOURNAL]
    assert len(set(reserved)) == len(reserved)
    for name in reserved:
        assert names.step_of(name) is None and names.shard_index(name) is None


@pytest.mark.parametrize("output", ["step-00000003.psk.d", "checkpoints.json", "w.psk.d", "a.b.c", "x", "é.psk.d"])
def test_temporary_files_locks_and_distributed_temporaries_are_recognised(tmp_path, output):
    fd, temporary = tempfile.mkstemp(prefix=names.temporary_prefix(output), suffix=".tmp", dir=tmp_path)
    os.close(fd)
    temporary = os.path.basename(temporary)
    assert names.temporary_pattern(output).fullmatch(temporary)
    assert names.leftover(temporary) == ("random", output)
    lock = names.save_lock(tmp_path / output)
    assert os.path.dirname(lock) == str(tmp_path)
    assert names.leftover(os.path.basename(lock)) == ("lock", output)
    distributed = names.distributed_temporary(tmp_path / output)
    assert os.path.dirname(distributed) == str(tmp_path)
    assert names.leftover(os.path.basename(distributed)) == ("distributed", output)
    kept = names.layout_before(tmp_path / output)  # (the old layout a commit keeps meanwhile)
    assert os.path.dirname(kept) == str(tmp_path)
    assert names.leftover(os.path.basename(kept)) == ("layout-before", output)
    assert not names.is_layout_name(kept) and names.data_path_for(kept) is None
    for made in (temporary, os.path.basename(lock), os.path.basename(distributed), os.path.basename(kept)):
        assert made.startswith(".")  # hidden beside the output
        assert names.step_of(made) is None and names.shard_index(made) is None


def test_one_outputs_temporary_pattern_matches_no_other_outputs_files():
    pattern = names.temporary_pattern("a.psk.d")
    assert pattern.fullmatch(".a.psk.d.ab_12cd3.tmp")
    for other in (".b.psk.d.ab_12cd3.tmp", ".a.psk.d.ab_12cd3.tmp.keep", "a.psk.d.ab_12cd3.tmp",
                  ".a.psk.d.toolong99.tmp", ".a.psk.d.short.tmp", ".a.psk.d.AB_12CD3.tmp", ".aXpsk.d.ab_12cd3.tmp",
                  ".xa.psk.d.ab_12cd3.tmp", ".a.psk.d.ab-12cd3.tmp"):
        assert not pattern.fullmatch(other), other


@pytest.mark.parametrize("name", ["x.tmp", ".x.tmp", ".x.abc.tmp", ".x.ABCDEFGH.tmp", ".x.lock.bak", "x.lock",
                                  ".lock", ".x.distributed.tmp.old", "x.distributed.tmp",
                                  "x.layout-before", ".x.layout-before.tmp", ".layout-before", ".x.abcdefgh.tmp2", ""])
def test_near_misses_are_not_leftovers(name):
    assert names.leftover(name) is None


def test_layout_path_for_other_names():
    assert names.layout_path_for("dir/model.psk.d") == "dir/model.layout.json"
    assert names.layout_path_for("model.bin") == "model.bin.pskd-layout.json"  # (issue 20: never m.psk.d's)
    assert names.layout_path_for("a.psk.d.psk.d") == "a.psk.d.layout.json"  # only the last suffix goes
