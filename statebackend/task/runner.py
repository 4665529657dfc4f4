"""The function ``mapInPandas`` runs for one partition of a stateful operator: input,
open, process, commit, emit (see :mod:`statebackend.task.context` for what each step must
guarantee).

Which state to open and how to commit it belongs to
:class:`~.partition_state.PartitionState`; the watermark and late rows to
:mod:`.watermark`; this module sequences them and runs the user's code.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from ..checkpoint.publish import ManifestFacts
from ..local.disk import WORK_DIR
from ..local.resident import resident_dir_name
from ..metrics import partition_progress, partition_stats, rocksdb_properties
from ..state.backend import KeyedStateBackend
from .columns import KG_COL
from .context import (
    ADDED_COLUMNS,
    BatchContext,
    KeyGroups,
    OperatorConfig,
    TaskInput,
    check_rows_belong,
    decode_key,
    group_by_key,
    kg_range_of,
    task_identity,
)
from .executor import current_executor_id
from .metrics import TaskClock, TaskMetrics, as_dict
from .metrics_rows import frames_with_metrics
from .partition_state import (
    PartitionState,
    Restored,
    check_continuity,
    last_batch_that_ran,
    resolve_base,
    root_store,
    task_writer,
)
from .watermark import EventTime, apply_watermark, check_emitted, max_opt

__all__ = ["check_continuity", "concat_frames", "last_batch_that_ran", "make_task",
           "resolve_base", "root_store", "run_partition", "task_input", "user_frames",
           "task_writer"]

log = logging.getLogger("statebackend.runner")

Process = Callable[[KeyedStateBackend, Any, BatchContext, Callable[[bytes], tuple]], list]


def run_partition(config: OperatorConfig, batches: Iterator[pd.DataFrame],
                  process: Process, partition: int | None = None) -> Iterator[pd.DataFrame]:
    """Run one task; ``process(backend, groups, ctx, decode)`` returns the output frames.
    ``partition``: ours, when it is not the Spark task's (the carrier plan, :mod:`.carrier`).

    The output is yielded only once the checkpoint is published: a task whose checkpoint
    failed produces nothing, and Spark's retry starts from the same state (invariant 1).
    """
    checkpoint_id, partition, attempt = task_identity(config, partition)
    clock = TaskClock()
    source = TaskInput(batches, config.watermark[0] if config.watermark is not None else None)
    chunks = source.chunks(sys.maxsize if config.per_key or config.frame_rows is None
                           else config.frame_rows)
    # The first frame (for per-key operators, and usually for map_in_pandas too, the whole
    # input) before the state: opening the working directory removes its clean marker, so
    # a failure while receiving (a lost shuffle block after an executor loss) would cost
    # the retry its working directory (tests/faults/test_executor_loss.py).
    first = next(chunks, None)
    ptime = source.batch_processing_time()
    clock.lap("input")
    state = PartitionState(config, partition, working_dir_name=(
        resident_dir_name() if config.options.keep_instances_open else WORK_DIR))
    restored = state.load(checkpoint_id)
    clock.lap("restore")
    published = None
    try:
        first, event = apply_watermark(state.store, config, checkpoint_id, restored, first)
        ctx = BatchContext(checkpoint_id, partition, ptime, event.watermark_ms,
                           max_opt(restored.max_event_time_ms, source.max_event_time_ms),
                           first=restored.first)
        out, states, metrics = process_batch(config, state, restored, ctx, event, source,
                                             first, chunks, process, clock)
        for frame in out if config.event_time_column is not None else ():
            check_emitted(frame, config, event.late_watermark_ms,
                          f"operator {config.operator_id!r}, partition {partition}, "
                          f"micro-batch {checkpoint_id}:")
        facts = ManifestFacts(
            key_columns=tuple(config.key.columns), key_types=tuple(config.key.types),
            max_event_time_ms=max_opt(ctx.max_event_time_ms, source.max_event_time_ms),
            # the next batch drops input at or before this watermark (Spark's rule)
            watermark_ms=None if config.watermark is None else event.watermark_ms,
            placement=config.plan_name,
            writer_query=None if state.writer is None else state.writer.query_id)
        published = state.commit(checkpoint_id, attempt, states, metrics.to_dict(), facts)
    finally:
        state.release(published)
    log.debug("partition %d batch %d done in %.3fs", partition, checkpoint_id,
              clock.elapsed_s())
    if config.progress_columns is None:  # a batch run: no progress to report in
        if out:
            yield concat_frames(out)
        return
    # what this task measured, as one more row for the query's observed metrics
    yield from frames_with_metrics(concat_frames(out) if out else None,
                                   config.progress_columns,
                                   partition_progress(partition_stats(published, None,
                                                                      requests=False)))


def process_batch(config: OperatorConfig, state: PartitionState, restored: Restored,
                  ctx: BatchContext, event: EventTime, source: TaskInput,
                  first: pd.DataFrame | None, chunks: Iterator[pd.DataFrame],
                  process: Process, clock: TaskClock) -> tuple[list, tuple, TaskMetrics]:
    """Run the user's code over the batch against the restored state, then flush.

    Returns the output frames, the declared states and the task's metrics.
    """
    restore_requests = state.requests()  # the restore's (and the watermark's reads)
    read_before = source.read_s
    instance, ptime = restored.instance, ctx.processing_time_ms
    kg_range = kg_range_of(config, ctx.partition)
    backend = KeyedStateBackend(instance, timer_service=config.options.timer_service,
                                clock=lambda: ptime)
    if config.per_key:
        groups: KeyGroups | None = task_input(first, config, kg_range, ctx.partition)
        frames = None
    else:
        groups, frames = None, user_frames(first, chunks, config, kg_range, ctx.partition)
    clock.lap("group")
    out = process(backend, groups if config.per_key else frames, ctx,
                  lambda k: decode_key(k, config.key))
    for _ in frames or ():  # rows the function did not ask for: still checked, counted
        pass
    clock.lap("process")
    backend.purge_expired()
    backend.flush()
    clock.lap("flush")
    clock.waited(source.read_s - read_before)
    metrics = TaskMetrics(
        restore=as_dict(restored.metrics), rows=source.rows,
        keys=len(groups) if groups is not None else 0, processing_time_ms=ptime,
        # before the checkpoint flushes, while the instance is open
        rocksdb=rocksdb_properties(instance), task_ms=dict(clock.ms),
        late_rows_dropped=None if config.watermark is None else event.late_rows_dropped,
        restore_requests=restore_requests, executor=current_executor_id())
    return out, backend.descriptors(), metrics


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
    :class:`~statebackend.task.vector.KeyedColumnState` checks the key groups of the keys
    it is asked about, so a row of another partition still never touches state.
    """
    if first is None:
        return
    for frame in itertools.chain([first], rest):
        if KG_COL in frame.columns:
            check_rows_belong(frame[KG_COL].to_numpy(), kg_range, partition)
        yield frame.drop(columns=[c for c in ADDED_COLUMNS if c in frame.columns])


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


def make_task(config: OperatorConfig, process) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    def task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from run_partition(config, batches, process)
    return task
