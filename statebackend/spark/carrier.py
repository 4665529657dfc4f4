"""The carrier plan: each partition's task runs where Spark keeps its state store.

Today's plan (:func:`statebackend.spark.plan.place` + ``mapInPandas``) leaves the choice
of executor to Spark's scheduler, which has no reason to send partition ``p`` where its
RocksDB instance, working directory and local copy are: on a cluster most tasks restore
from durable storage. Spark's own stateful operators run inside ``StateStoreRDD``, whose
preferred location for partition ``s`` is the executor that last loaded the state store
of ``s``; the scheduler honours it (``spark.locality.wait``).

So the streaming swap-ins run their work inside a Spark stateful operator used as a
carrier: ``applyInPandasWithState`` grouped by an ``int`` column ``__sb_pid`` whose value
for our partition ``p`` is chosen so that Spark's hash partitioning of an ``int`` sends it
to Spark partition ``p mod N`` (``N``: the query's shuffle partitions). Each of our
partitions is one group: the function is called once per partition per micro-batch with
the partition's whole input as an iterator of pandas frames, and runs exactly the task
of today's plan (:func:`statebackend.task.runner.run_partition`) on it, batch at a time.
The carrier's own state store stays empty for operators without timers, and holds one
tiny row per partition for operators with timers (:func:`carrier_timeout`).

Correctness never depends on placement: the group value names our partition, so a value
that Spark places elsewhere (a restart whose checkpointed shuffle partitions differ from
the session's) costs locality only. Several of our partitions in one Spark partition are
several groups in one task.

Spark calls the function only for groups with rows: a partition without rows in a
micro-batch runs nothing and publishes nothing; its checkpoint is carried over
(:mod:`statebackend.restore.carry`) by the driver when Spark commits the micro-batch,
or by the partition's next task.

Progress metrics (:mod:`.progress`) travel as in the shuffle plan: the carrier's output
schema has the hidden metrics column, and each group (one of our partitions) adds its
metrics row. A partition without rows in a micro-batch ran no task, so it adds none (the
micro-batch's metrics are those of the partitions that ran).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from ..keys.groups import spark_hashes
from ..task.columns import KG_COL, PID_COL, key_groups_in_task
from ..task.context import PTIME_COL, OperatorConfig
from . import plan

# Output modes the carrier (applyInPandasWithState) supports; "Complete" keeps today's plan.
CARRIER_OUTPUT_MODES = ("append", "update")

log = logging.getLogger("statebackend")


def carrier_values(parallelism: int, spark_partitions: int) -> list[int]:
    """``v_p`` for each of our partitions ``p``: distinct non-negative ints with
    ``pmod(hash(v_p as int), spark_partitions) == p mod spark_partitions``.

    >>> vs = carrier_values(4, 2)
    >>> [int(h) % 2 for h in spark_hashes([np.array(vs, np.int32)], ["int"])]
    [0, 1, 0, 1]
    """
    want = [p % spark_partitions for p in range(parallelism)]
    need: dict[int, int] = {}
    for s in want:
        need[s] = need.get(s, 0) + 1
    found: dict[int, list[int]] = {s: [] for s in need}
    base, chunk = 0, max(1024, 8 * parallelism)
    while any(len(found[s]) < n for s, n in need.items()):
        cand = np.arange(base, base + chunk, dtype=np.int32)
        bucket = np.mod(spark_hashes([cand], ["int"]).astype(np.int64), spark_partitions)
        for v, s in zip(cand.tolist(), bucket.tolist()):
            if s in need and len(found[s]) < need[s]:
                found[s].append(v)
        base += chunk
    taken = {s: 0 for s in need}
    out = []
    for s in want:
        out.append(found[s][taken[s]])
        taken[s] += 1
    return out


def spark_partitions_of(df: DataFrame) -> int:
    """The shuffle partitions a new streaming query fixes in its checkpoint."""
    return int(str(df.sparkSession.conf.get("spark.sql.shuffle.partitions")))


def carrier_timeout(config: OperatorConfig) -> str:
    """The carrier's GroupState timeout: what keeps a partition with timers running.

    Operators without timers: ``NoTimeout`` (a partition runs when it has rows; skipping
    it otherwise changes nothing). Processing-time timers (``timeMode="ProcessingTime"``,
    a ``ProcessingTimeTimeout``): ``ProcessingTimeTimeout``, each partition's timeout set
    1 ms ahead, so every partition that has run is called in every micro-batch, rows or
    not, as the shuffle plan runs every partition; Spark then also runs no-data
    micro-batches, as its own operators in that mode do. Event-time timers with a
    watermark: ``EventTimeTimeout`` set just past the watermark, so a partition is called
    whenever the watermark advances, and Spark runs a no-data micro-batch when it does,
    as its own operators in that mode do.
    """
    mode = config.timers
    if mode == "ProcessingTime":
        return "ProcessingTimeTimeout"
    if mode == "EventTime" and config.watermark is not None:
        return "EventTimeTimeout"
    return "NoTimeout"


def carrier_plan(df: DataFrame, config: OperatorConfig, process: Callable[..., list],
                 schema: Any, output_mode: str) -> DataFrame:
    """``df`` (ticks already added) run through the carrier: each group runs
    :func:`~statebackend.task.runner.run_partition` for its partition with ``process``.

    What the carrier adds to the shuffle plan is Spark's (BENCHMARKS.md, "What the carrier
    costs on one machine"): per Spark shuffle partition and micro-batch a state-store task,
    with rows or not, so ``spark.sql.shuffle.partitions`` far above the parallelism runs
    mostly empty tasks (:func:`_idle_stores_note`). The micro-batch timestamp is taken
    from the group's ``GroupState`` in the worker instead of travelling as a column
    through the shuffle, the sort and the Arrow framing.
    """
    timeout = carrier_timeout(config)
    n_spark = spark_partitions_of(df)
    _idle_stores_note(n_spark, config.parallelism)
    values = carrier_values(config.parallelism, n_spark)
    partition_of = {v: p for p, v in enumerate(values)}
    kg, route = plan.route_column(config.parallelism, config.max_parallelism,
                                  list(config.key.columns), values)
    if not key_groups_in_task(config.key.types):
        df = df.withColumn(KG_COL, kg)
    df = df.withColumn(PID_COL, route.cast("int"))

    def carry(key: tuple, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        from ..task.runner import run_partition

        # the worker reads the state once the output is exhausted: set it first, then
        # stream the output (run_partition yields only after its checkpoint is published)
        if timeout == "ProcessingTimeTimeout":
            state.update((1,))
            state.setTimeoutDuration(1)
        elif timeout == "EventTimeTimeout":
            state.update((1,))
            state.setTimeoutTimestamp(max(int(state.getCurrentWatermarkMs()), 0) + 1)
        # the micro-batch timestamp: GroupState's processing time is Spark's batch
        # timestamp, the value current_timestamp() has in the shuffle plan (fixed per
        # micro-batch and logged, so a retry sees the same); set on the frames the worker
        # built rather than on every row Spark shuffles, sorts and frames
        ms = np.int64(state.getCurrentProcessingTimeMs())

        def stamped() -> Iterator[pd.DataFrame]:
            for frame in frames:
                frame[PTIME_COL] = ms
                yield frame

        yield from run_partition(config, stamped(), process, partition=partition_of[int(key[0])])

    mode = "Append" if str(output_mode).lower() == "append" else "Update"
    return df.groupBy(PID_COL).applyInPandasWithState(
        carry, schema, "alive INT", mode, timeout)


def _idle_stores_note(spark_partitions: int, parallelism: int) -> None:
    """Log what a shuffle-partition count above the parallelism costs: Spark runs a
    state-store task (load, commit, a checkpoint file) for every one of its partitions
    every micro-batch, and only ``parallelism`` of them can have rows."""
    if spark_partitions > parallelism:
        log.warning(
            "carrier plan: spark.sql.shuffle.partitions is %d and the parallelism %d, so "
            "%d of Spark's %d state-store tasks per micro-batch run without rows (each a "
            "state-store load and commit, and a file in the checkpoint location); a new "
            "query with spark.sql.shuffle.partitions = %d avoids them (BENCHMARKS.md, "
            "\"What the carrier costs on one machine\")",
            spark_partitions, parallelism, spark_partitions - min(parallelism, spark_partitions),
            spark_partitions, parallelism)

