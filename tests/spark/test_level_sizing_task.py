"""The partition task records the logical size in both checkpoint modes and sizes
RocksDB's levels from its state in incremental mode (in process, no SparkSession:
``inproc.run_task``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from inproc import frames, run_task

from statebackend.local import resident
from statebackend.metrics import partition_stats
from statebackend.options import StateBackendOptions
from statebackend.rocksdb import options as rocks_options
from statebackend.storage import open_store
from statebackend.storage.manifests import list_published_manifests, operator_store

MODES = ("incremental", "changelog")


def _manifest(root: Path, batch: int, attempt: str):
    store = operator_store(open_store(f"{root}/durable"), "frames")
    (m,) = [m for m in list_published_manifests(store, batch, 0) if m.attempt == attempt]
    return m


def _level_base(local: Path) -> set[str]:
    """max_bytes_for_level_base of every column family in the newest OPTIONS file of
    every database under ``local``."""
    found = set()
    for db in {p.parent for p in local.rglob("OPTIONS-*")}:
        newest = max(db.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
        found |= set(re.findall(r"max_bytes_for_level_base=(\d+)", newest.read_text()))
    return found


@pytest.mark.parametrize("mode", MODES)
def test_task_records_logical_bytes_and_sizes_levels(tmp_path: Path, mode: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # from 1 KiB of bottom level instead of 256 MiB: what a large partition gets
    monkeypatch.setattr(rocks_options, "SIZED_FROM", 1024)
    keys = [f"key-{i:05d}" for i in range(3000)]
    try:
        for b in range(4):
            run_task(str(tmp_path), b, f"a{b}", frames(keys, per_frame=1000),
                     frame_rows=1000, checkpoint_mode=mode)
        m = _manifest(tmp_path, 3, "a3")
        logical = m.metrics["rocksdb"]["logical_bytes"]
        stats = partition_stats(m, None)
        assert stats.logical_bytes == logical
        # every key's count (an 8-byte value) and its key (key group + encoded string)
        # once, whatever versions the SSTs still hold; memtable writes are not counted
        # (changelog mode flushes only when it materializes), so at most the whole state
        assert 0 <= logical <= 3000 * 64
        if mode == "incremental":  # every checkpoint flushed: all of it is in SSTs
            assert logical >= 3000 * 16
            assert stats.referenced_over_logical is not None
        bases = _level_base(tmp_path / "local")
        # incremental mode, and changelog mode materializing small snapshots inline
        # (materialize_inline_ratio), upload about every batch's files: sized
        if rocks_options.sizes_levels(StateBackendOptions(checkpoint_mode=mode)):
            assert bases and bases != {str(256 << 20)}, bases  # derived, not RocksDB's
        else:  # materializations ten batches apart share more with RocksDB's own sizes
            assert bases == {str(256 << 20)}, bases
    finally:
        resident.close_all()


@pytest.mark.parametrize("mode", MODES)
def test_sizing_off_leaves_rocksdb_sizes(tmp_path: Path, mode: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks_options, "SIZED_FROM", 1024)
    keys = [f"key-{i:05d}" for i in range(500)]
    try:
        for b in range(2):
            run_task(str(tmp_path), b, f"a{b}", frames(keys, per_frame=500), frame_rows=500,
                     checkpoint_mode=mode, level_sizing=False)
        assert _level_base(tmp_path / "local") == {str(256 << 20)}
    finally:
        resident.close_all()
