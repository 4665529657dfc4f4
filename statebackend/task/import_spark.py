"""Executor side of the move from Spark's own state store: each task writes one savepoint
data file of its partition from the rows Spark's ``statestore`` source exported.

The driver (:mod:`statebackend.spark.import_spark`) reads every state variable of a
``transformWithStateInPandas`` operator through Spark's ``statestore`` source, unions them
into one DataFrame (the grouping key's columns, the variable's index, one payload column per
variable) and routes it to our partitions by key group, as the input is routed
(:func:`statebackend.spark.plan.place`). Task ``p`` replays its rows into a scratch RocksDB
instance through the state layer (so every byte is written by the code that writes it in a
running query), with the clock set per row so that a TTL state keeps the expiry Spark
recorded, and writes the partition's key groups as one data file of a savepoint
(:func:`statebackend.savepoint.writer.write_data_file`). The rows never reach the driver: it
collects one small row per task naming the file.

Data files are named by partition and task attempt, so a retried or speculative attempt
never overwrites another's file (invariant 2); the driver names in the savepoint's manifest
the file of the attempt Spark kept.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import StateBackendError
from ..keys.grouping_key import encode_grouping_keys
from ..keys.groups import key_groups
from ..keys.ranges import key_group_range
from ..model.manifest import StateDescriptor
from ..rocksdb.instance import RocksDBInstance
from ..savepoint.format import data_file_name
from ..savepoint.writer import write_data_file
from ..state.backend import KeyedStateBackend
from .columns import KG_COL
from .context import check_rows_belong

__all__ = ["IMPORT_SCHEMA", "VAR", "ImportPlan", "StateVariable", "import_partition",
           "make_import_task", "payload_column", "peak_rss_mb"]

VAR = "__sb_var"
"""Column of the union: index of the state variable a row belongs to."""

# one row per task: what the driver collects
IMPORT_SCHEMA = ("partition BIGINT, file STRING, key_group_start BIGINT, key_group_end BIGINT, "
                 "size BIGINT, checksum STRING, entries BIGINT, raw_bytes BIGINT, "
                 "stored_bytes BIGINT, rows STRING, states STRING, peak_rss_mb DOUBLE")

#: The TTL a TTL state is declared with while importing: each write sets the clock to
#: ``expiry - IMPORT_TTL_MS`` so the value keeps Spark's expiry. A TTL's duration is
#: not part of a state's schema version (only whether it has one), so the processor's own
#: ``ttl`` applies to every later write.
IMPORT_TTL_MS = 1


def payload_column(index: int) -> str:
    return f"__sb_v{index}"


@dataclass(frozen=True)
class StateVariable:
    """One state variable of the exported operator.

    ``kind``: ``value``, ``list``, ``map`` or ``timers``; ``value_type`` and
    ``user_key_type``: pyspark DataTypes of the stored value (and of a map's user key);
    ``ttl``: Spark wrapped each value as ``struct<value, ttlExpirationMs>``.
    """

    name: str
    kind: str
    value_type: Any = None
    user_key_type: Any = None
    ttl: bool = False


@dataclass(frozen=True)
class ImportPlan:
    """What every import task needs (pickled to the executors)."""

    location: str
    storage_options: dict[str, Any]
    operator_id: str
    savepoint_dir: str  # relative to the operator's root
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    variables: tuple[StateVariable, ...]
    parallelism: int
    max_parallelism: int
    compression: str = "snappy"


def _converter(dt: Any) -> Callable[[Any], Any]:
    """``value -> value`` turning pyarrow's ``to_pylist`` form of type ``dt`` into what the
    state layer takes: structs as tuples (positional, as Spark's rows), maps as dicts
    (struct keys as tuples). Compiled once per variable, called per row."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(dt, StructType):
        fields = [(f.name, _converter(f.dataType)) for f in dt.fields]
        return lambda v: None if v is None else tuple(c(v[n]) for n, c in fields)
    if isinstance(dt, ArrayType):
        elem = _converter(dt.elementType)
        return lambda v: None if v is None else [elem(x) for x in v]
    if isinstance(dt, MapType):
        key, val = _converter(dt.keyType), _converter(dt.valueType)
        return lambda v: None if v is None else {key(k): val(x) for k, x in v}
    return lambda v: v


class _Clock:
    """The scratch backend's clock, set before each TTL write."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _declare(kb: KeyedStateBackend, v: StateVariable):
    ttl = IMPORT_TTL_MS if v.ttl else None
    if v.kind == "value":
        return kb.value_state(v.name, v.value_type, ttl_ms=ttl)
    if v.kind == "list":
        return kb.list_state(v.name, v.value_type, ttl_ms=ttl)
    if v.kind == "map":
        return kb.map_state(v.name, v.user_key_type, v.value_type, ttl_ms=ttl)
    return None  # timers: the backend's own service


def _apply(kb: KeyedStateBackend, clock: _Clock, v: StateVariable, state: Any,
           payload: Any) -> int:
    """Write one exported row's payload for the current key; the entries written."""
    if v.kind == "timers":
        kb.register_timer(int(payload))
        return 1
    if v.kind == "value":
        value = payload
        if v.ttl:
            value, clock.now = payload[0], int(payload[1]) - IMPORT_TTL_MS
        state.update(value)
        return 1
    if v.kind == "list":
        # one row per key (flattenCollectionTypes=false keeps the list's order); a run of
        # elements with one expiry is written at once
        if not v.ttl:
            state.put(payload)
            return len(payload)
        runs = itertools.groupby(payload, key=lambda e: int(e[1]) - IMPORT_TTL_MS)
        for i, (clock.now, run) in enumerate(runs):
            (state.appendList if i else state.put)([e[0] for e in run])
        return len(payload)
    user_key, value = payload
    if v.ttl:
        value, clock.now = value[0], int(value[1]) - IMPORT_TTL_MS
    state.updateValue(user_key, value)
    return 1


def _payload_type(v: StateVariable) -> Any:
    """The pyspark type of a variable's payload column (as the driver builds it)."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    if v.kind == "timers":
        return LongType()
    wrapped = v.value_type
    if v.ttl:
        wrapped = StructType([StructField("value", v.value_type),
                              StructField("ttlExpirationMs", LongType())])
    if v.kind == "list":
        return ArrayType(wrapped)
    if v.kind == "map":
        return StructType([StructField("user_map_key", v.user_key_type),
                           StructField("user_map_value", wrapped)])
    return wrapped


def import_partition(batches: Iterator[Any], plan: ImportPlan, partition: int,
                     attempt: str) -> dict[str, Any]:
    """Replay one partition's exported rows into a scratch instance and write its
    savepoint data file (uploaded under ``plan.savepoint_dir``); the row the driver
    collects, as a dict of :data:`IMPORT_SCHEMA`'s fields."""
    from ..storage.fsspec_store import open_store
    from ..storage.manifests import operator_store

    rng = key_group_range(partition, plan.parallelism, plan.max_parallelism)
    scratch = tempfile.mkdtemp(prefix="sb-import-")
    try:
        inst = RocksDBInstance(os.path.join(scratch, "db"))
        try:
            rows, descriptors = _replay(inst, batches, plan, partition)
            fname = data_file_name(rng.start, rng.end, attempt)
            local = os.path.join(scratch, fname)
            stats = write_data_file(inst, local, rng, plan.max_parallelism, descriptors,
                                    plan.compression)
        finally:
            inst.close()
        root = open_store(plan.location, storage_options=plan.storage_options or None)
        t = operator_store(root, plan.operator_id).put_file(
            local, f"{plan.savepoint_dir}/{fname}")
        return {"partition": partition, "file": fname, "key_group_start": rng.start,
                "key_group_end": rng.end, "size": t.size, "checksum": t.checksum,
                "entries": stats.entries, "raw_bytes": stats.raw_bytes,
                "stored_bytes": stats.stored_bytes,
                "rows": json.dumps({str(i): n for i, n in rows.items()}),
                "states": json.dumps([asdict(d) for d in descriptors]),
                "peak_rss_mb": peak_rss_mb()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def peak_rss_mb() -> float:
    """This process's peak resident memory (a Python worker's, over its life so far)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _replay(inst: RocksDBInstance, batches: Iterator[Any], plan: ImportPlan,
            partition: int) -> tuple[dict[int, int], list[StateDescriptor]]:
    """Write the rows of ``batches`` into ``inst`` (with the plan's states declared, rows
    or not); the rows read per variable index, and the declared states."""
    clock = _Clock()
    # writes only (a list's later run of elements reads the earlier one back): no read
    # cache, and small write batches; a worker replaying 600,000 keys of four states
    # peaked at 396 MB so against 573 MB with the defaults (RocksDB's memtables remain)
    kb = KeyedStateBackend(inst, clock=clock, monotonic_clock=False,
                           max_dirty_entries=10_000, max_cached_entries=0)
    states = [_declare(kb, v) for v in plan.variables]
    convert = [_converter(_payload_type(v)) for v in plan.variables]
    rng = key_group_range(partition, plan.parallelism, plan.max_parallelism)
    rows: dict[int, int] = {}
    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        columns = [batch.column(c) for c in plan.key_columns]
        # as the operator's tasks: Spark's key group where plan.place added it
        kgs = (batch.column(KG_COL).to_numpy(zero_copy_only=False)
               if KG_COL in batch.schema.names
               else key_groups(columns, plan.key_types, plan.max_parallelism))
        check_rows_belong(kgs, rng, partition)
        keys = encode_grouping_keys(columns, plan.key_types, kgs)
        var_of = batch.column(VAR).to_pylist()
        payloads = {i: batch.column(payload_column(i)).to_pylist()
                    for i in set(var_of)}
        for r in range(n):
            i = var_of[r]
            v = plan.variables[i]
            kb.set_current_key(keys[r])
            _apply(kb, clock, v, states[i], convert[i](payloads[i][r]))
            rows[i] = rows.get(i, 0) + 1
    kb.flush()
    descriptors = kb.descriptors()
    kb.close()
    return rows, descriptors


def make_import_task(plan: ImportPlan):
    """The ``mapInArrow`` function of the import job: partition ``p`` of the placed export
    is our partition ``p``."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:
            raise StateBackendError("the import from Spark's state store runs inside a "
                                    "Spark task")
        attempt = f"t{tc.taskAttemptId()}-a{tc.attemptNumber()}-{uuid.uuid4().hex[:8]}"
        row = import_partition(batches, plan, tc.partitionId(), attempt)
        yield pa.RecordBatch.from_pylist([row])

    return task
