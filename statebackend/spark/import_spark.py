"""The one-step move from Spark's own state store: a savepoint of our operator written from
a stopped ``transformWithStateInPandas`` query's state, read through Spark's
``statestore`` source.

What is read: Spark's ``state-metadata`` source names the operator's state variables, their
kinds and whether they have a TTL; each variable is read with ``statestore``
(``stateVarName``; lists with ``flattenCollectionTypes=false`` so their order is Spark's),
the registered timers with ``readRegisteredTimers``; all at one committed batch (the last
by default). The union is routed to our partitions by key group in one Spark job whose
tasks write the savepoint's data files (:mod:`statebackend.task.import_spark`); the driver
collects one row per partition and publishes ``_SAVEPOINT.json`` last (invariant 3). A TTL
state keeps each value's, element's and entry's expiry; timers keep their times.

The new query starts from the savepoint (``from_savepoint=``) with a new Spark checkpoint
location: see docs/migration.md.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointNotFoundError, MoveRefusedError, OptionsError
from ..model.manifest import StateDescriptor, check_component
from ..redact import redact_url
from ..savepoint.format import SAVEPOINT_MANIFEST, SavepointManifest
from ..savepoint.writer import merge_state, refuse_existing, savepoint_dir
from ..storage.base import DurableStore
from ..storage.manifests import operator_store
from ..storage.records import listed_records
from ..task.columns import KeySpec
from ..task.import_spark import (
    IMPORT_SCHEMA,
    VAR,
    ImportPlan,
    StateVariable,
    import_partition,
    make_import_task,
    payload_column,
)
from . import plan as plans

log = logging.getLogger("statebackend")

__all__ = ["ImportStep", "TWS_OPERATORS", "import_spark_state", "spark_state_variables"]

#: Names Spark's operator metadata gives a transformWithState operator.
TWS_OPERATORS = frozenset({"transformWithStateInPandasExec", "transformWithStateExec",
                           "transformWithStateInPySparkExec"})
_KINDS = {"ValueState": "value", "ListState": "list", "MapState": "map",
          "TimerState": "timers"}


@dataclass(frozen=True)
class ImportStep:
    """What an import wrote and how to start the new query.

    Attributes
    ----------
    operator_id : str
    savepoint : str
        The savepoint's name (``from_savepoint=`` of a backend on ``state_location``).
    state_location : str
    batch_id : int | None
        Spark's committed batch the state was read at (None: Spark's latest).
    rows : dict
        Rows Spark exported per state variable (``$timers`` for the timers).
    entries : int
        Entries written to the savepoint.
    worker_peak_mb : float
        The highest peak resident memory of a Python worker that wrote a partition.
    seconds : float
    restart : str
        The restart step as text, with a Python snippet.
    """

    operator_id: str
    savepoint: str
    state_location: str
    batch_id: int | None
    rows: dict[str, int]
    entries: int
    worker_peak_mb: float
    seconds: float
    restart: str


def _metadata_row(spark: Any, spark_checkpoint: str, spark_operator_id: int) -> Any:
    try:
        rows = spark.read.format("state-metadata").load(spark_checkpoint).collect()
    except Exception as exc:  # noqa: BLE001 - Py4J / Connect errors: typed below
        raise CheckpointNotFoundError(
            f"{redact_url(spark_checkpoint)} is not a Spark streaming checkpoint with state "
            f"Spark's state-metadata source can read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); pass the checkpointLocation "
            f"of the stopped query") from exc
    if not rows:
        raise CheckpointNotFoundError(
            f"{redact_url(spark_checkpoint)} holds no stateful operator's state (Spark's "
            f"state-metadata source finds none); pass the checkpointLocation of the stopped "
            f"query")
    mine = [r for r in rows if int(r["operatorId"]) == spark_operator_id]
    if not mine:
        have = sorted({int(r["operatorId"]) for r in rows})
        raise CheckpointNotFoundError(
            f"{redact_url(spark_checkpoint)} has no stateful operator {spark_operator_id} "
            f"(operators with state: {have})")
    row = mine[0]
    if row["operatorName"] not in TWS_OPERATORS:
        raise MoveRefusedError(
            f"Spark operator {spark_operator_id} of {redact_url(spark_checkpoint)} is "
            f"{row['operatorName']}, not a transformWithState operator: only "
            f"transformWithStateInPandas state is moved (replay the source for others, "
            f"docs/migration.md)")
    return row


def spark_state_variables(spark: Any, spark_checkpoint: str, spark_operator_id: int = 0,
                          batch_id: int | None = None) -> tuple[Any, list[StateVariable],
                                                                dict[str, Any]]:
    """The grouping key's StructType, the state variables and each one's DataFrame (as
    :func:`_union` takes them) of a Spark transformWithState operator."""
    from pyspark.sql import functions as F

    row = _metadata_row(spark, spark_checkpoint, spark_operator_id)
    props = json.loads(row["operatorProperties"] or "{}")
    variables: list[StateVariable] = []
    frames: dict[str, Any] = {}
    key_type = None
    timers_seen = False
    for sv in props.get("stateVariables", []):
        kind = _KINDS.get(sv.get("stateVariableType"))
        name = sv.get("stateName", "")
        if kind is None:
            raise MoveRefusedError(f"state variable {name!r} of Spark operator "
                                   f"{spark_operator_id} has type "
                                   f"{sv.get('stateVariableType')!r}, which is not moved")
        if kind == "timers":
            if timers_seen:
                continue
            timers_seen = True
            df = _reader(spark, spark_operator_id, batch_id).option(
                "readRegisteredTimers", "true").load(spark_checkpoint)
            name = "$timers"
            variables.append(StateVariable(name, "timers"))
            frames[name] = df.select("key", F.col("expiration_timestamp_ms").alias("payload"))
        else:
            df = _reader(spark, spark_operator_id, batch_id).option(
                "stateVarName", name).option("flattenCollectionTypes",
                                             "true" if kind == "map" else "false"
                                             ).load(spark_checkpoint)
            ttl = bool(sv.get("ttlEnabled"))
            variables.append(_variable(name, kind, ttl, df.schema))
            frames[name] = df.select("key", _payload_column(kind).alias("payload"))
        key_type = key_type or df.schema["key"].dataType
    if key_type is None:
        raise MoveRefusedError(f"Spark operator {spark_operator_id} of "
                               f"{redact_url(spark_checkpoint)} declares no state variable")
    return key_type, variables, frames


def _reader(spark: Any, spark_operator_id: int, batch_id: int | None) -> Any:
    r = spark.read.format("statestore").option("operatorId", str(spark_operator_id))
    return r if batch_id is None else r.option("batchId", str(batch_id))


def _payload_column(kind: str) -> Any:
    from pyspark.sql import functions as F

    if kind == "value":
        return F.col("value")
    if kind == "list":
        return F.col("list_value")
    return F.struct(F.col("user_map_key"), F.col("user_map_value"))


def _variable(name: str, kind: str, ttl: bool, schema: Any) -> StateVariable:
    """The variable's value type (Spark's ``struct<value, ttlExpirationMs>`` unwrapped)."""
    col = {"value": "value", "list": "list_value", "map": "user_map_value"}[kind]
    t = schema[col].dataType
    if kind == "list":
        t = t.elementType
    if ttl:
        t = t["value"].dataType
    user_key = schema["user_map_key"].dataType if kind == "map" else None
    return StateVariable(name, kind, t, user_key, ttl)


def _union(key_type: Any, variables: list[StateVariable], frames: dict[str, Any]
           ) -> tuple[Any, KeySpec]:
    """One DataFrame of every variable's rows: the key's columns, the variable's index and
    one payload column per variable (null in the others' rows)."""
    from pyspark.sql import functions as F

    key_cols = [f.name for f in key_type.fields]
    out = None
    for i, v in enumerate(variables):
        df = frames[v.name].select(*[F.col("key")[c].alias(c) for c in key_cols],
                                   F.lit(i).alias(VAR), F.col("payload").alias(payload_column(i)))
        out = df if out is None else out.unionByName(df, allowMissingColumns=True)
    key = KeySpec(tuple(key_cols), tuple(plans.spark_type_name(f.dataType)
                                         for f in key_type.fields))
    return out, key


def import_spark_state(spark: Any, store: DurableStore, location: str, operator_id: str,
                       spark_checkpoint: str, *, parallelism: int, max_parallelism: int,
                       storage_options: dict[str, Any] | None = None,
                       spark_operator_id: int = 0, batch_id: int | None = None,
                       name: str = "from-spark", compression: str = "snappy") -> ImportStep:
    """Write savepoint ``name`` of ``operator_id`` under ``location`` from the state of
    Spark operator ``spark_operator_id`` in the stopped query's ``spark_checkpoint``.

    Raises
    ------
    CheckpointNotFoundError
        ``spark_checkpoint`` has no state Spark's sources can read, or no such operator.
    MoveRefusedError
        The operator is not a transformWithState operator, or ``operator_id`` already has
        a checkpoint under ``location`` (the savepoint would never be read). Nothing is
        written.
    StorageError
        A savepoint of that name exists, or an upload failed (nothing published).
    """
    t0 = time.perf_counter()
    check_component(name)
    if not isinstance(spark_operator_id, int) or spark_operator_id < 0:
        raise OptionsError("spark_operator_id", spark_operator_id,
                           "the Spark operator's id (0 for a query's first stateful operator)")
    op_store = operator_store(store, operator_id)
    if listed_records(store, operator_id):
        raise MoveRefusedError(
            f"operator {operator_id!r} already has state under {redact_url(location)}: a "
            f"savepoint is only read by an operator without a checkpoint; import into a "
            f"new location (or another operator_id)")
    refuse_existing(op_store, operator_id, name)
    key_type, variables, frames = spark_state_variables(spark, spark_checkpoint,
                                                         spark_operator_id, batch_id)
    union, key = _union(key_type, variables, frames)
    sp_dir = savepoint_dir(name)
    plan = ImportPlan(location=location, storage_options=dict(storage_options or {}),
                      operator_id=operator_id, savepoint_dir=sp_dir,
                      key_columns=key.columns, key_types=key.types,
                      variables=tuple(variables), parallelism=parallelism,
                      max_parallelism=max_parallelism, compression=compression)
    try:
        by_partition = _write_files(op_store, plan, plans.place(union, key, parallelism,
                                                                max_parallelism))
        manifest = _manifest(plan, name, by_partition, spark_checkpoint, spark_operator_id,
                             batch_id, t0)
        _publish(op_store, sp_dir, manifest)
    except BaseException:
        _discard(op_store, sp_dir)  # a failed import leaves no half-written savepoint
        raise
    rows = {v.name: sum(json.loads(r["rows"]).get(str(i), 0) for r in by_partition.values())
            for i, v in enumerate(variables)}
    entries = int(manifest.metrics["entries"])
    log.info("imported Spark operator %d of %s into savepoint %s of %s: %d entries in "
             "%.1f s", spark_operator_id, redact_url(spark_checkpoint), name, operator_id,
             entries, time.perf_counter() - t0)
    peak = max((float(r.get("peak_rss_mb") or 0) for r in by_partition.values()), default=0)
    return ImportStep(operator_id, name, location, batch_id, rows, entries, peak,
                      time.perf_counter() - t0,
                      restart_step(location, operator_id, name))


def _publish(op_store: DurableStore, sp_dir: str, manifest: SavepointManifest) -> None:
    """Delete the files of attempts Spark did not keep (a retried or speculative task's),
    then publish the manifest (last: invariant 3)."""
    named = {f"{sp_dir}/{f}" for f in manifest.files}
    stray = [p for p in op_store.list_dir(sp_dir) if p not in named]
    if stray:
        op_store.delete(stray)
    op_store.put_bytes_atomic(f"{sp_dir}/{SAVEPOINT_MANIFEST}", manifest.to_json())


def _discard(op_store: DurableStore, sp_dir: str) -> None:
    """Best effort: delete what a failed import wrote (it was never published)."""
    try:
        written = op_store.list_dir(sp_dir)
        if written:
            op_store.delete(written)
    except Exception as exc:  # noqa: BLE001 - the import's own error is the one to raise
        log.warning("could not delete the unpublished savepoint files under %s (%s); "
                    "delete them, or import under another name", sp_dir, exc)


def _write_files(op_store: DurableStore, plan: ImportPlan, placed: Any
                 ) -> dict[int, dict[str, Any]]:
    """Run the import job (its progress is Spark's: one stage of ``parallelism`` tasks);
    the row of each partition's data file (written by the driver for a partition Spark ran
    no task for)."""
    written = placed.mapInArrow(make_import_task(plan), IMPORT_SCHEMA).collect()
    by_partition = {int(r["partition"]): r.asDict() for r in written}
    for p in range(plan.parallelism):
        if p not in by_partition:
            by_partition[p] = import_partition(iter(()), plan, p, "driver")
    return by_partition


def _manifest(plan: ImportPlan, name: str, by_partition: dict[int, dict[str, Any]],
              spark_checkpoint: str, spark_operator_id: int, batch_id: int | None,
              t0: float) -> SavepointManifest:
    files: dict[str, dict[str, Any]] = {}
    states: dict[str, StateDescriptor] = {}
    totals = {"entries": 0, "raw_bytes": 0, "stored_bytes": 0}
    for p in sorted(by_partition):
        r = by_partition[p]
        files[r["file"]] = {"key_group_start": int(r["key_group_start"]),
                            "key_group_end": int(r["key_group_end"]), "size": int(r["size"]),
                            "checksum": r["checksum"], "partition": p,
                            "entries": int(r["entries"])}
        for d in (StateDescriptor(**s) for s in json.loads(r["states"])):
            merge_state(states, d)
        for k in totals:
            totals[k] += int(r[k])
    return SavepointManifest(
        name=name, operator_id=plan.operator_id, checkpoint_id=None,
        parallelism=plan.parallelism, max_parallelism=plan.max_parallelism,
        compression=plan.compression, files=files,
        states=tuple(states[k] for k in sorted(states)),
        metrics={**totals, "seconds": time.perf_counter() - t0,
                 "key_columns": list(plan.key_columns), "key_types": list(plan.key_types),
                 "imported_from": {"spark_checkpoint": redact_url(spark_checkpoint),
                                   "spark_operator_id": spark_operator_id,
                                   "batch_id": batch_id}},
        created_at_ms=int(time.time() * 1000))


def restart_step(location: str, operator_id: str, name: str) -> str:
    """The step after an import, as text."""
    loc = redact_url(location)
    return (f"Savepoint {name!r} of operator {operator_id!r} written under {loc}.\n"
            f"Start the query on our backend from it, with a NEW Spark checkpointLocation "
            f"(the old one holds Spark's operator) and the source positioned where the old "
            f"query stopped (docs/migration.md):\n\n"
            f"    backend = RocksDBStateBackend({loc!r}, from_savepoint={name!r})\n"
            f"    out = backend.transform_with_state(df.groupBy(...), MyProcessor(), schema,\n"
            f"                                       outputMode, timeMode, "
            f"operator_id={operator_id!r})\n")
