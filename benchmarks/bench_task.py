"""The task side without Spark: the framework's own cost per key, and where it goes.

    python benchmarks/bench_task.py                      # stage table, noop and count
    python benchmarks/bench_task.py --keys 10000 --rows 20000 --batches 10
    python benchmarks/bench_task.py --profile count      # cProfile of the whole task, top 30
    python benchmarks/bench_task.py --keys 50000 --rows 100000 --workloads vector  # map_in_pandas
    python -m pytest benchmarks/bench_task.py --benchmark-enable

What one Spark task of ours does for one partition and one micro-batch
(``statebackend.task.runner.run_partition``) runs here on a pandas frame shaped like the
one Spark hands it (key, value, key-group and processing-time columns), against a local
checkpoint location: restore b-1, group by key, run the processor, checkpoint b, close,
concatenate the output. Only the Spark task identity is patched in (there is no
TaskContext outside Spark). Figures are per key per batch, so they compare directly with
Spark's 1-2 ms per key per batch and with the 50 us target for a processor that does
nothing. The stage table times the pieces separately on the same data.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

from statebackend.options import StateBackendOptions  # noqa: E402
from statebackend.rocksdb.instance import RocksDBInstance  # noqa: E402
from statebackend.spark.plan import KeySpec  # noqa: E402
from statebackend.state.backend import KeyedStateBackend  # noqa: E402
from statebackend.task import runner  # noqa: E402
from statebackend.task.context import (  # noqa: E402
    DEFAULT_FRAME_ROWS,
    PTIME_COL,
    BatchContext,
    OperatorConfig,
    decode_key,
    group_by_key,
)
from statebackend.task.processor import run_processor  # noqa: E402
from statebackend.task.vector import vector_config, vector_process  # noqa: E402

SPEC = KeySpec(("k",), ("string",))
MAXP = 128


def make_batch(keys: int, rows: int, seed: int) -> pd.DataFrame:
    """One partition's input for one micro-batch, with the column our plan adds (string
    keys: no key-group column, the task computes key groups itself)."""
    rng = np.random.default_rng(seed)
    names = np.array([f"key-{i:07d}" for i in range(keys)], dtype=object)
    k = names[rng.integers(0, keys, rows)]
    return pd.DataFrame({"k": k, "x": rng.integers(0, 100, rows).astype("int64"),
                         PTIME_COL: np.full(rows, 1_700_000_000_000, dtype="int64")})


def config_for(location: str, local: str, op: str) -> OperatorConfig:
    # one partition owning every key group: the whole key space in one task
    opts = StateBackendOptions(parallelism=1, max_parallelism=MAXP, local_dir=local)
    return OperatorConfig(operator_id=op, checkpoint_location=location, storage_options={},
                          options=opts, parallelism=1, key=SPEC)


# per-key workloads run a StatefulProcessor; "vector" is map_in_pandas's running count,
# "vector-blocks" the same with the state in value blocks (VECTOR_BLOCKS per key group)
PROCESSORS = {"noop": W.NoOp, "count": W.RunningCount, "sessions": W.Sessions, "map": W.MapCounts}
WORKLOADS = (*PROCESSORS, "vector", "vector-blocks")
VECTOR_BLOCKS = W.VALUE_BLOCKS
FRAME_ROWS: int | None = DEFAULT_FRAME_ROWS  # map_in_pandas's frame_rows


def task_process(workload: str, config: OperatorConfig) -> tuple[OperatorConfig, Callable]:
    """What the backend hands the runner for ``workload``: ``transform_with_state``'s
    (pandas flavour) or ``map_in_pandas``'s, with the config it runs under."""
    if workload in ("vector", "vector-blocks"):
        config = vector_config(config, FRAME_ROWS)
        return config, vector_process(W.vector_count, config, "c BIGINT",
                                      VECTOR_BLOCKS if workload == "vector-blocks" else None)
    processor_cls = PROCESSORS[workload]

    def process(backend, groups, ctx, decode):
        return run_processor(processor_cls(), backend, groups, ctx, "None", decode)
    return config, process


SPARK_BATCH_ROWS = 10_000
"""Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch`` default: a task's input arrives
in frames of this many rows."""


def arrow_batches(pdf: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """``pdf`` in the frames Spark would hand the task."""
    for i in range(0, max(len(pdf), 1), SPARK_BATCH_ROWS):
        yield pdf.iloc[i:i + SPARK_BATCH_ROWS].reset_index(drop=True)


def run_batches(workdir: str, workload: str, batches: list[pd.DataFrame],
                profile: cProfile.Profile | None = None) -> list[float]:
    """Run ``run_partition`` for each batch in turn (batch ids 0..n-1); seconds per batch."""
    config = config_for(os.path.join(workdir, "durable"), os.path.join(workdir, "local"),
                        f"bench-{workload}")
    config, process = task_process(workload, config)
    original = runner.task_identity
    times = []
    try:
        for b, pdf in enumerate(batches):
            runner.task_identity = lambda _c, _partition, b=b: (b, 0, f"bench-{b}")
            t0 = time.perf_counter()
            if profile is not None:
                profile.enable()
            for _ in runner.run_partition(config, arrow_batches(pdf), process):
                pass
            if profile is not None:
                profile.disable()
            times.append(time.perf_counter() - t0)
    finally:
        runner.task_identity = original
    return times


def stages(workdir: str, processor_cls: type, pdf: pd.DataFrame, repeat: int = 3
           ) -> dict[str, float]:
    """Seconds of each piece of the per-key path on one batch (best of ``repeat``)."""
    inst = RocksDBInstance(os.path.join(workdir, f"stages-{processor_cls.__name__}"))
    backend = KeyedStateBackend(inst, clock=lambda: 0)
    ctx = BatchContext(1, 0, 0, -1, None)
    body = pdf.drop(columns=[PTIME_COL])
    best: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*fn_args)
        dt = time.perf_counter() - t0
        best[name] = min(best.get(name, dt), dt)
        return out

    def decode(k: bytes) -> tuple:
        return decode_key(k, SPEC)

    def slices(groups: Any) -> list:
        return [groups.rows(i) for i in range(len(groups))]

    def set_keys(groups: Any) -> None:
        for i in range(len(groups)):
            backend.set_current_key(groups.key_bytes[i])

    groups: Any = None
    try:
        for _ in range(repeat):
            groups = timed("group_by_key", group_by_key, body, SPEC, None, MAXP)
            out = timed("run_processor", run_processor, processor_cls(), backend, groups, ctx,
                        "None", decode)
            timed("flush", backend.flush)
            if out:
                timed("concat_frames", runner.concat_frames, out)
            else:
                best.setdefault("concat_frames", 0.0)
            # pieces of run_processor that are ours, without any processor call
            timed("slices_only", slices, groups)
            timed("set_current_key", set_keys, groups)
        best["keys"] = float(len(groups))
    finally:
        inst.close()
    return best


def report(args: argparse.Namespace) -> None:
    workdir = tempfile.mkdtemp(prefix="sb-bench-task-")
    try:
        batches = [make_batch(args.keys, args.rows, seed) for seed in range(args.batches)]
        keys_per_batch = [b["k"].nunique() for b in batches]
        print(f"{args.keys:,} keys, {args.rows:,} rows per batch ({np.mean(keys_per_batch):,.0f} "
              f"distinct keys per batch), {args.batches} batches, one task per batch; "
              f"load {os.getloadavg()[0]:.1f}")
        for name in args.workloads:
            times = run_batches(os.path.join(workdir, name), name, batches)
            steady = times[1:] or times
            per_key = [t / k for t, k in zip(times, keys_per_batch)][1:] or [times[0]]
            print(f"\n{name}: whole task (restore, group, process, checkpoint, close, concat): "
                  f"median {1000 * float(np.median(steady)):.1f} ms per batch = "
                  f"{1e6 * float(np.median(per_key)):.1f} us per key per batch, "
                  f"{args.rows / float(np.median(steady)):,.0f} rows/s")
            print("  the task's own timings (manifests' task_ms and checkpoint, median ms): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in
                              manifest_timings(os.path.join(workdir, name, "durable"),
                                               f"bench-{name}", first_batch=1).items()))
            if name not in PROCESSORS:
                continue
            st = stages(workdir, PROCESSORS[name], batches[-1])
            nk = st.pop("keys")
            for stage, sec in st.items():
                print(f"  {stage:16} {1000 * sec:8.1f} ms  {1e6 * sec / nk:7.2f} us/key")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def manifest_timings(location: str, operator_id: str, partitions: int = 1,
                     first_batch: int = 0) -> dict[str, float]:
    """Medians, over every published manifest of ``operator_id`` under ``location`` from
    ``first_batch`` on, of what the tasks recorded: ``task_ms`` and the checkpoint's sync
    and async parts (ms)."""
    from statebackend.storage import open_store
    from statebackend.storage.manifests import list_published_manifests, operator_store
    from statebackend.storage.records import listed_records

    root = open_store(location)
    store = operator_store(root, operator_id)
    rows: dict[str, list[float]] = {}
    # Under Spark, retention deletes old checkpoints' manifests: read the completed ones
    # still there. Without a coordinator (bench_task's own runs) nothing is completed or
    # deleted: read from first_batch on until a checkpoint has no manifest.
    completed = sorted(i for i in listed_records(root, operator_id) if i >= first_batch)
    ids = iter(completed) if completed else itertools.count(first_batch)
    for b in ids:
        found = [m for p in range(partitions) for m in list_published_manifests(store, b, p)]
        if not found and not completed:
            break
        for m in found:
            met = m.metrics
            stages_ms = {k: float(v) for k, v in (met.get("task_ms") or {}).items()}
            stages_ms["sync"] = 1000 * float(met.get("sync_duration_s", 0))
            stages_ms["async"] = 1000 * float(met.get("async_duration_s", 0))
            for k, v in stages_ms.items():
                rows.setdefault(k, []).append(v)
    return {k: float(np.median(v)) for k, v in rows.items()}


def profile(args: argparse.Namespace) -> None:
    workdir = tempfile.mkdtemp(prefix="sb-bench-task-")
    try:
        batches = [make_batch(args.keys, args.rows, seed) for seed in range(args.batches)]
        run_batches(os.path.join(workdir, "warm"), args.profile, batches[:2])
        prof = cProfile.Profile()
        run_batches(os.path.join(workdir, "prof"), args.profile, batches, prof)
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s).strip_dirs().sort_stats(args.sort)
        st.print_stats(args.top)
        print(s.getvalue())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- pytest-benchmark ----------------------------------------------------------------------


def _bench(benchmark: Any, tmp_path: Any, workload: str, keys: int = 5_000, rows: int = 10_000
           ) -> None:
    batches = [make_batch(keys, rows, s) for s in range(3)]
    counter = iter(range(10**6))

    def run() -> None:
        run_batches(str(tmp_path / f"r{next(counter)}"), workload, batches)

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["key_batches"] = sum(b["k"].nunique() for b in batches)


def test_task_noop(benchmark: Any, tmp_path: Any) -> None:
    """Three batches through the whole task with a processor that does nothing."""
    _bench(benchmark, tmp_path, "noop")


def test_task_running_count(benchmark: Any, tmp_path: Any) -> None:
    """Three batches through the whole task with the running-count processor."""
    _bench(benchmark, tmp_path, "count")


def test_task_vector_count(benchmark: Any, tmp_path: Any) -> None:
    """Three batches through the whole task with map_in_pandas's vectorised running count."""
    _bench(benchmark, tmp_path, "vector", keys=50_000, rows=100_000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/bench_task.py",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=10_000,
                    help="rows per batch of this one task (the target workload gives each "
                         "of its 2 partitions ~10,000 rows per batch)")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["noop", "count"],
                    help=f"comma separated, out of {','.join(WORKLOADS)}")
    ap.add_argument("--profile", choices=WORKLOADS, default=None)
    ap.add_argument("--sort", default="cumulative")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--value-blocks", type=int, default=W.VALUE_BLOCKS,
                    help="value_blocks of the vector-blocks workload (per key group)")
    ap.add_argument("--frame-rows", default=str(DEFAULT_FRAME_ROWS),
                    help="map_in_pandas's frame_rows for the vector workloads ('none': the "
                         "whole input as one frame)")
    args = ap.parse_args(argv)
    global VECTOR_BLOCKS, FRAME_ROWS
    VECTOR_BLOCKS = args.value_blocks
    FRAME_ROWS = None if args.frame_rows.lower() == "none" else int(args.frame_rows)
    if args.profile:
        profile(args)
    else:
        report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
