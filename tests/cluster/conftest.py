"""The cluster test bed: ``local-cluster[2,1,1024]`` with state on S3 (moto) and a
``local_dir`` per executor, run by cluster_job.py in its own process (one SparkSession,
that is, one cluster, per test module).

The failure-free ``local[2]`` references come from the run's one ``spark`` fixture
(tests/conftest.py).
"""
