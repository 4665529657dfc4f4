"""Publishing carried-over checkpoints (the IO of :mod:`statebackend.model.carry`).

Under the carrier plan a partition without rows in a micro-batch runs no task, so it
publishes nothing for that checkpoint. Once Spark has committed the micro-batch, its
checkpoint is published by whoever learns it first:

* the driver, completing the micro-batch Spark committed (:func:`carry_on_driver`, called
  by :func:`statebackend.coordinator.pending.complete_pending` through the coordinator's
  ``carry`` hook, which the backend sets);
* the partition's next task (:func:`carry_in_task`): Spark runs micro-batch ``b`` only
  after committing ``b - 1``, so a task of ``b`` whose partition has nothing published
  for ``b - 1`` while other partitions have knows that it ran no task in it.

Both publish the same state (a copy of the partition's previous manifest, nothing
uploaded), so either may win; readers choose among published attempts as ever.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Any

from ..checkpoint.checkpointer import PartitionCheckpointer
from ..checkpoint.fencing import check_publisher
from ..checkpoint.publish import ManifestFacts
from ..keys.ranges import key_group_range
from ..model.carry import CARRIED_SOURCE, carried_attempt, carried_manifest, carried_origin
from ..model.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
    checkpoint_dir,
    choose_manifest,
    manifests_by_partition,
)
from ..rocksdb.instance import RocksDBInstance
from ..rocksdb.options import to_rocksdict_options
from ..savepoint.reader import SavepointReader
from ..storage import open_store
from ..storage.base import DurableStore
from ..storage.manifests import (
    list_published_manifests,
    operator_store,
    publish_manifest,
    read_completed_record,
    read_manifest,
    read_recorded_manifests,
)
from ..storage.records import completed_ids
from .rescale import restore_from_savepoint, restore_rescaled

__all__ = ["carry_in_task", "carry_on_driver", "latest_own_manifest"]

log = logging.getLogger("statebackend.carry")


def manifests_at(ostore: DurableStore, checkpoint_id: int) -> dict[int, list[str]] | None:
    """Manifest paths published for ``checkpoint_id`` by partition; None: nothing at all
    was written for it (Spark ran no task of the operator in that micro-batch)."""
    listing = ostore.list_dir(checkpoint_dir(checkpoint_id))
    if not listing:
        return None
    return manifests_by_partition(listing)


def peer_watermark(ostore: DurableStore, by_partition: dict[int, list[str]]) -> int | None:
    """The watermark the micro-batch ran with: every task of a batch ran with the same one,
    so the first manifest that reads is enough."""
    for rels in by_partition.values():
        for rel in rels:
            try:
                m = read_manifest(ostore, rel)
            except Exception:  # noqa: BLE001 - a failed attempt's: try another
                continue
            return m.watermark_ms
    return None


def latest_own_manifest(ostore: DurableStore, partition: int, before: int, parallelism: int,
                        kg_range: tuple[int, int]) -> tuple[PartitionManifest | None, bool]:
    """The latest manifest of ``partition`` (same layout) of a checkpoint before
    ``before``, chosen among published attempts after the latest completed checkpoint, or
    from that checkpoint's record; and whether a completed checkpoint of another layout
    was found instead (a rescale). One listing of the records, and one of each
    checkpoint after the latest completed one."""
    floor = max([c for c in completed_ids(ostore) if c < before], default=-1)
    for n in range(before - 1, floor, -1):
        published = [m for m in list_published_manifests(ostore, n, partition)
                     if (m.key_group_start, m.key_group_end) == tuple(kg_range)]
        if published:
            return choose_manifest(published), False
    if floor < 0:
        return None, False
    record = read_completed_record(ostore, floor)
    if record is None:
        return None, False
    if record.parallelism != parallelism:
        return None, True  # another layout: only a rescaling restore can build it
    return read_recorded_manifests(ostore, record, [partition])[partition], False


def carry_in_task(ostore: DurableStore, partition: int, checkpoint_id: int, parallelism: int,
                  kg_range: tuple[int, int], writer_epoch: int | None = None,
                  wait_s: float = 60.0) -> PartitionManifest | CompletedCheckpoint | None:
    """In a task of micro-batch ``checkpoint_id + 1``, whose partition has no manifest for
    ``checkpoint_id`` (it had no rows then) and whose checkpoint is not completed yet:
    publish the carried manifest (under ``writer_epoch``) and return it.

    None when nothing at all was published for ``checkpoint_id`` (the caller passes over
    such micro-batches) or this partition has no earlier state (it starts empty). When
    the earlier state has another layout: if ``checkpoint_id`` was the previous run's
    last micro-batch, the old layout's unwritten record of it
    (:func:`old_layout_in_task`), for a rescaling restore; else (the first micro-batch
    after a rescale) waits up to ``wait_s`` for the driver, which completes
    ``checkpoint_id`` with a rescaling restore of this partition (:func:`carry_on_driver`).
    """
    by_partition = manifests_at(ostore, checkpoint_id)
    if by_partition is None:
        return None
    origin, rescaled = latest_own_manifest(ostore, partition, checkpoint_id, parallelism,
                                           kg_range)
    if origin is None:
        old = old_layout_in_task(ostore, checkpoint_id, parallelism, writer_epoch,
                                 by_partition) if rescaled else None
        if old is not None:
            return old
        deadline = time.monotonic() + (wait_s if rescaled else 0.0)
        while time.monotonic() < deadline:
            record = read_completed_record(ostore, checkpoint_id)
            if record is not None:
                return read_recorded_manifests(ostore, record, [partition])[partition]
            time.sleep(0.2)
        return None
    carried = carried_manifest(origin, checkpoint_id, peer_watermark(ostore, by_partition),
                               writer_epoch=writer_epoch)
    check_publisher(ostore, carried)
    publish_manifest(ostore, carried)
    log.info("partition %d ran no task in batch %d: carried over checkpoint %d (%s)",
             partition, checkpoint_id, origin.checkpoint_id, carried.attempt)
    return carried


def published_in_layout(ostore: DurableStore, checkpoint_id: int,
                        by_partition: dict[int, list[str]], parallelism: int,
                        max_parallelism: int) -> bool:
    """Whether everything published for ``checkpoint_id`` belongs to the layout of
    ``parallelism`` partitions (each manifest covers its partition's key groups there)."""
    for q in by_partition:
        if q >= parallelism:
            return False
        r = key_group_range(q, parallelism, max_parallelism)
        if any((m.key_group_start, m.key_group_end) != (r.start, r.end)
               for m in list_published_manifests(ostore, checkpoint_id, q)):
            return False
    return True


def old_layout_in_task(ostore: DurableStore, checkpoint_id: int, parallelism: int,
                       writer_epoch: int | None,
                       by_partition: dict[int, list[str]]) -> CompletedCheckpoint | None:
    """In a task of micro-batch ``checkpoint_id + 1`` after a rescale to ``parallelism``:
    the state of micro-batch ``checkpoint_id``, which the previous run ran with another
    layout but did not complete (some of its partitions had no rows, and the run ended
    before its driver completed it), as an unwritten record of the old layout for a
    rescaling restore to read. None where that does not apply: nothing published for it,
    no completed checkpoint of another layout before it, or anything of it published by
    the new layout (then it is the new layout's micro-batch, completed by this run's
    driver: :func:`carry_in_task` waits for that).

    Spark runs micro-batch ``checkpoint_id + 1`` only after committing ``checkpoint_id``,
    so that state is final: each old partition's manifest for it, or, for one that ran no
    task in it, its latest earlier manifest carried over (published here as the driver
    would have). This run's driver cannot: its listener never sees that micro-batch.
    ``by_partition``: what was published for it (:func:`manifests_at`).
    """
    floor = max([c for c in completed_ids(ostore) if c < checkpoint_id], default=-1)
    done = read_completed_record(ostore, floor) if floor >= 0 else None
    if done is None or done.parallelism == parallelism:
        return None
    old_p, max_p = done.parallelism, done.max_parallelism
    if not published_in_layout(ostore, checkpoint_id, by_partition, old_p, max_p):
        return None  # the new layout published this micro-batch
    chosen: dict[int, PartitionManifest] = {}
    for q in range(old_p):
        r = key_group_range(q, old_p, max_p)
        published = list_published_manifests(ostore, checkpoint_id, q)
        if published:
            chosen[q] = choose_manifest(published)
            continue
        origin, _ = latest_own_manifest(ostore, q, checkpoint_id, old_p, (r.start, r.end))
        if origin is None:
            return None
        carried = carried_manifest(origin, checkpoint_id, peer_watermark(ostore, by_partition),
                                   writer_epoch=writer_epoch)
        check_publisher(ostore, carried)
        publish_manifest(ostore, carried)
        chosen[q] = carried
    log.info("batch %d of the previous layout (%d partitions) assembled in a task after a "
             "rescale to %d; carried over partitions %s", checkpoint_id, old_p, parallelism,
             sorted(set(range(old_p)) - set(by_partition)))
    return CompletedCheckpoint(
        operator_id=done.operator_id, checkpoint_id=checkpoint_id, parallelism=old_p,
        max_parallelism=max_p, manifests={q: m.path for q, m in chosen.items()})


def carry_on_driver(coordinator: Any, checkpoint_id: int, options: Any, local_root: str,
                    facts: ManifestFacts | None = None,
                    savepoint: tuple[str, dict] | None = None) -> list[int]:
    """Publish carried checkpoints for the partitions that published nothing for
    ``checkpoint_id``, a micro-batch Spark has committed (so they ran no task in it);
    returns those partitions. ``coordinator``: the operator's
    :class:`~statebackend.coordinator.CheckpointCoordinator` (its store, operator,
    layout, latest record and writer epoch are read).

    Same layout: a copy of the partition's manifest in the latest completed checkpoint
    (no IO but the small manifest). A partition that has never run: the checkpoint of an
    empty instance (``never_ran``), or its share of ``savepoint`` (``(url, storage
    options)``) when the query starts from one. A rescale whose first micro-batch left a new
    partition without rows: its state assembled from the old partitions here, on the
    driver, as its task would have (one download of its share of the state).
    """
    ostore = operator_store(coordinator.store, coordinator.operator_id)
    by_partition = manifests_at(ostore, checkpoint_id)
    if by_partition is None:
        return []
    previous = _in_previous_layout(coordinator, ostore, checkpoint_id, by_partition,
                                   options, local_root, facts, savepoint)
    if previous is not None:
        return previous
    missing = [p for p in range(coordinator.parallelism) if p not in by_partition]
    latest = coordinator.latest()
    if not missing or (latest is not None and latest.checkpoint_id >= checkpoint_id):
        return []
    wm = peer_watermark(ostore, by_partition)
    stamp = coordinator.writer_stamp
    epoch = None if stamp is None else stamp.epoch
    same = latest is not None and latest.parallelism == coordinator.parallelism
    origins = read_recorded_manifests(ostore, latest, missing) if same else {}
    for p in missing:
        if p in origins:
            carried = carried_manifest(origins[p], checkpoint_id, wm, writer_epoch=epoch)
            check_publisher(ostore, carried)
            publish_manifest(ostore, carried)
            continue
        r = key_group_range(p, coordinator.parallelism, coordinator.max_parallelism)
        base = facts or ManifestFacts()
        _publish_restored(coordinator, p, checkpoint_id, (r.start, r.end), latest, options,
                          local_root, ManifestFacts(
                              key_columns=base.key_columns, key_types=base.key_types,
                              watermark_ms=wm, never_ran=latest is None,
                              placement=base.placement,
                              writer_query=None if stamp is None else stamp.query_id), epoch,
                          savepoint)
    log.info("operator %s batch %d: carried over partitions %s (no rows)",
             coordinator.operator_id, checkpoint_id, missing)
    return missing


def _in_previous_layout(coordinator: Any, ostore: DurableStore, checkpoint_id: int,
                        by_partition: dict[int, list[str]], options: Any, local_root: str,
                        facts: ManifestFacts | None, savepoint: tuple[str, dict] | None
                        ) -> list[int] | None:
    """Complete ``checkpoint_id`` in the layout of the latest completed checkpoint, when
    that differs from the coordinator's and everything published for it is of that
    layout: the previous run's last micro-batch, which its driver did not complete before
    the restart with another parallelism (this run's tasks assembled its state,
    :func:`old_layout_in_task`). Returns the old layout's partitions it completed (None:
    not that case)."""
    latest = coordinator.latest()
    if latest is None or latest.parallelism == coordinator.parallelism or not \
            published_in_layout(ostore, checkpoint_id, by_partition, latest.parallelism,
                                latest.max_parallelism):
        return None
    new = coordinator.parallelism
    coordinator.parallelism = latest.parallelism
    try:
        carried = carry_on_driver(coordinator, checkpoint_id, options, local_root, facts,
                                  savepoint)
        coordinator.try_complete(checkpoint_id, committed=True)
    finally:
        coordinator.parallelism = new
    return sorted(set(carried) | set(by_partition))


def _publish_restored(coordinator: Any, partition: int, checkpoint_id: int,
                      kg: tuple[int, int], record: CompletedCheckpoint | None, options: Any,
                      local_root: str, facts: ManifestFacts, epoch: int | None,
                      savepoint: tuple[str, dict] | None = None) -> None:
    """Checkpoint ``checkpoint_id`` of one partition, written on the driver: its share of
    ``record`` (another layout), else of ``savepoint`` (``(url, storage options)``, the
    state a new query starts from), else empty state (``facts.never_ran``)."""
    db_options = to_rocksdict_options(options)

    def open_instance(path: str) -> RocksDBInstance:
        return RocksDBInstance(path, db_options=db_options)

    os.makedirs(local_root, exist_ok=True)
    root = tempfile.mkdtemp(prefix="carry-", dir=local_root)
    try:
        cp = PartitionCheckpointer(coordinator.store, coordinator.operator_id, partition,
                                   options, root, open_instance=open_instance,
                                   writer_epoch=epoch)
        base: PartitionManifest | None = None
        states: tuple = ()
        if record is not None:
            inst, _, sources = restore_rescaled(cp, record, coordinator.parallelism,
                                                coordinator.max_parallelism, root,
                                                open_instance)
            # as a task after a rescale: the first source is the base (changelog mode
            # then materializes, the rescaled state being no changelog of anything)
            base = carried_origin(sources[0]) if sources else None
            states = base.states if base is not None else ()
            ets = [m.max_event_time_ms for m in sources if m.max_event_time_ms is not None]
            facts = replace(facts, max_event_time_ms=max(ets) if ets else None)
        elif savepoint is not None:
            reader = SavepointReader(open_store(savepoint[0],
                                                storage_options=savepoint[1] or None))
            inst, _ = restore_from_savepoint(cp, reader, coordinator.parallelism,
                                             coordinator.max_parallelism)
            states = tuple(reader.manifest.states)
            et = reader.manifest.metrics.get("max_event_time_ms")
            facts = replace(facts, never_ran=False,
                            max_event_time_ms=None if et is None else int(et))
        else:
            inst, _ = cp.restore(None, [])
        try:
            cp.checkpoint(inst, checkpoint_id, carried_attempt(), kg, states,
                          base_manifest=base, extra_metrics={
                              "rows": 0, "keys": 0, "restore": {"source": CARRIED_SOURCE}},
                          facts=facts)
        finally:
            inst.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
