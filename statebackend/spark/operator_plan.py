"""The Spark plan of one stateful operator: which plan runs its tasks (the shuffle plan,
:func:`.plan.place` + ``mapInPandas``, or the carrier plan, :mod:`.carrier`), and how its
metrics reach the streaming query's progress (:mod:`.progress`).

Both plans run :func:`~statebackend.task.runner.run_partition` for each partition, and
both carry the metrics the same way: the operator's output has one more hidden column,
each task (each of our partitions, under the carrier) adds one metrics row, the plan
observes the output under the operator's observation name and then keeps only the user's
rows and columns.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from ..task.context import PTIME_COL, OperatorConfig
from ..task.runner import make_task
from . import plan
from .carrier import carrier_plan
from .listener import observation_name
from .progress import METRICS_COL, observed_columns

__all__ = ["operator_plan"]


def operator_plan(df: DataFrame, config: OperatorConfig, process: Callable[..., list],
                  schema: StructType, output_mode: str | None,
                  checkpoint_location: str) -> DataFrame:
    """The operator's output DataFrame, with exactly the columns of ``schema``.

    ``output_mode``: the streaming query's (the carrier must declare it to Spark);
    ``checkpoint_location``: the backend's (it names the observation).
    """
    streaming = df.isStreaming
    if config.ticks and streaming:
        df = plan.with_ticks(df)
    # the builder decided the plan and the metrics row (statebackend.spark.operators)
    progress = config.progress_columns is not None
    if progress:
        out_schema = StructType([*schema.fields, StructField(METRICS_COL, StringType(), True)])
    else:
        out_schema = schema
    if config.carrier:
        out = carrier_plan(df, config, process, out_schema, str(output_mode or "Append"))
    else:
        placed = plan.place(df, config.key, config.parallelism, config.max_parallelism)
        # current_timestamp() is the micro-batch timestamp in streaming (fixed per batch
        # and logged by Spark, so retries see the same processing time)
        placed = placed.withColumn(PTIME_COL, F.unix_millis(F.current_timestamp()))
        out = placed.mapInPandas(make_task(config, process), out_schema)
    if not streaming:
        return out
    # progress events carry the observation: the listener knows which query committed
    # which micro-batch of this operator, and users read the metrics under this name
    name = observation_name(checkpoint_location, config.operator_id)
    if not progress:
        return out.observe(name, F.count(F.lit(1)).alias("rows"))
    out = out.observe(name, *observed_columns())
    return out.filter(F.col(METRICS_COL).isNull()).drop(METRICS_COL)

