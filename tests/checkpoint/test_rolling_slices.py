"""Rolling slices (``rolling_slices``): each changelog-mode batch rewrites one key-group
slice of the partition with its changelog, and a restore ingests the newest unit of every
slice and replays only the changelogs after it. The state of every checkpoint restores to
a dict model, on an instance kept open and on one restored each batch, in changelog mode and
in ``auto`` mode (switching from an incremental base); what a batch uploads is its
changelog plus one slice; old units, old changelogs and the base stop being referenced once
newer units cover them; a crash in the middle of a unit's upload publishes nothing."""

from __future__ import annotations

import copy
import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_changelog import Model, apply, dump, restore_durable

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint import slices as sl
from statebackend.checkpoint.deltas import delta_problems
from statebackend.errors import CorruptStateError, StorageError
from statebackend.model.manifest import PartitionManifest, SliceRef
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store

OP = "op"
KGR = (0, 15)
N = 4


def key(kg: int, i: int) -> bytes:
    return kg.to_bytes(2, "big") + b"k%03d" % i


def random_batch(rng: random.Random, big: bool = False) -> list[tuple]:
    ops: list[tuple] = []
    for _ in range(rng.randint(1, 6) if not big else 60):
        cf = rng.choice(["s1", "s2"])
        kg = rng.randint(*KGR)
        r = rng.random()
        if r < 0.6 or big:
            ops.append(("batch", cf, [(key(kg, rng.randint(0, 9)), os.urandom(rng.randint(1, 300)))
                                      for _ in range(rng.randint(1, 8))]))
        elif r < 0.8:
            ops.append(("delete", cf, key(kg, rng.randint(0, 9))))
        elif r < 0.85:
            ops.append(("range", cf, key(kg, rng.randint(0, 4)), key(kg, rng.randint(5, 9))))
        elif r < 0.88:  # across key groups (and slices)
            kg2 = rng.randint(kg, KGR[1])
            ops.append(("range", cf, key(kg, rng.randint(0, 9)), key(kg2, rng.randint(0, 9))))
        elif r < 0.9:  # a state dropped (made again by a later write)
            ops.append(("drop", cf))
        else:  # the state layer's descriptors: a column family not keyed by key group
            ops.append(("put", "_meta", b"state-%d" % rng.randint(0, 3), os.urandom(8)))
    return ops


def checkpoint_each(store: Any, opts: Any, local: str, batches: list[list[tuple]],
                    kept_open: bool, before: Any = None
                    ) -> tuple[list[PartitionManifest], Model]:
    """Batches 1..n of partition 0: apply (then ``before(n, instance)``), checkpoint, and
    check that the checkpoint restores to the model from durable storage and, with the
    instance not ``kept_open``, through the checkpointer's own restore. ``opts``: the
    options, or a function of the batch giving them (where they change, a new process
    restores the last checkpoint with the new ones)."""
    options = opts if callable(opts) else (lambda _n: opts)
    model: Model = {}
    cp = PartitionCheckpointer(store, OP, 0, options(1), local)
    inst, _ = cp.restore(None)
    manifests: list[PartitionManifest] = []
    for n, ops in enumerate(batches, start=1):
        if n > 1 and options(n) != options(n - 1):
            inst.close()
            cp = PartitionCheckpointer(store, OP, 0, options(n), f"{local}-{n}")
            inst, _ = cp.restore(manifests[-1])
        apply(inst, model, ops)
        if before is not None:
            before(n, inst)
        m, _ = cp.checkpoint(inst, n, "a0", KGR)
        manifests.append(m)
        assert restore_durable(store, m, options(n)) == model, n
        if kept_open:
            cp.resume(m, inst)
        else:
            inst.close()
            cp = PartitionCheckpointer(store, OP, 0, options(n), local)
            inst, _ = cp.restore(m)
            assert dump(inst) == model, n
    inst.close()
    return manifests, model


def covered(m: PartitionManifest) -> dict[int, int]:
    return sl.covering(KGR, m.slices, m.materialized_id).versions


@pytest.mark.parametrize("mode", ["changelog", "auto"])
@pytest.mark.parametrize("kept_open", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_restore_after_every_batch_of_a_random_history_equals_the_model(
        tmp_path: Path, mode: str, kept_open: bool, seed: int) -> None:
    rng = random.Random(seed)
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    # auto: the first batches checkpoint incrementally, then changelog mode on that base
    opts = StateBackendOptions(checkpoint_mode=mode, rolling_slices=N,
                               auto_changelog_size="8k", max_parallelism=16)
    manifests, _model = checkpoint_each(
        store, opts, str(tmp_path / "local"),
        [random_batch(rng, big=n in (1, 13)) for n in range(1, 25)], kept_open)
    # every older checkpoint still restores to what it was (nothing it names was changed)
    rolled = [m for m in manifests if m.slices]
    assert len(rolled) >= 18, [m.mode for m in manifests]
    for m in rolled[-3:]:
        versions = covered(m)
        # one slice a batch: every key group's unit is at most N batches old, so a
        # manifest references at most N changelogs and no base once a rotation is done
        assert m.checkpoint_id - min(versions.values()) < N, (m.checkpoint_id, versions)
        assert m.materialization is None and not m.db_files
        # its changelogs travel as pieces by key-group range (statebackend.checkpoint.
        # deltas): for every batch after a key group's unit a piece holding it, and no
        # piece whose key groups all have a newer unit
        assert not m.changelog_files
        pieces = [d for d in m.slices if d.is_delta]
        for b in range(min(versions.values()) + 1, m.checkpoint_id + 1):
            for kg in (kg for kg, v in versions.items() if v < b):
                assert any(d.checkpoint_id == b and d.first_kg <= kg <= d.last_kg
                           for d in pieces), (b, kg)
        for d in pieces:
            assert any(versions[kg] < d.checkpoint_id
                       for kg in range(d.first_kg, d.last_kg + 1)), d


def test_each_batch_uploads_its_changelog_and_one_slice(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    model: Model = {}
    # a load: 16 key groups x 40 keys x 1 KiB, then one key per key group each batch
    apply(inst, model, [("batch", "s1", [(key(kg, i), os.urandom(1024)) for kg in range(16)
                                         for i in range(40)])])
    m, _ = cp.checkpoint(inst, 1, "a0", KGR)
    # the load rewrites every slice and needs no changelog
    assert sorted((u.first_kg, u.last_kg) for u in m.slices if not u.is_global) == \
        sl.slice_ranges(KGR, N)
    assert not m.changelog_files
    state = sum(f.size for f in m.files)
    for n in range(2, 12):
        cp.resume(m, inst)
        apply(inst, model, [("batch", "s1", [(key(kg, n), os.urandom(1024))
                                             for kg in range(16)])])
        m, _ = cp.checkpoint(inst, n, "a0", KGR)
        new = [f for f in m.files if f.uploaded]
        # its changelog, the slice due (a quarter of the state) and the global unit
        assert {f.name for f in new if f.name.startswith("slice-") and "-g-" not in f.name} \
            == {u.file_names()[0] for u in m.slices if u.checkpoint_id == n
                and not u.is_global and not u.is_delta}
        # the changelog in pieces by slice turn (with N <= deltas.PIECES, one piece per
        # slice), but none for the slice just rewritten (its unit holds the batch)
        due = next(u for u in m.slices if u.checkpoint_id == n and not u.is_global)
        assert {f.name for f in new if f.name.startswith("delta-")} == {
            f"delta-{n}-{a}-{b}.sbcl" for a, b in sl.slice_ranges(KGR, N)
            if (a, b) != (due.first_kg, due.last_kg)}
        assert sum(f.size for f in new) < state / N + 40 * 1024, n
        # the previous unit of that slice is no longer referenced
        assert len([u for u in m.slices if not u.is_global and not u.is_delta]) == N
        assert restore_durable(store, m, opts) == model
    inst.close()


class FailingStore:
    """A store whose ``put_files`` uploads the first files of a call and then fails."""

    def __init__(self, store: Any, after: int, switch: dict | None = None) -> None:
        self._store, self.after = store, after
        self.switch = switch if switch is not None else {"armed": False}

    @property
    def armed(self) -> bool:
        return self.switch["armed"]

    @armed.setter
    def armed(self, value: bool) -> None:
        self.switch["armed"] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def child(self, name: str) -> FailingStore:
        return FailingStore(self._store.child(name), self.after, self.switch)

    def put_files(self, items, **kw):
        if self.armed and any("slice-" in path for _local, path in items):
            self._store.put_files(items[:self.after], **kw)
            raise StorageError("connection reset during a slice upload")
        return self._store.put_files(items, **kw)


def test_a_crash_during_a_units_upload_publishes_nothing_and_a_retry_restores(
        tmp_path: Path) -> None:
    durable = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    store = FailingStore(durable, after=2)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    rng = random.Random(7)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    model: Model = {}
    m = None
    for n in range(1, 6):
        apply(inst, model, random_batch(rng, big=n == 1))
        m, _ = cp.checkpoint(inst, n, "a0", KGR)
        cp.resume(m, inst)
    before = copy.deepcopy(model)
    inst.close()
    # batch 6: the task restores 5, writes, and dies while its slice is uploading
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local2"))
    inst, _ = cp.restore(m)
    apply(inst, model, random_batch(rng))
    store.armed = True
    with pytest.raises(StorageError):
        cp.checkpoint(inst, 6, "a0", KGR)
    inst.close()
    # nothing was published for batch 6; batch 5 restores as it was
    written = [f for _d, _s, fs in os.walk(tmp_path / "durable" / OP / "chk-6") for f in fs]
    assert written and "_MANIFEST.json" not in written  # part of the upload, no manifest
    assert restore_durable(durable, m, opts) == before
    # a retry of batch 6 (another attempt) from batch 5's checkpoint
    store.armed = False
    model = copy.deepcopy(before)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local3"))
    inst, _ = cp.restore(m)
    apply(inst, model, random_batch(random.Random(8)))
    m6, _ = cp.checkpoint(inst, 6, "a1", KGR)
    inst.close()
    assert any(u.checkpoint_id == 6 for u in m6.slices)
    assert all("/a1/" in f.path for f in m6.files if f.uploaded)
    assert restore_durable(durable, m6, opts) == model


def test_coverage_merge_and_prune() -> None:
    assert sl.slice_ranges((0, 15), 4) == [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert sl.slice_ranges((3, 5), 8) == [(3, 3), (4, 4), (5, 5)]
    v = {kg: 9 for kg in range(16)} | {5: 2, 13: 2, 12: 1}
    assert [sl.due_ranges((0, 15), 4, vs, False) for vs in ({}, {**v, 5: 9}, v)] == \
        [[(0, 3)], [(12, 15)], [(12, 15)]]
    old = (SliceRef(-1, -1, 3, ("_meta",)), SliceRef(0, 7, 3, ("s1",)),
           SliceRef(8, 15, 4, ("s1",)))
    new = (SliceRef(-1, -1, 5, ()), SliceRef(0, 3, 5, ("s1",)))
    merged = sl.merge_slices(old, new)
    # the global unit is replaced; 0-7 only partly covered by 0-3: kept for 4-7
    assert [(s.first_kg, s.checkpoint_id) for s in merged] == [(0, 3), (8, 4), (-1, 5),
                                                               (0, 5)]
    c = sl.covering((0, 15), merged, base_id=2)
    assert c.versions[0] == 5 and c.versions[4] == 3 and c.versions[9] == 4
    assert (c.start, c.needs_base, c.global_version) == (3, False, 5)
    # a base older than every unit is no longer needed; one some key group uses still is
    c2 = sl.covering((0, 15), (SliceRef(0, 7, 5, ()),), base_id=2)
    assert (c2.start, c2.needs_base) == (2, True)
    assert sl.prune_slices(merged, c) == merged
    # a unit every key group of which a newer one holds is dropped
    c3 = sl.covering((0, 15), merged + (SliceRef(4, 7, 6, ()),), base_id=2)
    assert SliceRef(0, 7, 3, ("s1",)) not in sl.prune_slices(
        merged + (SliceRef(4, 7, 6, ()),), c3)


def test_a_piece_of_a_changelog_moved_dropped_or_swapped_is_refused(tmp_path: Path
                                                                    ) -> None:
    # a restore of rolling slices checks its changelog pieces (statebackend.checkpoint.
    # deltas) as any other restore checks its changelogs: where they are, that none is
    # missing, and that each holds its own key groups' and batch's changes
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = StateBackendOptions(checkpoint_mode="changelog", rolling_slices=N,
                               max_parallelism=16)
    cp = PartitionCheckpointer(store, OP, 0, opts, str(tmp_path / "local"))
    inst, _ = cp.restore(None)
    rng, model = random.Random(5), {}
    try:
        for n in range(1, 4):
            apply(inst, model, [("batch", "s1", [(key(kg, n), b"v%d" % n)
                                                 for kg in range(16)])])
            apply(inst, model, random_batch(rng))
            m, _ = cp.checkpoint(inst, n, "a0", KGR)
            cp.resume(m, inst)
    finally:
        inst.close()
    pieces = [d for d in m.slices if d.is_delta]
    assert len(pieces) >= 2 and not m.changelog_files
    assert restore_durable(store, m, opts) == model
    files = m.slice_files
    mine, other = files[pieces[0].file_name(0)], files[pieces[1].file_name(0)]

    def refused(edited: PartitionManifest, match: str) -> CorruptStateError:
        with pytest.raises(CorruptStateError, match=match) as bad:
            restore_durable(store, edited, opts)
        return bad.value

    # in another partition's directory
    theirs = replace(mine, path=mine.path.replace("/p0/", "/p1/"))
    bad = refused(replace(m, files=tuple(theirs if f == mine else f for f in m.files)),
                  "another partition")
    assert bad.path == theirs.path
    # left out of the manifest (entry and file)
    dropped = replace(m, slices=tuple(s for s in m.slices if s != pieces[0]),
                      files=tuple(f for f in m.files if f != mine))
    refused(dropped, "piece is missing")
    # verify's check is the same rule (statebackend.verify.changelogs_continuous)
    assert delta_problems(m, 1, m.checkpoint_id) == (m.checkpoint_id, [])
    reached, probs = delta_problems(dropped, 1, m.checkpoint_id)
    assert reached == pieces[0].checkpoint_id - 1 and "piece is missing" in probs[0][1]
    # its entry pointing at another range's piece, with that file's size and checksum
    swapped = replace(mine, path=other.path, size=other.size, checksum=other.checksum)
    refused(replace(m, files=tuple(swapped if f == mine else f for f in m.files)),
            "outside them")
