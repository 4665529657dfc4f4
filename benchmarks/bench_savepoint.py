"""Savepoint and rescale benchmarks.

Run ``python benchmarks/bench_savepoint.py [N ...]`` (N: keys in state; default 100000
300000) for a table, or ``python -m pytest benchmarks/bench_savepoint.py -s`` for a small
smoke run.

For each state size: an operator with parallelism 4 (max_parallelism 128) holding N keys
in a value state (8-byte counts) and N map entries (24-byte values) is checkpointed, then

* a savepoint is written with snappy and with none: write throughput (entries/s, raw
  MB/s) and compression ratio (raw / stored bytes);
* every partition of parallelism 3 is restored from each savepoint: read throughput;
* every partition of parallelism 3 is rescaled from the incremental checkpoint (base
  instance from the local copy, clipped with delete_range, the other ranges copied by
  range scans into write batches): total time, against the savepoint restore.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.coordinator import CheckpointCoordinator
from statebackend.keys.ranges import key_group_range
from statebackend.options import StateBackendOptions
from statebackend.restore.rescale import restore_from_savepoint, restore_rescaled
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.savepoint.reader import SavepointReader
from statebackend.savepoint.writer import create_savepoint, savepoint_dir
from statebackend.storage import open_store

OP = "bench"
MAXP = 128
OLD_P, NEW_P = 4, 3


def build(root: str, n: int) -> tuple:
    store = open_store(os.path.join(root, "durable"))
    opts = StateBackendOptions(max_parallelism=MAXP, local_dir=os.path.join(root, "local"))
    coord = CheckpointCoordinator(store, OP, parallelism=OLD_P, max_parallelism=MAXP)
    for p in range(OLD_P):
        rng = key_group_range(p, OLD_P, MAXP)
        cp = PartitionCheckpointer(store, OP, p, opts, opts.local_dir)
        inst, _ = cp.restore(None)
        # keys spread evenly over the partition's key groups (layout as the state layer's)
        count: dict[bytes, bytes | None] = {}
        seen: dict[bytes, bytes | None] = {}
        for i in range(p, n, OLD_P):
            kg = rng.start + (i // OLD_P) % len(rng)
            key = kg.to_bytes(2, "big") + b"user-%09d" % i
            count[key] = (i % 1000).to_bytes(8, "big")
            seen[key + b"\x00\x00\x00\x01" + len(key).to_bytes(4, "big")] = b"v%023d" % i
            if len(count) >= 50_000:
                inst.write({"count": count, "seen": seen})
                count, seen = {}, {}
        inst.write({"count": count, "seen": seen, "_meta": {b"state/count": b"{}"}})
        cp.checkpoint(inst, 0, "a0", (rng.start, rng.end))
        inst.close()
    assert coord.try_complete(0) is not None
    return store, opts, coord


def run(n: int) -> dict:
    root = tempfile.mkdtemp(prefix="sb-bench-sp-")
    try:
        store, opts, coord = build(root, n)
        out: dict = {"keys": n}
        for comp in ("snappy", "none"):
            t0 = time.perf_counter()
            sp = create_savepoint(store, OP, f"sp-{comp}", compression=comp, local_root=root)
            dt = time.perf_counter() - t0
            m = sp.metrics
            out[f"write_{comp}_s"] = dt
            out[f"write_{comp}_entries_per_s"] = m["entries"] / dt
            out[f"write_{comp}_raw_MBps"] = m["raw_bytes"] / dt / 1e6
            out[f"ratio_{comp}"] = m["raw_bytes"] / m["stored_bytes"]
            reader = SavepointReader(store.child(OP).child(savepoint_dir(f"sp-{comp}")))
            t0 = time.perf_counter()
            for p in range(NEW_P):
                cp = PartitionCheckpointer(store, OP, p, opts, os.path.join(root, f"r-{comp}"))
                inst, _ = restore_from_savepoint(cp, reader, NEW_P, MAXP)
                inst.close()
            dt = time.perf_counter() - t0
            out[f"restore_savepoint_{comp}_s"] = dt
            out[f"read_{comp}_entries_per_s"] = m["entries"] / dt
        record = coord.latest()
        t0 = time.perf_counter()
        for p in range(NEW_P):
            cp = PartitionCheckpointer(store, OP, p, opts, opts.local_dir)
            inst, _, _ = restore_rescaled(cp, record, NEW_P, MAXP, opts.local_dir,
                                          RocksDBInstance)
            inst.close()
        out["rescale_checkpoint_s"] = time.perf_counter() - t0
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [100_000, 300_000]
    for n in sizes:
        r = run(n)
        print(f"keys={n:>9,} entries={2 * n:>9,}")
        for comp in ("snappy", "none"):
            print(f"  savepoint {comp:6}: write {r[f'write_{comp}_s']:.2f}s "
                  f"({r[f'write_{comp}_entries_per_s']:,.0f} entries/s, "
                  f"{r[f'write_{comp}_raw_MBps']:.1f} MB/s raw), ratio {r[f'ratio_{comp}']:.2f}; "
                  f"restore {OLD_P}->{NEW_P} {r[f'restore_savepoint_{comp}_s']:.2f}s "
                  f"({r[f'read_{comp}_entries_per_s']:,.0f} entries/s)")
        print(f"  rescale {OLD_P}->{NEW_P} from incremental checkpoint: "
              f"{r['rescale_checkpoint_s']:.2f}s")


def test_bench_savepoint_smoke() -> None:
    r = run(5_000)
    assert r["ratio_none"] < r["ratio_snappy"]


if __name__ == "__main__":
    main(sys.argv[1:])
