"""The carrier plan (placement="carrier") on local[2]: partitions without rows in a
micro-batch (carried over), several of our partitions in one Spark partition, a restart
with another parallelism, read_state and savepoints over carried checkpoints."""

from __future__ import annotations

import pandas as pd
import pytest
from harness import check_batches, run_stream, running_counts, write_batches
from processors import RunningCount

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.supervisor import restore_report

pytestmark = [pytest.mark.spark]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"


def few_keys(n: int) -> list[pd.DataFrame]:
    """Each batch touches one or two keys: most of 5 partitions have no rows most of the time."""
    keys = [["a"], ["b", "a"], ["c"], ["a"], ["d", "e"], ["b"], ["a"], ["c", "f"]]
    return [pd.DataFrame({"k": keys[b % len(keys)] * 3, "x": 1,
                          "ts": pd.Timestamp("2026-01-01") + pd.Timedelta(seconds=b)})
            .astype({"x": "int64"}) for b in range(n)]


def backend(tmp_path, parallelism: int) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=parallelism, local_dir=str(tmp_path / "local"), placement="carrier"))


def count(be):
    return lambda df: be.transform_with_state(df.groupBy("k"), RunningCount(), OUT, "Update",
                                              "None", operator_id="counts")


def test_idle_partitions_rescale_read_state_and_savepoint(spark, tmp_path):
    data = few_keys(8)
    ref = running_counts(data)[0]
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    write_batches(inp, data[:5])
    be = backend(tmp_path, 5)  # 5 of ours in Spark's 2 shuffle partitions
    out = run_stream(spark, inp, SCHEMA, count(be), ck)
    # Spark committed batch 4 (the query ended); its listener may not have completed it
    # yet, and completing a batch with partitions that ran no task needs to know that
    be.complete("counts", up_to=4)
    completed = [c.checkpoint_id for c in be.coordinator("counts").list_completed()]
    assert completed[-1] == 4
    sources = {r.source for b in completed for r in restore_report(be, "counts", b).values()}
    assert "carried" in sources, sources  # partitions without rows were carried over

    # restart with another parallelism (the Spark checkpoint keeps its 2 partitions)
    write_batches(inp, data[5:], start=5)
    be2 = backend(tmp_path, 3)
    out.update(run_stream(spark, inp, SCHEMA, count(be2), ck))
    check_batches(out, ref)

    be2.complete("counts", up_to=7)
    state = be2.read_state(spark, "counts").toPandas()
    counts = state[state["state_name"] == "count"]
    assert len(counts) == len(set(pd.concat(data)["k"]))
    sp = be2.savepoint("counts", "after")
    assert sp is not None


def test_progress_metrics_under_the_carrier(spark, tmp_path):
    """Each of our partitions that ran adds its metrics row, as in the shuffle plan; a
    partition without rows ran no task and adds none."""
    from test_progress_metrics import Collect

    data = few_keys(4)
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    write_batches(inp, data)
    be = backend(tmp_path, 5)
    listener = Collect(be.observation_name("counts"))
    spark.streams.addListener(listener)
    try:
        out = run_stream(spark, inp, SCHEMA, count(be), ck)
        seen = listener.wait_for(len(data))
    finally:
        spark.streams.removeListener(listener)
    check_batches(out, running_counts(data)[0])
    assert sorted(seen) == list(range(len(data)))
    for b, m in seen.items():
        assert m["input_rows"] == len(data[b]), (b, m)
        assert m["rows"] == len(out[b]) == m["keys"], (b, m)
        # the partitions with rows: one or two keys, never all five of ours
        assert 1 <= m["partitions"] <= data[b]["k"].nunique(), (b, m)
