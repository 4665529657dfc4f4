"""Local-recovery hit rate on a cluster, and durable restore speed against S3 (moto).

``local-cluster[2,1,1024]`` (two executors, each its own JVM, Python workers and
``local_dir`` through ``{executor_id}``, as separate hosts), state on S3 through s3fs
against a moto server in its own process. A running count (``map_in_pandas``) runs:

1. ``steady``: ``--batches`` micro-batches, no failure;
2. ``executor lost``: the JVM of executor 1 is killed (SIGKILL) after the last steady
   batch, and ``--after`` more batches run (Spark starts a replacement executor);
3. ``restarted``: the query stops and a new query (new backend object, same checkpoint)
   runs ``--after`` more batches.

For every partition of every micro-batch the manifest's restore metrics say where the
task found the state of the batch before: its working directory or local copy (a hit:
the task ran on the executor that wrote that state) or durable storage (a miss). Then
``get_files`` of one partition-sized set of files is timed against the same moto server
for several ``download_threads`` (MB/s).

Usage::

    python -m benchmarks.cluster_recovery                    # 50 + 10 + 10 batches
    python -m benchmarks.cluster_recovery --batches 20 --after 5 --partitions 4
    python -m benchmarks.cluster_recovery --conf spark.locality.wait=10s
    python -m benchmarks.cluster_recovery --shared-local-dir   # one local_dir per machine
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict

from . import compare
from .workloads import OUT, make_input, padded_count, vector_count

OP = "counts"
# resident: the instance the partition's worker kept open (keep_instances_open)
SOURCES = ("resident", "working_dir", "local_copy", "durable", "empty", "carried")
HITS = ("resident", "working_dir", "local_copy")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen, str]:
    """A moto S3 server in its own process (so it does not share our GIL)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto server did not start")


def s3_options(endpoint: str) -> dict:
    return {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "key": "testing", "secret": "testing", "skip_instance_cache": True,
            "use_listings_cache": False}


def make_bucket(endpoint: str) -> str:
    import boto3

    bucket = f"sb-bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing"
                 ).create_bucket(Bucket=bucket)
    return bucket


def executor_jvms() -> dict[str, int]:
    """Executor id -> pid of the executor JVMs below this process."""
    from statebackend.task.executor import executor_id_from_cmdline

    me = os.getpid()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = [a.decode() for a in fh.read().split(b"\0") if a]
        except OSError:
            continue
        if not any("CoarseGrainedExecutorBackend" in a for a in argv):
            continue
        pid, ancestor = int(name), int(name)
        for _ in range(8):  # is it ours? (worker JVM -> executor JVM)
            try:
                with open(f"/proc/{ancestor}/stat") as fh:
                    ancestor = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            if ancestor == me:
                eid = executor_id_from_cmdline(argv)
                if eid is not None:
                    out[eid] = pid
                break
    return out


def fill_first_batch(in_dir: str, keys: int) -> None:
    """Make batch 0 hold every key once, so that the state has all ``keys`` from batch 0
    on (``--value-bytes``: the state's size is then keys x value bytes)."""
    import pandas as pd

    file = os.path.join(in_dir, "part-00000.parquet")
    st = os.stat(file)
    first = pd.read_parquet(file)
    pd.DataFrame({"k": [f"key-{i:07d}" for i in range(keys)],
                  "x": [0] * keys, "ts": first["ts"].min()}).to_parquet(
        file, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
    os.utime(file, (st.st_atime, st.st_mtime))  # keeps batch order


def run_query(spark, backend, in_dir: str, ck: str, kill_after: int | None = None,
              value_bytes: int = 0) -> dict:
    """Run the count over every file in ``in_dir`` (one per micro-batch); with
    ``kill_after``, kill executor 1's JVM once that batch's output is in; with
    ``value_bytes``, each key's state carries that many bytes of padding."""
    df = spark.readStream.schema("k STRING, x BIGINT, ts TIMESTAMP") \
        .option("maxFilesPerTrigger", 1).parquet(in_dir)
    func, state_schema = vector_count, "c BIGINT"
    if value_bytes:
        func = functools.partial(padded_count, value_bytes=value_bytes)
        state_schema = "c BIGINT, pad BINARY"
    out = backend.map_in_pandas(df, key="k", func=func, schema=OUT,
                                state_schema=state_schema, operator_id=OP,
                                output_mode="Append")
    info: dict = {"killed": None}

    def sink(batch_df, batch_id):
        batch_df.count()
        if kill_after is not None and batch_id == kill_after and info["killed"] is None:
            pid = executor_jvms().get("1")
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                info["killed"] = pid

    q = (out.writeStream.foreachBatch(sink).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    return info


def restores(backend, batches: range) -> list[dict]:
    """Restore metrics of every partition of the given (completed) checkpoints."""
    from statebackend.storage.manifests import read_manifest

    backend.complete(OP)
    coord = backend.coordinator(OP)
    rows = []
    for b in batches:
        record = coord.get(b)
        for partition, path in sorted(record.manifests.items()):
            metrics = read_manifest(coord.store, path, operator_id=OP).metrics
            r = metrics.get("restore") or {}
            rows.append({"batch": b, "partition": partition,
                         "source": str(r.get("source", "?")).split(".")[-1].lower(),
                         "bytes": int(r.get("bytes_downloaded", 0) or 0),
                         "files": int(r.get("files_downloaded", 0) or 0),
                         "seconds": float(r.get("duration_s", 0.0) or 0.0),
                         "executor": metrics.get("executor")})
    return rows


def loss_downloads(rows: list[dict], last_before: int, phase: range,
                   lost: str = "1") -> dict:
    """Which partitions restored from durable storage in ``phase`` (the micro-batches
    after executor ``lost`` was killed): those it ran at batch ``last_before`` (each should
    download once) and the others (which should not download at all)."""
    held = sorted(r["partition"] for r in rows
                  if r["batch"] == last_before and r["executor"] == lost)
    durable = [r for r in rows if r["batch"] in phase and r["source"] == "durable"]
    return {"lost_executor_partitions": held,
            "lost_partition_downloads": Counter(r["partition"] for r in durable
                                                if r["partition"] in held),
            "other_partition_downloads": Counter(r["partition"] for r in durable
                                                 if r["partition"] not in held)}


def state_bytes(backend, batch: int) -> int:
    """The state's size at ``batch``: the files its partitions' manifests name."""
    from statebackend.storage.manifests import read_manifest

    coord = backend.coordinator(OP)
    return sum(read_manifest(coord.store, path, operator_id=OP).full_size
               for path in coord.get(batch).manifests.values())


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summarize(name: str, rows: list[dict]) -> dict:
    counts = Counter(r["source"] for r in rows)
    hits = sum(counts[s] for s in HITS)
    total = sum(counts.values()) - counts["carried"]  # carried: no task ran, no restore
    batches = len({r["batch"] for r in rows})
    durable = [r for r in rows if r["source"] == "durable" and r["seconds"] > 0]
    by_source = defaultdict(list)
    for r in rows:
        by_source[r["source"]].append(r["seconds"])
    return {"phase": name, "restores": total, **{s: counts.get(s, 0) for s in SOURCES},
            "hit_rate": hits / total if total else float("nan"),
            "restore_s": {s: {"median": statistics.median(v), "p90": pct(v, 0.9),
                              "max": max(v)} for s, v in by_source.items()},
            "durable_mb": sum(r["bytes"] for r in durable) / 1e6,
            "durable_mb_per_batch": sum(r["bytes"] for r in durable) / 1e6 / max(1, batches),
            "durable_files_median": statistics.median([r["files"] for r in durable])
            if durable else 0,
            "durable_mb_s_median": statistics.median(
                [r["bytes"] / 1e6 / r["seconds"] for r in durable]) if durable else 0.0}


def download_rates(endpoint: str, bucket: str, files: int, file_mb: float,
                   threads: list[int], repeats: int) -> list[dict]:
    """MB/s of ``get_files`` for ``files`` files of ``file_mb`` MB per thread count."""
    from statebackend.storage.fsspec_store import open_store

    work = tempfile.mkdtemp(prefix="sb-dl-")
    try:
        src = os.path.join(work, "src")
        os.makedirs(src)
        rng = os.urandom
        up = open_store(f"s3://{bucket}/dl", storage_options=s3_options(endpoint),
                        upload_threads=8)
        pairs = []
        for i in range(files):
            p = os.path.join(src, f"f{i:03d}.sst")
            with open(p, "wb") as fh:
                fh.write(rng(int(file_mb * 1e6)))
            pairs.append((p, f"f{i:03d}.sst"))
        up.put_files(pairs)
        out = []
        for n in threads:
            store = open_store(f"s3://{bucket}/dl", storage_options=s3_options(endpoint),
                               download_threads=n)
            times = []
            for rep in range(repeats):
                dst = os.path.join(work, f"dst-{n}-{rep}")
                t0 = time.perf_counter()
                store.get_files([(name, os.path.join(dst, name)) for _p, name in pairs])
                times.append(time.perf_counter() - t0)
                shutil.rmtree(dst)
            mb = files * file_mb
            out.append({"download_threads": n, "mb": mb,
                        "mb_s_median": mb / statistics.median(times),
                        "mb_s_worst": mb / max(times)})
            store.close()
        up.close()
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_tables(phases: list[dict], rates: list[dict]) -> None:
    print("\nLocal-recovery hit rate (restores per partition and micro-batch)")
    print(f"{'phase':<15}{'restores':>9}{'resident':>9}{'working_dir':>12}{'local_copy':>11}"
          f"{'durable':>9}{'hit rate':>9}{'MB/batch':>9}  "
          f"{'durable restore s (median/p90/max)':<36}{'MB/s':>6}")
    for p in phases:
        d = p["restore_s"].get("durable")
        dtxt = f"{d['median']:.2f}/{d['p90']:.2f}/{d['max']:.2f}" if d else "-"
        print(f"{p['phase']:<15}{p['restores']:>9}{p['resident']:>9}{p['working_dir']:>12}"
              f"{p['local_copy']:>11}{p['durable']:>9}{p['hit_rate']:>9.0%}"
              f"{p['durable_mb_per_batch']:>9.2f}  {dtxt:<36}"
              f"{p['durable_mb_s_median']:>6.1f}")
    print("\nget_files against moto (S3 API, one process, loopback)")
    print(f"{'download_threads':>17}{'MB':>8}{'MB/s median':>13}{'MB/s worst':>12}")
    for r in rates:
        print(f"{r['download_threads']:>17}{r['mb']:>8.0f}{r['mb_s_median']:>13.1f}"
              f"{r['mb_s_worst']:>12.1f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=50, help="steady-state micro-batches")
    ap.add_argument("--after", type=int, default=10,
                    help="micro-batches after the executor loss, and after the restart")
    ap.add_argument("--partitions", type=int, default=4, help="state partitions")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--events-per-batch", type=int, default=20_000)
    ap.add_argument("--value-bytes", type=int, default=0,
                    help="incompressible bytes of state per key beside its count; with it, "
                         "batch 0 holds every key once, so the state is about keys x "
                         "value bytes from batch 0 on (e.g. --keys 270000 --value-bytes 4000: "
                         "~1.1 GB)")
    ap.add_argument("--download-files", type=int, default=16)
    ap.add_argument("--download-file-mb", type=float, default=4.0)
    ap.add_argument("--threads", default="1,4,8,16", help="download_threads to time")
    ap.add_argument("--conf", action="append", default=[],
                    help="extra Spark conf key=value (e.g. spark.locality.wait=10s)")
    ap.add_argument("--shared-local-dir", action="store_true",
                    help="one local_dir for both executors (no {executor_id}): executors of "
                         "one machine share local state")
    ap.add_argument("--placement", choices=("auto", "shuffle", "carrier"), default="auto",
                    help="StateBackendOptions.placement (default: the options' default, "
                         "auto, which runs a new query on a cluster in the carrier)")
    ap.add_argument("--executors", type=int, default=2, help="local-cluster executors")
    ap.add_argument("--json", help="also write the figures to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    compare.setup_env()
    from statebackend import RocksDBStateBackend, StateBackendOptions

    # executors unpickle benchmarks.workloads functions: the repository root on their path
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    conf = {"spark.executor.memory": "512m",
            "spark.executorEnv.PYTHONPATH": os.pathsep.join([root, os.environ["PYTHONPATH"]])}
    conf.update(kv.split("=", 1) for kv in args.conf)
    work = tempfile.mkdtemp(prefix="sb-cluster-")
    moto, endpoint = start_moto()
    spark = None
    try:
        bucket = make_bucket(endpoint)
        in_dir, ck = os.path.join(work, "in"), os.path.join(work, "ck")
        per = args.events_per_batch
        steady, after = args.batches, args.after
        make_input(in_dir, args.keys, per * (steady + after), steady + after)
        if args.value_bytes:
            fill_first_batch(in_dir, args.keys)
        spark = compare.start_session("statebackend-cluster-recovery", args.partitions,
                                      master=f"local-cluster[{args.executors},1,1024]",
                                      conf=conf)

        def backend():
            return RocksDBStateBackend(f"s3://{bucket}/state", StateBackendOptions(
                parallelism=args.partitions, placement=args.placement,
                num_retained=steady + 2 * after + 1,  # every batch's restore metrics stay
                local_dir=os.path.join(work, "local", "" if args.shared_local_dir
                                       else "{executor_id}")),
                storage_options=s3_options(endpoint))

        be = backend()
        t0 = time.perf_counter()
        info = run_query(spark, be, in_dir, ck, kill_after=steady - 1,
                         value_bytes=args.value_bytes)
        run1_s = time.perf_counter() - t0
        make_input(in_dir, args.keys, per * after, after, first_batch=steady + after)
        be = backend()
        run_query(spark, be, in_dir, ck, value_bytes=args.value_bytes)
        total = steady + 2 * after
        rows = restores(be, range(1, total))  # batch 0 starts empty
        size = state_bytes(be, total - 1)
        phases = [summarize("steady", [r for r in rows if r["batch"] < steady]),
                  summarize("executor lost", [r for r in rows
                                              if steady <= r["batch"] < steady + after]),
                  summarize("restarted", [r for r in rows if r["batch"] >= steady + after])]
        loss = loss_downloads(rows, steady - 1, range(steady, steady + after))
        spark.stop()
        spark = None
        rates = download_rates(endpoint, bucket, args.download_files, args.download_file_mb,
                               [int(t) for t in args.threads.split(",")], repeats=3)
        print_tables(phases, rates)
        with open("/proc/loadavg") as fh:
            load = fh.read().split()[:3]
        print(f"\nexecutor 1 killed: {'pid ' + str(info['killed']) if info['killed'] else 'NO'}"
              f"; first run {run1_s:.0f} s for {steady + after} batches; load {' '.join(load)};"
              f" confs {args.conf or 'default'}; placement {args.placement};"
              f" {args.executors} executors;"
              f" local_dir {'shared' if args.shared_local_dir else 'per executor'};"
              f" state {size / 1e6:.0f} MB at the last batch")
        print(f"executor 1 held partitions {loss['lost_executor_partitions']} before the loss;"
              f" durable restores after it: {dict(loss['lost_partition_downloads'])} of those,"
              f" {dict(loss['other_partition_downloads'])} of the others (partition: count)")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"phases": phases, "download": rates, "rows": rows,
                           "killed": info["killed"], "load": load, "loss": loss,
                           "state_bytes": size, "args": vars(args)},
                          fh, indent=1)
        return 0
    finally:
        if spark is not None:
            spark.stop()
        moto.terminate()
        moto.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
