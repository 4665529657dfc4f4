"""A script that starts a streaming query over the backend, stops it with ``q.stop()`` and
exits without stopping the session (run by tests/spark/test_clean_stop.py).

    python stop_and_exit_job.py WORKDIR [stop|session|running]

``stop`` (default): ``q.stop()``, then exit; ``session``: ``q.stop()`` and
``spark.stop()``, then exit; ``running``: exit with the query still running.
"""

from __future__ import annotations

import os
import sys
import time

import pandas as pd


def main(work: str, how: str = "stop") -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from statebackend import RocksDBStateBackend, StateBackendOptions

    inp = os.path.join(work, "in")
    os.makedirs(inp, exist_ok=True)
    for b in range(3):
        pd.DataFrame({"k": [f"k{i % 5}" for i in range(20)], "x": list(range(20))}).to_parquet(
            os.path.join(inp, f"b{b}.parquet"), index=False)
    spark = (SparkSession.builder.master("local[2]").appName("stop-and-exit")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    backend = RocksDBStateBackend(os.path.join(work, "state"), StateBackendOptions(
        parallelism=2, local_dir=os.path.join(work, "local")))

    def counts(frames, state):
        for pdf in frames:
            g = pdf.groupby("k")["x"].count()
            keys = list(g.index)
            old = state.get(keys)["value"].to_numpy(dtype="float64", na_value=0).astype("int64")
            new = old + g.to_numpy()
            state.put(keys, pd.DataFrame({"value": new}))
            yield pd.DataFrame({"k": keys, "n": new})

    df = spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1).parquet(inp)
    out = backend.map_in_pandas(df, key="k", func=counts, schema="k STRING, n BIGINT",
                                operator_id="counts")
    q = (out.writeStream.format("memory").queryName("counts").outputMode("append")
         .option("checkpointLocation", os.path.join(work, "ck")).start())
    deadline = time.monotonic() + 300
    while q.lastProgress is None or q.lastProgress["batchId"] < 2:
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.2)
    print("\nbatch", q.lastProgress["batchId"], "done", flush=True)
    if how in ("stop", "session"):
        q.stop()
    if how == "session":
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
