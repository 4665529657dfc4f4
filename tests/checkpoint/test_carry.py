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
