"""Retention benchmark: durable storage used by a churning state with ``num_retained=3``.

Run with ``python -m pytest benchmarks/bench_retention.py --benchmark-enable -s`` (figures
are printed), or ``python benchmarks/bench_retention.py`` for the figures alone.

Two partitions of real RocksDB state (100,000 keys each, 100-byte random values) go through
100 checkpoints the way Spark tasks take them (restore the previous checkpoint, update 5%
of the keys at random and add 1% new ones, checkpoint, upload, publish); every tenth
checkpoint partition 0 also gets a second, concurrent attempt that restores from the
durable copy, and a third that dies before publishing. The coordinator completes each
checkpoint and collects garbage. After every completion the benchmark sums the bytes of
every file under the operator's directory. Target: at most 4x the full state size (the
sum of the latest checkpoint's files).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rocksdict import Options

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.coordinator import CheckpointCoordinator
from statebackend.model.manifest import PartitionManifest
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.storage import open_store

OP = "retention"
PARALLELISM = 2
MAX_PARALLELISM = 128


def db_options() -> Options:
    """Small memtables and files, so that compactions replace files every few checkpoints."""
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_write_buffer_size(1 << 20)
    o.set_target_file_size_base(1 << 20)
    o.set_max_bytes_for_level_base(4 << 20)
    o.set_level_zero_file_num_compaction_trigger(4)
    return o


@dataclass
class RetentionResult:
    checkpoints: int
    full_size: int  # bytes of the latest checkpoint's files
    max_ratio: float  # max over checkpoints of (bytes in the store / full size)
    final_ratio: float
    files_left: int  # files under the operator's directory at the end
    seconds: float


def store_bytes(root: str) -> int:
    total = 0
    for d, _dirs, files in os.walk(root):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def run_retention(workdir: str, *, checkpoints: int = 100, keys: int = 100_000,
                  value_size: int = 100, update: float = 0.05, insert: float = 0.01,
                  num_retained: int = 3, seed: int = 7) -> RetentionResult:
    rng = random.Random(seed)
    durable = os.path.join(workdir, "durable")
    store = open_store(durable)
    opts = StateBackendOptions(max_parallelism=MAX_PARALLELISM)
    coord = CheckpointCoordinator(store, OP, PARALLELISM, MAX_PARALLELISM, num_retained)
    ranges = [(-(-p * MAX_PARALLELISM // PARALLELISM),
               -(-(p + 1) * MAX_PARALLELISM // PARALLELISM) - 1) for p in range(PARALLELISM)]
    sizes: dict[int, int] = {p: keys for p in range(PARALLELISM)}

    def checkpointer(p: int, local: str) -> PartitionCheckpointer:
        return PartitionCheckpointer(store, OP, p, opts, os.path.join(workdir, local),
                                     open_instance=lambda path: RocksDBInstance(path, db_options()))

    def key(p: int, i: int) -> bytes:
        return ranges[p][0].to_bytes(2, "big") + i.to_bytes(8, "big")

    def task(p: int, n: int, attempt: str, base: PartitionManifest | None,
             updates: dict[bytes, bytes], local: str, die: bool = False
             ) -> PartitionManifest | None:
        c = checkpointer(p, local)
        inst, _ = c.restore(base)
        inst.write({"default": updates})
        if die:
            inst.close()
            return None
        m, _ = c.checkpoint(inst, n, attempt, key_group_range=ranges[p])
        inst.close()
        return m

    t0 = time.perf_counter()
    bases: dict[int, PartitionManifest | None] = {p: None for p in range(PARALLELISM)}
    worst = 0.0
    ratio = 0.0
    full = 0
    for n in range(checkpoints):
        for p in range(PARALLELISM):
            if n == 0:
                upd = {key(p, i): rng.randbytes(value_size) for i in range(keys)}
            else:
                upd = {key(p, rng.randrange(sizes[p])): rng.randbytes(value_size)
                       for _ in range(int(keys * update))}
                new = int(keys * insert)
                upd.update({key(p, i): rng.randbytes(value_size)
                            for i in range(sizes[p], sizes[p] + new)})
                sizes[p] += new
            task(p, n, "a0", bases[p], upd, f"local-p{p}")
            if p == 0 and n % 10 == 5:
                # A speculative twin restoring from durable storage, and one that dies.
                task(p, n, "b0", bases[p], upd, f"spec-{n}")
                task(p, n, "c0", bases[p], upd, f"dead-{n}", die=True)
                shutil.rmtree(os.path.join(workdir, f"spec-{n}"), ignore_errors=True)
                shutil.rmtree(os.path.join(workdir, f"dead-{n}"), ignore_errors=True)
        rec = coord.try_complete(n)
        assert rec is not None, f"checkpoint {n} did not complete"
        rp = coord.restore(n, verify=False)
        bases = dict(rp.manifests)
        full = rec.full_size
        ratio = store_bytes(os.path.join(durable, OP)) / full
        worst = max(worst, ratio)
    left = sum(len(f) for _d, _s, f in os.walk(os.path.join(durable, OP)))
    secs = time.perf_counter() - t0
    coord.close()
    store.close()
    return RetentionResult(checkpoints, full, worst, ratio, left, secs)


def test_retention_keeps_store_within_4x_of_state(benchmark: Any, tmp_path: Any) -> None:
    results: list[RetentionResult] = []

    def run() -> None:
        d = tempfile.mkdtemp(dir=tmp_path)
        results.append(run_retention(d))
        shutil.rmtree(d, ignore_errors=True)

    benchmark.pedantic(run, rounds=1, iterations=1)
    r = results[-1]
    print(f"\nretention: {r.checkpoints} checkpoints, full state {r.full_size / 1e6:.2f} MB, "
          f"store at most {r.max_ratio:.2f}x of it (finally {r.final_ratio:.2f}x, "
          f"{r.files_left} files left), {r.seconds:.1f} s")
    benchmark.extra_info.update(max_ratio=r.max_ratio, final_ratio=r.final_ratio,
                                full_size=r.full_size)
    assert r.max_ratio <= 4.0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        print(run_retention(d))
