"""The metrics each micro-batch reports in Spark's progress, without Spark: what one
partition contributes (partition_progress), how partitions fold (combine_progress), the
RocksDB statistics an instance counts per batch, and the same names in the recorded
metrics (``statebackend metrics``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from statebackend.metrics import (
    BLOCK_CACHE_HIT_RATE,
    PROGRESS_METRICS,
    ROCKSDB_STATISTICS,
    PartitionStats,
    combine_progress,
    partition_progress,
    rocksdb_properties,
)
from statebackend.metrics_store import read_metrics
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.rocksdb.options import to_rocksdict_options


def stats(partition: int, **kw) -> PartitionStats:
    base = PartitionStats(
        partition=partition, attempt="a", rows=10, keys=4, sync_ms=2.0, async_ms=5.0,
        end_to_end_ms=None, start_delay_ms=None, bytes_uploaded=100, files_uploaded=2,
        files_reused=1, bytes_reused=50, full_size=150, incremental_size=100,
        restore_source="durable", restore_ms=7.0, restore_bytes_downloaded=30,
        rocksdb={"state_entries": 4, "logical_bytes": 96, "live_sst_bytes": 120, "memtable_bytes": 8,
                 "pending_compaction_bytes": 0, "l0_files": 2, "block_cache_bytes": 64,
                 "block_cache_hits": 3, "block_cache_misses": 1, "write_stall_micros": 0,
                 "compaction_micros": 2500})
    return replace(base, **kw)


def test_a_partition_contributes_every_metric_with_its_unit():
    p = partition_progress(stats(0, late_rows_dropped=3))
    assert set(p) == set(PROGRESS_METRICS)
    assert p["partitions"] == 1 and p["input_rows"] == 10 and p["keys"] == 4
    assert p["state_rows"] == 4 and p["state_bytes"] == 150 and p["state_logical_bytes"] == 96
    assert p["bytes_downloaded"] == 30 and p["late_rows_dropped"] == 3
    assert p["sync_ms"] == p["sync_ms_max"] == 2.0
    assert p["rocksdb_compaction_ms"] == 2.5  # micros -> ms
    assert p["rocksdb_l0_files_max"] == 2
    # the restore source is one-hot; a source this version does not know counts as other
    assert [k for k in p if k.startswith("restore_") and p[k] == 1] == ["restore_durable"]
    q = partition_progress(stats(0, restore_source="savepoint"))
    assert q["restore_other"] == 1 and q["restore_durable"] == 0


def test_a_partition_without_rocksdb_figures_leaves_them_out():
    p = partition_progress(stats(0, rocksdb={}))
    assert "state_rows" not in p and "rocksdb_block_cache_hits" not in p
    assert "state_logical_bytes" not in p
    assert combine_progress([p]).get(BLOCK_CACHE_HIT_RATE) is None


def test_partitions_are_summed_and_maxed_as_declared():
    a = stats(0, sync_ms=2.0, restore_source="empty")
    b = stats(1, sync_ms=9.0, rows=5, full_size=10,
              rocksdb={**a.rocksdb, "l0_files": 7, "block_cache_bytes": 32,
                       "pending_compaction_bytes": 40, "block_cache_hits": 5,
                       "block_cache_misses": 3})
    got = combine_progress([partition_progress(a), partition_progress(b)])
    assert got["partitions"] == 2
    assert got["input_rows"] == 15 and got["state_bytes"] == 160
    assert got["sync_ms"] == 11.0 and got["sync_ms_max"] == 9.0
    assert got["rocksdb_l0_files_max"] == 7
    assert got["rocksdb_block_cache_bytes"] == 64  # the shared cache: the maximum
    assert got["rocksdb_pending_compaction_bytes"] == 40
    assert got["rocksdb_pending_compaction_bytes_max"] == 40
    assert got["restore_empty"] == 1 and got["restore_durable"] == 1
    assert got["rocksdb_block_cache_hits"] == 8 and got["rocksdb_block_cache_misses"] == 4
    assert got[BLOCK_CACHE_HIT_RATE] == pytest.approx(8 / 12)
    # every declared metric is either a sum or a maximum, and the order is the declared one
    assert {how for how, _unit in PROGRESS_METRICS.values()} == {"sum", "max"}
    assert list(got) == [*PROGRESS_METRICS, BLOCK_CACHE_HIT_RATE]


def test_no_partition_no_metric():
    assert combine_progress([]) == {}


def test_rocksdb_statistics_count_the_batch_and_state_entries_skip_internal_families(
        tmp_path: Path):
    inst = RocksDBInstance(str(tmp_path / "db"), db_options=to_rocksdict_options(
        StateBackendOptions(rocksdb_statistics=True)))
    try:
        cf = inst.column_family("count")
        meta = inst.column_family("_meta")
        for i in range(500):
            cf[i.to_bytes(8, "big")] = b"v" * 32
        meta[b"state/count"] = b"{}"
        inst.flush()
        first = rocksdb_properties(inst)
        assert first["state_entries"] == 500  # not the descriptor in _meta
        for i in range(0, 500, 5):
            assert cf[i.to_bytes(8, "big")] == b"v" * 32
        second = rocksdb_properties(inst)
        assert set(ROCKSDB_STATISTICS) <= set(second)
        # reads of flushed data go through the block cache: this batch's lookups counted
        assert second["block_cache_hits"] + second["block_cache_misses"] > 0
        # a batch that reads nothing counts nothing (deltas, not totals since opening)
        third = rocksdb_properties(inst)
        assert third["block_cache_hits"] == 0 and third["block_cache_misses"] == 0
    finally:
        inst.close()


@pytest.mark.parametrize("options", [None, StateBackendOptions()], ids=["raw", "default"])
def test_instance_without_statistics_reports_none(tmp_path: Path, options):
    # statistics are opt-in (rocksdb_statistics): by default nothing is counted or reported
    inst = RocksDBInstance(str(tmp_path / "db"), db_options=None if options is None
                           else to_rocksdict_options(options))
    try:
        assert inst.statistics_delta(ROCKSDB_STATISTICS) == {}
        assert not set(ROCKSDB_STATISTICS) & set(rocksdb_properties(inst))
    finally:
        inst.close()


def test_recorded_metrics_carry_the_progress_names(tmp_path: Path):
    from statebackend.backend import complete_pending
    from statebackend.coordinator import CheckpointCoordinator
    from statebackend.storage import open_store
    from tests.coordinator.coordsim import run_attempt

    store = open_store(str(tmp_path / "d"), backoff_s=0.0)
    coord = CheckpointCoordinator(store, "op1", 2, 64)
    for p in range(2):
        m = run_attempt(store, 0, p, "a", {"1.sst": b"s" * 10}, None, parallelism=2,
                        max_parallelism=64)
        raw = m.with_metrics(rows=7 + p, rocksdb={"state_entries": 3, "block_cache_hits": 1,
                                                  "block_cache_misses": 1},
                             late_rows_dropped=p)
        store.put_bytes_atomic(f"op1/{m.path}", raw.to_json().encode())
    complete_pending(coord, up_to=0)
    (line,) = read_metrics(store, "op1")
    prog = line["progress"]
    assert prog["partitions"] == 2 and prog["input_rows"] == 15 and prog["state_rows"] == 6
    assert prog["late_rows_dropped"] == 1 and prog[BLOCK_CACHE_HIT_RATE] == 0.5
    # the same figures as the checkpoint's own line, under the progress names
    assert prog["bytes_uploaded"] == line["bytes_uploaded"] > 0
    assert prog["state_bytes"] == line["full_size"] > 0
    assert prog["sync_ms_max"] == line["sync_ms"]
    # stored once: the file holds the partitions, the progress is folded on reading
    raw = store.get_bytes("op1/_metrics/chk-0.jsonl").decode()
    assert '"progress"' not in raw and raw.count('"kind": "partition"') == 2
    coord.close()
