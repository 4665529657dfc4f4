"""Savepoints end to end without Spark: written from a completed checkpoint, read by key
group, restored into another parallelism, corrupted, kept through retention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from savepoint_helpers import MAXP, OP, build_operator, dump, merged, opts, restrict

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptKeyGroupError,
    IncompatibleStateError,
    StorageError,
)
from statebackend.keys.ranges import key_group_range
from statebackend.restore.rescale import restore_from_savepoint
from statebackend.savepoint.format import SAVEPOINT_MANIFEST
from statebackend.savepoint.reader import SavepointReader
from statebackend.savepoint.writer import create_savepoint, savepoint_dir


def reader_for(store, name: str) -> SavepointReader:
    return SavepointReader(store.child(OP).child(savepoint_dir(name)))


@pytest.mark.parametrize(("compression", "mode"), [("snappy", "incremental"),
                                                  ("none", "incremental"),
                                                  ("snappy", "changelog")])
def test_savepoint_restores_every_parallelism(store, tmp_path: Path, compression, mode):
    _, state = build_operator(store, tmp_path, 2, checkpoint_mode=mode)
    full = merged(state)
    sp = create_savepoint(store, OP, "sp1", compression=compression)
    assert sp.checkpoint_id == 1 and sp.parallelism == 2 and sp.max_parallelism == MAXP
    assert {s.name for s in sp.states} >= {"count", "seen", "only_here"}
    if compression == "snappy":
        assert sp.metrics["stored_bytes"] < sp.metrics["raw_bytes"]
    r = reader_for(store, "sp1")
    for new_p in (1, 3, 4):
        for p in range(new_p):
            rng = key_group_range(p, new_p, MAXP)
            cp = PartitionCheckpointer(store, OP, p, opts(tmp_path), str(tmp_path / f"l{new_p}"))
            inst, metrics = restore_from_savepoint(cp, r, new_p, MAXP)
            try:
                assert dump(inst) == restrict(full, rng.start, rng.end), (new_p, p)
                assert metrics.source == "savepoint"
            finally:
                inst.close()


def test_read_key_group_reads_only_that_group(store, tmp_path: Path):
    _, state = build_operator(store, tmp_path, 2)
    full = merged(state)
    create_savepoint(store, OP, "sp")
    r = reader_for(store, "sp")
    got = r.read_key_group(5)
    want = restrict(full, 5, 5)
    want.pop("_meta")
    assert {cf: dict(kv) for cf, kv in got.items()} == want


def corrupt_block_of(store, name: str, kg: int) -> str:
    r = reader_for(store, name)
    fname = next(r.manifest.files_for(kg, kg))
    block = r.file(fname).blocks_of(kg)[0]
    path = os.path.join(store.root, OP, savepoint_dir(name), fname)
    with open(path, "r+b") as f:
        f.seek(block.offset + block.length // 2)
        b = f.read(1)
        f.seek(block.offset + block.length // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    return fname


def test_corrupt_block_fails_only_the_restore_that_needs_it(store, tmp_path: Path):
    _, state = build_operator(store, tmp_path, 2)
    full = merged(state)
    create_savepoint(store, OP, "sp")
    bad_kg = 20  # owned by partition 2 of 4 (key groups 16..23)
    fname = corrupt_block_of(store, "sp", bad_kg)
    r = reader_for(store, "sp")
    cp = PartitionCheckpointer(store, OP, 2, opts(tmp_path), str(tmp_path / "x"))
    with pytest.raises(CorruptKeyGroupError) as e:
        restore_from_savepoint(cp, r, 4, MAXP)
    assert e.value.key_group == bad_kg and fname in str(e.value) and fname in e.value.path
    assert not os.listdir(cp.local.working_dir) if os.path.isdir(cp.local.working_dir) else True
    # partition 3 (24..31) and partition 1 (8..15) never read that block
    for p in (1, 3):
        rng = key_group_range(p, 4, MAXP)
        cp = PartitionCheckpointer(store, OP, p, opts(tmp_path), str(tmp_path / "y"))
        inst, _ = restore_from_savepoint(cp, r, 4, MAXP)
        assert dump(inst) == restrict(full, rng.start, rng.end)
        inst.close()


def test_changed_max_parallelism_is_refused_with_migration_advice(store, tmp_path: Path):
    build_operator(store, tmp_path, 2, batches=1)
    create_savepoint(store, OP, "sp")
    cp = PartitionCheckpointer(store, OP, 0, opts(tmp_path), str(tmp_path / "z"))
    with pytest.raises(IncompatibleStateError, match=r"max_parallelism=32.*savepoint"):
        restore_from_savepoint(cp, reader_for(store, "sp"), 2, 64)


def test_savepoint_names_are_never_reused_and_missing_ones_are_typed(store, tmp_path: Path):
    build_operator(store, tmp_path, 1, batches=1)
    create_savepoint(store, OP, "sp")
    with pytest.raises(StorageError, match="already exists"):
        create_savepoint(store, OP, "sp")
    with pytest.raises(CheckpointNotFoundError):
        create_savepoint(store, OP, "other", checkpoint_id=42)
    with pytest.raises(CheckpointNotFoundError):
        _ = reader_for(store, "nope").manifest


def test_savepoint_outlives_retention_of_its_checkpoint(store, tmp_path: Path):
    coord, _ = build_operator(store, tmp_path, 2, batches=1)
    sp = create_savepoint(store, OP, "keep")
    # more checkpoints than retained: checkpoint 0 and its files go
    from savepoint_helpers import encoded_keys, fill

    from statebackend.state.backend import KeyedStateBackend
    for b in range(1, 4):
        for p in range(2):
            rng = key_group_range(p, 2, MAXP)
            cp = PartitionCheckpointer(store, OP, p, opts(tmp_path), str(tmp_path / "local"))
            inst, _ = cp.restore(coord.restore(b - 1).manifests[p])
            be = KeyedStateBackend(inst, clock=lambda: 0)
            fill(be, [k for k in encoded_keys(50) if int.from_bytes(k[:2], "big") in rng], b)
            cp.checkpoint(inst, b, f"a{b}", (rng.start, rng.end), be.descriptors())
            inst.close()
        coord.try_complete(b)
    coord.wait_for_gc()
    coord.collect_garbage()
    assert 0 not in [c.checkpoint_id for c in coord.list_completed()]
    d = f"{OP}/{savepoint_dir('keep')}"
    assert store.exists(f"{d}/{SAVEPOINT_MANIFEST}")
    assert sorted(n.rsplit("/", 1)[1] for n in store.list_dir(d)) == sorted(
        [SAVEPOINT_MANIFEST, *sp.files])
