"""End-to-end demo: a stateful streaming job on local Spark with RocksDB state.

    python -m statebackend.demo                    # state in ./demo-state (a local directory)
    python -m statebackend.demo --state-url s3://bucket/demo --batches 20

It writes a deterministic event stream as files (one file per micro-batch), runs an
unmodified ``StatefulProcessor`` (a running count and sum per user) through
``RocksDBStateBackend.transform_with_state``, prints one progress line per micro-batch, and
checks at the end that the totals equal a pandas computation over all input. Interrupt it
(Ctrl-C) and run it again: Spark resumes from its checkpoint, the backend restores the
state of the last completed batch, and the totals still match.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

OUTPUT_SCHEMA = "user STRING, count BIGINT, total DOUBLE"
INPUT_SCHEMA = "user STRING, amount DOUBLE, ts TIMESTAMP"


class RunningTotals(StatefulProcessor):
    """Count and sum of ``amount`` per user; emits the new totals of every user seen."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", "count BIGINT, total DOUBLE")

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        count, total = 0, 0.0
        for pdf in rows:
            count += len(pdf)
            total += float(pdf["amount"].sum())
        old = self.totals.get()
        if old is not None:
            count += old[0]
            total += old[1]
        self.totals.update((count, total))
        yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})

    def close(self) -> None:
        pass


def make_events(batch: int, events: int, keys: int) -> pd.DataFrame:
    """The deterministic input of one micro-batch."""
    rng = np.random.default_rng(1000 + batch)
    users = rng.zipf(1.3, events) % keys
    return pd.DataFrame({
        "user": [f"user-{u:05d}" for u in users],
        "amount": np.round(rng.random(events) * 100, 2),
        "ts": pd.Timestamp("2026-01-01") + pd.to_timedelta(batch * 60 + rng.random(events) * 60, unit="s"),
    })


def write_input(input_dir: str, batches: int, events: int, keys: int) -> None:
    os.makedirs(input_dir, exist_ok=True)
    for b in range(batches):
        path = os.path.join(input_dir, f"events-{b:05d}.parquet")
        if not os.path.exists(path):
            tmp = path + ".tmp"
            # Spark reads microsecond timestamps, not pandas' default nanoseconds
            make_events(b, events, keys).to_parquet(tmp, index=False, coerce_timestamps="us",
                                                    allow_truncated_timestamps=True)
            os.replace(tmp, path)  # the file source must never see a half-written file
            # it reads the oldest file first: a second apart keeps the batches in order
            stamp = time.time() + b
            os.utime(path, (stamp, stamp))


def expected_totals(batches: int, events: int, keys: int) -> pd.DataFrame:
    allv = pd.concat([make_events(b, events, keys) for b in range(batches)])
    g = allv.groupby("user")["amount"].agg(["count", "sum"]).reset_index()
    return g.rename(columns={"sum": "total"}).sort_values("user").reset_index(drop=True)


def spark_session(master: str, partitions: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("statebackend-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")  # our own line per batch instead
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(partitions))
             .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m statebackend.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="demo-state", help="working directory of the demo (default ./demo-state)")
    ap.add_argument("--state-url", default=None, help="checkpoint location of the state (any fsspec URL; default <dir>/state)")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--events", type=int, default=20_000, help="events per micro-batch")
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--fresh", action="store_true", help="delete the demo directory first")
    args = ap.parse_args(argv)

    from statebackend import RocksDBStateBackend, StateBackendOptions

    base = os.path.abspath(args.dir)
    if args.fresh:
        shutil.rmtree(base, ignore_errors=True)
    input_dir = os.path.join(base, "input")
    state_url = args.state_url or os.path.join(base, "state")
    write_input(input_dir, args.batches, args.events, args.keys)

    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None  # embedded in a bigger program?
    spark = spark_session(args.master, args.partitions)
    backend = RocksDBStateBackend(state_url, StateBackendOptions(
        parallelism=args.partitions, local_dir=os.path.join(base, "local")))
    events = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
              .parquet(input_dir))
    out = backend.transform_with_state(events.groupBy("user"), RunningTotals(), OUTPUT_SCHEMA,
                                       "Update", "None", operator_id="running-totals")
    results_dir = os.path.join(base, "results")
    started = time.perf_counter()

    def on_batch(batch_df, batch_id: int) -> None:
        # idempotent per batch id: a replayed batch overwrites its own output file
        pdf = batch_df.toPandas()
        os.makedirs(results_dir, exist_ok=True)
        pdf.to_parquet(os.path.join(results_dir, f"batch-{batch_id:05d}.parquet"), index=False)
        backend.complete("running-totals")
        print(progress_line(backend, batch_id, pdf, started), flush=True)

    query = (out.writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", os.path.join(base, "spark-checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", flush=True)
        query.stop()
        return 130
    backend.complete("running-totals")
    ok = verify(results_dir, args)
    if own_session:
        spark.stop()
    return 0 if ok else 1


def progress_line(backend, batch_id: int, pdf: pd.DataFrame, started: float) -> str:
    try:
        info = backend.checkpoint_summary("running-totals", batch_id)
    except Exception as exc:  # the line is informative only; never fail the batch for it
        info = {"restore_sources": f"(no summary: {exc})"}
    parts = [f"batch {batch_id:>3}", f"out rows {len(pdf):>6}"]
    for label, key, fmt in (("events", "rows", "{:>7}"), ("keys in batch", "keys", "{:>6}"),
                            ("state", "full_size", "{:>9} B"),
                            ("uploaded", "bytes_uploaded", "{:>9} B"),
                            ("reused", "bytes_reused", "{:>9} B"),
                            ("sync", "sync_ms", "{:>5.0f} ms"), ("async", "async_ms", "{:>5.0f} ms"),
                            ("restore", "restore_sources", "{}")):
        if key in info:
            parts.append(f"{label} " + fmt.format(info[key]))
    parts.append(f"elapsed {time.perf_counter() - started:6.1f} s")
    return " | ".join(parts)


def verify(results_dir: str, args) -> bool:
    files = sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []
    frames = []
    for f in files:
        pdf = pd.read_parquet(os.path.join(results_dir, f))
        pdf["batch"] = int(f.split("-")[1].split(".")[0])
        frames.append(pdf)
    if not frames:
        print("no output yet")
        return False
    allout = pd.concat(frames)
    latest = (allout.sort_values(["user", "batch"]).groupby("user").tail(1)
              .sort_values("user").reset_index(drop=True))
    expected = expected_totals(args.batches, args.events, args.keys)
    same = (len(latest) == len(expected)
            and (latest["user"].to_numpy() == expected["user"].to_numpy()).all()
            and (latest["count"].to_numpy() == expected["count"].to_numpy()).all()
            and np.allclose(latest["total"].to_numpy(), expected["total"].to_numpy()))
    print(f"{len(latest)} users, {int(latest['count'].sum())} events counted; totals "
          f"{'match' if same else 'DO NOT match'} a pandas computation over all input")
    return bool(same)


if __name__ == "__main__":
    raise SystemExit(main())
