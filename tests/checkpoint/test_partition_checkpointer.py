"""Checkpoint and restore of one partition: incremental uploads, local copies, fallbacks."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.materialize import wait_for_materializations
from statebackend.checkpoint.task_metrics import RestoreSource
from statebackend.errors import CheckpointError, CommitFailedError, CorruptStateError
from statebackend.model.manifest import (
    MANIFEST_NAME,
    PartitionManifest,
    StateDescriptor,
    attempt_dir,
    choose_manifest,
)
from statebackend.options import StateBackendOptions
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.storage import (
    FsspecStore,
    list_published_manifests,
    open_store,
    read_manifest,
)

INC = "incremental"
OP = "op-1"
STATES = (StateDescriptor("count", "value", value_schema="c long", ttl_ms=60_000),)


def dump(inst: RocksDBInstance) -> dict[str, dict[bytes, bytes]]:
    """Every entry of every column family (the logical state)."""
    return {cf: dict(inst.scan_range(cf, b"", None)) for cf in inst.column_family_names()}


def write_batch(inst: RocksDBInstance, start: int, n: int, tag: bytes) -> None:
    inst.write({"default": {b"k%06d" % i: tag * 20 for i in range(start, start + n)},
                "count": {b"c%04d" % (start % 1000): tag}})


def make(store: FsspecStore, tmp_path: Path, partition: int = 0,
         **opts: Any) -> PartitionCheckpointer:
    # this module is about incremental checkpoints (tests/checkpoint/test_changelog.py
    # has changelog mode's)
    return PartitionCheckpointer(store, OP, partition,
                                 StateBackendOptions(**{"checkpoint_mode": INC, **opts}),
                                 str(tmp_path / "local"))


@pytest.fixture
def store(tmp_path: Path) -> FsspecStore:
    return open_store(str(tmp_path / "durable"), backoff_s=0.0)


def run_batches(store: FsspecStore, tmp_path: Path, batches: int, **opts: Any
                ) -> tuple[list[PartitionManifest], dict[str, dict[bytes, bytes]]]:
    """Batches 1..n as the Spark layer runs them: restore n-1, write, checkpoint n, close."""
    manifests: list[PartitionManifest] = []
    state: dict[str, dict[bytes, bytes]] = {}
    for b in range(1, batches + 1):
        cp = make(store, tmp_path, **opts)
        inst, _ = cp.restore(manifests[-1] if manifests else None)
        write_batch(inst, b * 100, 300, b"%d" % b)
        state = dump(inst)
        m, _metrics = cp.checkpoint(inst, b, "a0", (0, 63), STATES)
        inst.close()
        wait_for_materializations()  # changelog mode: deterministic adoption
        manifests.append(m)
    return manifests, state


def restore_state(store: FsspecStore, tmp_path: Path, m: PartitionManifest | None,
                  **opts: Any) -> tuple[dict[str, dict[bytes, bytes]], RestoreSource, Any]:
    cp = make(store, tmp_path, **opts)
    inst, metrics = cp.restore(m)
    try:
        return dump(inst), metrics.source, metrics
    finally:
        inst.close()


# --- incremental checkpoints ---------------------------------------------------------


def test_second_checkpoint_reuses_base_ssts_and_uploads_private_files(
        store: FsspecStore, tmp_path: Path) -> None:
    (m1, m2), _ = run_batches(store, tmp_path, 2)
    assert m1.base_checkpoint_id is None and all(f.uploaded for f in m1.files)
    assert m2.base_checkpoint_id == 1
    reused = [f for f in m2.files if not f.uploaded]
    assert reused and all(f.shared and f.path.startswith("chk-1/p0/a0/") for f in reused)
    assert {f.name for f in reused} <= set(m1.shared_files())
    # Private files (MANIFEST, CURRENT, OPTIONS...) are uploaded by every checkpoint.
    private = [f for f in m2.files if not f.shared]
    assert {"CURRENT"} <= {f.name for f in private}
    assert all(f.uploaded and f.path.startswith("chk-2/p0/a0/") for f in private)
    assert m2.incremental_size < m2.full_size
    assert m2.metrics["files_reused"] == len(reused)
    assert m2.metrics["incremental_size"] == m2.incremental_size
    assert m2.metrics["bytes_uploaded"] == m2.incremental_size
    assert m2.states == STATES and (m2.key_group_start, m2.key_group_end) == (0, 63)


def test_manifest_is_published_and_reads_back_equal(store: FsspecStore, tmp_path: Path) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1)
    ostore = store.child(OP)
    assert read_manifest(ostore, m1.path) == m1
    assert read_manifest(store, m1.path, operator_id=OP) == m1
    assert list_published_manifests(store, 1, 0, operator_id=OP) == [m1]
    for f in m1.files:
        assert ostore.size(f.path) == f.size


def test_non_incremental_uploads_everything(store: FsspecStore, tmp_path: Path) -> None:
    (m1, m2), _ = run_batches(store, tmp_path, 2, incremental=False)
    assert all(f.uploaded for f in m2.files)
    assert m2.incremental_size == m2.full_size
    assert all(f.path.startswith("chk-2/") for f in m2.files)


def test_checkpoint_metrics_dataclass(store: FsspecStore, tmp_path: Path) -> None:
    cp = make(store, tmp_path)
    inst, rm = cp.restore(None)
    assert rm.source is RestoreSource.EMPTY
    write_batch(inst, 0, 100, b"x")
    m, cm = cp.checkpoint(inst, 1, "a0")
    inst.close()
    assert cm.files_uploaded == len(m.files) and cm.files_reused == 0
    assert cm.bytes_uploaded == cm.full_size == m.full_size > 0
    assert cm.sync_duration_s >= 0 and cm.async_duration_s >= 0
    assert (m.key_group_start, m.key_group_end) == (0, 127)


# --- restore sources -----------------------------------------------------------------


MODES = pytest.mark.parametrize("mode", ["incremental", "changelog"])


@MODES
def test_restore_from_clean_working_dir(store: FsspecStore, tmp_path: Path, mode: str) -> None:
    (m1, m2), state = run_batches(store, tmp_path, 2, checkpoint_mode=mode)
    got, source, _ = restore_state(store, tmp_path, m2, checkpoint_mode=mode)
    assert source is RestoreSource.WORKING_DIR and got == state


def test_working_dir_of_another_version_is_not_used(store: FsspecStore, tmp_path: Path) -> None:
    (m1, m2), _ = run_batches(store, tmp_path, 2)
    expected, _, _ = restore_state(store, tmp_path / "elsewhere", m1)
    got, source, _ = restore_state(store, tmp_path, m1)
    assert source is RestoreSource.LOCAL_COPY and got == expected


def test_writes_after_checkpoint_make_the_working_dir_unclean(store: FsspecStore,
                                                              tmp_path: Path) -> None:
    cp = make(store, tmp_path)
    inst, _ = cp.restore(None)
    write_batch(inst, 0, 200, b"a")
    committed = dump(inst)
    m, _ = cp.checkpoint(inst, 1, "a0")
    write_batch(inst, 0, 200, b"z")  # a repeated attempt's partial updates
    inst.close()
    got, source, metrics = restore_state(store, tmp_path, m)
    assert source is RestoreSource.LOCAL_COPY and got == committed
    assert "written after checkpoint" in metrics.fallback_reason


@MODES
def test_reopened_working_dir_is_not_clean_any_more(store: FsspecStore, tmp_path: Path,
                                                    mode: str) -> None:
    (m1, m2), state = run_batches(store, tmp_path, 2, checkpoint_mode=mode)
    cp = make(store, tmp_path, checkpoint_mode=mode)
    inst, rm = cp.restore(m2)
    assert rm.source is RestoreSource.WORKING_DIR
    write_batch(inst, 5000, 10, b"q")  # task fails before its checkpoint
    inst.close()
    got, source, _ = restore_state(store, tmp_path, m2, checkpoint_mode=mode)
    # changelog mode: the local materialization of batch 1 plus the local changelog of 2
    assert source is RestoreSource.LOCAL_COPY and got == state


def test_deleted_local_copy_restores_from_durable(store: FsspecStore, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (m1, m2), state = run_batches(store, tmp_path, 2)
    cp = make(store, tmp_path)
    cp.local.discard_working_dir()
    cp.local.remove_copy(cp.local.copy_dir(2, "a0"))
    got, source, metrics = restore_state(store, tmp_path, m2)
    assert source is RestoreSource.DURABLE and got == state
    assert metrics.files_downloaded == len(m2.files)
    assert metrics.bytes_downloaded == m2.full_size
    assert metrics.fallback_reason is None  # absent copy: normal, nothing logged


@pytest.mark.faults
@pytest.mark.parametrize("damage", ["flip_sst_byte", "truncate_sst", "delete_sst",
                                    "garble_current", "flip_manifest_byte"])
def test_damaged_local_copy_falls_back_to_durable(store: FsspecStore, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture,
                                                  damage: str) -> None:
    (m1, m2), state = run_batches(store, tmp_path, 2)
    cp = make(store, tmp_path)
    cp.local.discard_working_dir()
    d = Path(cp.local.copy_dir(2, "a0"))
    sst = d / max((f for f in m2.files if f.shared), key=lambda f: f.size).name
    if damage == "flip_sst_byte":
        data = bytearray(sst.read_bytes())
        data[len(data) // 2] ^= 0xFF
        sst.unlink()  # break the hard link so the working instance's file stays intact
        sst.write_bytes(bytes(data))
    elif damage == "truncate_sst":
        data = sst.read_bytes()
        sst.unlink()
        sst.write_bytes(data[:-10])
    elif damage == "delete_sst":
        sst.unlink()
    elif damage == "garble_current":
        (d / "CURRENT").write_bytes(b"MANIFEST-999999\n")
    else:
        man = next(d.glob("MANIFEST-*"))
        data = bytearray(man.read_bytes())
        data[-3] ^= 0x01
        man.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="statebackend"):
        got, source, metrics = restore_state(store, tmp_path, m2)
    assert source is RestoreSource.DURABLE and got == state
    assert metrics.fallback_reason and "local copy" in metrics.fallback_reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "durable" in warnings[0].getMessage()


def test_local_recovery_disabled_keeps_no_copy(store: FsspecStore, tmp_path: Path) -> None:
    (m1, m2), state = run_batches(store, tmp_path, 2, local_recovery=False)
    cp = make(store, tmp_path, local_recovery=False)
    assert cp.local.list_copies() == []
    cp.local.discard_working_dir()
    got, source, _ = restore_state(store, tmp_path, m2, local_recovery=False)
    assert source is RestoreSource.DURABLE and got == state


def test_local_copies_are_retained_up_to_the_limit(store: FsspecStore, tmp_path: Path) -> None:
    run_batches(store, tmp_path, 4, num_local_retained=2)
    cp = make(store, tmp_path)
    assert [(n, a) for n, a, _ in cp.local.list_copies()] == [(3, "a0"), (4, "a0")]


def test_failing_local_copy_never_fails_the_checkpoint(store: FsspecStore, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cp = make(store, tmp_path)
    inst, _ = cp.restore(None)
    write_batch(inst, 0, 50, b"a")

    def boom(*_a: object, **_k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(cp.local, "write_clean_marker", boom)
    monkeypatch.setattr(cp.local, "retain", boom)
    m, _ = cp.checkpoint(inst, 1, "a0")
    inst.close()
    assert read_manifest(store.child(OP), m.path) == m


# --- durable failures ------------------------------------------------------------------


def _only_durable(store: FsspecStore, tmp_path: Path) -> None:
    cp = make(store, tmp_path)
    cp.local.discard_working_dir()
    for _n, _a, d in cp.local.list_copies():
        cp.local.remove_copy(d)
    shutil.rmtree(cp.local.changelogs_dir, ignore_errors=True)


@pytest.mark.faults
@MODES
def test_missing_durable_file_raises_typed_error(store: FsspecStore, tmp_path: Path,
                                                 mode: str) -> None:
    (m1, m2), _ = run_batches(store, tmp_path, 2, checkpoint_mode=mode)
    _only_durable(store, tmp_path)
    victim = next(f for f in m2.files if not f.uploaded)  # reused from checkpoint 1
    store.child(OP).delete([victim.path])
    cp = make(store, tmp_path, checkpoint_mode=mode)
    with pytest.raises(CorruptStateError) as ei:
        cp.restore(m2)
    e = ei.value
    assert (e.checkpoint_id, e.partition, e.path) == (2, 0, victim.path)
    assert victim.path in str(e)
    # Never an empty or partial state left behind for a later open.
    assert not os.path.exists(cp.working_dir)
    assert [n for n in os.listdir(cp.local.partition_dir) if n.startswith(".work")] == []


@pytest.mark.faults
@MODES
def test_corrupt_durable_file_raises_typed_error(store: FsspecStore, tmp_path: Path,
                                                 mode: str) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1, checkpoint_mode=mode)
    _only_durable(store, tmp_path)
    # changelog mode: the batch's changelog (local changelogs are gone with the machine)
    victim = max(m1.files, key=lambda f: f.size)
    p = Path(store.root) / OP / victim.path
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError) as ei:
        make(store, tmp_path, checkpoint_mode=mode).restore(m1)
    assert (ei.value.checkpoint_id, ei.value.partition, ei.value.path) == (1, 0, victim.path)


# --- reference rules -------------------------------------------------------------------


def test_two_attempts_never_share_or_overwrite_files(store: FsspecStore, tmp_path: Path) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1)
    published = []
    for attempt in ("a2", "a1"):
        cp = make(store, tmp_path / attempt)
        inst, _ = cp.restore(m1)
        write_batch(inst, 7000, 100, b"s")
        m, _ = cp.checkpoint(inst, 2, attempt)
        inst.close()
        published.append(m)
    up = [{f.path for f in m.files if f.uploaded} for m in published]
    assert up[0] and up[1] and not (up[0] & up[1])
    assert all(p.startswith(f"chk-2/p0/{m.attempt}/") for m, u in zip(published, up) for p in u)
    listed = list_published_manifests(store, 2, 0, operator_id=OP)
    assert [m.attempt for m in listed] == ["a1", "a2"]
    assert choose_manifest(listed).attempt == "a1"


def test_reusing_an_attempt_name_is_refused(store: FsspecStore, tmp_path: Path) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1)
    cp = make(store, tmp_path / "again")
    inst, _ = cp.restore(None)
    write_batch(inst, 0, 10, b"x")
    with pytest.raises(CommitFailedError, match="fresh attempt"):
        cp.checkpoint(inst, 1, "a0")
    inst.close()
    assert read_manifest(store.child(OP), m1.path) == m1


def test_base_must_be_the_restored_manifest(store: FsspecStore, tmp_path: Path) -> None:
    (m1, m2), _ = run_batches(store, tmp_path, 2)
    cp = make(store, tmp_path / "x")
    inst, _ = cp.restore(m1)
    with pytest.raises(CheckpointError, match="restored from"):
        cp.checkpoint(inst, 3, "a0", base_manifest=m2)
    inst.close()


def test_files_of_a_different_lineage_are_not_reused(store: FsspecStore, tmp_path: Path) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1)
    # A fresh database has its own SST names and sizes; a caller passing an unrelated base
    # must not make it reference files that hold other data.
    cp = make(store, tmp_path / "fresh")
    inst, _ = cp.restore(None)
    write_batch(inst, 0, 5, b"other")
    snap = cp.snapshot_sync(inst, 2, "b0")
    inst.close()
    cp2 = make(store, tmp_path / "fresh")
    m2 = cp2.upload_async(snap, m1)
    for f in m2.files:
        if not f.uploaded:
            base = m1.shared_files()[f.name]
            assert base.size == f.size


def test_manifest_at_wrong_path_is_refused(store: FsspecStore, tmp_path: Path) -> None:
    (m1,), _ = run_batches(store, tmp_path, 1)
    ostore = store.child(OP)
    ostore.put_bytes_atomic(f"{attempt_dir(1, 0, 'zz')}/{MANIFEST_NAME}", m1.to_json().encode())
    with pytest.raises(CorruptStateError, match="belongs at"):
        list_published_manifests(store, 1, 0, operator_id=OP)


@pytest.mark.faults
def test_local_copy_rocksdb_refuses_to_open_falls_back(store: FsspecStore,
                                                       tmp_path: Path) -> None:
    (m1,), state = run_batches(store, tmp_path, 1)
    calls: list[str] = []

    def flaky_open(path: str) -> RocksDBInstance:
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("Corruption: bad block")
        return RocksDBInstance(path)

    cp = PartitionCheckpointer(store, OP, 0, StateBackendOptions(checkpoint_mode=INC),
                               str(tmp_path / "local"),
                               open_instance=flaky_open)
    cp.local.discard_working_dir()
    inst, rm = cp.restore(m1)
    try:
        assert rm.source is RestoreSource.DURABLE and dump(inst) == state
        assert "does not open" in rm.fallback_reason
    finally:
        inst.close()
