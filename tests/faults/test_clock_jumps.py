"""Clock jumps for TTL and timers, at the :class:`KeyedStateBackend` level with an injected
clock (marker ``faults``).

Processing time comes from Spark's batch timestamp (the driver's clock) or, in a partition
without rows, from the task's wall clock; either can jump. A jump backwards must not bring
back a value that has already expired (whether or not it was purged yet) nor fire a timer
again; a jump forward fires and expires exactly what is due.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend

pytestmark = pytest.mark.faults

K1 = b"\x00\x01user-1"
K2 = b"\x00\x05user-2"


class JumpingClock:
    """A clock the test sets to any value, backwards included."""

    def __init__(self, now: int = 10_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Env:
    def __init__(self, path: Path, service: str = "rocksdb") -> None:
        self.path = str(path / "db")
        self.service = service
        self.clock = JumpingClock()
        self.inst = RocksDBInstance(self.path)
        self.b = KeyedStateBackend(self.inst, timer_service=service, clock=self.clock)

    def reopen(self) -> KeyedStateBackend:
        """Close and reopen, as the next micro-batch's task does after a checkpoint."""
        self.b.close()
        self.inst.close()
        self.inst = RocksDBInstance(self.path)
        self.b = KeyedStateBackend(self.inst, timer_service=self.service, clock=self.clock)
        return self.b


@pytest.fixture(params=["rocksdb", "heap"])
def env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Env]:
    e = Env(tmp_path, request.param)
    yield e
    if not e.b.closed:
        e.b.close()
    e.inst.close()


def _ttl_states(b: KeyedStateBackend):
    return (b.value_state("v", "x INT", ttl_ms=1_000), b.list_state("l", "x INT", ttl_ms=1_000),
            b.map_state("m", "k INT", "x INT", ttl_ms=1_000))


def _visible(b: KeyedStateBackend, key: bytes) -> tuple:
    v, lst, m = _ttl_states(b)
    b.set_current_key(key)
    return v.get(), list(lst.get()), dict(m.iterator())


def test_backward_jump_does_not_resurrect_expired_ttl_state_before_the_purge(env: Env) -> None:
    b, clock = env.b, env.clock
    v, lst, m = _ttl_states(b)
    b.set_current_key(K1)
    v.update((1,))
    lst.appendValue((1,))
    m.updateValue((1,), (1,))  # all expire at 11_000
    clock.now = 12_000  # forward: expired
    assert _visible(b, K1) == (None, [], {})
    clock.now = 10_500  # the clock steps back before any purge ran
    assert _visible(b, K1) == (None, [], {}), "an expired value came back after a clock jump"
    # a write after the jump gets its TTL from processing time as already seen, so it does
    # not expire earlier than a write just before the jump would have
    b.set_current_key(K2)
    v.update((2,))
    clock.now = 12_900
    assert _visible(b, K2)[0] == (2,)
    clock.now = 13_000
    assert _visible(b, K2)[0] is None


def test_backward_jump_across_a_checkpoint_does_not_resurrect(env: Env) -> None:
    b, clock = env.b, env.clock
    v, lst, m = _ttl_states(b)
    for k in (K1, K2):
        b.set_current_key(k)
        v.update((1,))
        lst.appendValue((1,))
        m.updateValue((1,), (1,))
    clock.now = 10_600
    b.set_current_key(K2)
    v.update((2,))  # K2's value now expires at 11_600
    # the end of a batch: purge and flush, then the next task reopens the instance
    clock.now = 11_200
    b.purge_expired()
    b = env.reopen()
    clock.now = 9_000  # the next batch's timestamp is earlier than the last one
    assert _visible(b, K1) == (None, [], {})
    assert _visible(b, K2) == ((2,), [], {})
    clock.now = 11_600  # forward again: what is due expires
    assert _visible(b, K2) == (None, [], {})


def test_timers_never_fire_twice_and_a_forward_jump_fires_what_is_due(env: Env) -> None:
    b, clock = env.b, env.clock
    for key, ts in ((K1, 10_100), (K1, 10_900), (K2, 10_500), (K2, 20_000)):
        b.set_current_key(key)
        b.register_timer(ts)
    assert list(b.pop_expired_timers(10_600)) == [(K1, 10_100), (K2, 10_500)]
    b.purge_expired()
    b = env.reopen()
    # the clock jumps back: nothing fires again, and what fired is gone for good
    clock.now = 9_000
    assert list(b.pop_expired_timers(9_000)) == []
    assert list(b.pop_expired_timers(10_600)) == []
    b.set_current_key(K1)
    assert list(b.list_timers()) == [10_900]
    # a timer registered "in the past" after the backward jump still fires, once
    b.set_current_key(K2)
    b.register_timer(9_500)
    assert list(b.pop_expired_timers(9_600)) == [(K2, 9_500)]
    # a jump far forward fires every due timer, in time order, exactly once
    b = env.reopen()
    assert list(b.pop_expired_timers(50_000)) == [(K1, 10_900), (K2, 20_000)]
    assert list(b.pop_expired_timers(50_000)) == []
    b = env.reopen()
    assert list(b.pop_expired_timers(50_000)) == []
