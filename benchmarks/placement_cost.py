"""What the carrier plan costs on one machine: ``placement="carrier"`` against ``"shuffle"``.

    python -m benchmarks.placement_cost --ab                       # both plans, 2 and 200 shuffle partitions, 3 rounds
    python -m benchmarks.placement_cost --ab --rounds 5 --systems ours-tws --shuffle-partitions 200
    python -m benchmarks.placement_cost --placement carrier --shuffle-partitions 200 --stages
    python -m benchmarks.placement_cost --ab --conf spark.sql.streaming.stateStore.providerClass=hdfs

On ``local[N]`` the carrier can only cost: every task already runs on the one executor.
One run (``--placement``) is one process: a ``local[2]`` session with Spark's defaults
where the issue asks for them (``spark.sql.streaming.noDataMicroBatches.enabled`` left at
true, ``spark.sql.shuffle.partitions`` as given: the carrier's stateful operator runs one
state-store task per shuffle partition per micro-batch, the shuffle plan's ``repartition``
ignores the setting), the RocksDB state-store provider (``--conf`` changes any of these),
a warm-up query on a tiny input, then the measured query: the ``count`` workload of
``benchmarks.compare`` (10,000 keys, 200,000 events, 10 micro-batches by default) through
``transform_with_state`` (``ours-tws``) or ``map_in_pandas`` (``ours-map``), into a
``foreachBatch`` sink that counts. It prints one ``RESULT {json}`` line: the query's wall
time, Spark's trigger phases (``durationMs``) and state-operator figures (``stateOperators``:
state-store instances, commit time) summed over the micro-batches, and the files the
carrier's state store left in the query's checkpoint location; ``--stages`` adds JVM CPU
per stage from Spark's REST API (the UI on a loopback port).

``--ab`` runs every (shuffle partitions, system, placement) once per round as a child
process, shuffle and carrier in turn, each under ``perf stat`` (the whole process tree:
the JVM and the Python workers are children of the driver): CPU time (``task-clock``), and
instructions where the machine's PMU counts them. It prints each figure's median and
range per configuration, the carrier-to-shuffle ratios pair by pair, and the 1-minute load
beside each run, and writes ``<out>/placement_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np

from . import compare as C

NO_DATA_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
SHUFFLE_CONF = "spark.sql.shuffle.partitions"
PROVIDERS = {"rocksdb": C.ROCKSDB, "hdfs": C.HDFS}
UI_PORT = 4079
SYSTEMS = ("ours-tws", "ours-map")
PLACEMENTS = ("shuffle", "carrier")


def session(shuffle_partitions: int, conf: dict[str, str], stages: bool):
    """``local[2]`` with Spark's defaults except the provider (RocksDB, as
    ``benchmarks.compare``) and what ``conf`` says."""
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName("statebackend-placement-cost")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.ui.showConsoleProgress", "false")
         .config(SHUFFLE_CONF, str(shuffle_partitions))
         .config(C.PROVIDER_CONF, C.ROCKSDB))
    if stages:
        b = (b.config("spark.ui.enabled", "true").config("spark.ui.port", str(UI_PORT))
             .config("spark.ui.retainedStages", "100000")
             .config("spark.ui.retainedTasks", "1000000")
             .config("spark.driver.bindAddress", "127.0.0.1"))
    else:
        b = b.config("spark.ui.enabled", "false")
    for k, v in conf.items():
        b = b.config(k, PROVIDERS.get(v, v) if k == C.PROVIDER_CONF else v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def state_files(ck: str) -> dict[str, Any]:
    """The files Spark's state store left under ``<ck>/state``: count and bytes in all,
    and per partition directory (``state/<operator>/<partition>/...``)."""
    root = os.path.join(ck, "state")
    files = C.dir_files(root)
    parts: set[str] = set()
    for p in files:
        rel = os.path.relpath(p, root).split(os.sep)
        if len(rel) >= 3 and rel[1].isdigit():
            parts.add(rel[0] + "/" + rel[1])
    kinds: dict[str, int] = {}
    for p in files:
        m = re.search(r"\.([a-z]+)$", p)
        kinds[m.group(1) if m else "other"] = kinds.get(m.group(1) if m else "other", 0) + 1
    return {"files": len(files), "bytes": sum(files.values()), "partition_dirs": len(parts),
            "by_suffix": kinds}


def progress_sums(query) -> dict[str, Any]:
    """Trigger phases and state-operator figures summed over the query's micro-batches."""
    phases: dict[str, float] = {}
    ops: dict[str, float] = {}
    batches = data = 0
    for p in query.recentProgress:
        batches += 1
        data += int((p.numInputRows or 0) > 0)
        for k, v in (p.durationMs or {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
        for op in p.stateOperators or ():
            for k in ("numRowsTotal", "commitTimeMs", "allUpdatesTimeMs", "allRemovalsTimeMs",
                      "numStateStoreInstances", "memoryUsedBytes"):
                ops[k] = ops.get(k, 0) + float(getattr(op, k, 0) or 0)
            for k, v in (getattr(op, "customMetrics", None) or {}).items():
                ops["custom." + k] = ops.get("custom." + k, 0) + float(v or 0)
    return {"micro_batches": batches, "data_batches": data, "phases_ms": phases,
            "state_ops": ops}


def stage_cpu(spark) -> list[dict[str, Any]]:
    """Completed stages grouped by task count: stages, tasks, JVM CPU and run time (ms)."""
    ui = spark.sparkContext.uiWebUrl or f"http://127.0.0.1:{UI_PORT}"
    url = f"{ui}/api/v1/applications/{spark.sparkContext.applicationId}/stages?status=complete"
    with urllib.request.urlopen(url) as resp:
        stages = json.load(resp)
    groups: dict[int, dict[str, Any]] = {}
    for s in stages:
        g = groups.setdefault(int(s["numTasks"]), {"tasks_per_stage": int(s["numTasks"]),
                                                   "stages": 0, "cpu_ms": 0.0, "run_ms": 0.0,
                                                   "shuffle_write": 0})
        g["stages"] += 1
        g["cpu_ms"] += s.get("executorCpuTime", 0) / 1e6
        g["run_ms"] += s.get("executorRunTime", 0)
        g["shuffle_write"] += s.get("shuffleWriteBytes", 0)
    return sorted(groups.values(), key=lambda g: g["tasks_per_stage"])


def _number(text: str) -> float | None:
    """The total of a SQL metric's text: '1.2 s', '35 ms (...)', '1,024' or 'total (min, med,
    max ...)\n5 ms (...)'; ``None`` for what is not a number."""
    line = text.strip().splitlines()[-1] if "\n" in text.strip() else text.strip()
    m = re.match(r"([\d,.]+)\s*(ms|s|m|h|B|KiB|MiB|GiB)?", line)
    if not m:
        return None
    x = float(m.group(1).replace(",", ""))
    scale = {"s": 1e3, "m": 6e4, "h": 3.6e6, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
    return x * scale.get(m.group(2) or "", 1)


def sql_metrics(spark) -> dict[str, float]:
    """Spark's SQL metrics of every plan node (``node: metric`` -> total over the
    micro-batches, time in ms), from the REST API: the sort, the exchange, the state store
    and the Python runner each say what they took."""
    ui = spark.sparkContext.uiWebUrl or f"http://127.0.0.1:{UI_PORT}"
    url = (f"{ui}/api/v1/applications/{spark.sparkContext.applicationId}/sql"
           "?details=true&planDescription=false&length=100000")
    with urllib.request.urlopen(url) as resp:
        executions = json.load(resp)
    out: dict[str, float] = {}
    for e in executions:
        for node in e.get("nodes", ()):
            for m in node.get("metrics", ()):
                x = _number(str(m.get("value", "")))
                if x is not None:
                    key = f"{node['nodeName']}: {m['name']}"
                    out[key] = out.get(key, 0.0) + x
    return out


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and every process below it (the JVM,
    its threads, the Python workers), reaped children included: read from ``/proc``, so
    the measured query's share is the difference of two readings."""
    return sum(tree_cpu_by_kind().values())


def tree_cpu_by_kind() -> dict[str, float]:
    """:func:`tree_cpu_s` split into the driver (this process), the JVM (every thread:
    tasks, shuffle, RocksDB's native threads, the state-store maintenance) and the Python
    workers (the ``pyspark.daemon`` processes and the workers it forks)."""
    hz = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17)
        stats[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]) / hz)
    kinds = {"driver": 0.0, "jvm": 0.0, "python_workers": 0.0, "other": 0.0}
    mine, frontier = {os.getpid()}, [(os.getpid(), "driver")]
    while frontier:
        pid, kind = frontier.pop()
        kinds[kind] += stats.get(pid, (0, 0.0))[1]
        for p, (ppid, _) in stats.items():
            if ppid == pid and p not in mine:
                mine.add(p)
                frontier.append((p, _kind(p, kind)))
    return kinds


def _kind(pid: int, parent_kind: str) -> str:
    if parent_kind == "python_workers":
        return parent_kind
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ")
    except OSError:
        return "other"
    if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
        return "python_workers"
    return "jvm" if b"java" in cmd else "other"


def run_once(args: argparse.Namespace, conf: dict[str, str]) -> dict[str, Any]:
    """One measured query in this process (after a warm-up query); the ``RESULT`` dict."""
    C.setup_env()
    import workloads as W

    from statebackend import RocksDBStateBackend, StateBackendOptions

    spark = session(args.shuffle_partitions, conf, args.stages)
    work = tempfile.mkdtemp(prefix="sb-placement-")
    system = C.BY_NAME[args.system]
    try:
        warm, inp = os.path.join(work, "warm"), os.path.join(work, "input")
        W.make_input(warm, 100, 2_000, 2)
        W.make_input(inp, args.keys, args.events, args.batches)
        out: dict[str, Any] = {}
        for tag, src in (("warm", warm), ("run", inp)):
            backend = RocksDBStateBackend(os.path.join(work, "state-" + tag), StateBackendOptions(
                parallelism=args.partitions, local_dir=os.path.join(work, "local-" + tag),
                placement=args.placement))
            ck = os.path.join(work, "ck-" + tag)
            build = C.build_query(system, "count", backend)
            rows = [0]

            def sink(df, _batch_id, rows=rows):
                rows[0] += df.count()

            cpu0, t0 = tree_cpu_by_kind(), time.perf_counter()
            q = C.start_query(spark, system, "count", build, src, ck, sink)
            q.awaitTermination()
            seconds, cpu1 = time.perf_counter() - t0, tree_cpu_by_kind()
            by_kind = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
            cpu = sum(by_kind.values())
            if tag == "warm":
                continue
            out = {"system": args.system, "placement": args.placement,
                   "shuffle_partitions": args.shuffle_partitions, "conf": conf,
                   "keys": args.keys, "events": args.events, "batches": args.batches,
                   "query_s": seconds, "query_cpu_s": cpu, "query_cpu_by_kind_s": by_kind,
                   "output_rows": rows[0],
                   "trigger_ms": C.trigger_ms(q), **progress_sums(q),
                   "spark_state": state_files(ck), "load_1m": os.getloadavg()[0]}
        if args.stages:
            # warm-up included in both: compare like with like
            out["stages"] = stage_cpu(spark)
            out["sql_metrics"] = sql_metrics(spark)
        return out
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


# --- the A/B driver ------------------------------------------------------------------------


def perf_available() -> dict[str, bool]:
    """Which of ``task-clock`` and ``instructions:u`` ``perf stat`` counts here."""
    have = {"task-clock": False, "instructions:u": False}
    try:
        r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u,task-clock", "true"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return have
    for line in r.stderr.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in have:
            have[f[2]] = not f[0].startswith("<")
    return have


def parse_perf(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in ("instructions:u", "task-clock") and not f[0].startswith("<"):
            out[f[2]] = float(f[0])
    return out


def child(args: argparse.Namespace, system: str, placement: str, sp: int,
          perf: dict[str, bool], code: str | None = None) -> dict[str, Any]:
    """One run as a child process under ``perf stat`` (whole process tree); ``code``: the
    checkout to run instead of this one (it needs this file in its ``benchmarks/``)."""
    root = code or os.path.dirname(C.HERE)
    cmd = [sys.executable, "-m", "benchmarks.placement_cost", "--placement", placement,
           "--system", system, "--shuffle-partitions", str(sp), "--keys", str(args.keys),
           "--events", str(args.events), "--batches", str(args.batches),
           "--partitions", str(args.partitions),
           *(x for kv in args.conf for x in ("--conf", kv))]
    events = [e for e, ok in perf.items() if ok]
    fd, perf_out = tempfile.mkstemp(prefix="sb-perf-")
    os.close(fd)
    if events:
        cmd = ["perf", "stat", "-x,", "-o", perf_out, "-e", ",".join(events), *cmd]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if p and os.path.abspath(p) != os.path.dirname(C.HERE)]))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    res = next(json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT "))
    with open(perf_out) as fh:
        counts = parse_perf(fh.read())
    os.remove(perf_out)
    res.update(process_wall_s=wall, load_1m_start=load, load_1m_end=os.getloadavg()[0],
               cpu_s=counts.get("task-clock", 0.0) / 1000 or None,
               instructions=counts.get("instructions:u"))
    return res


def spread(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{np.median(xs):,.2f} ({min(xs):,.2f}-{max(xs):,.2f})"


def summary(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    configs = sorted({(r["shuffle_partitions"], r["system"]) for r in runs})
    for sp, system in configs:
        lines.append(f"\n{system}, spark.sql.shuffle.partitions={sp}: median (min-max) over "
                     f"{len({r['round'] for r in runs})} rounds")
        arms = sorted({r["arm"] for r in runs}, key=lambda a: (a != "shuffle", a))
        by = {a: [r for r in runs if (r["shuffle_partitions"], r["system"], r["arm"])
                  == (sp, system, a)] for a in arms}
        for pl, rs in by.items():
            ops = [r["state_ops"] for r in rs]
            lines.append(
                f"  {pl:12} process wall {spread([r['process_wall_s'] for r in rs])} s, "
                f"query {spread([r['query_s'] for r in rs])} s, "
                f"query CPU {spread([r['query_cpu_s'] for r in rs])} s, "
                f"CPU {spread([r['cpu_s'] for r in rs])} s"
                + (f", instructions {spread([r['instructions'] / 1e9 for r in rs])} G"
                   if all(r.get("instructions") for r in rs) else "")
                + f", micro-batches {spread([r['micro_batches'] for r in rs])}"
                + f", state-store instances {spread([o.get('numStateStoreInstances', 0) for o in ops])}"
                + f", commit {spread([o.get('commitTimeMs', 0) for o in ops])} ms"
                + f", state files {spread([r['spark_state']['files'] for r in rs])}"
                + f", load {spread([r['load_1m_start'] for r in rs])}")
        for a, b in [(a, "shuffle") for a in arms if a != "shuffle"] + (
                [("carrier", "carrier@base")] if "carrier@base" in arms else []):
            pairs = list(zip(by[a], by[b]))
            for what in ("process_wall_s", "query_s", "query_cpu_s", "cpu_s", "instructions"):
                ratios = [x[what] / y[what] for x, y in pairs if x.get(what) and y.get(what)]
                if ratios:
                    lines.append(f"  {a} / {b}, {what}: "
                                 + ", ".join(f"{x:.3f}" for x in ratios)
                                 + f" (median {np.median(ratios):.3f})")
    return lines


def ab(args: argparse.Namespace) -> int:
    perf = perf_available()
    sps = [int(x) for x in args.shuffle_partitions_list.split(",") if x.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    print(f"placement cost: local[2], {args.keys:,} keys, {args.events:,} events, "
          f"{args.batches} batches, shuffle partitions {sps}, {args.rounds} rounds; perf counts "
          f"{[e for e, ok in perf.items() if ok] or 'nothing'}; load {os.getloadavg()[0]:.1f}",
          flush=True)
    runs = []
    for rnd in range(args.rounds):
        for sp in sps:
            for system in systems:
                # alternate which arm goes first, so a drifting load favours none
                arms = [("shuffle", "shuffle", None), ("carrier", "carrier", None)]
                if args.baseline_code:
                    arms.append(("carrier@base", "carrier", args.baseline_code))
                order = arms if rnd % 2 == 0 else arms[::-1]
                for arm, placement, code in order:
                    r = child(args, system, placement, sp, perf, code)
                    r["round"], r["arm"] = rnd, arm
                    runs.append(r)
                    print(f"[round {rnd + 1}] {system:9} sp={sp:<4} {arm:12} "
                          f"process {r['process_wall_s']:6.1f} s  query {r['query_s']:6.1f} s  "
                          f"query CPU {r['query_cpu_s']:6.1f} s  "
                          f"CPU {r['cpu_s'] or 0:6.1f} s"
                          + (f"  {r['instructions'] / 1e9:,.1f} G instr"
                             if r.get("instructions") else "")
                          + f"  micro-batches {r['micro_batches']}  "
                          f"state files {r['spark_state']['files']}  "
                          f"load {r['load_1m_start']:.1f}->{r['load_1m_end']:.1f}", flush=True)
    print("\n".join(summary(runs)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "placement_cost.json")
    with open(path, "w") as fh:
        json.dump({"args": vars(args), "machine": C.machine(), "perf": perf, "runs": runs},
                  fh, indent=1)
    print(f"\nJSON written to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.placement_cost",
                                 description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]))
    ap.add_argument("--ab", action="store_true", help="run both plans in alternated child "
                    "processes under perf stat")
    ap.add_argument("--placement", choices=PLACEMENTS, default="carrier")
    ap.add_argument("--system", choices=SYSTEMS, default="ours-tws")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="--ab: comma separated")
    ap.add_argument("--shuffle-partitions", dest="shuffle_partitions_list", default="2,200",
                    help="spark.sql.shuffle.partitions: one value for a run, comma separated "
                         "for --ab (default 2,200)")
    ap.add_argument("--partitions", type=int, default=2, help="our parallelism")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", action="store_true",
                    help="a run: JVM CPU per stage from Spark's REST API (UI on)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark conf for every run (repeatable; the provider also takes "
                         "'rocksdb' or 'hdfs')")
    ap.add_argument("--baseline-code", default=None, metavar="PATH",
                    help="--ab: also run the carrier from this checkout (with this file "
                         "copied into its benchmarks/), as the arm 'carrier@base'")
    ap.add_argument("--out", default="bench-out")
    args = ap.parse_args(argv)
    conf = C.key_values(ap, "--conf", args.conf)
    if args.ab:
        return ab(args)
    args.shuffle_partitions = int(args.shuffle_partitions_list.split(",")[0])
    conf.setdefault(NO_DATA_CONF, "true")  # Spark's default, said out loud
    print("RESULT " + json.dumps(run_once(args, conf)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
