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


def make_backend(tmp_path) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"),
                               StateBackendOptions(parallelism=2, local_dir=str(tmp_path / "local")))


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


def test_union_of_two_operators_is_refused_unless_each_runs_in_its_own_stage(spark, tmp_path):
    # after a union in the same stage, TaskContext.partitionId() is offset for the second
    # operator: that must fail loudly, never put state in the wrong partition
    data = batches(2, seed=17)
    write_batches(str(tmp_path / "in"), data)
    be = make_backend(tmp_path)

    def union_of(df, shuffle: bool, suffix: str):
        a = be.transform_with_state(df.groupBy("k"), P.RunningCount(), OUT, operator_id="a" + suffix)
        b = be.transform_with_state(df.groupBy("k"), P.RunningCount(), OUT, operator_id="b" + suffix)
        return a.repartition(2).union(b.repartition(2)) if shuffle else a.union(b)

    with pytest.raises(Exception, match="combined \\(e.g. by union\\)"):
        run_stream(spark, str(tmp_path / "in"), SCHEMA, lambda df: union_of(df, False, "x"),
                   str(tmp_path / "ck-bad"))

    def build(df):
        return union_of(df, True, "")

    ours = run_stream(spark, str(tmp_path / "in"), SCHEMA, build, str(tmp_path / "ck"))
    ref = reference_running_counts(data)
    for bid, expected in ref.items():
        doubled = pd.concat([expected, expected]).sort_values(["k", "v"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(ours[bid].astype({"v": "int64"}), doubled, check_dtype=False)
    be.complete()
    assert be.coordinator("a").latest().checkpoint_id == 1
    assert be.coordinator("b").latest().checkpoint_id == 1
