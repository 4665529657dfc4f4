"""ticks=True keeps micro-batches flowing so processing-time timers fire without new input."""

from __future__ import annotations

import time

import pandas as pd
import processors as P
import pytest
from harness import write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark


def test_timers_fire_without_new_input_when_ticks_are_on(spark, tmp_path):
    in_dir = str(tmp_path / "in")
    write_batches(in_dir, [pd.DataFrame({"k": ["a", "b", "a"], "x": [1, 2, 3],
                                         "ts": pd.Timestamp("2026-01-01")})])
    be = RocksDBStateBackend(str(tmp_path / "state"),
                             StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))
    df = spark.readStream.schema("k STRING, x BIGINT, ts TIMESTAMP").parquet(in_dir)
    out = be.transform_with_state(df.groupBy("k"), P.ProcessingTimer(), "k STRING, v BIGINT",
                                  "Update", "ProcessingTime", ticks=True)
    rows: list[tuple] = []

    def collect(batch_df, batch_id):
        rows.extend((r["k"], r["v"]) for r in batch_df.collect())

    q = (out.writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="1 second").start())
    try:
        deadline = time.monotonic() + 90  # a bound on waiting, not a speed assertion
        while time.monotonic() < deadline and not any(v < 0 for _, v in rows):
            time.sleep(0.5)
    finally:
        q.stop()
    assert ("a", 2) in rows and ("b", 1) in rows  # the input was processed once
    fired = sorted((k, v) for k, v in rows if v < 0)
    assert fired == [("a", -2), ("b", -1)]  # each timer fired exactly once, with the state
