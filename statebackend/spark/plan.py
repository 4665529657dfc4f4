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

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ..errors import StateBackendError
from ..keys.placement import placement_values

KG_COL = "__sb_kg"
TICK_COL = "__sb_tick"
PID_COL = "__sb_pid"  # the carrier plan's grouping column (statebackend.spark.carrier)
INTERNAL_COLUMNS = (KG_COL, TICK_COL, PID_COL)

# Key types whose pandas values in a task are exactly what Spark's hash() reads: tasks
# compute their key groups with the native kernel instead of receiving a column. Not
# here: timestamps (pandas holds them in the session time zone), float/double (NaN and
# null are one value in pandas), integers (with nulls a column arrives as float64 or as
# objects, depending on the PySpark version), collated strings (their hash depends on
# the collation).
_TASK_HASHED_TYPES = frozenset({"string", "binary"})


@dataclass(frozen=True)
class KeySpec:
    """The grouping columns of a stateful operator and their Spark type names."""

    columns: tuple[str, ...]
    types: tuple[str, ...]


def grouping_columns(grouped: GroupedData | tuple[DataFrame, list[str]]) -> tuple[DataFrame, list[str]]:
    """The DataFrame and grouping column names behind ``df.groupBy(...)``.

    Accepts a :class:`pyspark.sql.GroupedData` (plain column names or column references)
    or an explicit ``(df, [column, ...])`` pair.
    """
    if isinstance(grouped, tuple):
        df, cols = grouped
        return df, [c if isinstance(c, str) else str(c) for c in cols]
    if not isinstance(grouped, GroupedData):
        raise TypeError(f"expected df.groupBy(...) (GroupedData) or (df, [columns]), "
                        f"got {type(grouped).__name__}")
    df = grouped._df
    names: list[str] = []
    exprs = grouped._jgd.groupingExprs()
    for i in range(exprs.size()):
        expr = exprs.apply(i)
        cls = expr.getClass().getSimpleName()
        if cls in ("UnresolvedAttribute", "AttributeReference"):
            names.append(expr.name())
        else:
            raise StateBackendError(
                f"grouping by the expression {expr.sql()} is not supported: add it as a column "
                f"first, e.g. df.withColumn('k', <expr>).groupBy('k')")
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise StateBackendError(f"grouping columns {missing} are not columns of the DataFrame "
                                f"{df.columns}")
    return df, names


def spark_type_name(dt: DataType) -> str:
    name = dt.simpleString()
    return {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}.get(name, name)


def key_spec(df: DataFrame, columns: list[str]) -> KeySpec:
    fields = {f.name: f for f in df.schema.fields}
    return KeySpec(tuple(columns), tuple(spark_type_name(fields[c].dataType) for c in columns))


def key_groups_in_task(key_types: tuple[str, ...] | list[str]) -> bool:
    """Whether tasks compute key groups from the key columns themselves (``True``) or
    receive them in the ``__sb_kg`` column computed by Spark."""
    return all(t in _TASK_HASHED_TYPES for t in key_types)


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


def watermark_of(df: DataFrame) -> tuple[str, int] | None:
    """(event-time column, delay in ms) of the ``withWatermark`` upstream of ``df``, if any."""
    plan = df._jdf.queryExecution().logical()
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.getClass().getSimpleName() == "EventTimeWatermark":
            from py4j.java_gateway import get_field

            delay = node.delay()
            # Spark counts a month as 31 days when it turns a watermark delay into ms
            days = get_field(delay, "months") * 31 + get_field(delay, "days")
            delay_ms = days * 86_400_000 + get_field(delay, "microseconds") // 1000
            return node.eventTime().name(), int(delay_ms)
        children = node.children()
        for i in range(children.size()):
            stack.append(children.apply(i))
    return None
