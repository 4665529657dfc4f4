"""A script that runs a streaming query over the backend, stops it with ``q.stop()`` while
a micro-batch may be running and exits at once, without stopping the session (run by
tests/spark/test_clean_stop.py). It used to print listener errors after its last line:
the listener's events were still on their way to a Python process that had ended.

    python stop_and_exit_job.py WORKDIR
"""

from __future__ import annotations

import os
import sys
import time

import pandas as pd


def write_batch(inp: str, b: int) -> None:
    path = os.path.join(inp, f"b{b}.parquet")
    pd.DataFrame({"k": [f"k{i % 5}" for i in range(20)], "x": list(range(20))}).to_parquet(
        path + ".tmp", index=False)
    os.replace(path + ".tmp", path)
    stamp = time.time() + b  # the file source reads the oldest file first
    os.utime(path, (stamp, stamp))


def counts(frames, state):
    for pdf in frames:
        g = pdf.groupby("k")["x"].count()
        keys = list(g.index)
        old = state.get(keys)["value"].to_numpy(dtype="float64", na_value=0).astype("int64")
        new = old + g.to_numpy()
        state.put(keys, pd.DataFrame({"value": new}))
        yield pd.DataFrame({"k": keys, "n": new})


def wait_for_batch(q, batch: int) -> int:
    deadline = time.monotonic() + 300
    while q.lastProgress is None or q.lastProgress["batchId"] < batch:
        if time.monotonic() > deadline:
            raise SystemExit(f"no batch {batch} within 300 s")
        time.sleep(0.2)
    return int(q.lastProgress["batchId"])


def main(work: str) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from statebackend import RocksDBStateBackend, StateBackendOptions

    inp = os.path.join(work, "in")
    os.makedirs(inp, exist_ok=True)
    for b in range(4):
        write_batch(inp, b)
    spark = (SparkSession.builder.master("local[2]").appName("stop-and-exit")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    backend = RocksDBStateBackend(os.path.join(work, "state"), StateBackendOptions(
        parallelism=2, local_dir=os.path.join(work, "local")))

    def start():
        df = (spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1)
              .parquet(inp))
        out = backend.map_in_pandas(df, key="k", func=counts, schema="k STRING, n BIGINT",
                                    operator_id="counts")
        return (out.writeStream.format("parquet").option("path", os.path.join(work, "out"))
                .option("checkpointLocation", os.path.join(work, "ck")).start())

    q = start()
    done = wait_for_batch(q, 2)
    q.stop()
    print("stopped after batch", done, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
