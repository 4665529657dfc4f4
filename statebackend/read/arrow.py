"""State read on the driver, as Arrow: the typed columns of one state's values and user
keys (structs, structs of structs, arrays, maps at any depth), so ``statebackend read`` and
``statebackend changes`` write Parquet that reads back with the state's own types.

The decoded values are Python objects (a struct is a ``Row``, a map a ``dict``), from which
Arrow alone would infer a list for a struct and a struct for a map; here each nested column
gets the Arrow type of its declared schema and its values the shape that type takes (a
struct as a dict of its fields, a map as ``(key, value)`` pairs).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..model.schema import DataType, Schema
from .views import StateView, select_states, user_key_schema, value_schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["arrow_type", "frame_to_arrow", "json_default", "nested_as_json", "plain",
           "write_parquet"]

_PRIMITIVE = {"boolean": "bool_", "tinyint": "int8", "smallint": "int16", "int": "int32",
              "bigint": "int64", "float": "float32", "double": "float64", "date": "date32",
              "string": "string", "binary": "binary"}


def _nested(t: DataType) -> bool:
    return t.name in ("struct", "array", "map")


def arrow_type(t: DataType) -> pa.DataType:
    """The Arrow type of a state schema's type (nested at any depth)."""
    import pyarrow as pa

    if t.name == "decimal":
        return pa.decimal128(t.precision, t.scale)
    if t.name == "array":
        assert t.element is not None
        return pa.list_(pa.field("element", arrow_type(t.element), t.contains_null))
    if t.name == "map":
        assert t.key is not None and t.value is not None
        return pa.map_(pa.field("key", arrow_type(t.key), False),
                       pa.field("value", arrow_type(t.value), t.value_contains_null))
    if t.name == "struct":
        assert t.fields is not None
        return pa.struct([pa.field(f.name, arrow_type(f.type), f.nullable) for f in t.fields])
    if t.name in ("timestamp", "timestamp_ntz"):
        return pa.timestamp("us", tz="UTC" if t.name == "timestamp" else None)
    return getattr(pa, _PRIMITIVE[t.name])()


def _to_arrow_value(t: DataType) -> Callable[[Any], Any]:
    """``decoded value -> what pa.array takes for arrow_type(t)``."""
    if t.name == "struct":
        assert t.fields is not None
        convs = [(f.name, _to_arrow_value(f.type)) for f in t.fields]
        return lambda v: {n: None if x is None else c(x) for (n, c), x in zip(convs, v)}
    if t.name == "array":
        assert t.element is not None
        conv = _to_arrow_value(t.element)
        return lambda v: [None if x is None else conv(x) for x in v]
    if t.name == "map":
        assert t.key is not None and t.value is not None
        kc, vc = _to_arrow_value(t.key), _to_arrow_value(t.value)
        return lambda v: [(kc(k), None if x is None else vc(x)) for k, x in v.items()]
    return lambda v: v


def json_default(v: Any) -> Any:
    """How JSON text writes what JSON has no type for."""
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def plain(v: Any) -> Any:
    """A decoded value with its structs as dicts of their fields (``Row`` is a tuple,
    which JSON would write as a list, losing the field names), at every depth."""
    if hasattr(v, "__fields__") and isinstance(v, tuple):
        return {n: plain(x) for n, x in zip(v.__fields__, v)}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k if isinstance(k, (str, int, float, bool)) or k is None else json_default(k): plain(x)
                for k, x in v.items()}
    return v


def _typed_columns(view: StateView, state_name: str | None) -> dict[str, DataType]:
    """Frame column -> declared type, for the nested value and user-key columns."""
    if state_name is None:  # several states: values are JSON text
        return {}
    d = select_states(view, state_name)[0]
    out = {f"value.{f.name}": f.type for f in value_schema(d).fields if _nested(f.type)}
    uk: Schema | None = user_key_schema(d)
    if uk is not None:
        out.update({f"user_key.{f.name}": f.type for f in uk.fields if _nested(f.type)})
    return out


def frame_to_arrow(frame: pd.DataFrame, view: StateView, state_name: str | None) -> pa.Table:
    """``frame`` (from :func:`~.read_state.rows_to_pandas` or the change feed's) as an
    Arrow table whose nested columns have their declared types."""
    import pyarrow as pa

    typed = _typed_columns(view, state_name)
    # the other columns as pandas writes them (its metadata keeps nullable ints nullable)
    table = pa.Table.from_pandas(frame[[c for c in frame.columns if c not in typed]],
                                 preserve_index=False)
    for i, col in enumerate(frame.columns):
        t = typed.get(col)
        if t is not None:
            conv = _to_arrow_value(t)
            arr = pa.array([None if v is None else conv(v) for v in _objects(frame[col])],
                           type=arrow_type(t))
            table = table.add_column(i, pa.field(str(col), arr.type), arr)
    return table


def _objects(col: pd.Series) -> Iterable[Any]:
    return (None if v is None or (isinstance(v, float) and v != v) else v for v in col)


def write_parquet(frame: pd.DataFrame, view: StateView, state_name: str | None,
                  path: str) -> None:
    """Write ``frame`` to the Parquet file ``path`` (see :func:`frame_to_arrow`)."""
    import pyarrow.parquet as pq

    pq.write_table(frame_to_arrow(frame, view, state_name), path)


def nested_as_json(frame: pd.DataFrame, view: StateView, state_name: str | None
                   ) -> pd.DataFrame:
    """``frame`` with its nested value and user-key columns as JSON text (for CSV, which
    would otherwise hold Python reprs)."""
    typed = _typed_columns(view, state_name)
    if not typed:
        return frame
    out = frame.copy()
    for col in typed:
        out[col] = [None if v is None else json.dumps(plain(v), default=json_default)
                    for v in _objects(frame[col])]
    return out
