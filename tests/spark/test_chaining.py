"""Stateful operators chained after ours on ``eventTimeColumnName``, differential against
Spark's own ``transformWithStateInPandas`` in the same position: the same query, the same
input, the same output in every micro-batch (or the same failure, in the same batch)."""

from __future__ import annotations

import chain_procs as C
import numpy as np
import pandas as pd
import processors as P
import pytest
from harness import assert_same, run_stream, run_streams, write_batches
from pyspark.sql import functions as F

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import LateOutputError, OptionsError
from statebackend.task.columns import KeySpec
from statebackend.task.context import OperatorConfig
from statebackend.task.watermark import check_emitted

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
WATERMARK = ("ts", "5 seconds")


def batches(n: int = 6, seed: int = 3) -> list[pd.DataFrame]:
    """30 rows per batch over 6 keys; event time moves 7 s per batch, spread over 6 s."""
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({
        "k": [f"k{i}" for i in rng.integers(0, 6, 30)],
        "x": rng.integers(0, 9, 30).astype("int64"),
        "ts": pd.Timestamp("2026-01-01") + pd.to_timedelta(b * 7 + rng.random(30) * 6, unit="s"),
    }) for b in range(n)]


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("chaining")


@pytest.fixture(scope="module")
def input_dir(module_dir):
    d = str(module_dir / "input")
    write_batches(d, batches())
    return d


@pytest.fixture(scope="module")
def spark_runs(spark, module_dir, input_dir):
    """``theirs(name, build)``: Spark's own query ``name`` over ``input_dir``, run once per
    module (two tests compare ours with the same Spark query)."""
    runs: dict[str, dict[int, pd.DataFrame]] = {}

    def theirs(name, build, mode="append"):
        if name not in runs:
            runs[name] = run_stream(spark, input_dir, SCHEMA, build,
                                    str(module_dir / f"ck-spark-{name}"), WATERMARK, mode)
        return runs[name]
    return theirs


def backend(tmp_path, **kw) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local"), **kw))


def both(spark, tmp_path, input_dir, theirs, our_build, mode="append"):
    """``theirs``: the output of Spark's query in ours' place (:func:`spark_runs`)."""
    ours = run_stream(spark, input_dir, SCHEMA, our_build, str(tmp_path / "ck-ours"),
                      WATERMARK, mode)
    assert len(theirs) >= 6  # the 6 with input, and any no-data micro-batch Spark ran
    assert_same(ours, theirs)
    return ours


def window_counts(df):
    return (df.groupBy(F.window("ts", "10 seconds")).count()
              .select(F.col("window.start").alias("start"), "count"))


def spark_tws(proc, schema=C.EMIT_SCHEMA):
    return lambda df: df.groupBy("k").transformWithStateInPandas(
        proc, schema, "Append", "EventTime", eventTimeColumnName="ts")


@pytest.mark.parametrize("placement", ["shuffle", "carrier"])
def test_window_aggregation_after_ours(spark, tmp_path, input_dir, spark_runs, placement):
    # the query: without the event time Spark refused the aggregation
    # ("streaming aggregations without watermark"); with it, Spark's windows
    be = backend(tmp_path, placement=placement)
    ours = both(spark, tmp_path, input_dir,
                spark_runs("window-counts",
                           lambda df: window_counts(spark_tws(C.EmitLatest())(df))),
                lambda df: window_counts(be.transform_with_state(
                    df.groupBy("k"), C.EmitLatest(), C.EMIT_SCHEMA, "Append", "EventTime",
                    eventTimeColumnName="ts")))
    # windows closed by the watermark, emitted once each in Append mode
    assert sum(len(v) for v in ours.values()) >= 2


def spark_then_spark(spark_runs):
    """Spark's transformWithStateInPandas after Spark's: the reference of both tests below."""
    return spark_runs("sum-after-latest", lambda df: spark_tws(C.EmitLatest())(df).groupBy(
        "k").transformWithStateInPandas(C.SumUntilWatermark(), "k STRING, v BIGINT", "Append",
                                        "EventTime"))


def test_spark_transform_with_state_after_ours(spark, tmp_path, input_dir, spark_runs):
    be = backend(tmp_path)
    downstream = lambda df: df.groupBy("k").transformWithStateInPandas(  # noqa: E731
        C.SumUntilWatermark(), "k STRING, v BIGINT", "Append", "EventTime")
    ours = both(spark, tmp_path, input_dir, spark_then_spark(spark_runs),
                lambda df: downstream(be.transform_with_state(
                    df.groupBy("k"), C.EmitLatest(), C.EMIT_SCHEMA, "Append", "EventTime",
                    eventTimeColumnName="ts")))
    assert sum(len(v) for v in ours.values()) > 0  # the downstream timers fired


def test_our_transform_with_state_after_ours(spark, tmp_path, input_dir, spark_runs):
    be = backend(tmp_path)
    ours = both(spark, tmp_path, input_dir, spark_then_spark(spark_runs),
                lambda df: be.transform_with_state(
                    be.transform_with_state(df.groupBy("k"), C.EmitLatest(), C.EMIT_SCHEMA,
                                            "Append", "EventTime", eventTimeColumnName="ts",
                                            operator_id="first").groupBy("k"),
                    C.SumUntilWatermark(), "k STRING, v BIGINT", "Append", "EventTime",
                    operator_id="second"))
    assert sum(len(v) for v in ours.values()) > 0


def test_output_at_the_watermark_is_allowed_as_by_spark(spark, tmp_path, input_dir,
                                                        spark_runs):
    # Spark compares output with the watermark for late events (the previous batch's):
    # a row timed at the current watermark passes, and the aggregation counts it
    be = backend(tmp_path)
    ours = both(spark, tmp_path, input_dir,
                spark_runs("window-counts-at-watermark",
                           lambda df: window_counts(spark_tws(C.EmitAtWatermark())(df))),
                lambda df: window_counts(be.transform_with_state(
                    df.groupBy("k"), C.EmitAtWatermark(), C.EMIT_SCHEMA, "Append",
                    "EventTime", eventTimeColumnName="ts")))
    assert sum(len(v) for v in ours.values()) > 0


def _failure(spark, tmp_path, input_dir, build, name):
    out: dict[int, pd.DataFrame] = {}
    with pytest.raises(Exception) as info:
        run_stream(spark, input_dir, SCHEMA, build, str(tmp_path / name), WATERMARK,
                   "append", out)
    return out, str(info.value)


def test_late_output_fails_the_query_as_spark_does(spark, tmp_path, input_dir):
    be = backend(tmp_path)
    theirs, their_error = _failure(spark, tmp_path, input_dir,
                                   spark_tws(C.EmitAnHourEarlier()), "ck-spark")
    ours, our_error = _failure(spark, tmp_path, input_dir, lambda df: be.transform_with_state(
        df.groupBy("k"), C.EmitAnHourEarlier(), C.EMIT_SCHEMA, "Append", "EventTime",
        eventTimeColumnName="ts", operator_id="late"), "ck-ours")
    assert LateOutputError.CONDITION in their_error
    assert LateOutputError.CONDITION in our_error
    # the same micro-batches committed before the failure, with the same rows
    assert sorted(theirs) == [0, 1]
    assert_same(ours, theirs)
    # and the failed batch published no state: the state ends at the last good batch
    be.complete("late")
    assert be.coordinator("late").latest().checkpoint_id == 1


def test_event_time_column_needs_a_watermark_and_a_timestamp(spark, tmp_path, input_dir):
    be = backend(tmp_path)
    stream = spark.readStream.schema(SCHEMA).parquet(input_dir)

    def ours(df, column, schema=C.EMIT_SCHEMA):
        return be.transform_with_state(df.groupBy("k"), C.EmitLatest(), schema, "Append",
                                       "EventTime", eventTimeColumnName=column)

    for df in (stream, spark.read.parquet(input_dir).withWatermark(*WATERMARK)):
        with pytest.raises(OptionsError, match="CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK"):
            ours(df, "ts")
        with pytest.raises(Exception, match="CANNOT_ASSIGN_EVENT_TIME_COLUMN_WITHOUT_WATERMARK"):
            spark_tws(C.EmitLatest())(df)
    watermarked = stream.withWatermark(*WATERMARK)
    with pytest.raises(OptionsError, match="not a column of the output"):
        ours(watermarked, "zz")
    with pytest.raises(OptionsError, match="LongType column; expected a TIMESTAMP"):
        ours(watermarked, "n")
    # the output's event time carries the delay Spark's downstream operators read
    out = ours(watermarked, "ts")
    field = out.schema["ts"]
    assert field.metadata == {"spark.watermarkDelayMs": 5000}
    assert out.columns == ["k", "ts", "n"]


def _config(column=("ts", 1)) -> OperatorConfig:
    return OperatorConfig(operator_id="op", checkpoint_location="/x", storage_options={},
                          options=StateBackendOptions(parallelism=1), parallelism=1,
                          key=KeySpec(("k",), ("string",)), watermark=("ts", 5000),
                          event_time_column=column)


def test_check_emitted_rule_in_microseconds():
    wm = 1_767_225_600_588  # ms
    at = pd.Timestamp(wm, unit="ms")
    ok = pd.DataFrame({"k": ["a", "b", "c"], "ts": [at + pd.Timedelta(microseconds=1), None,
                                                    at + pd.Timedelta(hours=1)]})
    check_emitted(ok, _config(), wm, "here")  # one microsecond after passes; null passes
    late = pd.DataFrame({"k": ["a", "b"], "ts": [at + pd.Timedelta(hours=1), at]})
    with pytest.raises(LateOutputError) as info:
        check_emitted(late, _config(), wm, "here")
    assert info.value.event_time_us == wm * 1000 and info.value.watermark_ms == wm
    assert str(info.value).startswith(f"[{LateOutputError.CONDITION}] Previous node emitted "
                                      f"a row with eventTime={wm * 1000} which is older than "
                                      f"current_watermark_value={wm}\n")
    # frames labelled by position, as Spark accepts them; tz-aware values in UTC
    positional = pd.DataFrame({0: ["a"], 1: [at.tz_localize("UTC")], 2: [1]})
    with pytest.raises(LateOutputError):
        check_emitted(positional, _config(), wm, "here")
    check_emitted(late, _config(None), wm, "here")  # not chained: nothing checked




# --- Spark's stateful operators before ours -----------------------------------------------

AROUND_SCHEMA = "id BIGINT, k STRING, x BIGINT, ts TIMESTAMP"


def sliding_with_redelivery(n: int = 6, seed: int = 11) -> list[pd.DataFrame]:
    """Keys slide on (so they go quiet and their event-time timers fire); every batch also
    redelivers a third of the previous batch's events, exactly as they were (same id and
    event time), which a deduplication drops."""
    rng = np.random.default_rng(seed)
    out, prev, next_id = [], None, 0
    for b in range(n):
        rows = 24
        fresh = pd.DataFrame({
            "id": np.arange(next_id, next_id + rows, dtype="int64"),
            "k": [f"k{i}" for i in rng.integers(b * 2, b * 2 + 4, rows)],
            "x": rng.integers(1, 9, rows).astype("int64"),
            "ts": pd.Timestamp("2026-01-01") + pd.to_timedelta(b * 7 + rng.random(rows) * 6,
                                                               unit="s")})
        next_id += rows
        batch = fresh if prev is None else pd.concat([fresh, prev.iloc[::3]], ignore_index=True)
        out.append(batch)
        prev = fresh
    return out


@pytest.fixture
def redelivered_dir(tmp_path):
    d = str(tmp_path / "input-redelivered")
    write_batches(d, sliding_with_redelivery())
    return d


def around(spark, tmp_path, input_dir, before, mode="update"):
    """``before(df)`` then Spark's event-time transformWithStateInPandas, against the same
    with ours in its place; same output in every micro-batch."""
    be = backend(tmp_path)
    # the operator's mode follows the query's (the carrier plan cannot run an Update
    # operator in an Append query, which Spark's own operator can)
    op_mode = "Append" if mode == "append" else "Update"
    runs = run_streams(spark, input_dir, AROUND_SCHEMA, {
        "theirs": (lambda df: before(df).groupBy("k").transformWithStateInPandas(
            P.EventTimer(), "k STRING, v BIGINT", op_mode, "EventTime"),
            str(tmp_path / "ck-spark")),
        "ours": (lambda df: be.transform_with_state(
            before(df).groupBy("k"), P.EventTimer(), "k STRING, v BIGINT", op_mode,
            "EventTime"), str(tmp_path / "ck-ours"))}, WATERMARK, mode)
    theirs, ours = runs["theirs"], runs["ours"]
    assert len(theirs) >= 6  # the 6 with input, and any no-data micro-batch Spark ran
    assert_same(ours, theirs)
    assert sum(len(v) for v in ours.values()) > 0  # timers fired on the watermark
    return ours


def test_deduplication_before_ours(spark, tmp_path, redelivered_dir):
    around(spark, tmp_path, redelivered_dir,
           lambda df: df.dropDuplicatesWithinWatermark(["id"]), mode="append")


def test_stream_static_join_before_ours(spark, tmp_path, redelivered_dir):
    weights = spark.createDataFrame(pd.DataFrame({"k": [f"k{i}" for i in range(20)],
                                                  "w": [i + 1 for i in range(20)]}))
    around(spark, tmp_path, redelivered_dir,
           lambda df: df.join(weights, "k").withColumn("x", F.col("x") * F.col("w")))
