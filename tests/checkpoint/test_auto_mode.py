"""``checkpoint_mode="auto"``: each batch of a partition checkpoints incrementally while
its state is small and by changelog (with small materializations inline) once the state it
restored references ``auto_changelog_size`` bytes, back below half of that. The switch
happens on an instance kept open between batches as well as on one restored afresh, and the
state of every checkpoint restores to the model either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_changelog import Background, Model, apply, dump, restore_durable

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint import changelog_mode as changelog_mode_mod
from statebackend.checkpoint.strategy import mode_for
from statebackend.model.manifest import (
    FileEntry,
    MaterializationRef,
    PartitionManifest,
    changelog_name,
)
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.options import sizes_levels
from statebackend.storage import open_store

OP = "op"
KIB = 1024


def _manifest(size: int, mode: str) -> PartitionManifest:
    ref = MaterializationRef(1, "a0") if mode.startswith("changelog") else None
    pending = MaterializationRef(2, "a0") if mode == "changelog-pending" else None
    return PartitionManifest(
        operator_id=OP, partition=0, checkpoint_id=2, attempt="a0", key_group_start=0,
        key_group_end=127, max_parallelism=128, mode=mode.split("-")[0], materialization=ref,
        pending_materialization=pending,
        files=(FileEntry("000009.sst", "chk-1/p0/a0/000009.sst", size, "crc32:00000000",
                         shared=True, uploaded=True),))


@pytest.mark.parametrize("size, restored_mode, expected", [
    # empty state: recorded, the first batch's own size decides (rolling slices for a
    # large load, incremental below the line; test_rolling_default.py)
    (None, None, "changelog"),
    (99 * KIB, "incremental", "incremental"),
    (100 * KIB, "incremental", "changelog"),  # at the line
    (60 * KIB, "changelog", "changelog"),     # between half and the line: stays
    (50 * KIB, "changelog", "changelog"),     # at half
    (49 * KIB, "changelog", "incremental"),   # below half: back
    # below half, but its materialization is still pending: stays until adopted
    (1 * KIB, "changelog-pending", "changelog"),
])
def test_auto_chooses_by_the_size_of_the_state_restored(size, restored_mode, expected):
    opts = StateBackendOptions(checkpoint_mode="auto", auto_changelog_size="100k")
    restored = None if size is None else _manifest(size, restored_mode)
    assert mode_for(opts, restored) == expected
    if restored is None:  # without rolling slices a first batch is incremental
        assert mode_for(opts.with_(rolling_slices=0), restored) == "incremental"
    # the explicit modes ignore the size
    for mode in ("incremental", "changelog"):
        assert mode_for(opts.with_(checkpoint_mode=mode), restored) == mode
    # full snapshots asked for (incremental=False): snapshot mode whatever the size
    assert mode_for(opts.with_(incremental=False), restored) == "incremental"


def test_auto_materializes_small_snapshots_inline_unless_told_otherwise():
    assert StateBackendOptions(checkpoint_mode="auto").inline_ratio() == 2.0
    assert StateBackendOptions(checkpoint_mode="auto",
                               materialize_inline_ratio=0).inline_ratio() == 0.0
    assert StateBackendOptions(checkpoint_mode="changelog").inline_ratio() == 0.0
    assert StateBackendOptions(checkpoint_mode="changelog",
                               materialize_inline_ratio=3).inline_ratio() == 3.0
    # level sizing follows: every mode but changelog without inline materializations
    assert sizes_levels(StateBackendOptions(checkpoint_mode="auto"))
    assert not sizes_levels(StateBackendOptions(checkpoint_mode="auto",
                                                materialize_inline_ratio=0))
    assert not sizes_levels(StateBackendOptions(checkpoint_mode="changelog"))


@pytest.mark.parametrize("kept_open", [True, False])
def test_auto_switches_modes_as_the_state_grows_and_shrinks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_open: bool) -> None:
    bg = Background()
    monkeypatch.setattr(changelog_mode_mod, "materialize_in_background", bg.submit)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    # materializations (rolling slices off): test_rolling_default.py has the default's
    opts = StateBackendOptions(checkpoint_mode="auto", auto_changelog_size="200k",
                               rolling_slices=0)
    local = str(tmp_path / "local")
    model: Model = {}

    def rows(lo: int, hi: int) -> list[tuple]:
        return [("batch", "default", [(b"k%05d" % i, os.urandom(KIB)) for i in range(lo, hi)])]

    # what each batch writes: grow to ~300 KiB, small updates, then drop most of it
    batches = [rows(0, 100), rows(100, 300), rows(0, 5), rows(5, 10),
               [("range", "default", b"k00000", b"k00280")], rows(10, 12), rows(12, 14),
               rows(14, 16)]
    cp = PartitionCheckpointer(store, OP, 0, opts, local)
    inst, _ = cp.restore(None)
    manifests: list[PartitionManifest] = []
    for n, ops in enumerate(batches, start=1):
        apply(inst, model, ops)
        if n == 5:  # the drop compacted away (else the files still hold the old state)
            inst.db.compact_range(None, None)
        m, _ = cp.checkpoint(inst, n, "a0", (0, 127))
        manifests.append(m)
        bg.run_all()
        assert restore_durable(store, m, opts) == model, n
        if kept_open:
            cp.resume(m, inst)
        else:
            inst.close()
            cp = PartitionCheckpointer(store, OP, 0, opts, local)
            inst, _ = cp.restore(m)
            assert dump(inst) == model
    inst.close()

    modes = [m.mode for m in manifests]
    sizes = [m.full_size for m in manifests]
    # batches 1-2 incremental (the state restored is under 200 KiB); from batch 3 on the
    # restored state is over the line: changelog, small snapshots inline (their own base)
    assert modes[:2] == ["incremental"] * 2 and sizes[0] < 200 * KIB <= sizes[1], sizes
    assert modes[2:4] == ["changelog"] * 2, modes
    # batch 3's snapshot adds its flush alone: inline, its own base; batch 4's may also
    # hold RocksDB's compaction of the four level-0 files (timing is RocksDB's), which goes
    # to the background while the checkpoint names its changelog
    for m in manifests[2:4]:
        if m.materialization == MaterializationRef(m.checkpoint_id, "a0"):
            assert m.changelog_files == () and m.metrics["changelog"]["materialized_inline"]
        else:
            assert m.changelog_files[-1].name == changelog_name(m.checkpoint_id), m
    assert manifests[2].materialization == MaterializationRef(3, "a0"), manifests[2]
    # the drop: still changelog (restored from a big state); then back to incremental
    # once a checkpoint under half the line is the one restored, and only then
    back = next(i for i in range(4, len(manifests)) if manifests[i].mode == "incremental")
    assert all(m.mode == "changelog" for m in manifests[4:back]), modes
    assert sizes[back - 1] < 100 * KIB and all(s >= 100 * KIB for s in sizes[3:back - 1]), \
        (sizes, modes)
    assert all(m.mode == "incremental" for m in manifests[back:]), modes
