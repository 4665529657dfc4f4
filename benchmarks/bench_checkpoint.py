"""Checkpoint benchmarks: incremental upload size under churn, and restore from a local copy.

Run with ``python -m pytest benchmarks/bench_checkpoint.py --benchmark-enable -s`` (figures
are printed), or ``python benchmarks/bench_checkpoint.py [churn|restore]`` for the figures
alone.

* Churn: 1,000,000 keys in state, 1% of them (random keys) updated between checkpoints,
  20 checkpoints taken the way a Spark task takes them (restore the previous checkpoint,
  write, checkpoint, close). Target: bytes uploaded per checkpoint < 10% of the full size.
* Restore: a ~1 GB state restored from the local secondary copy (verified by size and
  CRC32, hard-linked into a fresh working directory, opened). Target: < 2 s.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocksdict import Options

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.task_metrics import RestoreSource
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.storage import open_store

OP = "bench"


def churn_db_options() -> Options:
    """Level compaction tuned for small incremental checkpoints.

    Random updates touch every key range, so a compaction into a level rewrites every file
    of that level it overlaps. Small SST files and a small level base keep each compaction
    (and so each checkpoint's new files) small while the untouched files are reused; the
    L0 trigger stays at RocksDB's default of 4. Environment variables ``SB_L0``, ``SB_TFS``,
    ``SB_LBASE``, ``SB_MULT`` and ``SB_DYN`` override the settings for experiments.
    """
    o = Options(raw_mode=True)
    o.set_write_buffer_size(64 << 20)  # one flush per checkpoint, not several
    o.set_level_zero_file_num_compaction_trigger(int(os.environ.get("SB_L0", 4)))
    o.set_target_file_size_base(int(os.environ.get("SB_TFS", 4 << 20)))
    o.set_max_bytes_for_level_base(int(os.environ.get("SB_LBASE", 16 << 20)))
    o.set_max_bytes_for_level_multiplier(float(os.environ.get("SB_MULT", 10)))
    o.set_level_compaction_dynamic_level_bytes(os.environ.get("SB_DYN", "1") == "1")
    return o


@dataclass
class ChurnResult:
    keys: int
    updated_per_checkpoint: int
    checkpoints: int
    avg_bytes_uploaded: float
    avg_full_size: float
    max_bytes_uploaded: int

    @property
    def ratio(self) -> float:
        return self.avg_bytes_uploaded / self.avg_full_size


def run_churn(workdir: str, *, keys: int = 1_000_000, churn: float = 0.01,
              checkpoints: int = 20, value_size: int = 32,
              db_options: Callable[[], Options] = churn_db_options) -> ChurnResult:
    """Load ``keys`` keys, checkpoint, then ``checkpoints`` rounds of updating ``churn``."""
    store = open_store(os.path.join(workdir, "durable"))
    opts = StateBackendOptions(num_local_retained=1)
    local = os.path.join(workdir, "local")
    rng = random.Random(7)

    def cp() -> PartitionCheckpointer:
        return PartitionCheckpointer(store, OP, 0, opts, local,
                                     open_instance=lambda p: RocksDBInstance(p, db_options()))

    def key(i: int) -> bytes:
        return (i % 128).to_bytes(2, "big") + b"user%010d" % i  # key-group prefix + key

    c = cp()
    inst, _ = c.restore(None)
    step = 100_000
    for s in range(0, keys, step):
        inst.write({"default": {key(i): rng.randbytes(value_size)
                                for i in range(s, min(keys, s + step))}})
    m, _ = c.checkpoint(inst, 0, "a0")
    inst.close()
    uploaded, full = [], []
    n_upd = int(keys * churn)
    for n in range(1, checkpoints + 1):
        c = cp()
        inst, rm = c.restore(m)
        assert rm.source is RestoreSource.WORKING_DIR
        upd = {key(i): rng.randbytes(value_size) for i in rng.sample(range(keys), n_upd)}
        inst.write({"default": upd})
        m, metrics = c.checkpoint(inst, n, "a0")
        inst.close()
        uploaded.append(metrics.bytes_uploaded)
        full.append(metrics.full_size)
    store.close()
    return ChurnResult(keys, n_upd, checkpoints, sum(uploaded) / len(uploaded),
                       sum(full) / len(full), max(uploaded))


@dataclass
class RestoreResult:
    state_bytes: int
    files: int
    seconds: float
    source: str


def build_state(workdir: str, *, total_bytes: int = 1 << 30, value_size: int = 4000
                ) -> tuple[Any, Any, StateBackendOptions]:
    """A checkpointed state of ``total_bytes`` of random values; returns (store, manifest)."""
    store = open_store(os.path.join(workdir, "durable"))
    opts = StateBackendOptions()
    c = PartitionCheckpointer(store, OP, 0, opts, os.path.join(workdir, "local"))
    inst, _ = c.restore(None)
    n = total_bytes // value_size
    payload = os.urandom(value_size + 4096)
    step = 20_000
    for s in range(0, n, step):
        inst.write({"default": {i.to_bytes(8, "big"): payload[i % 4096:i % 4096 + value_size]
                                for i in range(s, min(n, s + step))}})
    m, _ = c.checkpoint(inst, 1, "a0")
    inst.close()
    return store, m, opts


def restore_from_local_copy(workdir: str, store: Any, manifest: Any,
                            opts: StateBackendOptions) -> RestoreResult:
    c = PartitionCheckpointer(store, OP, 0, opts, os.path.join(workdir, "local"))
    c.local.discard_working_dir()  # force the local-copy path
    t0 = time.perf_counter()
    inst, rm = c.restore(manifest)
    secs = time.perf_counter() - t0
    inst.close()
    return RestoreResult(manifest.full_size, len(manifest.files), secs, rm.source.value)


# --- pytest-benchmark entry points ---------------------------------------------------


def test_churn_incremental_size(benchmark: Any, tmp_path: Any) -> None:
    results: list[ChurnResult] = []

    def run() -> None:
        d = tempfile.mkdtemp(dir=tmp_path)
        results.append(run_churn(d))
        shutil.rmtree(d, ignore_errors=True)

    benchmark.pedantic(run, rounds=1, iterations=1)
    r = results[-1]
    print(f"\nchurn: avg uploaded {r.avg_bytes_uploaded / 1e6:.2f} MB of "
          f"{r.avg_full_size / 1e6:.2f} MB full ({100 * r.ratio:.1f}%), "
          f"max {r.max_bytes_uploaded / 1e6:.2f} MB")
    benchmark.extra_info.update(ratio=r.ratio, avg_uploaded=r.avg_bytes_uploaded,
                                avg_full=r.avg_full_size)
    assert r.ratio < 0.10


def test_restore_1gb_from_local_copy(benchmark: Any, tmp_path: Any) -> None:
    store, manifest, opts = build_state(str(tmp_path))
    results: list[RestoreResult] = []
    benchmark.pedantic(lambda: results.append(
        restore_from_local_copy(str(tmp_path), store, manifest, opts)), rounds=3, iterations=1)
    r = results[-1]
    print(f"\nrestore: {r.state_bytes / 1e9:.2f} GB in {r.files} files from {r.source} "
          f"in {r.seconds:.2f} s")
    assert r.source == RestoreSource.LOCAL_COPY.value


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "churn"
    with tempfile.TemporaryDirectory() as d:
        if what == "churn":
            t0 = time.perf_counter()
            r = run_churn(d, checkpoints=int(os.environ.get("SB_N", 20)))
            print(f"churn: avg uploaded {r.avg_bytes_uploaded / 1e6:.2f} MB of "
                  f"{r.avg_full_size / 1e6:.2f} MB ({100 * r.ratio:.1f}%), max "
                  f"{r.max_bytes_uploaded / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")
        else:
            store, m, opts = build_state(d)
            for _ in range(3):
                r2 = restore_from_local_copy(d, store, m, opts)
                print(f"restore: {r2.state_bytes / 1e9:.2f} GB, {r2.files} files, "
                      f"{r2.source}, {r2.seconds:.2f} s")
            c = PartitionCheckpointer(store, OP, 0, opts, os.path.join(d, "elsewhere"))
            t0 = time.perf_counter()
            inst, rm = c.restore(m)
            inst.close()
            print(f"restore: {m.full_size / 1e9:.2f} GB from {rm.source.value} "
                  f"(local filesystem) in {time.perf_counter() - t0:.2f} s")
