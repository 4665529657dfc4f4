"""Key groups without Spark: known hashes, input forms, ranges, rescale and placement."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statebackend.errors import OptionsError, SchemaError, StateBackendError
from statebackend.keys.groups import key_group, key_groups, normalise_type, spark_hash, spark_hashes
from statebackend.keys.placement import placement_values
from statebackend.keys.ranges import (
    DEFAULT_MAX_PARALLELISM,
    EMPTY_KEY_GROUP_RANGE,
    MAX_MAX_PARALLELISM,
    KeyGroupRange,
    check_parallelism,
    key_group_range,
    partition_for_key_group,
    rescale_sources,
)

# Values of Spark SQL's hash() (checked against Spark by test_keygroup_spark_parity.py).
KNOWN = [
    ([0], ["int"], 933211791),
    ([1], ["int"], -559580957),
    ([""], ["string"], 142593372),
    (["abc"], ["string"], 1322437556),
]


def test_constants() -> None:
    assert DEFAULT_MAX_PARALLELISM == 128
    assert MAX_MAX_PARALLELISM == 32768


@pytest.mark.parametrize("values, types, expected", KNOWN)
def test_known_spark_hashes(values: list, types: list, expected: int) -> None:
    assert spark_hash(values, types) == expected
    assert spark_hashes([values[:1]], types).tolist() == [expected]


def test_null_leaves_hash_unchanged_and_seeds_chain() -> None:
    assert spark_hash([None], ["string"]) == 42
    assert spark_hash([None, None], ["int", "bigint"]) == 42
    h1 = spark_hash(["a"], ["string"])
    assert spark_hash(["a", 7], ["string", "int"]) == spark_hash([7], ["int"], seed=h1)
    assert spark_hash([None, 7], ["string", "int"]) == spark_hash([7], ["int"])


def test_int_types_hash_alike_and_bigint_differs() -> None:
    for t in ("int", "smallint", "tinyint"):
        assert spark_hash([5], [t]) == spark_hash([5], ["int"])
    assert spark_hash([True], ["boolean"]) == spark_hash([1], ["int"])
    assert spark_hash([dt.date(1970, 1, 11)], ["date"]) == spark_hash([10], ["int"])
    assert spark_hash([5], ["bigint"]) != spark_hash([5], ["int"])
    ntz = dt.datetime(1970, 1, 1, 0, 0, 1)
    assert spark_hash([ntz], ["timestamp_ntz"]) == spark_hash([1_000_000], ["bigint"])
    aware = dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)
    assert spark_hash([aware], ["timestamp"]) == spark_hash([1_000_000], ["bigint"])


def test_float_normalisation() -> None:
    assert spark_hash([-0.0], ["double"]) == spark_hash([0.0], ["double"])
    assert spark_hash([-0.0], ["float"]) == spark_hash([0.0], ["float"])
    nan2 = np.frombuffer(np.array([0x7FF8000000000001], np.uint64).tobytes(), np.float64)[0]
    assert spark_hash([nan2], ["double"]) == spark_hash([float("nan")], ["double"])
    assert spark_hash([0.0], ["double"]) == spark_hash([0], ["bigint"])  # bits of 0.0 are 0


def test_type_aliases_and_unknown_types() -> None:
    assert normalise_type("Integer") == "int"
    assert normalise_type("long") == "bigint"
    with pytest.raises(SchemaError, match="unsupported grouping-key type"):
        normalise_type("decimal(10,2)")
    with pytest.raises(SchemaError, match="sequence of type names"):
        spark_hash(["a"], "string")  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="2 values but 1 types"):
        spark_hash(["a", 1], ["string"])


@pytest.mark.parametrize("value, type_", [
    (128, "tinyint"), (-32769, "smallint"), (2**31, "int"), (2**63, "bigint"),
    ("1", "int"), (1.5, "int"), (True, "int"), (1, "boolean"), (b"x", "string"),
    ("x", "binary"), ("\ud800", "string"), ("2020-01-01", "date"), ("x", "double"),
])
def test_bad_scalars_are_schema_errors(value: object, type_: str) -> None:
    with pytest.raises(SchemaError):
        spark_hash([value], [type_])


def test_bad_columns_are_schema_errors() -> None:
    with pytest.raises(SchemaError, match="out of range"):
        key_groups([np.array([300], dtype=np.int64)], ["tinyint"])
    with pytest.raises(SchemaError, match="differ in length"):
        key_groups([["a", "b"], [1]], ["string", "int"])
    with pytest.raises(SchemaError, match="sequence of columns"):
        key_groups(np.array([1, 2]), ["int"])  # type: ignore[arg-type]
    with pytest.raises(SchemaError):
        key_groups([np.array([1.5])], ["int"])
    with pytest.raises(TypeError):
        key_groups([["a", 3]], ["string"])


def test_input_forms_agree() -> None:
    ints = [3, None, -7, 2**40]
    expect = [key_group([v], ["bigint"], 100) for v in ints]
    assert key_groups([ints], ["bigint"], 100).tolist() == expect
    assert key_groups([pd.Series(ints, dtype="Int64")], ["bigint"], 100).tolist() == expect
    assert key_groups([pa.array(ints, pa.int64())], ["bigint"], 100).tolist() == expect
    assert key_groups([np.array(ints, dtype=object)], ["bigint"], 100).tolist() == expect
    strs = ["x", None, "", "ÿÿÿ"]
    expect = [key_group([v], ["string"], 100) for v in strs]
    for col in (strs, np.array(strs, dtype=object), pd.Series(strs),
                pd.Series(strs, dtype="string"), pa.array(strs), pa.array(strs, pa.large_string()),
                pd.Series([v if v is not None else float("nan") for v in strs], dtype=object),
                pd.Series([v if v is not None else pd.NA for v in strs], dtype=object)):
        assert key_groups([col], ["string"], 100).tolist() == expect
    days = ["2020-01-01", None, "1969-12-31"]
    expect = [key_group([None if d is None else dt.date.fromisoformat(d)], ["date"], 100)
              for d in days]
    assert key_groups([np.array(days, dtype="datetime64[D]")], ["date"], 100).tolist() == expect
    assert key_groups([pd.Series(pd.to_datetime(days)).dt.date], ["date"], 100).tolist() == expect
    stamps = pd.Series(pd.to_datetime(["2020-01-01T00:00:01.5", None]))
    micros = [1577836801500000, None]
    expect = [key_group([v], ["bigint"], 100) for v in micros]
    assert key_groups([stamps], ["timestamp"], 100).tolist() == expect
    assert key_groups([stamps.dt.tz_localize("UTC")], ["timestamp"], 100).tolist() == expect
    assert key_groups([pd.Series([True, None, False], dtype="boolean")], ["boolean"],
                      100).tolist() == [key_group([v], ["boolean"], 100) for v in (True, None, False)]


def test_empty_columns() -> None:
    assert key_groups([[]], ["string"]).tolist() == []
    assert key_groups([np.array([], np.int64), pa.array([], pa.string())],
                      ["bigint", "string"]).tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text()), max_size=30),
       st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), max_size=30),
       st.integers(1, MAX_MAX_PARALLELISM))
def test_vectorised_equals_scalar(strs: list, ints: list, max_p: int) -> None:
    n = min(len(strs), len(ints))
    strs, ints = strs[:n], ints[:n]
    got = key_groups([strs, ints], ["string", "bigint"], max_p)
    assert got.tolist() == [key_group([s, i], ["string", "bigint"], max_p)
                            for s, i in zip(strs, ints)]
    assert ((0 <= got) & (got < max_p)).all()


# --- ranges --------------------------------------------------------------------------


def test_key_group_range_object() -> None:
    r = KeyGroupRange(10, 19)
    assert len(r) == 10 and 10 in r and 19 in r and 20 not in r and 9 not in r
    assert "10" not in r  # type: ignore[operator]
    assert list(r) == list(range(10, 20))
    assert r.intersect(KeyGroupRange(15, 30)) == KeyGroupRange(15, 19)
    assert r.intersect(KeyGroupRange(20, 30)) == EMPTY_KEY_GROUP_RANGE
    assert len(EMPTY_KEY_GROUP_RANGE) == 0 and not EMPTY_KEY_GROUP_RANGE
    assert EMPTY_KEY_GROUP_RANGE.is_empty and not r.is_empty
    with pytest.raises(OptionsError):
        KeyGroupRange(5, 3)
    with pytest.raises(OptionsError):
        KeyGroupRange(-1, 3)
    with pytest.raises(OptionsError):
        KeyGroupRange(0, MAX_MAX_PARALLELISM)
    with pytest.raises(AttributeError):
        r.start = 3  # type: ignore[misc]


def test_known_ranges() -> None:
    assert [key_group_range(p, 3, 128) for p in range(3)] == [
        KeyGroupRange(0, 42), KeyGroupRange(43, 85), KeyGroupRange(86, 127)]
    assert key_group_range(0, 1, 128) == KeyGroupRange(0, 127)
    assert [key_group_range(p, 7, 7) for p in range(7)] == [KeyGroupRange(p, p) for p in range(7)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_MAX_PARALLELISM).flatmap(
    lambda m: st.tuples(st.just(m), st.integers(1, min(m, 300)))))
def test_ranges_partition_the_key_groups(mp_p: tuple[int, int]) -> None:
    max_p, p = mp_p
    ranges = [key_group_range(i, p, max_p) for i in range(p)]
    assert ranges[0].start == 0 and ranges[-1].end == max_p - 1
    for a, b in zip(ranges, ranges[1:]):
        assert b.start == a.end + 1
    sizes = {len(r) for r in ranges}
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    kgs = np.arange(max_p)
    owners = partition_for_key_group(kgs, p, max_p)
    assert owners.dtype == np.int32
    for i, r in enumerate(ranges):
        assert (owners[r.start:r.end + 1] == i).all()
        assert partition_for_key_group(r.start, p, max_p) == i
        assert partition_for_key_group(r.end, p, max_p) == i


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2000).flatmap(
    lambda m: st.tuples(st.just(m), st.integers(1, min(m, 64)), st.integers(1, min(m, 64)))),
       st.data())
def test_rescale_sources_cover_exactly(args: tuple[int, int, int], data: st.DataObject) -> None:
    max_p, new_p, old_p = args
    part = data.draw(st.integers(0, new_p - 1))
    target = key_group_range(part, new_p, max_p)
    sources = rescale_sources(part, new_p, old_p, max_p)
    covered = [kg for _, r in sources for kg in r]
    assert covered == list(target)  # disjoint, ordered, exactly the target range
    for old, overlap in sources:
        assert not overlap.is_empty
        assert overlap == key_group_range(old, old_p, max_p).intersect(target)
    assert len({old for old, _ in sources}) == len(sources)


def test_rescale_examples() -> None:
    assert rescale_sources(0, 2, 4, 128) == [(0, KeyGroupRange(0, 31)), (1, KeyGroupRange(32, 63))]
    assert rescale_sources(1, 4, 2, 128) == [(0, KeyGroupRange(32, 63))]
    assert rescale_sources(0, 1, 3, 128) == [
        (0, KeyGroupRange(0, 42)), (1, KeyGroupRange(43, 85)), (2, KeyGroupRange(86, 127))]


@pytest.mark.parametrize("call", [
    lambda: key_group_range(0, 0, 128),
    lambda: key_group_range(3, 3, 128),
    lambda: key_group_range(-1, 3, 128),
    lambda: key_group_range(0, 129, 128),
    lambda: key_group_range(0, 1, 0),
    lambda: key_group_range(0, 1, MAX_MAX_PARALLELISM + 1),
    lambda: key_group_range(0, True, 128),
    lambda: partition_for_key_group(128, 4, 128),
    lambda: partition_for_key_group(-1, 4, 128),
    lambda: partition_for_key_group(np.array([0, 128]), 4, 128),
    lambda: rescale_sources(0, 2, 200, 128),
    lambda: key_group(["a"], ["string"], 0),
    lambda: placement_values(0),
    lambda: check_parallelism(5, 4),
])
def test_validation_errors(call) -> None:  # noqa: ANN001
    with pytest.raises(OptionsError) as info:
        call()
    assert isinstance(info.value, ValueError) and isinstance(info.value, StateBackendError)
    assert info.value.key in ("parallelism", "max_parallelism", "partition", "key_group")


def test_validation_message_says_what_to_do() -> None:
    with pytest.raises(OptionsError, match=r"parallelism must be an int in 1..max_parallelism "
                                           r"\(128\), got 200; lower parallelism, or raise max_parallelism"):
        check_parallelism(200, 128)


# --- placement -------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3, 7, 8, 64, 200, 1000])
def test_placement_values_route_to_their_index(p: int) -> None:
    vs = placement_values(p)
    assert len(vs) == p and len(set(vs)) == p
    assert all(0 <= v < 2**31 for v in vs)
    assert [spark_hash([v], ["int"]) % p for v in vs] == list(range(p))
    # Smallest such value: no smaller non-negative int routes to the same index.
    hashes = spark_hashes([np.arange(max(vs) + 1)], ["int"]) % p
    for i, v in enumerate(vs):
        assert (hashes[:v] != i).all()
    assert placement_values(p) == vs  # deterministic (and a fresh list each call)
    placement_values(p).append(-1)
    assert placement_values(p) == vs
