"""Read the keyed state of a completed checkpoint: as rows (no Spark needed), as pandas,
or as a Spark DataFrame shaped like Spark's ``statestore`` data source.

Each partition's files are downloaded (size and CRC32 verified) into a private temporary
directory, opened there with :class:`~statebackend.rocksdb.instance.RocksDBInstance` and
scanned; the durable checkpoint is only read, and the temporary copy is removed after the
partition is read. Values are decoded with the codecs of the state descriptors the
manifests record; grouping keys with the key types the runner records in every manifest's
metrics (``key_types``, ``key_columns``).

One row per stored entry:

==============  =============================================================
partition_id    the partition that holds the key
key             the grouping key (a struct of the grouping columns)
state_name      the declared state's name (``_timers`` for timers)
user_key        the map state's user key; null for other kinds
value           the value; a list state gives one row per element, in order
expiration_ms   the TTL expiry of the entry (null without TTL)
==============  =============================================================

With ``state_name`` given, ``user_key`` and ``value`` are structs of that state's
schemas; without it (every state at once, with different schemas) they are JSON text.
The reading happens on the driver (or in the CLI's process): it is a debugging and
migration tool, sized for state that fits one machine's disk, not a scan of a huge store.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint.manifest import CompletedCheckpoint, PartitionManifest, StateDescriptor
from ..checkpoint.restore import open_checkpoint
from ..errors import CorruptStateError, StateBackendError, StateError
from ..keycodec import decode_grouping_key
from ..progress import ProgressFn
from ..rocksdb.instance import RocksDBInstance
from ..state.base import EXPIRY
from ..state.codec import RowCodec, compile_codec
from ..state.layout import decode_ts, split_composite
from ..state.list import _elements
from ..state.schema import Schema, parse_ddl
from ..state.timers import TIMERS_CF
from ..state.value import decode_block
from ..storage.base import DurableStore
from ..storage.manifests import operator_store, read_recorded_manifests

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "StateRow",
    "load_checkpoint",
    "read_partition",
    "read_rows",
    "read_state",
    "rows_to_pandas",
    "spark_schema",
]

log = logging.getLogger(__name__)

TIMER_SCHEMA = "ts BIGINT"
_VALUE_KINDS = ("value", "reducing", "aggregating")


@dataclass(frozen=True)
class StateRow:
    """One stored entry of a state."""

    partition_id: int
    key: tuple[Any, ...]
    state_name: str
    user_key: tuple[Any, ...] | None
    value: tuple[Any, ...]
    expiration_ms: int | None


@dataclass(frozen=True)
class CheckpointView:
    """A completed checkpoint's record and chosen manifests, with what decoding needs."""

    record: CompletedCheckpoint
    manifests: dict[int, PartitionManifest]
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    states: dict[str, StateDescriptor]


def load_checkpoint(store: DurableStore, operator_id: str, checkpoint_id: int | None = None,
                    *, key_types: Sequence[str] | None = None) -> CheckpointView:
    """Read the record and manifests of a completed checkpoint (the latest by default).

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator's directory name.
    checkpoint_id : int, optional
        A completed checkpoint; defaults to the latest one.
    key_types : sequence of str, optional
        Spark type names of the grouping columns, for checkpoints whose manifests do not
        record them.

    Raises
    ------
    CheckpointNotFoundError
        No such completed checkpoint.
    CorruptStateError
        The manifests disagree on a state's schema or on the key types.
    StateError
        The key types are neither recorded nor given.
    """
    from ..coordinator import require_completed_record

    ostore = operator_store(store, operator_id)
    record = require_completed_record(store, operator_id, checkpoint_id)
    manifests = read_recorded_manifests(ostore, record)
    states: dict[str, StateDescriptor] = {}
    recorded: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for m in manifests.values():
        for d in m.states:
            old = states.setdefault(d.name, d)
            if (old.kind, old.value_schema, old.user_key_schema) != \
                    (d.kind, d.value_schema, d.user_key_schema):
                raise CorruptStateError(f"checkpoint {record.checkpoint_id}: state {d.name!r} "
                                        f"has different schemas in different partitions",
                                        checkpoint_id=record.checkpoint_id, path=m.path)
        if m.metrics.get("key_types") is not None:
            recorded.add((tuple(m.metrics["key_types"]),
                          tuple(m.metrics.get("key_columns") or ())))
    if len(recorded) > 1:
        raise CorruptStateError(f"checkpoint {record.checkpoint_id}: partitions record "
                                f"different grouping-key types {sorted(recorded)}",
                                checkpoint_id=record.checkpoint_id)
    types: tuple[str, ...]
    columns: tuple[str, ...] = ()
    if key_types is not None:
        types = tuple(key_types)
    elif recorded:
        types, columns = next(iter(recorded))
    else:
        raise StateError(f"checkpoint {record.checkpoint_id} of {operator_id!r} does not "
                         f"record its grouping-key types (written by an older version); pass "
                         f"them, e.g. key_types=['string'] (CLI: --key-types string)")
    if len(columns) != len(types):
        columns = tuple(f"key_{i}" for i in range(len(types)))
    return CheckpointView(record, manifests, columns, types, states)


def select_states(view: CheckpointView, state_name: str | None) -> list[StateDescriptor]:
    """The descriptors to read: one named state, or every state (timers included)."""
    if state_name is None:
        return [view.states[n] for n in sorted(view.states)]
    d = view.states.get(state_name)
    if d is None:
        raise StateError(f"checkpoint {view.record.checkpoint_id} of "
                         f"{view.record.operator_id!r} has no state {state_name!r}; its states "
                         f"are {sorted(view.states)}")
    return [d]


def value_schema(d: StateDescriptor) -> Schema:
    return parse_ddl(TIMER_SCHEMA if d.kind == "timers" else d.value_schema or "")


def user_key_schema(d: StateDescriptor) -> Schema | None:
    return parse_ddl(d.user_key_schema) if d.kind == "map" and d.user_key_schema else None


def read_partition(instance: RocksDBInstance, partition: int, key_types: Sequence[str],
                   states: Iterable[StateDescriptor]) -> Iterator[StateRow]:
    """Decode every entry of ``states`` in an open instance, in key order per state."""
    types = list(key_types)
    existing = set(instance.column_family_names())
    for d in states:
        if d.name not in existing:
            continue  # declared elsewhere, never written here
        yield from _read_cf(instance, partition, types, d)


def _read_cf(instance: RocksDBInstance, partition: int, types: list[str],
             d: StateDescriptor) -> Iterator[StateRow]:
    ttl = d.ttl_ms is not None
    codec: RowCodec = compile_codec(value_schema(d), f"state {d.name!r}")
    decode = codec.decode
    ukey = user_key_schema(d)
    key_decode = compile_codec(ukey, f"map state {d.name!r} user key").decode if ukey else None
    name = d.name

    def split(raw: bytes) -> tuple[int | None, bytes]:
        if ttl:
            return EXPIRY.unpack_from(raw)[0], raw[8:]
        return None, raw

    for k, raw in instance.scan_range(d.name, b"", None):
        if d.kind == "blocks":
            for gk, payload in sorted(decode_block(d.name, k, raw).items()):
                yield StateRow(partition, decode_grouping_key(gk, types)[1], name, None,
                               decode(payload), None)
        elif d.kind in _VALUE_KINDS:
            key = decode_grouping_key(k, types)[1]
            exp, payload = split(raw)
            yield StateRow(partition, key, name, None, decode(payload), exp)
        elif d.kind == "list":
            key = decode_grouping_key(k, types)[1]
            for e in _elements(raw):
                exp, payload = split(e)
                yield StateRow(partition, key, name, None, decode(payload), exp)
        elif d.kind == "map":
            gk, part = split_composite(k)
            key = decode_grouping_key(gk, types)[1]
            exp, payload = split(raw)
            assert key_decode is not None
            yield StateRow(partition, key, name, key_decode(part), decode(payload), exp)
        elif d.kind == "timers" and name == TIMERS_CF:
            gk, part = split_composite(k)
            yield StateRow(partition, decode_grouping_key(gk, types)[1], name, None,
                           (decode_ts(part),), None)
        else:
            raise StateError(f"state {name!r} has kind {d.kind!r}, which this reader does "
                             f"not know")


def read_rows(store: DurableStore, operator_id: str, checkpoint_id: int | None = None,
              state_name: str | None = None, *, partitions: Iterable[int] | None = None,
              key_types: Sequence[str] | None = None, temp_dir: str | None = None,
              progress: ProgressFn | None = None,
              view: CheckpointView | None = None) -> Iterator[StateRow]:
    """Every stored entry of a completed checkpoint (or of some of its partitions).

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator's directory name.
    checkpoint_id : int, optional
        Defaults to the latest completed checkpoint.
    state_name : str, optional
        Only this state (default: all, timers included).
    partitions : iterable of int, optional
        Only these partitions (default: all).
    key_types : sequence of str, optional
        See :func:`load_checkpoint`.
    temp_dir : str, optional
        Where the partition copies are downloaded (default: the system temp dir).
    progress : callable, optional
        ``progress(partitions, total, bytes, total_bytes)`` after each partition (bytes:
        the partitions' checkpoint files); see :mod:`statebackend.progress`.
    view : CheckpointView, optional
        An already loaded checkpoint (then the ids above are not read again).

    Raises
    ------
    CheckpointNotFoundError, CorruptStateError, StateError
        See :func:`load_checkpoint`; a durable file that is missing or fails its checksum
        raises :class:`CorruptStateError` naming it.
    """
    view = view or load_checkpoint(store, operator_id, checkpoint_id, key_types=key_types)
    states = select_states(view, state_name)
    wanted = sorted(view.manifests) if partitions is None else sorted(set(partitions))
    unknown = [p for p in wanted if p not in view.manifests]
    if unknown:
        raise StateError(f"checkpoint {view.record.checkpoint_id} has partitions "
                         f"0..{view.record.parallelism - 1}; no partition {unknown}")
    ostore = operator_store(store, operator_id)
    total_bytes = sum(view.manifests[p].full_size for p in wanted)
    done_bytes = 0
    for i, p in enumerate(wanted):
        m = view.manifests[p]
        tmp = tempfile.mkdtemp(prefix=f"sb-read-p{p}-", dir=temp_dir)
        try:
            with open_checkpoint(ostore, m, tmp) as inst:
                yield from read_partition(inst, p, view.key_types, states)
        except StateBackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception
            # files that passed their checksums but do not open or read back (e.g. a
            # manifest missing an SST its RocksDB MANIFEST needs): typed, naming the files
            raise CorruptStateError(
                f"checkpoint {m.checkpoint_id} partition {p}: RocksDB cannot open or read "
                f"the state of {m.path} ({type(exc).__name__}: {exc}); 'statebackend verify' "
                f"names what is wrong", checkpoint_id=m.checkpoint_id, partition=p,
                path=m.path) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        done_bytes += m.full_size
        if progress is not None:
            progress(i + 1, len(wanted), done_bytes, total_bytes)


# --- shapes: pandas and Spark ----------------------------------------------------------


def _json_default(v: Any) -> Any:
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def _as_json(names: Sequence[str], values: tuple[Any, ...] | None) -> str | None:
    if values is None:
        return None
    return json.dumps(dict(zip(names, values)), default=_json_default, sort_keys=False)


def rows_to_pandas(rows: Iterable[StateRow], view: CheckpointView,
                   state_name: str | None = None) -> pd.DataFrame:
    """Flat frame of ``rows``: ``partition_id``, ``key.<column>``..., ``state_name``, then
    ``user_key.<field>``/``value.<field>`` columns for one state, or ``user_key``/``value``
    JSON text for several."""
    import pandas as pd

    key_cols = [f"key.{c}" for c in view.key_columns]
    records: list[dict[str, Any]] = []
    if state_name is not None:
        d = select_states(view, state_name)[0]
        vnames = value_schema(d).names
        uk = user_key_schema(d)
        unames = uk.names if uk is not None else ()
        columns = (["partition_id", *key_cols, "state_name"] + [f"user_key.{n}" for n in unames]
                   + [f"value.{n}" for n in vnames] + ["expiration_ms"])
        for r in rows:
            rec: dict[str, Any] = {"partition_id": r.partition_id, "state_name": r.state_name,
                                   "expiration_ms": r.expiration_ms}
            rec.update(zip(key_cols, r.key))
            if r.user_key is not None:
                rec.update(zip([f"user_key.{n}" for n in unames], r.user_key))
            rec.update(zip([f"value.{n}" for n in vnames], r.value))
            records.append(rec)
    else:
        names = {d.name: (value_schema(d).names,
                          getattr(user_key_schema(d), "names", ())) for d in view.states.values()}
        columns = ["partition_id", *key_cols, "state_name", "user_key", "value", "expiration_ms"]
        for r in rows:
            vn, un = names[r.state_name]
            rec = {"partition_id": r.partition_id, "state_name": r.state_name,
                   "user_key": _as_json(un, r.user_key), "value": _as_json(vn, r.value),
                   "expiration_ms": r.expiration_ms}
            rec.update(zip(key_cols, r.key))
            records.append(rec)
    frame = pd.DataFrame.from_records(records, columns=columns)
    # nullable ints: a missing expiry must not turn the column into floats
    frame["expiration_ms"] = frame["expiration_ms"].astype("Int64")
    frame["partition_id"] = frame["partition_id"].astype("int32")
    return frame


def _struct_ddl(schema: Schema | None, names: Sequence[str] | None = None,
                types: Sequence[str] | None = None) -> str:
    if schema is not None:
        pairs = [(f.name, f.type.ddl()) for f in schema.fields]
    else:
        assert names is not None and types is not None
        pairs = list(zip(names, types))
    inner = ", ".join(f"`{n.replace('`', '``')}`: {t}" for n, t in pairs)
    return f"STRUCT<{inner}>"


def spark_schema(view: CheckpointView, state_name: str | None = None) -> str:
    """The DDL of the DataFrame :func:`read_state` returns."""
    key = _struct_ddl(None, view.key_columns, [t.upper() for t in view.key_types])
    if state_name is None:
        uk = value = "STRING"
    else:
        d = select_states(view, state_name)[0]
        u = user_key_schema(d)
        uk = _struct_ddl(u) if u is not None else "STRING"  # always null: not a map state
        value = _struct_ddl(value_schema(d))
    return (f"partition_id INT, key {key}, state_name STRING, user_key {uk}, "
            f"value {value}, expiration_ms BIGINT")


def read_state(spark: SparkSession, checkpoint_location: str, operator_id: str,
               checkpoint_id: int | None = None, state_name: str | None = None, *,
               storage_options: dict[str, Any] | None = None,
               key_types: Sequence[str] | None = None) -> DataFrame:
    """The state of a completed checkpoint as a Spark DataFrame.

    Parameters
    ----------
    spark : SparkSession
        Session to build the DataFrame in.
    checkpoint_location : str
        The backend's root URL.
    operator_id : str
        The operator's directory name.
    checkpoint_id : int, optional
        A completed checkpoint; defaults to the latest.
    state_name : str, optional
        One state (typed ``user_key`` and ``value`` structs); default every state, with
        ``user_key`` and ``value`` as JSON text.
    storage_options : dict, optional
        fsspec options of the location.
    key_types : sequence of str, optional
        Grouping-key types, for checkpoints that do not record them.

    Returns
    -------
    pyspark.sql.DataFrame
        Columns ``partition_id, key, state_name, user_key, value, expiration_ms``.
    """
    from ..storage import open_store

    store = open_store(checkpoint_location, storage_options=storage_options)
    view = load_checkpoint(store, operator_id, checkpoint_id, key_types=key_types)
    schema = spark_schema(view, state_name)
    data: list[tuple[Any, ...]] = []
    names = {d.name: (value_schema(d).names, getattr(user_key_schema(d), "names", ()))
             for d in view.states.values()}
    for r in read_rows(store, operator_id, state_name=state_name, view=view):
        if state_name is None:
            vn, un = names[r.state_name]
            data.append((r.partition_id, r.key, r.state_name, _as_json(un, r.user_key),
                         _as_json(vn, r.value), r.expiration_ms))
        else:
            data.append((r.partition_id, r.key, r.state_name, r.user_key, r.value,
                         r.expiration_ms))
    return spark.createDataFrame(data, schema)
