"""Scenario tests of the checkpoint coordinator on local, memory and S3 storage.

Each test drives simulated task attempts (see ``coordsim``) through one situation the
issue names: concurrent attempts, a task restoring from a non-chosen attempt, retention,
pins, aborts, dead attempts, crashes at every step, restarts, bounded listings.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from coordsim import (
    OP,
    CountingStore,
    FaultStore,
    SimulatedCrash,
    all_files,
    content,
    run_attempt,
)

from statebackend.coordinator import (
    CheckpointCoordinator,
    key_group_range,
    referenced_paths,
)
from statebackend.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptStateError,
    IncompatibleStateError,
)
from statebackend.model.manifest import PartitionManifest, completed_record_path
from statebackend.storage.base import DurableStore
from statebackend.storage.records import read_latest_record

MAXP = 8


def ssts(*names: str, p: int = 0) -> dict[str, bytes]:
    return {f"{n}.sst": content(p, f"{n}.sst", 10 + len(n)) for n in names}


class Query:
    """A tiny driver-plus-tasks harness over one store (one partition unless told)."""

    def __init__(self, store: DurableStore, num_retained: int = 1, parallelism: int = 1,
                 **kw: object) -> None:
        self.store = store
        self.num_retained = num_retained
        self.parallelism = parallelism
        self.kw = kw
        self.coord = self.open()

    def open(self, store: DurableStore | None = None) -> CheckpointCoordinator:
        return CheckpointCoordinator(store or self.store, OP, self.parallelism, MAXP,
                                     self.num_retained, **self.kw)  # type: ignore[arg-type]

    def attempt(self, n: int, name: str, state: dict[str, bytes],
                base: PartitionManifest | None, p: int = 0,
                die_after: int | None = None) -> PartitionManifest | None:
        return run_attempt(self.store, n, p, name, state, base, parallelism=self.parallelism,
                           max_parallelism=MAXP, die_after=die_after)

    def files(self) -> set[str]:
        return all_files(self.store)

    def referenced(self) -> set[str]:
        out: set[str] = set()
        for info in self.coord.list_completed():
            out |= referenced_paths(self.coord.restore(info.checkpoint_id).manifests.values())
        return out

    def assert_clean(self) -> None:
        """Only retained checkpoints' files and the coordinator's metadata remain."""
        meta = {completed_record_path(i.checkpoint_id) for i in self.coord.list_completed()}
        meta |= {f"_pins/chk-{i.checkpoint_id}" for i in self.coord.list_completed() if i.pinned}
        assert self.files() - {"_gc/swept.json", "_checkpoints/LATEST.json"} == (
            self.referenced() | meta)


def test_complete_list_get_restore(store: DurableStore) -> None:
    q = Query(store, num_retained=2, parallelism=2, clock=lambda: 1234.5)
    assert q.coord.latest() is None and q.coord.list_completed() == []
    m0 = q.attempt(0, "a", ssts("1"), None, p=0)
    assert q.coord.try_complete(0) is None  # partition 1 has not published yet
    m1 = q.attempt(0, "a", ssts("2", p=1), None, p=1)
    rec = q.coord.try_complete(0)
    assert rec is not None and q.coord.try_complete(0) == rec  # idempotent
    assert dict(rec.manifests) == {0: m0.path, 1: m1.path}
    assert rec.full_size == m0.full_size + m1.full_size > 0
    assert rec.incremental_size == rec.full_size and rec.created_at_ms == 1234500
    assert q.coord.latest() == rec == q.coord.get(0)
    assert read_latest_record(store, OP) == rec
    [info] = q.coord.list_completed()
    assert (info.checkpoint_id, info.full_size, info.created_at_ms, info.pinned) == (
        0, rec.full_size, 1234500, False)
    rp = q.coord.restore()
    assert rp.record == rec and rp.manifests == {0: m0, 1: m1}
    with pytest.raises(CheckpointNotFoundError):
        q.coord.get(7)


def test_concurrent_attempts_choose_first_name_and_lose_their_files_later(
        store: DurableStore) -> None:
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    b = q.attempt(1, "b", ssts("1", "2"), c0)
    a = q.attempt(1, "a", ssts("1", "2"), c0)
    q.attempt(1, "c", ssts("1", "2"), c0, die_after=1)  # died before publishing
    rec = q.coord.try_complete(1)
    assert rec is not None and rec.manifests[0] == a.path
    # A task of checkpoint 2 may still restore from attempt b: its files stay for now.
    assert b.path in q.files() and "chk-1/p0/c/000000.sst" not in q.files()
    q.attempt(2, "a", ssts("1", "2", "3"), q.coord.restore().manifests[0])
    q.coord.try_complete(2)
    assert not any(f.startswith(("chk-1/p0/b/", "chk-1/p0/c/")) for f in q.files())
    q.assert_clean()


def test_restored_from_non_chosen_attempt_is_referenced_until_dropped(
        store: DurableStore) -> None:
    # c1 has attempts a (chosen) and b; c2's attempts restored from both before c1's record
    # existed; c3 restored from c2's non-chosen attempt: the files of c1/b are needed until
    # c3 is no longer retained.
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    c1a = q.attempt(1, "a", ssts("1", "2"), c0)
    c1b = q.attempt(1, "b", ssts("1", "2"), c0)
    c2a = q.attempt(2, "a", ssts("1", "2", "3"), c1a)
    c2b = q.attempt(2, "b", ssts("1", "2", "3"), c1b)
    assert q.coord.try_complete(1).manifests[0] == c1a.path  # type: ignore[union-attr]
    c3 = q.attempt(3, "a", ssts("1", "2", "3", "4"), c2b)
    assert q.coord.try_complete(2).manifests[0] == c2a.path  # type: ignore[union-attr]
    from_c1b = {f.path for f in c1b.files if f.uploaded and f.shared}
    assert from_c1b <= q.files()  # protected: c2/b is the base of a checkpoint in flight
    rec3 = q.coord.try_complete(3)
    assert rec3 is not None and rec3.manifests[0] == c3.path
    assert {f.path for f in c3.files} & from_c1b
    assert q.coord.registry.is_referenced(next(iter({f.path for f in c3.files} & from_c1b)))
    c4 = q.attempt(4, "a", ssts("5"), q.coord.restore().manifests[0])
    assert q.coord.try_complete(4) is not None and c4 is not None
    assert not from_c1b & q.files()
    q.assert_clean()


def test_protected_only_files_are_swept_once_protection_ends(store: DurableStore) -> None:
    # Like above, but c3 restores from c2's record: the files of c1/b were protected only by
    # the non-chosen c2/b, and must be deleted after c3 completes, not forgotten.
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    c1a = q.attempt(1, "a", ssts("1", "2"), c0)
    c1b = q.attempt(1, "b", ssts("1", "2"), c0)
    q.attempt(2, "a", ssts("1", "2", "3"), c1a)
    q.attempt(2, "b", ssts("1", "2", "3"), c1b)
    q.coord.try_complete(1)
    q.coord.try_complete(2)
    assert q.coord.watermark == 1  # chk-1/ still holds files only c2/b uses
    q.attempt(3, "a", ssts("1", "2", "3", "4"), q.coord.restore().manifests[0])
    q.coord.try_complete(3)
    assert q.coord.watermark == 3
    q.assert_clean()


def blocked_scenario(q: Query) -> set[str]:
    """c2's chosen attempt holds s1 at another path than c1 did, its other attempt at c1's.

    With one retained checkpoint, c1 is subsumed when c2 completes, but c1's copy of s1 is
    still protected (c2/b uses it); c1's record must stay until that ends. Returns the
    path of c1's copy of s1.
    """
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    c1a = q.attempt(1, "a", ssts("1", "2"), c0)  # reuses chk-0's s1
    c1b = q.attempt(1, "b", ssts("1", "2"), None)  # uploads everything again
    q.attempt(2, "a", ssts("1", "2", "3"), c1b)
    q.attempt(2, "b", ssts("1", "2", "3"), c1a)
    q.coord.try_complete(1)
    q.coord.try_complete(2)
    return {f.path for f in c1a.files if f.name == "1.sst"}


def test_subsumed_checkpoint_kept_while_its_files_are_protected(store: DurableStore) -> None:
    q = Query(store)
    s1 = blocked_scenario(q)
    assert s1 == {"chk-0/p0/a/1.sst"} and s1 <= q.files()
    assert 1 in q.coord.registry.checkpoints  # subsumed but not forgotten
    assert completed_record_path(1) in q.files()
    q.coord = q.open()  # a restart must still know about s1
    q.attempt(3, "a", ssts("1", "2", "3", "4"), q.coord.restore().manifests[0])
    q.coord.try_complete(3)
    assert not s1 & q.files()
    q.assert_clean()


@pytest.mark.parametrize("crash_rebuild_too", [False, True])
def test_crash_at_every_mutating_step_then_rebuild(new_store: Callable[[], DurableStore],
                                                   crash_rebuild_too: bool,
                                                   request: pytest.FixtureRequest) -> None:
    """For each k, crash before the k-th write or delete of a completion and its collection
    (optionally also of the rebuild after it); a clean restart must finish the job."""
    # Every step on local and memory; on S3 (slow round trips) every ninth.
    stride = 9 if request.node.callspec.params["store_url"] == "s3" else 1
    k = 0
    while True:
        q = Query(new_store())
        blocked_scenario(q)
        q.attempt(3, "a", ssts("1", "2", "3", "4"), q.coord.restore().manifests[0])
        fault = FaultStore(q.store)
        q.coord = q.open(fault)
        fault.crash_after = fault.ops + k
        try:
            q.coord.try_complete(3)
            crashed = False
        except SimulatedCrash:
            crashed = True
        if crash_rebuild_too and crashed:
            try:
                q.open(FaultStore(q.store, crash_after=k // 2))
            except SimulatedCrash:
                pass
        q.coord = q.open()
        assert q.referenced() <= q.files()
        q.coord.try_complete(3)
        q.attempt(4, "a", ssts("5"), q.coord.restore().manifests[0])
        q.coord.try_complete(4)
        q.assert_clean()
        if not crashed:
            break
        k += stride
    assert k > 8  # the scenario has many steps to crash in


def test_retention_pins_survive_restart(store: DurableStore) -> None:
    q = Query(store, num_retained=2)
    base = None
    for n in range(3):
        base = q.attempt(n, "a", ssts(*(f"{n}{i}" for i in range(2))), base)
        q.coord.try_complete(n)
        if n == 0:
            q.coord.pin(0)
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [0, 1, 2]
    assert [i.pinned for i in q.coord.list_completed()] == [True, False, False]
    q.coord = q.open()
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [0, 1, 2]
    q.coord.restore(0)
    q.assert_clean()
    q.coord.unpin(0)
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [1, 2]
    q.assert_clean()
    with pytest.raises(CheckpointNotFoundError):
        q.coord.pin(0)
    with pytest.raises(CheckpointNotFoundError):
        q.coord.restore(0)


def test_abort_deletes_attempts_and_a_rerun_completes(store: DurableStore) -> None:
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    q.attempt(1, "a", ssts("1", "2"), c0)
    q.attempt(1, "b", ssts("1", "2"), c0, die_after=1)
    deleted = q.coord.abort(1)
    assert deleted and not any(f.startswith("chk-1/") for f in q.files())
    assert q.coord.try_complete(1) is None
    q.attempt(1, "c", ssts("1", "2"), c0)  # the re-run of the batch
    assert q.coord.try_complete(1).manifests[0] == "chk-1/p0/c/_MANIFEST.json"  # type: ignore[union-attr]
    with pytest.raises(CheckpointError):
        q.coord.abort(1)
    q.assert_clean()


def test_skipped_and_late_checkpoints_are_swept(store: DurableStore) -> None:
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    q.attempt(1, "a", ssts("1", "2"), c0)  # never completed
    c2 = q.attempt(2, "a", ssts("1", "3"), c0)
    assert q.coord.try_complete(2) is not None
    assert q.coord.try_complete(1) is None  # older than the latest: obsolete
    q.attempt(2, "z", ssts("1", "3"), c0)  # a straggler of the completed checkpoint
    q.attempt(3, "a", ssts("1", "3", "4"), c2)
    q.coord.try_complete(3)
    q.assert_clean()


def test_attempt_with_missing_file_is_not_chosen(store: DurableStore) -> None:
    q = Query(store)
    c0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    a = q.attempt(1, "a", ssts("1", "2"), c0)
    q.attempt(1, "b", ssts("1", "2"), c0)
    store.delete([f"{OP}/{next(f.path for f in a.files if f.uploaded)}"])
    assert q.coord.try_complete(1).manifests[0] == "chk-1/p0/b/_MANIFEST.json"  # type: ignore[union-attr]


def test_corrupt_manifest_is_ignored_and_wrong_key_groups_refused(store: DurableStore) -> None:
    q = Query(store)
    store.put_bytes_atomic(f"{OP}/chk-0/p0/a/_MANIFEST.json", b"{not json")
    q.attempt(0, "b", ssts("1"), None)
    assert q.coord.try_complete(0).manifests[0] == "chk-0/p0/b/_MANIFEST.json"  # type: ignore[union-attr]
    q.attempt(1, "a", ssts("1"), None)
    with pytest.raises(IncompatibleStateError):
        CheckpointCoordinator(store, OP, 1, MAXP * 2).try_complete(1)


def test_attempt_of_another_layout_is_a_failed_attempt_not_a_blocker(store: DurableStore) -> None:
    # a run with parallelism 2 died after publishing partition 0 of checkpoint 0; the query
    # then restarted with parallelism 1: completion must pick the new layout's attempt
    run_attempt(store, 0, 0, "old", ssts("9"), None, parallelism=2, max_parallelism=MAXP)
    q = Query(store)
    q.attempt(0, "new", ssts("1"), None)
    assert q.coord.try_complete(0).manifests[0] == "chk-0/p0/new/_MANIFEST.json"  # type: ignore[union-attr]


def test_retained_manifest_missing_at_rebuild_is_reported(store: DurableStore) -> None:
    q = Query(store)
    m = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    store.delete([f"{OP}/{m.path}"])
    # degraded, not stuck: the coordinator opens and reports it; restoring it fails
    coord = q.open()
    assert set(coord.damaged) == {0} and coord.damaged[0].path == m.path
    with pytest.raises(CorruptStateError, match="missing") as bad:
        coord.restore()
    assert bad.value.path == m.path


def two_completed_and_a_third(store: DurableStore) -> tuple[Query, PartitionManifest]:
    """Checkpoints 0 and 1 completed (two retained), and checkpoint 2's manifest published
    (completing it drops checkpoint 0); the query and that manifest."""
    q = Query(store, num_retained=2)
    m0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    m1 = q.attempt(1, "a", ssts("1", "2"), m0)
    q.coord.try_complete(1)
    return q, q.attempt(2, "a", ssts("2", "3"), m1)


@pytest.mark.parametrize("record_left", [False, True])
def test_rebuild_while_another_coordinator_drops_a_retained_checkpoint(
        store: DurableStore, monkeypatch: pytest.MonkeyPatch, record_left: bool) -> None:
    # A driver that restarts a query with a new backend object rebuilds the registry while
    # the earlier object's coordinator still completes and collects: a record listed as
    # retained may lose its manifest and record before it is read. That is retention, not
    # corruption: the rebuild reads the records again. It deletes the manifests first, the
    # record last (record_left: the rebuild reads in between).
    q, m2 = two_completed_and_a_third(store)
    load = CheckpointCoordinator._load
    raced = []

    record0 = store.get_bytes(f"{OP}/{completed_record_path(0)}")

    def racing_load(self, record, **kw):
        if not raced:
            raced.append(record.checkpoint_id)
            q.coord.try_complete(2)  # drops checkpoint 0: its manifest and record go
            q.coord.wait_for_gc()
            if record_left:  # the other coordinator is between the two deletions
                store.put_bytes_atomic(f"{OP}/{completed_record_path(0)}", record0)
        return load(self, record, **kw)

    monkeypatch.setattr(CheckpointCoordinator, "_load", racing_load)
    fresh = q.open()
    assert raced == [0]
    completed = [i.checkpoint_id for i in fresh.list_completed()]
    # a record left behind is a subsumed checkpoint to the fresh coordinator: it forgets it
    assert completed == [1, 2]
    assert fresh.restore().manifests == {0: m2}
    assert completed_record_path(0) not in all_files(store)


def test_rebuild_while_another_coordinator_drops_a_listed_record(
        store: DurableStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The record itself may go between the listing of _checkpoints/ and its read (seen
    # once under load as a StoreFileNotFoundError out of a query's start): retention
    # again, so the rebuild lists the records again.
    q, m2 = two_completed_and_a_third(store)
    listing = CheckpointCoordinator._list
    raced = []

    def racing_list(self, rel):
        out = listing(self, rel)
        if rel == "_checkpoints" and not raced and self is not q.coord:
            raced.append(sorted(out))
            q.coord.try_complete(2)  # drops checkpoint 0: its manifest and record go
            q.coord.wait_for_gc()
        return out

    monkeypatch.setattr(CheckpointCoordinator, "_list", racing_list)
    fresh = q.open()
    assert raced and completed_record_path(0) in raced[0]
    assert [i.checkpoint_id for i in fresh.list_completed()] == [1, 2]
    assert fresh.restore().manifests == {0: m2}


def test_uncommitted_completion_keeps_its_predecessor_until_spark_commits(
        store: DurableStore) -> None:
    # A checkpoint completed without knowing that Spark committed its micro-batch (a
    # restart's planning) may be run again by Spark from the checkpoint before it.
    q = Query(store)
    m0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    m1 = q.attempt(1, "a", ssts("2"), m0)  # compacted: shares nothing with m0
    rec = q.coord.try_complete(1, committed=False)
    assert rec is not None and not rec.committed
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [0, 1]
    assert {m0.path, m1.path} <= q.files()
    q.coord = q.open()  # derived from the records: a restarted driver keeps it too
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [0, 1]
    assert q.coord.restore(0).manifests == {0: m0}
    # completing it again without the commit changes nothing; with it, the record is
    # rewritten and retention is back to num_retained
    assert q.coord.try_complete(1, committed=False) == rec
    assert q.coord.try_complete(1).committed
    assert read_latest_record(store, OP).committed  # type: ignore[union-attr]
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [1]
    assert m0.path not in q.files()
    q.assert_clean()
    # a newer checkpoint subsumes an uncommitted predecessor like any other
    m2 = q.attempt(2, "a", ssts("3"), m1)
    q.coord.try_complete(2, committed=False)
    q.attempt(3, "a", ssts("4"), m2)
    q.coord.try_complete(3)
    assert [i.checkpoint_id for i in q.coord.list_completed()] == [3]
    q.assert_clean()


def test_another_coordinators_commit_is_never_taken_back(store: DurableStore) -> None:
    # The backend object of a query that just ended records checkpoint 1 as committed
    # (its progress event) and deletes checkpoint 0; the restarted query's coordinator,
    # opened before, completes 1 on publication alone: the record stays committed.
    q = Query(store)
    m0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    q.attempt(1, "a", ssts("2"), m0)
    late = q.open()
    assert q.coord.try_complete(1).committed  # type: ignore[union-attr]
    assert late.try_complete(1, committed=False).committed  # type: ignore[union-attr]
    assert read_latest_record(store, OP).committed  # type: ignore[union-attr]
    assert [i.checkpoint_id for i in q.open().list_completed()] == [1]


def test_rebuild_passes_over_a_kept_predecessor_that_lost_its_manifest(
        store: DurableStore) -> None:
    # If the checkpoint an uncommitted latest keeps lost its manifest anyway (another
    # coordinator knew the commit and deleted it), a restarted driver must still start.
    q = Query(store)
    m0 = q.attempt(0, "a", ssts("1"), None)
    q.coord.try_complete(0)
    m1 = q.attempt(1, "a", ssts("2"), m0)
    q.coord.try_complete(1, committed=False)
    store.delete([f"{OP}/{m0.path}"])
    fresh = q.open()
    assert fresh.restore().manifests == {0: m1}
    store.delete([f"{OP}/{m1.path}"])
    # the latest itself missing is corruption, reported by the coordinator and refused by
    # a restore, as before (but the coordinator opens: degraded, not stuck)
    damaged = q.open()
    assert set(damaged.damaged) == {1}
    with pytest.raises(CorruptStateError, match="missing"):
        damaged.restore()


def test_no_step_lists_more_than_bounded_directories(store: DurableStore) -> None:
    counting = CountingStore(store)
    q = Query(store, num_retained=2, parallelism=2)
    q.coord = q.open(counting)
    bases: dict[int, PartitionManifest | None] = {0: None, 1: None}
    for n in range(6):
        for p in range(2):
            bases[p] = q.attempt(n, "a", ssts(f"{n}", p=p), bases[p], p=p)
            if n < 5:  # the latest checkpoint's dead attempts are swept after the next one
                q.attempt(n, "b", ssts(f"{n}", p=p), None, p=p, die_after=1)
        q.coord.try_complete(n)
    q.coord = q.open(counting)
    allowed = ({f"{OP}/chk-{n}" for n in range(6)} | {f"{OP}/chk-{n}/p{p}" for n in range(6)
                                                      for p in range(2)}
               # _metrics/: a rebuild's evidence that no newer checkpoint completed
               # (one listing of at most METRICS_KEPT files)
               | {f"{OP}/_checkpoints", f"{OP}/_pins", f"{OP}/_writers", f"{OP}/_metrics"}
               # _initial/: a staged initial state (one file per partition), deleted by a
               # coordinator's first collection after a completed checkpoint
               | {f"{OP}/_initial"})
    assert set(counting.listed) <= allowed
    assert counting.listed.count(f"{OP}/_initial") <= 2  # once per coordinator opened
    # Each directory is swept a bounded number of times, not once per collection.
    assert max(counting.listed.count(f"{OP}/chk-{n}") for n in range(6)) <= 3
    q.assert_clean()


def test_background_collection(store: DurableStore) -> None:
    q = Query(store, background_gc=True)
    base = None
    for n in range(5):
        base = q.attempt(n, "a", ssts(str(n)), base)
        q.coord.try_complete(n)
    q.coord.wait_for_gc()
    q.assert_clean()
    q.coord.close()


def test_watermark_persists_and_key_group_ranges_cover_everything(store: DurableStore) -> None:
    q = Query(store)
    base = None
    for n in range(3):
        base = q.attempt(n, "a", ssts(str(n)), base)
        q.coord.try_complete(n)
    assert json.loads(store.get_bytes(f"{OP}/_gc/swept.json")) == {"swept_below": 2}
    assert q.open().watermark == 2
    for par in (1, 3, 8):
        ranges = [key_group_range(p, par, MAXP) for p in range(par)]
        assert ranges[0][0] == 0 and ranges[-1][1] == MAXP - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
