"""Restore time against state size, from each source a task can restore from.

    python benchmarks/bench_restore.py                          # 16, 64, 256 MB
    python benchmarks/bench_restore.py --sizes-mb 16,64,256,1024 --json bench-out/restore.json
    python -m pytest benchmarks/bench_restore.py --benchmark-enable

For each size, one partition's state is written and checkpointed with
``PartitionCheckpointer`` (durable store on the local filesystem), then restored from the
local secondary copy (working directory gone: hard links, verified against the manifest)
and from durable storage (no local files: another machine; here a local-filesystem copy,
so network time is not included). The third source, the working directory a task left
behind, is exercised by ``bench_task.py`` (every batch after the first restores from it). The JSON feeds ``benchmarks/plots.py`` (restore time vs state size);
the 1 GB local-copy figure the issue targets is ``bench_checkpoint.py restore``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store

OP = "bench-restore"
VALUE_SIZE = 1000


def build(workdir: str, nbytes: int) -> tuple[Any, Any, StateBackendOptions]:
    """A checkpointed state of about ``nbytes`` of incompressible values."""
    store = open_store(os.path.join(workdir, "durable"))
    opts = StateBackendOptions()
    c = PartitionCheckpointer(store, OP, 0, opts, os.path.join(workdir, "local"))
    inst, _ = c.restore(None)
    n = nbytes // VALUE_SIZE
    payload = os.urandom(VALUE_SIZE + 4096)
    step = 20_000
    for s in range(0, n, step):
        inst.write({"default": {i.to_bytes(8, "big"): payload[i % 4096:i % 4096 + VALUE_SIZE]
                                for i in range(s, min(n, s + step))}})
    manifest, _ = c.checkpoint(inst, 1, "a0")
    inst.close()
    return store, manifest, opts


def restore_once(workdir: str, store: Any, manifest: Any, opts: StateBackendOptions,
                 source: str) -> tuple[float, str]:
    """Seconds to an open instance, restoring from ``source``; returns (seconds, source seen)."""
    local = os.path.join(workdir, "local" if source != "durable" else f"fresh-{time.time_ns()}")
    c = PartitionCheckpointer(store, OP, 0, opts, local)
    if source == "local_copy":
        c.local.discard_working_dir()
    t0 = time.perf_counter()
    inst, rm = c.restore(manifest)
    secs = time.perf_counter() - t0
    inst.close()
    if source == "durable":
        shutil.rmtree(local, ignore_errors=True)
    return secs, rm.source.value


def run(sizes_mb: list[int], repeat: int = 3) -> list[dict[str, Any]]:
    results = []
    for mb in sizes_mb:
        with tempfile.TemporaryDirectory(prefix="sb-bench-restore-") as d:
            store, manifest, opts = build(d, mb << 20)
            for source in ("local_copy", "durable"):
                best, seen = min(restore_once(d, store, manifest, opts, source)
                                 for _ in range(repeat))
                results.append({"size_mb": mb, "state_bytes": manifest.full_size,
                                "files": len(manifest.files), "source": source,
                                "source_seen": seen, "restore_ms": 1000 * best})
                print(f"{mb:>6} MB  {len(manifest.files):>4} files  {source:12} "
                      f"({seen}) {1000 * best:9.1f} ms", flush=True)
    return results


def test_restore_sources(benchmark: Any) -> None:
    """Restore a 32 MB state from each source (figures in extra_info)."""
    out: list[list[dict[str, Any]]] = []
    benchmark.pedantic(lambda: out.append(run([32], repeat=1)), rounds=1, iterations=1)
    benchmark.extra_info["results"] = out[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/bench_restore.py",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes-mb", default="16,64,256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="bench-out/restore.json")
    args = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f}")
    results = run([int(s) for s in args.sizes_mb.split(",")], args.repeat)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"results": results, "load_avg": os.getloadavg()}, fh, indent=1)
    print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
