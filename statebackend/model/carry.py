"""Carried-over manifests (pure): the checkpoint of a partition that ran no task in a
micro-batch.

With the carrier plan (``placement="carrier"``, :mod:`statebackend.spark.carrier`) Spark
calls our code for a partition only when the partition has rows in the micro-batch. A
partition without rows publishes nothing for that checkpoint while the others do, yet its
state is exactly that of its previous checkpoint. Once Spark has committed the micro-batch,
a *carried* manifest is published for it (:mod:`statebackend.restore.carry` does the IO):
a copy of the previous manifest with this checkpoint's id and a fresh attempt name,
referencing the same files (nothing is uploaded), naming the checkpoint it carries in its
typed field ``carried_from``. Invariants hold: a carried manifest is one more uniquely
named, immutable publication; it references only files of a completed checkpoint (or of
the attempt its origin restored from); and the state it describes is the state of the
batch.

A task restoring from a carried manifest restores its *origin* (:func:`carried_origin`),
so the instance its executor kept open, its working directory and its local copy, all
named by the origin, still match, and the next checkpoint names the origin as its base.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from .manifest import CarriedFrom, PartitionManifest

__all__ = ["CARRIED_SOURCE", "carried_attempt", "carried_manifest", "carried_origin",
           "never_ran", "origin_path"]

#: The restore source a carried manifest reports (``metrics["restore"]["source"]``).
CARRIED_SOURCE = "carried"


def carried_attempt() -> str:
    """A fresh attempt name for a carried manifest (unique, as every attempt's)."""
    return f"carried-{uuid.uuid4().hex[:12]}"


def carried_manifest(origin: PartitionManifest, checkpoint_id: int,
                     watermark_ms: int | None = None,
                     writer_epoch: int | None = None) -> PartitionManifest:
    """``origin``'s state as the checkpoint ``checkpoint_id`` of the same partition.

    ``watermark_ms``: the watermark the micro-batch ran with (from the partitions that ran
    it), recorded as every task records it (the next batch drops late rows with it); None
    keeps the origin's. ``writer_epoch``: the publisher's (None keeps the origin's). A
    carry of a carried manifest still names the first origin.
    """
    src = origin.carried_from or CarriedFrom(origin.checkpoint_id, origin.attempt)
    metrics: dict[str, Any] = {**origin.metrics, "rows": 0, "keys": 0,
                               "restore": {"source": CARRIED_SOURCE}}
    metrics.pop("task_ms", None)
    if watermark_ms is not None:
        metrics["late_rows_dropped"] = 0
    return replace(origin, checkpoint_id=checkpoint_id, attempt=carried_attempt(),
                   base_checkpoint_id=origin.checkpoint_id,
                   files=tuple(replace(f, uploaded=False) for f in origin.files),
                   metrics=metrics, created_at_ms=int(time.time() * 1000), carried_from=src,
                   watermark_ms=origin.watermark_ms if watermark_ms is None else int(watermark_ms),
                   writer_epoch=origin.writer_epoch if writer_epoch is None else writer_epoch)


def carried_origin(m: PartitionManifest | None) -> PartitionManifest | None:
    """The manifest a restore should look for: ``m`` itself, or for a carried manifest the
    one it carries, rebuilt from ``m`` without a read (same files, the origin's id and
    attempt, so the instance kept open, the working directory and the local copy of the
    origin match, and a checkpoint built on it names the origin as its base; ``m``'s typed
    facts, so the watermark it records is the carried micro-batch's)."""
    if m is None or m.carried_from is None:
        return m
    return replace(m, checkpoint_id=m.carried_from.checkpoint_id,
                   attempt=m.carried_from.attempt, carried_from=None)


def origin_path(m: PartitionManifest) -> str:
    """The path of the manifest whose files ``m`` holds (its own, unless carried)."""
    src = carried_origin(m)
    return (src or m).path


def never_ran(m: PartitionManifest | None) -> bool:
    """Whether ``m`` is (a carried copy of) an empty checkpoint written for a partition that
    has not run yet: its first task still starts as a first batch."""
    return m is not None and m.never_ran
