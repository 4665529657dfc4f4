"""Hypothesis strategies for Spark schemas nested to depth 3 and values of them, and a
processor that stores such values and reads them back (importable by Spark's workers)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pandas as pd
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

from statebackend.model.schema import DataType, Field, Schema

_INT_RANGES = {"tinyint": 2**7, "smallint": 2**15, "int": 2**31, "bigint": 2**63}
PRIMITIVE_NAMES = ["string", "binary", "boolean", "tinyint", "smallint", "int", "bigint",
                   "float", "double", "date", "timestamp", "timestamp_ntz", "decimal"]
# map keys: what users key maps by (hashable, never null)
KEY_NAMES = ["string", "int", "bigint", "date"]
NAMES = st.sampled_from(["a", "b", "c", "n", "x", "tag", "at", "v w"])


def primitive_types() -> st.SearchStrategy[DataType]:
    def make(name: str) -> st.SearchStrategy[DataType]:
        if name == "decimal":
            return st.integers(1, 38).flatmap(
                lambda p: st.integers(0, min(p, 6)).map(lambda s: DataType("decimal", p, s)))
        return st.just(DataType(name))
    return st.sampled_from(PRIMITIVE_NAMES).flatmap(make)


def fields_of(children: st.SearchStrategy[DataType]) -> st.SearchStrategy[tuple[Field, ...]]:
    return st.lists(st.tuples(NAMES, children, st.booleans()), min_size=1, max_size=3,
                    unique_by=lambda t: t[0]).map(
        lambda fs: tuple(Field(n, t, nullable) for n, t, nullable in fs))


def types(depth: int = 3) -> st.SearchStrategy[DataType]:
    """Any supported type with at most ``depth`` levels of nesting."""
    if depth <= 1:
        return primitive_types()
    inner = types(depth - 1)
    return st.one_of(
        primitive_types(),
        st.tuples(inner, st.booleans()).map(
            lambda t: DataType("array", element=t[0], contains_null=t[1])),
        st.tuples(st.sampled_from(KEY_NAMES), inner, st.booleans()).map(
            lambda t: DataType("map", key=DataType(t[0]), value=t[1],
                               value_contains_null=t[2])),
        fields_of(inner).map(lambda fs: DataType("struct", fields=fs)),
    )


def schemas(depth: int = 3) -> st.SearchStrategy[Schema]:
    return fields_of(types(depth)).map(Schema)


def _primitive_values(t: DataType) -> st.SearchStrategy[Any]:
    n = t.name
    if n in _INT_RANGES:
        r = _INT_RANGES[n]
        return st.integers(-r, r - 1)
    if n == "string":
        return st.text(max_size=8)
    if n == "binary":
        return st.binary(max_size=8)
    if n == "boolean":
        return st.booleans()
    if n == "float":
        return st.floats(width=32, allow_nan=False)
    if n == "double":
        return st.floats(allow_nan=False)
    if n == "date":
        return st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1))
    if n in ("timestamp", "timestamp_ntz"):
        return st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1))
    if n == "decimal":
        limit = 10 ** t.precision - 1
        wide = decimal.Context(prec=80)
        return st.integers(-limit, limit).map(
            lambda u: decimal.Decimal(u).scaleb(-t.scale, context=wide))
    raise AssertionError(n)


def values(t: DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Values of ``t`` as users pass them (lists, dicts, Rows), None where allowed."""
    if t.name == "array":
        base: st.SearchStrategy[Any] = st.lists(values(t.element, t.contains_null), max_size=3)
    elif t.name == "map":
        base = st.dictionaries(values(t.key, False), values(t.value, t.value_contains_null),
                               max_size=3)
    elif t.name == "struct":
        names = [f.name for f in t.fields]
        base = st.tuples(*[values(f.type, f.nullable) for f in t.fields]).map(
            lambda vs: Row(**dict(zip(names, vs))) if len(set(names)) == len(names) else vs)
    else:
        base = _primitive_values(t)
    return st.one_of(st.none(), base) if nullable else base


def rows_of(schema: Schema) -> st.SearchStrategy[tuple]:
    return st.tuples(*[values(f.type, f.nullable) for f in schema.fields])


def same(a: Any, b: Any) -> bool:
    """Equality that tells a Row's field names and a list from a tuple apart."""
    if isinstance(a, Row) or isinstance(b, Row):
        return (isinstance(a, Row) and isinstance(b, Row)
                and list(getattr(a, "__fields__", [])) == list(getattr(b, "__fields__", []))
                and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, decimal.Decimal):
        return isinstance(b, decimal.Decimal) and a == b
    return type(a) is type(b) and a == b


class StoreAndReadBack(StatefulProcessor):
    """Stores ``values[i]`` for key ``i`` when the key has no state; when it has, emits
    whether what it reads back is exactly what was stored."""

    def __init__(self, ddl: str, values: list[tuple]):
        self.ddl = ddl
        self.values = values

    def init(self, handle):
        self.state = handle.getValueState("v", self.ddl)

    def handleInputRows(self, key, rows, timerValues):
        i = int(key[0])
        for _ in rows:
            pass
        if not self.state.exists():
            self.state.update(self.values[i])
            return iter([])
        got = self.state.get()
        ok = same(tuple(got), tuple(self.values[i]))
        return iter([pd.DataFrame({"i": [i], "ok": [ok], "got": [repr(got)]})])

    def close(self):
        pass
