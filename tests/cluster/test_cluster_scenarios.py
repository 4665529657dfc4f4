"""The running-count, timer and fault scenarios on the cluster test bed (conftest.py):
two executors with their own JVMs, Python workers and local directories, state on S3.
Each ends with output identical to a failure-free run (a pandas reference for the counts,
the same query on ``local[2]`` for the timers), and every partition of every completed
checkpoint restored from a known source."""

from __future__ import annotations

from collections.abc import Callable

import boto3
import pandas as pd
import processors as P
import pytest
from cluster_job import job_result, start_job
from harness import (
    early,
    killed_at_end,
    random_batches,
    run_stream,
    run_streams,
    running_counts,
    write_batches,
)

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
# empty: checkpoint 0; resident: the instance its worker kept open (keep_instances_open)
SOURCES = {"empty", "resident", "working_dir", "local_copy", "durable"}


def sliding_batches(n: int, seed: int = 7, rows: int = 60) -> list[pd.DataFrame]:
    """Keys move on from batch to batch, event time moves forward 10 s per batch: keys go
    quiet and their timers and timeouts fire."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [pd.DataFrame({
        "k": [f"key{i}" for i in rng.integers(b * 3, b * 3 + 6, rows)],
        "x": rng.integers(0, 100, rows).astype("int64"),
        "ts": pd.Timestamp("2026-01-01") + pd.to_timedelta(b * 10 + rng.random(rows) * 5,
                                                           unit="s")}) for b in range(n)]


COUNT = random_batches(6, seed=3)           # 4 batches, then 2 more after a restart
FAULT = random_batches(3, seed=21, rows=40, keys=8)
SLIDING = sliding_batches(5)
CARRIER = random_batches(10, seed=5, rows=80, keys=24)
SCENARIOS = [  # (name, data, batches before the restart or None, watermark, options)
    ("count", COUNT, 4, False, {}),
    ("processing_timer", SLIDING, None, False, {}),
    ("event_timer", SLIDING, None, True, {}),
    ("event_timeout", SLIDING, None, True, {}),
    # test_the_default_keeps_partitions_on_their_executors: every checkpoint retained
    ("carrier_count", CARRIER, None, False, {"num_retained": len(CARRIER) + 1}),
    ("task_failure", FAULT, None, False, {}),
    ("worker_killed", FAULT, None, False, {}),
    ("executor_lost", FAULT, None, False, {}),  # last: it kills an executor
]


def start_early(request: pytest.FixtureRequest) -> Callable[[], dict]:
    """The job that runs every scenario once on one cluster (a cluster costs a driver and
    two executor JVMs to start), run in the background (tests/conftest.py,
    ``_jobs_started_early``); a job still running at the end of the run (interrupted
    before its tests) is killed."""
    moto_server = request.getfixturevalue("moto_server")
    work = request.getfixturevalue("tmp_path_factory").mktemp("cluster")
    bucket = "sb-cluster"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(
        Bucket=bucket)
    scenarios = []
    for name, data, first, watermark, options in SCENARIOS:
        sc = {"name": name, "input": str(work / name / "in"), "watermark": watermark,
              **options}
        write_batches(sc["input"], data[:first])
        if first is not None:
            sc["more"] = str(work / name / "more")
            write_batches(sc["more"], data[first:], start=first)
        scenarios.append(sc)
    procs = killed_at_end(request)

    def job() -> dict:
        procs.append(start_job({"work": str(work), "endpoint": moto_server, "bucket": bucket,
                                "scenarios": scenarios}, str(work)))
        return job_result(procs[0], str(work))

    return job


@pytest.fixture(scope="module")
def cluster(request) -> dict:
    """The job's result per scenario, once it ended."""
    res = early(request, __name__)
    for name, r in res.items():  # shown with -s: where each partition restored from
        print(f"{name}: restores {r['restores']}, executor dirs {r['executor_dirs']}")
    return res


def frames(out: dict[str, list]) -> dict[int, pd.DataFrame]:
    return {int(b): pd.DataFrame(rows, columns=["k", "v"]).astype({"v": "int64"})
            for b, rows in out.items()}


def same_output(ours: dict[str, list], ref: dict[int, pd.DataFrame]) -> None:
    got = frames(ours)
    assert sorted(got) == sorted(ref)
    for b in ref:
        exp = ref[b].sort_values(["k", "v"]).reset_index(drop=True).astype({"v": "int64"})
        pd.testing.assert_frame_equal(got[b], exp[["k", "v"]], check_dtype=False,
                                      obj=f"micro-batch {b}")


def check_restores(res: dict, n_batches: int) -> None:
    assert res["completed"] == list(range(n_batches))[-3:]  # num_retained=3
    for b in res["completed"]:
        assert set(res["restores"][str(b)]) == {"0", "1"}
        assert set(res["restores"][str(b)].values()) <= SOURCES, res["restores"]


def test_running_count_and_restart(cluster):
    res = cluster["count"]
    same_output(res["out"], running_counts(COUNT)[0])
    check_restores(res, len(COUNT))


def test_executors_keep_separate_local_directories(cluster):
    dirs = set().union(*(set(r["executor_dirs"]) for r in cluster.values()))
    # one directory per executor id, never the unexpanded placeholder; both executors
    # (and possibly the one replacing the lost executor) held state
    assert {"0", "1"} <= dirs and dirs <= {"0", "1", "2"}, dirs


def local_reference(spark, tmp_path, build, data=SLIDING,
                    watermark=("ts", "5 seconds")) -> dict[int, pd.DataFrame]:
    """The same query, failure-free, on the local[2] session of tests/spark."""
    write_batches(str(tmp_path / "in"), data)
    be = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local")))
    return run_stream(spark, str(tmp_path / "in"), SCHEMA, lambda df: build(be, df),
                      str(tmp_path / "ck"), watermark=watermark)


def test_processing_time_timers(cluster, spark_no_data, tmp_path):
    # each batch's timers are due by the next batch's processing time: they fire there
    # (no-data micro-batches off, as in the cluster job: the query could not end otherwise)
    ref = local_reference(spark_no_data, tmp_path, lambda be, df: be.transform_with_state(
        df.groupBy("k"), P.ProcessingTimer(), OUT, "Update", "ProcessingTime",
        operator_id="t"), watermark=None)
    assert any((v["v"] < 0).any() for v in ref.values())  # some timers fired
    same_output(cluster["processing_timer"]["out"], ref)
    check_restores(cluster["processing_timer"], len(SLIDING))


@pytest.fixture(scope="module")
def event_time_references(spark, tmp_path_factory) -> dict[str, dict[int, pd.DataFrame]]:
    """The event-time timer and timeout queries, failure-free on the local[2] session, both
    at once over the same input (run_streams)."""
    tmp = tmp_path_factory.mktemp("event-time-references")
    write_batches(str(tmp / "in"), SLIDING)
    be = {name: RocksDBStateBackend(str(tmp / name / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp / name / "local"))) for name in ("timer", "timeout")}
    return run_streams(spark, str(tmp / "in"), SCHEMA, {
        "timer": (lambda df: be["timer"].transform_with_state(
            df.groupBy("k"), P.EventTimer(), OUT, "Update", "EventTime", operator_id="t"),
            str(tmp / "timer" / "ck")),
        "timeout": (lambda df: be["timeout"].apply_in_pandas_with_state(
            df.groupBy("k"), P.event_timeout_fn, OUT, "s BIGINT", "Update", P.EVENT_TIMEOUT,
            operator_id="t"), str(tmp / "timeout" / "ck"))}, ("ts", "5 seconds"))


def test_event_time_timers(cluster, event_time_references):
    ref = event_time_references["timer"]
    assert sum(len(v) for v in ref.values()) > 0  # some timers fired
    same_output(cluster["event_timer"]["out"], ref)
    # Spark's defaults: no-data micro-batches after the files, in both runs
    assert len(ref) > len(SLIDING), sorted(ref)
    check_restores(cluster["event_timer"], len(ref))


def test_event_time_timeouts(cluster, event_time_references):
    ref = event_time_references["timeout"]
    assert any((v["v"] < 0).any() for v in ref.values())  # some keys timed out
    same_output(cluster["event_timeout"]["out"], ref)
    # Spark's defaults: no-data micro-batches after the files, in both runs
    assert len(ref) > len(SLIDING), sorted(ref)
    check_restores(cluster["event_timeout"], len(ref))


@pytest.mark.faults
@pytest.mark.parametrize("name", ["task_failure", "worker_killed", "executor_lost"])
def test_fault_ends_with_failure_free_output(cluster, name):
    res = cluster[name]
    same_output(res["out"], running_counts(FAULT)[0])
    check_restores(res, len(FAULT))
    if name == "executor_lost":
        assert res["killed"], "the executor was never killed: the fault did not happen"


# --- the default placement ------------------------------------------------------------------
# With one ``local_dir`` per executor and no ``placement`` option, each partition's task runs
# where its state is, micro-batch after micro-batch. A new location on a cluster (any master
# but ``local[N]``) gets the carrier plan by default (``placement="auto"``,
# statebackend/spark/placement.py): each partition runs inside a Spark stateful operator,
# whose state-store scheduling keeps it on the executor that last ran it. The shuffle plan
# left the executor to Spark's scheduler: about half the steady-state tasks restored from
# durable storage on two executors (BENCHMARKS.md, "Local-recovery hit rate on a cluster").
# The bound is loose so that scheduler noise (a busy executor past ``spark.locality.wait``)
# does not break it, while a return to the coin toss does.

LOCAL = {"resident", "working_dir", "local_copy"}


def test_the_default_keeps_partitions_on_their_executors(cluster):
    res = cluster["carrier_count"]
    assert res["placement"] == "carrier"  # chosen by the default, recorded
    same_output(res["out"], running_counts(CARRIER)[0])
    assert res["completed"] == list(range(len(CARRIER)))
    # steady state: from batch 2 on (batch 0 starts empty, batch 1 may be a partition's
    # first task on the executor Spark placed its state store on); carried: no rows, no task
    sources = [src for b in range(2, len(CARRIER))
               for src in res["restores"][str(b)].values() if src != "carried"]
    assert len(sources) >= len(CARRIER) - 2, res["restores"]
    local = sum(src in LOCAL for src in sources)
    assert local >= 0.75 * len(sources), res["restores"]
    # each task records its executor: a kept-open instance is found only where it ran last
    ran = [(b, p, res["executors"][str(b)][p]) for b in range(1, len(CARRIER))
           for p, src in res["restores"][str(b)].items() if src != "carried"]
    assert {e for _b, _p, e in ran} <= {"0", "1"}, res["executors"]
    for b, p, e in ran:
        if res["restores"][str(b)][p] == "resident":
            before = res["executors"][str(b - 1)].get(p)  # None: carried, no task ran
            assert before in (e, None), (b, p, res["executors"])
