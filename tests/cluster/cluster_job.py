"""The cluster scenarios, run as their own process (a second SparkSession cannot share
the JVM of the test session): ``local-cluster[2,1,1024]`` (two executors, each its own
JVM, Python workers and ``local_dir`` through ``{executor_id}``), durable state on S3
through s3fs against the moto server of the calling test.

Usage: ``python cluster_job.py SPEC_JSON``; the spec names the work directory, the S3
endpoint and bucket, and the scenarios with their input directories. Prints one line
``RESULT {json}``: per scenario the output per micro-batch, the completed checkpoints,
the restore source of every partition per checkpoint and the executor directories that
hold local state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SPARK_TESTS = os.path.join(ROOT, "tests", "spark")
for _p in (SPARK_TESTS, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
WATERMARK = ("ts", "5 seconds")


def cluster_session(app: str, extra_conf: dict[str, str] | None = None):
    """A ``local-cluster[2,1,1024]`` SparkSession whose executors import the test modules."""
    from pyspark.sql import SparkSession

    path = os.pathsep.join(p for p in (ROOT, SPARK_TESTS, HERE, os.environ.get("PYTHONPATH"))
                           if p)
    builder = (SparkSession.builder.master("local-cluster[2,1,1024]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.executor.memory", "512m")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.executorEnv.PYTHONPATH", path))
    for k, v in (extra_conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def s3_options(endpoint: str) -> dict:
    return {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "key": "testing", "secret": "testing",
            "skip_instance_cache": True, "use_listings_cache": False}


def build(name: str, backend, work: str):
    """The operator of each scenario, applied to the stream."""
    import fault_procs as F
    import processors as P
    import procs

    def tws(proc, mode="None"):
        return lambda df: backend.transform_with_state(df.groupBy("k"), proc, OUT, "Update",
                                                       mode, operator_id=name)

    if name in ("count", "carrier_count"):
        return tws(P.RunningCount())
    if name == "processing_timer":
        return tws(P.ProcessingTimer(), "ProcessingTime")
    if name == "event_timer":
        return tws(P.EventTimer(), "EventTime")
    if name == "event_timeout":
        return lambda df: backend.apply_in_pandas_with_state(
            df.groupBy("k"), P.event_timeout_fn, OUT, "s BIGINT", "Update", P.EVENT_TIMEOUT,
            operator_id=name)
    if name == "task_failure":
        return tws(P.FailOnce())
    if name == "worker_killed":
        return tws(F.ExitOnce())
    if name == "executor_lost":
        return tws(procs.KillExecutorOnce(os.path.join(work, "killed")))
    raise ValueError(f"unknown scenario {name!r}")


def run_query(spark, in_dir: str, build_fn, ck: str, watermark: bool) -> dict[int, list]:
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(in_dir)
    if watermark:
        df = df.withWatermark(*WATERMARK)
    out: dict[int, list] = {}

    def collect(batch_df, batch_id):
        out[batch_id] = sorted([r["k"], int(r["v"])] for r in batch_df.collect())

    q = (build_fn(df).writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    return out


def executor_dirs(local: str) -> list[str]:
    """Names of the per-executor directories that hold local state."""
    return sorted(d for d in os.listdir(local) if os.listdir(os.path.join(local, d))) \
        if os.path.isdir(local) else []


def scenario(spark, spec: dict, sc: dict) -> dict:
    from statebackend import RocksDBStateBackend, StateBackendOptions
    from statebackend.supervisor import restore_report

    name = sc["name"]
    if name == "processing_timer":  # Spark's defaults otherwise
        from harness import no_data_off

        spark = no_data_off(spark)  # its availableNow run would never end under them
    work = os.path.join(spec["work"], name)
    local = os.path.join(work, "local")
    url = f"s3://{spec['bucket']}/{name}"

    def backend():  # a new object per query start: a driver with no memory of the state
        return RocksDBStateBackend(url, StateBackendOptions(
            parallelism=2, local_dir=os.path.join(local, "{executor_id}"),
            **{k: sc[k] for k in ("placement", "num_retained") if k in sc}),
            storage_options=s3_options(spec["endpoint"]))

    out: dict[int, list] = {}
    be = backend()
    out.update(run_query(spark, sc["input"], build(name, be, work), os.path.join(work, "ck"),
                         sc.get("watermark", False)))
    if sc.get("more"):  # more input arrives while the query is down; then it restarts
        for f in sorted(os.listdir(sc["more"])):
            os.rename(os.path.join(sc["more"], f), os.path.join(sc["input"], f))
        be = backend()
        out.update(run_query(spark, sc["input"], build(name, be, work),
                             os.path.join(work, "ck"), sc.get("watermark", False)))
    be.complete(name)
    completed = [c.checkpoint_id for c in be.coordinator(name).list_completed()]
    reports = {str(b): restore_report(be, name, b) for b in completed}
    restores = {b: {str(p): r.source for p, r in rep.items()} for b, rep in reports.items()}
    executors = {b: {str(p): r.executor for p, r in rep.items()} for b, rep in reports.items()}
    killed_path = os.path.join(work, "killed")
    return {"out": {str(b): v for b, v in sorted(out.items())}, "completed": completed,
            "restores": restores, "executors": executors,
            "executor_dirs": executor_dirs(local),
            "killed": os.path.exists(killed_path),
            "placement": be.coordinator(name).latest().placement}


def main(spec_path: str) -> dict:
    with open(spec_path) as fh:
        spec = json.load(fh)
    spark = cluster_session("statebackend-cluster-tests")
    try:
        results = {}
        for sc in spec["scenarios"]:
            results[sc["name"]] = scenario(spark, spec, sc)
        return results
    finally:
        spark.stop()


def start_job(spec: dict[str, Any], work: str) -> subprocess.Popen:
    """Start cluster_job.py on ``spec`` in a session of its own; its output goes to
    ``work/job.out`` and ``work/job.err`` (read by :func:`job_result`)."""
    spec_path = os.path.join(work, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                          if p))
    with open(os.path.join(work, "job.out"), "w") as out, \
            open(os.path.join(work, "job.err"), "w") as err:
        return subprocess.Popen([sys.executable, os.path.join(HERE, "cluster_job.py"),
                                 spec_path], env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def job_result(proc: subprocess.Popen, work: str, timeout: float = 900) -> dict[str, Any]:
    """The result of a job of :func:`start_job`, or a failure with the job's stderr."""
    import pytest

    proc.wait(timeout=timeout)
    with open(os.path.join(work, "job.out")) as out, open(os.path.join(work, "job.err")) as err:
        stdout, stderr = out.read(), err.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"cluster job failed (exit {proc.returncode}):\n{stderr[-8000:]}")
    return json.loads(lines[-1][len("RESULT "):])


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
