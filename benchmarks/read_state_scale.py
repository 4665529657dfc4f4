"""``read_state`` on a large state: one Spark task per partition against the driver reader.

    python -m benchmarks.read_state_scale                       # 1,000,000 keys, 8 partitions
    python -m benchmarks.read_state_scale --keys 100000 --repeat 1

Builds (once, kept in ``--workdir``) one completed checkpoint of ``--keys`` bigint keys with
a ``v BIGINT, s STRING`` value state in ``--partitions`` partitions, written by the
``map_in_pandas`` partition task run in this process (as ``benchmarks/large_state.py``
does), then reads it ``--repeat`` times each way, every read in a fresh process with its own
SparkSession (``--master``, default local[2]):

- ``driver``: ``read_state(..., distributed=False)``: every partition downloaded and
  decoded on the driver, the rows sent to Spark from there (the reader before issue 26);
- ``distributed``: ``read_state(...)``: one task per partition reads it on an executor.

The typed state is read (``state_name``); ``--json-values`` reads every state with values as
JSON text (the JSON encoding then costs more than the reading).

Each read is forced with ``df.write.format("noop")`` (every row computed, nothing
written). Per read: seconds from the call to the end of the write, the driver Python
process's peak RSS (``VmHWM``) and its RSS before the read (after Spark started), and
the JVM's peak RSS (``VmHWM``; in local mode the executors live in that JVM too).
Prints the median of each figure and writes ``read_state_scale.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd

OP = "scale"
MAXP = 128


def build(workdir: str, keys: int, partitions: int) -> str:
    """One completed checkpoint of ``keys`` keys under ``workdir/durable`` (reused)."""
    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.local import resident
    from statebackend.options import StateBackendOptions
    from statebackend.spark.plan import KG_COL, KeySpec
    from statebackend.storage import open_store
    from statebackend.task import runner
    from statebackend.task.context import PTIME_COL, OperatorConfig
    from statebackend.task.vector import vector_process

    durable = os.path.join(workdir, "durable")
    marker = os.path.join(workdir, f"built-{keys}-{partitions}")
    if os.path.exists(marker):
        return durable
    opts = StateBackendOptions(parallelism=partitions, max_parallelism=MAXP,
                               local_dir=os.path.join(workdir, "local"))
    config = OperatorConfig(operator_id=OP, checkpoint_location=durable, storage_options={},
                            options=opts,
                            parallelism=partitions, key=KeySpec(("k",), ("bigint",)))

    def put(frames, state):
        for pdf in frames:
            state.put(pdf[["k"]].reset_index(drop=True),
                      pd.DataFrame({"v": pdf["k"].to_numpy() * 3,
                                    "s": pdf["k"].astype(str).to_numpy()}))
        return iter(())

    process = vector_process(put, config, "v BIGINT, s STRING", None, None)
    from statebackend.keys.groups import key_groups

    all_keys = np.arange(keys, dtype=np.int64) * 7919 + 13
    kg = np.asarray(key_groups([all_keys], ["bigint"], MAXP), dtype=np.int32)
    part = (kg.astype(np.int64) * partitions // MAXP).astype(np.int32)
    coord = CheckpointCoordinator(open_store(durable), OP, partitions, MAXP, num_retained=1)
    original = runner.task_identity
    try:
        for p in range(partitions):
            sel = part == p
            k = all_keys[sel]
            frame = pd.DataFrame({"k": k, KG_COL: kg[sel],
                                  PTIME_COL: np.full(len(k), 1_700_000_000_000, np.int64)})
            runner.task_identity = lambda _c, _partition, p=p: (0, p, f"build-p{p}")
            for _ in runner.run_partition(config, iter([frame]), process):
                pass
        if coord.try_complete(0) is None:
            raise RuntimeError("checkpoint 0 did not complete")
    finally:
        runner.task_identity = original
        resident.close_all()
        coord.close()
    open(marker, "w").close()
    return durable


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def read_once(durable: str, mode: str, master: str, driver_memory: str,
              json_values: bool) -> dict[str, Any]:
    """One read in this (fresh) process: its time and memory figures."""
    from pyspark.sql import SparkSession

    from statebackend.spark.readers import read_state

    spark = (SparkSession.builder.master(master).appName(f"read-state-{mode}")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", driver_memory).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(10).count()  # start the executors and Python workers before timing
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    rss_before = _rss_now()
    t0 = time.perf_counter()
    state = None if json_values else "columnState"  # the state map_in_pandas declares
    df = read_state(spark, durable, OP, state_name=state, distributed=(mode == "distributed"))
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    rows = None
    if mode == "distributed":  # the same rows both ways (counted outside the timing)
        rows = df.count()
    out = {"mode": mode, "seconds": seconds, "partitions": df.rdd.getNumPartitions(),
           "driver_rss_before_bytes": rss_before,
           # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent that
           # forked this process (which built the state: hundreds of MiB)
           "driver_peak_rss_bytes": _vm_hwm(os.getpid()),
           "jvm_peak_rss_bytes": _vm_hwm(jvm_pid), "rows": rows}
    spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.read_state_scale")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--modes", default="distributed,driver")
    ap.add_argument("--json-values", action="store_true",
                    help="read every state (values as JSON text) instead of the typed state")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sb-read-scale"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    durable = os.path.join(args.workdir, "durable")
    if args.child:
        print(json.dumps(read_once(durable, args.child, args.master, args.driver_memory,
                                   args.json_values)))
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.perf_counter()
    build(args.workdir, args.keys, args.partitions)
    print(f"state of {args.keys:,} keys in {args.partitions} partitions: "
          f"{time.perf_counter() - t0:.1f}s (0 if reused)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes.split(",")}
    # the Spark workers import this checkout's statebackend, as the driver does
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                         if p)}
    for i in range(args.repeat):
        for mode in runs:  # alternate, so load on the machine hits both alike
            res = subprocess.run([sys.executable, "-m", "benchmarks.read_state_scale",
                                  "--workdir", args.workdir, "--master", args.master,
                                  "--driver-memory", args.driver_memory, "--child", mode,
                                  *(["--json-values"] if args.json_values else [])],
                                 check=True, capture_output=True, text=True, env=env)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            runs[mode].append(r)
            print(f"  run {i + 1} {mode}: {r['seconds']:.1f}s, driver peak "
                  f"{r['driver_peak_rss_bytes'] / 2**20:.0f} MiB (before read "
                  f"{r['driver_rss_before_bytes'] / 2**20:.0f} MiB), JVM peak "
                  f"{r['jvm_peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    summary = {}
    for mode, rs in runs.items():
        summary[mode] = {k: float(np.median([r[k] for r in rs]))
                         for k in ("seconds", "driver_peak_rss_bytes",
                                   "driver_rss_before_bytes", "jvm_peak_rss_bytes")}
        s = summary[mode]
        print(f"{mode:>12}: median {s['seconds']:.1f}s, driver peak "
              f"{s['driver_peak_rss_bytes'] / 2**20:.0f} MiB, JVM peak "
              f"{s['jvm_peak_rss_bytes'] / 2**20:.0f} MiB ({len(rs)} runs)")
    with open(os.path.join(args.out, "read_state_scale.json"), "w") as fh:
        json.dump({"args": vars(args), "runs": runs, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
