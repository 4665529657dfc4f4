"""Timers per grouping key, in RocksDB or in a heap.

Both services keep the authoritative by-key column family ``_timers`` (``grouping key +
ts + u32 len``, empty values) in the backend's write cache, so timers are in RocksDB after
every flush and therefore in every checkpoint. They differ in how they find expired
timers across keys:

- ``rocksdb``: a second column family ``_timers_by_time`` (``key group + ts + grouping
  key``) scanned per key group up to the deadline; memory stays flat.
- ``heap``: an in-memory ``(ts, key)`` heap rebuilt from ``_timers`` when the backend
  opens; fastest when timers fit in memory.

:meth:`TimerService.pop_expired` takes a snapshot of the timers due when it is called and
yields them in ``(ts, grouping key)`` order, deleting each just before yielding it; a timer
deleted by a handler in the meantime is skipped, and a timer registered by a handler fires
on the next call (so a handler that keeps registering past timers cannot loop forever).
"""

from __future__ import annotations

import builtins
import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..keys.layout import (
    composite,
    decode_ts,
    encode_ts,
    length_suffix,
    next_key_group,
    split_composite,
    split_timer_by_time_key,
    timer_by_time_key,
)
from .base import MISSING
from .host import StateHost

if TYPE_CHECKING:
    from ..rocksdb.instance import RocksDBInstance

__all__ = ["TimerService", "RocksDBTimerService", "HeapTimerService", "TIMERS_CF",
           "TIMERS_BY_TIME_CF", "key_groups"]

TIMERS_CF = "_timers"
TIMERS_BY_TIME_CF = "_timers_by_time"


def key_groups(instance: RocksDBInstance, cf: str) -> Iterator[bytes]:
    """The key groups (2-byte prefixes) present in ``cf``, in order: one seek per group."""
    start = b""
    while True:
        first = next(instance.scan_range(cf, start, None), None)
        if first is None:
            return
        kg = first[0][:2]
        yield kg
        nxt = next_key_group(kg)
        if nxt is None:
            return
        start = nxt


class TimerService(ABC):
    """Timers of one backend; keys are grouping keys, timestamps epoch ms."""

    name = ""

    def __init__(self, backend: StateHost) -> None:
        self._backend = backend
        self._cf, self._dirty, self._clean = backend._bind(TIMERS_CF)
        self._groups = backend._bind_groups(TIMERS_CF)

    @abstractmethod
    def register(self, key: bytes, ts: int) -> None:
        """Register a timer (idempotent)."""

    @abstractmethod
    def delete(self, key: bytes, ts: int) -> None:
        """Delete a timer (no-op when absent)."""

    @abstractmethod
    def list(self, key: bytes) -> builtins.list[int]:
        """Timestamps registered for ``key``, ascending."""

    @abstractmethod
    def pop_expired(self, up_to_ms: int) -> Iterator[tuple[bytes, int]]:
        """``(key, ts)`` with ``ts <= up_to_ms``, in time order, each removed before it is yielded."""

    # --- the by-key column family, shared by both services ------------------------------

    def _set_by_key(self, key: bytes, ts: int, present: bool) -> None:
        ck = composite(key, encode_ts(ts))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = set()
        group.add(ck)
        self._dirty[ck] = b"" if present else None
        self._backend._note_write()

    def _has(self, key: bytes, ts: int) -> bool:
        ck = composite(key, encode_ts(ts))
        raw = self._dirty.get(ck, MISSING)
        if raw is MISSING:
            raw = self._clean.get(ck, MISSING)
            if raw is MISSING:
                raw = self._cf.get(ck)
        return raw is not None

    def _scan_by_key(self, key: bytes) -> builtins.list[int]:
        suffix = length_suffix(key)
        merged: dict[bytes, bytes | None] = {
            k: v for k, v in self._backend._instance.scan_prefix(TIMERS_CF, key)
            if k.endswith(suffix)}
        for k in self._groups.get(key, ()):
            merged[k] = self._dirty[k]
        n = len(key)
        return [decode_ts(k, n) for k in sorted(merged) if merged[k] is not None]


class RocksDBTimerService(TimerService):
    """Timers indexed by time in the ``_timers_by_time`` column family."""

    name = "rocksdb"

    def __init__(self, backend: StateHost) -> None:
        super().__init__(backend)
        _, self._by_time, _ = backend._bind(TIMERS_BY_TIME_CF)

    def register(self, key: bytes, ts: int) -> None:
        self._set_by_key(key, ts, True)
        self._by_time[timer_by_time_key(key, ts)] = b""

    def delete(self, key: bytes, ts: int) -> None:
        self._set_by_key(key, ts, False)
        self._by_time[timer_by_time_key(key, ts)] = None

    def list(self, key: bytes) -> builtins.list[int]:
        return self._scan_by_key(key)

    def pop_expired(self, up_to_ms: int) -> Iterator[tuple[bytes, int]]:
        # The by-time scan reads RocksDB only, so pending writes go first (one WriteBatch).
        self._backend.flush()
        inst = self._backend._instance
        end = encode_ts(up_to_ms + 1)
        due: builtins.list[tuple[int, bytes]] = []
        for kg in list(key_groups(inst, TIMERS_BY_TIME_CF)):
            for k, _ in inst.scan_range(TIMERS_BY_TIME_CF, kg, kg + end):
                key, ts = split_timer_by_time_key(k)
                due.append((ts, key))
        due.sort()
        return self._fire(due)

    # builtins.list: the method named list() shadows the builtin inside the class body
    def _fire(self, due: builtins.list[tuple[int, bytes]]) -> Iterator[tuple[bytes, int]]:
        for ts, key in due:
            if self._has(key, ts):
                self.delete(key, ts)
                yield key, ts


class HeapTimerService(TimerService):
    """Timers indexed by time in memory; loaded from ``_timers`` when the backend opens."""

    name = "heap"

    def __init__(self, backend: StateHost) -> None:
        super().__init__(backend)
        self._by_key: dict[bytes, set[int]] = {}
        for k, _ in backend._instance.scan_range(TIMERS_CF, b"", None):
            key, part = split_composite(k)
            self._by_key.setdefault(key, set()).add(decode_ts(part))
        # Lazy deletion: the heap may hold deleted or duplicate entries; _by_key decides.
        self._heap = [(ts, key) for key, tss in self._by_key.items() for ts in tss]
        heapq.heapify(self._heap)

    def register(self, key: bytes, ts: int) -> None:
        tss = self._by_key.setdefault(key, set())
        if ts not in tss:
            tss.add(ts)
            heapq.heappush(self._heap, (ts, key))
            self._set_by_key(key, ts, True)

    def delete(self, key: bytes, ts: int) -> None:
        tss = self._by_key.get(key)
        if tss is not None and ts in tss:
            tss.discard(ts)
            if not tss:
                del self._by_key[key]
            self._set_by_key(key, ts, False)

    def list(self, key: bytes) -> builtins.list[int]:
        return sorted(self._by_key.get(key, ()))

    def pop_expired(self, up_to_ms: int) -> Iterator[tuple[bytes, int]]:
        due: builtins.list[tuple[int, bytes]] = []
        seen: set[tuple[int, bytes]] = set()
        heap = self._heap
        while heap and heap[0][0] <= up_to_ms:
            item = heapq.heappop(heap)
            if item not in seen and item[0] in self._by_key.get(item[1], ()):
                seen.add(item)
                due.append(item)
        return self._fire(due)

    # builtins.list: the method named list() shadows the builtin inside the class body
    def _fire(self, due: builtins.list[tuple[int, bytes]]) -> Iterator[tuple[bytes, int]]:
        pos = 0
        try:
            while pos < len(due):
                ts, key = due[pos]
                pos += 1
                if ts in self._by_key.get(key, ()):
                    self.delete(key, ts)
                    yield key, ts
        finally:
            # A caller that stops early must not lose the due timers it did not consume.
            for item in due[pos:]:
                heapq.heappush(self._heap, item)
