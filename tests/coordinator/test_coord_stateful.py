"""A Hypothesis state machine that tries to make the coordinator lose or leak a file.

Random sequences of checkpoints with SST churn (new files, compactions replacing files),
concurrent attempts of one checkpoint (including tasks of checkpoint n+1 that restored
from a non-chosen attempt of n), attempts that die before publishing, late attempts of a
completed checkpoint, aborted checkpoints, pins, crashes at every mutating step of
completion, garbage collection and rebuild, and driver restarts, all against a plain
model. After every step:

- the retained checkpoints are the model's (the newest ``num_retained`` plus pins);
- restoring any retained checkpoint of any partition gives the model's state: the chosen
  manifest is the model's choice, lists exactly the model's files, and every file exists
  with the model's content (so nothing referenced was ever deleted);

and after every garbage collection that ran to the end, no file is left that neither a
retained checkpoint nor a checkpoint in flight can reference. ``settle`` finally drives
the query to a quiet state and checks that nothing unreferenced is left at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
from coordsim import OP, FaultStore, SimulatedCrash, all_files, content, private_files, run_attempt
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from statebackend.coordinator import CheckpointCoordinator, referenced_paths
from statebackend.model.manifest import MANIFEST_NAME, PartitionManifest, completed_record_path
from statebackend.storage.base import DurableStore

P = 2
MAXP = 8

_churn_op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 200)),
    st.tuples(st.just("compact"), st.integers(2, 3), st.integers(1, 300)),
)
_attempt_name = st.text(alphabet="abcdefgh", min_size=1, max_size=3)


class CoordinatorMachine(RuleBasedStateMachine):
    make_store: Callable[[], DurableStore]

    def __init__(self) -> None:
        super().__init__()
        self.raw = type(self).make_store()
        self.num_retained = 1
        self.coord: CheckpointCoordinator | None = None
        self.ssts: dict[int, list[dict[str, bytes]]] = {}  # logical SSTs per checkpoint
        self.in_flight: list[int] = []
        self.published: dict[tuple[int, int], list[PartitionManifest]] = {}
        self.completed: dict[int, dict[int, PartitionManifest]] = {}
        self.pins: set[int] = set()
        self.uncommitted: set[int] = set()  # completed before Spark's commit was known
        self.used_attempts: set[tuple[int, int, str]] = set()
        self.next_id = 0
        self.counter = 0

    # --- plumbing -----------------------------------------------------------------------

    def open(self, crash_after: int | None = None) -> CheckpointCoordinator:
        self.fault = FaultStore(self.raw, crash_after)
        return CheckpointCoordinator(self.fault, OP, P, MAXP, self.num_retained)

    def restart(self) -> None:
        self.coord = self.open()

    def crash_in(self, k: int, action: Callable[[CheckpointCoordinator], Any]) -> None:
        assert self.coord is not None
        self.fault.crash_after = self.fault.ops + k
        try:
            action(self.coord)
        except SimulatedCrash:
            pass
        self.restart()  # the driver comes back and rebuilds

    def expected(self, n: int, p: int) -> dict[str, bytes]:
        return {**self.ssts[n][p], **private_files(n, p, self.ssts[n][p])}

    def model_retained(self) -> list[int]:
        done = sorted(self.completed)
        keep = self.num_retained
        if done and done[-1] in self.uncommitted:  # Spark may run it again from its base
            keep = max(keep, 2)
        return sorted(set(done[-keep:]) | (self.pins & set(done)))

    def base_for(self, n: int, p: int, data: st.DataObject) -> tuple[bool, PartitionManifest | None]:
        """The manifest a task of checkpoint ``n`` restores from: (possible, base)."""
        if n - 1 not in self.ssts:
            return True, None
        if n - 1 in self.completed:
            return True, self.completed[n - 1][p]
        candidates = self.published.get((n - 1, p), [])
        if not candidates:
            return False, None
        # Before the record of n-1 exists a task may restore from any published attempt.
        return True, data.draw(st.sampled_from(candidates), label="base")

    def new_attempt_name(self, n: int, p: int, data: st.DataObject) -> str:
        name = data.draw(_attempt_name.filter(lambda a: (n, p, a) not in self.used_attempts),
                         label="attempt")
        self.used_attempts.add((n, p, name))
        return name

    def publish(self, n: int, p: int, data: st.DataObject, die_after: int | None = None) -> None:
        ok, base = self.base_for(n, p, data)
        if not ok:
            return
        if data.draw(st.integers(0, 4), label="full upload") == 0:
            base = None  # an attempt that reuses nothing (e.g. it could not match any SST)
        name = self.new_attempt_name(n, p, data)
        m = run_attempt(self.raw, n, p, name, self.ssts[n][p], base, parallelism=P,
                        max_parallelism=MAXP, die_after=die_after)
        if m is not None:
            self.published.setdefault((n, p), []).append(m)

    def expect_complete(self, n: int) -> dict[int, PartitionManifest] | None:
        chosen = {}
        for p in range(P):
            cands = self.published.get((n, p), [])
            if not cands:
                return None
            chosen[p] = min(cands, key=lambda m: m.attempt)
        return chosen

    def apply_completion(self, n: int, chosen: dict[int, PartitionManifest]) -> None:
        self.completed[n] = chosen
        self.in_flight.remove(n)

    # --- rules --------------------------------------------------------------------------

    @initialize(num_retained=st.integers(1, 3))
    def setup(self, num_retained: int) -> None:
        self.num_retained = num_retained
        self.restart()

    @precondition(lambda self: len(self.in_flight) < 3 and all(
        self.expect_complete(n) is not None for n in self.in_flight))
    @rule(churn=st.lists(st.lists(_churn_op, max_size=3), min_size=P, max_size=P))
    def begin(self, churn: list[list[tuple[Any, ...]]]) -> None:
        """Start checkpoint m once the previous batch ended; completions may lag behind."""
        m = self.next_id
        self.next_id += 1
        prev = self.ssts.get(m - 1, [{} for _ in range(P)])
        new = []
        for p, ops in enumerate(churn):
            state = dict(prev[p])
            for op in ops:
                self.counter += 1
                name = f"{self.counter:06d}.sst"
                if op[0] == "compact":
                    for old in sorted(state)[:op[1]]:
                        del state[old]
                state[name] = content(p, name, op[-1])
            new.append(state)
        self.ssts[m] = new
        self.in_flight.append(m)

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), die_after=st.none() | st.integers(0, 3))
    def attempt(self, data: st.DataObject, die_after: int | None) -> None:
        n = data.draw(st.sampled_from(self.in_flight), label="checkpoint")
        p = data.draw(st.integers(0, P - 1), label="partition")
        self.publish(n, p, data, die_after)

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def batch_end(self, data: st.DataObject) -> None:
        """Every partition of a checkpoint in flight publishes, often more than once."""
        n = data.draw(st.sampled_from(self.in_flight), label="checkpoint")
        for p in range(P):
            low = 0 if self.published.get((n, p)) else 1
            for _ in range(data.draw(st.integers(low, 3), label="attempts")):
                self.publish(n, p, data)

    @precondition(lambda self: bool(self.completed))
    @rule(data=st.data())
    def straggler(self, data: st.DataObject) -> None:
        """A late (speculative) attempt of the latest completed checkpoint publishes."""
        latest = max(self.completed)
        p = data.draw(st.integers(0, P - 1), label="partition")
        base = self.completed.get(latest - 1, {}).get(p)
        if latest - 1 not in self.model_retained():
            base = None
        name = self.new_attempt_name(latest, p, data)
        run_attempt(self.raw, latest, p, name, self.ssts[latest][p], base, parallelism=P,
                    max_parallelism=MAXP)

    @precondition(lambda self: bool(self.in_flight))
    @rule(committed=st.booleans())
    def complete(self, committed: bool) -> None:
        assert self.coord is not None
        n = self.in_flight[0]
        chosen = self.expect_complete(n)
        rec = self.coord.try_complete(n, committed=committed)
        if chosen is None:
            assert rec is None
            return
        assert rec is not None and rec.committed == committed
        assert dict(rec.manifests) == {p: m.path for p, m in chosen.items()}
        self.apply_completion(n, chosen)
        if not committed:
            self.uncommitted.add(n)

    @precondition(lambda self: bool(self.uncommitted))
    @rule()
    def spark_commits(self) -> None:
        """The progress event of the latest uncommitted checkpoint's micro-batch."""
        assert self.coord is not None
        n = max(self.completed)
        assert self.coord.try_complete(n).committed  # type: ignore[union-attr]
        self.uncommitted.discard(n)

    @precondition(lambda self: bool(self.in_flight))
    @rule(k=st.integers(0, 12))
    def complete_and_crash(self, k: int) -> None:
        n = self.in_flight[0]
        chosen = self.expect_complete(n)
        self.crash_in(k, lambda c: c.try_complete(n))
        # The record is the commit point: the checkpoint is complete iff it was written.
        if self.raw.exists(f"{OP}/{completed_record_path(n)}"):
            assert chosen is not None
            self.apply_completion(n, chosen)

    @rule(k=st.integers(0, 12))
    def collect_and_crash(self, k: int) -> None:
        self.crash_in(k, lambda c: c.collect_garbage())

    @rule(k=st.integers(0, 8))
    def restart_and_crash(self, k: int) -> None:
        """The driver dies while rebuilding (its collection of leftovers), then again."""
        try:
            self.open(crash_after=k)
        except SimulatedCrash:
            pass
        self.restart()

    @rule()
    def restart_driver(self) -> None:
        self.restart()

    @precondition(lambda self: bool(self.in_flight))
    @rule()
    def abort(self) -> None:
        """The query failed: every checkpoint in flight is aborted, then re-run."""
        assert self.coord is not None
        for n in reversed(self.in_flight):
            self.coord.abort(n)
            for p in range(P):
                self.published.pop((n, p), None)

    @precondition(lambda self: bool(self.completed))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        assert self.coord is not None
        n = data.draw(st.sampled_from(self.model_retained()), label="pin")
        self.coord.pin(n)
        self.pins.add(n)

    @precondition(lambda self: bool(self.pins))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        assert self.coord is not None
        n = data.draw(st.sampled_from(sorted(self.pins)), label="unpin")
        self.coord.unpin(n)
        self.pins.discard(n)

    @rule()
    def collect(self) -> None:
        assert self.coord is not None
        self.coord.collect_garbage()
        if self.completed:
            self.check_nothing_leaked()

    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """Finish what is in flight, run one clean checkpoint, and expect no garbage."""
        assert self.coord is not None
        for n in list(self.in_flight):
            for p in range(P):
                if not self.published.get((n, p)):
                    self.publish(n, p, data)
            chosen = self.expect_complete(n)
            assert chosen is not None
            assert self.coord.try_complete(n) is not None
            self.apply_completion(n, chosen)
        self.begin([[] for _ in range(P)])
        n = self.in_flight[0]
        for p in range(P):
            self.publish(n, p, data)
        chosen = self.expect_complete(n)
        assert chosen is not None and self.coord.try_complete(n) is not None
        self.apply_completion(n, chosen)
        self.coord.collect_garbage()
        self.check_nothing_leaked()
        retained = self.model_retained()
        refs = set().union(*(referenced_paths(self.completed[r].values()) for r in retained))
        meta = ({completed_record_path(r) for r in retained} | {f"_pins/chk-{r}" for r in self.pins}
                | {"_gc/swept.json"})
        assert all_files(self.raw) - {"_checkpoints/LATEST.json"} == refs | meta

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def retained_checkpoints_restore_to_the_model(self) -> None:
        if self.coord is None:
            return
        retained = self.model_retained()
        assert [i.checkpoint_id for i in self.coord.list_completed()] == retained
        latest = self.coord.latest()
        assert (latest.checkpoint_id if latest else None) == (max(self.completed)
                                                               if self.completed else None)
        for n in retained:
            rp = self.coord.restore(n, verify=False)
            for p in range(P):
                m = rp.manifests[p]
                assert m == self.completed[n][p]
                want = self.expected(n, p)
                assert {f.name for f in m.files} == set(want)
                for f in m.files:
                    assert self.raw.get_bytes(f"{OP}/{f.path}") == want[f.name], f.path

    def check_nothing_leaked(self) -> None:
        """After a full collection: every file is referenced, or an in-flight one may be."""
        latest = max(self.completed)
        retained = self.model_retained()
        refs = set().union(*(referenced_paths(self.completed[r].values()) for r in retained))
        files = all_files(self.raw)
        # What a task restoring from any attempt of the latest checkpoint may reuse.
        latest_manifests = [PartitionManifest.from_json(self.raw.get_bytes(f"{OP}/{f}"))
                            for f in files if f.startswith(f"chk-{latest}/")
                            and f.endswith("/" + MANIFEST_NAME)]
        protected = referenced_paths(latest_manifests)
        allowed = (refs | protected | {"_gc/swept.json", "_checkpoints/LATEST.json"}
                   | {f"_pins/chk-{r}" for r in self.pins})
        for n in self.completed:
            if not self.raw.exists(f"{OP}/{completed_record_path(n)}"):
                continue
            allowed.add(completed_record_path(n))
            if n not in retained:
                # A subsumed record stays only while a file of it is protected.
                paths = referenced_paths(self.completed[n].values())
                assert paths & (protected - refs), f"subsumed checkpoint {n} kept for nothing"
                allowed |= {m.path for m in self.completed[n].values()}
        for f in files:
            if f.startswith("chk-") and int(f.split("/")[0][4:]) >= latest:
                continue  # the latest checkpoint's attempts, or in flight
            assert f in allowed, f"{f} is referenced by nothing"


def _run(new_store: Callable[[], DurableStore], examples: int, steps: int) -> None:
    machine = type("Machine", (CoordinatorMachine,), {"make_store": staticmethod(new_store)})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_coordinator_state_machine(new_store: Callable[[], DurableStore],
                                   store_url: tuple[str, dict[str, Any]],
                                   request: pytest.FixtureRequest) -> None:
    # S3 round trips on a moto server cost milliseconds each: fewer, shorter runs there.
    kind = request.node.callspec.params["store_url"]
    examples, steps = {"memory": (25, 40), "local": (40, 40), "s3": (4, 20)}[kind]
    _run(new_store, examples, steps)
