"""Driver-side planning: find the grouping columns, compute key groups in Spark SQL and
route every key-group range to exactly the Spark partition that owns its state.

The rows of partition ``i`` after ``repartition(P, route)`` are exactly the rows whose key
group lies in ``key_group_range(i, P, maxP)``: the route expression gives, for partition
index ``i``, an integer ``v_i`` with ``pmod(hash(v_i), P) == i`` (Spark's hash partitioner
is Murmur3 with seed 42, the same function as SQL ``hash()``). The route is a partitioning
expression, not a column: the shuffle carries only the user's columns, plus the key group
for key types whose pandas form does not keep what Spark hashes (see
:func:`key_groups_in_task`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ..keys.placement import placement_values
from ..task.columns import KG_COL, TICK_COL, KeySpec, key_groups_in_task


def spark_type_name(dt: DataType) -> str:
    name = dt.simpleString()
    return {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}.get(name, name)


def key_spec(df: DataFrame, columns: list[str]) -> KeySpec:
    fields = {f.name: f for f in df.schema.fields}
    return KeySpec(tuple(columns), tuple(spark_type_name(fields[c].dataType) for c in columns))


def route_column(parallelism: int, max_parallelism: int, key_columns: list[str],
                 values: list[int] | None = None) -> tuple[Column, Column]:
    """(key group, route) expressions: the route of a row is ``values[p]`` for its
    partition ``p``; by default the values ``repartition(parallelism, route)`` sends to
    partition p (:func:`placement_values`; the carrier plan passes its grouping values)."""
    kg = F.pmod(F.hash(*[F.col(f"`{c}`") for c in key_columns]), F.lit(max_parallelism))
    # partition index of a key group: floor(kg * P / maxP) (DESIGN.md section 2)
    pid = F.floor(kg * F.lit(parallelism) / F.lit(max_parallelism)).cast("int")
    if values is None:
        values = placement_values(parallelism)
    return kg.cast("int"), F.element_at(F.array(*[F.lit(int(v)) for v in values]), pid + 1)


def place(df: DataFrame, key: KeySpec, parallelism: int, max_parallelism: int) -> DataFrame:
    """``df`` repartitioned so partition i holds key-group range i (with the key-group
    column when tasks cannot compute it, see :func:`key_groups_in_task`).

    Routing by an expression rather than a column keeps the shuffle and the Arrow batches
    to the task at the user's columns: at 200,000 rows per batch the map stage took
    131-156 ms with two extra int columns and 80-97 ms without (one task, this machine).
    """
    kg, route = route_column(parallelism, max_parallelism, list(key.columns))
    if not key_groups_in_task(key.types):
        df = df.withColumn(KG_COL, kg)
    return df.repartition(parallelism, route)


def with_ticks(df: DataFrame) -> DataFrame:
    """``df`` plus one marker row per second from Spark's rate source.

    A ``mapInPandas`` operator gets no "no-data" micro-batches, so without new input its
    timers and timeouts wait. The tick rows make every trigger run a micro-batch (and so a
    task on every partition); tasks drop them before any user code sees the input.
    """
    ticks = (df.sparkSession.readStream.format("rate").option("rowsPerSecond", 1).load()
             .select(F.lit(True).alias(TICK_COL)))
    return (df.withColumn(TICK_COL, F.lit(False))
              .unionByName(ticks, allowMissingColumns=True))


# the column metadata by which Spark's stateful operators find a DataFrame's event time
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def with_event_time(df: DataFrame, column: str, delay_ms: int) -> DataFrame:
    """``df`` with ``column`` marked as its event time, with the query's watermark delay.

    What Spark's ``transformWithState`` does for ``eventTimeColumnName`` (its
    ``UpdateEventTimeWatermarkColumn``): the column carries the delay in its metadata, so
    the stateful operators after ours (an aggregation, a deduplication, a join, another
    ``transformWithState``) apply the query's watermark to it. No second
    ``withWatermark``: that would add an event-time source of its own to the query's
    global watermark (the minimum of all sources), which Spark's plan does not have. The
    watermark's value stays the one Spark computes from the input's ``withWatermark``.
    """
    return df.select(*[F.col(f"`{c}`").alias(c, metadata={WATERMARK_DELAY_KEY: int(delay_ms)})
                       if c == column else F.col(f"`{c}`") for c in df.columns])
