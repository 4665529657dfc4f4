"""Carried-over manifests: the checkpoint of a partition that ran no task in a micro-batch.

With the carrier plan (:mod:`statebackend.spark.carrier`) Spark calls our code for a
partition only when the partition has rows in the micro-batch. A partition without rows
publishes nothing for that checkpoint while the others do, yet its state is exactly that
of its previous checkpoint. Once Spark has committed the micro-batch (the listener knows;
a task of a later micro-batch knows too, as Spark runs batch ``b`` only after committing
``b - 1``), a *carried* manifest is published for it: a copy of the previous manifest with
this checkpoint's id and a fresh attempt name, referencing the same files (nothing is
uploaded), its metrics naming the checkpoint it carries (``carried_from``). Invariants
hold: a carried manifest is one more uniquely named, immutable publication; it references
only files of a completed checkpoint (or of the attempt its origin restored from); and
the state it describes is the state of the batch.

A task restoring from a carried manifest restores its *origin* (:func:`carried_origin`),
so the instance its executor kept open, its working directory and its local copy, all
named by the origin, still match.

A partition that has never run has no manifest to copy: :func:`publish_empty` writes the
checkpoint of an empty instance, marked so that the partition's first real task still sees
"no state existed" (initial state applies, :func:`never_ran`).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from .manifest import PartitionManifest

log = logging.getLogger("statebackend.carry")

CARRIED_FROM = "carried_from"
NEVER_RAN = "never_ran"


def carried_attempt() -> str:
    return f"carried-{uuid.uuid4().hex[:12]}"


def carried_manifest(origin: PartitionManifest, checkpoint_id: int,
                     watermark_ms: int | None = None) -> PartitionManifest:
    """``origin``'s state as the checkpoint ``checkpoint_id`` of the same partition (pure).

    ``watermark_ms``: the watermark the micro-batch ran with (from the partitions that
    ran it), recorded as every task records it (the next batch drops late rows with it).
    """
    src = origin.metrics.get(CARRIED_FROM) or {"checkpoint_id": origin.checkpoint_id,
                                                "attempt": origin.attempt}
    metrics: dict[str, Any] = {**origin.metrics, CARRIED_FROM: dict(src), "rows": 0, "keys": 0,
                               "restore": {"source": "carried"}}
    metrics.pop("task_ms", None)
    if watermark_ms is not None:
        metrics["watermark_ms"] = int(watermark_ms)
        metrics["late_rows_dropped"] = 0
    return replace(origin, checkpoint_id=checkpoint_id, attempt=carried_attempt(),
                   base_checkpoint_id=origin.checkpoint_id,
                   files=tuple(replace(f, uploaded=False) for f in origin.files),
                   metrics=metrics, created_at_ms=int(time.time() * 1000))


def carried_origin(m: PartitionManifest | None) -> PartitionManifest | None:
    """The manifest a restore should look for: ``m`` itself, or for a carried manifest the
    one it carries (rebuilt from ``m``, no read: same files, the origin's id and attempt,
    so the instance kept open, the working directory and the local copy of the origin
    match, and a checkpoint built on it names the origin as its base; ``m``'s metrics, so
    the watermark it records is the carried micro-batch's)."""
    if m is None:
        return None
    src = m.metrics.get(CARRIED_FROM)
    if not src:
        return m
    return replace(m, checkpoint_id=int(src["checkpoint_id"]), attempt=str(src["attempt"]))


def never_ran(m: PartitionManifest | None) -> bool:
    """Whether ``m`` is (a carried copy of) an empty checkpoint written for a partition
    that has not run yet: its first task still starts as a first batch."""
    return m is not None and bool(m.metrics.get(NEVER_RAN))


def peers_watermark(manifests: list[PartitionManifest]) -> int | None:
    """The watermark a micro-batch ran with, from the manifests of partitions that ran it."""
    wms = [int(m.metrics["watermark_ms"]) for m in manifests
           if m.metrics.get("watermark_ms") is not None]
    return max(wms) if wms else None


# --- IO: publishing carried checkpoints ---------------------------------------------------


def _manifests_at(ostore, checkpoint_id: int) -> dict[int, list[str]] | None:
    """Manifest paths published for ``checkpoint_id`` by partition; None: nothing at all
    was written for it (Spark ran no task of the operator in that micro-batch)."""
    from .manifest import MANIFEST_NAME, checkpoint_dir

    listing = ostore.list_dir(checkpoint_dir(checkpoint_id))
    if not listing:
        return None
    out: dict[int, list[str]] = {}
    for rel in listing:
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_NAME and parts[1][:1] == "p" \
                and parts[1][1:].isdigit():
            out.setdefault(int(parts[1][1:]), []).append(rel)
    return out


def _peer_watermark(ostore, by_partition: dict[int, list[str]]) -> int | None:
    from ..storage.manifests import read_manifest

    for rels in by_partition.values():  # every task of a batch ran with the same watermark
        for rel in rels:
            try:
                m = read_manifest(ostore, rel)
            except Exception:  # noqa: BLE001 - a failed attempt: try another
                continue
            return m.metrics.get("watermark_ms")
    return None


def latest_own_manifest(ostore, partition: int, before: int, parallelism: int,
                        kg_range: tuple[int, int]) -> tuple[PartitionManifest | None, bool]:
    """The latest manifest of ``partition`` (same layout) of a checkpoint before
    ``before``, chosen among published attempts after the latest completed checkpoint, or
    from that checkpoint's record; and whether a completed checkpoint of another layout
    was found instead (a rescale). One listing of the records, and one of each
    checkpoint after the latest completed one."""
    from ..coordinator.coordinator import completed_ids
    from ..storage.manifests import (
        list_published_manifests,
        read_completed_record,
        read_recorded_manifests,
    )
    from .manifest import choose_manifest

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


def carry_in_task(ostore, partition: int, checkpoint_id: int, parallelism: int,
                  kg_range: tuple[int, int], wait_s: float = 60.0) -> PartitionManifest | None:
    """In a task of micro-batch ``checkpoint_id + 1``, whose partition has no manifest for
    ``checkpoint_id`` (it had no rows then) and whose checkpoint is not completed yet:
    publish the carried manifest and return it. Spark runs a micro-batch only after
    committing the one before, so the partition ran no task of ``checkpoint_id``.

    None when nothing at all was published for ``checkpoint_id`` (the caller passes over
    such micro-batches) or this partition has no earlier state (it starts empty). When
    the earlier state has another layout (the first micro-batch after a rescale), waits
    up to ``wait_s`` for the driver, which completes ``checkpoint_id`` with a rescaling
    restore of this partition (:func:`carry_on_driver`).
    """
    from ..storage.manifests import publish_manifest, read_completed_record, read_recorded_manifests

    by_partition = _manifests_at(ostore, checkpoint_id)
    if by_partition is None:
        return None
    origin, rescaled = latest_own_manifest(ostore, partition, checkpoint_id, parallelism,
                                           kg_range)
    if origin is None:
        deadline = time.monotonic() + (wait_s if rescaled else 0.0)
        while time.monotonic() < deadline:
            record = read_completed_record(ostore, checkpoint_id)
            if record is not None:
                return read_recorded_manifests(ostore, record, [partition])[partition]
            time.sleep(0.2)
        return None
    carried = carried_manifest(origin, checkpoint_id, _peer_watermark(ostore, by_partition))
    publish_manifest(ostore, carried)
    log.info("partition %d ran no task in batch %d: carried over checkpoint %d (%s)",
             partition, checkpoint_id, origin.checkpoint_id, carried.attempt)
    return carried


def carry_on_driver(coordinator, checkpoint_id: int, options, local_root: str,
                    extra_metrics: dict[str, Any] | None = None) -> list[int]:
    """Publish carried checkpoints for the partitions that published nothing for
    ``checkpoint_id``, a micro-batch Spark has committed (so they ran no task in it);
    returns those partitions.

    Same layout: a copy of the partition's manifest in the latest completed checkpoint
    (no IO but the small manifest). A partition that has never run: the checkpoint of an
    empty instance (:data:`NEVER_RAN`). A rescale whose first micro-batch left a new
    partition without rows: its state assembled from the old partitions here, on the
    driver, as its task would have (one download of its share of the state).
    """
    from ..keygroups import key_group_range
    from ..storage.manifests import operator_store, publish_manifest, read_recorded_manifests

    ostore = operator_store(coordinator.store, coordinator.operator_id)
    by_partition = _manifests_at(ostore, checkpoint_id)
    if by_partition is None:
        return []
    missing = [p for p in range(coordinator.parallelism) if p not in by_partition]
    if not missing:
        return []
    wm = _peer_watermark(ostore, by_partition)
    latest = coordinator.latest()
    if latest is not None and latest.checkpoint_id >= checkpoint_id:
        return []
    same = latest is not None and latest.parallelism == coordinator.parallelism
    origins = read_recorded_manifests(ostore, latest, missing) if same else {}
    for p in missing:
        if p in origins:
            publish_manifest(ostore, carried_manifest(origins[p], checkpoint_id, wm))
            continue
        r = key_group_range(p, coordinator.parallelism, coordinator.max_parallelism)
        kg = (r.start, r.end)
        _publish_restored(coordinator, p, checkpoint_id, kg, latest, options, local_root,
                          {**(extra_metrics or {}), "rows": 0, "keys": 0,
                           **({} if wm is None else {"watermark_ms": int(wm)}),
                           **({NEVER_RAN: True} if latest is None else {})})
    log.info("operator %s batch %d: carried over partitions %s (no rows)",
             coordinator.operator_id, checkpoint_id, missing)
    return missing


def _publish_restored(coordinator, partition: int, checkpoint_id: int,
                      kg: tuple[int, int], record, options, local_root: str,
                      metrics: dict[str, Any]) -> None:
    """Checkpoint ``checkpoint_id`` of one partition, written on the driver: empty state
    (``record`` None) or the partition's share of ``record`` (another layout)."""
    import shutil
    import tempfile

    from ..recovery.rescale import restore_rescaled
    from ..rocksdb.instance import RocksDBInstance
    from ..rocksdb.options import to_rocksdict_options
    from .checkpointer import PartitionCheckpointer

    db_options = to_rocksdict_options(options)

    def open_instance(path: str) -> RocksDBInstance:
        return RocksDBInstance(path, db_options=db_options)

    root = tempfile.mkdtemp(prefix="carry-", dir=local_root)
    try:
        cp = PartitionCheckpointer(coordinator.store, coordinator.operator_id, partition,
                                   options, root, open_instance=open_instance,
                                   writer_epoch=getattr(coordinator, "_epoch", None) or None)
        states: tuple = ()
        base = None
        if record is None:
            inst, _ = cp.restore(None, [])
        else:
            inst, _, sources = restore_rescaled(cp, record, coordinator.parallelism,
                                                coordinator.max_parallelism, root,
                                                open_instance)
            # as a task after a rescale: the first source is the base (changelog mode
            # then materializes, the rescaled state being no changelog of anything)
            base = carried_origin(sources[0]) if sources else None
            states = base.states if base is not None else ()
        try:
            cp.checkpoint(inst, checkpoint_id, carried_attempt(), kg, states,
                          base_manifest=base, extra_metrics=metrics)
        finally:
            inst.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
