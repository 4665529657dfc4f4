"""Degraded, not stuck (invariant 13): a damaged older retained checkpoint is reported and
skipped, the intact latest restores, completion goes on, and garbage collection deletes
nothing the damaged one may name until a repair; each remedy the message names works."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from coordsim import OP, all_files, run_attempt

from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import CorruptStateError
from statebackend.model.manifest import PartitionManifest, completed_record_path
from statebackend.storage import open_store
from statebackend.storage.base import DurableStore

MAXP = 8


@pytest.fixture
def store(store_url: tuple[str, dict[str, Any]]) -> DurableStore:
    url, options = store_url
    return open_store(f"{url.rstrip('/')}/{uuid.uuid4().hex[:8]}", retries=0,
                      storage_options=options)


def checkpoint(store: DurableStore, coord: CheckpointCoordinator, n: int,
               base: PartitionManifest | None) -> PartitionManifest:
    """Checkpoint ``n`` of one partition: the SSTs of every batch so far (reused)."""
    ssts = {f"{k:06d}.sst": f"sst {k}".encode() * 20 for k in range(n + 1)}
    m = run_attempt(store, n, 0, f"a{n}", ssts, base, parallelism=1, max_parallelism=MAXP)
    assert m is not None and coord.try_complete(n) is not None
    return m


def five_checkpoints(store: DurableStore) -> tuple[CheckpointCoordinator, PartitionManifest]:
    coord = CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3)
    m = None
    for n in range(5):
        m = checkpoint(store, coord, n, m)
    assert m is not None
    return coord, m


def damage_manifest(store: DurableStore, n: int, how: str) -> tuple[str, bytes]:
    coord = CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3, fencing=False)
    rel = coord.get(n).manifests[0]
    raw = store.get_bytes(f"{OP}/{rel}")
    if how == "edited":
        store.put_bytes_atomic(f"{OP}/{rel}", raw.replace(b'"size": ', b'"size": 1', 1))
    else:
        store.delete([f"{OP}/{rel}"])
    return rel, raw


@pytest.mark.parametrize("how", ["edited", "deleted"])
def test_a_damaged_older_checkpoint_is_reported_skipped_and_keeps_its_files(
        store: DurableStore, caplog: pytest.LogCaptureFixture, how: str) -> None:
    _, m4 = five_checkpoints(store)
    rel, _ = damage_manifest(store, 2, how)
    before = all_files(store)
    with caplog.at_level(logging.WARNING, logger="statebackend"):
        coord = CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3)  # no raise
        coord.rebuild()
    warnings = [r for r in caplog.records
                if r.name.startswith("statebackend") and rel in r.getMessage()]
    assert len(warnings) == 1, "one warning at start, not one per rebuild"
    assert "_checkpoints/chk-2.json" in warnings[0].getMessage()
    assert set(coord.damaged) == {2} and coord.damaged[2].path == rel
    # the intact latest restores; the damaged one fails naming its manifest
    assert coord.restore().record.checkpoint_id == 4
    with pytest.raises(CorruptStateError) as bad:
        coord.restore(2)
    assert bad.value.path == rel
    # the query runs on: two more checkpoints complete, retention drops 2 and 3, yet
    # nothing is deleted while what checkpoint 2 names is unknown
    m = checkpoint(store, coord, 5, m4)
    checkpoint(store, coord, 6, m)
    coord.collect_garbage()
    assert all_files(store) >= before
    assert coord.restore().record.checkpoint_id == 6


def test_each_remedy_the_message_names_works(store: DurableStore) -> None:
    five_checkpoints(store)
    rel, raw = damage_manifest(store, 2, "edited")
    assert set(CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3).damaged) == {2}
    # 1. put the damaged file back from a backup
    store.put_bytes_atomic(f"{OP}/{rel}", raw)
    coord = CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3)
    assert coord.damaged == {}
    assert coord.restore(2).record.checkpoint_id == 2
    # 2. give the checkpoint up by deleting its record: collection resumes
    damage_manifest(store, 2, "deleted")
    assert set(CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3).damaged) == {2}
    store.delete([f"{OP}/{completed_record_path(2)}"])
    coord = CheckpointCoordinator(store, OP, 1, MAXP, num_retained=3)
    assert coord.damaged == {}
    m = coord.restore().manifests[0]
    for n in (5, 6, 7):
        m = checkpoint(store, coord, n, m)
    # retention dropped 3 and 4 and collection deleted their private files again (their
    # SSTs are reused by the newer checkpoints)
    left = all_files(store)
    assert not any(p.startswith(("chk-3/", "chk-4/")) and not p.endswith(".sst")
                   for p in left), sorted(left)
    assert [i.checkpoint_id for i in coord.list_completed()] == [5, 6, 7]
    for f in coord.restore().manifests[0].files:
        assert store.size(f"{OP}/{f.path}") == f.size
