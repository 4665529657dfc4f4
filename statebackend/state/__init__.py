"""The user-facing keyed state API: value, list, map, reducing and aggregating states,
TTL and timers, over one RocksDB instance per partition."""

from ..model.schema import DataType, Field, Schema, parse_ddl, to_schema
from .backend import KeyedStateBackend
from .list import ListState
from .map import MapState
from .reducing import AggregateFunction, AggregatingState, ReducingState
from .value import ValueState

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "DataType",
    "Field",
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "ReducingState",
    "Schema",
    "ValueState",
    "parse_ddl",
    "to_schema",
]
