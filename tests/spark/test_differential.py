"""Differential tests: the same processor on Spark's operator and on ours, same output per
micro-batch on the same multi-batch file stream."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import processors as P
import pytest
from harness import (
    assert_same,
    never_ends_under_defaults,
    run_stream,
    run_streams,
    write_batches,
)

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def make_batches(n_batches: int = 4, rows: int = 60, keys: int = 12, seed: int = 7,
                 sliding: bool = False) -> list[pd.DataFrame]:
    """Random rows per batch; with ``sliding`` each batch sees a window of keys that moves
    on, so keys go quiet and their event-time timers and timeouts can fire."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_batches):
        k = rng.integers(b * 3, b * 3 + 6, rows) if sliding else rng.integers(0, keys, rows)
        out.append(pd.DataFrame({
            "k": [f"key{i}" for i in k],
            "x": rng.integers(0, 100, rows).astype("int64"),
            # event time moves forward 10 s per batch, with a spread inside the batch
            "ts": pd.Timestamp("2026-01-01") + pd.to_timedelta(b * 10 + rng.random(rows) * 5, unit="s"),
        }))
    return out


@pytest.fixture
def stream_dir(tmp_path):
    d = str(tmp_path / "input")
    write_batches(d, make_batches())
    return d


@pytest.fixture
def sliding_dir(tmp_path):
    d = str(tmp_path / "input-sliding")
    write_batches(d, make_batches(n_batches=5, sliding=True))
    return d


def both(spark, tmp_path, stream_dir, spark_build, our_build, watermark=None):
    runs = run_streams(spark, stream_dir, SCHEMA, {
        "theirs": (spark_build, str(tmp_path / "ck-spark")),
        "ours": (our_build, str(tmp_path / "ck-ours"))}, watermark)
    theirs, ours = runs["theirs"], runs["ours"]
    assert len(theirs) >= 4
    assert sum(len(v) for v in theirs.values()) > 0
    assert_same(ours, theirs)
    return ours


def backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))


@pytest.mark.parametrize("proc_cls,mode", [(P.RunningCount, "None"), (P.ListOps, "None"),
                                           (P.MapOps, "None"), (P.TtlCount, "ProcessingTime")])
def test_processor_without_timers(spark, spark_no_data, tmp_path, stream_dir, proc_cls, mode):
    be = backend(tmp_path)
    both(spark_no_data if never_ends_under_defaults(mode) else spark, tmp_path, stream_dir,
         lambda df: df.groupBy("k").transformWithStateInPandas(proc_cls(), OUT, "Update", mode),
         lambda df: be.transform_with_state(df.groupBy("k"), proc_cls(), OUT, "Update", mode))


def test_ttl_without_processing_time_is_refused_like_spark(spark, tmp_path, stream_dir):
    be = backend(tmp_path)
    with pytest.raises(Exception, match="TTL"):
        run_stream(spark, stream_dir, SCHEMA,
                   lambda df: be.transform_with_state(df.groupBy("k"), P.TtlCount(), OUT, "Update", "None"),
                   str(tmp_path / "ck-ttl"))


def test_processing_time_timers(spark_no_data, tmp_path, stream_dir):
    be = backend(tmp_path)
    both(spark_no_data, tmp_path, stream_dir,
         lambda df: df.groupBy("k").transformWithStateInPandas(P.ProcessingTimer(), OUT, "Update", "ProcessingTime"),
         lambda df: be.transform_with_state(df.groupBy("k"), P.ProcessingTimer(), OUT, "Update", "ProcessingTime"))


def test_event_time_timers_with_watermark(spark, tmp_path, sliding_dir):
    be = backend(tmp_path)
    ours = both(spark, tmp_path, sliding_dir,
                lambda df: df.groupBy("k").transformWithStateInPandas(P.EventTimer(), OUT, "Update", "EventTime"),
                lambda df: be.transform_with_state(df.groupBy("k"), P.EventTimer(), OUT, "Update", "EventTime"),
                watermark=("ts", "5 seconds"))
    assert sum(len(v) for v in ours.values()) > 0  # some timers fired


def test_initial_state(spark, tmp_path, stream_dir):
    be = backend(tmp_path)
    init = spark.createDataFrame(pd.DataFrame({"k": ["key1", "key2", "nokey"], "init": [100, 200, 300]}))
    both(spark, tmp_path, stream_dir,
         lambda df: df.groupBy("k").transformWithStateInPandas(
             P.InitialCount(), OUT, "Update", "None", initialState=init.groupBy("k")),
         lambda df: be.transform_with_state(df.groupBy("k"), P.InitialCount(), OUT, "Update", "None",
                                            initialState=init.groupBy("k")))


def test_apply_in_pandas_with_state_no_timeout(spark, tmp_path, stream_dir):
    be = backend(tmp_path)
    both(spark, tmp_path, stream_dir,
         lambda df: df.groupBy("k").applyInPandasWithState(P.count_fn, OUT, "c BIGINT", "Update", P.NO_TIMEOUT),
         lambda df: be.apply_in_pandas_with_state(df.groupBy("k"), P.count_fn, OUT, "c BIGINT", "Update", P.NO_TIMEOUT))


def test_apply_in_pandas_with_state_event_timeout(spark, tmp_path, sliding_dir):
    be = backend(tmp_path)
    ours = both(spark, tmp_path, sliding_dir,
                lambda df: df.groupBy("k").applyInPandasWithState(P.event_timeout_fn, OUT, "s BIGINT", "Update", P.EVENT_TIMEOUT),
                lambda df: be.apply_in_pandas_with_state(df.groupBy("k"), P.event_timeout_fn, OUT, "s BIGINT", "Update", P.EVENT_TIMEOUT),
                watermark=("ts", "5 seconds"))
    assert any((v["v"] < 0).any() for v in ours.values())  # some keys timed out


def test_state_files_exist_after_run(spark, tmp_path, stream_dir):
    be = backend(tmp_path)
    run_stream(spark, stream_dir, SCHEMA,
               lambda df: be.transform_with_state(df.groupBy("k"), P.RunningCount(), OUT, "Update", "None",
                                                  operator_id="rc"),
               str(tmp_path / "ck"))
    be.complete("rc")
    latest = be.coordinator("rc").latest()
    assert latest is not None and latest.checkpoint_id == 3
    assert os.path.isdir(tmp_path / "state" / "rc")


def test_row_flavour_processor(spark, tmp_path, stream_dir):
    be = backend(tmp_path)
    both(spark, tmp_path, stream_dir,
         lambda df: df.groupBy("k").transformWithState(P.RowRunningCount(), OUT, "Update", "None"),
         lambda df: be.transform_with_state(df.groupBy("k"), P.RowRunningCount(), OUT, "Update",
                                            "None", flavour="row"))


def test_composite_key_with_a_bigint_field(spark, tmp_path, stream_dir):
    # (string, bigint) keys: the plan ships Spark's key groups instead of hashing in the task
    import pyspark.sql.functions as F

    be = backend(tmp_path)
    ours = both(spark, tmp_path, stream_dir,
                lambda df: df.withColumn("n", F.col("x") % 3).groupBy("k", "n")
                .transformWithStateInPandas(P.RunningCount(), OUT, "Update", "None"),
                lambda df: be.transform_with_state(df.withColumn("n", F.col("x") % 3).groupBy("k", "n"),
                                                   P.RunningCount(), OUT, "Update", "None"))
    # several (k, n) keys per k: the composite key really is the key
    assert any(v["k"].duplicated().any() for v in ours.values())
