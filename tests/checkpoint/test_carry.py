"""Carried-over manifests (statebackend.model.carry): the checkpoint of a partition
that ran no task in a micro-batch restores exactly the state it carries, from the same
local sources as its origin, and references only its origin's files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_partition_checkpointer import OP, dump, make, run_batches

from statebackend.checkpoint import RestoreSource
from statebackend.model.carry import carried_manifest, carried_origin, never_ran
from statebackend.model.manifest import CarriedFrom, PartitionManifest
from statebackend.storage import open_store, read_manifest
from statebackend.storage.manifests import operator_store, publish_manifest


@pytest.mark.parametrize("mode", ["incremental", "changelog"])
def test_carried_manifest_restores_its_origin(tmp_path: Path, mode: str) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    manifests, state = run_batches(store, tmp_path, 2, checkpoint_mode=mode)
    origin = manifests[-1]
    carried = carried_manifest(origin, 5, watermark_ms=1234)
    publish_manifest(operator_store(store, OP), carried)
    back = read_manifest(operator_store(store, OP), carried.path)
    assert (back.checkpoint_id, back.partition) == (5, origin.partition)
    assert back.attempt != origin.attempt and back.attempt.startswith("carried-")
    assert [f.path for f in back.files] == [f.path for f in origin.files]
    assert not any(f.uploaded for f in back.files) and back.incremental_size == 0
    assert back.watermark_ms == 1234 and not never_ran(back)
    # correctness data are typed fields, not metrics
    assert back.carried_from == CarriedFrom(origin.checkpoint_id, origin.attempt)
    assert "carried_from" not in back.metrics and "watermark_ms" not in back.metrics
    assert PartitionManifest.from_json(back.to_json()) == back
    # a carry of a carry still names the first origin
    again = carried_manifest(back, 6)
    assert carried_origin(again).path == origin.path == carried_origin(back).path

    # restored through its origin: the working directory its origin left still matches
    cp = make(store, tmp_path, checkpoint_mode=mode)
    inst, metrics = cp.restore(carried_origin(back))
    try:
        assert metrics.source == RestoreSource.WORKING_DIR
        assert dump(inst) == state
    finally:
        inst.close()
    # and from durable storage alone, the carried manifest's files are the state
    cp = make(store, tmp_path / "elsewhere", checkpoint_mode=mode)
    inst, metrics = cp.restore(back)
    try:
        assert metrics.source == RestoreSource.DURABLE
        assert dump(inst) == state
    finally:
        inst.close()


@pytest.mark.parametrize("mode", ["incremental", "changelog"])
def test_driver_and_task_publish_carried_checkpoints(tmp_path: Path, mode: str) -> None:
    """Partition 1 of 2 never has rows: the driver, completing micro-batches Spark
    committed, writes its empty never-ran checkpoint, then carries it over; a task of a
    later micro-batch carries it over too when the driver has not completed yet."""
    import functools

    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.coordinator.pending import complete_pending
    from statebackend.options import StateBackendOptions
    from statebackend.restore.carry import carry_in_task, carry_on_driver
    from statebackend.storage.manifests import read_recorded_manifests

    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    manifests, _ = run_batches(store, tmp_path, 2, checkpoint_mode=mode)  # p0: batches 1, 2
    coord = CheckpointCoordinator(store, OP, parallelism=2, max_parallelism=128, fencing=False)
    opts = StateBackendOptions(checkpoint_mode=mode)
    carry = functools.partial(carry_on_driver, options=opts,
                              local_root=str(tmp_path / "driver"))
    (tmp_path / "driver").mkdir()
    done = complete_pending(coord, up_to=2, carry=carry)
    assert [r.checkpoint_id for r in done] == [1, 2]
    ostore = operator_store(store, OP)
    first = read_recorded_manifests(ostore, done[0], [1])[1]
    second = read_recorded_manifests(ostore, done[1], [1])[1]
    assert first.never_ran and first.carried_from is None
    assert (first.key_group_start, first.key_group_end) == (64, 127)
    assert second.never_ran and second.carried_from == CarriedFrom(1, first.attempt)
    # without the hook nothing completes a checkpoint a partition did not publish

    # batch 3 ran on p0 only; batch 4's task of p1 carries p1 over before the driver does
    cp = make(store, tmp_path, checkpoint_mode=mode)
    inst, _ = cp.restore(manifests[-1])
    m3, _ = cp.checkpoint(inst, 3, "a0", (0, 63), ())
    inst.close()
    carried = carry_in_task(ostore, 1, 3, 2, (64, 127))
    assert carried is not None and carried.checkpoint_id == 3 and carried.never_ran
    assert carried.carried_from == CarriedFrom(1, first.attempt)
    assert [r.checkpoint_id for r in complete_pending(coord, up_to=3)] == [3]
    # nothing at all published for a batch: nothing to carry (the batch is passed over)
    assert carry_in_task(ostore, 1, 7, 2, (64, 127)) is None
    # the empty state restores as the first batch's
    inst, _ = make(store, tmp_path / "other", partition=1,
                   checkpoint_mode=mode).restore(carried_origin(carried))
    try:
        assert dump(inst).get("default", {}) == {}
    finally:
        inst.close()
    assert m3.checkpoint_id == 3
