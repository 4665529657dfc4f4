"""The one-step move from Spark's own state store, measured: a Spark
``transformWithStateInPandas`` query (RocksDB provider) builds the state of ``--keys`` keys,
each with a value, a list and a map entry, all with TTLs, and a timer; it stops; then
``RocksDBStateBackend.import_spark_state`` writes our savepoint from it.

Reported: the import's time; the driver's Python peak RSS before and after the import
(``ru_maxrss``: a transient collect would show); the highest peak RSS of a Python worker
that wrote a partition; the JVM's peak RSS (``VmHWM``: in ``local[N]`` the driver and the
executors share it); entries written. The import is verified without collecting the state:
per state, the row count and an order-independent hash sum of Spark's export and of
``read_state`` of the savepoint (key, user key, value and expiry) must be equal.

    PYTHONPATH=. python -m benchmarks.import_spark --keys 1000000 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from pyspark.sql.streaming import StatefulProcessor


class Seed(StatefulProcessor):
    """Each key: a value, a list element and a map entry with TTLs, and a timer."""

    def init(self, handle) -> None:
        self.handle = handle
        self.val = handle.getValueState("val", "n BIGINT, pad STRING", 3_600_000)
        self.hist = handle.getListState("hist", "v BIGINT", 7_200_000)
        self.tags = handle.getMapState("tags", "t STRING", "c BIGINT", 10_800_000)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - PySpark's name
        n = 0
        for pdf in rows:
            n += len(pdf)
        self.val.update((n, "x" * 32))
        self.hist.appendValue((n,))
        self.tags.updateValue(("t",), (n,))
        self.handle.registerTimer(4_102_444_800_000)
        return iter([])

    def close(self) -> None:
        pass


def jvm_peak_mb() -> float | None:
    """VmHWM of the java processes this process started (the local Spark JVM)."""
    best = None
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if status.get("Name", "").strip() != "java":
            continue
        ppid = int(status.get("PPid", "0"))
        if ppid != me and not _descends(ppid, me):
            continue
        mb = int(status.get("VmHWM", "0 kB").split()[0]) / 1024
        best = mb if best is None else max(best, mb)
    return best


def _descends(pid: int, ancestor: int) -> bool:
    for _ in range(8):
        if pid in (0, 1):
            return False
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def _digest(df, cols):
    from pyspark.sql import functions as F

    r = df.agg(F.count(F.lit(1)).alias("n"),
               F.sum(F.hash(*cols).cast("decimal(38,0)")).alias("h")).collect()[0]
    return int(r["n"]), str(r["h"])


def _verify(spark, backend, ck: str, operator_id: str, savepoint: str) -> dict:
    from pyspark.sql import functions as F

    read = spark.read.format("statestore")
    theirs = {
        "val": read.option("stateVarName", "val").load(ck).select(
            F.col("key.k").alias("k"), F.lit(None).cast("string").alias("uk"),
            F.to_json(F.col("value.value")).alias("v"), F.col("value.ttlExpirationMs").alias("e")),
        "hist": read.option("stateVarName", "hist").option("flattenCollectionTypes", "true")
        .load(ck).select(F.col("key.k").alias("k"), F.lit(None).cast("string").alias("uk"),
                         F.to_json(F.col("list_element.value")).alias("v"),
                         F.col("list_element.ttlExpirationMs").alias("e")),
        "tags": read.option("stateVarName", "tags").load(ck).select(
            F.col("key.k").alias("k"), F.to_json(F.col("user_map_key")).alias("uk"),
            F.to_json(F.col("user_map_value.value")).alias("v"),
            F.col("user_map_value.ttlExpirationMs").alias("e")),
    }
    out = {}
    for name, df in theirs.items():
        ours = backend.read_state(spark, operator_id, state_name=name, savepoint=savepoint)
        structured = ours.schema["user_key"].dataType.typeName() == "struct"
        ours = ours.select(F.col("key.k").alias("k"),
                           (F.to_json(F.col("user_key")) if structured
                            else F.col("user_key").cast("string")).alias("uk"),
                           F.to_json(F.col("value")).alias("v"),
                           F.col("expiration_ms").alias("e"))
        a, b = _digest(df, ["k", "uk", "v", "e"]), _digest(ours, ["k", "uk", "v", "e"])
        out[name] = {"spark": a, "ours": b, "equal": a == b}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4,
                    help="shuffle partitions of Spark's query and of ours")
    ap.add_argument("--files", type=int, default=4, help="input files (micro-batches)")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write the figures to this file")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from statebackend import RocksDBStateBackend, StateBackendOptions
    from statebackend.task.import_spark import peak_rss_mb

    work = args.workdir or tempfile.mkdtemp(prefix="import-spark-")
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", args.driver_memory)
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    inp = os.path.join(work, "input")
    (spark.range(args.keys).select(F.concat(F.lit("key"), F.col("id").cast("string")).alias("k"),
                                   F.col("id").alias("x"))
     .repartition(args.files).write.parquet(inp))
    ck = os.path.join(work, "spark-ck")
    t0 = time.perf_counter()
    q = (spark.readStream.schema("k STRING, x BIGINT").option("maxFilesPerTrigger", 1)
         .parquet(inp).groupBy("k")
         .transformWithStateInPandas(Seed(), "k STRING", "Update", "ProcessingTime")
         .writeStream.format("noop").option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    build_s = time.perf_counter() - t0
    print(f"Spark's query built the state of {args.keys} keys in {build_s:.1f} s", flush=True)

    backend = RocksDBStateBackend(os.path.join(work, "state"), StateBackendOptions(
        parallelism=args.partitions, local_dir=os.path.join(work, "local")))
    before = peak_rss_mb()
    t0 = time.perf_counter()
    step = backend.import_spark_state(spark, ck, "seed")
    import_s = time.perf_counter() - t0
    after = peak_rss_mb()
    figures = {
        "keys": args.keys, "partitions": args.partitions, "spark_build_s": round(build_s, 1),
        "import_s": round(import_s, 1), "rows": step.rows, "entries": step.entries,
        "driver_python_peak_mb_before": round(before, 1),
        "driver_python_peak_mb_after": round(after, 1),
        "worker_peak_mb": round(step.worker_peak_mb, 1),
        "jvm_peak_mb": jvm_peak_mb(),
    }
    print(json.dumps(figures, indent=1), flush=True)
    t0 = time.perf_counter()
    figures["verify"] = _verify(spark, backend, ck, "seed", step.savepoint)
    figures["verify_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(figures["verify"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    spark.stop()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(v["equal"] for v in figures["verify"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
