"""The cluster test bed: ``local-cluster[2,1,1024]`` with state on S3 (moto) and a
``local_dir`` per executor, run by cluster_job.py in its own process (one SparkSession,
that is, one cluster, per test module).

The failure-free ``local[2]`` references come from the session of ``tests/spark``
(loaded here under another module name, as tests/cli does).
"""

from __future__ import annotations

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SPARK_TESTS = os.path.join(os.path.dirname(HERE), "spark")
_spec = importlib.util.spec_from_file_location("_spark_conftest",
                                               os.path.join(SPARK_TESTS, "conftest.py"))
assert _spec is not None and _spec.loader is not None
_spark_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_spark_conftest)  # sets PYTHONPATH for the workers, adds sys.path

spark = _spark_conftest.spark
