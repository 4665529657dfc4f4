"""The RocksDB key layout: round trips, prefix-freeness, key-group bounds, corrupt input."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from statebackend.errors import CorruptStateError, OptionsError, SchemaError
from statebackend.keys.grouping_key import (
    KEY_GROUP_PREFIX_LEN,
    decode_grouping_key,
    encode_grouping_key,
    encode_grouping_keys,
    encode_keys_with_groups,
    key_group_bounds,
    key_group_of,
    key_group_prefix,
)
from statebackend.keys.groups import key_groups
from statebackend.keys.ranges import MAX_MAX_PARALLELISM, KeyGroupRange

# Values as PySpark hands them to a processor, per type (timestamps as naive datetimes).
VALUES = {
    "string": st.text(),
    "binary": st.binary(),
    "int": st.integers(-2**31, 2**31 - 1),
    "bigint": st.integers(-2**63, 2**63 - 1),
    "smallint": st.integers(-2**15, 2**15 - 1),
    "tinyint": st.integers(-128, 127),
    "boolean": st.booleans(),
    "date": st.dates(),
    "timestamp_ntz": st.datetimes(),
    "timestamp": st.datetimes(min_value=dt.datetime(1900, 1, 1),
                              max_value=dt.datetime(2200, 1, 1)),
    "float": st.floats(width=32),
    "double": st.floats(),
}
TYPES = sorted(VALUES)


@st.composite
def typed_keys(draw: st.DrawFn, types: list[str] | None = None) -> tuple[list[str], tuple]:
    if types is None:
        types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4))
    values = tuple(draw(st.one_of(st.none(), VALUES[t])) for t in types)
    return types, values


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b  # -0.0 decodes as 0.0, which compares equal
    return a == b and type(a) is type(b)


def _local_roundtrip_ok(t: str, v: object) -> bool:
    # A naive local time that does not exist (DST gap) cannot round-trip, as in PySpark.
    if t != "timestamp" or v is None:
        return True
    assert isinstance(v, dt.datetime)
    back = dt.datetime.fromtimestamp(int(__import__("time").mktime(v.timetuple())))
    return back.replace(microsecond=v.microsecond) == v


@settings(max_examples=200, deadline=None)
@given(typed_keys(), st.integers(0, MAX_MAX_PARALLELISM - 1), st.binary(max_size=8))
def test_round_trip(key: tuple[list[str], tuple], kg: int, tail: bytes) -> None:
    types, values = key
    assume(all(_local_roundtrip_ok(t, v) for t, v in zip(types, values)))
    data = encode_grouping_key(values, types, kg)
    assert data[:KEY_GROUP_PREFIX_LEN] == key_group_prefix(kg) == kg.to_bytes(2, "big")
    assert key_group_of(data) == kg
    got_kg, got, consumed = decode_grouping_key(data + tail, types)
    assert got_kg == kg and consumed == len(data)
    assert all(_same(v, g) for v, g in zip(values, got)), (values, got)
    # Deterministic: re-encoding the decoded key gives the same bytes.
    assert encode_grouping_key(got, types, kg) == data


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3).flatmap(
    lambda ts: st.tuples(typed_keys(ts), typed_keys(ts))))
def test_prefix_free(pair: tuple) -> None:
    (types, a), (_, b) = pair
    ea, eb = encode_grouping_key(a, types, 3), encode_grouping_key(b, types, 3)
    if ea != eb:
        assert not eb.startswith(ea) and not ea.startswith(eb)
        # Decoding a key followed by another key's bytes stops at the right place.
        assert decode_grouping_key(ea + eb[2:], types)[2] == len(ea)


def test_equal_keys_under_spark_grouping_encode_equal() -> None:
    assert encode_grouping_key((-0.0,), ["double"], 0) == encode_grouping_key((0.0,), ["double"], 0)
    nan2 = np.frombuffer(np.array([0x7FF8000000000001], np.uint64).tobytes(), np.float64)[0]
    assert (encode_grouping_key((nan2,), ["double"], 0)
            == encode_grouping_key((float("nan"),), ["double"], 0))
    assert encode_grouping_key((1,), ["bigint"], 0) == encode_grouping_key((np.int64(1),),
                                                                          ["bigint"], 0)


def test_compact_layout() -> None:
    assert encode_grouping_key(("a",), ["string"], 1) == b"\x00\x01\x02a"
    assert encode_grouping_key((None,), ["string"], 1) == b"\x00\x01\x00"
    assert encode_grouping_key(("",), ["string"], 1) == b"\x00\x01\x01"
    assert encode_grouping_key((0, -1, 63, -64), ["int"] * 4, 0) == b"\x00\x00\x01\x02\x7f\x80\x01"
    assert len(encode_grouping_key((-2**63,), ["bigint"], 0)) == 2 + 10
    assert len(encode_grouping_key((2**63 - 1,), ["bigint"], 0)) == 2 + 10
    assert encode_grouping_key((True, False), ["boolean"] * 2, 0) == b"\x00\x00\x03\x01"
    assert encode_grouping_key((1.0,), ["float"], 0) == b"\x00\x00\x01\x3f\x80\x00\x00"
    assert encode_grouping_key((dt.date(1970, 1, 2),), ["date"], 0) == b"\x00\x00\x03"


def test_decoded_python_types() -> None:
    types = ["string", "binary", "bigint", "boolean", "date", "timestamp_ntz", "float"]
    values = ("k", b"\x01", 5, True, dt.date(2020, 5, 17), dt.datetime(2020, 5, 17, 1, 2, 3, 4),
              0.5)
    _, got, _ = decode_grouping_key(encode_grouping_key(values, types, 9), types)
    assert got == values
    assert [type(v) for v in got] == [str, bytes, int, bool, dt.date, dt.datetime, float]


@pytest.mark.parametrize("data, types", [
    (b"", ["int"]),
    (b"\x00", ["int"]),
    (b"\x00\x00", ["int"]),  # no field
    (b"\x00\x00\x80", ["int"]),  # truncated varint
    (b"\x00\x00\x80\x00", ["int"]),  # non-canonical varint
    (b"\x00\x00" + b"\xff" * 11, ["bigint"]),  # varint too long
    (b"\x00\x00\x81\x80\x80\x80\x10", ["int"]),  # out of int range
    (b"\x00\x00\x05", ["boolean"]),  # boolean 2
    (b"\x00\x00\x05ab", ["string"]),  # truncated string
    (b"\x00\x00\x03\xff\xfe", ["string"]),  # not UTF-8
    (b"\x00\x00\x02\x00\x00", ["float"]),  # bad marker
    (b"\x00\x00\x01\x00\x00", ["double"]),  # truncated double
])
def test_corrupt_keys_raise(data: bytes, types: list[str]) -> None:
    with pytest.raises(CorruptStateError):
        decode_grouping_key(data, types)


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(OptionsError):
        encode_grouping_key(("a",), ["string"], MAX_MAX_PARALLELISM)
    with pytest.raises(OptionsError):
        encode_grouping_key(("a",), ["string"], -1)
    with pytest.raises(SchemaError):
        encode_grouping_key((1,), ["string"], 0)
    with pytest.raises(SchemaError):
        encode_grouping_key(("a", 1), ["string"], 0)
    with pytest.raises(OptionsError):
        encode_grouping_keys([["a"]], ["string"], np.array([MAX_MAX_PARALLELISM]))
    with pytest.raises(SchemaError):
        encode_grouping_keys([["a", "b"]], ["string"], np.array([1]))


def test_key_group_bounds_cover_exactly_the_range() -> None:
    r = KeyGroupRange(5, 9)
    lo, hi = key_group_bounds(r)
    assert (lo, hi) == (b"\x00\x05", b"\x00\x0a")
    inside = [encode_grouping_key(("x" * n,), ["string"], kg) for kg in (5, 9) for n in (0, 300)]
    outside = [encode_grouping_key((v,), ["string"], kg) for kg in (4, 10) for v in ("", "\uffff")]
    assert all(lo <= k < hi for k in inside)
    assert not any(lo <= k < hi for k in outside)
    assert key_group_bounds(KeyGroupRange(0, MAX_MAX_PARALLELISM - 1)) == (b"\x00\x00", b"\x80\x00")
    with pytest.raises(OptionsError):
        key_group_bounds(KeyGroupRange(3, 2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3).flatmap(
    lambda ts: st.tuples(st.just(ts), st.lists(typed_keys(ts), max_size=12))))
def test_vectorised_equals_scalar(case: tuple) -> None:
    types, rows = case
    columns = [[r[1][j] for r in rows] for j in range(len(types))]
    kgs = key_groups(columns, types, 1000)
    got = encode_grouping_keys(columns, types, kgs)
    assert got == [encode_grouping_key(r[1], types, int(kg)) for r, kg in zip(rows, kgs)]


def test_vectorised_column_forms() -> None:
    strs = ["a", None, "ccc"]
    ints = [1, None, -3]
    expect = [encode_grouping_key((s, i), ["string", "bigint"], 7) for s, i in zip(strs, ints)]
    kgs = np.full(3, 7)
    for s_col, i_col in [
        (pa.array(strs), pa.array(ints, pa.int64())),
        (pd.Series(strs), pd.Series(ints, dtype="Int64")),
        (pa.chunked_array([pa.array(strs[:1]), pa.array(strs[1:], pa.large_string())
                           .cast(pa.string())]), ints),
    ]:
        assert encode_grouping_keys([s_col, i_col], ["string", "bigint"], kgs) == expect
    f = np.array([1.5, -0.0, np.nan], dtype=np.float32)
    assert encode_grouping_keys([f], ["float"], np.zeros(3)) == [
        encode_grouping_key((float(v),), ["float"], 0) for v in f]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=6), st.integers(-2**63, 2**63 - 1)), max_size=30),
       st.sampled_from([1, 7, 128, 32768]))
def test_encode_keys_with_groups_equals_the_two_steps(rows, maxp):
    cols = [[r[0] for r in rows], [r[1] for r in rows]]
    kgs, keys = encode_keys_with_groups(cols, ["string", "bigint"], maxp)
    assert kgs.tolist() == key_groups(cols, ["string", "bigint"], maxp).tolist()
    assert keys == encode_grouping_keys(cols, ["string", "bigint"], kgs)
