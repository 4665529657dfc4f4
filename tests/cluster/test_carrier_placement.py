"""The default placement on the cluster test bed (conftest.py): with one ``local_dir`` per
executor and no ``placement`` option, each partition's task runs where its state is,
micro-batch after micro-batch.

A new location on a cluster (any master but ``local[N]``) gets the carrier plan by default
(``placement="auto"``, statebackend/spark/placement.py): each partition runs inside a Spark
stateful operator, whose state-store scheduling keeps it on the executor that last ran it.
The shuffle plan left the executor to Spark's scheduler: about half the steady-state tasks
restored from durable storage on two executors (BENCHMARKS.md, "Local-recovery hit rate on
a cluster"). The bound is loose so that scheduler noise (a busy executor past
``spark.locality.wait``) does not break it, while a return to the coin toss does.
"""

from __future__ import annotations

import boto3
import pytest
from cluster_job import run_job
from harness import random_batches, running_counts, write_batches
from test_cluster_scenarios import same_output

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

BATCHES = random_batches(10, seed=5, rows=80, keys=24)
LOCAL = {"resident", "working_dir", "local_copy"}


def test_the_default_keeps_partitions_on_their_executors(moto_server, tmp_path):
    bucket = "sb-carrier"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(
        Bucket=bucket)
    # no placement option: the default decides
    sc = {"name": "carrier_count", "input": str(tmp_path / "in"), "watermark": False,
          "num_retained": len(BATCHES) + 1}
    write_batches(sc["input"], BATCHES)
    res = run_job({"work": str(tmp_path), "endpoint": moto_server, "bucket": bucket,
                   "scenarios": [sc]}, str(tmp_path))["carrier_count"]
    print(f"restores {res['restores']}, executor dirs {res['executor_dirs']}")
    assert res["placement"] == "carrier"  # chosen by the default, recorded
    same_output(res["out"], running_counts(BATCHES)[0])
    assert res["completed"] == list(range(len(BATCHES)))
    # steady state: from batch 2 on (batch 0 starts empty, batch 1 may be a partition's
    # first task on the executor Spark placed its state store on); carried: no rows, no task
    sources = [src for b in range(2, len(BATCHES))
               for src in res["restores"][str(b)].values() if src != "carried"]
    assert len(sources) >= len(BATCHES) - 2, res["restores"]
    local = sum(src in LOCAL for src in sources)
    assert local >= 0.75 * len(sources), res["restores"]
    # each task records its executor: a kept-open instance is found only where it ran last
    ran = [(b, p, res["executors"][str(b)][p]) for b in range(1, len(BATCHES))
           for p, src in res["restores"][str(b)].items() if src != "carried"]
    assert {e for _b, _p, e in ran} <= {"0", "1"}, res["executors"]
    for b, p, e in ran:
        if res["restores"][str(b)][p] == "resident":
            before = res["executors"][str(b - 1)].get(p)  # None: carried, no task ran
            assert before in (e, None), (b, p, res["executors"])

