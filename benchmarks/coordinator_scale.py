"""The driver at 1,000 and 10,000 partitions, over a store that charges per-request latency.

Run::

    python -m benchmarks.coordinator_scale                       # 1,000 and 10,000 partitions
    python -m benchmarks.coordinator_scale --partitions 1000 --checkpoints 20 --latency-ms 20

Simulated partitions write what a real partition checkpoint writes (new SSTs under their
attempt directory, reuse of the base manifest's shared files, CURRENT/OPTIONS, the manifest
last) into an in-memory filesystem, for free: task time is not driver time. The coordinator
reads and writes the same filesystem through an
:class:`~statebackend.storage.accounting.AccountingFileSystem` that sleeps ``latency_ms``
per request (and charges ``bandwidth`` per connection), and counts requests.

Each partition holds ``--live`` SST files; every checkpoint adds one new SST per partition
and drops the oldest (a compaction), and every ``--fail-every`` checkpoints one partition
leaves a failed attempt behind. Measured per checkpoint (after a warm-up of ``num_retained``
checkpoints): completion time (:meth:`CheckpointCoordinator.try_complete`, listing, manifest
reads and the record; GC runs in the background and is timed apart; so is recording the
checkpoint's metrics, which happens after it completed), GC time and files
deleted per second, the driver's requests; at the end, memory held by statebackend objects
(tracemalloc) at several checkpoint counts, the durable file count, a driver restart
(rebuild) and the CLI's ``list``, ``describe`` and ``verify --size-only``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
import tracemalloc
import uuid
import zlib
from typing import Any

import fsspec

from statebackend.coordinator import CheckpointCoordinator, key_group_range
from statebackend.metrics_store import record_checkpoint
from statebackend.model.manifest import FileEntry, PartitionManifest, attempt_dir
from statebackend.storage import FsspecStore, open_store
from statebackend.storage.accounting import AccountingFileSystem, RequestCounts

OP = "op"


def _crc(data: bytes) -> str:
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


class FlatMemoryFileSystem(fsspec.AbstractFileSystem):
    """Objects in a dict, listed by prefix scan, like an object store (fsspec's memory
    filesystem walks directories, which costs O(directories x files) per listing)."""

    protocol = "flatmem"

    def __init__(self) -> None:
        super().__init__(skip_instance_cache=True)
        self.objects: dict[str, bytes] = {}

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return path.rstrip("/") or "/"

    def info(self, path: str, **_kw: Any) -> dict[str, Any]:
        data = self.objects.get(path)
        if data is None:
            raise FileNotFoundError(path)
        return {"name": path, "size": len(data), "type": "file"}

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **_kw: Any) -> bytes:
        try:
            return self.objects[path][start:end]
        except KeyError:
            raise FileNotFoundError(path) from None

    def pipe_file(self, path: str, value: bytes, **_kw: Any) -> None:
        # copies, so that tracemalloc charges the store's contents to this file, not to
        # the statebackend code that built them (the driver's memory is measured)
        self.objects[path.encode().decode()] = bytes(memoryview(value))

    def put_file(self, lpath: str, rpath: str, **_kw: Any) -> None:
        with open(lpath, "rb") as fh:
            self.objects[rpath.encode().decode()] = fh.read()

    def get_file(self, rpath: str, lpath: str, **_kw: Any) -> None:
        with open(lpath, "wb") as fh:
            fh.write(self.cat_file(rpath))

    def rm_file(self, path: str) -> None:
        if self.objects.pop(path, None) is None:
            raise FileNotFoundError(path)

    def find(self, path: str, *_a: Any, **_kw: Any) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(k for k in list(self.objects) if k.startswith(prefix))

    def ls(self, path: str, detail: bool = True, **_kw: Any) -> list[Any]:
        prefix = path.rstrip("/") + "/"
        names = sorted({prefix + k[len(prefix):].split("/", 1)[0]
                        for k in list(self.objects) if k.startswith(prefix)})
        if not detail:
            return names
        return [{"name": n, "type": "file" if n in self.objects else "directory",
                 "size": len(self.objects.get(n, b""))} for n in names]

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass

    def invalidate_cache(self, path: str | None = None) -> None:
        pass


class Partitions:
    """Simulated tasks: each checkpoint, one new SST per partition, the oldest dropped."""

    def __init__(self, store: FsspecStore, parallelism: int, max_parallelism: int,
                 live: int) -> None:
        self.store = store
        self.p = parallelism
        self.maxp = max_parallelism
        self.live = live
        self.base: dict[int, PartitionManifest] = {}

    def checkpoint(self, n: int, failed: set[int]) -> None:
        for p in range(self.p):
            if p in failed:
                # a failed attempt: one upload, no manifest (found by the sweep)
                self.store.put_bytes_atomic(f"{OP}/{attempt_dir(n, p, 'dead')}/x.sst", b"x")
            self._attempt(n, p)

    def _attempt(self, n: int, p: int) -> None:
        attempt = f"t{n}-{p}-{uuid.uuid4().hex[:8]}"
        adir = attempt_dir(n, p, attempt)
        base = self.base.get(p)
        shared = [f for f in (base.files if base else ()) if f.shared]
        if not shared:  # the first checkpoint uploads the whole state
            names = [f"{n:06d}-{i:02d}.sst" for i in range(self.live)]
        else:
            names = [f"{n:06d}.sst"]
            shared = shared[1:] if len(shared) >= self.live else shared
        files = [FileEntry(f.name, f.path, f.size, f.checksum, shared=True, uploaded=False)
                 for f in shared]
        for name in names + ["CURRENT", "OPTIONS"]:
            data = f"{adir}/{name}".encode()
            self.store.put_bytes_atomic(f"{OP}/{adir}/{name}", data)
            # tiny stand-ins: the driver's work depends on file counts, not sizes
            files.append(FileEntry(name, f"{adir}/{name}", len(data), _crc(data),
                                   shared=name.endswith(".sst"), uploaded=True))
        start, end = key_group_range(p, self.p, self.maxp)
        m = PartitionManifest(operator_id=OP, partition=p, checkpoint_id=n, attempt=attempt,
                              key_group_start=start, key_group_end=end,
                              max_parallelism=self.maxp, files=tuple(files),
                              base_checkpoint_id=None if base is None else base.checkpoint_id,
                              created_at_ms=int(time.time() * 1000))
        m = m.with_metrics(rows=100, keys=100, processing_time_ms=int(time.time() * 1000),
                           checkpoint_requests=RequestCounts(put=4).to_dict())
        self.store.put_bytes_atomic(f"{OP}/{m.path}", m.to_json().encode())
        self.base[p] = m


def _statebackend_bytes() -> int:
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*statebackend/*")])
    return sum(s.size for s in snap.statistics("filename"))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cli(argv: list[str], store: FsspecStore) -> float:
    from statebackend import cli

    real = cli._open
    cli._open = lambda _args: store  # the CLI over the charged store
    try:
        t0 = time.perf_counter()
        rc = cli.main(argv, out=io.StringIO())
        dt = time.perf_counter() - t0
    finally:
        cli._open = real
    assert rc == 0, (argv, rc)
    return dt


def run(parallelism: int, checkpoints: int, latency_ms: float, live: int,
        num_retained: int = 3, fail_every: int = 5, read_threads: int = 64,
        verbose: bool = True, trace_memory: bool = False, cli: bool = True) -> dict[str, Any]:
    mem = FlatMemoryFileSystem()
    root = f"/scale-{uuid.uuid4().hex[:8]}"
    tasks = open_store(root, fs=mem)
    charged = AccountingFileSystem(mem, latency_s=latency_ms / 1000.0)
    driver = open_store(root, fs=charged, read_threads=read_threads)
    maxp = max(128, parallelism)
    sim = Partitions(tasks, parallelism, maxp, live)
    if trace_memory:  # slows Python down: timings of such a run are not reported
        tracemalloc.start()
    coord = CheckpointCoordinator(driver, OP, parallelism, maxp, num_retained,
                                  background_gc=True)
    complete_s: list[float] = []
    complete_cpu: list[float] = []
    metrics_s: list[float] = []
    metrics_cpu: list[float] = []
    gc_s: list[float] = []
    deleted: list[int] = []
    reqs: list[RequestCounts] = []
    gc_reqs: list[RequestCounts] = []
    memory: dict[int, int] = {}
    try:
        for n in range(checkpoints):
            sim.checkpoint(n, {n % parallelism} if fail_every and n % fail_every == 0 else set())
            before_files = len(mem.find(root))
            t0, cpu0 = time.perf_counter(), time.process_time()
            record = coord.try_complete(n)
            t1, cpu1 = time.perf_counter(), time.process_time()
            assert record is not None
            comp = coord.last_completion_requests or RequestCounts()
            manifests = coord.chosen_manifests(n)
            c_before_gc = driver.request_counts()
            coord.wait_for_gc()
            t2 = time.perf_counter()
            gcr = driver.request_counts() - c_before_gc
            # metrics as complete_pending records them (a PUT), timed with completion
            cpu2 = time.process_time()
            record_checkpoint(driver, record, manifests, comp)
            t3 = time.perf_counter()
            cpu3 = time.process_time()
            if n >= num_retained:  # steady state: retention drops one checkpoint each time
                complete_s.append(t1 - t0)
                metrics_s.append(t3 - t2)
                # CPU of the process in those windows (all threads): what a loaded machine
                # stretches; the rest of the wall time is waiting for the store
                complete_cpu.append(cpu1 - cpu0)
                metrics_cpu.append(cpu3 - cpu2)
                gc_s.append(t2 - t1)
                deleted.append(before_files - len(mem.find(root)))
                reqs.append(comp)
                gc_reqs.append(gcr)
            if trace_memory and n + 1 in (checkpoints // 4, checkpoints // 2, checkpoints):
                memory[n + 1] = _statebackend_bytes()
            if verbose:
                print(f"  chk {n}: complete {1000 * (t1 - t0):.0f} ms, metrics "
                      f"{1000 * (t3 - t2):.0f} ms, gc {1000 * (t2 - t1):.0f} ms, "
                      f"requests {comp.requests} ({comp.list} LIST, {comp.get} GET)",
                      flush=True)
        live_files = len(coord.registry.refs)
        durable_files = len(mem.find(root))
        coord.close()
        t0 = time.perf_counter()
        c0 = driver.request_counts()
        CheckpointCoordinator(driver, OP, parallelism, maxp, num_retained).close()
        rebuild_s = time.perf_counter() - t0
        rebuild_reqs = driver.request_counts() - c0
        cli_s = {} if not cli else {
            "list": _cli(["list", root, OP], driver),
            "describe": _cli(["describe", root, OP], driver),
            "verify --size-only": _cli(["verify", root, OP, "--size-only"], driver)}
    finally:
        tracemalloc.stop()
        driver.close()
        tasks.close()
        mem.objects.clear()
    med = statistics.median
    gc_files = sum(deleted)
    return {
        "parallelism": parallelism, "checkpoints": checkpoints, "latency_ms": latency_ms,
        "live_files_per_partition": live, "read_threads": read_threads,
        "completion_s": {"median": med(complete_s), "p90": _pct(complete_s, 0.9),
                         "max": max(complete_s)},
        "completion_cpu_s": {"median": med(complete_cpu), "p90": _pct(complete_cpu, 0.9),
                             "max": max(complete_cpu)},
        "metrics_s": {"median": med(metrics_s), "max": max(metrics_s)},
        "metrics_cpu_s": {"median": med(metrics_cpu), "max": max(metrics_cpu)},
        "completion_requests_median": {k: med(getattr(r, k) for r in reqs)
                                       for k in ("list", "get", "put", "head", "delete")},
        "gc_s": {"median": med(gc_s), "p90": _pct(gc_s, 0.9), "max": max(gc_s)},
        "gc_requests_median": {k: med(getattr(r, k) for r in gc_reqs)
                               for k in ("list", "get", "put", "head", "delete")},
        "gc_files_per_s": gc_files / sum(gc_s) if sum(gc_s) else None,
        "gc_files_per_checkpoint": med(deleted),
        "statebackend_memory_bytes": memory,
        "registry_live_files": live_files,
        "durable_files_at_end": durable_files,
        "rebuild_s": rebuild_s,
        "rebuild_requests": rebuild_reqs.to_dict(),
        "cli_s": cli_s,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--checkpoints", type=int, default=12)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--live", type=int, default=10, help="SST files per partition")
    ap.add_argument("--read-threads", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="one JSON object per run, no progress")
    ap.add_argument("--memory", action="store_true",
                    help="trace memory (tracemalloc; timings then do not count)")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI timings")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    for p in args.partitions:
        if not args.json:
            print(f"{p} partitions, {args.checkpoints} checkpoints, {args.latency_ms} ms per "
                  f"request, load {load[0]:.2f}", flush=True)
        r = run(p, args.checkpoints, args.latency_ms, args.live,
                read_threads=args.read_threads, verbose=not args.json,
                trace_memory=args.memory, cli=not args.no_cli)
        r["load_1m_before"] = load[0]
        r["load_1m_after"] = os.getloadavg()[0]
        print(json.dumps(r, indent=None if args.json else 2), flush=True)


if __name__ == "__main__":
    main()
