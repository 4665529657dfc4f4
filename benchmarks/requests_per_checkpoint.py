"""Object-store requests per checkpoint: what one task and one completion cost, counted.

    python benchmarks/requests_per_checkpoint.py                  # 2 partitions, 8 batches
    python benchmarks/requests_per_checkpoint.py --partitions 4 --batches 12 --mode changelog

Runs the task of each partition for each batch in this process (``run_partition``, the
Spark task identity patched in, as ``bench_task.py`` does) against a local checkpoint
location, completing each checkpoint with the driver's coordinator after its batch, and
prints, per steady batch (the first is left out: it claims the writer epoch and restores
nothing), the median requests by kind of:

* a task's restore (``restore_requests`` in its manifest: the record and manifest reads),
* a task's checkpoint (``checkpoint_requests``: uploads, the fencing check, the manifest),
* a completion (the listing, manifest reads, record, pointer, fencing checks) with the
  garbage collection it triggers.

Requests are those the store counts (``statebackend.storage.accounting``): on S3 each is
one HTTP request; the local filesystem is counted the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_task as BT  # noqa: E402

from statebackend.coordinator import CheckpointCoordinator  # noqa: E402
from statebackend.keys.groups import key_group  # noqa: E402
from statebackend.keys.ranges import key_group_range  # noqa: E402
from statebackend.options import StateBackendOptions  # noqa: E402
from statebackend.storage import open_store  # noqa: E402
from statebackend.storage.manifests import read_completed_record, read_manifest  # noqa: E402
from statebackend.task import runner  # noqa: E402
from statebackend.task.context import OperatorConfig  # noqa: E402

KINDS = ("put", "get", "head", "list", "delete")


def run(workdir: str, partitions: int, batches: int, keys: int, mode: str) -> dict:
    durable = os.path.join(workdir, "durable")
    op = "requests"
    opts = StateBackendOptions(parallelism=partitions, max_parallelism=BT.MAXP,
                               local_dir=os.path.join(workdir, "local"), checkpoint_mode=mode)
    config = OperatorConfig(operator_id=op, checkpoint_location=durable, storage_options={},
                            options=opts, parallelism=partitions, key=BT.SPEC)
    config, process = BT.task_process("count", config)
    store = open_store(durable)
    coord = CheckpointCoordinator(store, op, partitions, BT.MAXP, num_retained=2)
    data = [BT.make_batch(keys, keys * 2, seed) for seed in range(batches)]
    completions = []
    original = runner.task_identity
    try:
        for b, pdf in enumerate(data):
            kg = pdf["k"].map(lambda k: key_group([k], ["string"], BT.MAXP)).to_numpy()
            for p in range(partitions):
                rng = key_group_range(p, partitions, BT.MAXP)
                part = pdf[(kg >= rng.start) & (kg <= rng.end)].reset_index(drop=True)
                runner.task_identity = lambda _c, _partition, b=b, p=p: (b, p, f"t-{b}-{p}")
                for _ in runner.run_partition(config, BT.arrow_batches(part), process):
                    pass
            before = store.request_counts()
            coord.try_complete(b)
            coord.wait_for_gc()
            completions.append((store.request_counts() - before).to_dict())
    finally:
        runner.task_identity = original
    ostore = store.child(op)
    tasks = {"restore": [], "checkpoint": []}
    for b in range(1, batches):
        rec = read_completed_record(ostore, b)
        if rec is None:
            continue
        for path in rec.manifests.values():
            m = read_manifest(ostore, path).metrics
            tasks["restore"].append(m.get("restore_requests", {}))
            tasks["checkpoint"].append(m.get("checkpoint_requests", {}))
    med = {k: {kind: float(np.median([d.get(kind, 0) for d in v])) for kind in KINDS}
           for k, v in tasks.items()}
    med["completion"] = {kind: float(np.median([d.get(kind, 0) for d in completions[1:]]))
                         for kind in KINDS}
    return med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--keys", type=int, default=2_000)
    ap.add_argument("--mode", choices=["incremental", "changelog"], default="incremental")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="sb-requests-")
    try:
        med = run(workdir, args.partitions, args.batches, args.keys, args.mode)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(med))
        return 0
    print(f"{args.mode}: {args.partitions} partitions, {args.batches} batches, median requests "
          f"per steady batch")
    print(f"{'':12}" + "".join(f"{k:>8}" for k in KINDS))
    for what, row in med.items():
        print(f"{what:12}" + "".join(f"{row[k]:>8g}" for k in KINDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
