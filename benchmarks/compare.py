"""Side by side on local Spark: our swap-ins against Spark's own state stores.

    python -m benchmarks.compare                  # every system and workload, small sizes (minutes)
    python -m benchmarks.compare --target         # issue target: count, 10,000 keys, 200,000 events
    python -m benchmarks.compare --large          # 1,000,000 keys, 5,000,000 events (ours + lower bound)
    python -m benchmarks.compare --workloads count --systems ours-tws,spark-tws --keys 1000

One invocation, one local[2] session. Systems (``--systems``, comma separated):

    lower              stateless mapInPandas (the lower bound: no state, no checkpoint)
    spark-tws          Spark transformWithStateInPandas, RocksDB provider
    spark-tws-cl       the same with changelog checkpointing
    spark-tws-row      Spark Row-based transformWithState, RocksDB provider
    spark-tws-row-cl   the same with changelog checkpointing
    spark-apply-hdfs   Spark applyInPandasWithState, HDFS-backed provider
    spark-apply-rocks  Spark applyInPandasWithState, RocksDB provider
    ours-tws           our transform_with_state (pandas flavour)
    ours-tws-row       our transform_with_state(flavour="row")
    ours-apply         our apply_in_pandas_with_state
    ours-map           our map_in_pandas with vectorised state
    ours-map-blocks    the same with the state in value blocks (value_blocks=16)

Workloads (``--workloads``; see ``benchmarks/workloads.py``): count, sessions (list state),
map (map state, many entries per key), timers (event-time timers with a watermark), noop
(a processor that does nothing: the framework's own cost). applyInPandasWithState and
map_in_pandas run ``count`` only; the lower bound runs every workload.

Each run reads the same file stream (one parquet file per micro-batch, availableNow) and
writes to a foreachBatch sink that counts the output. Measured per run: events/s (events
over the query's wall time, start to termination), p50/p95 micro-batch latency (Spark's
``triggerExecution``), durable bytes written per batch (new bytes under the state
checkpoint directory after each batch: ours = the backend's location, Spark's =
``<checkpointLocation>/state``), state size on disk at the end, and restart time (the query
is started again from its checkpoint with one more small file: the wall time of that
batch, restore included). Each figure also as a ratio to the lower bound and to Spark's
transformWithStateInPandas on the same workload. A progress line per run, a table, a JSON
file and PNG plots (``benchmarks/plots.py``; needs matplotlib, ``pip install .[bench]``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
ALL_WORKLOADS = ("count", "sessions", "map", "timers", "noop")
TWS_WORKLOADS = ALL_WORKLOADS
# noop measures framework cost: one reference per operator is enough
TWS_NO_NOOP = ("count", "sessions", "map", "timers")


@dataclass(frozen=True)
class System:
    """One thing to benchmark: which operator, which provider, which workloads."""

    name: str
    label: str
    workloads: tuple[str, ...]
    provider: str | None = None  # Spark state store provider (None: not Spark's state)
    changelog: bool = False
    ours: bool = False


SYSTEMS: tuple[System, ...] = (
    System("lower", "stateless mapInPandas", ALL_WORKLOADS),
    # keyed state needs its input shuffled by key; this bound pays that shuffle too
    System("lower-shuffled", "stateless mapInPandas after repartition by key", ("count",)),
    System("spark-tws", "Spark transformWithStateInPandas (RocksDB)", TWS_WORKLOADS, ROCKSDB),
    System("spark-tws-cl", "Spark transformWithStateInPandas (RocksDB+changelog)",
           TWS_NO_NOOP, ROCKSDB, True),
    System("spark-tws-row", "Spark transformWithState Row (RocksDB)", TWS_WORKLOADS, ROCKSDB),
    System("spark-tws-row-cl", "Spark transformWithState Row (RocksDB+changelog)",
           TWS_NO_NOOP, ROCKSDB, True),
    System("spark-apply-hdfs", "Spark applyInPandasWithState (HDFS)", ("count",), HDFS),
    System("spark-apply-rocks", "Spark applyInPandasWithState (RocksDB)", ("count",), ROCKSDB),
    System("ours-tws", "ours transform_with_state", TWS_WORKLOADS, ours=True),
    System("ours-tws-row", "ours transform_with_state Row", TWS_WORKLOADS, ours=True),
    System("ours-apply", "ours apply_in_pandas_with_state", ("count",), ours=True),
    System("ours-map", "ours map_in_pandas", ("count",), ours=True),
    System("ours-map-blocks", "ours map_in_pandas, value blocks", ("count",), ours=True),
)
BY_NAME = {s.name: s for s in SYSTEMS}
# the pairs the issue sets targets for: (ours, theirs, at least)
TARGETS = (("ours-tws", "spark-tws", 5.0), ("ours-tws-row", "spark-tws-row", 3.0),
           ("ours-apply", "spark-apply-rocks", 3.0), ("ours-map", "lower", 0.8),
           ("ours-map-blocks", "lower", 0.8))


def setup_env() -> None:
    """Make workers run this interpreter and import ``workloads`` by module name: the
    variables must be set before the SparkSession (and its Python workers) start."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


def dir_files(path: str) -> dict[str, int]:
    """Every file under ``path`` with its size (empty when ``path`` does not exist)."""
    out: dict[str, int] = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            try:
                out[p] = os.path.getsize(p)
            except OSError:  # deleted by retention while we walk
                pass
    return out


class ByteMeter:
    """Bytes written under a directory since the last call: new files plus files that
    changed size (deleted files do not count: writing is what costs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, int] = {}

    def delta(self) -> int:
        now = dir_files(self.path)
        new = sum(s for p, s in now.items() if self.seen.get(p) != s)
        self.seen.update(now)
        return new


OPTIONS: dict[str, str] = {}
"""``--option`` values: StateBackendOptions of our systems, by Spark key without the
``spark.statebackend.`` prefix (e.g. ``keep-instances-open``)."""


def build_query(system: System, workload: str, backend: Any) -> Callable:
    """The function ``df -> result df`` for ``system`` on ``workload``."""
    import workloads as W

    pandas_cls, row_cls, time_mode, _ = W.PROCESSORS[workload]
    op = f"{system.name}-{workload}"
    name = system.name
    if name == "lower":
        # the noop processor outputs nothing: so does its lower bound
        fn = W.drain if workload == "noop" else W.passthrough
        return lambda df: df.mapInPandas(fn, W.OUT)
    if name == "lower-shuffled":
        return lambda df: df.repartition("k").mapInPandas(W.passthrough, W.OUT)
    if name in ("spark-tws", "spark-tws-cl"):
        return lambda df: df.groupBy("k").transformWithStateInPandas(
            pandas_cls(), W.OUT, "Update", time_mode)
    if name in ("spark-tws-row", "spark-tws-row-cl"):
        return lambda df: df.groupBy("k").transformWithState(row_cls(), W.OUT, "Update", time_mode)
    if name.startswith("spark-apply"):
        return lambda df: df.groupBy("k").applyInPandasWithState(
            W.count_fn, W.OUT, "c BIGINT", "Update", "NoTimeout")
    if name == "ours-tws":
        return lambda df: backend.transform_with_state(
            df.groupBy("k"), pandas_cls(), W.OUT, "Update", time_mode, operator_id=op)
    if name == "ours-tws-row":
        return lambda df: backend.transform_with_state(
            df.groupBy("k"), row_cls(), W.OUT, "Update", time_mode, operator_id=op, flavour="row")
    if name == "ours-apply":
        return lambda df: backend.apply_in_pandas_with_state(
            df.groupBy("k"), W.count_fn, W.OUT, "c BIGINT", "Update", "NoTimeout", operator_id=op)
    if name in ("ours-map", "ours-map-blocks"):
        blocks = W.VALUE_BLOCKS if name == "ours-map-blocks" else None
        return lambda df: backend.map_in_pandas(df, "k", W.vector_count, W.OUT, "c BIGINT",
                                                operator_id=op, value_blocks=blocks,
                                                output_mode="Update")
    raise ValueError(f"unknown system {name!r}")


def start_query(spark, system: System, workload: str, build: Callable, input_dir: str,
                ck: str, sink: Callable):
    import workloads as W

    if system.provider is not None:
        # session confs are read when a query starts: set them per run
        spark.conf.set(PROVIDER_CONF, system.provider)
        spark.conf.set(CHANGELOG_CONF, "true" if system.changelog else "false")
    df = (spark.readStream.schema(W.INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
          .parquet(input_dir))
    if W.PROCESSORS[workload][3]:
        df = df.withWatermark(*W.WATERMARK)
    return (build(df).writeStream.foreachBatch(sink).outputMode("update")
            .option("checkpointLocation", ck).trigger(availableNow=True).start())


def trigger_ms(query) -> list[float]:
    out = []
    for p in query.recentProgress:
        d = p.durationMs if hasattr(p, "durationMs") else p["durationMs"]
        if d and "triggerExecution" in d:
            out.append(float(d["triggerExecution"]))
    return out


def run_one(spark, system: System, workload: str, input_dir: str, work: str, *,
            events: int, keys: int, batches: int, partitions: int,
            restart: bool = True) -> dict[str, Any]:
    """Run ``system`` on ``workload`` over the files in ``input_dir`` and measure it."""
    import workloads as W

    from statebackend import RocksDBStateBackend, StateBackendOptions

    tag = f"{system.name}-{workload}-{keys}"
    ck = os.path.join(work, "ck-" + tag)
    state_dir = os.path.join(work, "state-" + tag) if system.ours else os.path.join(ck, "state")
    backend = None
    if system.ours:
        backend = RocksDBStateBackend(state_dir, StateBackendOptions.from_spark_conf(
            {f"spark.statebackend.{k}": v for k, v in OPTIONS.items()},
            parallelism=partitions, local_dir=os.path.join(work, "local-" + tag)))
    build = build_query(system, workload, backend)
    meter = ByteMeter(state_dir)
    per_batch: list[int] = []
    rows = [0]

    def sink(batch_df, batch_id):
        rows[0] += batch_df.count()
        if system.provider is not None or system.ours:
            per_batch.append(meter.delta())

    t0 = time.perf_counter()
    q = start_query(spark, system, workload, build, input_dir, ck, sink)
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    lat = trigger_ms(q)
    size = sum(dir_files(state_dir).values()) if (system.provider or system.ours) else 0
    out: dict[str, Any] = {
        "system": system.name, "label": system.label, "workload": workload, "keys": keys,
        "events": events, "batches": len(lat), "seconds": seconds,
        "events_per_s": events / seconds,
        "p50_ms": float(np.percentile(lat, 50)) if lat else None,
        "p95_ms": float(np.percentile(lat, 95)) if lat else None,
        "bytes_per_batch": per_batch,
        "mean_bytes_per_batch": float(np.mean(per_batch)) if per_batch else 0.0,
        "state_bytes": size, "output_rows": rows[0], "restart_ms": None,
    }
    if system.ours:
        from statebackend.metrics_store import read_metrics
        from statebackend.storage import open_store

        sources: dict[str, int] = {}
        fallbacks: dict[str, int] = {}
        for line in read_metrics(open_store(state_dir), f"{system.name}-{workload}"):
            for k, v in (line.get("restore_sources") or {}).items():
                sources[k] = sources.get(k, 0) + int(v)
            for why in (line.get("restore_fallbacks") or {}).values():
                fallbacks[why] = fallbacks.get(why, 0) + 1
        out["restore_sources"] = sources  # tasks per restore source over the run
        out["restore_fallbacks"] = fallbacks  # why tasks passed over a faster source
    if restart:
        # one more small file: the batch that follows a restart pays the restore
        extra = os.path.join(work, "extra")
        shutil.rmtree(extra, ignore_errors=True)
        W.make_input(extra, keys, min(keys, 1000), 1, first_batch=batches)
        name = os.listdir(extra)[0]
        shutil.move(os.path.join(extra, name), os.path.join(input_dir, name))
        try:
            t1 = time.perf_counter()
            q2 = start_query(spark, system, workload, build, input_dir, ck, lambda b, i: b.count())
            q2.awaitTermination()
            lat2 = trigger_ms(q2)
            out["restart_ms"] = lat2[0] if lat2 else None
            out["restart_wall_ms"] = 1000 * (time.perf_counter() - t1)
        finally:
            os.remove(os.path.join(input_dir, name))
    return out


def median_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (system, workload, keys): events/s is the median over the runs (the
    mean of the middle two for an even count), every other figure comes from the run
    closest to it, and every run's events/s is kept beside it."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["system"], r["workload"], r["keys"]), []).append(r)
    out = []
    for same in groups.values():
        rates = [r["events_per_s"] for r in same]
        mid = float(np.median(rates))
        chosen = dict(min(same, key=lambda r: abs(r["events_per_s"] - mid)))
        chosen["events_per_s"] = mid
        chosen["runs_events_per_s"] = rates
        out.append(chosen)
    return out


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each figure as a ratio to the lower bound and to Spark's TWS (same workload, keys)."""
    figures = ("events_per_s", "p50_ms", "p95_ms", "mean_bytes_per_batch", "state_bytes",
               "restart_ms")
    index = {(r["system"], r["workload"], r["keys"]): r for r in results}
    for r in results:
        for ref_name, field in (("lower", "x_lower"), ("spark-tws", "x_spark_tws")):
            ref = index.get((ref_name, r["workload"], r["keys"]))
            r[field] = {f: (r[f] / ref[f]) if ref and r.get(f) and ref.get(f) else None
                        for f in figures}


def target_lines(results: list[dict[str, Any]]) -> list[str]:
    index = {(r["system"], r["workload"], r["keys"]): r for r in results}
    lines = []
    for r in results:
        if r["workload"] != "count":
            continue
        for ours, theirs, goal in TARGETS:
            if r["system"] != ours:
                continue
            ref = index.get((theirs, "count", r["keys"]))
            if ref:
                ratio = r["events_per_s"] / ref["events_per_s"]
                lines.append(f"count, {r['keys']:,} keys: {ours} / {theirs} = {ratio:.2f}x "
                             f"(target >= {goal}x: {'met' if ratio >= goal else 'NOT met'})")
    for r in results:
        if r["workload"] == "noop" and r["system"] in ("ours-tws", "spark-tws"):
            ref = index.get(("lower", "noop", r["keys"]))
            if ref and r.get("key_batches"):
                cost = (r["seconds"] - ref["seconds"]) / r["key_batches"] * 1e6
                r["framework_us_per_key_batch"] = cost
                lines.append(f"noop, {r['keys']:,} keys: {r['system']} costs {cost:,.0f} us per "
                             f"key per batch over the lower bound"
                             + (" (target < 50 us)" if r["system"] == "ours-tws" else ""))
    return lines


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return "-"


def table(results: list[dict[str, Any]]) -> str:
    head = (f"{'workload':9} {'keys':>9} {'system':18} {'events/s':>10} {'x lower':>8} "
            f"{'x TWS':>7} {'p50 ms':>8} {'p95 ms':>8} {'bytes/batch':>12} {'state':>10} "
            f"{'restart ms':>10} {'load':>5}")
    lines = [head, "-" * len(head)]
    for r in results:
        xl = r["x_lower"]["events_per_s"]
        xt = r["x_spark_tws"]["events_per_s"]
        restart = f"{r['restart_ms']:,.0f}" if r.get("restart_ms") else "-"
        lines.append(
            f"{r['workload']:9} {r['keys']:>9,} {r['system']:18} {r['events_per_s']:>10,.0f} "
            f"{(f'{xl:.2f}' if xl else '-'):>8} {(f'{xt:.2f}' if xt else '-'):>7} "
            f"{r['p50_ms'] or 0:>8,.0f} {r['p95_ms'] or 0:>8,.0f} "
            f"{fmt_bytes(r['mean_bytes_per_batch']):>12} {fmt_bytes(r['state_bytes']):>10} "
            f"{restart:>10} {r.get('load_avg_1m', 0):>5.1f}"
            + (f"  runs {min(r['runs_events_per_s']):,.0f}-{max(r['runs_events_per_s']):,.0f}"
               if len(r.get("runs_events_per_s", ())) > 1 else ""))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import pyspark

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return {"python": platform.python_version(), "pyspark": pyspark.__version__,
            "pandas": pd.__version__, "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_avg_start": load}


def unique_keys_per_batch(input_dir: str) -> int:
    """Sum over batches of the distinct keys in each batch (the per-key work units)."""
    total = 0
    for f in sorted(os.listdir(input_dir)):
        if f.endswith(".parquet"):
            total += pd.read_parquet(os.path.join(input_dir, f), columns=["k"])["k"].nunique()
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare",
                                 description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join((__doc__ or "").split("\n\n")[2:4]))
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--workloads", default="count,sessions,map,timers",
                    help=f"comma separated, out of {','.join(ALL_WORKLOADS)}")
    ap.add_argument("--systems", default="all",
                    help="comma separated system names, or all / ours / spark")
    ap.add_argument("--only", choices=["all", "ours", "spark"], default=None,
                    help="shorthand for --systems ours / spark (the lower bound is kept)")
    ap.add_argument("--sweep-keys", default="",
                    help="comma separated key counts: run the count workload at each one too "
                         "(for the throughput-vs-keys plot)")
    ap.add_argument("--no-restart", action="store_true", help="skip the restart measurement")
    ap.add_argument("--target", action="store_true",
                    help="the issue's target workload: count and noop, 10,000 keys, 200,000 "
                         "events, 10 batches")
    ap.add_argument("--large", action="store_true",
                    help="1,000,000 keys, 5,000,000 events, 10 batches, count, ours + lower "
                         "bound unless --systems says otherwise")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the whole plan this many times, interleaved, and report each "
                         "figure from the median run (a shared machine's noise is +-20%%)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of our systems by its Spark key without the "
                         "'spark.statebackend.' prefix, e.g. keep-instances-open=true "
                         "(repeatable)")
    ap.add_argument("--out", default="bench-out", help="directory for JSON and PNG files")
    ap.add_argument("--json", default=None, help="JSON path (default <out>/compare.json)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    OPTIONS.update(key_values(ap, "--option", args.option))
    if args.target:
        args.keys, args.events, args.batches = 10_000, 200_000, 10
        args.workloads = "count,noop"
    if args.large:
        args.keys, args.events, args.batches = 1_000_000, 5_000_000, 10
        args.workloads = "count"
        if args.systems == "all" and args.only is None:
            args.systems = "lower,ours-tws,ours-apply,ours-map,ours-map-blocks"
    if args.only:
        args.systems = args.only
    return args


def select_systems(spec: str) -> list[System]:
    if spec == "all":
        return list(SYSTEMS)
    if spec in ("ours", "spark"):
        return [s for s in SYSTEMS if s.name == "lower" or s.name.startswith(spec)]
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {list(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def start_session(app: str, partitions: int, ui_port: int | None = None,
                  master: str | None = None, conf: dict[str, str] | None = None):
    """The local[partitions] session every benchmark command runs in (the same confs, so
    their figures compare; Spark's streaming defaults, no-data micro-batches on, as users
    run); ``ui_port``: keep Spark's UI and REST API on that loopback port;
    ``master`` (e.g. ``local-cluster[2,1,1024]``) and ``conf`` for cluster benchmarks."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master or f"local[{partitions}]").appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(partitions))
               .config(PROVIDER_CONF, ROCKSDB))
    if ui_port is None:
        builder = builder.config("spark.ui.enabled", "false")
    else:
        builder = (builder.config("spark.ui.enabled", "true")
                   .config("spark.ui.port", str(ui_port))
                   .config("spark.ui.retainedStages", "100000")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def key_values(ap: argparse.ArgumentParser, flag: str, items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments of ``flag`` as a dict (a malformed one: the parser's error)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in workloads if w not in ALL_WORKLOADS]
    if bad:
        raise SystemExit(f"unknown workloads {bad}; choose from {list(ALL_WORKLOADS)}")
    systems = select_systems(args.systems)
    sweep = [int(k) for k in args.sweep_keys.split(",") if k.strip()]
    setup_env()
    import workloads as W

    spark = start_session("statebackend-compare", args.partitions)
    work = tempfile.mkdtemp(prefix="sb-compare-")
    plan: list[tuple[int, str, System]] = []
    for wl in workloads:
        plan += [(args.keys, wl, s) for s in systems if wl in s.workloads]
    for k in sweep:
        if k != args.keys:
            plan += [(k, "count", s) for s in systems if "count" in s.workloads]
    info = machine()
    print(f"statebackend compare: {len(plan) * args.repeat} runs, local[{args.partitions}], "
          f"{args.events:,} events in {args.batches} batches; load {info['load_avg_start'][0]:.1f}",
          flush=True)
    inputs: dict[int, tuple[str, int]] = {}

    def input_for(keys: int) -> tuple[str, int]:
        if keys not in inputs:
            d = os.path.join(work, f"input-{keys}")
            W.make_input(d, keys, args.events, args.batches)
            inputs[keys] = (d, unique_keys_per_batch(d))
        return inputs[keys]

    # warm up the JVM and the Python workers (imports) on a tiny input; not reported
    warm = os.path.join(work, "input-warm")
    W.make_input(warm, 100, 2_000, 2)
    for name in ("lower", "spark-tws", "ours-tws"):
        if any(s.name == name for s in systems):
            run_one(spark, BY_NAME[name], "count", warm, os.path.join(work, "warm"), events=2_000,
                    keys=100, batches=2, partitions=args.partitions, restart=False)
    runs = []
    total = len(plan) * args.repeat
    try:
        # rounds run the whole plan in turn, so a slow phase of the machine hits every system
        for i, (rnd, (keys, wl, system)) in enumerate(
                ((rnd, item) for rnd in range(args.repeat) for item in plan), 1):
            input_dir, key_batches = input_for(keys)
            r = run_one(spark, system, wl, input_dir, os.path.join(work, f"round-{rnd}"),
                        events=args.events, keys=keys, batches=args.batches,
                        partitions=args.partitions, restart=not args.no_restart)
            r["key_batches"] = key_batches
            r["load_avg_1m"] = os.getloadavg()[0]  # a shared machine: say how busy it was
            runs.append(r)
            print(f"[{i}/{total}] {wl:8} {keys:>9,} keys  {system.name:18} "
                  f"{r['events_per_s']:>10,.0f} events/s  {r['seconds']:6.1f} s  "
                  f"p50 {r['p50_ms'] or 0:,.0f} ms  p95 {r['p95_ms'] or 0:,.0f} ms  "
                  f"{fmt_bytes(r['mean_bytes_per_batch'])}/batch  "
                  f"state {fmt_bytes(r['state_bytes'])}  "
                  f"restart {r['restart_ms'] or 0:,.0f} ms  load {r['load_avg_1m']:.1f}"
                  + (f"  restores {r['restore_sources']}" if r.get("restore_sources") else ""),
                  flush=True)
            for why, n in sorted((r.get("restore_fallbacks") or {}).items()):
                print(f"      {n} task(s) fell back: {why}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    results = median_runs(runs)
    add_ratios(results)
    targets = target_lines(results)
    print()
    print(table(results))
    if targets:
        print()
        print("\n".join(targets))
    info["load_avg_end"] = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    path = args.json or os.path.join(args.out, "compare.json")
    with open(path, "w") as fh:
        json.dump({"args": vars(args), "machine": info, "results": results,
                   "targets": targets}, fh, indent=1)
    print(f"\nJSON written to {path}")
    try:
        from plots import plot_compare
    except ImportError:  # matplotlib missing
        print("plots skipped: pip install 'statebackend[bench]' for matplotlib")
    else:
        for png in plot_compare(path, args.out):
            print(f"plot written to {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
