"""The one publish path every checkpoint mode ends with: metrics, requests, publication.

A checkpoint's manifest is built by its mode's strategy (:mod:`.incremental`,
:mod:`.changelog_mode`) once every file it names is durable; this module adds what the
checkpoint cost (:class:`~.metrics.CheckpointMetrics`, derived from the manifest alone,
and the store requests it made), proves the writer still owns the location
(:func:`~.fencing.check_publisher`) and publishes it with one atomic write (invariant 3).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..model.manifest import PartitionManifest
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from ..storage.manifests import publish_manifest
from .fencing import check_publisher
from .task_metrics import CheckpointMetrics


@dataclass(frozen=True)
class ManifestFacts:
    """What the state's readers need of a checkpoint besides its files: the manifest's
    typed fields of the same names (see :class:`~.manifest.PartitionManifest`).

    Attributes
    ----------
    key_columns, key_types : tuple of str
        How grouping keys decode.
    max_event_time_ms : int or None
        The partition's running max event time.
    watermark_ms : int or None
        The watermark the batch ran with (None: the operator has none).
    never_ran : bool
        The empty state of a partition that has not run yet, written for it by the
        carrier plan's driver (:mod:`statebackend.restore.carry`).
    placement : str or None
        The streaming plan the task ran in (``"shuffle"``, ``"carrier"``; None: a batch
        run), kept by restarts under ``placement="auto"``.
    writer_query : str or None
        The streaming query whose run published it (fencing on; None: a batch run or
        fencing off): completion never chooses another query's manifest.
    """

    key_columns: tuple[str, ...] = ()
    key_types: tuple[str, ...] = ()
    max_event_time_ms: int | None = None
    watermark_ms: int | None = None
    never_ran: bool = False
    placement: str | None = None
    writer_query: str | None = None


def publish_checkpoint(store: DurableStore, manifest: PartitionManifest, *,
                       sync_duration_s: float, async_start: float,
                       counts0: RequestCounts | None,
                       extra_metrics: Mapping[str, Any] | None = None,
                       facts: ManifestFacts | None = None,
                       **mode_metrics: Any) -> tuple[PartitionManifest, CheckpointMetrics]:
    """Publish ``manifest`` (every file it references already durable) with its metrics.

    Parameters
    ----------
    store : DurableStore
        Rooted at the operator root.
    manifest : PartitionManifest
        The checkpoint, without metrics yet.
    sync_duration_s, async_start : float
        The synchronous part's duration; ``perf_counter()`` when the async part started.
    counts0 : RequestCounts or None
        The store's request counts when the checkpoint started (None: not counted).
    extra_metrics : mapping, optional
        The caller's metrics (the task's), recorded in the manifest.
    facts : ManifestFacts, optional
        The caller's typed manifest fields.
    **mode_metrics
        The mode's own entries (``changelog=...``).

    Returns
    -------
    tuple of (PartitionManifest, CheckpointMetrics)
        Published, and the metrics with the publication's time included.

    Raises
    ------
    WriterFencedError, StorageError
        Another run took the location over, or the publication failed: nothing published.
    """
    uploaded = [f for f in manifest.files if f.uploaded]
    metrics = CheckpointMetrics(
        checkpoint_id=manifest.checkpoint_id, partition=manifest.partition,
        attempt=manifest.attempt, sync_duration_s=sync_duration_s,
        async_duration_s=time.perf_counter() - async_start,
        bytes_uploaded=manifest.incremental_size, files_uploaded=len(uploaded),
        files_reused=len(manifest.files) - len(uploaded), full_size=manifest.full_size,
        incremental_size=manifest.incremental_size)
    extra = dict(extra_metrics or {})
    counts1 = store.request_counts()
    if counts0 is not None and counts1 is not None:
        # The checkpoint's requests, plus the manifest's own PUT (it cannot count itself)
        # and the fencing check just before it (a listing of _writers/, LATEST.json read)
        fenced = int(manifest.writer_epoch is not None)
        own = RequestCounts(put=1, list=fenced, get=fenced)
        extra["checkpoint_requests"] = (counts1 - counts0 + own).to_dict()
    if facts is not None:
        # its fields are the manifest's of the same names
        manifest = replace(manifest, **{f.name: getattr(facts, f.name)
                                        for f in fields(ManifestFacts)})
    manifest = manifest.with_metrics(**extra, **metrics.to_dict(), **mode_metrics)
    check_publisher(store, manifest)
    publish_manifest(store, manifest)
    # The manifest cannot hold its own publication time; the returned metrics do.
    return manifest, replace(metrics, async_duration_s=time.perf_counter() - async_start)
