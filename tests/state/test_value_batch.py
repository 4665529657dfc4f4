"""The batch paths of value state equal the per-row paths byte for byte.

``ValueState.get_many/put_many/delete_many``, the whole-column codec
(:class:`statebackend.keys.columns.FixedColumns`) and ``KeyedColumnState`` (map_in_pandas)
against ``set_current_key`` + ``get/update/clear`` and the row codec: nulls, TTL, and the
write/read caches before and after a flush.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebackend.errors import SchemaError, StateBackendError, StateError
from statebackend.keys.columns import fixed_columns
from statebackend.keys.grouping_key import encode_grouping_key
from statebackend.keys.groups import key_group
from statebackend.keys.ranges import KeyGroupRange
from statebackend.keys.values import compile_codec
from statebackend.model.schema import parse_ddl
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state import KeyedStateBackend
from statebackend.task.vector import STATE_NAME, KeyedColumnState

SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

_RANGES = {"tinyint": (-2**7, 2**7 - 1), "smallint": (-2**15, 2**15 - 1),
           "int": (-2**31, 2**31 - 1), "bigint": (-2**63, 2**63 - 1)}
_NP = {"tinyint": np.int8, "smallint": np.int16, "int": np.int32, "bigint": np.int64,
       "float": np.float32, "double": np.float64, "boolean": bool}
TYPES = list(_NP)


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@contextmanager
def backend(clock: Clock | None = None) -> Iterator[KeyedStateBackend]:
    with tempfile.TemporaryDirectory() as d:
        inst = RocksDBInstance(d + "/db")
        b = KeyedStateBackend(inst, clock=clock or Clock())
        try:
            yield b
        finally:
            b.close()
            inst.close()


def dump(b: KeyedStateBackend) -> dict[str, dict[bytes, bytes]]:
    """Every column family's contents (state values, TTL index, metadata)."""
    inst = b._instance
    return {cf: dict(inst.scan_prefix(cf, b"")) for cf in inst.column_family_names()}


def scalar(t: str) -> st.SearchStrategy:
    if t == "boolean":
        return st.booleans()
    if t == "float":
        return st.floats(width=32)
    if t == "double":
        return st.floats()
    lo, hi = _RANGES[t]
    return st.integers(lo, hi)


@st.composite
def schema_and_rows(draw: st.DrawFn, nulls: bool) -> tuple[str, list[str], list[tuple]]:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=10))
    nullable = [draw(st.booleans()) for _ in types]
    ddl = ", ".join(f"f{i} {t}{'' if nn else ' NOT NULL'}"
                    for i, (t, nn) in enumerate(zip(types, nullable)))
    fields = [scalar(t) if not (nulls and nn) else st.none() | scalar(t)
              for t, nn in zip(types, nullable)]
    rows = draw(st.lists(st.tuples(*fields), max_size=30))
    return ddl, types, rows


def frame_of(rows: list[tuple], types: list[str]) -> pd.DataFrame:
    return pd.DataFrame({f"f{i}": np.array([r[i] for r in rows], dtype=_NP[t])
                         for i, t in enumerate(types)}, columns=[f"f{i}" for i in range(len(types))])


# --- the whole-column codec ---------------------------------------------------------------


@SETTINGS
@given(schema_and_rows(nulls=False))
def test_fixed_encode_equals_row_encode(case: tuple[str, list[str], list[tuple]]) -> None:
    ddl, types, rows = case
    codec = compile_codec(parse_ddl(ddl), "state 's'")
    fixed = fixed_columns(codec.schema)
    assert fixed is not None
    frame = frame_of(rows, types)
    got = fixed.encode([frame[c].to_numpy() for c in frame.columns])
    assert got == [codec.encode(r) for r in frame.itertuples(index=False, name=None)]


@SETTINGS
@given(schema_and_rows(nulls=True), st.data())
def test_fixed_decode_equals_row_decode(case: tuple[str, list[str], list[tuple]],
                                        data: st.DataObject) -> None:
    ddl, _, rows = case
    codec = compile_codec(parse_ddl(ddl), "state 's'")
    fixed = fixed_columns(codec.schema)
    assert fixed is not None
    payloads = [None if data.draw(st.booleans()) else codec.encode(r) for r in rows]
    cols = fixed.decode(payloads)
    assert cols is not None
    for j, p in enumerate(payloads):
        expected = (None,) * len(codec.schema) if p is None else codec.decode(p)
        for (vals, null), e in zip(cols, expected):
            if e is None:
                assert null[j]
            else:
                assert not null[j]
                v = vals[j].item()
                assert v == e or (v != v and e != e)


def test_fixed_columns_only_for_numeric_schemas() -> None:
    assert fixed_columns(parse_ddl("a BIGINT, b DOUBLE, c BOOLEAN")) is not None
    assert fixed_columns(parse_ddl("a BIGINT, s STRING")) is None
    assert fixed_columns(parse_ddl("d DATE")) is None


def test_fixed_encode_refuses_what_the_row_codec_refuses() -> None:
    fixed = fixed_columns(parse_ddl("a INT, f FLOAT"))
    assert fixed is not None
    ok = np.array([1, 2], dtype=np.int64)
    assert fixed.encode([np.array([2**31, 0]), np.array([1.0, 2.0])]) is None  # int overflow
    assert fixed.encode([np.array([1.5, 2.0]), np.array([1.0, 2.0])]) is None  # float for int
    assert fixed.encode([ok, np.array([1e300, 0.0])]) is None  # float32 overflow
    assert fixed.encode([ok, np.array(["x", "y"], dtype=object)]) is None
    assert fixed.encode([ok, np.array([np.inf, np.nan])]) is not None  # inf stays inf


# --- ValueState batch methods vs the per-key ones -----------------------------------------


def keys_of(ids: list[int]) -> list[bytes]:
    return [b"\x00\x03k" + str(i).encode() for i in ids]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["put", "del", "flush", "tick"]),
                          st.lists(st.integers(0, 12), max_size=8),
                          st.integers(-5, 5)), max_size=12),
       st.sampled_from([None, 3]))
def test_value_batch_equals_per_key(ops: list[tuple[str, list[int], int]],
                                    ttl: int | None) -> None:
    ca, cb = Clock(), Clock()
    with backend(ca) as a, backend(cb) as b:
        sa = a.value_state("v", "n BIGINT, s STRING", ttl_ms=ttl)
        sb = b.value_state("v", "n BIGINT, s STRING", ttl_ms=ttl)
        for op, ids, x in ops:
            keys = keys_of(ids)
            if op == "put":
                vals = [(x + i, None if x < 0 else f"s{i}") for i in ids]
                sa.put_many(keys, vals)
                for k, v in zip(keys, vals):
                    b.set_current_key(k)
                    sb.update(v)
            elif op == "del":
                sa.delete_many(keys)
                for k in keys:
                    b.set_current_key(k)
                    sb.clear()
            elif op == "flush":
                a.flush()
                b.flush()
            else:
                ca.now += 2
                cb.now += 2
            every = keys_of(list(range(13)))
            expected = []
            for k in every:
                b.set_current_key(k)
                expected.append(sb.get())
            assert sa.get_many(every) == expected
        a.flush()
        b.flush()
        assert dump(a) == dump(b)


def test_put_many_validates_before_writing() -> None:
    with backend() as b:
        s = b.value_state("v", "n BIGINT NOT NULL")
        with pytest.raises(SchemaError):
            s.put_many(keys_of([1, 2]), [(1,), (None,)])
        assert s.get_many(keys_of([1, 2])) == [None, None]
        with pytest.raises(StateError):
            s.put_many(keys_of([1]), [(1,), (2,)])


def test_batch_methods_refuse_a_deleted_state() -> None:
    with backend() as b:
        s = b.value_state("v", "n BIGINT")
        b.delete_state("v")
        with pytest.raises(StateError):
            s.put_many(keys_of([1]), [(1,)])
        with pytest.raises(StateError):
            s.delete_many(keys_of([1]))


# --- KeyedColumnState: fast column paths vs the row paths -----------------------------------


def encoded_keys(ids: np.ndarray) -> list[bytes]:
    return [encode_grouping_key((int(i),), ["bigint"], key_group([int(i)], ["bigint"], 128))
            for i in ids]


@SETTINGS
@given(schema_and_rows(nulls=True), st.data())
def test_column_state_equals_row_paths(case: tuple[str, list[str], list[tuple]],
                                       data: st.DataObject) -> None:
    ddl, types, rows = case
    ids = np.arange(len(rows), dtype=np.int64)
    with backend() as a, backend() as b:
        ca = KeyedColumnState(a, ["k"], ["bigint"], ddl, 128)
        cb = KeyedColumnState(b, ["k"], ["bigint"], ddl, 128)
        full = [r for r in rows if None not in r]
        fids = pd.Series(ids[:len(full)], name="k")
        ca.put(fids, frame_of(full, types))            # the whole-column path
        cb.put(fids, [tuple(r) for r in full])          # the row path
        rest = pd.Series(ids[len(full):], name="k")
        ca.put(rest, [tuple(r) for r in rows[len(full):]])  # nulls: the row path
        cb.put(rest, [tuple(r) for r in rows[len(full):]])
        if data.draw(st.booleans()):
            a.flush()
            b.flush()
        a.flush()
        b.flush()
        assert dump(a) == dump(b)
        probe = pd.Series(np.concatenate([ids, ids + 1000]), name="k")
        got = ca.get(probe)
        stored = b.value_state(STATE_NAME, ddl).get_many(encoded_keys(probe.to_numpy()))
        expected = pd.DataFrame.from_records(
            [v if v is not None else (None,) * len(types) for v in stored],
            columns=ca.value_columns)
        pd.testing.assert_frame_equal(got, expected)
        assert ca.exists(probe).tolist() == [v is not None for v in stored]


def test_column_state_put_refuses_bad_columns() -> None:
    with backend() as b:
        c = KeyedColumnState(b, ["k"], ["bigint"], "c INT", 128)
        keys = pd.Series([1, 2], name="k")
        with pytest.raises(SchemaError):
            c.put(keys, pd.DataFrame({"c": [1.5, 2.0]}))
        with pytest.raises(SchemaError):
            c.put(keys, pd.DataFrame({"c": [2**40, 1]}))
        c.put(keys, pd.Series([7, 8]))
        assert c.get(keys)["c"].tolist() == [7, 8]
        c.delete(pd.Series([1], name="k"))
        assert c.get(keys)["c"].isna().tolist() == [True, False]


def test_column_state_refuses_keys_of_other_key_groups() -> None:
    ids = np.arange(200, dtype=np.int64)
    kgs = np.array([key_group([int(i)], ["bigint"], 128) for i in ids])
    with backend() as b:
        c = KeyedColumnState(b, ["k"], ["bigint"], "c BIGINT", 128, KeyGroupRange(0, 63))
        mine = pd.Series(ids[kgs <= 63], name="k")
        c.put(mine, pd.Series(np.ones(len(mine), dtype=np.int64)))
        assert c.get(mine)["c"].tolist() == [1] * len(mine)
        for op in (lambda k: c.get(k), lambda k: c.put(k, pd.Series(np.zeros(len(k), np.int64))),
                   c.delete, c.exists):
            with pytest.raises(StateBackendError, match="another partition"):
                op(pd.Series(ids, name="k"))  # some of them belong to key groups 64..127
        b.flush()
        assert len(dump(b)[STATE_NAME]) == len(mine)  # the refused calls wrote nothing
