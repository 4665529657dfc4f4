"""Executor side of a distributed initial state (``initialState`` of
``transform_with_state``): the driver routes the initial-state DataFrame to our partitions
by key group, exactly as the input (:func:`statebackend.spark.plan.place`), and runs one
Spark job in which each task stages its partition's rows as one Arrow file
(:func:`stage_partition`); the operator's tasks on the query's first run read their
partition's file (:func:`initial_groups`). The rows pass from executors to durable storage
to executors: the driver only sees one small row per partition (the file's name).

Staged files live under ``_initial/<stage id>/`` of the operator's location, named by
partition and task attempt, so a retried or speculative attempt never overwrites another's
file (invariant 2); the driver names the file of the attempt Spark kept.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import StateBackendError
from ..model.manifest import INITIAL_STATE_DIR
from .columns import KG_COL, KeySpec
from .context import KeyGroups, check_rows_belong, group_by_key, kg_range_of

__all__ = ["STAGE_DIR", "STAGE_SCHEMA", "InitialState", "initial_groups", "make_stage_task",
           "new_stage_id", "operator_root", "stage_partition"]

STAGE_DIR = INITIAL_STATE_DIR
# one row per staging task that had rows: what the driver collects
STAGE_SCHEMA = "partition INT, path STRING, rows BIGINT"


@dataclass(frozen=True)
class InitialState:
    """Where each partition's initial-state rows were staged.

    Attributes
    ----------
    key : KeySpec
        The initial state's grouping columns (its own names; the input's key types).
    files : tuple of (int, str)
        ``(partition, path relative to the operator's root)`` of the partitions that have
        rows; a partition not named has none.
    rows : int
        Rows staged in all (for logs and tests).
    """

    key: KeySpec
    files: tuple[tuple[int, str], ...]
    rows: int = 0

    def file_of(self, partition: int) -> str | None:
        for p, path in self.files:
            if p == partition:
                return path
        return None


def stage_partition(frames: Iterator[pd.DataFrame], operator_root, stage_id: str,
                    partition: int, attempt: str) -> Iterator[pd.DataFrame]:
    """Write one partition's initial-state rows as one Arrow stream file; yields the
    row the driver collects (nothing for a partition without rows)."""
    import pyarrow as pa

    sink = io.BytesIO()
    writer = None
    rows = 0
    for frame in frames:
        if not len(frame):
            continue
        batch = pa.RecordBatch.from_pandas(frame, preserve_index=False)
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
        rows += len(frame)
    if writer is None:
        return
    writer.close()
    path = f"{STAGE_DIR}/{stage_id}/p{partition}-{attempt}.arrow"
    operator_root.put_bytes_atomic(path, sink.getvalue())
    yield pd.DataFrame({"partition": [partition], "path": [path], "rows": [rows]})


def new_stage_id() -> str:
    return uuid.uuid4().hex


def initial_groups(operator_root, initial: InitialState, config, partition: int
                   ) -> KeyGroups | None:
    """The staged initial-state rows of ``partition`` grouped by key (None: none), each
    checked to belong to the partition's key groups before any state is touched."""
    import pyarrow as pa

    path = initial.file_of(partition)
    if path is None:
        return None
    try:
        data = operator_root.get_bytes(path)
    except FileNotFoundError as e:
        raise StateBackendError(
            f"operator {config.operator_id!r}: the staged initial state of partition "
            f"{partition} ({path}) is missing; it is written when the query is planned: "
            f"plan the query again (call transform_with_state) to stage it anew") from e
    pdf = pa.ipc.open_stream(data).read_all().to_pandas()
    kg = pdf[KG_COL].to_numpy() if KG_COL in pdf.columns else None
    groups = group_by_key(pdf, initial.key, kg, config.max_parallelism)
    check_rows_belong(np.asarray(groups.key_groups), kg_range_of(config, partition), partition)
    return groups


def operator_root(config):
    """The store at the operator's root, shared by the worker process's tasks."""
    from ..storage.manifests import operator_store
    from .partition_state import root_store

    return operator_store(root_store(config), config.operator_id)


def make_stage_task(config, stage_id: str):
    """The ``mapInPandas`` function of the staging job: partition ``p`` of the placed
    initial state (:func:`statebackend.spark.plan.place`) is our partition ``p``."""

    def task(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:
            raise StateBackendError("the initial state is staged inside a Spark task")
        attempt = f"t{tc.taskAttemptId()}-a{tc.attemptNumber()}-{uuid.uuid4().hex[:8]}"
        yield from stage_partition(frames, operator_root(config), stage_id,
                                   tc.partitionId(), attempt)

    return task
