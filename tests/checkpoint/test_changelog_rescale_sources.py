"""Changelog mode across two rescales (2 -> 4 -> 3 partitions), without Spark: the manifests
record where their lineage's changelogs are (``changelog_sources``), every checkpoint
restores to the model's state, and a manifest edited to list another partition's changelog
of the same batch in the middle of its lineage is refused from its metadata."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace

import pytest

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.materialize import wait_for_materializations
from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import CheckpointError, CorruptStateError
from statebackend.keys.grouping_key import encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.keys.ranges import key_group_range
from statebackend.model.changelog_sources import foreign_legacy
from statebackend.model.manifest import PartitionManifest, manifest_path
from statebackend.options import StateBackendOptions
from statebackend.restore.rescale import restore_rescaled
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state.backend import KeyedStateBackend
from statebackend.storage import open_store

OP = "op"
MAXP = 32
KEYS = [encode_grouping_key((f"k{i}",), ["string"], key_group([f"k{i}"], ["string"], MAXP))
        for i in range(240)]
# (parallelism, its batches): a materialization every 6 batches (at 0, then 6)
LAYOUTS = [(2, range(0, 3)), (4, range(3, 5)), (3, range(5, 8))]


def _kg(k: bytes) -> int:
    return int.from_bytes(k[:2], "big")


def _dump(inst: RocksDBInstance) -> dict[str, dict[bytes, bytes]]:
    out = {cf: dict(inst.scan_range(cf, b"", None)) for cf in inst.column_family_names()}
    return {cf: kv for cf, kv in out.items() if kv}


def _counts(inst: RocksDBInstance, keys: list[bytes]) -> dict[bytes, int]:
    be = KeyedStateBackend(inst, clock=lambda: 0)
    count = be.value_state("count", "c BIGINT")
    out = {}
    for k in keys:
        be.set_current_key(k)
        v = count.get()
        if v is not None:
            out[k] = v[0]
    return out


def _restored(store, m: PartitionManifest, opts: StateBackendOptions
              ) -> tuple[dict[str, dict[bytes, bytes]], dict[bytes, int]]:
    """Every entry of ``m``'s state restored from durable storage alone (a fresh local
    directory), and the counts of the keys of its key groups."""
    local = tempfile.mkdtemp()
    try:
        inst, _ = PartitionCheckpointer(store, OP, m.partition, opts, local).restore(m)
        try:
            rng = range(m.key_group_start, m.key_group_end + 1)
            return _dump(inst), _counts(inst, [k for k in KEYS if _kg(k) in rng])
        finally:
            inst.close()
    finally:
        shutil.rmtree(local, ignore_errors=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every checkpoint's manifests by (batch, partition), the live state each checkpoint
    held, the model of the counts, and the store."""
    tmp = tmp_path_factory.mktemp("rescale-sources")
    store = open_store(str(tmp / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(max_parallelism=MAXP, local_dir=str(tmp / "local"),
                               checkpoint_mode="changelog", materialize_interval=6,
                               materialize_inline_ratio=0.0, rolling_slices=0)
    coord = CheckpointCoordinator(store, OP, parallelism=2, max_parallelism=MAXP,
                                  num_retained=20)
    model: dict[bytes, int] = {}
    manifests: dict[tuple[int, int], PartitionManifest] = {}
    live: dict[tuple[int, int], dict] = {}
    for parallelism, batches in LAYOUTS:
        previous = coord.latest()
        coord.parallelism = parallelism  # what the backend does when parallelism changes
        for b in batches:
            for p in range(parallelism):
                rng = key_group_range(p, parallelism, MAXP)
                cp = PartitionCheckpointer(store, OP, p, opts, str(tmp / "local"))
                if previous is not None and b == batches[0]:
                    inst, _, sources = restore_rescaled(cp, previous, parallelism, MAXP,
                                                        str(tmp / "local"))
                    base = sources[0]
                else:
                    base = None if b == 0 else coord.restore(b - 1).manifests[p]
                    inst, _ = cp.restore(base)
                be = KeyedStateBackend(inst, clock=lambda: 0)
                count = be.value_state("count", "c BIGINT")
                mine = [k for k in KEYS if _kg(k) in rng]
                for k in mine if b == 0 else mine[b % 3::3]:
                    be.set_current_key(k)
                    model[k] = model.get(k, 0) + b + 1
                    count.update((model[k],))
                be.flush()
                manifests[b, p], _ = cp.checkpoint(inst, b, f"a{b}", (rng.start, rng.end),
                                                   be.descriptors(), base_manifest=base)
                live[b, p] = _dump(inst)
                inst.close()
            wait_for_materializations()
            assert coord.try_complete(b) is not None
    coord.close()
    return manifests, live, model, store, opts


def test_manifests_record_the_directories_their_lineage_runs_through(run):
    manifests, *_ = run
    sources = {k: m.changelog_sources for k, m in manifests.items()}
    assert sources[2, 0] == sources[2, 1] == ()
    # 2 -> 4: new p0 and p1 build on old p0 (new p0 has its number, not its key groups)
    for b in (3, 4):
        assert [sources[b, p] for p in range(4)] == [((0, 2),), ((0, 2),), ((1, 2),),
                                                     ((1, 2),)]
    # 4 -> 3: new p0 on old p0 (one directory, one segment), new p1 through old p1 (P=2)
    # and old p2 (P=4) before its own p1, new p2 through old p1 and old p3
    for b in (5, 6):
        assert [sources[b, p] for p in range(3)] == [((0, 4),), ((1, 2), (2, 4)),
                                                     ((1, 2), (3, 4))]
    # the materialization of batch 6 subsumed every changelog of the old layouts
    assert [sources[7, p] for p in range(3)] == [(), (), ()]
    assert [f.path.split("/")[1] for f in manifests[5, 1].changelog_files] == [
        "p1", "p1", "p2", "p2", "p1"]
    assert all(m.foreign_changelogs() == () for m in manifests.values())


@pytest.mark.parametrize("batch", [2, 4, 5, 6, 7])
def test_every_checkpoint_restores_to_the_state_it_took(run, batch):
    manifests, live, model, store, opts = run
    ps = sorted(p for b, p in manifests if b == batch)
    assert ps
    for p in ps:
        entries, counts = _restored(store, manifests[batch, p], opts)
        assert entries == live[batch, p]
        if batch == max(b for b, _ in manifests):  # the model holds the latest counts
            assert counts == {k: model[k] for k in counts} and len(counts) == len(
                [k for k in KEYS if _kg(k) in range(manifests[batch, p].key_group_start,
                                                     manifests[batch, p].key_group_end + 1)])


def test_another_partitions_changelog_of_the_same_batch_in_the_middle_is_refused(run):
    manifests, _live, _model, store, opts = run
    m = manifests[5, 1]  # lineage: old p1 (P=2) 1, 2; old p2 (P=4) 3, 4; own p1 5
    theirs = next(f for f in manifests[2, 0].changelog_files if f.name.endswith("01.sbcl"))
    mine = next(f for f in m.changelog_files if f.name == theirs.name)
    assert mine.path != theirs.path and mine.path.split("/")[1] == "p1"
    edited = replace(m, files=tuple(theirs if f == mine else f for f in m.files))
    # the same (base, batch) span, the checksums its own: the older rule saw nothing
    assert foreign_legacy(edited.changelog_files, edited.db_files, 1) == ()
    assert edited.foreign_changelogs() == (theirs,)
    with pytest.raises(CorruptStateError, match="chk-1/p1/") as bad:
        _restored(store, edited, opts)
    assert bad.value.path == theirs.path
    assert theirs.path in str(bad.value)


def test_a_base_listing_a_changelog_where_its_lineage_did_not_write_it_publishes_nothing(
        tmp_path):
    # a kept-open instance resumes from its manifest unread: the writer checks what it
    # would publish, so a checkpoint no reader would restore is never published
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(max_parallelism=MAXP, local_dir=str(tmp_path / "local"),
                               checkpoint_mode="changelog", materialize_interval=100,
                               materialize_inline_ratio=0.0, rolling_slices=0)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    try:
        m = None
        for n in range(3):
            inst.write({"default": {b"k%d" % n: b"v"}})
            m, _ = cp.checkpoint(inst, n, f"a{n}", (0, MAXP - 1))
            wait_for_materializations()
            cp.resume(m, inst)
        assert m is not None and [f.name[-6:] for f in m.changelog_files] == [
            "1.sbcl", "2.sbcl"] and m.changelog_sources == ()
        moved = m.changelog_files[0]
        edited = replace(m, files=tuple(
            replace(f, path=f.path.replace("/p0/", "/p1/")) if f == moved else f
            for f in m.files))
        cp.resume(edited, inst)
        inst.write({"default": {b"k3": b"v"}})
        with pytest.raises(CheckpointError, match="chk-1/p0/"):
            cp.checkpoint(inst, 3, "a3", (0, MAXP - 1))
    finally:
        inst.close()
    assert not store.child(OP).exists(manifest_path(3, 0, "a3"))
