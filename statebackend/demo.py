"""End-to-end demo: a stateful streaming job on local Spark with RocksDB state.

    python -m statebackend.demo                    # state in ./demo-state (a local directory)
    python -m statebackend.demo --state-url s3://bucket/demo --batches 20

It writes a deterministic event stream as files (one file per micro-batch), runs an
unmodified ``StatefulProcessor`` (a running count and sum per user) through
``RocksDBStateBackend.transform_with_state``, prints one progress line per micro-batch, and
checks at the end that the totals equal a pandas computation over all input. Ctrl-C stops
the query cleanly (exit status 130) with one line naming the last committed batch; run the
same command again and it resumes from there: Spark from its checkpoint, the backend from
the state of that batch, and the totals still match. A second Ctrl-C exits at once.
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


def spark_session(master: str, partitions: int, remote: str | None = None):
    """The demo's session: classic on ``master``, or a Spark Connect session to ``remote``
    (``sc://host:port``, or ``local[N]`` for a local Connect server pyspark starts)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from statebackend.spark.jvm import start_jvm_detached

    # Spark's streaming defaults otherwise (no-data micro-batches on), as users run
    conf = {"spark.sql.shuffle.partitions": str(partitions)}
    if remote is not None:
        builder = SparkSession.builder.remote(remote)
        for k, v in conf.items():
            builder = builder.config(k, v)
        return builder.getOrCreate()
    conf.update({"spark.master": master, "spark.app.name": "statebackend-demo",
                 "spark.ui.enabled": "false",
                 "spark.ui.showConsoleProgress": "false",  # our own line per batch instead
                 "spark.driver.host": "127.0.0.1"})
    # Ctrl-C reaches only this process: Spark's Python workers would otherwise die
    # mid-task with a KeyboardInterrupt traceback each
    start_jvm_detached(conf)
    builder = SparkSession.builder
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m statebackend.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="demo-state", help="working directory of the demo (default ./demo-state)")
    ap.add_argument("--state-url", default=None, help="checkpoint location of the state (any fsspec URL; default <dir>/state)")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--events", type=int, default=20_000, help="events per micro-batch")
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--remote", default=None,
                    help="run on a Spark Connect session instead: sc://host:port, or local[N] "
                         "for a local Connect server (needs pip install 'pyspark[connect]')")
    ap.add_argument("--fresh", action="store_true", help="delete the demo directory first")
    return ap


def _batch_printer(backend, started: float):
    """``print_new_batches(query)``: one line per committed micro-batch not printed yet,
    printed by the waiting (main) thread."""
    printed: set[int] = set()

    def print_new_batches(query) -> None:
        for p in sorted(query.recentProgress, key=lambda p: p.batchId):
            if p.batchId not in printed and p.numInputRows > 0:
                printed.add(p.batchId)
                # the listener may not have run yet; a progress event means Spark
                # committed the micro-batch
                backend.complete("running-totals", up_to=p.batchId)
                print(progress_line(backend, p.batchId, p.sink.numOutputRows, started),
                      flush=True)
    return print_new_batches


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    from statebackend import RocksDBStateBackend, StateBackendOptions
    from statebackend.spark.listener import release
    from statebackend.supervisor import (
        EXIT_INTERRUPTED,
        InterruptGuard,
        await_query,
        committed_batches,
        interrupted_line,
    )

    base = os.path.abspath(args.dir)
    if args.fresh:
        shutil.rmtree(base, ignore_errors=True)
    input_dir = os.path.join(base, "input")
    state_url = args.state_url or os.path.join(base, "state")
    write_input(input_dir, args.batches, args.events, args.keys)

    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None  # embedded in a bigger program?
    spark = spark_session(args.master, args.partitions, args.remote)
    backend = RocksDBStateBackend(state_url, StateBackendOptions(
        parallelism=args.partitions, local_dir=os.path.join(base, "local")))
    events = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
              .parquet(input_dir))
    out = backend.transform_with_state(events.groupBy("user"), RunningTotals(), OUTPUT_SCHEMA,
                                       "Update", "None", operator_id="running-totals")
    output_dir = os.path.join(base, "output")
    started = time.perf_counter()
    print_new_batches = _batch_printer(backend, started)

    with InterruptGuard() as guard:
        # A file sink, not foreachBatch: the batch's Spark jobs then run in Spark's own
        # thread, and stopping on Ctrl-C cancels them cleanly (a job cancelled inside a
        # Python foreachBatch function fails that function with a long Java traceback).
        # The sink's log makes the output exactly-once across stops and reruns.
        query = (out.writeStream.format("parquet").option("path", output_dir)
                 .option("checkpointLocation", os.path.join(base, "spark-checkpoint"))
                 .trigger(availableNow=True).start())
        finished = await_query(query, guard, poll_s=0.25, on_poll=print_new_batches)
        print_new_batches(query)
        backend.complete("running-totals")
        if finished:
            ok = verify(spark, output_dir, args)
        else:
            latest = backend.coordinator("running-totals").latest()
            print(interrupted_line(committed_batches(
                {"running-totals": None if latest is None else latest.checkpoint_id},
                query)), flush=True)
        if own_session:
            release(spark)  # the listener goes before the session, so no listener errors
            spark.stop()
    if not finished:
        return EXIT_INTERRUPTED
    return 0 if ok else 1


def progress_line(backend, batch_id: int, out_rows: int, started: float) -> str:
    try:
        info = backend.checkpoint_summary("running-totals", batch_id)
    except Exception as exc:  # the line is informative only; never fail the batch for it
        info = {"restore_sources": f"(no summary: {exc})"}
    parts = [f"batch {batch_id:>3}"]
    if out_rows >= 0:  # -1: the sink did not count
        parts.append(f"out rows {out_rows:>6}")
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


def verify(spark, output_dir: str, args) -> bool:
    """The latest totals per user in the output equal a pandas computation over all input.

    Read through Spark so that only committed output counts (the sink's log ignores files
    of a batch that was stopped and ran again). Counts only grow: a user's latest row is
    the one with the largest count."""
    try:
        allout = spark.read.parquet(output_dir).toPandas()
    except Exception:  # noqa: BLE001 - no committed output yet: nothing to read
        allout = pd.DataFrame(columns=["user", "count", "total"])
    if not len(allout):
        print("no output yet")
        return False
    latest = (allout.sort_values(["user", "count"]).groupby("user").tail(1)
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
