"""Where a micro-batch's time goes inside Spark, per system, for the count workload.

    python -m benchmarks.spark_stages                                  # lower vs ours-map, 100,000 keys, 2M events
    python -m benchmarks.spark_stages --systems lower,lower-shuffled,ours-map --repeat 3
    python -m benchmarks.spark_stages --systems lower,ours-map,ours-map-blocks   # value blocks
    python -m benchmarks.spark_stages --systems lower,ours-tws-row --keys 10000 --events 200000
    python -m benchmarks.spark_stages --systems ours-map-blocks --placement shuffle,carrier

``benchmarks.compare`` says how fast each system is; this says why. For every run it
prints, besides events/s:

* Spark's own trigger phases (``durationMs`` of the query progress: addBatch, planning,
  offset and commit logs), mean per micro-batch;
* every Spark stage of the run from Spark's REST API (the UI on a loopback port),
  grouped by task count, with mean wall time and executor run/CPU time per stage: the
  placement shuffle shows up as a one-task map stage before the operator's stage;
* for our systems, the medians of what each task recorded in its partition manifest:
  ``task_ms`` (input, restore, group, process, flush) and the checkpoint's sync and
  async parts.

Systems are the names of ``benchmarks.compare``; rounds (``--repeat``) run the systems in
turn so that a slow phase of the machine hits all of them. ``--placement`` runs each of our
systems once per plan (``StateBackendOptions.placement``), in turn within a round; its
summary line per run (stages, tasks, executor CPU per micro-batch) is the carrier's cost
in Spark's own counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import urllib.request
from datetime import datetime
from typing import Any

import numpy as np

from . import compare as C
from .bench_task import manifest_timings

UI_PORT = 4077


def stage_rows(app_url: str, seen: set[int]) -> list[dict[str, Any]]:
    """Completed stages not reported before (their ids are added to ``seen``)."""
    with urllib.request.urlopen(f"{app_url}/stages?status=complete") as resp:
        stages = json.load(resp)
    fresh = [s for s in stages if s["stageId"] not in seen]
    seen.update(s["stageId"] for s in fresh)
    return fresh


def _wall_ms(stage: dict[str, Any]) -> float | None:
    def parse(t: str) -> datetime:
        return datetime.strptime(t.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")

    if not stage.get("submissionTime") or not stage.get("completionTime"):
        return None
    return (parse(stage["completionTime"]) - parse(stage["submissionTime"])).total_seconds() * 1000


def summarise_stages(stages: list[dict[str, Any]]) -> list[str]:
    by_tasks: dict[int, list[dict[str, Any]]] = {}
    for s in stages:
        by_tasks.setdefault(int(s["numTasks"]), []).append(s)
    lines = []
    for n, group in sorted(by_tasks.items()):
        walls = [w for w in map(_wall_ms, group) if w is not None]
        run = np.mean([s.get("executorRunTime", 0) for s in group])
        cpu = np.mean([s.get("executorCpuTime", 0) for s in group]) / 1e6
        shuffle = np.mean([s.get("shuffleWriteBytes", 0) for s in group])
        lines.append(f"    {len(group):3d} stages of {n} task(s): wall {np.mean(walls):7.1f} ms, "
                     f"executor run {run:7.1f} ms, JVM CPU {cpu:6.1f} ms, "
                     f"shuffle write {shuffle / 1024:8.1f} kB per stage")
    return lines


def per_batch(stages: list[dict[str, Any]], batches: int) -> str:
    """Stages, tasks and executor time of a run, per micro-batch."""
    tasks = sum(int(s["numTasks"]) for s in stages)
    run = sum(s.get("executorRunTime", 0) for s in stages)
    cpu = sum(s.get("executorCpuTime", 0) for s in stages) / 1e6
    shuffle = sum(s.get("shuffleWriteBytes", 0) for s in stages)
    return (f"  per micro-batch: {len(stages) / batches:.1f} stages, {tasks / batches:.1f} "
            f"tasks, executor run {run / batches:.0f} ms, JVM CPU {cpu / batches:.0f} ms, "
            f"shuffle write {shuffle / batches / 1024:.0f} kB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spark_stages",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--systems", default="lower,ours-map")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--placement", default="shuffle",
                    help="comma separated plans of our systems: shuffle, carrier")
    args = ap.parse_args(argv)
    systems = C.select_systems(args.systems)
    bad = [s.name for s in systems if "count" not in s.workloads]
    if bad:
        ap.error(f"systems without the count workload: {bad}")
    C.setup_env()
    import workloads as W

    from statebackend import RocksDBStateBackend, StateBackendOptions

    spark = C.start_session("statebackend-spark-stages", args.partitions, UI_PORT)
    ui = spark.sparkContext.uiWebUrl or f"http://127.0.0.1:{UI_PORT}"
    app_url = f"{ui}/api/v1/applications/{spark.sparkContext.applicationId}"
    work = tempfile.mkdtemp(prefix="sb-stages-")
    seen: set[int] = set()
    try:
        warm = os.path.join(work, "warm")
        W.make_input(warm, 100, 2_000, 2)
        inp = os.path.join(work, "input")
        W.make_input(inp, args.keys, args.events, args.batches)
        print(f"{args.events:,} events over {args.keys:,} keys in {args.batches} batches, "
              f"local[{args.partitions}]; load {os.getloadavg()[0]:.1f}", flush=True)
        placements = [p.strip() for p in args.placement.split(",") if p.strip()]
        runs = [(system, placement) for system in systems
                for placement in (placements if system.ours else [None])]
        for rnd in range(-1, args.repeat):  # round -1 warms every system up on tiny input
            for system, placement in runs:
                tag = f"{system.name}-{placement}-{rnd}"
                state_dir = os.path.join(work, "state-" + tag)
                backend = (RocksDBStateBackend(state_dir, StateBackendOptions(
                    parallelism=args.partitions, local_dir=os.path.join(work, "local-" + tag),
                    placement=placement)) if system.ours else None)
                build = C.build_query(system, "count", backend)
                t0 = time.perf_counter()
                q = C.start_query(spark, system, "count", build, warm if rnd < 0 else inp,
                                  os.path.join(work, "ck-" + tag), lambda b, i: b.count())
                q.awaitTermination()
                seconds = time.perf_counter() - t0
                stages = stage_rows(app_url, seen)
                if rnd < 0:
                    continue
                phases: dict[str, list[float]] = {}
                for p in q.recentProgress:
                    for k, v in (p.durationMs or {}).items():
                        phases.setdefault(k, []).append(float(v))
                name = system.name + (f" ({placement})" if placement else "")
                print(f"\n[round {rnd + 1}] {name}: {args.events / seconds:,.0f} events/s "
                      f"({seconds:.1f} s), load {os.getloadavg()[0]:.1f}")
                print("  trigger phases, mean ms per batch: " + ", ".join(
                    f"{k} {np.mean(v):.0f}" for k, v in sorted(phases.items())))
                print("  stages:")
                print("\n".join(summarise_stages(stages)))
                print(per_batch(stages, args.batches))
                if system.ours:
                    t = manifest_timings(state_dir, f"{system.name}-count", args.partitions)
                    print("  per task, median ms: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
