"""Executor side: what one Spark task must do for one partition of a stateful operator,
and the pieces it is made of (the operator's configuration, the task's input, rows
grouped by key, the task's identity).

:func:`statebackend.task.runner.run_partition` runs it, for micro-batch (or epoch) ``b``
of partition ``p``:

1. input: read the partition's input (Spark gives every partition a task every batch,
   empty ones included; ``map_in_pandas`` reads its first ``frame_rows`` here and the rest
   as its function asks for it, see :class:`TaskInput`), before any state is touched;
2. open: restore the state committed for ``b - 1``
   (:meth:`~statebackend.task.partition_state.PartitionState.load`: the instance this
   process kept open, one handed over, the working directory, the local copy, durable
   storage, a rescale or a savepoint);
3. process: group the rows by key as slices of one sorted frame and run the user's code
   against the keyed state (inputs first, then expired timers, as Spark does);
4. commit: checkpoint ``b`` (flush + native checkpoint or changelog, upload what is new,
   publish the manifest), then close the instance, or keep it open for the partition's
   next task (``keep_instances_open``) once its checkpoint is published;
5. emit: only then yield the output, so a task whose checkpoint failed produces nothing
   and Spark's retry starts from the same committed state (invariant 1).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import StateBackendError
from ..keys.grouping_key import decode_grouping_key, encode_grouping_keys, encode_keys_with_groups
from ..keys.ranges import DEFAULT_MAX_PARALLELISM, key_group_range
from ..options import StateBackendOptions
from ..redact import redact_options, redact_url
from .columns import ADDED_COLUMNS, PTIME_COL, TICK_COL, KeySpec  # noqa: F401  (PTIME_COL, ADDED_COLUMNS: importable from here)
from .executor import current_executor_id

log = logging.getLogger("statebackend.task")

BATCH_ID_PROPERTY = "streaming.sql.batchId"
# Spark sets both on every job of a streaming query: its id (kept in the query's checkpoint,
# the same across restarts) and, as the job group, the id of this start of it
QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"
# map_in_pandas: rows per frame handed to the function (at least; see TaskInput.chunks).
# Large: the usual micro-batch arrives as one frame (one set of state calls), while a
# backlog of millions of rows per partition is still processed in bounded memory.
DEFAULT_FRAME_ROWS = 1_000_000


@dataclass(frozen=True)
class SavepointSource:
    """A savepoint a new operator's state starts from: its location and storage options."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        # a savepoint's location and options may hold credentials, as the state's do
        return (f"SavepointSource(url={redact_url(self.url)!r}, "
                f"storage_options={redact_options(self.storage_options)})")


@dataclass(frozen=True)
class OperatorConfig:
    """Everything a task needs, shipped (pickled) to the executors with the operator.
    Frozen: the driver's builder (:func:`statebackend.spark.operators.build_config`)
    decides every field once, before the plan is built.

    The last five fields say how the operator reads its input: ``ticks`` (the plan adds
    tick rows so timers fire in batches without input), ``drop_late`` (input at or before
    the previous batch's watermark never reaches the user's code, as Spark's event-time
    operators drop it), ``per_key`` (rows grouped by key; False: ``map_in_pandas``, which
    reads frames of ``frame_rows`` rows, None: the whole input as one frame) and
    ``from_savepoint`` (where a state with no checkpoint yet starts from).
    ``progress_columns``: a streaming operator's tasks report their metrics in Spark's
    progress as one more output row (:mod:`statebackend.spark.progress`), whose user
    columns hold these values; None (batch runs): no metrics row.
    ``timers``: the operator's time mode (``"None"``, ``"ProcessingTime"``,
    ``"EventTime"``), which the carrier plan keeps running (:mod:`.carrier`); ``carrier``:
    the operator runs in the carrier plan (partitions without rows run no task).
    ``event_time_column``: ``(name, position)`` of the output column named by
    ``eventTimeColumnName`` (None: not set); every emitted row's value there must be
    later than the watermark for late events (:func:`.watermark.check_emitted`).
    """

    operator_id: str
    checkpoint_location: str
    storage_options: dict[str, Any]
    options: StateBackendOptions
    parallelism: int
    key: KeySpec
    epoch: int | None = None  # batch jobs: the checkpoint id of this run
    run_id: str | None = None  # batch jobs: the writer identity of this run (fencing)
    watermark: tuple[str, int] | None = None  # (event-time column, delay ms)
    ticks: bool = False
    drop_late: bool = False
    per_key: bool = True
    frame_rows: int | None = None
    from_savepoint: SavepointSource | None = None
    progress_columns: dict[str, Any] | None = None
    timers: str = "None"
    carrier: bool = False
    event_time_column: tuple[str, int] | None = None

    @property
    def max_parallelism(self) -> int:
        return self.options.max_parallelism

    @property
    def plan_name(self) -> str | None:
        """The streaming plan its tasks run in, as manifests record it (None: a batch
        run, whose plan no restart inherits)."""
        if self.run_id is not None:
            return None
        return "carrier" if self.carrier else "shuffle"

    def __repr__(self) -> str:
        # Storage options hold credentials and a location may too: never print them.
        return (f"OperatorConfig(operator_id={self.operator_id!r}, checkpoint_location="
                f"{redact_url(self.checkpoint_location)!r}, storage_options="
                f"{redact_options(self.storage_options)}, options={self.options!r}, "
                f"parallelism={self.parallelism!r}, key={self.key!r}, epoch={self.epoch!r}, "
                f"watermark={self.watermark!r}, ticks={self.ticks!r}, "
                f"drop_late={self.drop_late!r}, per_key={self.per_key!r}, "
                f"frame_rows={self.frame_rows!r}, from_savepoint={self.from_savepoint!r}, "
                f"timers={self.timers!r}, carrier={self.carrier!r}, "
                f"event_time_column={self.event_time_column!r})")


@dataclass
class BatchContext:
    """What the user's code may see of the current batch."""

    batch_id: int
    partition: int
    processing_time_ms: int
    watermark_ms: int  # -1 when no watermark is defined
    max_event_time_ms: int | None  # running max over all batches so far (this partition)
    first: bool = False  # no state existed before this batch (initial state applies)


@dataclass
class KeyGroups:
    """The rows of one batch grouped by key: slices of one frame sorted by key."""

    frame: pd.DataFrame  # sorted, internal columns dropped
    keys: list[tuple]  # grouping key tuple per group, in order
    key_bytes: list[bytes]
    starts: np.ndarray
    ends: np.ndarray
    key_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # per key

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, i: int) -> pd.DataFrame:
        """The rows of key ``i``, indexed from 0 as Spark hands each key's frame."""
        return self.frame.iloc[int(self.starts[i]):int(self.ends[i])].reset_index(drop=True)

    def slicer(self) -> Callable[[int], pd.DataFrame]:
        """``i -> rows of key i`` as a view of the sorted batch, for the per-key loop.

        Each frame is indexed from 0, as Spark's operators hand it: user code written for
        them reads ``pdf.at[0, "col"]`` or ``pdf.loc[0]``. Slicing the block manager
        directly costs ~8 us per key here, against ~12-17 us for ``iloc`` plus
        ``reset_index``; with a processor that does nothing that is most of our per-key
        cost. The slice's index is the fresh ``RangeIndex`` pandas makes for every slice,
        renumbered from 0 in place (a second index object per key would cost ~4,000
        instructions, 7% of a no-op task: ``benchmarks/bench_instructions.py``). Falls back
        to :meth:`rows` on a pandas without these internals.
        """
        frame = self.frame
        starts, ends = self.starts.tolist(), self.ends.tolist()
        try:
            mgr = frame._mgr
            from_mgr = type(frame)._from_mgr
            probe = mgr.get_slice(slice(0, 0), axis=1)
            index = probe.axes[1]
            if type(index) is not pd.RangeIndex or index is mgr.axes[1] or index._cache:
                return self.rows
            index._range = range(0)
            if not from_mgr(probe, axes=probe.axes).index.equals(pd.RangeIndex(0)):
                return self.rows
        except (AttributeError, TypeError, IndexError):
            return self.rows

        def rows(i: int) -> pd.DataFrame:
            start, end = starts[i], ends[i]
            m = mgr.get_slice(slice(start, end), axis=1)
            # get_slice made this index object for this slice alone and nothing has read
            # it yet (no cached values): renumbering it touches no other frame
            m.axes[1]._range = range(end - start)
            return from_mgr(m, axes=m.axes)

        return rows


def group_by_key(pdf: pd.DataFrame, spec: KeySpec, kg: np.ndarray | None = None,
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> KeyGroups:
    """Sort ``pdf`` by key once and describe each key's rows as a slice (no per-key copies).

    ``kg`` holds the key group of every row when Spark computed it; without it the key
    groups are computed here, once per distinct key, with ``max_parallelism``.
    """
    n = len(pdf)
    cols = list(spec.columns)
    dropped = [c for c in ADDED_COLUMNS if c in pdf.columns]
    if n == 0:
        return KeyGroups(pdf.drop(columns=dropped), [], [], np.zeros(0, np.int64),
                         np.zeros(0, np.int64))
    if len(cols) == 1:
        codes, _ = pd.factorize(pdf[cols[0]], use_na_sentinel=False)
    else:
        codes = pdf.groupby(cols, sort=False, dropna=False).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    codes_sorted = np.asarray(codes)[order]
    bounds = np.flatnonzero(codes_sorted[1:] != codes_sorted[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [n]))
    frame = pdf.drop(columns=dropped).take(order)
    frame.reset_index(drop=True, inplace=True)
    firsts = order[starts]
    key_cols = [pdf[c].to_numpy()[firsts] for c in cols]
    keys = [tuple(_py(v) for v in row) for row in zip(*key_cols)]
    values = [[k[i] for k in keys] for i in range(len(cols))]
    if kg is None:
        kgs, key_bytes = encode_keys_with_groups(values, list(spec.types), max_parallelism)
    else:
        kgs = np.asarray(kg)[firsts].astype(np.int32)
        key_bytes = encode_grouping_keys(values, list(spec.types), kgs)
    return KeyGroups(frame, keys, key_bytes, starts, ends, kgs)


def _py(v: Any) -> Any:
    """numpy scalars -> Python scalars, as PySpark hands keys to user code."""
    if isinstance(v, np.generic):
        return v.item()
    if v is pd.NaT or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


def decode_key(key: bytes, spec: KeySpec) -> tuple:
    return decode_grouping_key(key, list(spec.types))[1]


def task_identity(config: OperatorConfig, partition: int | None = None) -> tuple[int, int, str]:
    """(checkpoint id, partition, attempt name) of the running Spark task (``partition``:
    ours when it is not the task's, as in the carrier plan, :mod:`.carrier`)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise StateBackendError("statebackend operators must run inside a Spark task")
    prop = tc.getLocalProperty(BATCH_ID_PROPERTY)
    if prop is not None:
        checkpoint_id = int(prop)
    elif config.epoch is not None:
        checkpoint_id = config.epoch
    else:
        # A streaming operator's task without Spark's micro-batch id: its DataFrame was
        # executed outside the streaming query's own thread, which is how a Spark Connect
        # server runs the DataFrame a foreachBatch function acts on.
        raise StateBackendError(
            f"operator {config.operator_id!r}: this task has no micro-batch id. Spark gives "
            f"one only to the tasks a streaming query runs itself; on Spark Connect a "
            f"foreachBatch function's DataFrame runs outside the query, so our operator "
            f"cannot run inside foreachBatch there. Write its output with a sink instead "
            f"(writeStream.format(...).start() or .toTable(...)), or move foreachBatch after "
            f"it into a second query reading that sink.")
    # unique per attempt even across driver restarts (invariant 2)
    attempt = f"t{tc.taskAttemptId()}-a{tc.attemptNumber()}-{uuid.uuid4().hex[:8]}"
    partition = tc.partitionId() if partition is None else partition
    if not 0 <= partition < config.parallelism:
        # After a union in the same stage Spark numbers partitions across both sides, and
        # no API tells a task its index within our own RDD.
        raise StateBackendError(
            f"operator {config.operator_id!r}: task partition {partition} is outside "
            f"0..{config.parallelism - 1}: the operator's output was combined (e.g. by union) "
            f"with other data in the same stage. Call .repartition() on the operator's output "
            f"before the union so it runs in a stage of its own.")
    return checkpoint_id, partition, attempt


def run_identity(config: OperatorConfig) -> tuple[str | None, str]:
    """(query id, run id) of the running task's writer (:mod:`statebackend.checkpoint.fencing`):
    Spark's for a streaming query, (None, the id the driver gave this run) for a batch one."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    query_id = tc.getLocalProperty(QUERY_ID_PROPERTY) if tc is not None else None
    run_id = tc.getLocalProperty(RUN_ID_PROPERTY) if tc is not None else None
    if query_id is not None and run_id:
        return query_id, run_id
    # a config made without a run (tests and benchmarks running tasks in process): one
    # shared identity, so such runs take one epoch between them, as a batch run does
    return None, config.run_id or "in-process"



def check_rows_belong(kg: np.ndarray, kg_range, partition: int) -> None:
    """Every row must lie in the partition's key-group range: placement is exact, so a row
    outside it means the partition index is wrong, and state would go to the wrong place."""
    if len(kg) and (int(kg.min()) < kg_range.start or int(kg.max()) > kg_range.end):
        raise StateBackendError(
            f"rows of key groups {int(kg.min())}..{int(kg.max())} reached partition {partition}, "
            f"which owns {kg_range.start}..{kg_range.end}: the input was not placed by this "
            f"operator (was the DataFrame repartitioned or unioned in between?)")


def local_root(options: StateBackendOptions) -> str:
    """This executor's local directory (``{executor_id}`` in ``local_dir`` resolved)."""
    root = options.resolved_local_dir(executor_id=current_executor_id())
    os.makedirs(root, exist_ok=True)
    return root


def now_ms() -> int:
    return int(time.time() * 1000)


class TaskInput:
    """The rows Spark sends one task (Arrow batches, already pandas), our tick rows dropped,
    in frames of at least a given size (:meth:`chunks`).

    Per-key operators take the whole input as one frame before the state is opened: they
    group by key over all of it. ``map_in_pandas`` takes frames of ``frame_rows``: the
    first before the state is opened, the rest while the user's function runs, so a
    partition's input larger than that is never in memory whole.

    ``rows``, ``read_s`` (time spent waiting for Spark) and ``max_event_time_ms`` (of
    ``event_time_col``, over the rows read so far) are kept as the rows go by.
    """

    def __init__(self, batches: Iterator[pd.DataFrame], event_time_col: str | None = None):
        self._it = iter(batches)
        self._done = False
        self.event_time_col = event_time_col
        self.rows = 0
        self.read_s = 0.0
        self.max_event_time_ms: int | None = None
        self.processing_time_ms: int | None = None

    def _next_raw(self) -> pd.DataFrame | None:
        while not self._done:
            t = time.perf_counter()
            try:
                frame = next(self._it)
            except StopIteration:
                self._done = True
                frame = None
            finally:
                self.read_s += time.perf_counter() - t
            if frame is not None and len(frame):
                if self.processing_time_ms is None and PTIME_COL in frame.columns:
                    # Spark's batch timestamp: fixed per micro-batch and recorded in the
                    # offset log, so a retried batch sees the same value; tick rows carry
                    # it too, so it is read before they are dropped
                    self.processing_time_ms = int(frame[PTIME_COL].iloc[0])
                return frame
        return None

    def batch_processing_time(self) -> int:
        """Spark's batch timestamp from the rows read so far; the wall clock for a
        partition without rows."""
        return self.processing_time_ms if self.processing_time_ms is not None else now_ms()

    def _user_rows(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        if TICK_COL in frame.columns:
            frame = frame[~frame[TICK_COL].fillna(False).astype(bool)].drop(columns=[TICK_COL])
        if not len(frame):
            return None
        self.rows += len(frame)
        col = self.event_time_col
        if col is not None and col in frame.columns:
            ts = pd.to_datetime(frame[col]).max()
            if not pd.isna(ts):
                ms = int(ts.value // 1_000_000)
                cur = self.max_event_time_ms
                self.max_event_time_ms = ms if cur is None else max(cur, ms)
        return frame

    def chunks(self, min_rows: int) -> Iterator[pd.DataFrame]:
        """The rows in frames of at least ``min_rows`` (Spark sends ``maxRecordsPerBatch``
        at a time; the last frame may be smaller), each as soon as it is complete."""
        parts: list[pd.DataFrame] = []
        n = 0
        while True:
            raw = self._next_raw()
            if raw is not None:
                frame = self._user_rows(raw)
                if frame is not None:
                    parts.append(frame)
                    n += len(frame)
                if n < min_rows:
                    continue
            if parts:
                yield parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
                parts, n = [], 0
            if raw is None:
                return


def event_time_ms(column: pd.Series) -> np.ndarray:
    """Event times in epoch ms as float64 (NaN where null), read the way
    :class:`TaskInput` reads them for the watermark, so the two always agree."""
    ts = pd.to_datetime(column)
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    ns = ts.astype("datetime64[ns]").to_numpy().view(np.int64).astype(np.float64)
    ns[ts.isna().to_numpy()] = np.nan
    return np.floor(ns / 1_000_000)


def event_time_us(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Event times in epoch microseconds (int64, Spark's unit for a timestamp) and a mask
    of the nulls, read as :func:`event_time_ms` reads them (naive values as UTC). Integer
    arithmetic: a float64 of nanoseconds since the epoch is off by up to 256 ns."""
    ts = pd.to_datetime(column)
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    nulls = ts.isna().to_numpy()
    ns = ts.astype("datetime64[ns]").to_numpy().view(np.int64)
    return np.floor_divide(ns, 1_000), nulls


def kg_range_of(config: OperatorConfig, partition: int):
    return key_group_range(partition, config.parallelism, config.max_parallelism)
