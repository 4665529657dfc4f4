"""Requests per checkpoint, per restore and per completion, and transfer rates, against S3
(moto's server on 127.0.0.1, through s3fs).

Run::

    python -m benchmarks.object_store                  # both parts
    python -m benchmarks.object_store --part requests  # or: --part transfer

*requests*: ``--partitions`` partitions of real RocksDB state (``--keys`` keys of 100-byte
values each) go through ``--checkpoints`` checkpoints the way Spark tasks take them (restore
the previous checkpoint from the working directory, update ``--churn`` of the keys,
checkpoint, upload, publish); the coordinator completes each checkpoint and collects
garbage. Printed per checkpoint: the requests of the tasks (summed), of the completion and
of the GC, from the store's request accounting; then a restore of every partition from
durable storage on a fresh local directory (a lost host).

*transfer*: MB/s of uploads and downloads of ``--files`` files of ``--file-mb`` MiB with the
store's pools (4 threads each, the defaults), and of one large file (a multipart upload and
parallel ranged GETs of 16 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.coordinator import CheckpointCoordinator, key_group_range
from statebackend.model.manifest import StateDescriptor
from statebackend.options import StateBackendOptions
from statebackend.storage import FsspecStore, open_store
from statebackend.storage.accounting import RequestCounts

OP = "bench"
STATES = (StateDescriptor("v", "value", value_schema="v binary"),)
MiB = 1024 * 1024


def moto() -> tuple[Any, str, dict[str, Any]]:
    """A moto S3 server on a free port, a fresh bucket, and the store options."""
    import logging
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket)
    options = {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
               "skip_instance_cache": True, "use_listings_cache": False}
    return server, f"s3://{bucket}/state", options


def _sum(xs: list[RequestCounts]) -> RequestCounts:
    out = RequestCounts()
    for x in xs:
        out = out + x
    return out


def run_requests(store: FsspecStore, work: str, partitions: int, checkpoints: int,
                 keys: int, churn: float) -> dict[str, Any]:
    rng = random.Random(7)
    opts = StateBackendOptions()
    maxp = 128
    coord = CheckpointCoordinator(store, OP, partitions, maxp, num_retained=3)
    bases: dict[int, Any] = {}
    rows = []
    for n in range(checkpoints):
        task: list[RequestCounts] = []
        for p in range(partitions):
            cp = PartitionCheckpointer(store, OP, p, opts, os.path.join(work, f"local-{p}"))
            c0 = store.request_counts()
            inst, _ = cp.restore(bases.get(p))
            c1 = store.request_counts()
            k = keys if n == 0 else int(keys * churn)
            inst.write({"default": {b"%02d%08d" % (p, rng.randrange(keys)) if n else
                                    b"%02d%08d" % (p, i): os.urandom(100) for i in range(k)}})
            m, metrics = cp.checkpoint(inst, n, f"a{n}", key_group_range(p, partitions, maxp),
                                       STATES)
            inst.close()
            bases[p] = m
            task.append(store.request_counts() - c1)
            assert (c1 - c0).requests == 0  # steady state: the working directory, no request
            assert RequestCounts.from_dict(m.metrics["checkpoint_requests"]).put == \
                metrics.files_uploaded + 1
        c0 = store.request_counts()
        coord.try_complete(n)
        comp = coord.last_completion_requests or RequestCounts()
        gc = store.request_counts() - c0 - comp
        t = _sum(task)
        files = sum(RequestCounts.from_dict(bases[p].metrics["checkpoint_requests"]).put - 1
                    for p in range(partitions))
        rows.append({"checkpoint": n, "files_uploaded": files,
                     "bytes_uploaded": t.bytes_up, "tasks": t.to_dict(),
                     "completion": comp.to_dict(), "gc": gc.to_dict()})
        print(f"  chk {n}: tasks PUT {t.put} (files {files} + {partitions} manifests) "
              f"parts {t.parts} HEAD {t.head} GET {t.get} LIST {t.list} "
              f"({t.bytes_up / MiB:.1f} MiB up); completion LIST {comp.list} GET {comp.get} "
              f"PUT {comp.put} HEAD {comp.head}; gc LIST {gc.list} DELETE {gc.delete} "
              f"GET {gc.get} PUT {gc.put}", flush=True)
    # a lost host: every partition restores from durable storage on a fresh directory
    restore: list[RequestCounts] = []
    t0 = time.perf_counter()
    for p in range(partitions):
        cp = PartitionCheckpointer(store, OP, p, opts, os.path.join(work, f"new-host-{p}"))
        c0 = store.request_counts()
        inst, rm = cp.restore(bases[p])
        inst.close()
        restore.append(store.request_counts() - c0)
        assert rm.source.value == "durable"
    dt = time.perf_counter() - t0
    r = _sum(restore)
    coord.close()
    print(f"  restore of {partitions} partitions from durable: GET {r.get} LIST {r.list} "
          f"HEAD {r.head}, {r.bytes_down / MiB:.1f} MiB in {dt:.2f} s", flush=True)
    return {"checkpoints": rows, "restore": {**r.to_dict(), "seconds": dt}}


def run_transfer(store: FsspecStore, work: str, files: int, file_mb: int,
                 big_mb: int, repeats: int) -> dict[str, Any]:
    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    paths = []
    for i in range(files):
        p = os.path.join(src, f"{i}.sst")
        with open(p, "wb") as fh:
            fh.write(os.urandom(file_mb * MiB))
        paths.append(p)
    big = os.path.join(src, "big.sst")
    with open(big, "wb") as fh:
        fh.write(os.urandom(big_mb * MiB))
    out: dict[str, list[float]] = {"upload_many": [], "download_many": [],
                                   "upload_one": [], "download_one": []}
    for r in range(repeats):
        pre = f"t{r}-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        ups = store.put_files([(p, f"{pre}/{i}.sst") for i, p in enumerate(paths)])
        t1 = time.perf_counter()
        store.get_files([(u.path, os.path.join(work, "dl", pre, f"{i}"), u.size, u.checksum)
                         for i, u in enumerate(ups)])
        t2 = time.perf_counter()
        up = store.put_file(big, f"{pre}/big.sst")
        t3 = time.perf_counter()
        store.get_file(up.path, os.path.join(work, "dl", pre, "big"), size=up.size,
                       checksum=up.checksum)
        t4 = time.perf_counter()
        mb = files * file_mb
        out["upload_many"].append(mb / (t1 - t0))
        out["download_many"].append(mb / (t2 - t1))
        out["upload_one"].append(big_mb / (t3 - t2))
        out["download_one"].append(big_mb / (t4 - t3))
        shutil.rmtree(os.path.join(work, "dl"), ignore_errors=True)
        store.delete([u.path for u in ups] + [up.path])
    return {k: {"median_MBps": statistics.median(v), "min_MBps": min(v), "max_MBps": max(v)}
            for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["requests", "transfer", "both"], default="both")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--checkpoints", type=int, default=8)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--churn", type=float, default=0.01)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mb", type=int, default=16)
    ap.add_argument("--big-mb", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part-mb", type=int, default=16,
                    help="multipart part size and ranged-GET chunk (MiB)")
    args = ap.parse_args(argv)
    server, url, options = moto()
    work = tempfile.mkdtemp(prefix="sb-objstore-")
    result: dict[str, Any] = {"load_1m_before": os.getloadavg()[0]}
    try:
        store = open_store(url, storage_options=options, part_size=args.part_mb * MiB)
        if args.part in ("requests", "both"):
            print(f"requests: {args.partitions} partitions x {args.keys} keys, "
                  f"{args.checkpoints} checkpoints, churn {args.churn}", flush=True)
            result["requests"] = run_requests(store, work, args.partitions, args.checkpoints,
                                              args.keys, args.churn)
        if args.part in ("transfer", "both"):
            result["transfer"] = run_transfer(store, work, args.files, args.file_mb,
                                              args.big_mb, args.repeats)
            print("transfer:", json.dumps(result["transfer"]), flush=True)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()
    result["load_1m_after"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in result.items() if k != "requests"}))


if __name__ == "__main__":
    main()
