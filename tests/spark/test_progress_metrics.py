"""The backend's metrics in Spark's progress: ``query.lastProgress`` of a running query and
a StreamingQueryListener's progress events carry them under the operator's observation
name, summed and maxed over the partitions as statebackend.metrics.combine_progress says,
and equal to what ``statebackend metrics`` recorded for the same checkpoint."""

from __future__ import annotations

import datetime
import decimal
import json
import threading
import time

import pandas as pd
import processors as P
import pytest
from harness import run_stream, running_counts, write_batches
from pyspark.sql.streaming import StreamingQueryListener

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.metrics import BLOCK_CACHE_HIT_RATE, PROGRESS_METRICS, STATISTICS_METRICS
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


# counted only with rocksdb_statistics=True
STATISTICS = STATISTICS_METRICS


def check_plausible(m: dict, *, batch: int, distinct: int, input_rows: int, partitions: int,
                    statistics: bool = True):
    # the hit rate only once some block was read
    expected = {"rows", *PROGRESS_METRICS} - (set() if statistics else STATISTICS)
    assert expected <= set(m) <= expected | ({BLOCK_CACHE_HIT_RATE} if statistics else set()), \
        sorted(m)
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
        if statistics:
            assert m["rocksdb_block_cache_hits"] + m["rocksdb_block_cache_misses"] > 0
            assert 0.0 <= m[BLOCK_CACHE_HIT_RATE] <= 1.0
    assert m["late_rows_dropped"] == 0


def test_last_progress_and_listener_show_the_backend_metrics(spark, tmp_path):
    data = batches()
    be = RocksDBStateBackend(str(tmp_path / "state"),
                             StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local"),
                                                 rocksdb_statistics=True))
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
        # RocksDB's statistics are opt-in (rocksdb_statistics): none counted by default
        assert not STATISTICS & set(p) and BLOCK_CACHE_HIT_RATE not in p


def test_observation_folds_partitions_as_combine_progress(spark):
    # the Spark aggregation and the pure fold agree on the same partitions' rows, with the
    # user's rows (metrics null) in between, which only `rows` counts
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from statebackend.metrics import combine_progress
    from statebackend.spark.progress import TASK_METRICS, observed_columns
    from statebackend.task.metrics_rows import task_metrics_frame

    parts = [
        {"partitions": 1, "input_rows": 10, "sync_ms": 2.5, "sync_ms_max": 2.5,
         "rocksdb_l0_files_max": 3, "rocksdb_block_cache_hits": 6,
         "rocksdb_block_cache_misses": 2, "restore_empty": 1, "restore_durable": 0},
        {"partitions": 1, "input_rows": 7, "sync_ms": 4.0, "sync_ms_max": 4.0,
         "rocksdb_l0_files_max": 1, "rocksdb_block_cache_hits": 0,
         "rocksdb_block_cache_misses": 4, "restore_empty": 0, "restore_durable": 1},
    ]
    user = pd.DataFrame({"k": ["a", "b", "c"], "v": [1, 2, 3], METRICS_COL: [None] * 3})
    pdf = pd.concat([user, *(task_metrics_frame({"k": None, "v": None}, p) for p in parts)],
                    ignore_index=True)
    df = spark.createDataFrame(pdf, f"k STRING, v BIGINT, {METRICS_COL} STRING")
    obs = Observation("progress-unit")
    rest = (df.observe(obs, *observed_columns()).filter(F.col(METRICS_COL).isNull())
            .drop(METRICS_COL).collect())
    assert sorted(r["k"] for r in rest) == ["a", "b", "c"]
    raw = obs.get
    assert raw["rows"] == 3 and len(raw[TASK_METRICS]) == 2  # the user rows are not collected
    got = progress_metrics({"observedMetrics": {"progress-unit": raw}}, "progress-unit")
    assert got == {"rows": 3, **combine_progress(parts)}
    assert got["sync_ms"] == 6.5 and got["sync_ms_max"] == 4.0
    assert got["rocksdb_l0_files_max"] == 3 and got["rocksdb_block_cache_hit_rate"] == 0.5
    assert got["input_rows"] == 17 and got["restore_empty"] == 1
    # a metric no partition measured is absent
    assert "state_rows" not in got
    assert progress_metrics({"observedMetrics": {}}, "progress-unit") is None


def test_metrics_row_crosses_arrow_with_null_user_columns_of_any_type(spark):
    # the task's metrics row has every user column null: nested, timestamp and NOT NULL
    # columns included, and only the user's rows come out
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from statebackend.spark.progress import metrics_row_values, observed_columns
    from statebackend.task.metrics_rows import task_metrics_frame, with_metrics_column

    user = StructType.fromDDL("k STRING NOT NULL, n BIGINT NOT NULL, ts TIMESTAMP, "
                              "s STRUCT<a: INT, b: ARRAY<STRING>>, m MAP<STRING, DOUBLE>, "
                              "l ARRAY<BIGINT>, t2 TIMESTAMP NOT NULL, "
                              "st STRUCT<a: INT NOT NULL, b: STRING> NOT NULL, "
                              "ar ARRAY<INT> NOT NULL, d DECIMAL(10,2) NOT NULL, "
                              "dt DATE NOT NULL, bo BOOLEAN NOT NULL, bi BINARY NOT NULL")
    carrier = StructType([*user.fields, StructField(METRICS_COL, StringType(), True)])
    cols = user.fieldNames()
    row = metrics_row_values(user)
    assert {c: row[c] for c in ("k", "n", "ts", "s", "st", "ar")} == {
        "k": "", "n": 0, "ts": None, "s": None, "st": {"a": 0, "b": None}, "ar": []}

    def task(frames):
        for _ in frames:
            pass
        yield with_metrics_column(pd.DataFrame({
            "k": ["x"], "n": [1], "ts": [pd.Timestamp("2024-01-01")],
            "s": [{"a": 1, "b": ["p"]}], "m": [{"q": 1.5}], "l": [[1, 2]],
            "t2": [pd.Timestamp("2024-01-02")], "st": [{"a": 2, "b": "z"}], "ar": [[3]],
            "d": [decimal.Decimal("1.25")], "dt": [datetime.date(2024, 1, 3)], "bo": [True],
            "bi": [b"\x01"]}))
        yield task_metrics_frame(row, {"partitions": 1, "input_rows": 1})

    df = spark.range(2).repartition(2).mapInPandas(task, carrier)
    obs = Observation("arrow-null-unit")
    out = (df.observe(obs, *observed_columns()).filter(F.col(METRICS_COL).isNull())
           .drop(METRICS_COL))
    assert out.columns == cols
    rows = out.collect()
    assert [(r["k"], r["n"], r["s"]["b"], r["m"], r["l"], r["st"]["b"], r["d"], r["bi"])
            for r in rows] == [("x", 1, ["p"], {"q": 1.5}, [1, 2], "z", decimal.Decimal("1.25"),
                                bytearray(b"\x01"))] * 2
    assert out.schema == user  # names, types and NOT NULL as declared
    got = progress_metrics({"observedMetrics": {"n": obs.get}}, "n")
    assert got["partitions"] == 2 and got["input_rows"] == 2 and got["rows"] == 2


def test_progress_metrics_read_connect_s_shape_of_an_observed_row():
    # Spark Connect's client reads observedMetrics from the progress JSON into
    # Row(values=[...], schema={...}); the metrics are the same as from a classic Row
    from pyspark.sql import Row

    task = json.dumps({"partitions": 1, "input_rows": 7, "bytes_uploaded": 10})
    schema = {"type": "struct", "fields": [
        {"name": "rows", "type": "long", "nullable": False, "metadata": {}},
        {"name": "task_metrics", "type": {"type": "array", "elementType": "string",
                                          "containsNull": False},
         "nullable": False, "metadata": {}}]}
    classic = progress_metrics({"observedMetrics": {"n": Row(rows=5, task_metrics=[task])}},
                               "n")
    connect = progress_metrics({"observedMetrics": {"n": Row(values=[5, [task]],
                                                             schema=schema)}}, "n")
    as_json = progress_metrics(json.dumps({"observedMetrics": {"n": {"values": [5, [task]],
                                                                     "schema": schema}}}), "n")
    assert classic == connect == as_json
    assert classic["rows"] == 5 and classic["input_rows"] == 7 and classic["partitions"] == 1
