"""Executor loss, run as its own process (a second SparkSession cannot share the JVM of
the test session): a ``local-cluster[2,1,1024]`` Spark runs a RunningCount query; in
micro-batch 1 the first attempt of partition 0 kills its own executor JVM with SIGKILL.

Usage: ``python executor_loss_job.py WORK_DIR``; prints one JSON line with the output per
micro-batch, the reference, the completed checkpoints and the restore report.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(work: str) -> dict:
    import numpy as np
    import pandas as pd
    from pyspark.sql import SparkSession

    from statebackend import RocksDBStateBackend, StateBackendOptions
    from statebackend.supervisor import restore_report

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .appName("statebackend-executor-loss")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.executor.memory", "512m")
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(os.path.join(HERE, "executor_loss_procs.py"))
    import executor_loss_procs as procs

    rng = np.random.default_rng(23)
    data = [pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, 8, 40)],
                          "x": rng.integers(0, 10, 40).astype("int64")}) for _ in range(3)]
    in_dir = os.path.join(work, "in")
    os.makedirs(in_dir, exist_ok=True)
    base = time.time()
    for i, pdf in enumerate(data):
        pdf.to_parquet(os.path.join(in_dir, f"part-{i:05d}.parquet"), index=False)
        # one second apart: Spark's file source reads the oldest file first and breaks
        # ties in listing order, so equal times could reorder the micro-batches
        path = os.path.join(in_dir, f"part-{i:05d}.parquet")
        os.utime(path, (base + i, base + i))
    backend = RocksDBStateBackend(os.path.join(work, "state"), StateBackendOptions(
        parallelism=2, local_dir=os.path.join(work, "local")))
    out: dict[int, list] = {}

    def collect(batch_df, batch_id):
        out[batch_id] = sorted(map(tuple, batch_df.toPandas().itertuples(index=False)))

    df = spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1) \
        .parquet(in_dir)
    res = backend.transform_with_state(df.groupBy("k"), procs.KillExecutorOnce(os.path.join(work, "killed")),
                                       "k STRING, v BIGINT", operator_id="counts")
    q = (res.writeStream.foreachBatch(collect).outputMode("update")
         .option("checkpointLocation", os.path.join(work, "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    backend.complete("counts")
    totals: dict[str, int] = {}
    ref: dict[int, list] = {}
    for b, pdf in enumerate(data):
        counts = pdf.groupby("k").size()
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + int(n)
        ref[b] = sorted((k, totals[k]) for k in counts.index)
    completed = [c.checkpoint_id for c in backend.coordinator("counts").list_completed()]
    reports = {b: {p: r.source for p, r in restore_report(backend, "counts", b).items()}
               for b in completed}
    killed_path = os.path.join(work, "killed")
    killed = open(killed_path).read() if os.path.exists(killed_path) else ""
    spark.stop()
    return {"out": {str(k): [list(t) for t in v] for k, v in sorted(out.items())},
            "ref": {str(k): [list(t) for t in v] for k, v in ref.items()},
            "completed": completed, "restores": reports, "killed": killed}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
