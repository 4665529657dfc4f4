"""Large state over many micro-batches, against storage that costs what an object store costs.

    python -m benchmarks.large_state                                   # 200,000 x 1 KiB, 60 batches
    python -m benchmarks.large_state --keys 1000000 --batches 100      # ~1 GiB of state
    python -m benchmarks.large_state --lifecycle close,open            # before/after side by side
    python -m benchmarks.large_state --checkpoint-mode changelog       # once that mode exists
    python -m benchmarks.large_state --option rocksdb.compaction-style=universal

N keys (bigint) with V bytes of incompressible value each: the first batch loads them all,
then each of B batches rewrites ``churn`` of them (chosen at random; the function reads the
old value and writes a new one, as a ``map_in_pandas`` user would). Each batch runs the
partition task of ``map_in_pandas`` (``statebackend.task.runner.run_partition``) for every
partition in turn in this process, as ``benchmarks/bench_task.py`` does, with the Spark task
identity patched in; a coordinator completes each checkpoint after the batch (retention and
deletion of unreferenced files included). Durable storage is ``benchmarks/latency_fs.py``:
a local directory charging ``--latency-ms`` per request and ``--bandwidth-mbps`` each way,
either on one link shared by all transfers (``--link shared``) or per request on its own
connection, at most ``--max-connections`` at once (``--link independent``).

``--lifecycle close`` is the task that opens, checkpoints and closes its instance each
batch; ``open`` keeps it open between batches (``keep_instances_open``). Partitions run
one after another in one process, so every kept-open instance shares the process's block
cache and write buffer manager (``bounded_memory``): the memory figures are for all of them.

Per batch: latency (the partitions' task times summed: one core), bytes the tasks made
durable before publishing (critical path: their checkpoints' ``bytes_uploaded``) and
everything else uploaded until the next batch starts (background: changelog mode's
materializations, plus a few kB of manifests and records), the bytes the batch
changed, L0 files (before the batch's flush: what its reads checked), local disk (hard
links counted once) and durable disk. At the end: restore time of every partition after
the machine is lost (local directory deleted), against downloading the live state once.
Prints medians, p90 and max; writes ``large_state.json`` and two plots (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import latency_fs
from statebackend.options import StateBackendOptions
from statebackend.spark.plan import KG_COL, KeySpec
from statebackend.task import runner
from statebackend.task.context import PTIME_COL, OperatorConfig
from statebackend.task.vector import vector_config, vector_process

OP = "large"
SPEC = KeySpec(("k",), ("bigint",))
MAXP = 128
ARROW_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch
KEY_BYTES = 16  # a RocksDB key of this operator, measured: see logical_bytes below


def rewrite(frames, state):
    """The user's function: read each key's old value, write a new one, emit nothing."""
    for pdf in frames:
        keys = pdf[["k"]].reset_index(drop=True)
        state.get(keys)  # a read-modify-write: the point reads L0 files make slower
        state.put(keys, pd.DataFrame({"v": pdf["v"].to_numpy()}))
    return iter(())


@dataclass
class Run:
    """One lifecycle's figures."""

    name: str
    batches: list[dict[str, Any]] = field(default_factory=list)
    restore: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)


def partition_of(keys: np.ndarray, parallelism: int) -> tuple[np.ndarray, np.ndarray]:
    from statebackend.keys.groups import key_groups

    kg = np.asarray(key_groups([keys], ["bigint"], MAXP), dtype=np.int32)
    return kg, (kg.astype(np.int64) * parallelism // MAXP).astype(np.int32)


def task_frames(keys: np.ndarray, kg: np.ndarray, value_bytes: int, rng: np.random.Generator
                ) -> Iterator[pd.DataFrame]:
    """Spark's Arrow batches for one task, values drawn as they are sent (incompressible)."""
    for i in range(0, len(keys), ARROW_ROWS):
        k = keys[i:i + ARROW_ROWS]
        raw = rng.bytes(len(k) * value_bytes)
        vals = [raw[j * value_bytes:(j + 1) * value_bytes] for j in range(len(k))]
        yield pd.DataFrame({"k": k, "v": pd.Series(vals, dtype=object), KG_COL: kg[i:i + ARROW_ROWS],
                            PTIME_COL: np.full(len(k), 1_700_000_000_000, np.int64)})


def disk_bytes(path: str) -> int:
    """Bytes on disk under ``path``, each inode once (hard-linked copies are free)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for d, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(d, f))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _counts(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    """How often each value of the per-partition lists ``row[key]`` occurs in ``rows``."""
    return dict(Counter(v for r in rows for v in r.get(key, ())))


def options_for(args: argparse.Namespace, local: str, keep_open: bool) -> StateBackendOptions:
    extra: dict[str, Any] = {}
    fields = StateBackendOptions.field_names()
    if "checkpoint_mode" in fields:
        if args.checkpoint_mode is not None:
            extra["checkpoint_mode"] = args.checkpoint_mode
    elif args.checkpoint_mode not in (None, "incremental"):
        raise SystemExit(f"--checkpoint-mode {args.checkpoint_mode}: this build of statebackend "
                         f"has no checkpoint_mode option (changelog checkpoints are not merged "
                         f"yet); only 'incremental' runs here")
    conf = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r}: expected KEY=VALUE")
        conf[f"spark.statebackend.{key.strip()}"] = value.strip()
    return StateBackendOptions.from_spark_conf(
        conf, parallelism=args.partitions, max_parallelism=MAXP, local_dir=local,
        keep_instances_open=keep_open, memory_budget=args.memory_budget, **extra)


def run_lifecycle(args: argparse.Namespace, name: str, workdir: str) -> Run:
    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.local import resident
    from statebackend.storage import open_store
    from statebackend.storage.manifests import operator_store, read_manifest

    keep_open = name == "open"
    durable_dir = os.path.join(workdir, "durable")
    local = os.path.join(workdir, "local")
    os.makedirs(durable_dir, exist_ok=True)
    opts = options_for(args, local, keep_open)
    config = OperatorConfig(
        operator_id=OP, checkpoint_location=f"latency://{durable_dir}",
        storage_options={"latency_s": args.latency_ms / 1000,
                         "bandwidth": args.bandwidth_mbps * 1e6, "link": args.link,
                         "max_connections": args.max_connections},
        options=opts, parallelism=args.partitions, key=SPEC)
    config = vector_config(config, args.frame_rows)
    process = vector_process(rewrite, config, "v BINARY", None)
    # the driver's side (completion, retention, deletion) is not charged: not a task's cost
    coord = CheckpointCoordinator(open_store(durable_dir), OP, args.partitions, MAXP,
                                  num_retained=opts.num_retained)
    op_store = operator_store(open_store(durable_dir), OP)
    rng = np.random.default_rng(args.seed)
    all_keys = np.arange(args.keys, dtype=np.int64) * 7919 + 13
    kg, part = partition_of(all_keys, args.partitions)
    run = Run(name)
    original = runner.task_identity
    entry_bytes = 8 + args.value_bytes
    try:
        for b in range(args.batches + 1):
            if b == 0:
                idx = np.arange(args.keys)
            else:
                idx = np.sort(rng.choice(args.keys, max(1, int(args.keys * args.churn)),
                                         replace=False))
            task_s = []
            _, up0, _ = latency_fs.STATS.snapshot()
            if run.batches:  # everything uploaded since the previous batch started
                run.batches[-1]["uploaded_bytes"] = up0 - run.batches[-1].pop("_up0")
            for p in range(args.partitions):
                sel = idx[part[idx] == p]
                runner.task_identity = lambda _c, _partition, b=b, p=p: (b, p, f"b{b}-p{p}")
                t0 = time.perf_counter()
                for _ in runner.run_partition(
                        config, task_frames(all_keys[sel], kg[sel], args.value_bytes, rng),
                        process):
                    pass
                task_s.append(time.perf_counter() - t0)
            # before completion deletes what the retained checkpoints no longer reference
            durable_before_gc = disk_bytes(durable_dir)
            record = coord.try_complete(b)
            if record is None:
                raise RuntimeError(f"checkpoint {b} did not complete")
            manifests = [read_manifest(op_store, record.manifests[p])
                         for p in range(args.partitions)]
            # what each task made durable before publishing (SSTs, or its changelog)
            critical = sum(int(m.metrics.get("bytes_uploaded", 0)) for m in manifests)
            l0 = [int((m.metrics.get("rocksdb") or {}).get("l0_files", -1)) for m in manifests]
            sources = [m.metrics["restore"]["source"] for m in manifests]
            modes = [m.mode for m in manifests]  # checkpoint_mode "auto" chooses per batch
            live = sum(m.full_size for m in manifests)
            # referenced, split: the base's SST files (RocksDB's obsolete versions included)
            # and the changelogs replayed onto it; which base, and how stale (changelog mode)
            changelog_ref = sum(f.size for m in manifests for f in m.changelog_files)
            bases = [m.materialized_id for m in manifests]
            # the product's own figure (keys and values of live entries, per partition)
            reported = [(m.metrics.get("rocksdb") or {}).get("logical_bytes") for m in manifests]
            row = {"batch": b, "latency_s": sum(task_s), "task_s": task_s,
                   "critical_bytes": critical, "_up0": up0,
                   "changed_bytes": len(idx) * entry_bytes, "l0_files": max(l0),
                   "l0_per_partition": l0, "sources": sources, "modes": modes,
                   "live_bytes": live,
                   # keys and values once each, as RocksDB stores them (key group + 8-byte
                   # key + a one-byte column tag: 16 bytes of key per entry)
                   "logical_bytes": args.keys * (KEY_BYTES + args.value_bytes),
                   "reported_logical_bytes": (sum(reported) if None not in reported
                                              else None),
                   "referenced_changelog_bytes": changelog_ref,
                   "referenced_sst_bytes": live - changelog_ref, "base_batches": bases,
                   "local_bytes": disk_bytes(local), "durable_bytes": disk_bytes(durable_dir),
                   "durable_before_gc_bytes": durable_before_gc}
            run.batches.append(row)
            if b % max(1, args.batches // 10) == 0 or b == args.batches:
                print(f"  [{name}] batch {b}: {row['latency_s']:.2f}s, critical "
                      f"{row['critical_bytes'] / 1e6:.1f} MB, L0 {l0}, local "
                      f"{row['local_bytes'] / 1e6:.0f} MB, durable "
                      f"{row['durable_bytes'] / 1e6:.0f} MB, {sources}", flush=True)
        wait_for_background()
        _, up_end, _ = latency_fs.STATS.snapshot()
        run.batches[-1]["uploaded_bytes"] = up_end - run.batches[-1].pop("_up0")
        for row in run.batches:
            # materializations, plus the small manifests and records of every batch
            row["background_bytes"] = max(0, row["uploaded_bytes"] - row["critical_bytes"])
        run.memory = memory_figures(opts)
        resident.close_all()
        # --- the machine is lost: no local directory, restore from durable storage ------
        shutil.rmtree(local, ignore_errors=True)
        run.restore = restore_all(config, coord, args, run.batches[-1]["logical_bytes"])
    finally:
        runner.task_identity = original
        resident.close_all()
        coord.close()
    return run


def wait_for_background() -> None:
    """Let background uploads (changelog mode's materializations) finish, where they exist."""
    try:
        from statebackend.checkpoint.materialize import wait_for_materializations
    except ImportError:  # a build without changelog checkpoints uploads nothing later
        return
    wait_for_materializations()


def memory_figures(opts: StateBackendOptions) -> dict[str, Any]:
    from statebackend.rocksdb.options import shared_memory

    shared = shared_memory(opts.memory_budget, opts.write_buffer_ratio)
    return {"rss_max_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_bytes": _rss(), "block_cache_usage": int(shared.cache.get_usage()),
            "block_cache_capacity": shared.cache_capacity,
            "write_buffer_usage": int(shared.write_buffer_manager.get_usage()),
            "write_buffer_capacity": shared.write_buffer_capacity}


def _rss() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def restore_all(config: OperatorConfig, coord, args: argparse.Namespace,
                logical_bytes: int = 0) -> dict[str, Any]:
    """Every partition of the latest checkpoint restored from durable storage (sequentially):
    :func:`restore_manifests`; with ``--keep DIR``, the durable state is copied to ``DIR``
    first, for ``python -m benchmarks.restore_kept DIR`` to restore again."""
    from statebackend.storage import open_store

    latest = coord.latest()
    if args.keep:
        keep(args, config, dict(latest.manifests), logical_bytes)
    store = open_store(config.checkpoint_location, storage_options=config.storage_options,
                       download_threads=config.options.download_threads)
    return restore_manifests(store, dict(latest.manifests), config.options, args,
                             logical_bytes)


KEPT = "kept.json"


def keep(args: argparse.Namespace, config: OperatorConfig, manifests: dict[int, str],
         logical_bytes: int) -> None:
    """Copy the durable state to ``args.keep``/durable, with what a restore of it needs."""
    target = os.path.join(args.keep, "durable")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(config.checkpoint_location.split("://", 1)[1], target)
    with open(os.path.join(args.keep, KEPT), "w") as fh:
        json.dump({"args": vars(args), "manifests": manifests,
                   "storage_options": config.storage_options,
                   "logical_bytes": logical_bytes}, fh, indent=1)


def restore_manifests(store, manifests: dict[int, str], options: StateBackendOptions,
                      args: argparse.Namespace, logical_bytes: int = 0) -> dict[str, Any]:
    """Restore each partition's manifest from ``store`` (one after the other) into
    ``options.local_dir``, against two floors: what it downloaded, and the logical state
    (keys and values once) through the same link, files and threads (one download of the
    state)."""
    from statebackend.checkpoint import PartitionCheckpointer
    from statebackend.storage.manifests import operator_store, read_manifest

    t0 = time.perf_counter()
    nbytes = nfiles = 0
    for p, path in sorted(manifests.items()):
        m = read_manifest(operator_store(store, OP), path)
        cp = PartitionCheckpointer(store, OP, p, options, options.local_dir)
        inst, rm = cp.restore(m)
        inst.close()
        nbytes += rm.bytes_downloaded
        nfiles += rm.files_downloaded
    seconds = time.perf_counter() - t0
    # the floor: bytes through the link once, plus one request per file; with independent
    # connections, as many transfers at once as threads and connections allow
    lanes = max(1, options.download_threads)

    def floor(size: int, files: int) -> float:
        if args.link == "independent":
            return (size / (args.bandwidth_mbps * 1e6) + args.latency_ms / 1000 * files) / min(
                lanes, args.max_connections)
        return size / (args.bandwidth_mbps * 1e6) + args.latency_ms / 1000 * files / lanes

    # one download of the state: its logical bytes in files of RocksDB's 64 MiB target
    # size (not in as many files as the restore read: that floor charges our own request
    # count to the state, and pieces are read 64 at once, not download_threads at once)
    part = -(-logical_bytes // max(1, args.partitions))
    state_files = args.partitions * max(1, -(-part // (64 << 20)))
    return {"seconds": seconds, "bytes": nbytes, "files": nfiles,
            "download_floor_s": floor(nbytes, nfiles), "state_files": state_files,
            "logical_download_s": floor(logical_bytes, state_files) if logical_bytes else None}


def stats(xs: list[float]) -> str:
    a = np.asarray(xs, dtype=float)
    if not len(a):
        return "-"
    return f"median {np.median(a):.3g}, p90 {np.percentile(a, 90):.3g}, max {a.max():.3g}"


def growth(xs: list[float]) -> dict[str, float]:
    """Whether a per-batch figure grows: least-squares slope per batch, and the mean of the
    second half of ``xs`` over the mean of its first half."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 4:
        return {"slope_per_batch": 0.0, "second_half_over_first": 1.0}
    slope = float(np.polyfit(np.arange(len(a)), a, 1)[0])
    h = len(a) // 2
    return {"slope_per_batch": slope, "second_half_over_first": float(a[h:].mean() / a[:h].mean())}


def written_over_changed(steady: list[dict[str, Any]], window: int = 50) -> dict[str, Any]:
    """Bytes written to durable storage (critical path and background, manifests and
    records included) over the bytes the batches changed: the mean over every batch after
    the load and over the last ``window`` (sums over sums: a batch that uploads a
    materialization counts with the quiet ones around it), and the worst single batch."""
    rows = [r for r in steady if "uploaded_bytes" in r and r["changed_bytes"]]
    if not rows:
        return {"written_over_changed_mean": None, f"written_over_changed_mean_last{window}":
                None, "written_over_changed_max": None}
    last = rows[-window:]
    return {
        "written_over_changed_mean": (sum(r["uploaded_bytes"] for r in rows)
                                      / sum(r["changed_bytes"] for r in rows)),
        f"written_over_changed_mean_last{window}": (sum(r["uploaded_bytes"] for r in last)
                                                    / sum(r["changed_bytes"] for r in last)),
        "written_over_changed_max": max(r["uploaded_bytes"] / r["changed_bytes"] for r in rows),
        "written_bytes_per_batch_mean": sum(r["uploaded_bytes"] for r in rows) / len(rows),
        "written_bytes_per_batch_max": max(r["uploaded_bytes"] for r in rows),
    }


def issue_targets(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The large-state targets (default options, 1% uniform churn), each with the measured
    figure and whether it holds: reported, never asserted."""
    rows = {
        "durable_peak <= 1.5x logical": (s["durable_over_logical_max_steady"], 1.5),
        "durable_after_gc <= 1.3x logical": (s["durable_post_gc_over_logical_max_steady"], 1.3),
        "written / changed, mean of the last 50 <= 3x": (
            s.get("written_over_changed_mean_last50"), 3.0),
        "written / changed, any batch <= 10x": (s.get("written_over_changed_max"), 10.0),
        "local <= 2x logical": (s["local_over_logical_max_steady"], 2.0),
        "p90 batch <= 1.3x median": (s["p90_over_median"], 1.3),
        "max batch <= 2x median": (s["max_over_median"], 2.0),
        "restore <= 1.5x one download of the state": (s.get("restore_over_logical_download"),
                                                       1.5),
    }
    return {k: {"value": v, "target": t, "met": None if v is None else v <= t}
            for k, (v, t) in rows.items()}


def against_logical(batches: list[dict[str, Any]], window: int = 50) -> dict[str, Any]:
    """Every amplification figure against the logical state (keys + values of live entries)."""
    steady = batches[1:]

    def ratio(key: str, rows: list[dict[str, Any]]) -> list[float]:
        return [r[key] / r["logical_bytes"] for r in rows]

    post_gc = ratio("durable_bytes", batches)
    peak = [max(r["durable_before_gc_bytes"], r["durable_bytes"]) / r["logical_bytes"]
            for r in batches]
    local = ratio("local_bytes", batches)
    last = batches[-window:]
    uploaded = [r["uploaded_bytes"] / r["changed_bytes"] for r in steady if "uploaded_bytes" in r]
    written = written_over_changed(steady, window)
    reported = [r["reported_logical_bytes"] / r["logical_bytes"] for r in batches
                if r.get("reported_logical_bytes")]
    return {
        "logical_bytes": batches[-1]["logical_bytes"],
        "referenced_over_logical_end": batches[-1]["live_bytes"] / batches[-1]["logical_bytes"],
        "referenced_over_logical_max": max(ratio("live_bytes", batches)),
        "durable_over_logical_max": max(peak),
        "durable_over_logical_max_steady": max(peak[1:]) if len(peak) > 1 else None,
        "durable_post_gc_over_logical_max_steady": max(post_gc[1:]) if len(post_gc) > 1 else None,
        "durable_post_gc_over_logical_end": post_gc[-1],
        "local_over_logical_max": max(local),
        "local_over_logical_max_steady": max(local[1:]) if len(local) > 1 else None,
        "local_over_logical_end": local[-1],
        "uploaded_over_changed_median": float(np.median(uploaded)) if uploaded else None,
        "uploaded_over_changed_max": max(uploaded) if uploaded else None,
        **written,
        "durable_over_logical_end": batches[-1]["durable_bytes"] / batches[-1]["logical_bytes"],
        f"last{window}_durable_post_gc_growth": growth(ratio("durable_bytes", last)),
        f"last{window}_durable_peak_growth": growth(
            [max(r["durable_before_gc_bytes"], r["durable_bytes"]) / r["logical_bytes"]
             for r in last]),
        f"last{window}_local_growth": growth(ratio("local_bytes", last)),
        f"last{window}_referenced_growth": growth(ratio("live_bytes", last)),
        "reported_logical_over_true": ([min(reported), max(reported)] if reported else None),
        # changelog mode: how much of referenced is the base's SSTs, how much changelogs,
        # and how many batches old the base got (a materialization that is not adopted)
        "referenced_sst_over_logical_max": max(ratio("referenced_sst_bytes", batches)),
        "referenced_changelog_over_logical_max": max(
            ratio("referenced_changelog_bytes", batches)),
        "base_age_max_batches": max(
            (r["batch"] - min(b for b in r["base_batches"] if b is not None) for r in batches
             if any(b is not None for b in r["base_batches"])), default=None),
    }


def summary(run: Run) -> dict[str, Any]:
    s = _summary(run)
    s["targets"] = issue_targets(s)
    return s


def _summary(run: Run) -> dict[str, Any]:
    steady = run.batches[1:]
    lat = [r["latency_s"] for r in steady]
    crit_ratio = [r["critical_bytes"] / r["changed_bytes"] for r in steady]
    last = run.batches[-1]
    med = float(np.median(lat)) if lat else 0.0
    return {
        "load_batch_s": run.batches[0]["latency_s"],
        "latency_median_s": med,
        "latency_p90_s": float(np.percentile(lat, 90)) if lat else 0.0,
        "latency_max_s": max(lat) if lat else 0.0,
        "p90_over_median": float(np.percentile(lat, 90)) / med if med else None,
        "max_over_median": max(lat) / med if med else None,
        "critical_over_changed_median": float(np.median(crit_ratio)) if crit_ratio else None,
        "critical_over_changed_max": max(crit_ratio) if crit_ratio else None,
        "background_bytes_total": sum(r["background_bytes"] for r in run.batches),
        "l0_max": max(r["l0_files"] for r in steady) if steady else None,
        "l0_median": float(np.median([r["l0_files"] for r in steady])) if steady else None,
        "live_bytes": last["live_bytes"],
        "durable_over_live_end": last["durable_bytes"] / last["live_bytes"],
        "durable_over_live_max": max(r["durable_bytes"] / r["live_bytes"] for r in run.batches),
        "local_over_live_end": last["local_bytes"] / last["live_bytes"],
        "local_over_live_max": max(r["local_bytes"] / r["live_bytes"] for r in run.batches),
        # against the data the user stored (keys and values of live entries)
        **against_logical(run.batches),
        "restore_s": run.restore.get("seconds"),
        "restore_over_floor": (run.restore["seconds"] / run.restore["download_floor_s"]
                               if run.restore.get("download_floor_s") else None),
        "restore_over_logical_download": (
            run.restore["seconds"] / run.restore["logical_download_s"]
            if run.restore.get("logical_download_s") else None),
        "sources": _counts(steady, "sources"),
        "modes": _counts(steady, "modes"),
        "memory": run.memory,
    }


def print_run(run: Run) -> None:
    steady = run.batches[1:]
    s = summary(run)
    print(f"\n== lifecycle {run.name}: {len(steady)} batches after the load "
          f"({s['load_batch_s']:.1f} s), live state {s['live_bytes'] / 1e6:.0f} MB")
    print(f"  batch latency (s): {stats([r['latency_s'] for r in steady])}; "
          f"p90/median {s['p90_over_median']:.2f}, max/median {s['max_over_median']:.2f}")
    print(f"  critical-path upload (MB): {stats([r['critical_bytes'] / 1e6 for r in steady])}; "
          f"/ changed bytes: median {s['critical_over_changed_median']:.1f}x, max "
          f"{s['critical_over_changed_max']:.1f}x; background {s['background_bytes_total'] / 1e6:.1f} MB")
    print(f"  L0 files before the flush: {stats([r['l0_files'] for r in steady])}")
    print(f"  durable / live: end {s['durable_over_live_end']:.2f}, max "
          f"{s['durable_over_live_max']:.2f}; local / live: end {s['local_over_live_end']:.2f}, "
          f"max {s['local_over_live_max']:.2f}")
    g = s["last50_durable_post_gc_growth"]
    print(f"  against the logical state (keys + values of live entries, "
          f"{s['logical_bytes'] / 1e6:.0f} MB): referenced end {s['referenced_over_logical_end']:.2f}"
          f" max {s['referenced_over_logical_max']:.2f}; durable peak "
          f"{s['durable_over_logical_max_steady']:.2f} (load batch included "
          f"{s['durable_over_logical_max']:.2f}), after GC max "
          f"{s['durable_post_gc_over_logical_max_steady']:.2f} end "
          f"{s['durable_post_gc_over_logical_end']:.2f}; local max "
          f"{s['local_over_logical_max_steady']:.2f} end {s['local_over_logical_end']:.2f}")
    print(f"  last 50 batches: durable after GC slope {g['slope_per_batch']:+.4f}/batch, "
          f"2nd half / 1st half {g['second_half_over_first']:.3f}; peak "
          f"{s['last50_durable_peak_growth']['second_half_over_first']:.3f}; local "
          f"{s['last50_local_growth']['second_half_over_first']:.3f}; referenced "
          f"{s['last50_referenced_growth']['second_half_over_first']:.3f}")
    print(f"  referenced: SST files of the base at most {s['referenced_sst_over_logical_max']:.2f}"
          f", changelogs at most {s['referenced_changelog_over_logical_max']:.2f} of the "
          f"logical state; oldest base {s['base_age_max_batches']} batches behind")
    print(f"  uploaded per batch / changed: median {s['uploaded_over_changed_median']:.2f}, max "
          f"{s['uploaded_over_changed_max']:.2f}; logical reported by the checkpoints / true: "
          f"{s['reported_logical_over_true']}")
    print(f"  written to durable storage / changed: mean {_x(s['written_over_changed_mean'])}, "
          f"mean of the last 50 {_x(s['written_over_changed_mean_last50'])}, worst batch "
          f"{_x(s['written_over_changed_max'])}; durable at the end "
          f"{s['durable_over_logical_end']:.2f} of the logical state")
    print(f"  restore after losing the machine: {run.restore['seconds']:.1f} s for "
          f"{run.restore['bytes'] / 1e6:.0f} MB in {run.restore['files']} files (floor "
          f"{run.restore['download_floor_s']:.1f} s: {s['restore_over_floor']:.2f}x; one "
          f"download of the logical state, in {run.restore.get('state_files')} files of 64 MiB, "
          f"{_x(s['restore_over_logical_download'])})")
    print("  targets: " + "; ".join(
        f"{k} {_x(v['value'])} {'met' if v['met'] else 'NOT met' if v['met'] is not None else '?'}"
        for k, v in s["targets"].items()))
    m = run.memory
    print(f"  memory (all partitions of the process): RSS {m['rss_bytes'] / 2**20:.0f} MiB "
          f"(peak {m['rss_max_bytes'] / 2**20:.0f}), block cache {m['block_cache_usage'] / 2**20:.0f}"
          f"/{m['block_cache_capacity'] / 2**20:.0f} MiB, write buffers "
          f"{m['write_buffer_usage'] / 2**20:.0f}/{m['write_buffer_capacity'] / 2**20:.0f} MiB")
    print(f"  restore sources of the tasks: {s['sources']}; checkpoint modes: {s['modes']}")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def plot(runs: list[Run], out_dir: str, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for what, key, scale, ylabel in (
            ("latency", "latency_s", 1.0, "batch latency (s, partitions summed)"),
            ("upload", "critical_bytes", 1e-6, "MB made durable in the critical path")):
        fig, ax = plt.subplots(figsize=(8, 4))
        for run in runs:
            xs = [r["batch"] for r in run.batches[1:]]
            ax.plot(xs, [r[key] * scale for r in run.batches[1:]], label=run.name, lw=1)
            if what == "upload" and any(r["background_bytes"] for r in run.batches[1:]):
                ax.plot(xs, [r["background_bytes"] * scale for r in run.batches[1:]],
                        label=f"{run.name} (background)", lw=1, ls="--")
        ax.set_xlabel("batch")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"large_state_{what}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    paths.append(plot_space(runs, out_dir, title))
    return paths


def plot_space(runs: list[Run], out_dir: str, title: str) -> str:
    """Durable (before and after each completion's deletions), referenced and local bytes
    per batch over the logical state."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for run in runs:
        rows = run.batches
        xs = [r["batch"] for r in rows]
        for key, label, ls in (("durable_before_gc_bytes", "durable, before GC", "-"),
                               ("durable_bytes", "durable, after GC", "--"),
                               ("live_bytes", "referenced", ":"),
                               ("referenced_sst_bytes", "referenced: the base's SSTs", (0, (1, 3))),
                               ("local_bytes", "local disk", "-.")):
            if all(key in r for r in rows):
                ax.plot(xs, [r[key] / r["logical_bytes"] for r in rows], lw=1, ls=ls,
                        label=f"{run.name}: {label}")
    ax.set_xlabel("batch")
    ax.set_ylabel("bytes / logical state")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "large_state_space.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_in_child(argv: list[str], name: str, out: str) -> Run:
    """Run one lifecycle with the same arguments in a new process; its figures."""
    import subprocess

    rest, skip = [], False
    for a in argv:  # drop --lifecycle/--out (both forms); the child gets its own
        if skip:
            skip = False
            continue
        if a in ("--lifecycle", "--out"):
            skip = True
            continue
        if a.startswith(("--lifecycle=", "--out=")):
            continue
        rest.append(a)
    subprocess.run([sys.executable, "-m", "benchmarks.large_state", *rest,
                    "--lifecycle", name, "--out", out], check=True)
    with open(os.path.join(out, "large_state.json")) as fh:
        r = json.load(fh)["runs"][name]
    return Run(name, r["batches"], r["restore"], r["memory"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.large_state",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=60, help="batches after the load batch")
    ap.add_argument("--churn", type=float, default=0.01, help="share of keys each batch rewrites")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--lifecycle", default="close,open",
                    help="comma separated: 'close' (open, checkpoint, close each task), "
                         "'open' (keep_instances_open)")
    ap.add_argument("--checkpoint-mode", choices=("incremental", "changelog", "auto"),
                    default=None, help="default: the build's own default")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="per request")
    ap.add_argument("--bandwidth-mbps", type=float, default=100.0, help="MB/s each way")
    ap.add_argument("--link", choices=latency_fs.LINKS, default="shared",
                    help="'shared': one link each way shared by all transfers of the process "
                         "(one saturated NIC); 'independent': every request pays latency + "
                         "size / bandwidth on its own connection (separate S3 connections)")
    ap.add_argument("--max-connections", type=int, default=16,
                    help="requests under way at once with --link independent")
    ap.add_argument("--memory-budget", default="256m", help="RocksDB memory per process")
    ap.add_argument("--frame-rows", type=int, default=100_000,
                    help="map_in_pandas frame_rows (the load batch streams in frames)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a StateBackendOptions field by its Spark key without the "
                         "'spark.statebackend.' prefix, e.g. rocksdb.compaction-style=universal "
                         "(repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="default: a temp dir, deleted after")
    ap.add_argument("--out", default="bench-out/large-state")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="copy the durable state to DIR before the restore, for "
                         "'python -m benchmarks.restore_kept DIR' (one lifecycle only)")
    args = ap.parse_args(argv)
    latency_fs.register()
    lifecycles = [x.strip() for x in args.lifecycle.split(",") if x.strip()]
    if not lifecycles or set(lifecycles) - {"open", "close"}:
        ap.error("--lifecycle takes 'open', 'close' or both")
    if args.keep and len(lifecycles) > 1:
        ap.error("--keep keeps one lifecycle's state: give --lifecycle open or close")
    # a mode this build lacks fails now
    mode = getattr(options_for(args, tempfile.gettempdir(), False), "checkpoint_mode",
                   "incremental")
    os.makedirs(args.out, exist_ok=True)
    title = (f"{args.keys:,} keys x {args.value_bytes} B, {args.batches} batches at "
             f"{args.churn:.1%} churn, {args.partitions} partitions, {mode}, "
             f"{args.latency_ms:g} ms / {args.bandwidth_mbps:g} MB/s, {args.link} link"
             + (f" (<= {args.max_connections} connections)" if args.link == "independent"
                else ""))
    print(f"{title}; load {os.getloadavg()}", flush=True)
    runs = []
    for name in lifecycles:
        if len(lifecycles) > 1:
            # each lifecycle in a process of its own: memory figures are its own
            runs.append(run_in_child(argv if argv is not None else sys.argv[1:], name,
                                     os.path.join(args.out, name)))
        else:
            if args.workdir:
                os.makedirs(args.workdir, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix=f"sb-large-{name}-", dir=args.workdir)
            try:
                runs.append(run_lifecycle(args, name, workdir))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        print_run(runs[-1])
    out = {"args": vars(args), "load_end": os.getloadavg(),
           "runs": {r.name: {"summary": summary(r), "batches": r.batches, "restore": r.restore,
                             "memory": r.memory} for r in runs}}
    with open(os.path.join(args.out, "large_state.json"), "w") as fh:
        json.dump(out, fh, indent=1, default=str)
    try:
        paths = plot(runs, args.out, title)
        print("plots:", ", ".join(paths))
    except ImportError:
        print("no plots: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
    print(f"load at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
