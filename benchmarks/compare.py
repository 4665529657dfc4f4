"""Side-by-side comparison on local Spark: our swap-ins against Spark's own operators.

    python -m benchmarks.compare                      # 10,000 keys, 200,000 events, 10 batches
    python -m benchmarks.compare --keys 1000 --events 20000 --batches 4 --only ours

Workload: a running count per key (the same unmodified StatefulProcessor / function on
both sides), over a file stream with one file per micro-batch, local[2]. Prints a progress
line per run and a table with events/s, p50/p95 micro-batch latency and the ratio to
Spark's transformWithStateInPandas and to a stateless mapInPandas lower bound; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))


def setup_env() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # workers import the workload module by name
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


def make_input(path: str, keys: int, events: int, batches: int) -> None:
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(42)
    per = events // batches
    for b in range(batches):
        pd.DataFrame({"k": [f"key-{i:06d}" for i in rng.integers(0, keys, per)],
                      "x": rng.integers(0, 100, per).astype("int64")}
                     ).to_parquet(os.path.join(path, f"part-{b:05d}.parquet"), index=False)


def run(spark, name: str, build, input_dir: str, work: str) -> dict:
    df = spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1).parquet(input_dir)
    ck = os.path.join(work, "ck-" + name)
    latencies = []
    rows = [0]

    def sink(batch_df, batch_id):
        rows[0] += batch_df.count()

    t0 = time.perf_counter()
    q = (build(df).writeStream.foreachBatch(sink).outputMode("update")
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    for p in q.recentProgress:
        d = p.durationMs if hasattr(p, "durationMs") else p["durationMs"]
        if d and "triggerExecution" in d:
            latencies.append(d["triggerExecution"])
    return {"name": name, "seconds": elapsed, "batches": len(latencies),
            "p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
            "p95_ms": float(np.percentile(latencies, 95)) if latencies else None,
            "output_rows": rows[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--only", choices=["all", "ours", "spark"], default="all")
    ap.add_argument("--json", default="bench-out/compare.json")
    ap.add_argument("--large", action="store_true", help="1,000,000 keys, 5,000,000 events")
    args = ap.parse_args(argv)
    if args.large:
        args.keys, args.events = 1_000_000, 5_000_000
    setup_env()
    import workloads as W
    from pyspark.sql import SparkSession

    from statebackend import RocksDBStateBackend, StateBackendOptions

    spark = (SparkSession.builder.master("local[2]").appName("statebackend-compare")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="sb-compare-")
    input_dir = os.path.join(work, "input")
    make_input(input_dir, args.keys, args.events, args.batches)
    out_schema = "k STRING, v BIGINT"

    def backend(tag):
        return RocksDBStateBackend(os.path.join(work, "state-" + tag),
                                   StateBackendOptions(parallelism=args.partitions,
                                                       local_dir=os.path.join(work, "local-" + tag)))

    runs = []
    if args.only in ("all", "spark"):
        runs += [
            ("stateless mapInPandas", lambda df: df.mapInPandas(W.passthrough, out_schema)),
            ("spark transformWithStateInPandas", lambda df: df.groupBy("k").transformWithStateInPandas(
                W.RunningCount(), out_schema, "Update", "None")),
            ("spark applyInPandasWithState", lambda df: df.groupBy("k").applyInPandasWithState(
                W.count_fn, out_schema, "c BIGINT", "Update", "NoTimeout")),
        ]
    if args.only in ("all", "ours"):
        b1, b2, b3 = backend("tws"), backend("apply"), backend("map")
        runs += [
            ("ours transform_with_state", lambda df: b1.transform_with_state(
                df.groupBy("k"), W.RunningCount(), out_schema, "Update", "None", operator_id="tws")),
            ("ours apply_in_pandas_with_state", lambda df: b2.apply_in_pandas_with_state(
                df.groupBy("k"), W.count_fn, out_schema, "c BIGINT", "Update", "NoTimeout",
                operator_id="apply")),
            ("ours map_in_pandas", lambda df: b3.map_in_pandas(
                df, "k", W.vector_count, out_schema, "c BIGINT", operator_id="map")),
        ]
    results = []
    for name, build in runs:
        print(f"running {name} ...", flush=True)
        r = run(spark, name.replace(" ", "_"), build, input_dir, work)
        r["events_per_s"] = args.events / r["seconds"]
        print(f"  {name}: {r['events_per_s']:,.0f} events/s, {r['seconds']:.1f} s, "
              f"p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms", flush=True)
        results.append(r)
    by = {r["name"].replace("_", " "): r for r in results}
    lower = by.get("stateless mapInPandas", {}).get("events_per_s")
    tws = by.get("spark transformWithStateInPandas", {}).get("events_per_s")
    print()
    print(f"{'run':36} {'events/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'x lower':>8} {'x TWS':>7}")
    for r in results:
        eps = r["events_per_s"]
        print(f"{r['name'].replace('_', ' '):36} {eps:>10,.0f} {r['p50_ms'] or 0:>8.0f} "
              f"{r['p95_ms'] or 0:>8.0f} {(eps / lower if lower else float('nan')):>8.2f} "
              f"{(eps / tws if tws else float('nan')):>7.2f}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), "results": results}, fh, indent=1)
    print(f"\nJSON written to {args.json}")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
