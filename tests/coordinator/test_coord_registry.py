"""The pure shared-state registry: retention, pins, references, and derivability."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from statebackend.coordinator import RegisteredCheckpoint, Retention, SharedStateRegistry
from statebackend.errors import CheckpointNotFoundError
from statebackend.model.manifest import CompletedCheckpoint


def cp(n: int, *paths: str, committed: bool = True) -> RegisteredCheckpoint:
    rec = CompletedCheckpoint("op", n, 1, 8, {0: f"chk-{n}/p0/a/_MANIFEST.json"},
                              committed=committed)
    return RegisteredCheckpoint(rec, frozenset(paths) | {f"chk-{n}/p0/a/_MANIFEST.json"})


def test_retention_and_reference_sets() -> None:
    reg = SharedStateRegistry(2)
    reg = reg.register(cp(0, "a", "b")).register(cp(1, "b", "c"))
    assert reg.retained_ids() == [0, 1] and reg.subsumed_ids() == []
    assert reg.refs["b"] == {0, 1}
    reg = reg.register(cp(2, "c", "d"))
    assert reg.retained_ids() == [1, 2] and reg.subsumed_ids() == [0]
    assert reg.retention(0) is Retention.SUBSUMED and reg.latest_id == 2
    assert "a" not in reg.refs and reg.refs["b"] == {1} and reg.refs["c"] == {1, 2}
    assert reg.unreferenced_paths(0) == {"a", "chk-0/p0/a/_MANIFEST.json"}
    assert reg.register(cp(2, "c", "d")) is reg  # registering twice counts once
    with pytest.raises(ValueError):
        reg.register(cp(2, "x"))
    with pytest.raises(ValueError):
        reg.forget(1)
    assert 0 not in reg.forget(0).checkpoints


def test_pins_keep_checkpoints_and_subsumed_ones_cannot_be_pinned() -> None:
    reg = SharedStateRegistry(1).register(cp(0, "a")).pin(0).register(cp(1, "b"))
    assert reg.retained_ids() == [0, 1] and reg.refs["a"] == {0}
    with pytest.raises(CheckpointNotFoundError):
        reg.unpin(0).pin(0)
    reg = reg.unpin(0)
    assert reg.subsumed_ids() == [0] and "a" not in reg.refs
    with pytest.raises(CheckpointNotFoundError):
        reg.pin(5)
    with pytest.raises(ValueError):
        SharedStateRegistry(0)


def test_an_uncommitted_latest_keeps_the_checkpoint_before_it() -> None:
    # Spark runs a micro-batch it did not commit again from the state before it: with
    # num_retained=1 that state must outlive the completion of the batch it preceded.
    reg = SharedStateRegistry(1).register(cp(0, "a")).register(cp(2, "b", committed=False))
    assert reg.retained_ids() == [0, 2] and reg.refs["a"] == {0}
    committed = reg.mark_committed(2)
    assert committed.retained_ids() == [2] and committed.subsumed_ids() == [0]
    assert committed.checkpoints[2].record.committed and "a" not in committed.refs
    assert committed.mark_committed(2) is committed
    # a newer checkpoint subsumes it whether or not it is committed itself
    assert reg.register(cp(3, "c", committed=False)).retained_ids() == [2, 3]
    assert reg.register(cp(3, "c")).retained_ids() == [3]
    assert SharedStateRegistry(3).register(cp(0, "a")).register(
        cp(1, "b", committed=False)).retained_ids() == [0, 1]  # nothing extra with 3


_ops = st.lists(st.one_of(
    st.tuples(st.just("register"), st.sets(st.sampled_from("abcdefgh"), max_size=4)),
    st.tuples(st.just("register_uncommitted"),
              st.sets(st.sampled_from("abcdefgh"), max_size=4)),
    st.tuples(st.just("commit"), st.integers(0, 20)),
    st.tuples(st.just("pin"), st.integers(0, 20)),
    st.tuples(st.just("unpin"), st.integers(0, 20)),
    st.tuples(st.just("forget"), st.integers(0, 20)),
), max_size=30)


@given(num_retained=st.integers(1, 3), ops=_ops)
def test_registry_is_derivable_from_its_checkpoints_and_pins(num_retained: int,
                                                             ops: list[tuple]) -> None:
    reg = SharedStateRegistry(num_retained)
    n = 0
    subsumed: set[int] = set()
    for op, arg in ops:
        if op.startswith("register"):
            reg = reg.register(cp(n, *arg, committed=op == "register"))
            n += 1
        elif op == "commit" and arg in reg.checkpoints:
            reg = reg.mark_committed(arg)
        elif op == "pin" and arg in reg.retained_ids():
            reg = reg.pin(arg)
        elif op == "unpin":
            reg = reg.unpin(arg)
        elif op == "forget" and arg in reg.subsumed_ids():
            reg = reg.forget(arg)
        # Invariants of every reachable value.
        newest = sorted(reg.checkpoints)[-num_retained:]
        assert set(newest) <= set(reg.retained_ids())
        if reg.checkpoints and not reg.checkpoints[max(reg.checkpoints)].record.committed:
            assert sorted(reg.checkpoints)[-2:] == reg.retained_ids()[-2:]
        assert not subsumed & set(reg.retained_ids())  # a subsumed checkpoint never returns
        subsumed |= set(reg.subsumed_ids())
        assert reg.latest_id == (max(reg.checkpoints) if reg.checkpoints else None)
        want: dict[str, set[int]] = {}
        for c in reg.retained_ids():
            for p in reg.checkpoints[c].paths:
                want.setdefault(p, set()).add(c)
        assert {p: set(s) for p, s in reg.refs.items()} == want
        assert SharedStateRegistry.rebuild(num_retained, reg.checkpoints.values(),
                                           reg.pins) == reg
