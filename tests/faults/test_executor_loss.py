"""Executor lost mid-batch (SIGKILL of its JVM) on ``local-cluster[2,1,1024]``, in a
subprocess with its own SparkSession: output identical to a failure-free run, and only
the lost partition restores from a fallback source."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.faults]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_executor_lost_mid_batch(tmp_path):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                          if p))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "executor_loss_job.py"),
                           str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=480)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["killed"], "the executor was never killed: the fault did not happen"
    assert res["out"] == res["ref"]
    assert res["completed"] == [0, 1, 2]
    # the task of the lost executor restored partition 0 from a fallback source (never
    # from its half-written working directory); partition 1 kept its instance
    restores = res["restores"]
    assert restores["1"]["0"] in ("local_copy", "durable")
    assert restores["1"]["1"] in ("working_dir", "resident")
    print("executor loss restores per checkpoint:", restores)
