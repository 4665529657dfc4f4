"""Unit tests of the keyed state backend: each state type, caches, metadata, TTL, timers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statebackend.errors import OptionsError, SchemaError, SchemaEvolutionError, StateError
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend

K1 = b"\x00\x01user-1"
K2 = b"\x00\x01user-10"  # K1 is a prefix of K2: per-key scans must not mix them
K3 = b"\x00\x07other"


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Env:
    """An instance and a backend over it that can be closed and reopened."""

    def __init__(self, path: Path) -> None:
        self.path = str(path / "db")
        self.clock = Clock()
        self.inst = RocksDBInstance(self.path)
        self.backend = KeyedStateBackend(self.inst, clock=self.clock)

    def reopen(self, **kwargs: Any) -> KeyedStateBackend:
        self.backend.close()
        self.inst.close()
        self.inst = RocksDBInstance(self.path)
        self.backend = KeyedStateBackend(self.inst, clock=self.clock, **kwargs)
        return self.backend

    def raw(self, cf: str) -> dict[bytes, bytes]:
        return dict(self.inst.scan_range(cf, b"", None))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    if not e.backend.closed:
        e.backend.close()
    e.inst.close()


# --- value state -----------------------------------------------------------------------


def test_value_state_lifecycle_and_persistence(env: Env) -> None:
    b = env.backend
    v = b.value_state("count", "count BIGINT, last STRING")
    b.set_current_key(K1)
    assert v.get() is None and not v.exists()
    v.update((1, "a"))
    assert v.get() == (1, "a") and v.exists()
    b.set_current_key(K2)
    assert v.get() is None
    v.update([2, None])
    assert env.raw("count") == {}  # nothing written before flush
    b.flush()
    assert set(env.raw("count")) == {K1, K2}  # the RocksDB key is the grouping key
    b.set_current_key(K1)
    v.clear()
    assert v.get() is None
    b = env.reopen()
    v = b.value_state("count", "count BIGINT, last STRING")
    b.set_current_key(K2)
    assert v.get() == (2, None)
    b.set_current_key(K1)
    assert v.get() is None  # the clear was flushed by close()


def test_no_current_key_is_an_error(env: Env) -> None:
    v = env.backend.value_state("v", "x INT")
    with pytest.raises(StateError, match="set_current_key"):
        v.get()
    with pytest.raises(StateError):
        env.backend.register_timer(5)
    with pytest.raises(StateError, match="2-byte key group"):
        env.backend.set_current_key(b"x")


def test_update_validates_and_names_the_state(env: Env) -> None:
    b = env.backend
    v = b.value_state("count", "count BIGINT")
    b.set_current_key(K1)
    with pytest.raises(SchemaError, match="value state 'count' field 'count'"):
        v.update(("many",))
    with pytest.raises(SchemaError, match="1 field"):
        v.update((1, 2))
    with pytest.raises(SchemaError):
        v.update(None)
    assert v.get() is None  # a refused update writes nothing


def test_get_many_put_many_delete_many(env: Env) -> None:
    b = env.backend
    v = b.value_state("v", "x INT")
    v.put_many([K1, K2, K3], [(1,), (2,), (3,)])
    b.flush()
    v.delete_many([K2])
    v.put_many([K3], [(30,)])
    assert v.get_many([K1, K2, K3, b"\x00\x09none"]) == [(1,), None, (30,), None]
    b.flush()
    b.set_current_key(K3)
    assert v.get() == (30,)
    with pytest.raises(StateError, match="2 keys and 1 values"):
        v.put_many([K1, K2], [(1,)])
    with pytest.raises(SchemaError):
        v.put_many([K1, K2], [(1,), ("bad",)])
    assert v.get_many([K1, K2]) == [(1,), None]  # validated before writing anything


def test_prefetch_fills_the_read_cache(env: Env) -> None:
    b = env.backend
    v = b.value_state("v", "x INT")
    lst = b.list_state("l", "x INT")
    v.put_many([K1, K2], [(1,), (2,)])
    b.set_current_key(K1)
    lst.put([(5,), (6,)])
    b.reopen = None  # type: ignore[attr-defined]
    b = env.reopen()
    v = b.value_state("v", "x INT")
    lst = b.list_state("l", "x INT")
    b.prefetch([K1, K2, K3])
    assert v._clean == {K1: v.codec.encode((1,)), K2: v.codec.encode((2,)), K3: None}
    assert set(lst._clean) == {K1, K2, K3}
    b.set_current_key(K1)
    assert v.get() == (1,) and list(lst.get()) == [(5,), (6,)]


def test_automatic_flush_bounds_the_write_cache(tmp_path: Path) -> None:
    inst = RocksDBInstance(str(tmp_path / "db"))
    b = KeyedStateBackend(inst, max_dirty_entries=10)
    v = b.value_state("v", "x INT")
    for i in range(25):
        b.set_current_key(b"\x00\x00" + bytes([i]))
        v.update((i,))
    assert len(dict(inst.scan_range("v", b"", None))) >= 15  # flushed without being asked
    b.close()
    assert len(dict(inst.scan_range("v", b"", None))) == 25
    inst.close()
    with pytest.raises(OptionsError):
        KeyedStateBackend(inst, timer_service="wheel")


# --- list state ------------------------------------------------------------------------


def test_list_state(env: Env) -> None:
    b = env.backend
    lst = b.list_state("events", "id INT, tag STRING")
    b.set_current_key(K1)
    assert not lst.exists() and list(lst.get()) == []
    lst.appendValue((1, "a"))
    lst.appendList([(2, "é" * 300), (3, None)])
    assert list(lst.get()) == [(1, "a"), (2, "é" * 300), (3, None)]
    b.flush()
    lst.appendValue((4, ""))
    assert [x[0] for x in lst.get()] == [1, 2, 3, 4]
    lst.put([(9, "z")])
    assert list(lst.get()) == [(9, "z")]
    with pytest.raises(StateError, match="empty list"):
        lst.put([])
    with pytest.raises(StateError, match="empty list"):
        lst.appendList([])
    with pytest.raises(SchemaError, match="list state 'events' field 'id'"):
        lst.appendValue(("x", "y"))
    b.set_current_key(K2)
    assert not lst.exists()
    b.set_current_key(K1)
    lst.clear()
    assert not lst.exists()


def test_list_get_is_a_snapshot(env: Env) -> None:
    b = env.backend
    lst = b.list_state("l", "x INT")
    b.set_current_key(K1)
    lst.put([(1,), (2,)])
    it = lst.get()
    lst.appendValue((3,))
    assert list(it) == [(1,), (2,)]


# --- map state -------------------------------------------------------------------------


def test_map_state(env: Env) -> None:
    b = env.backend
    m = b.map_state("m", "k STRING", "n BIGINT, s STRING")
    b.set_current_key(K1)
    assert not m.exists() and list(m.iterator()) == []
    m.updateValue(("a",), (1, "x"))
    m.updateValue(("b",), (2, "y"))
    b.set_current_key(K2)  # K1 is a prefix of K2
    m.updateValue(("a",), (10, "other"))
    b.flush()
    b.set_current_key(K1)
    m.updateValue(("c",), (3, None))  # unflushed: iteration must still see it
    m.removeKey(("b",))  # unflushed delete of a flushed entry
    assert dict(m.iterator()) == {("a",): (1, "x"), ("c",): (3, None)}
    assert sorted(m.keys()) == [("a",), ("c",)]
    assert sorted(m.values()) == [(1, "x"), (3, None)]
    assert m.getValue(("a",)) == (1, "x") and m.getValue(("b",)) is None
    assert m.containsKey(("c",)) and not m.containsKey(("b",))
    m.clear()
    assert not m.exists()
    b.set_current_key(K2)
    assert dict(m.iterator()) == {("a",): (10, "other")}
    b = env.reopen()
    m = b.map_state("m", "k STRING", "n BIGINT, s STRING")
    b.set_current_key(K1)
    assert not m.exists()
    b.set_current_key(K2)
    assert m.getValue(("a",)) == (10, "other")
    with pytest.raises(SchemaError, match="map state 'm' user key field 'k'"):
        m.updateValue((1,), (1, "x"))


def test_map_keys_start_with_the_grouping_key(env: Env) -> None:
    b = env.backend
    m = b.map_state("m", "k INT", "v INT")
    b.set_current_key(K3)
    m.updateValue((7,), (8,))
    b.flush()
    (key,) = env.raw("m")
    assert key.startswith(K3) and key.endswith(len(K3).to_bytes(4, "big"))


# --- reducing and aggregating ----------------------------------------------------------


class MeanAgg:
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + value)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[1] / acc[0]


def test_reducing_and_aggregating(env: Env) -> None:
    b = env.backend
    r = b.reducing_state("max", "m BIGINT", lambda a, x: (max(a[0], x[0]),))
    a = b.aggregating_state("mean", "n BIGINT, total BIGINT", MeanAgg())
    b.set_current_key(K1)
    assert r.get() is None and a.get() is None
    for x in (3, 9, 4):
        r.add((x,))
        a.add(x)
    assert r.get() == (9,) and a.get() == pytest.approx(16 / 3)
    assert a.get_accumulator() == (3, 16)
    b = env.reopen()
    r = b.reducing_state("max", "m BIGINT", lambda a, x: (max(a[0], x[0]),))
    a = b.aggregating_state("mean", "n BIGINT, total BIGINT", MeanAgg())
    b.set_current_key(K1)
    a.add(4)
    assert r.get() == (9,) and a.get() == 5.0
    r.clear()
    assert r.get() is None
    with pytest.raises(StateError, match="create_accumulator"):
        b.aggregating_state("bad", "n INT", object())  # type: ignore[arg-type]


# --- metadata --------------------------------------------------------------------------


def test_redeclaration_rules_and_descriptors(env: Env) -> None:
    b = env.backend
    v = b.value_state("s", "x INT", ttl_ms=100)
    assert b.value_state("s", "x INT", ttl_ms=100) is v
    with pytest.raises(SchemaError, match="already declared as value"):
        b.list_state("s", "x INT")
    with pytest.raises(SchemaError, match="cannot be redeclared"):
        b.value_state("s", "x BIGINT", ttl_ms=100)
    with pytest.raises(StateError, match="reserved"):
        b.value_state("_meta", "x INT")
    b.map_state("m", "k INT", "v STRING")
    b.set_current_key(K1)
    b.register_timer(5)
    b = env.reopen()
    names = [(d.name, d.kind, d.value_schema, d.user_key_schema, d.ttl_ms)
             for d in b.descriptors()]
    assert names == [("m", "map", "v STRING", "k INT", None), ("s", "value", "x INT", None, 100),
                     ("_timers", "timers", None, None, None)]
    with pytest.raises(SchemaEvolutionError, match="narrowing INT to SMALLINT"):
        b.value_state("s", "x SMALLINT", ttl_ms=100)  # checked against the stored metadata
    with pytest.raises(SchemaEvolutionError, match="kind from value to list"):
        b.list_state("s", "x INT")
    b.value_state("s", "x INT", ttl_ms=500)  # changing a TTL is fine (see test_evolution)
    assert [d.ttl_ms for d in env.reopen().descriptors() if d.name == "s"] == [500]


def test_delete_state(env: Env) -> None:
    b = env.backend
    v = b.value_state("v", "x INT")
    b.set_current_key(K1)
    v.update((1,))
    b.flush()
    b.delete_state("v")
    with pytest.raises(StateError, match="deleted"):
        v.get()
    assert "v" not in env.inst.column_family_names()
    v2 = b.value_state("v", "x STRING")  # a deleted name may come back with a new schema
    assert v2.get() is None
    v2.update(("s",))
    b.delete_state("never-declared")  # deleteIfExists
    b = env.reopen()
    assert [d.value_schema for d in b.descriptors()] == ["x STRING"]
    b.delete_state("v")
    b = env.reopen()
    assert b.descriptors() == []


# --- TTL -------------------------------------------------------------------------------


def test_value_ttl_expires_and_update_resets_it(env: Env) -> None:
    b, clock = env.backend, env.clock
    v = b.value_state("v", "x INT", ttl_ms=100)
    b.set_current_key(K1)
    v.update((1,))  # expires at 1100
    clock.now = 1099
    assert v.get() == (1,) and v.exists()
    v.update((2,))  # now expires at 1199
    clock.now = 1150
    assert v.get() == (2,)
    clock.now = 1199
    assert v.get() is None and not v.exists()
    assert v.get_many([K1]) == [None]


def test_list_and_map_elements_expire_one_by_one(env: Env) -> None:
    b, clock = env.backend, env.clock
    lst = b.list_state("l", "x INT", ttl_ms=100)
    m = b.map_state("m", "k INT", "v INT", ttl_ms=100)
    b.set_current_key(K1)
    lst.appendValue((1,))
    m.updateValue((1,), (10,))
    clock.now = 1050
    lst.appendValue((2,))
    m.updateValue((2,), (20,))
    clock.now = 1100
    assert list(lst.get()) == [(2,)]
    assert dict(m.iterator()) == {(2,): (20,)} and m.getValue((1,)) is None
    assert not m.containsKey((1,))
    clock.now = 1150
    assert not lst.exists() and not m.exists()


def test_purge_removes_expired_entries_from_rocksdb(env: Env) -> None:
    b, clock = env.backend, env.clock
    v = b.value_state("v", "x INT", ttl_ms=100)
    lst = b.list_state("l", "x INT", ttl_ms=100)
    m = b.map_state("m", "k INT", "v INT", ttl_ms=100)
    keep = b.value_state("keep", "x INT")
    for k in (K1, K2):
        b.set_current_key(k)
        v.update((1,))
        lst.appendValue((1,))
        m.updateValue((1,), (1,))
        keep.update((1,))
    clock.now = 1050
    b.set_current_key(K1)
    v.update((2,))  # rewritten: its first index entry becomes stale
    lst.appendValue((2,))
    clock.now = 1100
    assert b.purge_expired() == 1 + 2 + 2  # v@K2, both first list elements, both map entries
    b.flush()
    assert set(env.raw("v")) == {K1} and env.raw("m") == {}
    assert set(env.raw("keep")) == {K1, K2}
    b.set_current_key(K1)
    assert list(lst.get()) == [(2,)] and v.get() == (2,)
    clock.now = 2000
    assert b.purge_expired() == 2
    b.flush()
    assert env.raw("v") == {} and env.raw("l") == {} and env.raw("_ttl") == {}


# --- timers ----------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["rocksdb", "heap"])
def test_timers(tmp_path: Path, service: str) -> None:
    inst = RocksDBInstance(str(tmp_path / "db"))
    b = KeyedStateBackend(inst, timer_service=service)
    b.set_current_key(K2)
    b.register_timer(20)
    b.register_timer(10)
    b.register_timer(10)  # idempotent
    b.set_current_key(K1)
    b.register_timer(10)
    b.register_timer(30)
    b.register_timer(-5)
    b.delete_timer(30)
    b.delete_timer(999)  # absent: no-op
    assert list(b.list_timers()) == [-5, 10]
    b.set_current_key(K2)
    assert list(b.list_timers()) == [10, 20]
    fired = []
    for key, ts in b.pop_expired_timers(20):
        fired.append((key, ts))
        b.set_current_key(key)
        assert ts not in b.list_timers()  # deleted before the handler runs
        if (key, ts) == (K1, 10):
            b.set_current_key(K2)
            b.delete_timer(20)  # a pending timer deleted by a handler is skipped
            b.register_timer(15)  # a timer registered by a handler fires on the next call
    assert fired == [(K1, -5), (K1, 10), (K2, 10)]  # time order, ties by key bytes
    assert list(b.pop_expired_timers(20)) == [(K2, 15)]
    b.set_current_key(K3)
    b.register_timer(100)
    b.close()
    inst.close()
    other = "heap" if service == "rocksdb" else "rocksdb"
    inst = RocksDBInstance(str(tmp_path / "db"))
    b = KeyedStateBackend(inst, timer_service=other)  # switching services keeps timers
    b.set_current_key(K3)
    assert list(b.list_timers()) == [100]
    assert list(b.pop_expired_timers(1000)) == [(K3, 100)]
    b.close()
    inst.close()


def test_heap_pop_stopped_early_loses_nothing(tmp_path: Path) -> None:
    inst = RocksDBInstance(str(tmp_path / "db"))
    b = KeyedStateBackend(inst, timer_service="heap")
    for k in (K1, K2, K3):
        b.set_current_key(k)
        b.register_timer(1)
    it = b.pop_expired_timers(5)
    assert next(it) == (K1, 1)
    it.close()
    assert list(b.pop_expired_timers(5)) == [(K2, 1), (K3, 1)]
    b.close()
    inst.close()
