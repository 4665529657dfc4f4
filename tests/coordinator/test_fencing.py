"""One writer per state location: writer epochs, takeover, refusal, and two writers that
interleave on every filesystem kind (local, memory, S3 on moto)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from coordsim import FaultStore, all_files

from statebackend.checkpoint import PartitionCheckpointer
from statebackend.checkpoint.fencing import (
    check_owner,
    claim,
    latest_writer,
    list_epochs,
)
from statebackend.coordinator import CheckpointCoordinator
from statebackend.errors import (
    FencingUnsupportedError,
    StateLocationInUseError,
    WriterFencedError,
)
from statebackend.model.manifest import PartitionManifest, StateDescriptor
from statebackend.options import StateBackendOptions
from statebackend.storage import open_store, read_manifest
from statebackend.storage.base import DurableStore

OP = "op"
QUERY = "query-1"
STATES = (StateDescriptor("count", "value", value_schema="c long"),)


@pytest.fixture
def store(store_url: tuple[str, dict[str, Any]]) -> DurableStore:
    url, options = store_url
    return open_store(f"{url.rstrip('/')}/{uuid.uuid4().hex[:8]}", retries=0,
                      storage_options=options)


# --- the epoch protocol ------------------------------------------------------------------


def test_a_restart_takes_over_a_zombie_is_fenced_another_query_is_refused(
        store: DurableStore) -> None:
    ostore = store.child(OP)
    first = claim(ostore, QUERY, "run-a")
    assert first.epoch == 1
    assert claim(ostore, QUERY, "run-a") == first  # its other tasks: the same epoch
    check_owner(ostore, 1)

    second = claim(ostore, QUERY, "run-b")  # a restart of the same query
    assert second.epoch == 2
    with pytest.raises(WriterFencedError, match="epoch 2") as fenced:
        check_owner(ostore, 1)
    assert fenced.value.newer.run_id == "run-b"
    # the zombie's next task (a worker that never claimed) is refused too, and takes nothing
    with pytest.raises(WriterFencedError, match="run-b"):
        claim(ostore, QUERY, "run-a")
    with pytest.raises(StateLocationInUseError, match=QUERY) as refused:
        claim(ostore, "query-2", "run-x")
    assert refused.value.owner.run_id == "run-b"
    assert list_epochs(ostore) == [1, 2]
    assert latest_writer(ostore) == second
    check_owner(ostore, 2)


def test_concurrent_claims_of_one_run_share_an_epoch_and_of_many_runs_take_one_each(
        store: DurableStore) -> None:
    ostore = store.child(OP)
    got: list[int] = []
    errors: list[BaseException] = []

    def take(run: str) -> None:
        try:
            got.append(claim(ostore, QUERY, run).epoch)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=take, args=("run-a",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and set(got) == {1}
    assert list_epochs(ostore) == [1]
    got.clear()
    threads = [threading.Thread(target=take, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each run got an epoch of its own; some may have been fenced by a later one already,
    # which is a correct answer too (they raced, the newest wins)
    assert len(set(got)) == len(got)
    assert all(isinstance(e, WriterFencedError) for e in errors)
    assert len(got) + len(errors) == 4
    assert list_epochs(ostore) == list(range(1, len(got) + 2))


def test_a_store_without_compare_and_set_is_refused_with_the_opt_out_named(
        store: DurableStore) -> None:
    no_cas = FaultStore(store)  # a store that offers no create-if-absent
    with pytest.raises(FencingUnsupportedError, match="fencing=False"):
        claim(no_cas, QUERY, "run-a")


# --- two writers on one location -----------------------------------------------------------


class Writer:
    """One run of the query: its own local dir, its own coordinator bound to its run,
    tasks that take the run's epoch and publish under it."""

    def __init__(self, store: DurableStore, tmp: Path, run: str, query: str = QUERY) -> None:
        self.store, self.run, self.query = store, run, query
        self.local = str(tmp / run)
        self.coord = CheckpointCoordinator(store, OP, 1, 8, num_retained=2)

    def complete(self, n: int):
        """What the listener does when the run's micro-batch ``n`` ends."""
        return self.coord.try_complete(n, run_id=self.run)

    def run_batches(self, ids: range) -> None:
        """Micro-batches ``ids`` with :func:`rows` as input, each completed."""
        for n in ids:
            self.task(n, rows(n))
            assert self.complete(n) is not None

    def task(self, n: int, rows: dict[bytes, bytes]) -> PartitionManifest:
        """Batch ``n`` of the one partition: restore n-1 as completed (or published), put
        ``rows``, checkpoint n."""
        ostore = self.store.child(OP)
        epoch = claim(ostore, self.query, self.run).epoch
        cp = PartitionCheckpointer(self.store, OP, 0,
                                   StateBackendOptions(checkpoint_mode="incremental",
                                                       max_parallelism=8),
                                   self.local, writer_epoch=epoch)
        base = None
        if n > 0:
            from statebackend.storage.manifests import read_completed_record

            rec = read_completed_record(ostore, n - 1)
            assert rec is not None, f"checkpoint {n - 1} not completed"
            base = read_manifest(ostore, rec.manifests[0])
        inst, _ = cp.restore(base)
        try:
            inst.write({"default": rows})
            m, _ = cp.checkpoint(inst, n, f"{self.run}-{uuid.uuid4().hex[:6]}", (0, 7),
                                 STATES)
        finally:
            inst.close()
        return m


def state_of(store: DurableStore, tmp: Path, checkpoint_id: int) -> dict[bytes, bytes]:
    coord = CheckpointCoordinator(store, OP, 1, 8, num_retained=2, fencing=False)
    point = coord.restore(checkpoint_id)
    cp = PartitionCheckpointer(store, OP, 0, StateBackendOptions(max_parallelism=8),
                               str(tmp / f"reader-{uuid.uuid4().hex[:6]}"))
    inst, _ = cp.restore(point.manifests[0])
    try:
        return dict(inst.scan_range("default", b"", None))
    finally:
        inst.close()


def referenced_files_exist(store: DurableStore) -> list[str]:
    """Paths that a retained checkpoint references but the store lacks."""
    coord = CheckpointCoordinator(store, OP, 1, 8, num_retained=2, fencing=False)
    missing = []
    for info in coord.list_completed():
        for m in coord.restore(info.checkpoint_id, verify=False).manifests.values():
            missing += [f.path for f in m.files if store.size(f"{OP}/{f.path}") != f.size]
    return missing


def rows(n: int) -> dict[bytes, bytes]:
    return {b"k%d" % n: b"v%d" % n, b"shared": b"%d" % n}


@pytest.mark.slow
def test_two_writers_interleaving_on_batches_4_to_8_lose_nothing(
        store: DurableStore, tmp_path: Path) -> None:
    a = Writer(store, tmp_path, "run-a")
    a.run_batches(range(4))
    # the same query started again elsewhere, while run a still runs (a zombie driver)
    b = Writer(store, tmp_path, "run-b")
    expected: dict[bytes, bytes] = {}
    for n in range(4):
        expected.update(rows(n))
    for n in range(4, 9):
        # the zombie's task of batch n runs first, then the new run's
        if n == 4:
            a.task(4, rows(4))  # published before run b took over: a valid attempt
        else:
            with pytest.raises(WriterFencedError, match="run-b"):
                a.task(n, rows(n))
        b.task(n, rows(n))
        expected.update(rows(n))
        assert b.complete(n) is not None
        # the zombie's driver sees the micro-batch end too: refused, deletes nothing
        before = all_files(store, OP)
        with pytest.raises(WriterFencedError, match="run-b"):
            a.complete(n)
        # its own retention then, had the completion gone through: after the refusal
        # nothing runs it, and a collection for no run in particular follows run b
        assert all_files(store, OP) >= before
        assert referenced_files_exist(store) == []
    # the new run's attempt of batch 4 won over the zombie's (newest epoch first)
    rec4 = read_manifest(store.child(OP), b.coord.restore(8).record.manifests[0])
    assert rec4.writer_epoch == 2
    assert state_of(store, tmp_path, 8) == expected


@pytest.mark.slow
def test_a_zombie_that_wakes_after_the_new_writer_completed_deletes_nothing(
        store: DurableStore, tmp_path: Path) -> None:
    a = Writer(store, tmp_path, "run-a")
    a.run_batches(range(3))
    b = Writer(store, tmp_path, "run-b")
    b.run_batches(range(3, 7))
    files = all_files(store, OP)
    # run a wakes: its coordinator still believes checkpoint 2 is the latest, and its
    # retention would delete what run b's checkpoints reuse
    for step in (lambda: a.complete(3), lambda: a.task(3, rows(3))):
        with pytest.raises(WriterFencedError, match="epoch 2"):
            step()
    assert all_files(store, OP) == files
    # a collection for no run in particular (its stale registry says checkpoint 2 is the
    # latest) follows run b: it reads the records again before it deletes anything
    a.coord.collect_garbage()
    assert a.coord.latest().checkpoint_id == 6
    assert referenced_files_exist(store) == []
    assert state_of(store, tmp_path, 6) == {k: v for n in range(7) for k, v in rows(n).items()}


def test_an_unbound_coordinator_follows_the_new_writer_and_rebuilds_first(
        store: DurableStore, tmp_path: Path) -> None:
    # a coordinator that acts for no run in particular (a restart's planning, a manual
    # complete()) created before the takeover: it reads the records again, so its
    # retention never counts on a registry the other writer changed
    a = Writer(store, tmp_path, "run-a")
    a.run_batches(range(2))
    planner = CheckpointCoordinator(store, OP, 1, 8, num_retained=1)
    b = Writer(store, tmp_path, "run-b")
    b.run_batches(range(2, 5))
    b.task(5, rows(5))
    assert planner.try_complete(5) is not None
    assert planner.latest().checkpoint_id == 5
    assert referenced_files_exist(store) == []
    assert state_of(store, tmp_path, 5) == {k: v for n in range(6) for k, v in rows(n).items()}


def test_another_query_is_refused_before_it_writes_and_the_owner_runs_on(
        store: DurableStore, tmp_path: Path) -> None:
    a = Writer(store, tmp_path, "run-a")
    a.task(0, rows(0))
    a.complete(0)
    files = all_files(store, OP)
    other = Writer(store, tmp_path, "run-x", query="query-2")
    with pytest.raises(StateLocationInUseError, match="another streaming query"):
        other.task(1, rows(1))
    assert all_files(store, OP) == files
    a.task(1, rows(1))
    assert a.complete(1) is not None


def test_fencing_off_never_claims_checks_or_stamps(store: DurableStore, tmp_path: Path) -> None:
    from statebackend.task.context import OperatorConfig
    from statebackend.task.runner import task_writer

    ostore = store.child(OP)
    config = OperatorConfig(operator_id=OP, checkpoint_location=store.root,
                            storage_options={}, parallelism=1, key=None,  # type: ignore[arg-type]
                            options=StateBackendOptions(fencing=False), run_id="run-z")
    assert task_writer(config, ostore) is None
    assert list_epochs(ostore) == []
    # a coordinator without fencing completes and collects whatever epochs exist
    claim(ostore, QUERY, "run-a")
    claim(ostore, QUERY, "run-b")
    coord = CheckpointCoordinator(store, OP, 1, 8, num_retained=1, fencing=False)
    w = Writer(store, tmp_path, "run-b")
    w.task(0, rows(0))
    assert coord.try_complete(0, run_id="run-a") is not None  # run-a is fenced, unchecked


# --- fencing that survives damage to its own files ----------------------------------------


def three_runs(store: DurableStore, tmp: Path) -> tuple[Writer, Writer, Writer]:
    """Runs a, b, c of one query take epochs 1, 2, 3 and complete two batches each."""
    runs = []
    for i, run in enumerate(("run-a", "run-b", "run-c")):
        w = Writer(store, tmp, run)
        for n in (2 * i, 2 * i + 1):
            w.task(n, rows(n))
            assert w.complete(n) is not None
        runs.append(w)
    return runs[0], runs[1], runs[2]


@pytest.mark.slow
@pytest.mark.parametrize("lost", [[3], [2], [1, 2, 3]], ids=["newest", "middle", "all"])
def test_losing_epoch_files_never_lets_a_fenced_run_win(
        store: DurableStore, tmp_path: Path, lost: list[int]) -> None:
    a, b, c = three_runs(store, tmp_path)
    ostore = store.child(OP)
    # a lifecycle rule, a cleanup script, a partial copy: epoch files are gone
    store.delete([f"{OP}/_writers/epoch-{k:012d}.json" for k in lost])
    files = all_files(store, OP)
    for zombie, epoch in ((a, 1), (b, 2)):
        with pytest.raises(WriterFencedError, match="run-c"):
            claim(ostore, QUERY, zombie.run)  # a new worker of the zombie
        with pytest.raises(WriterFencedError):
            check_owner(ostore, epoch)  # a worker that claimed before
        with pytest.raises(WriterFencedError):
            zombie.task(6, rows(6))
        with pytest.raises(WriterFencedError):
            zombie.complete(6)
        assert all_files(store, OP) == files, "a fenced run changed the location"
    # the owner runs on (writing its own epoch file again when it was lost)
    c.task(6, rows(6))
    assert c.complete(6) is not None
    assert 3 in list_epochs(ostore)
    assert state_of(store, tmp_path, 6) == {k: v for n in range(7) for k, v in rows(n).items()}
    assert referenced_files_exist(store) == []
    # a restart takes an epoch above every one seen, and the zombies stay fenced
    assert claim(ostore, QUERY, "run-d").epoch == 4
    for zombie in (a, b, c):
        with pytest.raises(WriterFencedError, match="run-d"):
            claim(ostore, QUERY, zombie.run)


def test_a_claim_never_reuses_an_epoch_the_records_name(store: DurableStore,
                                                          tmp_path: Path) -> None:
    a = Writer(store, tmp_path, "run-a")
    b = Writer(store, tmp_path, "run-b")
    claim(store.child(OP), QUERY, "run-a")
    b.task(0, rows(0))  # takes epoch 2
    assert b.complete(0).writer_epoch == 2
    store.delete([f"{OP}/_writers/epoch-{k:012d}.json" for k in (1, 2)])
    assert claim(store.child(OP), QUERY, "run-c").epoch == 3
    with pytest.raises(WriterFencedError):
        a.task(1, rows(1))


def test_another_query_is_refused_and_changes_nothing_without_writer_files(
        store: DurableStore, tmp_path: Path) -> None:
    a = Writer(store, tmp_path, "run-a")  # keeps 2
    a.run_batches(range(3))
    a.task(3, rows(3))  # published, its completion still to come
    store.delete([f"{OP}/_writers/epoch-{1:012d}.json"])
    files = all_files(store, OP)
    # the other query's backend: its coordinator keeps 1, and is made before its tasks run
    other = CheckpointCoordinator(store, OP, 1, 8, num_retained=1)
    assert all_files(store, OP) == files  # constructing it deleted nothing of the owner's
    with pytest.raises(StateLocationInUseError, match=QUERY):
        Writer(store, tmp_path, "run-x", query="query-2").task(3, rows(3))
    # its listener completes for its run, whose tasks were refused: nothing happens, not
    # even the carrier's carry-over (it would publish manifests)
    from statebackend.coordinator.pending import complete_pending

    carried: list[int] = []
    assert complete_pending(other, up_to=4, run_id="run-x",
                            carry=lambda coord, n: carried.append(n) or [0]) == []
    assert carried == []
    assert other.try_complete(3, run_id="run-x") is None
    other.collect_garbage()
    assert all_files(store, OP) == files
    # a completion for no run in particular (its planning) is the owner's choice, under
    # the owner's retention, never the other query's smaller one
    assert other.try_complete(3) is not None
    kept = CheckpointCoordinator(store, OP, 1, 8, num_retained=2, fencing=False)
    assert [i.checkpoint_id for i in kept.list_completed()] == [2, 3]
    assert referenced_files_exist(store) == []
    a.task(4, rows(4))
    assert a.complete(4) is not None
    assert state_of(store, tmp_path, 4) == {k: v for n in range(5) for k, v in rows(n).items()}


def contents(store: DurableStore) -> dict[str, bytes]:
    return {p: store.get_bytes(f"{OP}/{p}") for p in sorted(all_files(store, OP))}


def test_another_querys_coordinator_leaves_repairs_to_the_owner(
        store: DurableStore, tmp_path: Path) -> None:
    from statebackend.coordinator.pending import complete_pending
    from statebackend.model.manifest import LATEST_PATH, parse_latest

    a = Writer(store, tmp_path, "run-a")
    a.run_batches(range(3))
    # what a rebuild repairs: a pin whose checkpoint is gone, a damaged LATEST.json
    store.put_bytes_atomic(f"{OP}/_pins/chk-0", b"")
    store.put_bytes_atomic(f"{OP}/{LATEST_PATH}", b"{not json")
    before = contents(store)
    # another query's backend: made while planning (no run yet), its catch-up there, then
    # its listener for its refused run, and a reader's coordinator of the location
    other = CheckpointCoordinator(store, OP, 1, 8, num_retained=1)
    with other.planning():
        assert complete_pending(other) == []
    with pytest.raises(StateLocationInUseError):
        Writer(store, tmp_path, "run-x", query="query-2").task(3, rows(3))
    assert complete_pending(other, up_to=3, run_id="run-x") == []
    assert other.latest().checkpoint_id == 2  # it reads the owner's state all the same
    assert contents(store) == before
    # the owner's next completion writes the pointer again
    a.task(3, rows(3))
    assert a.complete(3) is not None
    assert parse_latest(store.get_bytes(f"{OP}/{LATEST_PATH}")).checkpoint_id == 3
    # a restart of the owner's query: its planning (no run yet) leaves the stale pin too,
    # its first completion deletes it
    restart = Writer(store, tmp_path, "run-b")
    assert store.exists(f"{OP}/_pins/chk-0")
    restart.task(4, rows(4))
    assert restart.complete(4) is not None
    assert not store.exists(f"{OP}/_pins/chk-0")
    assert state_of(store, tmp_path, 4) == {k: v for n in range(5) for k, v in rows(n).items()}


def test_completion_never_chooses_another_querys_manifest(store: DurableStore,
                                                          tmp_path: Path) -> None:
    from statebackend.checkpoint.publish import ManifestFacts

    a = Writer(store, tmp_path, "run-a")
    a.task(0, rows(0))
    a.complete(0)
    # a task of another query that got past the claim (its evidence lost, say) publishes
    # under the owner's epoch an attempt whose name sorts before the owner's
    cp = PartitionCheckpointer(store, OP, 0, StateBackendOptions(
        checkpoint_mode="incremental", max_parallelism=8), str(tmp_path / "x"),
        writer_epoch=1)
    inst, _ = cp.restore(None)
    try:
        inst.write({"default": {b"intruder": b"1"}})
        theirs, _ = cp.checkpoint(inst, 1, "a-intruder", (0, 7), STATES,
                                  facts=ManifestFacts(writer_query="query-2"))
    finally:
        inst.close()
    assert read_manifest(store.child(OP), theirs.path).writer_query == "query-2"
    mine = a.task(1, rows(1))
    assert mine.writer_query is None  # the test's tasks publish without facts
    record = a.complete(1)
    assert record.manifests[0] == mine.path
    assert state_of(store, tmp_path, 1) == {**rows(0), **rows(1)}


def test_credentials_in_the_location_are_redacted_in_refusals(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.chdir(tmp_path)  # file://user:pw@/... roots resolve under the working dir
    for url in ("memory://user:s3cr3t@host/loc", "file://user:s3cr3t@/loc"):
        ostore = open_store(f"{url}-{uuid.uuid4().hex[:6]}").child(OP)
        claim(ostore, QUERY, "run-a")
        claim(ostore, QUERY, "run-b")
        for fn, args in ((claim, ("query-2", "run-x")), (claim, (QUERY, "run-a")),
                         (check_owner, (1,))):
            with pytest.raises((StateLocationInUseError, WriterFencedError)) as exc:
                fn(ostore, *args)
            assert "s3cr3t" not in str(exc.value) and "user:***@" in str(exc.value)
