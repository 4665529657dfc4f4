"""Read the keyed state of a completed checkpoint: as rows (no Spark needed), as pandas,
or as a Spark DataFrame shaped like Spark's ``statestore`` data source.

Each partition's files are downloaded (size and CRC32 verified) into a private temporary
directory, opened there with :class:`~statebackend.rocksdb.instance.RocksDBInstance` and
scanned; the durable checkpoint is only read, and the temporary copy is removed after the
partition is read. Values are decoded with the codecs of the state descriptors the
manifests record; grouping keys with the key types the runner records in every manifest
(its typed ``key_types`` and ``key_columns`` fields).

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

The unit of reading is a :class:`ReadUnit`: one partition of a checkpoint, or one data file
(key-group range) of a savepoint. :func:`read_rows` reads the units one after the other in
this process (the CLI, no Spark); :func:`read_state` gives a Spark DataFrame with one task
per unit, each reading its unit on an executor, so the driver reads only the record and
manifests (``distributed=False`` reads on the driver instead, as before).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CorruptStateError, StateBackendError, StateError
from ..keys.grouping_key import decode_grouping_key
from ..keys.layout import decode_ts, split_composite
from ..keys.values import compile_codec
from ..model.manifest import StateDescriptor
from ..model.schema import Schema
from ..progress import ProgressFn
from ..rocksdb.instance import RocksDBInstance
from ..state.evolution import Versions
from ..state.list import _elements
from ..state.timers import TIMERS_CF
from ..state.value import decode_block
from ..storage.base import DurableStore
from .arrow import json_default, plain
from .views import (  # noqa: F401  (importable from here, as before the split)
    TIMER_SCHEMA,
    CheckpointView,
    ReadUnit,
    SavepointView,
    StateRow,
    StateView,
    load_checkpoint,
    load_savepoint,
    open_unit,
    select_states,
    select_units,
    user_key_schema,
    value_schema,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CheckpointView",
    "ReadUnit",
    "SavepointView",
    "StateRow",
    "load_checkpoint",
    "load_savepoint",
    "read_partition",
    "read_rows",
    "rows_to_pandas",
    "spark_schema",
]

log = logging.getLogger(__name__)

_VALUE_KINDS = ("value", "reducing", "aggregating")



def read_partition(instance: RocksDBInstance, partition: int, key_types: Sequence[str],
                   states: Iterable[StateDescriptor]) -> Iterator[StateRow]:
    """Decode every entry of ``states`` in an open instance, in key order per state."""
    existing = set(instance.column_family_names())
    for d in states:
        if d.name not in existing:
            continue  # declared elsewhere, never written here
        dec = EntryDecoder(d, key_types)
        name = d.name
        for k, raw in instance.scan_range(name, b"", None):
            for key, user_key, value, exp in dec.rows(k, raw):
                yield StateRow(partition, key, name, user_key, value, exp)


Decoded = tuple[tuple[Any, ...], "tuple[Any, ...] | None", "tuple[Any, ...] | None", "int | None"]
"""(key, user_key, value, expiration_ms) of one row."""


class EntryDecoder:
    """Turns the raw RocksDB entries of one state into rows (``rows``), and names what a
    deleted entry was (``identity``): the grouping key, the map's user key, the timer's
    timestamp.

    Raises
    ------
    StateError
        A state kind this reader does not know.
    """

    def __init__(self, d: StateDescriptor, key_types: Sequence[str]) -> None:
        self.descriptor = d
        self.kind = d.kind
        if d.kind not in (*_VALUE_KINDS, "list", "map", "blocks") and not (
                d.kind == "timers" and d.name == TIMERS_CF):
            raise StateError(f"state {d.name!r} has kind {d.kind!r}, which this reader does "
                             f"not know")
        self.types = list(key_types)
        self.ttl = d.ttl_ms is not None
        if d.kind == "timers":
            self.decode = compile_codec(value_schema(d), f"state {d.name!r}").decode
        else:
            # Values of every schema version, read as the current one (see
            # statebackend.state.evolution).
            self._versions = Versions(d)
            self.decode = lambda payload: self._versions.read(payload)[1]
        ukey = user_key_schema(d)
        self.key_decode = (compile_codec(ukey, f"map state {d.name!r} user key").decode
                           if ukey else None)

    def _split(self, raw: bytes) -> tuple[int | None, tuple[Any, ...]]:
        """``(expiry, decoded value)`` of one stored value (or list element)."""
        return self._versions.read(raw)

    def grouping_key(self, gk: bytes) -> tuple[Any, ...]:
        return decode_grouping_key(gk, self.types)[1]

    def rows(self, k: bytes, raw: bytes) -> Iterator[Decoded]:
        """The rows of one entry (a list gives one per element, a block one per key)."""
        kind, decode = self.kind, self.decode
        if kind in _VALUE_KINDS:
            exp, value = self._split(raw)
            yield self.grouping_key(k), None, value, exp
        elif kind == "list":
            key = self.grouping_key(k)
            for e in _elements(raw):
                exp, value = self._split(e)
                yield key, None, value, exp
        elif kind == "map":
            gk, part = split_composite(k)
            exp, value = self._split(raw)
            assert self.key_decode is not None
            yield self.grouping_key(gk), self.key_decode(part), value, exp
        elif kind == "blocks":
            for gk, payload in sorted(decode_block(self.descriptor.name, k, raw).items()):
                yield self.grouping_key(gk), None, decode(payload), None
        else:  # timers
            gk, part = split_composite(k)
            yield self.grouping_key(gk), None, (decode_ts(part),), None

    def identity(self, k: bytes) -> Decoded:
        """The row of a deleted entry: its identity, no value (a timer's value is its
        timestamp, part of its identity). Not for blocks, whose entries hold many keys."""
        if self.kind == "map":
            gk, part = split_composite(k)
            assert self.key_decode is not None
            return self.grouping_key(gk), self.key_decode(part), None, None
        if self.kind == "timers":
            gk, part = split_composite(k)
            return self.grouping_key(gk), None, (decode_ts(part),), None
        return self.grouping_key(k), None, None, None


def read_unit(store: DurableStore, operator_id: str, unit: ReadUnit,
              key_types: Sequence[str], states: Sequence[StateDescriptor],
              temp_dir: str | None = None) -> Iterator[StateRow]:
    """Every entry of ``states`` in one unit (see :func:`open_unit`).

    Raises
    ------
    CorruptStateError
        Files that passed their checksums but do not open or read back (a manifest missing
        an SST its RocksDB MANIFEST needs, say), naming the manifest.
    """
    try:
        with open_unit(store, operator_id, unit, temp_dir) as inst:
            yield from read_partition(inst, unit.partition, key_types, states)
    except StateBackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception
        m = unit.manifest
        where = m.path if m is not None else f"savepoint {unit.savepoint}"
        what = (f"checkpoint {m.checkpoint_id} partition {unit.partition}" if m is not None
                else f"partition {unit.partition}")
        raise CorruptStateError(
            f"{what}: RocksDB cannot open or read the state of {where} "
            f"({type(exc).__name__}: {exc}); 'statebackend verify' names what is wrong",
            checkpoint_id=None if m is None else m.checkpoint_id, partition=unit.partition,
            path=where) from exc


def read_rows(store: DurableStore, operator_id: str, checkpoint_id: int | None = None,
              state_name: str | None = None, *, partitions: Iterable[int] | None = None,
              key_types: Sequence[str] | None = None, temp_dir: str | None = None,
              progress: ProgressFn | None = None,
              view: StateView | None = None) -> Iterator[StateRow]:
    """Every stored entry of a completed checkpoint or a savepoint (or of some of its
    partitions), read in this process, one partition after the other.

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
        Only these partitions (default: all); a savepoint's partitions are its data files
        in key-group order.
    key_types : sequence of str, optional
        See :func:`load_checkpoint`.
    temp_dir : str, optional
        Where the partition copies are downloaded (default: the system temp dir).
    progress : callable, optional
        ``progress(partitions, total, bytes, total_bytes)`` after each partition (bytes:
        the partitions' checkpoint files); see :mod:`statebackend.progress`.
    view : CheckpointView or SavepointView, optional
        An already loaded checkpoint (then the ids above are not read again), or a
        savepoint (:func:`load_savepoint`).

    Raises
    ------
    CheckpointNotFoundError, CorruptStateError, StateError
        See :func:`load_checkpoint`; a durable file that is missing or fails its checksum
        raises :class:`CorruptStateError` naming it.
    """
    view = view or load_checkpoint(store, operator_id, checkpoint_id, key_types=key_types)
    states = select_states(view, state_name)
    units = select_units(view, partitions)
    total_bytes = sum(u.full_size for u in units)
    done_bytes = 0
    for i, u in enumerate(units):
        yield from read_unit(store, operator_id, u, view.key_types, states, temp_dir)
        done_bytes += u.full_size
        if progress is not None:
            progress(i + 1, len(units), done_bytes, total_bytes)


# --- shapes: pandas and Spark ----------------------------------------------------------


def as_json_text(names: Sequence[str], values: tuple[Any, ...] | None) -> str | None:
    if values is None:
        return None
    # structs as objects with their field names, at every depth
    return json.dumps(plain(dict(zip(names, values))), default=json_default, sort_keys=False)


def rows_to_pandas(rows: Iterable[StateRow], view: StateView,
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
            if r.value is not None:  # null in a change feed's deletes
                rec.update(zip([f"value.{n}" for n in vnames], r.value))
            records.append(rec)
    else:
        names = {d.name: (value_schema(d).names,
                          getattr(user_key_schema(d), "names", ())) for d in view.states.values()}
        columns = ["partition_id", *key_cols, "state_name", "user_key", "value", "expiration_ms"]
        for r in rows:
            vn, un = names[r.state_name]
            rec = {"partition_id": r.partition_id, "state_name": r.state_name,
                   "user_key": as_json_text(un, r.user_key), "value": as_json_text(vn, r.value),
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


def spark_schema(view: StateView, state_name: str | None = None) -> str:
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


def spark_row_shaper(view: StateView, state_name: str | None):
    """``StateRow -> tuple`` in the column order of :func:`spark_schema` (JSON text for
    ``user_key``/``value`` when ``state_name`` is None)."""
    if state_name is not None:
        def typed(r: Any) -> tuple[Any, ...]:
            return (r.partition_id, r.key, r.state_name, r.user_key, r.value, r.expiration_ms)
        return typed
    names = {d.name: (value_schema(d).names, getattr(user_key_schema(d), "names", ()))
             for d in view.states.values()}

    def as_json(r: Any) -> tuple[Any, ...]:
        vn, un = names[r.state_name]
        return (r.partition_id, r.key, r.state_name, as_json_text(un, r.user_key),
                as_json_text(vn, r.value), r.expiration_ms)
    return as_json


def load_view(store: DurableStore, operator_id: str, checkpoint_id: int | None,
               savepoint: str | None, key_types: Sequence[str] | None) -> StateView:
    if savepoint is not None:
        return load_savepoint(store, operator_id, savepoint, key_types=key_types)
    return load_checkpoint(store, operator_id, checkpoint_id, key_types=key_types)
