"""The backend's metrics in Spark's progress: each micro-batch's
:data:`~statebackend.metrics.PROGRESS_METRICS` as observed metrics of the query.

How they travel. A streaming operator's ``mapInPandas`` has one more output column,
:data:`METRICS_COL` (a JSON string): null on every row of the user's output, and each
task, after publishing its checkpoint, yields one more row whose user columns are null
(a placeholder where the schema says NOT NULL) and whose :data:`METRICS_COL` holds what the task measured (:func:`task_metrics_frame`).
The plan then observes, under the operator's observation name (the name the listener
matches progress events with), the output rows and every metric summed or maxed over
those rows (:func:`observed_columns`), keeps only the user's rows and drops the column,
so the user's DataFrame has exactly the columns it declared. Spark aggregates the
observation over the micro-batch's tasks and reports it in the batch's
``StreamingQueryProgress.observedMetrics``: ``query.lastProgress`` and every
``StreamingQueryListener.onQueryProgress`` see it.

The cost: one null string per output row through Arrow and the JVM, one small row per
task, and one aggregation over the output rows that Spark already ran for the row count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..metrics import BLOCK_CACHE_HIT_RATE, PROGRESS_METRICS

__all__ = ["METRICS_COL", "PROGRESS_KEY", "metrics_row_values", "observed_columns",
           "placeholder", "progress_metrics", "task_metrics_frame", "with_metrics_column"]

#: The hidden column carrying each task's metrics from the task to the observation.
METRICS_COL = "__sb_metrics"
#: The key of ``OperatorConfig.extra`` telling a task to report its metrics: the user
#: columns of its metrics row, name -> value (:func:`metrics_row_values`).
PROGRESS_KEY = "progress_columns"


def metrics_row_values(schema: Any) -> dict[str, Any]:
    """The user columns' values in a task's metrics row: null, except a value of the
    column's type where the schema declares it NOT NULL (Spark's row writer trusts the
    declaration; the row never reaches the user, who keeps the declared schema)."""
    return {f.name: None if f.nullable else placeholder(f.dataType) for f in schema.fields}


def placeholder(dt: Any) -> Any:
    """A value of Spark type ``dt`` (its zero; nested NOT NULL fields filled the same way)."""
    import datetime
    import decimal

    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return {f.name: None if f.nullable else placeholder(f.dataType) for f in dt.fields}
    if isinstance(dt, T.ArrayType):
        return []
    if isinstance(dt, T.MapType):
        return {}
    if isinstance(dt, T.StringType | T.VarcharType | T.CharType):
        return ""
    if isinstance(dt, T.BinaryType):
        return b""
    if isinstance(dt, T.BooleanType):
        return False
    if isinstance(dt, T.DecimalType):
        return decimal.Decimal(0)
    if isinstance(dt, T.TimestampType | T.TimestampNTZType):
        return datetime.datetime(1970, 1, 1)
    if isinstance(dt, T.DateType):
        return datetime.date(1970, 1, 1)
    if isinstance(dt, T.DayTimeIntervalType):
        return datetime.timedelta(0)
    if isinstance(dt, T.NumericType):
        return 0
    return None


def observed_columns() -> list[Any]:
    """The observation's aggregate columns: ``rows`` (the user's output rows), each of
    :data:`PROGRESS_METRICS` (``bigint``, or ``double`` for milliseconds) and
    :data:`BLOCK_CACHE_HIT_RATE`; what :func:`statebackend.metrics.combine_progress`
    computes from the same partitions."""
    from pyspark.sql import functions as F

    m = F.col(METRICS_COL)
    cols = [F.count(F.when(m.isNull(), F.lit(1))).alias("rows")]
    aggs: dict[str, Any] = {}
    for name, (how, unit) in PROGRESS_METRICS.items():
        v = F.get_json_object(m, f"$.{name}").cast("double" if unit == "ms" else "bigint")
        aggs[name] = F.sum(v) if how == "sum" else F.max(v)
        cols.append(aggs[name].alias(name))
    hits, misses = aggs["rocksdb_block_cache_hits"], aggs["rocksdb_block_cache_misses"]
    # when(): a batch without block reads has no rate (and ANSI mode forbids x / 0)
    cols.append(F.when(hits + misses > 0, hits / (hits + misses)).alias(BLOCK_CACHE_HIT_RATE))
    return cols


def with_metrics_column(frame: pd.DataFrame) -> pd.DataFrame:
    """The user's output frame with :data:`METRICS_COL` all null (a shallow copy: the
    user's frame itself is not changed)."""
    out = frame.copy(deep=False)
    out[METRICS_COL] = None
    return out


def task_metrics_frame(columns: Mapping[str, Any], values: Mapping[str, int | float]
                       ) -> pd.DataFrame:
    """The one row a task adds to its output: the user columns as ``columns`` gives them
    (:func:`metrics_row_values`), its metrics as JSON."""
    # one row as a list: a quarter of the time of a dict of columns
    row = [*columns.values(), json.dumps(dict(values), separators=(",", ":"))]
    return pd.DataFrame([row], columns=[*columns, METRICS_COL])


def progress_metrics(progress: Any, name: str) -> dict[str, Any] | None:
    """The metrics of one operator in a progress report: ``progress`` is
    ``query.lastProgress`` (a dict), a ``StreamingQueryProgress`` (a listener's
    ``event.progress``) or its JSON; ``name`` the operator's observation name
    (:meth:`statebackend.RocksDBStateBackend.observation_name`). None when the report
    holds no observation of that name (a micro-batch that ran no task of the operator)."""
    if isinstance(progress, str):
        progress = json.loads(progress)
    observed = (progress.get("observedMetrics") if isinstance(progress, Mapping)
                else getattr(progress, "observedMetrics", None)) or {}
    row = observed.get(name)
    if row is None:
        return None
    return dict(row) if isinstance(row, Mapping) else row.asDict()
