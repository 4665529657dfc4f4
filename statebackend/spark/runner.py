"""The function ``mapInPandas`` runs: restore, process, checkpoint, close (or keep open),
then output."""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..checkpoint.carry import carried_origin, never_ran
from ..checkpoint.fencing import claim
from ..checkpoint.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
    checkpoint_dir,
    choose_manifest,
)
from ..coordinator.coordinator import completed_ids
from ..errors import IncompatibleStateError
from ..metrics import rocksdb_properties
from ..recovery.local import WORK_DIR
from ..recovery.resident import ResidentInstances, resident_dir_name, resident_instances
from ..rocksdb.instance import RocksDBInstance
from ..rocksdb.options import to_rocksdict_options
from ..state.backend import KeyedStateBackend
from ..storage import open_store
from ..storage.manifests import (
    list_published_manifests,
    operator_store,
    read_completed_record,
    read_recorded_manifests,
)
from .plan import KG_COL
from .task import (
    ADDED_COLUMNS,
    DEFAULT_FRAME_ROWS,
    BatchContext,
    KeyGroups,
    OperatorConfig,
    TaskInput,
    check_rows_belong,
    decode_key,
    event_time_ms,
    group_by_key,
    kg_range_of,
    local_root,
    run_identity,
    task_identity,
)

log = logging.getLogger("statebackend.runner")

_STORES: dict[tuple, Any] = {}
# (location, operator, run id) -> the writer epoch this process's tasks of that run hold
_EPOCHS: dict[tuple[str, str, str], int] = {}


def root_store(config: OperatorConfig):
    """One store per location per worker process: pools are reused across tasks."""
    # storage options nest (S3's client_kwargs is a dict): key by their canonical JSON
    key = (config.checkpoint_location,
           json.dumps(config.storage_options, sort_keys=True, default=repr))
    store = _STORES.get(key)
    if store is None:
        root = open_store(config.checkpoint_location,
                          upload_threads=config.options.upload_threads,
                          download_threads=config.options.download_threads,
                          storage_options=config.storage_options or None)
        store = _STORES[key] = root
    return store


def writer_epoch(config: OperatorConfig, store) -> int | None:
    """The writer epoch this task's run holds on the operator's location, taken by the
    run's first task in this process (:func:`~statebackend.checkpoint.fencing.claim`: a
    listing and a few small reads, once per run and process); None without fencing.
    Publication then proves it still owns the location (one HEAD per checkpoint).

    Raises
    ------
    StateLocationInUseError
        Another streaming query owns the location (before anything is restored or written).
    WriterFencedError
        A newer run of the same query took the location over.
    """
    if not config.options.fencing:
        return None
    query_id, run_id = run_identity(config)
    key = (config.checkpoint_location, config.operator_id, run_id)
    epoch = _EPOCHS.get(key)
    if epoch is None:
        epoch = _EPOCHS[key] = claim(store, query_id, run_id).epoch
    return epoch


def resolve_base(store, partition: int, checkpoint_id: int,
                 kg_range: tuple[int, int] | None,
                 record: CompletedCheckpoint | None) -> PartitionManifest | None:
    """The manifest of ``partition`` committed for ``checkpoint_id`` (None: no state yet).

    The coordinator's record names it once the checkpoint is complete; before that (the
    listener runs after the batch ends), every reader applies the same deterministic rule
    to the published attempts. ``record``: the checkpoint's record as the task read it
    (None: not completed when read).
    """
    if checkpoint_id < 0:
        return None
    if record is not None:
        return read_recorded_manifests(store, record, [partition])[partition]
    published = list_published_manifests(store, checkpoint_id, partition)
    if kg_range is not None:
        # attempts of another layout (a run with another parallelism that died before
        # this checkpoint completed) are not this partition's state
        published = [m for m in published if (m.key_group_start, m.key_group_end) == kg_range]
    if published:
        chosen = choose_manifest(published)
        # The coordinator may have completed the checkpoint meanwhile with an attempt that
        # published after our listing; its record is the truth (the files of an attempt it
        # did not choose may be deleted), so look once more.
        record = read_completed_record(store, checkpoint_id)
        if record is not None and record.manifests.get(partition) not in (None, chosen.path):
            return read_recorded_manifests(store, record, [partition])[partition]
        return chosen
    return None


def check_continuity(completed: list[int], checkpoint_id: int) -> None:
    """Refuse to start from empty state when durable state of this operator exists
    (``completed``: the ids of its completed checkpoints): that means Spark's
    checkpointLocation was reset or our state was removed; silently starting over would
    lose committed state."""
    if completed:
        raise IncompatibleStateError(
            f"batch {checkpoint_id} expects state of batch {checkpoint_id - 1}, which does not "
            f"exist, but completed checkpoints {completed[0]}..{completed[-1]} do: was the "
            f"Spark checkpointLocation reset? Use a new state location for a new query, or "
            f"restart the query from its original Spark checkpoint.")


@dataclass
class Restored:
    """The instance a task starts from, and where it came from."""

    instance: RocksDBInstance
    metrics: Any
    base: PartitionManifest | None  # the manifest restored (the next checkpoint's base)
    first: bool  # no state existed before this batch (initial state applies)
    max_event_time_ms: int | None
    record: CompletedCheckpoint | None = None  # of the previous checkpoint, if completed
    prev_id: int = -1  # the checkpoint restored: the last batch before this one that ran


def obtain_instance(config: OperatorConfig, store, checkpointer, checkpoint_id: int,
                    open_instance: Callable[[str], RocksDBInstance],
                    resident: ResidentInstances | None = None) -> Restored:
    """Open the state committed for ``checkpoint_id - 1`` as this partition's instance.

    Three cases: the same layout (restore that partition's manifest); a completed
    checkpoint written with another parallelism (assemble the new key-group range from
    the overlapping old partitions); no state yet and a savepoint configured (read the
    range's key-group blocks from it). With ``resident`` (``keep_instances_open``), the
    same layout first reuses the instance this process kept open, when it produced
    exactly that manifest. Micro-batches in which the operator ran no task (see
    :func:`last_batch_that_ran`) are passed over: the state restored is then that of the
    batch before them (``Restored.prev_id``).
    """
    restored = _obtain(config, store, checkpointer, checkpoint_id, open_instance, resident)
    if resident is not None:
        resident.opened(checkpointer.local, restored.instance)
    return restored


def release_instance(checkpointer, instance: RocksDBInstance,
                     published: PartitionManifest | None,
                     resident: ResidentInstances | None) -> None:
    """End of a task: close the instance, or keep it open for the next task of its
    partition when its checkpoint was published (``keep_instances_open``)."""
    if resident is None:
        instance.close()
    elif published is None:
        resident.discard(checkpointer.local, instance)
    else:
        resident.give_back(checkpointer.local, instance, published)


def _obtain(config: OperatorConfig, store, checkpointer, checkpoint_id: int,
            open_instance: Callable[[str], RocksDBInstance],
            resident: ResidentInstances | None, prev: int | None = None) -> Restored:
    from ..recovery.rescale import restore_from_savepoint, restore_rescaled

    partition = checkpointer.partition
    if prev is None:
        prev = checkpoint_id - 1
    record = read_completed_record(store, prev) if prev >= 0 else None
    if record is not None and record.parallelism != config.parallelism:
        if resident is not None:
            resident.forget(checkpointer.local)
        inst, rmetrics, sources = restore_rescaled(
            checkpointer, record, config.parallelism, config.max_parallelism,
            local_root(config.options), open_instance)
        ets = [int(m.metrics["max_event_time_ms"]) for m in sources
               if m.metrics.get("max_event_time_ms") is not None]
        return Restored(inst, rmetrics, carried_origin(sources[0]), False,
                        max(ets) if ets else None, record, prev)
    kg_range = kg_range_of(config, partition)
    base = resolve_base(store, partition, prev, (kg_range.start, kg_range.end), record)
    if base is None and record is None and prev >= 0 and config.extra.get("carrier"):
        from .carrier import carry_idle_partition  # it had no rows in batch `prev`
        base = carry_idle_partition(store, config, partition, prev)
    if base is None and prev >= 0:
        completed = completed_ids(store)
        ran = last_batch_that_ran(store, prev, completed) if record is None else prev
        if ran != prev:
            return _obtain(config, store, checkpointer, checkpoint_id, open_instance,
                           resident, prev=ran)
        check_continuity(completed, checkpoint_id)
    if base is not None and base.max_parallelism != config.max_parallelism:
        raise IncompatibleStateError(
            f"state was written with max_parallelism={base.max_parallelism}, this query uses "
            f"{config.max_parallelism}; it is fixed for the life of the state. To migrate, "
            f"write a savepoint with the old value, rewrite it for the new one with "
            f"`statebackend migrate-savepoint URL OPERATOR NAME NEW_NAME --max-parallelism "
            f"{config.max_parallelism}` (or statebackend.savepoint.migrate.migrate_savepoint), "
            f"and start from the new savepoint)")
    passed_over: list[str] = []  # faster sources that did not work out, for the report
    base = carried_origin(base)  # a carried-over manifest: the checkpoint it carries
    if resident is not None:
        t0 = time.perf_counter()
        kept = resident.take(checkpointer.local, base)
        if kept is not None and base is not None:
            rmetrics = checkpointer.resume(base, kept, time.perf_counter() - t0)
            et = base.metrics.get("max_event_time_ms")
            return Restored(kept, rmetrics, base, False, et, record, prev)
        if base is not None:
            # open in another worker of this executor: have it handed over (bounded wait)
            resident.request_handover(checkpointer.local, base, reasons=passed_over)
    savepoint = config.extra.get("from_savepoint")
    if base is None and savepoint:
        from ..savepoint.reader import SavepointReader

        sp_store = open_store(savepoint["url"],
                              storage_options=savepoint.get("storage_options") or None)
        reader = SavepointReader(sp_store)
        inst, smetrics = restore_from_savepoint(checkpointer, reader, config.parallelism,
                                                config.max_parallelism)
        et = reader.manifest.metrics.get("max_event_time_ms")
        return Restored(inst, smetrics, None, False, None if et is None else int(et), record,
                        prev)
    inst, rmetrics = checkpointer.restore(base, passed_over)
    et = base.metrics.get("max_event_time_ms") if base is not None else None
    return Restored(inst, rmetrics, base, base is None or never_ran(base), et, record, prev)


def last_batch_that_ran(store, prev: int, completed: list[int]) -> int:
    """``prev``, or the latest earlier batch with anything published when ``prev`` and the
    batches between have nothing at all (-1: none has); ``completed``: the operator's
    completed checkpoint ids (none is passed over).

    Spark runs no task of a ``mapInPandas`` whose whole input is empty as planned (an empty
    file, a no-data micro-batch): the optimizer prunes it, so that micro-batch publishes no
    manifest for any partition while Spark still commits it. Its state is the state of the
    batch before it. A batch with something published is never passed over (a partition
    missing from it is an error, raised by the caller). Costs one listing of one
    checkpoint's directory per batch passed over, and runs only when ``prev`` has neither
    a record nor a manifest of this partition.
    """
    floor = max([c for c in completed if c <= prev], default=-1)
    n = prev
    while n > floor and not store.list_dir(checkpoint_dir(n)):
        n -= 1
    return n


def run_partition(config: OperatorConfig, batches: Iterator[pd.DataFrame],
                  process: Callable[[KeyedStateBackend, Any, BatchContext,
                                     Callable[[bytes], tuple]], list],
                  partition: int | None = None) -> Iterator[pd.DataFrame]:
    """Run one task; ``process(backend, groups, ctx, frames)`` returns the output frames."""
    from ..checkpoint import PartitionCheckpointer

    checkpoint_id, partition, attempt = task_identity(config, partition)
    t0 = time.perf_counter()
    per_key = config.extra.get("per_key", True)
    source = TaskInput(batches, config.watermark[0] if config.watermark is not None else None)
    frame_rows = None if per_key else config.extra.get("frame_rows", DEFAULT_FRAME_ROWS)
    chunks = source.chunks(sys.maxsize if frame_rows is None else frame_rows)
    # The first frame (for per-key operators, and usually for map_in_pandas too, the whole
    # input) before the state: opening the working directory removes its clean marker, so
    # a failure while receiving (a lost shuffle block after an executor loss) would cost
    # the retry its working directory (tests/faults/test_executor_loss.py).
    first = next(chunks, None)
    ptime = source.batch_processing_time()
    t_input = time.perf_counter()
    root = root_store(config)
    store = operator_store(root, config.operator_id)
    kg_range = kg_range_of(config, partition)
    db_options = to_rocksdict_options(config.options)

    def open_instance(path: str) -> RocksDBInstance:
        return RocksDBInstance(path, db_options=db_options)

    resident = (resident_instances(config.options.instance_idle_timeout)
                if config.options.keep_instances_open else None)
    checkpointer = PartitionCheckpointer(
        root, config.operator_id, partition, config.options, local_root(config.options),
        open_instance=open_instance,
        working_dir_name=resident_dir_name() if resident is not None else WORK_DIR)
    # taken before the restore: another query is refused before anything is touched
    checkpointer.writer_epoch = writer_epoch(config, store)
    counts0 = root.request_counts()
    restored = obtain_instance(config, store, checkpointer, checkpoint_id, open_instance,
                               resident)
    instance, restore_metrics, base = restored.instance, restored.metrics, restored.base
    t_restore = time.perf_counter()
    read_before = source.read_s
    published = None
    try:
        max_et = _max_opt(restored.max_event_time_ms, source.max_event_time_ms)
        wm = -1
        late_dropped = 0
        if config.watermark is not None:
            prev = restored.prev_id
            wm = watermark_for(store, config, prev, base, restored.record)
            if per_key and config.extra.get("drop_late") and first is not None:
                # after micro-batches that ran no task the previous batch's watermark was
                # already this one (no event time arrived since)
                late_wm = (late_watermark(store, config, checkpoint_id, base)
                           if prev == checkpoint_id - 1 else wm)
                first, late_dropped = drop_late_rows(first, config.watermark[0], late_wm)
        counts1 = root.request_counts()  # the restore's requests (and the watermark's reads)
        ctx = BatchContext(checkpoint_id, partition, ptime, wm, max_et, first=restored.first)
        backend = KeyedStateBackend(instance, timer_service=config.options.timer_service,
                                    clock=lambda: ptime)
        groups = task_input(first, config, kg_range, partition) if per_key else None
        frames = None if per_key else user_frames(first, chunks, config, kg_range, partition)
        t_group = time.perf_counter()
        out = process(backend, groups if per_key else frames, ctx,
                      lambda k: decode_key(k, config.key))
        for _ in frames or ():  # rows the function did not ask for: still checked, counted
            pass
        t_process = time.perf_counter()
        backend.purge_expired()
        backend.flush()
        t_flush = time.perf_counter()
        max_et = _max_opt(max_et, source.max_event_time_ms)
        # time spent waiting for Spark's input while the function ran (streamed input)
        read_during = source.read_s - read_before
        metrics = {"restore": _as_dict(restore_metrics), "rows": source.rows,
                   "keys": len(groups) if groups is not None else 0, "processing_time_ms": ptime,
                   # readers of the state (read_state, the CLI) decode grouping keys with these
                   "key_columns": list(config.key.columns), "key_types": list(config.key.types),
                   # before the checkpoint flushes, while the instance is open
                   "rocksdb": rocksdb_properties(instance),
                   # where the task's time went before the checkpoint (its own sync/async
                   # durations are recorded by the checkpointer); "input" counts every wait
                   # for Spark's rows, "process" the function's time without them
                   "task_ms": {"input": _ms(t0, t_input) + 1000 * read_during,
                               "restore": _ms(t_input, t_restore),
                               "group": _ms(t_restore, t_group),
                               "process": _ms(t_group, t_process) - 1000 * read_during,
                               "flush": _ms(t_process, t_flush)}}
        if max_et is not None:
            metrics["max_event_time_ms"] = int(max_et)
        if config.watermark is not None:
            # the next batch drops input at or before this watermark (Spark's rule)
            metrics["watermark_ms"] = int(wm)
            metrics["late_rows_dropped"] = late_dropped
        if counts0 is not None and counts1 is not None:
            metrics["restore_requests"] = (counts1 - counts0).to_dict()
        published, _ = checkpointer.checkpoint(
            instance, checkpoint_id, attempt, (kg_range.start, kg_range.end),
            backend.descriptors(), base_manifest=base, extra_metrics=metrics)
    finally:
        release_instance(checkpointer, instance, published, resident)
    log.debug("partition %d batch %d done in %.3fs", partition, checkpoint_id,
              time.perf_counter() - t0)
    if out:
        yield concat_frames(out)


def task_input(pdf: pd.DataFrame | None, config: OperatorConfig, kg_range,
               partition: int) -> KeyGroups:
    """The batch's rows grouped by key (:func:`group_by_key`) for a per-key operator,
    checked to belong here. Key groups come from Spark's ``__sb_kg`` column when the plan
    added one, else they are computed here once per distinct key; either way a row of
    another partition's key groups is refused before its state is touched.
    """
    if pdf is None:
        return group_by_key(pd.DataFrame(columns=list(config.key.columns)), config.key,
                            np.zeros(0, np.int32))
    kg = pdf[KG_COL].to_numpy() if KG_COL in pdf.columns else None
    if kg is not None:
        check_rows_belong(kg, kg_range, partition)
    groups = group_by_key(pdf, config.key, kg, config.max_parallelism)
    if kg is None:
        check_rows_belong(groups.key_groups, kg_range, partition)
    return groups


def user_frames(first: pd.DataFrame | None, rest: Iterator[pd.DataFrame],
                config: OperatorConfig, kg_range, partition: int) -> Iterator[pd.DataFrame]:
    """The frames a batch-at-a-time function (``map_in_pandas``) reads, as they arrive,
    without our columns. Rows carrying Spark's key group are checked here; otherwise
    :class:`~statebackend.spark.vector.KeyedColumnState` checks the key groups of the keys
    it is asked about, so a row of another partition still never touches state.
    """
    if first is None:
        return
    for frame in itertools.chain([first], rest):
        if KG_COL in frame.columns:
            check_rows_belong(frame[KG_COL].to_numpy(), kg_range, partition)
        yield frame.drop(columns=[c for c in ADDED_COLUMNS if c in frame.columns])


def _max_opt(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(int(a), int(b))


def concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One frame from many small ones (typically one per key).

    ``pd.concat`` costs ~45 us per input frame here; when every frame has the same
    columns with plain numpy dtypes, concatenating the column arrays costs ~4 us (reading
    each column with ``iget_values``: ``DataFrame.dtypes`` builds a Series per frame, ~18 us).
    """
    if len(frames) == 1:
        return frames[0]
    first = frames[0]
    cols = list(first.columns)
    dtypes = list(first.dtypes)
    try:
        if all(isinstance(d, np.dtype) for d in dtypes) and first.columns.is_unique:
            parts: list[list[np.ndarray]] = [[] for _ in cols]
            for f in frames:
                if f.columns.tolist() != cols:
                    raise ValueError("mixed frames")
                mgr = f._mgr
                for i, part in enumerate(parts):
                    arr = mgr.iget_values(i)
                    if arr.dtype != dtypes[i]:
                        raise ValueError("mixed frames")
                    part.append(arr)
            return pd.DataFrame({c: np.concatenate(p) for c, p in zip(cols, parts)}, columns=cols)
    except (AttributeError, ValueError):
        pass
    return pd.concat(frames, ignore_index=True)


def watermark_for(store, config: OperatorConfig, prev_id: int, own: PartitionManifest | None,
                  record: CompletedCheckpoint | None) -> int:
    """The event-time watermark of this batch: max event time of all earlier batches over
    all partitions, minus the delay (0 before any event, as Spark's first batch).
    ``record``: the previous checkpoint's record as the task read it (None: not completed)."""
    if prev_id < 0:
        return 0
    latest = None
    # after a rescale the previous checkpoint has the old layout's partitions
    parts = sorted(record.manifests) if record is not None else range(config.parallelism)
    for p in parts:
        m = own if own is not None and p == own.partition else resolve_base(store, p, prev_id,
                                                                            None, record)
        v = None if m is None else m.metrics.get("max_event_time_ms")
        if v is not None:
            latest = int(v) if latest is None else max(latest, int(v))
    if latest is None or config.watermark is None:
        return 0
    return max(0, latest - config.watermark[1])


def late_watermark(store, config: OperatorConfig, checkpoint_id: int,
                   base: PartitionManifest | None) -> int:
    """The watermark for late events of batch ``checkpoint_id``: the watermark the previous
    batch ran with, as Spark's stateful operators use it to drop late input.

    Every task records the watermark it used in its manifest, so it is read from the base
    (b-1). A base without it (written before that, or a start from a savepoint) falls back
    to deriving it from the manifests of b-2, as :func:`watermark_for` derives b-1's.
    """
    if checkpoint_id < 1:
        return 0
    recorded = base.metrics.get("watermark_ms") if base is not None else None
    if recorded is not None:
        return int(recorded)
    prev_prev = checkpoint_id - 2
    if prev_prev < 0:
        return 0
    record = read_completed_record(store, prev_prev)
    return watermark_for(store, config, prev_prev, None, record)


def drop_late_rows(pdf: pd.DataFrame, column: str, late_wm: int) -> tuple[pd.DataFrame, int]:
    """``pdf`` without the rows whose event time is at or before ``late_wm`` (ms), and how
    many were dropped. Rows with a null event time are kept, as Spark keeps them."""
    if column not in pdf.columns or not len(pdf):
        return pdf, 0
    late = event_time_ms(pdf[column]) <= late_wm
    n = int(late.sum())
    if not n:
        return pdf, 0
    return pdf[~late].reset_index(drop=True), n


def _ms(start: float, end: float) -> float:
    return round(1000 * (end - start), 3)


def _as_dict(obj: Any) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(obj)
    return {"value": str(obj)}


def make_task(config: OperatorConfig, process) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    def task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from run_partition(config, batches, process)
    return task
