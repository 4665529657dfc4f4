"""A task's metrics as one more output row: the executor's half of the backend's metrics
in Spark's progress (the driver's half, the observation, is
:mod:`statebackend.spark.progress`).

Each task, after publishing its checkpoint, yields one more row whose user columns are
null (a placeholder where the schema says NOT NULL; ``OperatorConfig.progress_columns``)
and whose :data:`METRICS_COL` holds what the task measured (:func:`task_metrics_frame`).
The metrics row goes out in the same frame as the user's rows when it can
(:func:`frames_with_metrics`): one frame built straight from its column arrays (~10 us),
where a pandas constructor costs ~70-80 us per frame and a task would build two.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["METRICS_COL", "frames_with_metrics", "metrics_row_values", "placeholder",
           "task_metrics_frame", "with_metrics_column"]

#: The hidden column carrying each task's metrics from the task to the observation.
METRICS_COL = "__sb_metrics"


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


def with_metrics_column(frame: pd.DataFrame) -> pd.DataFrame:
    """The user's output frame with :data:`METRICS_COL` all null (a new frame over the same
    column arrays: the user's frame itself is not changed)."""
    # a frame built from the column arrays: ~100 us for any row count, where a shallow
    # copy and a column assignment cost ~170 us (pandas consolidates its blocks)
    columns = {name: frame[name] for name in frame.columns} if frame.columns.is_unique \
        else None
    if columns is None or METRICS_COL in columns:
        out = frame.copy(deep=False)
        out[METRICS_COL] = None
        return out
    columns[METRICS_COL] = np.full(len(frame), None, dtype=object)
    return pd.DataFrame(columns, index=frame.index, copy=False)


def frames_with_metrics(frame: pd.DataFrame | None, columns: Mapping[str, Any],
                        values: Mapping[str, int | float]) -> list[pd.DataFrame]:
    """What a streaming task yields: the user's output ``frame`` (None: no rows) with
    :data:`METRICS_COL` null, and its metrics row (:func:`task_metrics_frame`).

    Usually one frame: the user's columns with one more row, a copy of their first row
    (a value of each column's type; the row is filtered out before the user sees
    anything), and the metrics in that row's :data:`METRICS_COL`. Built over the column
    arrays without pandas' constructor, so the fixed cost per task stays small beside the
    vectorised path's per-key work. Frames with duplicate column names, or the column
    already present, go as two frames as before.
    """
    metrics = json.dumps(dict(values), separators=(",", ":"))
    if frame is None or not len(frame):
        return [task_metrics_frame(columns, values, metrics)]
    names = list(frame.columns)
    if frame.columns.is_unique and METRICS_COL not in names and \
            all(isinstance(n, str) for n in names):
        n = len(frame)
        mgr = frame._mgr
        arrays = [_plus_first(mgr.iget_values(i)) for i in range(len(names))]
        hidden = np.empty(n + 1, dtype=object)  # None everywhere
        hidden[n] = metrics
        return [_frame_of([*names, METRICS_COL], [*arrays, hidden], n + 1)]
    return [with_metrics_column(frame), task_metrics_frame(columns, values, metrics)]


def _plus_first(a: Any) -> Any:
    """Column ``a`` with its first value once more at the end (same dtype)."""
    if isinstance(a, np.ndarray):
        return np.concatenate([a, a[:1]])
    return type(a)._concat_same_type([a, a[:1]])  # a pandas extension array


def _frame_of(names: list[str], arrays: list[Any], n: int) -> pd.DataFrame:
    """``pd.DataFrame(dict(zip(names, arrays)), copy=False)`` with a RangeIndex, built
    from one block per column (~10 us against ~70 us); the constructor when pandas'
    internals differ from what this expects."""
    try:
        from pandas._libs.internals import BlockPlacement
        from pandas.core.internals import BlockManager
        from pandas.core.internals.blocks import ensure_block_shape, new_block

        blocks = tuple(new_block(ensure_block_shape(a, 2), BlockPlacement(slice(i, i + 1)),
                                 ndim=2)
                       for i, a in enumerate(arrays))
        mgr = BlockManager(blocks, [_columns_index(names), pd.RangeIndex(n)],
                           verify_integrity=False)
        return pd.DataFrame._from_mgr(mgr, axes=mgr.axes)
    except (ImportError, AttributeError, TypeError, ValueError):
        return pd.DataFrame(dict(zip(names, arrays)), copy=False)


_INDEXES: dict[tuple[str, ...], pd.Index] = {}


def _columns_index(names: list[str]) -> pd.Index:
    """The (immutable, so shared) column index of ``names``: building one costs more than
    the rest of the frame (~60% of it), and a worker's tasks use a few at most."""
    key = tuple(names)
    index = _INDEXES.get(key)
    if index is None:
        if len(_INDEXES) >= 64:
            _INDEXES.clear()
        index = _INDEXES[key] = pd.Index(names)
    return index


def task_metrics_frame(columns: Mapping[str, Any], values: Mapping[str, int | float],
                       text: str | None = None) -> pd.DataFrame:
    """The one row a task adds to its output: the user columns as ``columns`` gives them
    (:func:`metrics_row_values`), its metrics as JSON (``text``, when already made)."""
    if text is None:
        text = json.dumps(dict(values), separators=(",", ":"))
    names = [*columns, METRICS_COL]
    return _frame_of(names, [*(_one(v) for v in columns.values()), _one(text)], 1)


def _one(value: Any) -> np.ndarray:
    # a one-element object array: pandas takes it as it is (no inference per column)
    out = np.empty(1, dtype=object)
    out[0] = value
    return out
