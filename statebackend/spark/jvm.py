"""Starting Spark's JVM so that Ctrl-C in the terminal reaches only the Python driver.

A terminal sends SIGINT to every process of its foreground process group: the driver, the
JVM (pyspark starts it ignoring SIGINT) and the Python workers the JVM forks, which turn it
into a ``KeyboardInterrupt`` in the middle of their task (a failed task and a traceback
in the log). Started in its own session, the JVM and its workers never see the terminal's
signals; the driver then stops the query itself
(:class:`statebackend.supervisor.InterruptGuard`). The JVM still ends with the driver:
it exits when its standard input, a pipe from the driver, closes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["silence_spark_log", "start_jvm_detached"]


def start_jvm_detached(conf: Mapping[str, str] | None = None) -> bool:
    """Launch Spark's JVM in a new session, before the first ``SparkSession`` is built.

    Parameters
    ----------
    conf : mapping, optional
        Spark settings passed to ``spark-submit`` (those read only at JVM start, such as
        ``spark.driver.memory``, must be here; give the same ones to the builder).

    Returns
    -------
    bool
        False when a JVM already runs (or pyspark was started by ``spark-submit``):
        nothing was changed.
    """
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    spark_conf = SparkConf(loadDefaults=False)
    for k, v in (conf or {}).items():
        spark_conf.set(k, v)
    gateway = launch_gateway(spark_conf, popen_kwargs={"start_new_session": True})
    SparkContext._ensure_initialized(gateway=gateway)
    return True


def silence_spark_log(query: Any) -> None:
    """Turn Spark's log off for the session of ``query`` (a ``StreamingQuery``), before a
    deliberate stop whose cancelled jobs and tasks Spark would log as errors."""
    try:
        spark = getattr(query, "sparkSession", None)
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
        if spark is not None:
            from .session import set_log_level

            set_log_level(spark, "OFF")
    except Exception:  # noqa: BLE001 - quieter output only; the stop goes on regardless
        pass
