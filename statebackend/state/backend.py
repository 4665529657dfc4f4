"""The keyed state of one partition: declared states over one :class:`RocksDBInstance`.

How a task drives it, per micro-batch::

    backend = KeyedStateBackend(instance, timer_service="rocksdb", clock=lambda: now_ms)
    count = backend.value_state("count", "count BIGINT")
    backend.prefetch(keys_of_this_batch)           # optional: one multi-get per state
    for key in keys:
        backend.set_current_key(key)
        c = count.get()
        count.update(((c[0] if c else 0) + 1,))
    for key, ts in backend.pop_expired_timers(watermark):
        backend.set_current_key(key)
        ...
    backend.purge_expired()
    backend.flush()                                # one WriteBatch with every change

Caches. Each column family has a write cache (key -> encoded value, or None for a
delete) and a read cache (key -> value or None, filled by reads and :meth:`prefetch`).
Reads look at the write cache, then the read cache, then RocksDB. :meth:`flush` writes all
write caches in one WriteBatch; it also runs by itself when ``max_dirty_entries`` writes
have accumulated. Scans of one grouping key (map iteration, ``list_timers``) merge RocksDB
with that key's cached writes, found through a per-key index, so they never flush; scans
across keys (``pop_expired_timers`` with the RocksDB timer service, ``purge_expired``)
flush first, once per call.

Column families: one per declared state (named like the state), plus ``_meta`` (state
descriptors, so a reopened instance knows its states), ``_ttl`` (TTL index), ``_timers``
and ``_timers_by_time``. This backend is the only writer of its instance.
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import OptionsError, SchemaError, StateError
from ..keys.layout import decode_ts, timer_by_time_key
from ..keys.values import RowCodec, compile_codec
from ..model.manifest import StateDescriptor
from ..model.schema import to_schema
from ..rocksdb.instance import DEFAULT_CF, RocksDBInstance
from .base import KeyedState
from .evolution import Versions, check_stored_descriptor, descriptor_json, evolve
from .list import ListState
from .map import MapState
from .reducing import AggregateFunction, AggregatingState, ReducingState
from .timers import (
    TIMERS_BY_TIME_CF,
    TIMERS_CF,
    HeapTimerService,
    RocksDBTimerService,
    TimerService,
    split_composite,
)
from .ttl import TTL_CF, purge_expired, validate_ttl
from .value import MAX_BLOCKS, BlockState, ValueState, is_block_count

__all__ = ["KeyedStateBackend", "META_CF", "descriptor_json"]

META_CF = "_meta"
_STATE_PREFIX = b"state/"
_TIMER_SERVICE_KEY = b"timer_service"
_RESERVED = {DEFAULT_CF, META_CF, TTL_CF, TIMERS_CF, TIMERS_BY_TIME_CF}
# Column families only written through the cache, never point-read: no read cache.
_WRITE_ONLY = {META_CF, TTL_CF, TIMERS_BY_TIME_CF}
_TIMER_SERVICES: dict[str, type[TimerService]] = {
    "rocksdb": RocksDBTimerService, "heap": HeapTimerService}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class _ColumnFamilyView:
    """Point reads of one column family through the instance.

    Deliberately holds no rocksdict handle: a live column-family handle keeps the
    database (and its directory lock) open after ``RocksDBInstance.close()``.
    """

    __slots__ = ("_instance", "_name")

    def __init__(self, instance: RocksDBInstance, name: str) -> None:
        self._instance = instance
        self._name = name

    def get(self, key: Any) -> Any:
        """``bytes | None`` for a key, a list of them for a list of keys (multi-get)."""
        if key.__class__ is list:
            return self._instance.multi_get(self._name, key)
        return self._instance.column_family(self._name).get(key)


class KeyedStateBackend:
    """Keyed state of one partition over one RocksDB instance.

    Parameters
    ----------
    instance : RocksDBInstance
        The open instance; the backend does not close it (its owner does, after any
        checkpoint).
    timer_service : {"rocksdb", "heap"}
        Where the by-time index of timers lives (see :mod:`statebackend.state.timers`).
    clock : callable, optional
        ``() -> epoch ms``: processing time for TTL. Defaults to the wall clock; the Spark
        layer passes the batch's processing time.
    max_dirty_entries : int
        Writes accumulated before :meth:`flush` runs by itself (bounds memory).
    max_cached_entries : int
        Size of the read caches beyond which a flush empties them.
    monotonic_clock : bool
        Never let the clock go back (see :meth:`_clock`); False takes ``clock`` as given,
        for a writer that replays recorded expiries in any order (the import from Spark's
        store, :mod:`statebackend.task.import_spark`).
    """

    def __init__(self, instance: RocksDBInstance, timer_service: str = "rocksdb",
                 clock: Callable[[], int] | None = None, *,
                 max_dirty_entries: int = 100_000, max_cached_entries: int = 1_000_000,
                 monotonic_clock: bool = True) -> None:
        if timer_service not in _TIMER_SERVICES:
            raise OptionsError("timer_service", timer_service,
                               f"timer_service must be one of {sorted(_TIMER_SERVICES)}, "
                               f"got {timer_service!r}")
        if max_dirty_entries < 1 or max_cached_entries < 0:
            raise OptionsError("max_dirty_entries", max_dirty_entries,
                               "max_dirty_entries must be >= 1 and max_cached_entries >= 0")
        self._instance = instance
        self._source_clock: Callable[[], int] = clock or _wall_clock_ms
        self._clock_high = _INT64[0]
        self._monotonic = monotonic_clock
        self.max_dirty_entries = max_dirty_entries
        self.max_cached_entries = max_cached_entries
        self._current_key: bytes | None = None
        self._dirty: dict[str, dict[bytes, bytes | None]] = {}
        self._clean: dict[str, dict[bytes, bytes | None]] = {}
        self._groups: dict[str, dict[bytes, set[bytes]]] = {}
        self._n_writes = 0
        self._states: dict[str, KeyedState] = {}
        self._closed = False
        _, self._meta_dirty, _ = self._bind(META_CF)
        _, self._ttl_dirty, _ = self._bind(TTL_CF)
        self._meta: dict[str, StateDescriptor] = self._load_meta()
        self._timer_service_name = timer_service
        self._timers: TimerService | None = None
        self._switch_timer_service()

    def _clock(self) -> int:
        """Processing time for TTL, never earlier than a time this backend already used.

        Clocks jump (an NTP step on the driver that stamps batches, or on the executor that
        runs an empty partition): a value found expired must not come back when the clock
        steps back before the purge has removed it. Across checkpoints the purge at the end
        of every batch gives the same guarantee.
        """
        now = int(self._source_clock())
        if not self._monotonic:
            return now
        if now < self._clock_high:
            return self._clock_high
        self._clock_high = now
        return now

    # --- binding column families to caches ---------------------------------------------

    def _bind(self, cf: str) -> tuple[Any, dict[bytes, bytes | None], dict[bytes, bytes | None]]:
        """``(RocksDB handle, write cache, read cache)`` of ``cf`` (created if missing)."""
        self._check_open()
        self._instance.column_family(cf)  # create it now, so a flush finds it
        return (_ColumnFamilyView(self._instance, cf), self._dirty.setdefault(cf, {}),
                self._clean.setdefault(cf, {}))

    def _bind_groups(self, cf: str) -> dict[bytes, set[bytes]]:
        """Index ``grouping key -> dirty keys`` of ``cf``, for merged per-key scans."""
        return self._groups.setdefault(cf, {})

    def _note_write(self, n: int = 1) -> None:
        self._n_writes += n
        if self._n_writes >= self.max_dirty_entries:
            self.flush()

    # --- current key -------------------------------------------------------------------

    @property
    def current_key(self) -> bytes | None:
        """The grouping key that state calls apply to."""
        return self._current_key

    def set_current_key(self, key: bytes | None) -> None:
        """Make ``key`` (encoded by :mod:`statebackend.keys.grouping_key`) the current key.

        Raises
        ------
        StateError
            When ``key`` is shorter than its 2-byte key group.
        """
        if key is not None:
            if key.__class__ is not bytes:
                key = bytes(key)
            if len(key) < 2:
                raise StateError(f"a grouping key starts with its 2-byte key group; got {key!r}")
        self._current_key = key

    # --- declaring states --------------------------------------------------------------

    def value_state(self, name: str, schema: Any, ttl_ms: int | None = None) -> ValueState:
        """Create, or return the already declared, value state ``name``.

        Parameters
        ----------
        name : str
            State name (also its column family); must not start with ``_``.
        schema : str or StructType
            DDL such as ``"count BIGINT"`` or a pyspark ``StructType``.
        ttl_ms : int, optional
            Time to live of a value after its last update.

        Raises
        ------
        SchemaError
            When ``name`` was declared (now or in the stored state) with another kind or schema.
        """
        s = to_schema(schema)
        existing = self._declare(StateDescriptor(name, "value", s.ddl(), None,
                                                 validate_ttl(name, ttl_ms)))
        if existing is not None:
            return existing  # type: ignore[return-value]
        st = ValueState(self, name, self._codec(name, s, f"value state {name!r}"), ttl_ms)
        self._states[name] = st
        return st

    def block_state(self, name: str, schema: Any, blocks: int) -> BlockState:
        """Create, or return the already declared, block state ``name``: the values of
        many grouping keys packed into ``blocks`` RocksDB entries per key group (see
        :class:`~.value.BlockState`; its user is ``KeyedColumnState``).

        Raises
        ------
        SchemaError
            When ``name`` was declared (now or in the stored state) with another kind,
            schema or number of blocks.
        """
        if not is_block_count(blocks):
            raise StateError(f"block state {name!r}: blocks must be an int in 1..{MAX_BLOCKS}, "
                             f"got {blocks!r}")
        s = to_schema(schema)
        existing = self._declare(StateDescriptor(name, "blocks", s.ddl(), None, None, blocks))
        if existing is not None:
            return existing  # type: ignore[return-value]
        st = BlockState(self, name, self._codec(name, s, f"block state {name!r}"), blocks)
        self._states[name] = st
        return st

    def list_state(self, name: str, schema: Any, ttl_ms: int | None = None) -> ListState:
        """Create, or return the already declared, list state ``name`` (see :meth:`value_state`)."""
        s = to_schema(schema)
        existing = self._declare(StateDescriptor(name, "list", s.ddl(), None,
                                                 validate_ttl(name, ttl_ms)))
        if existing is not None:
            return existing  # type: ignore[return-value]
        st = ListState(self, name, self._codec(name, s, f"list state {name!r}"), ttl_ms)
        self._states[name] = st
        return st

    def map_state(self, name: str, user_key_schema: Any, value_schema: Any,
                  ttl_ms: int | None = None) -> MapState:
        """Create, or return the already declared, map state ``name`` (see :meth:`value_state`)."""
        ks, vs = to_schema(user_key_schema), to_schema(value_schema)
        existing = self._declare(StateDescriptor(name, "map", vs.ddl(), ks.ddl(),
                                                 validate_ttl(name, ttl_ms)))
        if existing is not None:
            return existing  # type: ignore[return-value]
        st = MapState(self, name, compile_codec(ks, f"map state {name!r} user key"),
                      self._codec(name, vs, f"map state {name!r} value"), ttl_ms)
        self._states[name] = st
        return st

    def reducing_state(self, name: str, schema: Any,
                       reduce_fn: Callable[[Any, Any], Any],
                       ttl_ms: int | None = None) -> ReducingState:
        """A value per key folded with ``reduce_fn(current, added)`` by ``add``."""
        s = to_schema(schema)
        existing = self._declare(StateDescriptor(name, "reducing", s.ddl(), None,
                                                 validate_ttl(name, ttl_ms)))
        if existing is not None:
            existing.reduce_fn = reduce_fn  # type: ignore[attr-defined]
            return existing  # type: ignore[return-value]
        st = ReducingState(self, name, self._codec(name, s, f"reducing state {name!r}"),
                           reduce_fn, ttl_ms)
        self._states[name] = st
        return st

    def aggregating_state(self, name: str, accumulator_schema: Any,
                          aggregate_fn: AggregateFunction,
                          ttl_ms: int | None = None) -> AggregatingState:
        """An accumulator per key (stored with ``accumulator_schema``) fed by ``add``."""
        s = to_schema(accumulator_schema)
        existing = self._declare(StateDescriptor(name, "aggregating", s.ddl(), None,
                                                 validate_ttl(name, ttl_ms)))
        if existing is not None:
            existing.aggregate_fn = aggregate_fn  # type: ignore[attr-defined]
            return existing  # type: ignore[return-value]
        st = AggregatingState(self, name, self._codec(name, s, f"aggregating state {name!r}"),
                              aggregate_fn, ttl_ms)
        self._states[name] = st
        return st

    def delete_state(self, name: str) -> None:
        """Drop state ``name``, its data and its metadata (PySpark's ``deleteIfExists``).

        Handles to the state raise :class:`StateError` afterwards; declaring it again
        starts empty.
        """
        self._check_open()
        self._check_name(name)
        st = self._states.pop(name, None)
        if st is not None:
            st._drop()
        known = name in self._meta or name in self._instance.column_family_names()
        self._dirty.pop(name, None)
        self._clean.pop(name, None)
        self._groups.pop(name, None)
        if known:
            self._instance.drop_column_family(name)
            self._meta.pop(name, None)
            self._meta_dirty[_STATE_PREFIX + name.encode("utf-8")] = None
            self._note_write()

    def descriptors(self) -> list[StateDescriptor]:
        """Every known state (declared now or stored), and the timers when there are any."""
        out = sorted(self._meta.values(), key=lambda d: d.name)
        if TIMERS_CF in self._instance.column_family_names():
            out.append(StateDescriptor(TIMERS_CF, "timers"))
        return out

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise StateError(f"a state name must be a non-empty string, got {name!r}")
        if name.startswith("_") or name in _RESERVED:
            raise StateError(f"state name {name!r} is reserved: names starting with '_' are "
                             f"the backend's own column families")
        if len(name.encode("utf-8")) > 255:
            raise StateError(f"state name {name[:40]!r}... is longer than 255 bytes")

    def _declare(self, desc: StateDescriptor) -> KeyedState | None:
        """Check ``desc`` against what is declared or stored; the live state if any.

        A stored state declared with another schema or TTL evolves (a new schema version,
        see :mod:`.evolution`) when the change is compatible; an incompatible change
        raises :class:`SchemaEvolutionError` before anything is written.
        """
        self._check_open()
        self._check_name(desc.name)
        old = self._meta.get(desc.name)
        live = self._states.get(desc.name)
        if live is not None:
            assert old is not None
            if (old.kind, old.value_schema, old.user_key_schema, old.blocks, old.ttl_ms) != \
                    (desc.kind, desc.value_schema, desc.user_key_schema, desc.blocks,
                     desc.ttl_ms):
                raise SchemaError(
                    f"state {desc.name!r} is already declared as {self._describe(old)} "
                    f"(ttl_ms={old.ttl_ms}) in this task; it cannot be redeclared as "
                    f"{self._describe(desc)} (ttl_ms={desc.ttl_ms}) in the same task")
            return live
        desc = evolve(old, desc)
        if old == desc:
            return None
        self._meta[desc.name] = desc
        self._meta_dirty[_STATE_PREFIX + desc.name.encode("utf-8")] = descriptor_json(desc)
        self._note_write()
        return None

    def _codec(self, name: str, schema: Any, label: str) -> RowCodec:
        """The codec of the current version of declared state ``name``: rows tagged with
        its schema id (TTL states get the id in front of the expiry instead)."""
        d = self._meta[name]
        tag = d.schema_id if d.ttl_ms is None else None
        return compile_codec(schema, label, tag)

    def versions(self, name: str) -> Versions:
        """The schema versions of stored state ``name`` (to read values of any version)."""
        return Versions(self._meta[name])

    @staticmethod
    def _describe(d: StateDescriptor) -> str:
        if d.kind == "map":
            return f"map<({d.user_key_schema}) -> ({d.value_schema})>"
        if d.kind == "blocks":
            return f"blocks[{d.blocks} per key group]({d.value_schema})"
        return f"{d.kind}({d.value_schema})"

    def _load_meta(self) -> dict[str, StateDescriptor]:
        out = {}
        for _, v in self._instance.scan_prefix(META_CF, _STATE_PREFIX):
            d = json.loads(v)
            out[d["name"]] = check_stored_descriptor(StateDescriptor(**d), "_meta")
        return out

    # --- batch paths -------------------------------------------------------------------

    def prefetch(self, keys: Iterable[bytes], states: Iterable[str] | None = None) -> None:
        """Multi-get the values of ``keys`` of declared value-like and list states.

        Parameters
        ----------
        keys : iterable of bytes
            Grouping keys; those already cached are not fetched again.
        states : iterable of str, optional
            Only these states (default: every declared value, reducing, aggregating and
            list state).
        """
        self._check_open()
        keys = [k if k.__class__ is bytes else bytes(k) for k in keys]
        if not keys:
            return
        wanted = None if states is None else set(states)
        for st in list(self._states.values()):
            if wanted is not None and st.name not in wanted:
                continue
            if isinstance(st, (ValueState, ListState)) and not isinstance(st, BlockState):
                dirty, clean = st._dirty, st._clean
                missing = [k for k in keys if k not in dirty and k not in clean]
                if missing:
                    clean.update(zip(missing, st._cf.get(missing)))

    def flush(self) -> None:
        """Write every cached change in one WriteBatch."""
        self._check_open()
        puts = {cf: d for cf, d in self._dirty.items() if d}
        if puts:
            self._instance.write(puts)
        for cf, d in puts.items():
            if cf not in _WRITE_ONLY:
                self._clean[cf].update(d)
            d.clear()
        for groups in self._groups.values():
            groups.clear()
        self._n_writes = 0
        if sum(len(c) for c in self._clean.values()) > self.max_cached_entries:
            for c in self._clean.values():
                c.clear()

    def purge_expired(self) -> int:
        """Remove expired TTL entries (flushes first); the number removed.

        See :func:`statebackend.state.ttl.purge_expired`.
        """
        self._check_open()
        return purge_expired(self)

    # --- timers ------------------------------------------------------------------------

    @property
    def timer_service(self) -> str:
        return self._timer_service_name

    def _timer_svc(self) -> TimerService:
        if self._timers is None:
            self._check_open()
            self._timers = _TIMER_SERVICES[self._timer_service_name](self)
        return self._timers

    def _switch_timer_service(self) -> None:
        """Record the timer service; rebuild or drop the by-time index when it changed."""
        want = self._timer_service_name.encode()
        had = self._instance.multi_get(META_CF, [_TIMER_SERVICE_KEY])[0]
        if had == want:
            return
        if had is not None and TIMERS_CF in self._instance.column_family_names():
            if want == b"rocksdb":
                by_time: dict[bytes, bytes | None] = {}
                for k, _ in self._instance.scan_range(TIMERS_CF, b"", None):
                    key, part = split_composite(k)
                    by_time[timer_by_time_key(key, decode_ts(part))] = b""
                self._instance.write({TIMERS_BY_TIME_CF: by_time})
            else:
                self._instance.drop_column_family(TIMERS_BY_TIME_CF)
        self._instance.write({META_CF: {_TIMER_SERVICE_KEY: want}})

    def _timer_key(self, op: str) -> bytes:
        key = self._current_key
        if key is None:
            raise StateError(f"{op} needs a current key: call set_current_key(key) first")
        return key

    @staticmethod
    def _ts(ts: Any) -> int:
        try:
            t = operator.index(ts)
        except TypeError:
            raise StateError(f"a timer timestamp is an int of epoch ms, got {ts!r}") from None
        if not _INT64[0] <= t < _INT64[1]:
            raise StateError(f"timer timestamp {t} is outside the int64 range")
        return t

    def register_timer(self, ts: int) -> None:
        """Register a timer at ``ts`` (epoch ms) for the current key (idempotent)."""
        self._timer_svc().register(self._timer_key("register_timer"), self._ts(ts))

    def delete_timer(self, ts: int) -> None:
        """Delete the current key's timer at ``ts`` (no-op when absent)."""
        self._timer_svc().delete(self._timer_key("delete_timer"), self._ts(ts))

    def list_timers(self) -> Iterator[int]:
        """The current key's timers, ascending."""
        return iter(self._timer_svc().list(self._timer_key("list_timers")))

    def pop_expired_timers(self, up_to_ms: int) -> Iterator[tuple[bytes, int]]:
        """Timers with ``ts <= up_to_ms`` across keys, as ``(key, ts)`` in time order.

        Ties are ordered by key bytes. Each timer is deleted just before it is yielded, so
        a handler may register new timers (they fire on the next call) or delete pending
        ones (they are skipped).
        """
        return self._timer_svc().pop_expired(self._ts(up_to_ms))

    # --- lifecycle ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StateError("the keyed state backend is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and stop; the instance stays open for its owner (checkpoint, close)."""
        if not self._closed:
            self.flush()
            self._closed = True
            for st in self._states.values():
                st._drop()

    def __enter__(self) -> KeyedStateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
