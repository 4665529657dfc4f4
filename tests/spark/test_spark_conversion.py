"""Key and value conversion of the swap-in's states against Spark's own Python client.

Hypothesis draws objects a processor may hand a state call (a tuple, a list, a ``Row``,
a dict, a bare string or number, with numpy and pandas scalars inside) for one-field and
multi-field schemas, and runs them through Spark's conversion itself,
``StatefulProcessorApiClient._serialize_to_bytes`` (imported from PySpark, its pickle
read back), and through the states our handle gives a processor. Then:

- Spark's client raises: ours raises the same class with the same message;
- a struct inside a field: a ``Row`` by position, a dict by name, as Spark's client;
- Spark's client produces a row the JVM stores as it is (right arity, each field of a type
  the JVM reads for its column): ours stores it, and reads back what Spark would
  (``StructType.fromInternal`` of that row);
- otherwise (the JVM would store null, a string made by ``toString``, or fail the query:
  README "Known differences"): ours refuses with ``SchemaError``.
"""

from __future__ import annotations

import datetime as dt
import re
import types

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pyspark.serializers import PickleSerializer
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient

from statebackend.errors import SchemaError
from statebackend.rocksdb.instance import RocksDBInstance
from statebackend.state.backend import KeyedStateBackend
from statebackend.task.processor import RocksDBProcessorHandle
from statebackend.task.spark_states import spark_struct

SCHEMAS = ["name STRING", "c BIGINT", "at TIMESTAMP", "name STRING, c BIGINT",
           "c BIGINT, at TIMESTAMP, name STRING", "c BIGINT, inner STRUCT<a: BIGINT, b: BIGINT>"]
_PICKLE = PickleSerializer()
_CLIENT = types.SimpleNamespace(pickleSer=_PICKLE)  # what _serialize_to_bytes uses of self


def spark_client(struct, obj):
    """The row Spark's client sends the JVM for ``obj`` (its internal values)."""
    return _PICKLE.loads(StatefulProcessorApiClient._serialize_to_bytes(_CLIENT, struct, obj))


def jvm_stores_as_is(struct, row) -> bool:
    """Whether the JVM reads ``row`` into the columns unchanged (for the types drawn)."""
    if not isinstance(row, (tuple, list)) or len(row) != len(struct.fields):
        return False
    for f, v in zip(struct.fields, row):
        name = f.dataType.typeName()
        if v is None:
            continue
        if name == "struct" and not jvm_stores_as_is(f.dataType, v):
            return False
        if name == "string" and not isinstance(v, str):
            return False
        if name in ("long", "timestamp") and (type(v) is not int
                                              or not -(1 << 63) <= v < (1 << 63)):
            return False
    return True


# --- what a processor may pass -----------------------------------------------------------

_when = st.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2040, 1, 1))
strings = st.one_of(st.text(max_size=4), st.characters().map(np.str_))
longs = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                  st.integers(-(1 << 31), (1 << 31) - 1).map(np.int32),
                  st.integers(-(1 << 63), (1 << 63) - 1).map(np.int64),
                  st.integers(1 << 63, 1 << 70))
times = st.one_of(_when, _when.map(pd.Timestamp),
                  _when.map(lambda d: np.datetime64(d, "us")))
pairs = st.tuples(longs, longs)
inner = st.one_of(  # a STRUCT<a: BIGINT, b: BIGINT> value, in every shape a user may write
    pairs, pairs.map(list), pairs.map(lambda p: Row(a=p[0], b=p[1])),
    pairs.map(lambda p: Row(b=p[0], a=p[1])), pairs.map(lambda p: {"b": p[0], "a": p[1]}),
    st.tuples(longs).map(lambda p: Row(a=p[0])))
BY_TYPE = {"STRING": strings, "BIGINT": longs, "TIMESTAMP": times,
           "STRUCT<a: BIGINT, b: BIGINT>": inner}
anything = st.one_of(st.none(), strings, longs, times, st.floats(allow_nan=False))


@st.composite
def state_objects(draw, ddl: str):
    """An object for a state of schema ``ddl``: mostly fields of the right types, sometimes
    a wrong one, a missing or extra one, in a tuple, list, Row, dict or bare."""
    fields = [f.split(" ", 1) for f in re.split(r", (?![^<]*>)", ddl)]
    values = [draw(st.one_of(BY_TYPE[t], anything) if draw(st.booleans())
                   else BY_TYPE[t]) for _, t in fields]
    if draw(st.integers(0, 9)) == 0:
        values = values[:-1] if draw(st.booleans()) else values + [draw(anything)]
    names = [n for n, _ in fields][:len(values)] + ["extra"] * (len(values) - len(fields))
    shape = draw(st.sampled_from(["tuple", "list", "row", "row reversed", "dict", "bare"]))
    if shape == "tuple":
        return tuple(values)
    if shape == "list":
        return values
    if shape == "row":
        return Row(**dict(zip(names, values)))
    if shape == "row reversed":  # fields in another order than the schema's
        return Row(**dict(reversed(list(zip(names, values)))))
    if shape == "dict":
        return dict(zip(names, values))
    return values[0] if values else ""  # a bare string is iterable: Spark takes its characters


# --- ours ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    inst = RocksDBInstance(str(tmp_path_factory.mktemp("conversion") / "db"))
    backend = KeyedStateBackend(inst)
    backend.set_current_key(b"\x00\x01key")
    handle = RocksDBProcessorHandle(backend, "None")
    out = {}
    for i, ddl in enumerate(SCHEMAS):
        out[ddl] = (handle.getValueState(f"value{i}", ddl),
                    handle.getListState(f"list{i}", ddl),
                    handle.getMapState(f"map{i}", ddl, "c BIGINT"),
                    handle._backend.value_state(f"value{i}", ddl).codec)
    yield out
    backend.close()
    inst.close()


def _raises_like(call, expected: BaseException) -> None:
    with pytest.raises(type(expected)) as info:
        call()
    assert type(info.value) is type(expected)
    assert str(info.value) == str(expected)


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("ddl", SCHEMAS)
@SETTINGS
@given(data=st.data())
def test_values_and_map_keys_convert_as_spark_does(states, ddl, data):
    value, lst, mp, codec = states[ddl]
    struct = spark_struct(codec.schema)
    obj = data.draw(state_objects(ddl), label="obj")
    try:
        row = spark_client(struct, obj)
    except Exception as exc:  # noqa: BLE001 - Spark's client refuses: ours must refuse alike
        event(f"Spark's client raises {type(exc).__name__}")
        _raises_like(lambda: value.update(obj), exc)
        _raises_like(lambda: lst.appendValue(obj), exc)
        _raises_like(lambda: mp.updateValue(obj, (1,)), exc)
        _raises_like(lambda: mp.containsKey(obj), exc)
        return
    if not jvm_stores_as_is(struct, row):
        event("the JVM would not store it as it is")
        for call in (lambda: value.update(obj), lambda: lst.put([obj]),
                     lambda: mp.updateValue(obj, (1,)), lambda: mp.containsKey(obj)):
            with pytest.raises(SchemaError):
                call()
        return
    event(f"stored: {type(obj).__name__}")
    expected = tuple(struct.fromInternal(row))
    value.update(obj)
    assert value.get() == expected
    lst.put([obj, obj])
    assert list(lst.get()) == [expected, expected]
    mp.clear()
    mp.updateValue(obj, [7])
    assert mp.containsKey(obj) and mp.containsKey(expected)
    assert list(mp.keys()) == [expected]
    got = mp.getValue(obj)
    assert got == Row(c=7) and got.__fields__ == ["c"]  # a Row, as Spark's getValue gives


@pytest.mark.parametrize("text", ["\x00", "a\x00", "a\x00b", "plain"])
def test_a_numpy_string_in_a_plain_tuple_is_stored_as_spark_stores_it(states, text):
    # a plain tuple takes our fast path; numpy's string scalar must still become the
    # Python value Spark's client sends (numpy drops trailing NUL characters there),
    # a case Hypothesis drew once in a whole-suite run
    value, lst, _mp, codec = states["name STRING, c BIGINT"]
    struct = spark_struct(codec.schema)
    obj = (np.str_(text), 7)
    expected = tuple(struct.fromInternal(spark_client(struct, obj)))
    value.update(obj)
    assert value.get() == expected
    lst.put([obj])
    assert list(lst.get()) == [expected]
