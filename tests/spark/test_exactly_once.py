"""Exactly-once state (invariants 1 and 8) under task retries, repeated batches and
restarts: output and state end identical to a failure-free pandas reference."""

from __future__ import annotations

import pandas as pd
import processors as P
import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def batches(n: int, seed: int = 3) -> list[pd.DataFrame]:
    return random_batches(n, seed)


def reference_running_counts(data: list[pd.DataFrame]) -> dict[int, pd.DataFrame]:
    return running_counts(data)[0]


check = check_batches


def make_backend(tmp_path, **options) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local"),
                                                   **options))


def test_task_failing_on_first_attempt_is_retried_from_committed_state(spark, tmp_path):
    data = batches(3)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)
    ours = run_stream(spark, str(tmp_path / "in"), SCHEMA,
                      lambda df: be.transform_with_state(df.groupBy("k"), P.FailOnce(), OUT),
                      str(tmp_path / "ck"))
    check(ours, reference_running_counts(data))


def test_query_stopped_and_restarted_continues_from_committed_state(spark, tmp_path):
    data = batches(4, seed=11)
    in_dir = str(tmp_path / "in")
    write_batches(in_dir, data[:2])
    ck = str(tmp_path / "ck")
    first = run_stream(spark, in_dir, SCHEMA,
                       lambda df: make_backend(tmp_path).transform_with_state(
                           df.groupBy("k"), P.RunningCount(), OUT, operator_id="rc"), ck)
    # more input arrives while the query is down; a new backend object (new driver state)
    write_batches(in_dir, data[2:], start=2)
    second = run_stream(spark, in_dir, SCHEMA,
                        lambda df: make_backend(tmp_path).transform_with_state(
                            df.groupBy("k"), P.RunningCount(), OUT, operator_id="rc"), ck)
    check({**first, **second}, reference_running_counts(data))


def test_same_batch_executed_twice_gives_same_state(spark, tmp_path):
    data = batches(2, seed=5)
    be = make_backend(tmp_path)
    df0 = spark.createDataFrame(data[0])
    out0 = be.transform_with_state(df0.groupBy("k"), P.RunningCount(), OUT, operator_id="rc")
    a = out0.toPandas().sort_values(["k", "v"]).reset_index(drop=True)
    b = out0.toPandas().sort_values(["k", "v"]).reset_index(drop=True)  # the same epoch again
    pd.testing.assert_frame_equal(a, b)
    be.complete("rc")
    df1 = spark.createDataFrame(data[1])
    out1 = be.transform_with_state(df1.groupBy("k"), P.RunningCount(), OUT, operator_id="rc")
    got = out1.toPandas().sort_values(["k", "v"]).reset_index(drop=True)
    ref = reference_running_counts(data)
    pd.testing.assert_frame_equal(a.astype({"v": "int64"}), ref[0], check_dtype=False)
    pd.testing.assert_frame_equal(got.astype({"v": "int64"}), ref[1], check_dtype=False)


def test_union_of_two_operators_in_one_stage(spark, tmp_path):
    # A union in one stage numbers the partitions of its second side after the first, so
    # TaskContext.partitionId() is offset for the second operator: that must fail loudly,
    # never put state in the wrong partition. Two operators placed by the same expression
    # (same input, same key) are the exception: Spark then zips their partitions (its
    # partitioning-aware union), and every task sees its own index for both. It does so
    # only when no projection follows the operators: with progress metrics on (the plan
    # drops their hidden column), that union fails as loudly as the other.
    import pyspark.sql.functions as F

    data = batches(2, seed=17)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path, progress_metrics=False)
    with_progress = make_backend(tmp_path / "p")
    ref = reference_running_counts(data)

    def count(df, key, op):
        return be.transform_with_state(df.groupBy(key), P.RunningCount(), OUT, operator_id=op)

    def check_doubled(ours):
        for bid, expected in ref.items():
            doubled = pd.concat([expected, expected]).sort_values(["k", "v"]).reset_index(drop=True)
            pd.testing.assert_frame_equal(ours[bid].astype({"v": "int64"}), doubled,
                                          check_dtype=False)

    def renumbered(df):  # the second side keyed by another column: another placement
        return count(df, "k", "ax").union(count(df.withColumn("k2", F.col("k")), "k2", "bx"))

    with pytest.raises(Exception, match="combined \\(e.g. by union\\)"):
        run_stream(spark, str(tmp_path / "in"), SCHEMA, renumbered, str(tmp_path / "ck-bad"))
    with pytest.raises(Exception, match="combined \\(e.g. by union\\)"):
        run_stream(spark, str(tmp_path / "in"), SCHEMA,
                   lambda df: with_progress.transform_with_state(
                       df.groupBy("k"), P.RunningCount(), OUT, operator_id="pa").union(
                       with_progress.transform_with_state(
                           df.groupBy("k"), P.RunningCount(), OUT, operator_id="pb")),
                   str(tmp_path / "ck-progress"))

    check_doubled(run_stream(spark, str(tmp_path / "in"), SCHEMA,
                             lambda df: count(df, "k", "az").union(count(df, "k", "bz")),
                             str(tmp_path / "ck-zip")))
    check_doubled(run_stream(spark, str(tmp_path / "in"), SCHEMA,
                             lambda df: count(df, "k", "a").repartition(2).union(
                                 count(df, "k", "b").repartition(2)),
                             str(tmp_path / "ck")))
    be.complete()
    for op in ("a", "b", "az", "bz"):
        assert be.coordinator(op).latest().checkpoint_id == 1
