"""The backend's metrics in Spark's progress: ``query.lastProgress`` of a running query and
a StreamingQueryListener's progress events carry them under the operator's observation
name, summed and maxed over the partitions as statebackend.metrics.combine_progress says,
and equal to what ``statebackend metrics`` recorded for the same checkpoint."""

from __future__ import annotations

import threading
import time

import pandas as pd
import processors as P
import pytest
from harness import run_stream, running_counts, write_batches
from pyspark.sql.streaming import StreamingQueryListener

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.metrics import BLOCK_CACHE_HIT_RATE, PROGRESS_METRICS
from statebackend.spark.progress import METRICS_COL, progress_metrics

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"


def batches() -> list[pd.DataFrame]:
    """Batch b brings keys k<b*10>..k<b*10+9> (new) and, from batch 1 on, k0..k4 again."""
    out = []
    for b in range(3):
        keys = [f"k{b * 10 + i}" for i in range(10)] + ([f"k{i}" for i in range(5)] if b else [])
        out.append(pd.DataFrame({"k": keys, "x": range(len(keys)),
                                 "ts": pd.Timestamp("2024-01-01")}))
    return out


class Collect(StreamingQueryListener):
    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[int, dict] = {}
        self.cond = threading.Condition()

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        m = progress_metrics(event.progress, self.name)
        with self.cond:
            if m is not None:
                self.seen[int(event.progress.batchId)] = m
            self.cond.notify_all()

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        pass

    def wait_for(self, n: int, timeout: float = 120.0) -> dict[int, dict]:
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.seen) < n and time.monotonic() < end:
                self.cond.wait(1.0)
            return dict(self.seen)


def check_plausible(m: dict, *, batch: int, distinct: int, input_rows: int, partitions: int):
    assert set(m) == {"rows", *PROGRESS_METRICS, BLOCK_CACHE_HIT_RATE}, sorted(m)
    assert m["partitions"] == partitions
    assert m["input_rows"] == input_rows
    assert m["keys"] == m["rows"]  # RunningCount outputs one row per key it saw
    assert m["state_rows"] >= distinct  # RocksDB's estimate: overwrites count until compacted
    assert m["state_bytes"] > 0 and m["bytes_uploaded"] > 0 and m["files_uploaded"] > 0
    assert m["rocksdb_live_sst_bytes"] >= 0 and m["rocksdb_block_cache_bytes"] >= 0
    assert m["sync_ms_max"] <= m["sync_ms"] and m["async_ms_max"] <= m["async_ms"]
    assert m["async_ms"] > 0
    restored = sum(m[f"restore_{s}"] for s in ("resident", "working_dir", "local_copy",
                                               "durable", "empty", "other"))
    assert restored == partitions
    if batch == 0:
        assert m["restore_empty"] == partitions
    else:
        assert m["restore_empty"] == 0
        assert m["rocksdb_block_cache_hits"] + m["rocksdb_block_cache_misses"] > 0
        assert 0.0 <= m[BLOCK_CACHE_HIT_RATE] <= 1.0
    assert m["late_rows_dropped"] == 0


def test_last_progress_and_listener_show_the_backend_metrics(spark, tmp_path):
    data = batches()
    be = RocksDBStateBackend(str(tmp_path / "state"),
                             StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))
    name = be.observation_name("rc")
    listener = Collect(name)
    spark.streams.addListener(listener)
    inp = str(tmp_path / "in")
    write_batches(inp, data[:1])
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(inp)
    out = be.transform_with_state(df.groupBy("k"), P.RunningCount(), "k STRING, v BIGINT",
                                  "Update", "None", operator_id="rc")
    assert out.columns == ["k", "v"]  # the hidden column never reaches the user
    got: dict[int, pd.DataFrame] = {}

    def collect(bdf, bid):
        got[bid] = bdf.toPandas()

    q = (out.writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="0 seconds")
         .start())
    try:
        seen_keys: set[str] = set()
        for b, pdf in enumerate(data):
            if b:
                write_batches(inp, [pdf], start=b)
            q.processAllAvailable()
            seen_keys |= set(pdf["k"])
            assert q.isActive
            m = progress_metrics(q.lastProgress, name)
            assert m is not None, q.lastProgress
            assert q.lastProgress["batchId"] == b
            check_plausible(m, batch=b, distinct=len(seen_keys), input_rows=len(pdf),
                            partitions=2)
            assert m["rows"] == pdf["k"].nunique()
            assert m["keys"] == pdf["k"].nunique()
            if b == 0:  # every key written once so far: RocksDB's estimate is exact
                assert m["state_rows"] == len(seen_keys)
    finally:
        q.stop()
    seen = listener.wait_for(len(data))
    spark.streams.removeListener(listener)
    assert sorted(seen) == [0, 1, 2]
    assert all(METRICS_COL not in pdf.columns for pdf in got.values())
    ref, _ = running_counts(data)
    for b in ref:  # the user's rows are exactly those of the reference: no metrics row
        pd.testing.assert_frame_equal(
            got[b].sort_values(["k"]).reset_index(drop=True).astype({"v": "int64"}), ref[b],
            check_dtype=False)
    # the same numbers as `statebackend metrics` recorded for each checkpoint
    be.complete("rc")
    for b, m in seen.items():
        recorded = be.checkpoint_metrics("rc", b).progress
        assert {k: m[k] for k in recorded} == pytest.approx(dict(recorded)), b
        check_plausible(m, batch=b, distinct=0, input_rows=len(data[b]), partitions=2)


def test_map_in_pandas_reports_and_keeps_its_columns(spark, tmp_path):
    data = batches()
    write_batches(str(tmp_path / "in"), data)
    be = RocksDBStateBackend(str(tmp_path / "state"),
                             StateBackendOptions(parallelism=3, local_dir=str(tmp_path / "local")))
    ours = run_stream(spark, str(tmp_path / "in"), SCHEMA,
                      lambda df: be.map_in_pandas(df, "k", P.vector_count, "k STRING, v BIGINT",
                                                  state_schema="c BIGINT", operator_id="vec",
                                                  value_blocks=4),
                      str(tmp_path / "ck"))
    assert sorted(ours) == [0, 1, 2]
    assert all(list(pdf.columns) == ["k", "v"] for pdf in ours.values())
    be.complete("vec")
    for b in range(3):
        p = be.checkpoint_metrics("vec", b).progress
        assert p["partitions"] == 3 and p["input_rows"] == len(data[b])
        assert p["bytes_uploaded"] > 0
