"""Rolling slices by default (``rolling_slices=None`` under ``checkpoint_mode="auto"``): a
first batch that loads at least ``auto_changelog_size`` is written as slices, a smaller one
incrementally; the number of slices follows the partition's state and changelog sizes; a
batch that changed nothing rewrites no slice and the oldest slice is the next one due;
every checkpoint of a random history restores to the model."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_changelog import Model, apply, restore_durable
from test_rolling_slices import KGR, OP, checkpoint_each, random_batch

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint import slices as sl
from statebackend.checkpoint.materialize import wait_for_materializations
from statebackend.model.manifest import SliceRef
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store

# the defaults these tests are about, named: the suite's switches
# (STATEBACKEND_TEST_CHECKPOINT_MODE, ..._ROLLING_SLICES) change the unnamed ones
DEFAULT = {"checkpoint_mode": "auto", "rolling_slices": None}


def test_the_count_follows_state_over_changelog_and_keeps_its_cut() -> None:
    kgr = (0, 63)
    # no units and no sizes yet: 32; requested counts win; 3 key groups: off
    assert sl.slice_count(None, kgr, (), 0, ()) == 32
    assert sl.slice_count(7, kgr, (), 10**9, (10**6,)) == 7
    assert sl.slice_count(None, (0, 2), (), 10**9, (10**6,)) == 0
    # 0.55 x state / mean changelog, within 4..key groups
    assert sl.slice_count(None, kgr, (), 10**9, (10**7,)) == 55      # 1% churn
    assert sl.slice_count(None, kgr, (), 10**9, (5 * 10**7,)) == 11  # 5%
    assert sl.slice_count(None, kgr, (), 10**9, (10**5,)) == 64      # 0.01%: clipped
    assert sl.slice_count(None, kgr, (), 10**9, (4 * 10**8,)) == 4   # 40%: at least 4
    # the current cut (its newest unit's count) is kept within a factor of 1.5
    cut16 = tuple(SliceRef(a, b, 5, of=16) for a, b in sl.slice_ranges(kgr, 16))
    assert sl.slice_count(None, kgr, cut16, 10**9, (3 * 10**7,)) == 16  # ideal 18
    assert sl.slice_count(None, kgr, cut16, 10**9, (5 * 10**7,)) == 16  # ideal 11
    assert sl.slice_count(None, kgr, cut16, 10**9, (6 * 10**7,)) == 9   # ideal 9.2
    assert sl.slice_count(None, kgr, cut16, 10**9, (10**7,)) == 55
    assert sl.slice_count(None, kgr, cut16, 0, ()) == 16
    # a unit written before the count was recorded: its span says it
    assert sl.slice_count(None, kgr, (SliceRef(0, 3, 5),), 0, ()) == 16


def small_batch(rng: random.Random) -> list[tuple]:
    return [("batch", "s1", [(kg.to_bytes(2, "big") + b"k%03d" % rng.randint(0, 9),
                              bytes(rng.randrange(256) for _ in range(40)))])
            for kg in rng.sample(range(KGR[1] + 1), 3)]


@pytest.mark.parametrize("kept_open", [True, False])
@pytest.mark.parametrize("seed", [1, 2])
def test_default_options_roll_a_large_partition(tmp_path: Path, kept_open: bool,
                                                seed: int) -> None:
    rng = random.Random(seed)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(auto_changelog_size="8k", max_parallelism=16, **DEFAULT)
    assert opts.rolling_slices is None and sl.rolling_on(opts)
    batches = [random_batch(rng, big=True) if n == 1 else [] if n in (9, 10)
               else small_batch(rng) if n % 3 else random_batch(rng) for n in range(1, 31)]
    manifests, _model = checkpoint_each(store, opts, str(tmp_path / "local"), batches,
                                        kept_open)
    first = manifests[0]
    # the load is written as slices, every one, and no changelog or base
    assert first.mode == "changelog" and not first.changelog_files and not first.db_files
    keyed = sorted((u.first_kg, u.last_kg) for u in first.slices if not u.is_global)
    assert keyed[0][0] == KGR[0] and keyed[-1][1] == KGR[1] and len(keyed) >= 4
    # a batch that changed nothing rewrites no slice
    for m in manifests[8:10]:
        assert not any(u.checkpoint_id == m.checkpoint_id for u in m.slices
                       if not u.is_delta), m.slices
    # every other batch rewrites one slice: the oldest, so no key group's unit is older
    # than the count of slices + the two idle batches
    for m in manifests[12:]:
        mine = [u for u in m.slices if u.checkpoint_id == m.checkpoint_id
                and not u.is_global and not u.is_delta]
        assert len(mine) == 1, (m.checkpoint_id, m.slices)
        versions = sl.covering(KGR, m.slices, m.materialized_id).versions
        count = len([u for u in m.slices if not u.is_global and not u.is_delta])
        assert m.checkpoint_id - min(versions.values()) <= count + 2
        assert m.materialization is None and not m.db_files


def test_a_small_first_batch_checkpoints_incrementally(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(max_parallelism=16, **DEFAULT)  # line: 32 MiB
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    model: Model = {}
    apply(inst, model, random_batch(random.Random(3), big=True))
    m, _ = cp.checkpoint(inst, 1, "a0", KGR)
    inst.close()
    assert m.mode == "incremental" and not m.slices and m.db_files
    assert restore_durable(store, m, opts) == model
    # explicit changelog mode without a count: materializations, as before
    opts = StateBackendOptions(max_parallelism=16, checkpoint_mode="changelog")
    assert not sl.rolling_on(opts)
    cp = PartitionCheckpointer(store, "op2", 0, opts, str(tmp_path / "local2"))
    inst, _ = cp.restore(None)
    apply(inst, {}, random_batch(random.Random(3), big=True))
    m2, _ = cp.checkpoint(inst, 1, "a0", KGR)
    inst.close()
    assert m2.mode == "changelog" and not m2.slices


@pytest.mark.parametrize("kept_open", [True, False])
def test_a_partition_grows_into_slices_and_shrinks_back(tmp_path: Path,
                                                        kept_open: bool) -> None:
    """Incremental while small; past the line the incremental base is rotated out by
    slices (held until every slice was rewritten, then unreferenced); back to incremental
    once a checkpoint under half the line is restored (the units still hold the dropped
    state until they are rewritten)."""
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(auto_changelog_size="200k", max_parallelism=16, **DEFAULT)

    def rows(lo: int, hi: int) -> list[tuple]:
        return [("batch", "s1", [((i % 16).to_bytes(2, "big") + b"k%05d" % i,
                                  random.randbytes(1024)) for i in range(lo, hi)])]

    # grow to ~300 KiB, small updates for a rotation, then drop most of it
    batches = ([rows(0, 100), rows(100, 300)] + [rows(5 * i, 5 * i + 5) for i in range(20)]
               + [[("range", "s1", b"", b"\xff")]] + [rows(2 * i, 2 * i + 2) for i in range(24)])
    def compact_the_drop(n: int, inst: Any) -> None:
        if n == 23:  # the drop compacted away (else an incremental snapshot still holds it)
            inst.column_family("s1").compact_range(None, None)

    manifests, _model = checkpoint_each(store, opts, str(tmp_path / "local"), batches,
                                        kept_open, compact_the_drop)
    modes = [m.mode for m in manifests]
    assert modes[:2] == ["incremental"] * 2, modes
    rolled = manifests[2:22]
    assert all(m.mode == "changelog" and m.slices for m in rolled), modes
    # the incremental base is held while some key group has no unit newer than it...
    assert rolled[0].db_files and rolled[0].materialized_id == 2
    # ...and dropped once every slice was rewritten
    assert not rolled[-1].db_files and rolled[-1].materialization is None
    back = next(i for i in range(22, len(manifests)) if manifests[i].mode == "incremental")
    assert all(m.mode == "incremental" for m in manifests[back:]), modes
    assert not manifests[-1].slices


@pytest.mark.parametrize("kept_open", [True, False])
def test_a_materializing_lineage_upgraded_to_the_default_rolls_out_its_base(
        tmp_path: Path, kept_open: bool) -> None:
    """A partition written in changelog mode with whole materializations (the default
    before rolling slices: its base, its whole changelogs, maybe a materialization still
    pending) continues under the default options: the first rolling batches keep the
    base and the whole changelogs after it, add pieces, and every checkpoint restores."""
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    old = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=0,
                              materialize_interval=3, max_parallelism=16)
    new = StateBackendOptions(auto_changelog_size="8k", max_parallelism=16, **DEFAULT)
    rng = random.Random(11)
    batches = [random_batch(rng, big=n == 1) if n % 2 else small_batch(rng)
               for n in range(1, 31)]

    def upgraded_at_8(n: int) -> StateBackendOptions:
        if n == 8:  # materializations of the old process done before the new one starts
            wait_for_materializations()
        return old if n < 8 else new

    manifests, _model = checkpoint_each(store, upgraded_at_8, str(tmp_path / "local"),
                                        batches, kept_open)
    before, first = manifests[6], manifests[7]
    assert before.materialization is not None and not before.slices
    # the first rolling batch: the old base and its whole changelogs kept, pieces added
    assert first.slices and first.db_files and first.materialized_id is not None
    assert any(d.is_delta for d in first.slices)
    # rolled out once every slice was rewritten after the base
    assert not manifests[-1].db_files and not manifests[-1].changelog_files


def test_pieces_follow_the_turns_of_the_slices() -> None:
    from statebackend.checkpoint import deltas as dl

    kgr, n = (0, 63), 16
    cut = sl.slice_ranges(kgr, n)
    # slice i's unit is of batch 100 + (i - 5) mod 16: slice 5 is the oldest, rewritten now
    versions = {kg: 100 + (i - 5) % n for i, (a, b) in enumerate(cut) for kg in range(a, b + 1)}
    ranges = dl.piece_ranges(kgr, n, versions, [cut[5]])
    # no piece for the slice rewritten; the others in 8 groups of next turns (6; 7-8; ...;
    # 15 and 0, split where the key groups wrap; 1-2; 3-4), in key order
    assert ranges == [(0, 3), (4, 11), (12, 19), (24, 27), (28, 35), (36, 43), (44, 51),
                      (52, 59), (60, 63)]
    covered = {kg for a, b in ranges for kg in range(a, b + 1)}
    assert covered == set(range(64)) - set(range(20, 24))
    # fewer slices than pieces: one piece per slice
    assert dl.piece_ranges((0, 15), 4, {}, [(0, 3)]) == [(4, 7), (8, 11), (12, 15)]
    # turns that are no rotation (units of scattered ages): fixed ranges
    scattered = {kg: (kg * 7919) % 64 for kg in range(64)}
    assert dl.piece_ranges(kgr, 64, scattered, [(0, 0)]) == sl.slice_ranges(kgr, dl.PIECES)
