"""A Hypothesis state machine: the keyed state backend against a plain-dict model.

It drives every state type (value with and without TTL, list and map with TTL, reducing,
aggregating) and timers over a few grouping keys (one a prefix of another), with an
advancing fake clock, TTL purges, random flushes, automatic flushes (a tiny write-cache
bound), state deletion, and close/reopen of the RocksDB instance with either timer service.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend

# Two grouping keys where one is a prefix of the other, in the same key group.
KEYS = [b"\x00\x01a", b"\x00\x01ab", b"\x00\x05a", b"\x00\x7fzz"]
VALUE_TTL, LIST_TTL, MAP_TTL = 50, 30, 40

texts = st.text(alphabet="aé✓\x00 ", max_size=4)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=-5, max_value=5)
values = st.tuples(ints, st.none() | texts)
elements = st.tuples(small)
maybe_key = st.none() | st.sampled_from(KEYS)
user_keys = st.tuples(st.sampled_from(["", "k", "kk", "é"]))


class SumCount:
    """Aggregate: accumulator (count, sum); result is the tuple itself."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + value)

    def get_result(self, acc: tuple[int, int]) -> tuple[int, int]:
        return tuple(acc)  # type: ignore[return-value]


class StateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="state-machine-")
        self.now = 1_000
        # model: expiry None = never expires
        self.plain: dict[bytes, tuple] = {}
        self.vt: dict[bytes, tuple[tuple, int]] = {}
        self.lists: dict[bytes, list[tuple[tuple, int]]] = {}
        self.maps: dict[bytes, dict[tuple, tuple[tuple, int]]] = {}
        self.sums: dict[bytes, int] = {}
        self.aggs: dict[bytes, tuple[int, int]] = {}
        self.timers: dict[bytes, set[int]] = {}
        self.key = KEYS[0]
        self.inst: RocksDBInstance | None = None

    @initialize(service=st.sampled_from(["rocksdb", "heap"]), bound=st.sampled_from([5, 100_000]))
    def open(self, service: str, bound: int) -> None:
        self.bound = bound
        self._open(service)

    def _open(self, service: str) -> None:
        self.inst = RocksDBInstance(self.dir + "/db")
        b = self.b = KeyedStateBackend(self.inst, timer_service=service, clock=lambda: self.now,
                                       max_dirty_entries=self.bound)
        self.v = b.value_state("plain", "n BIGINT, s STRING")
        self.t = b.value_state("vt", "n BIGINT, s STRING", ttl_ms=VALUE_TTL)
        self.lst = b.list_state("events", "x INT", ttl_ms=LIST_TTL)
        self.m = b.map_state("m", "k STRING", "x INT", ttl_ms=MAP_TTL)
        self.r = b.reducing_state("sum", "s BIGINT", lambda a, x: (a[0] + x[0],))
        self.a = b.aggregating_state("agg", "n BIGINT, total BIGINT", SumCount())
        b.set_current_key(self.key)

    def teardown(self) -> None:
        if self.inst is not None:
            if not self.b.closed:
                self.b.close()
            self.inst.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def live(self, exp: int | None) -> bool:
        return exp is None or exp > self.now

    # --- navigation, clock, durability -------------------------------------------------

    @rule(key=st.sampled_from(KEYS))
    def set_key(self, key: bytes) -> None:
        self.key = key
        self.b.set_current_key(key)

    @rule(dt=st.sampled_from([1, VALUE_TTL, LIST_TTL, MAP_TTL]) | st.integers(0, 25))  # hit TTL edges
    def advance_clock(self, dt: int) -> None:
        self.now += dt

    @rule()
    def flush(self) -> None:
        self.b.flush()

    @rule(service=st.sampled_from(["rocksdb", "heap"]))
    def reopen(self, service: str) -> None:
        self.b.close()
        assert self.inst is not None
        self.inst.close()
        self._open(service)

    @rule()
    def purge(self) -> None:
        expected = 0
        for k, (_, exp) in list(self.vt.items()):
            if not self.live(exp):
                expected += 1
                del self.vt[k]
        for k, elems in list(self.lists.items()):
            kept = [e for e in elems if self.live(e[1])]
            expected += len(elems) - len(kept)
            self.lists[k] = kept
        for mk in self.maps.values():
            for uk, (_, exp) in list(mk.items()):
                if not self.live(exp):
                    expected += 1
                    del mk[uk]
        assert self.b.purge_expired() == expected

    # --- value states --------------------------------------------------------------------

    @rule(v=values, key=maybe_key)
    def value_update(self, v: tuple, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.v.update(v)
        self.plain[self.key] = v

    @rule()
    def value_clear(self) -> None:
        self.v.clear()
        self.plain.pop(self.key, None)

    @rule(v=values, key=maybe_key)
    def ttl_update(self, v: tuple, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.t.update(list(v))
        self.vt[self.key] = (v, self.now + VALUE_TTL)

    @rule()
    def ttl_clear(self) -> None:
        self.t.clear()
        self.vt.pop(self.key, None)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4, unique=True), v=values)
    def value_put_many(self, keys: list[bytes], v: tuple) -> None:
        self.v.put_many(keys, [v] * len(keys))
        for k in keys:
            self.plain[k] = v

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4, unique=True))
    def value_delete_many(self, keys: list[bytes]) -> None:
        self.v.delete_many(keys)
        for k in keys:
            self.plain.pop(k, None)

    @rule()
    def prefetch(self) -> None:
        self.b.prefetch(KEYS)

    # --- list state ----------------------------------------------------------------------

    @rule(vs=st.lists(elements, min_size=1, max_size=3))
    def list_put(self, vs: list[tuple]) -> None:
        self.lst.put(vs)
        self.lists[self.key] = [(v, self.now + LIST_TTL) for v in vs]

    @rule(v=elements, key=maybe_key)
    def list_append(self, v: tuple, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.lst.appendValue(v)
        self.lists.setdefault(self.key, []).append((v, self.now + LIST_TTL))

    @rule(vs=st.lists(elements, min_size=1, max_size=3))
    def list_append_list(self, vs: list[tuple]) -> None:
        self.lst.appendList(vs)
        self.lists.setdefault(self.key, []).extend((v, self.now + LIST_TTL) for v in vs)

    @rule()
    def list_clear(self) -> None:
        self.lst.clear()
        self.lists.pop(self.key, None)

    @rule()
    def list_delete_and_redeclare(self) -> None:
        self.b.delete_state("events")
        self.lst = self.b.list_state("events", "x INT", ttl_ms=LIST_TTL)
        self.lists.clear()

    # --- map state -----------------------------------------------------------------------

    @rule(k=user_keys, v=elements, key=maybe_key)
    def map_update(self, k: tuple, v: tuple, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.m.updateValue(k, v)
        self.maps.setdefault(self.key, {})[k] = (v, self.now + MAP_TTL)

    @rule(k=user_keys)
    def map_remove(self, k: tuple) -> None:
        self.m.removeKey(k)
        self.maps.get(self.key, {}).pop(k, None)

    @rule()
    def map_clear(self) -> None:
        self.m.clear()
        self.maps.pop(self.key, None)

    # --- reducing and aggregating --------------------------------------------------------

    @rule(x=small, key=maybe_key)
    def reduce_add(self, x: int, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.r.add((x,))
        self.sums[self.key] = self.sums.get(self.key, 0) + x

    @rule(x=small, key=maybe_key)
    def agg_add(self, x: int, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.a.add(x)
        n, s = self.aggs.get(self.key, (0, 0))
        self.aggs[self.key] = (n + 1, s + x)

    @rule()
    def reduce_clear(self) -> None:
        self.r.clear()
        self.sums.pop(self.key, None)

    # --- timers --------------------------------------------------------------------------

    @rule(ts=st.integers(min_value=990, max_value=1100), key=maybe_key)
    def register_timer(self, ts: int, key: bytes | None = None) -> None:
        if key is not None:
            self.set_key(key)
        self.b.register_timer(ts)
        self.timers.setdefault(self.key, set()).add(ts)

    @rule(ts=st.integers(min_value=990, max_value=1100))
    def delete_timer(self, ts: int) -> None:
        self.b.delete_timer(ts)
        self.timers.get(self.key, set()).discard(ts)

    @precondition(lambda self: any(self.timers.values()))
    @rule(data=st.data())
    def delete_existing_timer(self, data: Any) -> None:
        ts = data.draw(st.sampled_from(sorted(set().union(*self.timers.values()))))
        self.delete_timer(ts)

    @rule(up_to=st.integers(min_value=980, max_value=1200), reregister=st.booleans())
    def pop_timers(self, up_to: int, reregister: bool) -> None:
        expected = sorted((ts, k) for k, tss in self.timers.items() for ts in tss if ts <= up_to)
        got = []
        for key, ts in self.b.pop_expired_timers(up_to):
            got.append((ts, key))
            self.timers[key].discard(ts)
            if reregister:  # a handler registering a due timer: fires on the next call only
                self.b.set_current_key(key)
                self.b.register_timer(ts - 1)
                self.timers[key].add(ts - 1)
        self.b.set_current_key(self.key)
        assert got == expected

    # --- checks --------------------------------------------------------------------------

    @invariant()
    def current_key_matches_model(self) -> None:
        if self.inst is None:
            return
        k = self.key
        assert self.v.get() == self.plain.get(k)
        assert self.v.exists() == (k in self.plain)
        vt = self.vt.get(k)
        assert self.t.get() == (vt[0] if vt and self.live(vt[1]) else None)
        assert list(self.lst.get()) == [v for v, e in self.lists.get(k, []) if self.live(e)]
        live_map = {uk: v for uk, (v, e) in self.maps.get(k, {}).items() if self.live(e)}
        assert dict(self.m.iterator()) == live_map
        assert self.m.exists() == bool(live_map)
        for uk in ["", "k", "é"]:
            assert self.m.getValue((uk,)) == live_map.get((uk,))
        assert self.r.get() == ((self.sums[k],) if k in self.sums else None)
        assert self.a.get() == self.aggs.get(k)
        assert list(self.b.list_timers()) == sorted(self.timers.get(k, ()))

    @invariant()
    def all_keys_match_model(self) -> None:
        if self.inst is None:
            return
        for k in KEYS:  # per-key scans of every key, flushed or not
            self.b.set_current_key(k)
            live_map = {uk: v for uk, (v, e) in self.maps.get(k, {}).items() if self.live(e)}
            assert dict(self.m.iterator()) == live_map
            assert list(self.lst.get()) == [v for v, e in self.lists.get(k, []) if self.live(e)]
            assert list(self.b.list_timers()) == sorted(self.timers.get(k, ()))
        self.b.set_current_key(self.key)
        assert self.v.get_many(KEYS) == [self.plain.get(k) for k in KEYS]
        assert self.t.get_many(KEYS) == [
            self.vt[k][0] if k in self.vt and self.live(self.vt[k][1]) else None for k in KEYS]


StateMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestKeyedStateMachine = StateMachine.TestCase
