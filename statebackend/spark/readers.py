"""Readers that give the state as a Spark DataFrame: :func:`read_state` (a checkpoint's or
a savepoint's state, shaped like Spark's ``statestore`` source) and :func:`read_changes`
(the change feed between two checkpoints).

The driver reads only the record and the manifests; one Spark task per unit (a
partition, or a savepoint's data file) downloads, opens and decodes it on an executor
with the functions of :mod:`statebackend.read`, which never touch a session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from ..read.changes import changes_schema, plan_changes, select_change_units, unit_changes
from ..read.rows import (
    as_json_text,
    load_view,
    read_rows,
    read_unit,
    spark_row_shaper,
    spark_schema,
)
from ..read.views import select_states, select_units, user_key_schema, value_schema
from .session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_changes", "read_state", "unit_dataframe"]


def read_state(spark: SparkSession, checkpoint_location: str, operator_id: str,
               checkpoint_id: int | None = None, state_name: str | None = None, *,
               savepoint: str | None = None, storage_options: dict[str, Any] | None = None,
               key_types: Sequence[str] | None = None, partitions: Iterable[int] | None = None,
               distributed: bool = True) -> DataFrame:
    """The state of a completed checkpoint or a savepoint as a Spark DataFrame.

    Parameters
    ----------
    spark : SparkSession
        Session to build the DataFrame in.
    checkpoint_location : str
        The backend's root URL; with ``distributed`` the executors must reach it too.
    operator_id : str
        The operator's directory name.
    checkpoint_id : int, optional
        A completed checkpoint; defaults to the latest.
    state_name : str, optional
        One state (typed ``user_key`` and ``value`` structs); default every state, with
        ``user_key`` and ``value`` as JSON text.
    savepoint : str, optional
        Read this savepoint of the operator (its name) instead of a checkpoint.
    storage_options : dict, optional
        fsspec options of the location.
    key_types : sequence of str, optional
        Grouping-key types, for checkpoints that do not record them.
    partitions : iterable of int, optional
        Only these partitions (a savepoint's: its data files in key-group order).
    distributed : bool, default True
        One Spark task per partition (per data file of a savepoint) downloads, opens and
        decodes it on an executor; the driver reads only the record and manifests. False:
        every partition is read on the driver, one after the other, and the rows are sent
        to Spark from there (state that fits the driver; no executor access to storage).

    Returns
    -------
    pyspark.sql.DataFrame
        Columns ``partition_id, key, state_name, user_key, value, expiration_ms``; rows in
        partition order, then state, then key order (a list's elements in list order).
    """
    from ..storage import open_store

    if savepoint is not None and checkpoint_id is not None:
        raise StateError("read_state reads a checkpoint or a savepoint: give checkpoint_id "
                         "or savepoint, not both")
    store = open_store(checkpoint_location, storage_options=storage_options)
    view = load_view(store, operator_id, checkpoint_id, savepoint, key_types)
    schema = spark_schema(view, state_name)
    shape = spark_row_shaper(view, state_name)
    units = select_units(view, partitions)
    if not distributed:
        data = [shape(r) for r in read_rows(store, operator_id, state_name=state_name,
                                            partitions=partitions, view=view)]
        return spark.createDataFrame(data, schema)
    states, key_types_ = select_states(view, state_name), view.key_types

    def produce(i: int) -> Iterator[tuple[Any, ...]]:
        return map(shape, read_unit(store, operator_id, units[i], key_types_, states))

    return unit_dataframe(spark, len(units), schema, produce)




def read_changes(spark: SparkSession, checkpoint_location: str, operator_id: str,
                 from_id: int, to_id: int, state_name: str | None = None, *,
                 storage_options: dict[str, Any] | None = None,
                 key_types: Sequence[str] | None = None,
                 partitions: Iterable[int] | None = None) -> DataFrame:
    """The change feed from checkpoint ``from_id`` to ``to_id`` as a Spark DataFrame, one
    task per partition of ``to_id`` (the driver reads only records and manifests).

    Columns ``batch_id, operation, partition_id, key, state_name, user_key, value,
    expiration_ms``; ``user_key`` and ``value`` typed with ``state_name``, JSON text
    without. See the module docstring for what a row means. Parameters as
    :func:`change_rows`; the executors must reach ``checkpoint_location``.
    """
    from ..storage import open_store

    store = open_store(checkpoint_location, storage_options=storage_options)
    plan = plan_changes(store, operator_id, from_id, to_id, key_types=key_types)
    states = select_states(plan.view, state_name)
    units = select_change_units(plan, partitions)
    schema = changes_schema(plan, state_name)
    names = {d.name: (value_schema(d).names, getattr(user_key_schema(d), "names", ()))
             for d in plan.view.states.values()}
    typed = state_name is not None

    def produce(i: int) -> Iterator[tuple[Any, ...]]:
        for r in unit_changes(store, plan, units[i], states):
            if typed:
                yield (r.batch_id, r.operation, r.partition_id, r.key, r.state_name,
                       r.user_key, r.value, r.expiration_ms)
            else:
                vn, un = names[r.state_name]
                yield (r.batch_id, r.operation, r.partition_id, r.key, r.state_name,
                       as_json_text(un, r.user_key), as_json_text(vn, r.value), r.expiration_ms)

    return unit_dataframe(spark, len(units), schema, produce)


_ARROW_ROWS = 10_000  # rows per Arrow batch a task sends


def unit_dataframe(spark: SparkSession, n: int, schema: str,
                   produce: Callable[[int], Iterator[tuple[Any, ...]]]) -> DataFrame:
    """A DataFrame of ``schema`` with one partition (one task) per unit ``0..n-1``, whose
    rows are ``produce(i)`` computed on the executor.

    The rows travel to the JVM as Arrow batches (``mapInArrow``), several times faster than
    pickled rows. On a classic session, schemas with timestamps or maps go the pickled way
    (``createDataFrame`` of an RDD): that is how the driver reader converts them too (a
    naive datetime is local time there), so both readers give the same values. A Spark
    Connect session has no RDDs: there those values are converted as ``createDataFrame``
    would (:func:`_arrow_rows`) and go as Arrow batches too.
    """
    from pyspark.sql.types import _parse_datatype_string

    struct = _parse_datatype_string(schema)
    safe = _arrow_safe(struct)
    if not safe and not is_connect(spark):
        def rows(indexes: Iterable[int]) -> Iterator[tuple[Any, ...]]:
            for i in indexes:
                yield from produce(i)
        rdd = spark.sparkContext.parallelize(range(n), max(n, 1)).mapPartitions(rows)
        return spark.createDataFrame(rdd, struct)
    from pyspark.sql.pandas.types import to_arrow_schema

    # a Connect client gives Arrow timestamps the session's zone, as toPandas does
    zone = str(spark.conf.get("spark.sql.session.timeZone")) if is_connect(spark) else None
    arrow_schema = (to_arrow_schema(struct) if zone is None
                    else to_arrow_schema(struct, timezone=zone))
    convert = None if safe else _arrow_rows(struct)

    def batches(it: Iterator[Any]) -> Iterator[Any]:
        for b in it:
            for i in b.column(0).to_pylist():
                buf: list[tuple[Any, ...]] = []
                for row in produce(int(i)):
                    buf.append(row)
                    if len(buf) >= _ARROW_ROWS:
                        yield _record_batch(buf if convert is None else convert(buf),
                                            arrow_schema)
                        buf = []
                if buf:
                    yield _record_batch(buf if convert is None else convert(buf), arrow_schema)

    # spark.range splits 0..n-1 evenly: exactly one unit per partition
    return spark.range(0, n, 1, max(n, 1)).mapInArrow(batches, struct)


def _arrow_rows(struct: Any) -> Callable[[list[tuple[Any, ...]]], list[tuple[Any, ...]]]:
    """Rows -> rows whose values Arrow takes as ``createDataFrame`` reads them: a naive
    timestamp is local time (made aware, so Arrow does not read it as UTC), a map a list
    of (key, value) pairs; nested values converted the same way."""
    fields = [_value_converter(f.dataType) for f in struct.fields]

    def convert(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [tuple(v if c is None or v is None else c(v) for c, v in zip(fields, row))
                for row in rows]
    return convert


def _value_converter(t: Any) -> Callable[[Any], Any] | None:
    from pyspark.sql.types import ArrayType, MapType, Row, StructType, TimestampType

    if isinstance(t, TimestampType):
        def stamp(v: Any) -> Any:
            return v.astimezone() if getattr(v, "tzinfo", 1) is None else v
        return stamp
    if isinstance(t, MapType):
        kc, vc = _value_converter(t.keyType), _value_converter(t.valueType)
        return lambda m: [(k if kc is None else kc(k),
                           v if vc is None or v is None else vc(v)) for k, v in m.items()]
    if isinstance(t, ArrayType):
        ec = _value_converter(t.elementType)
        if ec is None:
            return None
        return lambda a: [e if e is None else ec(e) for e in a]
    if isinstance(t, StructType):
        subs = [(f.name, _value_converter(f.dataType)) for f in t.fields]
        if all(c is None for _, c in subs):
            return None

        def struct_value(v: Any) -> Any:
            items = v.asDict() if isinstance(v, Row) else (
                v if isinstance(v, dict) else dict(zip([n for n, _ in subs], v)))
            return {n: (items.get(n) if c is None or items.get(n) is None else c(items[n]))
                    for n, c in subs}
        return struct_value
    return None


def _record_batch(rows: list[tuple[Any, ...]], schema: Any) -> Any:
    import pyarrow as pa

    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


def _arrow_safe(t: Any) -> bool:
    from pyspark.sql.types import (
        ArrayType,
        MapType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    if isinstance(t, (TimestampType, TimestampNTZType, MapType)):
        return False
    if isinstance(t, StructType):
        return all(_arrow_safe(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return _arrow_safe(t.elementType)
    return True
