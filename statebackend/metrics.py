"""Checkpoint metrics: captured per partition in the task, aggregated per checkpoint on
the driver, written as JSON lines beside the checkpoints and logged as one line per batch.

Where each number comes from
----------------------------
Every partition manifest carries the metrics of the task that published it (see
:class:`statebackend.checkpoint.task_metrics.CheckpointMetrics` and the Spark runner):
sync/async durations, bytes and files uploaded and reused, full and incremental size,
the restore (source, duration, bytes downloaded), rows, keys, the batch's processing
time, and the RocksDB properties read by :func:`rocksdb_properties` just before the
checkpoint. :func:`checkpoint_stats` folds the chosen manifests of one completed
checkpoint into a :class:`CheckpointStats`.

Timing follows Flink's definitions. The *trigger* time of micro-batch ``b`` is Spark's
batch timestamp (the ``processing_time_ms`` every task of the batch sees); a partition's
*end to end* duration runs from the trigger to the publication of its manifest; its
*start delay* is ``end_to_end - sync - async``: the time before the snapshot began
(scheduling, restore and processing of the batch's rows).

Where they are written and read back: :mod:`statebackend.metrics_store`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .storage.accounting import RequestCounts

if TYPE_CHECKING:  # the executor imports this module: keep its imports light
    from .model.manifest import CompletedCheckpoint, PartitionManifest
    from .rocksdb.instance import RocksDBInstance

__all__ = [
    "BLOCK_CACHE_HIT_RATE",
    "PROGRESS_METRICS",
    "ROCKSDB_PROPERTIES",
    "ROCKSDB_STATISTICS",
    "STATISTICS_METRICS",
    "CheckpointStats",
    "PartitionStats",
    "combine_progress",
    "partition_progress",
    "rocksdb_properties",
]

log = logging.getLogger("statebackend.metrics")


#: Metric name -> (RocksDB property, how to combine column families). Per-column-family
#: properties are summed; the block cache is shared by every column family (and by every
#: instance of the process), so its usage is read once.
ROCKSDB_PROPERTIES: dict[str, tuple[str, str]] = {
    "estimated_keys": ("rocksdb.estimate-num-keys", "sum"),
    "live_sst_bytes": ("rocksdb.live-sst-files-size", "sum"),
    "memtable_bytes": ("rocksdb.cur-size-all-mem-tables", "sum"),
    "block_cache_bytes": ("rocksdb.block-cache-usage", "max"),
    "pending_compaction_bytes": ("rocksdb.estimate-pending-compaction-bytes", "sum"),
    # the files every point read of the batch may check (compaction keeps it near its
    # trigger only while the instance stays open long enough: keep_instances_open)
    "l0_files": ("rocksdb.num-files-at-level0", "sum"),
}

#: Metric name -> (RocksDB statistic, field): counted by the instance's statistics
#: during the batch (what the task's work counted, also for a kept-open instance), summed.
ROCKSDB_STATISTICS: dict[str, tuple[str, str]] = {
    "block_cache_hits": ("rocksdb.block.cache.hit", "COUNT"),
    "block_cache_misses": ("rocksdb.block.cache.miss", "COUNT"),
    "write_stall_micros": ("rocksdb.stall.micros", "COUNT"),
    "compaction_micros": ("rocksdb.compaction.times.micros", "SUM"),
}

#: The metrics each micro-batch reports in Spark's progress (observed metrics) and
#: ``statebackend metrics`` (``progress``): name -> (how partitions combine, unit). The
#: names are stable; docs/operations.md says what each means and what to do when high.
PROGRESS_METRICS: dict[str, tuple[str, str]] = {
    "partitions": ("sum", "tasks"),
    "input_rows": ("sum", "rows"),
    "keys": ("sum", "keys"),
    "state_rows": ("sum", "rows"),
    "state_bytes": ("sum", "bytes"),
    "state_logical_bytes": ("sum", "bytes"),
    "bytes_uploaded": ("sum", "bytes"),
    "files_uploaded": ("sum", "files"),
    "bytes_downloaded": ("sum", "bytes"),
    "late_rows_dropped": ("sum", "rows"),
    "sync_ms": ("sum", "ms"),
    "sync_ms_max": ("max", "ms"),
    "async_ms": ("sum", "ms"),
    "async_ms_max": ("max", "ms"),
    "restore_ms": ("sum", "ms"),
    "restore_ms_max": ("max", "ms"),
    "restore_resident": ("sum", "tasks"),
    "restore_working_dir": ("sum", "tasks"),
    "restore_local_copy": ("sum", "tasks"),
    "restore_durable": ("sum", "tasks"),
    "restore_empty": ("sum", "tasks"),
    "restore_other": ("sum", "tasks"),
    "rocksdb_live_sst_bytes": ("sum", "bytes"),
    "rocksdb_memtable_bytes": ("sum", "bytes"),
    "rocksdb_pending_compaction_bytes": ("sum", "bytes"),
    "rocksdb_pending_compaction_bytes_max": ("max", "bytes"),
    "rocksdb_l0_files_max": ("max", "files"),
    "rocksdb_block_cache_bytes": ("max", "bytes"),
    "rocksdb_block_cache_hits": ("sum", "reads"),
    "rocksdb_block_cache_misses": ("sum", "reads"),
    "rocksdb_write_stall_ms": ("sum", "ms"),
    "rocksdb_compaction_ms": ("sum", "ms"),
}
#: The metrics above that only RocksDB's statistics count (``rocksdb_statistics=True``);
#: without them these names, and :data:`BLOCK_CACHE_HIT_RATE`, are absent.
STATISTICS_METRICS = frozenset({"rocksdb_block_cache_hits", "rocksdb_block_cache_misses",
                                "rocksdb_write_stall_ms", "rocksdb_compaction_ms"})
#: Derived from the sums above after combining: hits / (hits + misses), absent without reads.
BLOCK_CACHE_HIT_RATE = "rocksdb_block_cache_hit_rate"
_SOURCES = ("resident", "working_dir", "local_copy", "durable", "empty")


# --- executor side ---------------------------------------------------------------------


def rocksdb_properties(instance: RocksDBInstance) -> dict[str, int]:
    """RocksDB properties of an open instance, summed over its column families.

    Read in the task before the checkpoint flushes (so ``memtable_bytes`` is what the
    batch left in memory, and ``live_sst_bytes`` excludes it). A property RocksDB does not
    report is left out rather than recorded as 0.

    Parameters
    ----------
    instance : RocksDBInstance
        The open working instance.

    Returns
    -------
    dict of str to int
        Keys of :data:`ROCKSDB_PROPERTIES` (those RocksDB reported), and
        ``logical_bytes``: keys and values of the live entries in the SST files
        (:meth:`~statebackend.rocksdb.instance.RocksDBInstance.logical_bytes`).
    """
    out: dict[str, int] = {}
    names = instance.column_family_names()
    for metric, (prop, how) in ROCKSDB_PROPERTIES.items():
        values = [v for v in (instance.property_int(prop, cf) for cf in names) if v is not None]
        if values:
            out[metric] = int(sum(values) if how == "sum" else max(values))
    # keys and values of the live entries flushed so far: what every amplification figure
    # is against (RocksDBInstance.logical_bytes says how it is estimated)
    out["logical_bytes"] = instance.logical_bytes()
    # the entries of the declared states (their column families; not the descriptors,
    # TTL index and timers in "default" and "_..." families)
    states = [v for v in (instance.property_int("rocksdb.estimate-num-keys", cf) for cf in names
                          if cf != "default" and not cf.startswith("_")) if v is not None]
    out["state_entries"] = int(sum(states))
    out.update(instance.statistics_delta(ROCKSDB_STATISTICS))
    return out


def partition_progress(p: PartitionStats) -> dict[str, int | float]:
    """One partition's values of :data:`PROGRESS_METRICS` (those it measured)."""
    rocks = p.rocksdb
    source = p.restore_source if p.restore_source in _SOURCES else "other"
    out: dict[str, int | float] = {
        "partitions": 1, "input_rows": p.rows, "keys": p.keys, "state_bytes": p.full_size,
        "bytes_uploaded": p.bytes_uploaded, "files_uploaded": p.files_uploaded,
        "bytes_downloaded": p.restore_bytes_downloaded,
        "late_rows_dropped": p.late_rows_dropped,
        "sync_ms": p.sync_ms, "sync_ms_max": p.sync_ms,
        "async_ms": p.async_ms, "async_ms_max": p.async_ms,
        "restore_ms": p.restore_ms, "restore_ms_max": p.restore_ms,
        **{f"restore_{s}": int(s == source) for s in (*_SOURCES, "other")}}
    for name, key, scale in (("state_rows", "state_entries", None),
                             ("state_logical_bytes", "logical_bytes", None),
                             ("rocksdb_live_sst_bytes", "live_sst_bytes", None),
                             ("rocksdb_memtable_bytes", "memtable_bytes", None),
                             ("rocksdb_pending_compaction_bytes", "pending_compaction_bytes", None),
                             ("rocksdb_pending_compaction_bytes_max", "pending_compaction_bytes",
                              None),
                             ("rocksdb_l0_files_max", "l0_files", None),
                             ("rocksdb_block_cache_bytes", "block_cache_bytes", None),
                             ("rocksdb_block_cache_hits", "block_cache_hits", None),
                             ("rocksdb_block_cache_misses", "block_cache_misses", None),
                             ("rocksdb_write_stall_ms", "write_stall_micros", 1000.0),
                             ("rocksdb_compaction_ms", "compaction_micros", 1000.0)):
        if key in rocks:
            out[name] = rocks[key] / scale if scale else rocks[key]
    return out


def combine_progress(parts: Iterable[Mapping[str, int | float]]) -> dict[str, int | float]:
    """Partitions' :func:`partition_progress` folded as :data:`PROGRESS_METRICS` says (a
    metric no partition measured is absent), plus :data:`BLOCK_CACHE_HIT_RATE`. What
    :func:`statebackend.spark.progress.progress_metrics` computes from the tasks' rows in
    Spark's progress."""
    out: dict[str, int | float] = {}
    for part in parts:
        for name, v in part.items():
            how = PROGRESS_METRICS[name][0]
            out[name] = (v if name not in out else
                         out[name] + v if how == "sum" else max(out[name], v))
    hits, misses = out.get("rocksdb_block_cache_hits"), out.get("rocksdb_block_cache_misses")
    if hits is not None and misses is not None and hits + misses > 0:
        out[BLOCK_CACHE_HIT_RATE] = hits / (hits + misses)
    return {k: out[k] for k in (*PROGRESS_METRICS, BLOCK_CACHE_HIT_RATE) if k in out}


# --- driver side -------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStats:
    """What one partition's task did for one checkpoint (from its manifest).

    Durations are milliseconds. ``end_to_end_ms`` and ``start_delay_ms`` are None when
    the manifest does not say when the batch started (manifests of batch jobs written
    before processing times were recorded).
    """

    partition: int
    attempt: str
    rows: int
    keys: int
    sync_ms: float
    async_ms: float
    end_to_end_ms: float | None
    start_delay_ms: float | None
    bytes_uploaded: int
    files_uploaded: int
    files_reused: int
    bytes_reused: int
    full_size: int
    incremental_size: int
    restore_source: str
    restore_ms: float
    restore_bytes_downloaded: int
    rocksdb: Mapping[str, int] = field(default_factory=dict)
    # where the task's time went before the snapshot, ms: input (reading the batch from
    # Spark), restore, group, process (the user's code), flush
    task_ms: Mapping[str, float] = field(default_factory=dict)
    # object-store requests of the task (RequestCounts as dicts): "restore" (reading the
    # committed state) and "checkpoint" (uploads and the manifest's PUT)
    requests: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # why a faster restore source was passed over (None: the first choice worked)
    restore_fallback: str | None = None
    # keys and values of the live entries (rocksdb.logical_bytes; None: not recorded)
    logical_bytes: int | None = None

    @property
    def referenced_over_logical(self) -> float | None:
        """Bytes the checkpoint references over the logical state (space amplification)."""
        return self.full_size / self.logical_bytes if self.logical_bytes else None
    # input rows at or before the watermark, dropped before the state saw them
    late_rows_dropped: int = 0


@dataclass(frozen=True)
class CheckpointStats:
    """One completed checkpoint, aggregated over its partitions.

    Attributes
    ----------
    end_to_end_ms : float or None
        From the batch's trigger to the last partition's publication (Flink's end to end).
    sync_ms, async_ms, start_delay_ms : float
        Maxima over partitions (the slowest partition is what delays a checkpoint).
    full_size, incremental_size : int
        Bytes the checkpoint references / bytes it uploaded.
    restore_sources : dict
        Partition count per restore source (``resident``, ``working_dir``, ``local_copy``,
        ``durable``, ``empty``).
    rocksdb : dict
        RocksDB properties summed over partitions (block cache: the maximum), and the
        statistics of :data:`ROCKSDB_STATISTICS` the batch counted, summed.
    requests : dict
        Object-store requests by phase, each a
        :class:`~statebackend.storage.accounting.RequestCounts` dict (put, parts, get,
        head, list, delete, bytes_up, bytes_down): ``checkpoint`` and ``restore`` summed
        over the partitions' tasks, ``completion`` the driver's (listing, manifest reads,
        record). A phase is absent when nothing counted it (a store without accounting).
    restore_fallbacks : dict
        Partition -> why its task passed over a faster restore source (a kept-open
        instance not handed over, a working directory written after the checkpoint, an
        unusable local copy); only partitions that fell back.
    logical_bytes : int or None
        Keys and values of the live entries over all partitions (the data the user
        stored, estimated from RocksDB's table properties); None when a partition did not
        record it. ``referenced_over_logical`` is ``full_size`` over it.
    progress : dict
        The metrics of :data:`PROGRESS_METRICS` (:func:`combine_progress`): what Spark's
        progress of the micro-batch reports under the operator's observation name.
    """

    operator_id: str
    checkpoint_id: int
    parallelism: int
    trigger_ms: int | None
    completed_at_ms: int
    end_to_end_ms: float | None
    sync_ms: float
    async_ms: float
    start_delay_ms: float | None
    rows: int
    keys: int
    bytes_uploaded: int
    files_uploaded: int
    files_reused: int
    bytes_reused: int
    full_size: int
    incremental_size: int
    restore_sources: Mapping[str, int]
    restore_ms: float
    restore_bytes_downloaded: int
    rocksdb: Mapping[str, int]
    requests: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    restore_fallbacks: Mapping[int, str] = field(default_factory=dict)
    partitions: tuple[PartitionStats, ...] = ()
    logical_bytes: int | None = None

    @property
    def referenced_over_logical(self) -> float | None:
        return self.full_size / self.logical_bytes if self.logical_bytes else None
    # the micro-batch's metrics as Spark's progress reports them (PROGRESS_METRICS)
    progress: Mapping[str, int | float] = field(default_factory=dict)

    def to_dict(self, partitions: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["referenced_over_logical"] = self.referenced_over_logical
        if not partitions:
            d.pop("partitions")
        return d


def _source(restore: Mapping[str, Any]) -> str:
    # RestoreSource is a str enum: a manifest built in this process (metrics from asdict)
    # still holds the member, whose str() is "RestoreSource.X"; one read back holds "x"
    return str(restore.get("source", "unknown")).split(".")[-1].lower()


def partition_stats(m: PartitionManifest, trigger_ms: int | None, *,
                    requests: bool = True) -> PartitionStats:
    """The stats of one manifest; ``trigger_ms`` is the batch's start (None: unknown).
    ``requests=False`` leaves the request counts out (empty): a task's metrics row
    (:func:`partition_progress`) does not report them, and parsing them was 40% of this."""
    met = m.metrics
    sync_ms = 1000.0 * float(met.get("sync_duration_s", 0.0))
    async_ms = 1000.0 * float(met.get("async_duration_s", 0.0))
    e2e = start = None
    if trigger_ms is not None and m.created_at_ms:
        e2e = float(max(0, m.created_at_ms - trigger_ms))
        start = max(0.0, e2e - sync_ms - async_ms)
    restore = met.get("restore") or {}
    rocks = {k: int(v) for k, v in (met.get("rocksdb") or {}).items()}
    full, incremental = m.full_size, m.incremental_size
    return PartitionStats(
        partition=m.partition, attempt=m.attempt, rows=int(met.get("rows", 0)),
        keys=int(met.get("keys", 0)), sync_ms=sync_ms, async_ms=async_ms,
        end_to_end_ms=e2e, start_delay_ms=start,
        # (the fallbacks walk every file: computed only when the metric is missing)
        bytes_uploaded=int(met["bytes_uploaded"] if "bytes_uploaded" in met else incremental),
        files_uploaded=int(met["files_uploaded"] if "files_uploaded" in met
                           else sum(f.uploaded for f in m.files)),
        files_reused=int(met["files_reused"] if "files_reused" in met
                         else sum(not f.uploaded for f in m.files)),
        bytes_reused=full - incremental, full_size=full,
        incremental_size=incremental, restore_source=_source(restore),
        restore_ms=1000.0 * float(restore.get("duration_s", 0.0)),
        restore_bytes_downloaded=int(restore.get("bytes_downloaded", 0)), rocksdb=rocks,
        task_ms={k: float(v) for k, v in (met.get("task_ms") or {}).items()},
        requests={phase: RequestCounts.from_dict(met[key]).to_dict()
                  for phase, key in (("restore", "restore_requests"),
                                     ("checkpoint", "checkpoint_requests"))
                  if requests and met.get(key) is not None},
        restore_fallback=restore.get("fallback_reason") or None,
        logical_bytes=rocks.get("logical_bytes"),
        late_rows_dropped=int(met.get("late_rows_dropped", 0)))


def aggregate(record: CompletedCheckpoint, manifests: Iterable[PartitionManifest],
              completion_requests: RequestCounts | None = None) -> CheckpointStats:
    """Fold the chosen manifests of a completed checkpoint into :class:`CheckpointStats`
    (``completion_requests``: the driver's, when counted)."""
    ms = sorted(manifests, key=lambda m: m.partition)
    # Every task of a micro-batch sees the same batch timestamp; a partition without rows
    # falls back to its wall clock (later), so the minimum is the batch's trigger.
    times = [int(m.metrics["processing_time_ms"]) for m in ms
             if m.metrics.get("processing_time_ms") is not None]
    trigger = min(times) if times else None
    parts = tuple(partition_stats(m, trigger) for m in ms)
    sources: dict[str, int] = {}
    for p in parts:
        sources[p.restore_source] = sources.get(p.restore_source, 0) + 1
    rocks: dict[str, int] = {}
    for p in parts:
        for k, v in p.rocksdb.items():
            how = ROCKSDB_PROPERTIES.get(k, ("", "sum"))[1]
            rocks[k] = max(rocks.get(k, v), v) if how == "max" else rocks.get(k, 0) + v
    published = [m.created_at_ms for m in ms if m.created_at_ms]
    e2e = None
    if trigger is not None and published:
        e2e = float(max(0, max(published) - trigger))
    delays = [p.start_delay_ms for p in parts if p.start_delay_ms is not None]
    requests: dict[str, RequestCounts] = {}
    for p in parts:
        for phase, counts in p.requests.items():
            requests[phase] = requests.get(phase, RequestCounts()) + RequestCounts.from_dict(counts)
    if completion_requests is not None:
        requests["completion"] = completion_requests
    return CheckpointStats(
        operator_id=record.operator_id, checkpoint_id=record.checkpoint_id,
        parallelism=record.parallelism, trigger_ms=trigger,
        completed_at_ms=record.created_at_ms, end_to_end_ms=e2e,
        sync_ms=max((p.sync_ms for p in parts), default=0.0),
        async_ms=max((p.async_ms for p in parts), default=0.0),
        start_delay_ms=max(delays) if delays else None,
        rows=sum(p.rows for p in parts), keys=sum(p.keys for p in parts),
        bytes_uploaded=sum(p.bytes_uploaded for p in parts),
        files_uploaded=sum(p.files_uploaded for p in parts),
        files_reused=sum(p.files_reused for p in parts),
        bytes_reused=sum(p.bytes_reused for p in parts),
        full_size=sum(p.full_size for p in parts),
        incremental_size=sum(p.incremental_size for p in parts),
        restore_sources=dict(sorted(sources.items())),
        restore_ms=max((p.restore_ms for p in parts), default=0.0),
        restore_bytes_downloaded=sum(p.restore_bytes_downloaded for p in parts),
        rocksdb=dict(sorted(rocks.items())),
        requests={k: v.to_dict() for k, v in sorted(requests.items())},
        restore_fallbacks={p.partition: p.restore_fallback for p in parts
                           if p.restore_fallback},
        partitions=parts, progress=combine_progress(partition_progress(p) for p in parts),
        logical_bytes=(sum(p.logical_bytes or 0 for p in parts)
                       if parts and all(p.logical_bytes is not None for p in parts) else None))
