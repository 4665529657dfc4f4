"""Schemas (DDL and StructType) and the compiled row codecs: round trips and refusals."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import numpy as np
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from statebackend.errors import SchemaError
from statebackend.keys.values import RowCodec, decode_varint, encode_varint
from statebackend.model.schema import parse_ddl, to_schema

ALL = ("s STRING, b BINARY, f BOOLEAN, t TINYINT, sm SMALLINT, i INT, l BIGINT, "
       "r FLOAT, d DOUBLE, day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, dec DECIMAL(12,3), "
       "arr ARRAY<INT>, sarr ARRAY<STRING>")


def codec(ddl: str, label: str = "state 'x'") -> RowCodec:
    return RowCodec(parse_ddl(ddl), label)


def roundtrip(c: RowCodec, v: tuple) -> tuple:
    return c.decode(c.encode(v))


# --- DDL -------------------------------------------------------------------------------


def test_ddl_aliases_backquotes_not_null_and_canonical_form() -> None:
    s = parse_ddl("`my field` long NOT NULL, x: integer COMMENT 'c', `a``b` varchar(3), "
                  "y decimal, z array<short>")
    assert s.names == ("my field", "x", "a`b", "y", "z")
    assert s.ddl() == ("`my field` BIGINT NOT NULL, x INT, `a``b` STRING, y DECIMAL(10,0), "
                       "z ARRAY<SMALLINT>")
    assert parse_ddl(s.ddl()) == s  # canonical DDL parses back to the same schema
    assert parse_ddl("struct<a:int,b:string>").ddl() == "a INT, b STRING"


def test_structtype_is_read_without_a_session() -> None:
    st = StructType([StructField("count", LongType(), False), StructField("name", StringType()),
                     StructField("xs", ArrayType(IntegerType(), containsNull=False))])
    s = to_schema(st)
    assert s.ddl() == "count BIGINT NOT NULL, name STRING, xs ARRAY<INT>"
    assert s.fields[2].type.contains_null is False


@pytest.mark.parametrize("ddl", ["", "a MAP<INT>", "a STRUCT<>", "a STRUCT<x INT, x INT>",
                                 "a ARRAY<ARRAY<INT>", "a INT,", "a INT, a INT",
                                 "a ARRAY<VOID>", "a DECIMAL(50,2)", "1a INT", "a INT b"])
def test_bad_ddl_is_refused(ddl: str) -> None:
    with pytest.raises(SchemaError):
        parse_ddl(ddl)


def test_non_schema_is_refused() -> None:
    with pytest.raises(SchemaError, match="DDL string or a StructType"):
        to_schema(42)


# --- round trips -----------------------------------------------------------------------


def test_every_type_round_trips() -> None:
    c = codec(ALL)
    v = ("héllo wörld ✓ 日本", b"\x00\xff", True, -128, 32767, -2**31, 2**63 - 1, 1.5, -0.25,
         dt.date(1, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
         dt.datetime(9999, 12, 31, 23, 59, 59), Decimal("-123456789.125"), [1, None, -3],
         ["", None, "ü" * 200])
    assert roundtrip(c, v) == v


def test_all_nulls_and_empty_values() -> None:
    c = codec(ALL)
    nulls = (None,) * 15
    assert roundtrip(c, nulls) == nulls
    empties = ("", b"", False, 0, 0, 0, 0, 0.0, 0.0, dt.date(1970, 1, 1),
               dt.datetime(1970, 1, 1), dt.datetime(1970, 1, 1), Decimal("0.000"), [], [])
    assert roundtrip(c, empties) == empties
    # An empty string and a null string are different values.
    s = codec("s STRING")
    assert s.encode(("",)) != s.encode((None,))


def test_extremes() -> None:
    c = codec("a BIGINT, b BIGINT, c TINYINT, d DOUBLE, e DOUBLE, f FLOAT, g DATE")
    v = (-2**63, 2**63 - 1, 127, float("inf"), -1e308, 3.4e38, dt.date(9999, 12, 31))
    out = roundtrip(c, v)
    assert out[:5] == v[:5] and out[6] == v[6]
    assert math.isclose(out[5], 3.4e38, rel_tol=1e-6)  # float32 precision
    assert math.isnan(roundtrip(codec("x DOUBLE"), (float("nan"),))[0])


def test_long_strings_use_multibyte_lengths() -> None:
    c = codec("a STRING, b BINARY, c STRING")
    v = ("x" * 127, b"y" * 128, "z" * 70_000)
    assert roundtrip(c, v) == v
    for n in (0, 1, 127, 128, 16383, 16384, 2**35):
        assert decode_varint(b"\x01" + encode_varint(n), 1) == (n, 1 + len(encode_varint(n)))


@pytest.mark.parametrize("n", [1, 8, 9, 16, 17, 64, 65, 130])
def test_bitmap_widths(n: int) -> None:
    c = codec(", ".join(f"f{i} INT" for i in range(n)))
    v = tuple(None if i % 3 == 0 else i for i in range(n))
    assert roundtrip(c, v) == v


def test_encoding_is_deterministic_and_input_permissive() -> None:
    c = codec("a BIGINT, b DOUBLE, c STRING, d BOOLEAN")
    ref = c.encode((1, 2.0, "x", True))
    assert c.encode([1, 2.0, "x", True]) == ref
    assert c.encode(Row(a=1, b=2.0, c="x", d=True)) == ref
    assert c.encode(Row(d=True, c="x", b=2.0, a=1)) == ref  # Row reordered by field name
    assert c.encode({"d": True, "a": 1, "b": 2.0, "c": "x"}) == ref
    assert c.encode((np.int64(1), np.float64(2.0), np.str_("x"), np.bool_(True))) == ref
    assert c.encode((1, 2, "x", True)) == ref  # an int is a valid double
    assert c.decode(ref) == (1, 2.0, "x", True)
    assert type(c.decode(c.encode((np.int32(5), 1.0, "", False)))[0]) is int


def test_aware_timestamps_become_local_wall_clock() -> None:
    c = codec("t TIMESTAMP")
    aware = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    assert c.decode(c.encode((aware,)))[0] == aware.astimezone().replace(tzinfo=None)


def test_decimal_is_rounded_to_scale_and_checked_against_precision() -> None:
    c = codec("d DECIMAL(5,2)")
    assert c.decode(c.encode((Decimal("1.005"),)))[0] == Decimal("1.01")
    assert c.decode(c.encode((7,)))[0] == Decimal("7.00")
    with pytest.raises(SchemaError, match="does not fit DECIMAL"):
        c.encode((Decimal("1000.00"),))


# --- refusals --------------------------------------------------------------------------


def test_wrong_arity_names_the_state() -> None:
    c = codec("a INT, b STRING", "value state 'count'")
    with pytest.raises(SchemaError, match="value state 'count'.*2 field"):
        c.encode((1,))
    with pytest.raises(SchemaError, match="2 field"):
        c.encode((1, "x", 3))


@pytest.mark.parametrize("ddl,value,field", [
    ("a INT, b STRING", ("1", "x"), "'a'"),
    ("a INT, b STRING", (1, 2), "'b'"),
    ("a INT, b STRING", (1.5, "x"), "'a'"),
    ("a TINYINT", (128,), "'a'"),
    ("a INT", (2**31,), "'a'"),
    ("a DOUBLE", ("1.0",), "'a'"),
    ("a BOOLEAN", (1,), "'a'"),
    ("a DATE", ("2020-01-01",), "'a'"),
    ("a TIMESTAMP", (dt.date(2020, 1, 1),), "'a'"),
    ("a BINARY", ("text",), "'a'"),
    ("a ARRAY<INT>", ([1, "x"],), "'a'"),
    ("a ARRAY<INT>", ("123",), "'a'"),
    ("a DECIMAL(5,2)", (1.5,), "'a'"),
    ("a STRING", ("\ud800",), "'a'"),
    ("a INT NOT NULL, b INT", (None, 1), "'a'"),
])
def test_wrong_type_names_the_field(ddl: str, value: tuple, field: str) -> None:
    c = codec(ddl, "list state 'events'")
    with pytest.raises(SchemaError, match=f"list state 'events' field {field}"):
        c.encode(value)


def test_non_tuple_values_are_refused() -> None:
    c = codec("count BIGINT")
    with pytest.raises(SchemaError, match=r"wrap a single value in a tuple"):
        c.encode(5)
    with pytest.raises(SchemaError):
        c.encode(None)
    with pytest.raises(SchemaError, match="missing"):
        codec("a INT, b INT").encode({"a": 1})
    with pytest.raises(SchemaError, match="unexpected"):
        codec("a INT").encode({"a": 1, "z": 2})


def test_schema_error_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        codec("a INT").encode(("x",))
