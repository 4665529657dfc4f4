"""PySpark's state classes over ours: what a processor's ``getValueState`` /
``getListState`` / ``getMapState`` return, converting and failing exactly as Spark's
Python client does.

Spark's client turns every value and map user key into a tuple before it reaches the JVM
(``tuple(map(_normalize_state_value, x))``, then the schema's ``toInternal``): a list, a
``Row`` (by position, not by field name), a dict (its keys), a one-character string all
become tuples; numpy and pandas scalars become Python ones; an object that is not
iterable raises ``TypeError`` there, a string in a TIMESTAMP field ``AttributeError``.
The same functions, imported from PySpark, do that here, but only where a value is not a
plain tuple, our codec refuses it, or the schema nests a struct (Spark's client takes a
nested ``Row`` by position, our codec by name): otherwise a plain tuple our codec accepts
is what Spark's conversion would have produced (the per-key path stays as fast as before).

A call that Spark's server answers with an error raises ``PySparkRuntimeError`` whose
message starts with the client's text (``Error checking value state exists: ...``) and
the server's (``Value state x is not initialized.``); statebackend's explanation, if
any, follows as `` (statebackend: ...)``. The messages are Spark 4.x's, checked against Spark on this machine by
``tests/spark/test_spark_messages.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyspark.sql.streaming.stateful_processor_api_client as _client
from pyspark.sql.streaming.stateful_processor import ListState as _SparkListState
from pyspark.sql.streaming.stateful_processor import MapState as _SparkMapState
from pyspark.sql.streaming.stateful_processor import ValueState as _SparkValueState
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..errors import SchemaError, StateError
from ..model import schema as _schema
from ..state.list import ListState
from ..state.map import MapState
from ..state.value import ValueState

__all__ = ["SparkListState", "SparkMapState", "SparkValueState", "converts_always",
           "spark_struct", "spark_tuple", "timer_timestamp"]

_SIMPLE: dict[str, type[DataType]] = {
    "boolean": BooleanType, "tinyint": ByteType, "smallint": ShortType, "int": IntegerType,
    "bigint": LongType, "float": FloatType, "double": DoubleType, "date": DateType,
    "timestamp": TimestampType, "timestamp_ntz": TimestampNTZType, "string": StringType,
    "binary": BinaryType}


def _spark_type(t: _schema.DataType) -> DataType:
    if t.name == "decimal":
        return DecimalType(t.precision, t.scale)
    if t.name == "array":
        assert t.element is not None
        return ArrayType(_spark_type(t.element), t.contains_null)
    if t.name == "map":
        assert t.key is not None and t.value is not None
        return MapType(_spark_type(t.key), _spark_type(t.value), t.value_contains_null)
    if t.name == "struct":
        assert t.fields is not None
        return StructType([StructField(f.name, _spark_type(f.type), f.nullable)
                           for f in t.fields])
    return _SIMPLE[t.name]()


def spark_struct(schema: _schema.Schema) -> StructType:
    """The pyspark ``StructType`` of ``schema`` (built without a JVM)."""
    return StructType([StructField(f.name, _spark_type(f.type), f.nullable)
                       for f in schema.fields])


def _nests_struct(t: DataType) -> bool:
    if isinstance(t, StructType):
        return True
    if isinstance(t, ArrayType):
        return _nests_struct(t.elementType)
    if isinstance(t, MapType):
        return _nests_struct(t.keyType) or _nests_struct(t.valueType)
    return False


def converts_always(struct: StructType) -> bool:
    """Whether a plain tuple for ``struct`` must go through Spark's conversion too: a
    struct inside a field takes a ``Row`` by position in Spark's client, where our codec
    takes it by field name."""
    return any(_nests_struct(f.dataType) for f in struct.fields)


def spark_tuple(struct: StructType, value: Any) -> tuple[Any, ...]:
    """``value`` as Spark's Python client hands it to the JVM, read back as Python values.

    Raises what Spark's client raises (``TypeError`` for an object that is not iterable,
    ``AttributeError`` for a string in a TIMESTAMP field, ...).
    """
    if _client.has_numpy is None:
        _client._load_numpy()
    converted = tuple(map(_client._normalize_state_value, value)) if _client.has_numpy \
        else value
    row = struct.fromInternal(struct.toInternal(converted))
    return tuple(row)


def _not_initialized(client_text: str, kind: str, name: str) -> StateError:
    return StateError(f"{client_text}: {kind} state {name} is not initialized. (statebackend: "
                      f"deleted by deleteIfExists({name!r}) in init; declare it again to use it)")


class SparkValueState(_SparkValueState):
    """PySpark's ``ValueState`` over our :class:`~statebackend.state.value.ValueState`.

    ``get``, ``exists`` and ``clear`` are our state's own methods (no extra call per key);
    ``update`` converts what is not a plain tuple as Spark's client does.
    """

    def __init__(self, name: str, struct: StructType, state: ValueState | None) -> None:  # noqa: D107
        self._stateName = name
        self._struct = struct
        self._fast = not converts_always(struct)
        self.bind(state)

    def bind(self, state: ValueState | None) -> None:
        """Point at ``state``; None: the state was deleted, every call fails as Spark's."""
        if state is None:
            name = self._stateName

            def fail(text: str) -> Any:
                def call() -> Any:
                    raise _not_initialized(text, "Value", name)
                return call
            self.exists = fail("Error checking value state exists")
            self.get = fail("Error getting value state")
            self.clear = fail("Error clearing value state")
            self._update = None
        else:
            self.exists, self.get, self.clear = state.exists, state.get, state.clear
            self._update = state.update

    def update(self, newValue: Any) -> None:  # noqa: N803 - PySpark's name
        update = self._update
        if update is None:
            spark_tuple(self._struct, newValue)  # Spark converts before it asks the JVM
            raise _not_initialized("Error updating value state", "Value", self._stateName)
        if newValue.__class__ is tuple and self._fast:
            try:
                update(newValue)
                return
            except SchemaError:
                pass  # Spark's conversion may make it fit, or raise Spark's error
        update(spark_tuple(self._struct, newValue))


def _fast_many(direct: Callable[[Any], None], slow: Callable[[Any], None]
               ) -> Callable[[Any], None]:
    """``direct`` for a non-empty list of plain tuples (the per-key path: one frame, as
    calling our state itself), ``slow`` (Spark's conversion) for anything else or when our
    codec refuses."""
    def call(values: Any) -> None:
        if values.__class__ is list and values:
            for v in values:
                if v.__class__ is not tuple:
                    break
            else:
                try:
                    direct(values)
                    return
                except SchemaError:
                    pass
        slow(values)
    return call


def _fast_get(direct: Callable[[Any], Any], slow: Callable[[Any], Any], names: list[str]
              ) -> Callable[[Any], Any]:
    """A map state's ``getValue`` for a plain tuple key: our state's value as the ``Row``
    Spark returns (built as ``_create_row`` builds it, without Row's argument checks)."""
    def call(key: Any) -> Any:
        if key.__class__ is not tuple:
            return slow(key)
        try:
            v = direct(key)
        except SchemaError:
            return slow(key)
        if v is None:
            return None
        row = tuple.__new__(Row, v)
        row.__fields__ = names
        return row
    return call


def _fast_one(direct: Callable[..., Any], slow: Callable[..., Any]) -> Callable[..., Any]:
    """``direct`` when every argument is a plain tuple, else ``slow`` (see _fast_many)."""
    def call(*args: Any) -> Any:
        for a in args:
            if a.__class__ is not tuple:
                return slow(*args)
        try:
            return direct(*args)
        except SchemaError:
            return slow(*args)
    return call


class SparkListState(_SparkListState):
    """PySpark's ``ListState`` over our :class:`~statebackend.state.list.ListState`.

    ``get`` and ``exists`` are our state's own methods while it is bound; writes of plain
    tuples go to it directly (one call per key, as before the wrapper), anything else
    through Spark's conversion.
    """

    def __init__(self, name: str, struct: StructType, state: ListState | None) -> None:  # noqa: D107
        self._stateName = name
        self._struct = struct
        self._fast = not converts_always(struct)
        self.bind(state)

    def bind(self, state: ListState | None) -> None:
        """Point at ``state``; None: the state was deleted."""
        self._st = state
        for name in ("get", "exists", "put", "appendValue", "appendList"):
            # class methods again: Spark's empty iterator, its errors, its conversion
            self.__dict__.pop(name, None)
        if state is not None:
            self.get, self.exists = state.get, state.exists  # type: ignore[method-assign]
            if self._fast:
                cls = type(self)
                self.put = _fast_many(state.put, cls.put.__get__(self))  # type: ignore[method-assign]
                self.appendList = _fast_many(  # type: ignore[method-assign]
                    state.appendList, cls.appendList.__get__(self))
                self.appendValue = _fast_one(  # type: ignore[method-assign]
                    state.appendValue, cls.appendValue.__get__(self))

    def _state(self, client_text: str) -> ListState:
        if self._st is None:
            raise _not_initialized(client_text, "List", self._stateName)
        return self._st

    def _rows(self, values: Iterable[Any]) -> list[tuple[Any, ...]]:
        struct = self._struct
        if not self._fast:
            return [spark_tuple(struct, v) for v in values]
        return [v if v.__class__ is tuple else spark_tuple(struct, v) for v in values]

    def _write(self, op: str, rows: list[tuple[Any, ...]]) -> None:
        st = self._state("Error updating value state")
        if not rows:
            # the JVM's text; Spark's worker loses its state server over it instead
            raise StateError(f"Error updating value state: [ILLEGAL_STATE_STORE_VALUE."
                             f"EMPTY_LIST_VALUE] Illegal value provided to the State Store "
                             f"Cannot write empty list values to State Store for StateName "
                             f"{self._stateName}. SQLSTATE: 42601 (statebackend: use clear() "
                             f"to remove the list)")
        try:
            getattr(st, op)(rows)
            return
        except SchemaError:
            pass  # Spark's conversion may make it fit, or raise Spark's error
        getattr(st, op)([spark_tuple(self._struct, v) for v in rows])

    def exists(self) -> bool:
        return self._state("Error checking value state exists").exists()

    def get(self) -> Iterator[tuple[Any, ...]]:
        # Spark's iterator ends quietly when the server answers with an error
        return iter(()) if self._st is None else self._st.get()

    # The general paths (Spark's conversion); bind() puts faster ones in front for plain
    # tuples while a state is bound.
    def put(self, newState: Iterable[Any]) -> None:  # noqa: N803 - PySpark's name
        self._write("put", self._rows(newState))

    def appendValue(self, newState: Any) -> None:  # noqa: N802, N803 - PySpark's names
        self._write("appendList", self._rows((newState,)))

    def appendList(self, newState: Iterable[Any]) -> None:  # noqa: N802, N803 - PySpark's names
        self._write("appendList", self._rows(newState))

    def clear(self) -> None:
        self._state("Error clearing value state").clear()


class SparkMapState(_SparkMapState):
    """PySpark's ``MapState`` over our :class:`~statebackend.state.map.MapState`.

    ``getValue`` returns a ``Row`` of the value schema, as Spark's does (the iterators
    give tuples, as Spark's do).
    """

    def __init__(self, name: str, key_struct: StructType, value_struct: StructType,  # noqa: D107
                 state: MapState | None) -> None:
        self._stateName = name
        self._key_struct = key_struct
        self._value_struct = value_struct
        self._names = list(value_struct.names)
        self._fast_key = not converts_always(key_struct)
        self._fast_value = not converts_always(value_struct)
        self.bind(state)

    def bind(self, state: MapState | None) -> None:
        """Point at ``state``; None: the state was deleted."""
        self._st = state
        reads = ("exists", "iterator", "keys", "values")
        for name in (*reads, "getValue", "containsKey", "updateValue", "removeKey"):
            # class methods again: Spark's empty iterators, errors and conversion
            self.__dict__.pop(name, None)
        if state is None:
            return
        for name in reads:
            setattr(self, name, getattr(state, name))
        cls = type(self)
        if self._fast_key:
            self.containsKey = _fast_one(  # type: ignore[method-assign]
                state.containsKey, cls.containsKey.__get__(self))
            self.removeKey = _fast_one(  # type: ignore[method-assign]
                state.removeKey, cls.removeKey.__get__(self))
            self.getValue = _fast_get(state.getValue, cls.getValue.__get__(self),  # type: ignore[method-assign]
                                      self._names)
            if self._fast_value:
                self.updateValue = _fast_one(  # type: ignore[method-assign]
                    state.updateValue, cls.updateValue.__get__(self))

    def _row(self, v: tuple[Any, ...] | None) -> Any:
        if v is None:
            return None
        row = tuple.__new__(Row, v)  # what _create_row makes, without Row's argument checks
        row.__fields__ = self._names
        return row

    def _call(self, client_text: str, op: str, key: Any, *value: Any) -> Any:
        k = key if key.__class__ is tuple and self._fast_key \
            else spark_tuple(self._key_struct, key)
        v = tuple(x if x.__class__ is tuple and self._fast_value
                  else spark_tuple(self._value_struct, x) for x in value)
        st = self._st
        if st is None:
            raise _not_initialized(client_text, "Map", self._stateName)
        method = getattr(st, op)
        try:
            return method(k, *v)
        except SchemaError:
            pass  # Spark's conversion may make it fit, or raise Spark's error
        return method(spark_tuple(self._key_struct, k),
                      *(spark_tuple(self._value_struct, x) for x in v))

    def exists(self) -> bool:
        if self._st is None:
            raise _not_initialized("Error checking map state exists", "Map", self._stateName)
        return self._st.exists()

    # The general paths (Spark's conversion); bind() puts faster ones in front for plain
    # tuples while a state is bound.
    def getValue(self, key: Any) -> Any:  # noqa: N802 - PySpark's name
        return self._row(self._call("Error getting value", "getValue", key))

    def containsKey(self, key: Any) -> bool:  # noqa: N802 - PySpark's name
        return self._call("Error checking if map state contains key", "containsKey",  # type: ignore[no-any-return]
                          key)

    def updateValue(self, key: Any, value: Any) -> None:  # noqa: N802 - PySpark's name
        self._call("Error updating map state value", "updateValue", key, value)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter(()) if self._st is None else self._st.iterator()

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter(()) if self._st is None else self._st.keys()

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter(()) if self._st is None else self._st.values()

    def removeKey(self, key: Any) -> None:  # noqa: N802 - PySpark's name
        self._call("Error removing key from map state", "removeKey", key)

    def clear(self) -> None:
        if self._st is None:
            raise _not_initialized("Error clearing map state", "Map", self._stateName)
        self._st.clear()


def timer_timestamp(ts: Any, message: str) -> int:
    """A timer's timestamp as Spark's client sends it: through the protobuf field, which
    takes what ``operator.index`` takes (numpy integers too), refuses floats, strings and
    bools with Spark's ``TypeError``, and reads None as 0. ``message`` names the protobuf
    message (``RegisterTimer`` or ``DeleteTimer``)."""
    if ts.__class__ is int and -(1 << 63) <= ts < (1 << 63):
        return ts  # type: ignore[no-any-return]
    import pyspark.sql.streaming.proto.StateMessage_pb2 as state_message

    return int(getattr(state_message, message)(expiryTimestampMs=ts).expiryTimestampMs)
