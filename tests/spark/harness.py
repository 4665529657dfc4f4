"""Run the same stateful query on Spark's own operator and on ours, batch by batch."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pandas as pd
import pytest

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def never_ends_under_defaults(mode: str) -> bool:
    """Whether an ``availableNow`` query with an operator in this time mode (or with this
    timeout) never ends under Spark's defaults (no-data micro-batches on): in
    ``ProcessingTime`` mode Spark's own operator asks for a micro-batch after every one,
    and ours (the carrier, as for every operator with timers) does the same."""
    return str(mode) in ("ProcessingTime", "ProcessingTimeTimeout")


def no_data_off(spark):
    """A session of ``spark``'s application with no-data micro-batches off (a query takes
    its session's conf when it starts), for the queries of
    :func:`never_ends_under_defaults`."""
    session = spark.newSession()
    session.conf.set(NO_DATA_BATCHES, "false")
    return session


def recorded_plan(backend, operator_id: str, last_batch: int) -> str | None:
    """The plan (``placement``) recorded by the checkpoint of ``last_batch``, which Spark
    committed (the query ended), completed here rather than waiting for the listener."""
    backend.complete(operator_id, up_to=last_batch)
    latest = backend.coordinator(operator_id).latest()
    assert latest is not None and latest.checkpoint_id == last_batch
    return latest.placement


def write_batches(input_dir: str, batches: list[pd.DataFrame], start: int = 0) -> None:
    """One parquet file per micro-batch, named and dated in batch order.

    Spark's file source takes the oldest new file first (maxFilesPerTrigger=1) and breaks
    ties in listing order, so files written within one clock tick could be read out of
    order: each file gets a modification time one second after the previous one. Each
    file is written and dated under a hidden name (Spark skips names starting with ".")
    and renamed into place, so a query already running never lists a file before its
    date is set (it took batch 3's file, still dated "now", before batch 2's).
    """
    os.makedirs(input_dir, exist_ok=True)
    base = time.time()
    for i, pdf in enumerate(batches, start=start):
        name = f"part-{i:05d}.parquet"
        tmp = os.path.join(input_dir, "." + name)
        # Spark reads timestamps in microseconds, not pandas' nanoseconds
        pdf.to_parquet(tmp, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
        os.utime(tmp, (base + i, base + i))
        os.replace(tmp, os.path.join(input_dir, name))


def run_stream(spark, input_dir: str, schema: str, build: Callable, checkpoint_dir: str,
               watermark: tuple[str, str] | None = None, output_mode: str = "update",
               out: dict[int, pd.DataFrame] | None = None) -> dict[int, pd.DataFrame]:
    """Run ``build(stream_df) -> result_df`` over the files, one file per micro-batch; returns
    each micro-batch's output sorted, keyed by batch id (``out``: the dict to fill, which
    keeps the batches before a failure)."""
    out = {} if out is None else out
    _start(spark, input_dir, schema, build, checkpoint_dir, watermark, output_mode,
           out).awaitTermination()
    return out


def run_streams(spark, input_dir: str, schema: str, builds: dict[str, tuple[Callable, str]],
                watermark: tuple[str, str] | None = None, output_mode: str = "update"
                ) -> dict[str, dict[int, pd.DataFrame]]:
    """:func:`run_stream` of several queries over the same files, at the same time: ``builds``
    maps a name to ``(build, checkpoint_dir)``; returns each one's output by name. The
    queries share nothing but the session and the input (Spark's and ours side by side: a
    small micro-batch mostly waits on its driver, so two overlap well on two cores)."""
    outs: dict[str, dict[int, pd.DataFrame]] = {name: {} for name in builds}
    run_together([lambda name=name, build=build, ck=ck: _start(
        spark, input_dir, schema, build, ck, watermark, output_mode, outs[name])
        for name, (build, ck) in builds.items()])
    return outs


def run_together(starts: list[Callable]) -> None:
    """Start every query (each of ``starts`` starts one and returns it), then wait for all
    to end; whatever happens, stop those still active."""
    queries = []
    try:
        for start in starts:
            queries.append(start())
        for q in queries:
            q.awaitTermination()
    finally:
        for q in queries:
            if q.isActive:
                q.stop()


# the Futures of the jobs of tests/conftest.py's _jobs_started_early, by module name
_EARLY = pytest.StashKey[dict[str, Future]]()


def run_early(request, jobs: dict[str, Callable[[], Any]]) -> None:
    """Run ``jobs`` (module name -> job) one after another in a daemon thread; each one's
    Future is kept for :func:`early`."""
    futures = {name: Future() for name in jobs}
    request.config.stash[_EARLY] = futures

    def lane() -> None:
        for name, job in jobs.items():
            futures[name].set_running_or_notify_cancel()
            try:
                futures[name].set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                futures[name].set_exception(exc)

    threading.Thread(target=lane, daemon=True).start()


def early(request, module: str, timeout: float = 2400) -> Any:
    """What the job of ``module`` (its ``start_early``) returned, once it ended; what it
    raised (a failed assertion of the job fails the test that waits)."""
    return request.config.stash[_EARLY][module].result(timeout=timeout)


def killed_at_end(request) -> list[subprocess.Popen]:
    """A list for the processes a job starts: each still running at the end of the run
    (or of ``request``'s scope) is killed with whatever it started (:func:`kill_group`)."""
    procs: list[subprocess.Popen] = []
    request.addfinalizer(lambda: [kill_group(proc) for proc in procs])
    return procs


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a job started in a session of its own (``start_new_session``) with every
    process it started (its JVM), unless it already ended."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start(spark, input_dir, schema, build, checkpoint_dir, watermark, output_mode, out):
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_dir)
    if watermark is not None:
        df = df.withWatermark(*watermark)

    def collect(batch_df, batch_id):
        pdf = batch_df.toPandas()
        out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)

    return (build(df).writeStream.foreachBatch(collect).outputMode(output_mode)
            .option("checkpointLocation", checkpoint_dir).trigger(availableNow=True).start())


def assert_same(ours: dict[int, pd.DataFrame], theirs: dict[int, pd.DataFrame]) -> None:
    assert sorted(ours) == sorted(theirs), f"batches differ: {sorted(ours)} vs {sorted(theirs)}"
    for b in sorted(theirs):
        a = ours[b].astype({c: "int64" for c in ours[b].columns if c == "v"})
        e = theirs[b].astype({c: "int64" for c in theirs[b].columns if c == "v"})
        pd.testing.assert_frame_equal(a, e, check_dtype=False, obj=f"micro-batch {b}")


def assert_same_but_empty_batches(ours: dict[int, pd.DataFrame],
                                  theirs: dict[int, pd.DataFrame]) -> None:
    """:func:`assert_same`, except that Spark's run may have more micro-batches, after all
    of ours and each without output: the no-data micro-batches Spark's transformWithState
    without timers runs when the watermark advances (README "Known differences")."""
    extra = sorted(set(theirs) - set(ours))
    assert extra and min(extra) > max(ours), f"{sorted(ours)} vs {sorted(theirs)}"
    assert all(theirs[b].empty for b in extra), {b: theirs[b] for b in extra}
    assert_same(ours, {b: v for b, v in theirs.items() if b in ours})


def random_batches(n: int, seed: int, rows: int = 50, keys: int = 9) -> list[pd.DataFrame]:
    """``n`` micro-batches of (k, x, ts) rows over ``keys`` keys."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)],
                          "x": rng.integers(0, 10, rows).astype("int64"),
                          "ts": pd.Timestamp("2026-01-01")}) for _ in range(n)]


def running_counts(data: list[pd.DataFrame]) -> tuple[dict[int, pd.DataFrame], dict[str, int]]:
    """What RunningCount outputs per micro-batch in a failure-free run, and the final counts."""
    totals: dict[str, int] = {}
    out = {}
    for b, pdf in enumerate(data):
        counts = pdf.groupby("k").size()
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + int(n)
        out[b] = pd.DataFrame({"k": list(counts.index), "v": [totals[k] for k in counts.index]}
                              ).sort_values(["k", "v"]).reset_index(drop=True)
    return out, totals


def check_batches(ours: dict[int, pd.DataFrame], ref: dict[int, pd.DataFrame]) -> None:
    """Same micro-batches, each with the same rows (v compared as integers)."""
    assert sorted(ours) == sorted(ref)
    for b in ref:
        pd.testing.assert_frame_equal(ours[b].astype({"v": "int64"}), ref[b], check_dtype=False,
                                      obj=f"micro-batch {b}")


def watch_driver(monkeypatch, df_type, collected: list[int]) -> None:
    """Fail any whole-DataFrame transfer to this process; count the rows of collect()."""
    def refuse(self, *a, **k):
        raise AssertionError("the driver collected a DataFrame")

    real_collect = df_type.collect

    def collect(self, *a, **k):
        rows = real_collect(self, *a, **k)
        collected.append(len(rows))
        return rows

    for name in ("toPandas", "toArrow", "toLocalIterator", "take", "head", "tail"):
        monkeypatch.setattr(df_type, name, refuse)
    monkeypatch.setattr(df_type, "collect", collect)
