"""Instructions the per-key task path executes, counted by callgrind: an A/B of two
versions of the code that does not depend on what else the machine is doing.

    python benchmarks/bench_instructions.py --workloads noop,count --keys 2000 --batches 3
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_instructions.py ...   # the B side
    python benchmarks/bench_instructions.py --carrier ...   # as the carrier plan calls it

Each workload runs ``runner.run_partition`` (restore, group, process, checkpoint, close) over
the same batches as ``bench_task.py``; imports and a first batch run before counting starts,
so the count is the steady-state task, per key per batch. Wall-clock figures on a loaded
two-core machine swing by +-20%; the task thread's instruction count repeats to well under
1%, which is what a 2% budget needs (RocksDB's background threads are counted apart: see
:func:`count`). Needs
valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def count(workload: str, keys: int, rows: int, batches: int,
          progress_metrics: bool = True, carrier: bool = False) -> tuple[int, int]:
    """Instructions of ``batches`` steady-state tasks of ``workload`` (a child under
    callgrind that switches counting on after its warm-up): the task's own thread, and all
    threads together.

    The task's thread is the figure to compare: the other threads (RocksDB's flushes and
    compactions, the upload pool) run beside it, and whether a background compaction
    falls inside the counted batches can swing the all-threads total by ~10% between two
    versions of the code that differ in nothing the task does (one more attribute on an
    object moved noop from 56,4xx to 61,9xx per key per batch, all of it in other threads).
    """
    out_dir = tempfile.mkdtemp(prefix="sb-callgrind-")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={out_dir}/cg.%p", sys.executable, __file__, "--child",
           "--workloads", workload, "--keys", str(keys), "--rows", str(rows),
           "--batches", str(batches), *(() if progress_metrics else ("--no-progress-metrics",)),
           *(("--carrier",) if carrier else ())]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    main_thread = every = 0
    for path in glob.glob(f"{out_dir}/cg.*"):
        n = 0
        with open(path) as fh:
            for line in fh:
                m = re.match(r"(?:summary|totals):\s+(\d+)", line)
                if m:
                    n = max(n, int(m.group(1)))
        every += n
        if path.endswith("-01"):  # callgrind numbers threads from 1: the main thread
            main_thread = n
    return main_thread, every


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, HERE)
    import bench_task as T

    from statebackend.task import runner

    workdir = tempfile.mkdtemp(prefix="sb-instr-")
    data = [T.make_batch(args.keys, args.rows, seed) for seed in range(args.batches + 1)]
    config = T.config_for(os.path.join(workdir, "durable"), os.path.join(workdir, "local"),
                          f"bench-{args.workloads}")
    config, process = T.task_process(args.workloads, config)
    if hasattr(config, "progress_columns") and args.progress_metrics:
        # a streaming task: its row of metrics too
        config = dataclasses.replace(config, progress_columns={"k": None, "v": None})
    pid = str(os.getpid())
    saved = runner.task_identity
    try:
        for b, pdf in enumerate(data):
            if b == 1:  # batch 0 (first open, codec compilation) runs before counting
                # The objects of the imports and the warm-up are moved out of the
                # collector's reach: otherwise whether a full collection over pyspark's and
                # pandas' objects (~30 M instructions) falls inside the counted batches
                # swings the figure by ~10% with code changes that allocate nothing more.
                gc.collect()
                gc.freeze()
                subprocess.run(["callgrind_control", "-i", "on", pid], check=True,
                               stdout=subprocess.DEVNULL)
            runner.task_identity = lambda _c, _p=None, b=b: (b, 0, f"bench-{b}")
            if args.carrier:
                # what the carrier's group function adds around the same task
                # (statebackend/spark/carrier.py, ``carry``): its partition named, the
                # output collected before it is yielded
                for _ in list(runner.run_partition(config, T.arrow_batches(pdf), process,
                                                   partition=0)):
                    pass
            else:
                for _ in runner.run_partition(config, T.arrow_batches(pdf), process):
                    pass
    finally:
        runner.task_identity = saved
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True,
                       stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="noop,count")
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--batches", type=int, default=3, help="counted batches (after a warm-up)")
    ap.add_argument("--no-progress-metrics", dest="progress_metrics", action="store_false",
                    help="tasks without their row of metrics for Spark's progress (as "
                         "progress_metrics=False): the baseline of the metrics' cost")
    ap.add_argument("--carrier", action="store_true",
                    help="call the task as the carrier plan's group function does (its "
                         "partition named, output collected): the carrier's own Python work; "
                         "PySpark's applyInPandasWithState framing is not counted")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    import statebackend

    print(f"code: {os.path.dirname(statebackend.__file__)}, progress metrics "
          f"{'on' if args.progress_metrics else 'off'}, "
          f"{'carrier' if args.carrier else 'shuffle'} plan's call")
    for w in args.workloads.split(","):
        n, every = count(w, args.keys, args.rows, args.batches, args.progress_metrics,
                         args.carrier)
        per_key = n / (args.keys * args.batches)
        print(f"{w}: {n:,} instructions in the task's thread over {args.batches} batches of "
              f"{args.rows:,} rows ({args.keys:,} keys): {per_key:,.0f} per key per batch "
              f"(all threads: {every / (args.keys * args.batches):,.0f})")


if __name__ == "__main__":
    main()
