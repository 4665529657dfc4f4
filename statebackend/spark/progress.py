"""The backend's metrics in Spark's progress: each micro-batch's
:data:`~statebackend.metrics.PROGRESS_METRICS` as observed metrics of the query.

How they travel. A streaming operator's ``mapInPandas`` has one more output column,
:data:`METRICS_COL` (a JSON string): null on every row of the user's output, and each
task, after publishing its checkpoint, yields one more row whose user columns are null
(a placeholder where the schema says NOT NULL; ``OperatorConfig.progress_columns``) and whose :data:`METRICS_COL` holds what the task measured (:func:`task_metrics_frame`).
The plan then observes, under the operator's observation name (the name the listener
matches progress events with), the output rows and the metrics rows collected
(:func:`observed_columns`), keeps only the user's rows and drops the column, so the user's
DataFrame has exactly the columns it declared. Spark reports the observation in the
batch's ``StreamingQueryProgress.observedMetrics``: ``query.lastProgress`` and every
``StreamingQueryListener.onQueryProgress`` see it, and :func:`progress_metrics` sums and
maxes the tasks' rows into the named metrics.

The cost: one null string per output row through Arrow and the JVM, one small row per
task, and a second aggregate beside the row count Spark already ran. In the task, the
metrics row goes out in the same frame as the user's rows when it can
(:func:`frames_with_metrics`): one frame built straight from its column arrays (~10 us),
where a pandas constructor costs ~70-80 us per frame and a task would build two.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..task.metrics_rows import METRICS_COL, metrics_row_values

__all__ = ["METRICS_COL", "TASK_METRICS", "metrics_row_values", "observed_columns",
           "progress_metrics"]

#: The observation's field holding the tasks' metrics: one JSON object per task.
TASK_METRICS = "task_metrics"


def observed_columns() -> list[Any]:
    """The observation's columns: ``rows`` (the user's output rows) and
    :data:`TASK_METRICS`, the metrics rows' JSON collected (null user rows are skipped).

    Two aggregates, not one per metric: Spark pays for every aggregate of an observation
    in every micro-batch (33 of them cost 60-90 ms per batch here, BENCHMARKS.md), while
    collecting the few metrics rows costs next to nothing. :func:`progress_metrics` folds
    the collected rows into the named metrics (:func:`statebackend.metrics.combine_progress`).
    """
    from pyspark.sql import functions as F

    m = F.col(METRICS_COL)
    return [F.count(F.when(m.isNull(), F.lit(1))).alias("rows"),
            F.collect_list(m).alias(TASK_METRICS)]


def progress_metrics(progress: Any, name: str) -> dict[str, Any] | None:
    """The metrics of one operator in a progress report, by the names of
    :data:`~statebackend.metrics.PROGRESS_METRICS`, summed and maxed over the micro-batch's
    tasks, plus ``rows``.

    ``progress`` is ``query.lastProgress`` (a dict), a ``StreamingQueryProgress`` (a
    listener's ``event.progress``) or its JSON; ``name`` the operator's observation name
    (:meth:`statebackend.RocksDBStateBackend.observation_name`). None when the report holds
    no observation of that name (a micro-batch that ran no task of the operator).
    """
    from ..metrics import combine_progress

    if isinstance(progress, str):
        progress = json.loads(progress)
    observed = (progress.get("observedMetrics") if isinstance(progress, Mapping)
                else getattr(progress, "observedMetrics", None)) or {}
    row = observed.get(name)
    if row is None:
        return None
    row = _observed_row(row)
    tasks = [json.loads(x) for x in row.get(TASK_METRICS) or ()]
    return {"rows": row.get("rows"), **combine_progress(tasks)}


def _observed_row(row: Any) -> dict[str, Any]:
    """An observed metric's row as a dict of its fields. A classic session gives a ``Row``
    of the fields; Spark Connect's client reads the progress JSON into
    ``Row(values=[...], schema={...})`` (the row's values and the JSON of its struct
    type), and the JSON form (``lastProgress`` as a dict) may hold either shape."""
    row = dict(row) if isinstance(row, Mapping) else row.asDict()
    schema = row.get("schema")
    if set(row) == {"values", "schema"} and isinstance(schema, Mapping | str):
        if isinstance(schema, str):
            schema = json.loads(schema)
        names = [f["name"] for f in schema.get("fields", ())]
        return dict(zip(names, row["values"]))
    return row
