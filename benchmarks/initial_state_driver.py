"""Driver memory while planning a ``transform_with_state`` with a large initial state.

The initial state is made by Spark (``spark.range``: nothing built in this process), then
the operator is planned with it as ``initialState``; the driver process's peak RSS is read
before and after planning (``ru_maxrss``: the peak, so a transient collect shows), and the
first micro-batch is run so the staged state is also applied and counted.

    PYTHONPATH=. python -m benchmarks.initial_state_driver --keys 300000 --value-bytes 1024
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=300_000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "tests", "spark")
    sys.path.insert(0, tests)
    os.environ["PYTHONPATH"] = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])
    import pandas as pd
    import processors as P
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from statebackend import RocksDBStateBackend, StateBackendOptions

    work = args.workdir or tempfile.mkdtemp(prefix="initial-state-")
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    inp = os.path.join(work, "input")
    os.makedirs(inp, exist_ok=True)
    pd.DataFrame({"k": ["key1"], "x": [1]}).to_parquet(os.path.join(inp, "p.parquet"))
    be = RocksDBStateBackend(os.path.join(work, "state"), StateBackendOptions(
        parallelism=2, local_dir=os.path.join(work, "local")))
    init = spark.range(args.keys).select(
        F.concat(F.lit("key"), F.col("id").cast("string")).alias("k"),
        (F.col("id") + 1000).alias("init"),
        F.repeat(F.lit("x"), args.value_bytes).alias("pad"))
    stream = spark.readStream.schema("k STRING, x BIGINT").parquet(inp)
    before = peak_mb()
    t0 = time.perf_counter()
    out = be.transform_with_state(stream.groupBy("k"), P.InitialCount(), "k STRING, v BIGINT",
                                  "Update", "None", initialState=init.groupBy("k"),
                                  operator_id="init")
    plan_s = time.perf_counter() - t0
    planned = peak_mb()
    q = (out.writeStream.format("noop").option("checkpointLocation", os.path.join(work, "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    be.complete("init")
    keys = be.read_state(spark, "init", state_name="count").count()
    print(f"keys={args.keys} value_bytes={args.value_bytes} plan_s={plan_s:.1f} "
          f"driver_peak_mb_before={before:.0f} after_planning={planned:.0f} "
          f"growth_mb={planned - before:.0f} state_keys={keys}")
    spark.stop()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if keys == args.keys + 0 or keys == args.keys + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
