"""Workloads for ``benchmarks.compare`` and ``benchmarks.bench_task``.

Spark workers import these by module name (``workloads``), so ``benchmarks/`` must be on
``PYTHONPATH`` before the SparkSession starts (``compare.setup_env`` does it). Every
workload is written once and run unmodified on Spark's operators and on ours:

* ``count``: running count per key in value state (pandas and Row flavours, an
  applyInPandasWithState function, and a vectorised ``map_in_pandas`` function).
* ``sessions``: list state; each key's events are appended and a session of
  ``SESSION_LEN`` events is emitted (and the list cleared) when it is full.
* ``map``: map state with many entries per key (``x % MAP_ENTRIES`` as the user key).
* ``timers``: event-time timers; a key's sum is emitted when the watermark passes its
  latest event.
* ``noop``: a processor that reads nothing, writes nothing and outputs nothing: what is
  left is the framework's own cost per key.

All outputs have the schema ``OUT`` so one sink serves every run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

OUT = "k STRING, v BIGINT"
INPUT_SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
SESSION_LEN = 16
MAP_ENTRIES = 64
WATERMARK = ("ts", "5 seconds")
BATCH_SPAN_S = 60  # each micro-batch covers one minute of event time


def make_input(path: str, keys: int, events: int, batches: int, *, seed: int = 42,
               first_batch: int = 0) -> None:
    """Write ``batches`` parquet files (one per micro-batch) of ``events // batches`` rows:
    uniformly random keys out of ``keys``, ``x`` in [0, 100), and event times increasing
    by ``BATCH_SPAN_S`` per batch."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed + first_batch)
    per = max(1, events // batches)
    names = np.array([f"key-{i:07d}" for i in range(keys)], dtype=object)
    base = pd.Timestamp("2024-01-01")
    stamp = time.time()
    for b in range(first_batch, first_batch + batches):
        ts = base + pd.to_timedelta(b * BATCH_SPAN_S + rng.uniform(0, BATCH_SPAN_S, per), unit="s")
        file = os.path.join(path, f"part-{b:05d}.parquet")
        pd.DataFrame({"k": names[rng.integers(0, keys, per)],
                      "x": rng.integers(0, 100, per).astype("int64"),
                      "ts": ts}).to_parquet(
            file, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)  # Spark reads us
        # the file source reads the oldest file first: one second apart keeps batch order
        os.utime(file, (stamp + b, stamp + b))


# --- count ---------------------------------------------------------------------------


class RunningCount(StatefulProcessor):
    """Running count per key (pandas flavour)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        old = self.count.get()
        total = n + (old[0] if old is not None else 0)
        self.count.update((total,))
        yield pd.DataFrame({"k": [key[0]], "v": [total]})

    def close(self):
        pass


class RowRunningCount(StatefulProcessor):
    """Running count per key (Row flavour, for ``transformWithState``)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(1 for _ in rows)
        old = self.count.get()
        total = n + (old[0] if old is not None else 0)
        self.count.update((total,))
        yield Row(k=key[0], v=total)

    def close(self):
        pass


def count_fn(key, pdfs, state):
    """Running count per key for ``applyInPandasWithState``."""
    n = sum(len(p) for p in pdfs)
    total = n + (state.get[0] if state.exists else 0)
    state.update((total,))
    yield pd.DataFrame({"k": [key[0]], "v": [total]})


def passthrough(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Stateless lower bound: count per key inside the partition, no state, no checkpoint."""
    for pdf in batches:
        g = pdf.groupby("k").size()
        yield pd.DataFrame({"k": g.index, "v": g.to_numpy().astype("int64")})


def drain(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Stateless lower bound of the noop workload: reads the input, outputs nothing."""
    for _ in batches:
        pass
    return iter([])


VALUE_BLOCKS = 16
"""``value_blocks`` of the block-layout map_in_pandas systems (per key group)."""


def vector_count(batches, state):
    """Batch-at-a-time running count with vectorised state access (``map_in_pandas``)."""
    for pdf in batches:
        g = pdf.groupby("k").size()
        keys = pd.Series(g.index, name="k")
        old = pd.to_numeric(state.get(keys)["c"], errors="coerce").fillna(0).to_numpy("int64")
        new = old + g.to_numpy()
        state.put(keys, pd.DataFrame({"c": new}))
        yield pd.DataFrame({"k": g.index, "v": new})


def padded_count(batches, state, value_bytes: int = 1000):
    """:func:`vector_count` with ``value_bytes`` of incompressible padding beside each
    key's count (``state_schema="c BIGINT, pad BINARY"``): state of a chosen size, for
    runs that need gigabytes of it (``functools.partial`` sets the size)."""
    for pdf in batches:
        g = pdf.groupby("k").size()
        keys = pd.Series(g.index, name="k")
        old = pd.to_numeric(state.get(keys)["c"], errors="coerce").fillna(0).to_numpy("int64")
        new = old + g.to_numpy()
        pad = os.urandom(value_bytes * len(new))
        state.put(keys, pd.DataFrame({"c": new, "pad": [pad[i * value_bytes:(i + 1) * value_bytes]
                                                       for i in range(len(new))]}))
        yield pd.DataFrame({"k": g.index, "v": new})


# --- sessions (list state) -------------------------------------------------------------


class Sessions(StatefulProcessor):
    """Appends each key's events to a list; emits and clears a full session."""

    def init(self, handle):
        self.events = handle.getListState("events", "x BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        self.events.appendList([(x,) for x in xs])
        cur = [t[0] for t in self.events.get()]
        if len(cur) >= SESSION_LEN:
            self.events.clear()
            yield pd.DataFrame({"k": [key[0]], "v": [sum(cur)]})

    def close(self):
        pass


class RowSessions(StatefulProcessor):
    """:class:`Sessions` in the Row flavour."""

    def init(self, handle):
        self.events = handle.getListState("events", "x BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(r.x) for r in rows]
        self.events.appendList([(x,) for x in xs])
        cur = [t[0] for t in self.events.get()]
        if len(cur) >= SESSION_LEN:
            self.events.clear()
            yield Row(k=key[0], v=sum(cur))

    def close(self):
        pass


# --- map state ---------------------------------------------------------------------------


class MapCounts(StatefulProcessor):
    """Counts per (key, x % MAP_ENTRIES) in map state: many entries per key."""

    def init(self, handle):
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        subs: dict[int, int] = {}
        for pdf in rows:
            for x in pdf["x"]:
                s = int(x) % MAP_ENTRIES
                subs[s] = subs.get(s, 0) + 1
        total = 0
        for s, n in subs.items():
            old = self.m.getValue((s,)) if self.m.containsKey((s,)) else None
            c = n + (old[0] if old else 0)
            self.m.updateValue((s,), (c,))
            total += c
        yield pd.DataFrame({"k": [key[0]], "v": [total]})

    def close(self):
        pass


class RowMapCounts(StatefulProcessor):
    """:class:`MapCounts` in the Row flavour."""

    def init(self, handle):
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        subs: dict[int, int] = {}
        for r in rows:
            s = int(r.x) % MAP_ENTRIES
            subs[s] = subs.get(s, 0) + 1
        total = 0
        for s, n in subs.items():
            old = self.m.getValue((s,)) if self.m.containsKey((s,)) else None
            c = n + (old[0] if old else 0)
            self.m.updateValue((s,), (c,))
            total += c
        yield Row(k=key[0], v=total)

    def close(self):
        pass


# --- event-time timers -------------------------------------------------------------------


def _max_ms(values) -> int:
    return int(pd.to_datetime(pd.Series(values)).max().value // 1_000_000)


class EventTimers(StatefulProcessor):
    """Sums ``x`` per key; emits the sum when the watermark passes the key's latest event."""

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("total", "total BIGINT, maxts BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        s, mx = 0, 0
        for pdf in rows:
            s += int(pdf["x"].sum())
            mx = max(mx, _max_ms(pdf["ts"]))
        old = self.total.get()
        if old is not None:
            s += old[0]
            mx = max(mx, old[1])
            self.handle.deleteTimer(old[1])
        self.total.update((s, mx))
        self.handle.registerTimer(mx)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        t = self.total.get()
        self.total.clear()
        yield pd.DataFrame({"k": [key[0]], "v": [t[0] if t else -1]})

    def close(self):
        pass


class RowEventTimers(StatefulProcessor):
    """:class:`EventTimers` in the Row flavour."""

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("total", "total BIGINT, maxts BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        s, tss = 0, []
        for r in rows:
            s += int(r.x)
            tss.append(r.ts)
        mx = _max_ms(tss)
        old = self.total.get()
        if old is not None:
            s += old[0]
            mx = max(mx, old[1])
            self.handle.deleteTimer(old[1])
        self.total.update((s, mx))
        self.handle.registerTimer(mx)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        t = self.total.get()
        self.total.clear()
        yield Row(k=key[0], v=t[0] if t else -1)

    def close(self):
        pass


# --- no-op: the framework's own cost ---------------------------------------------------------


class NoOp(StatefulProcessor):
    """Touches no state and outputs nothing."""

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        return iter([])

    def close(self):
        pass


class RowNoOp(NoOp):
    """The same, for the Row flavour."""


# name -> (pandas processor, Row processor, time mode, needs a watermark)
PROCESSORS: dict[str, tuple[type, type, str, bool]] = {
    "count": (RunningCount, RowRunningCount, "None", False),
    "sessions": (Sessions, RowSessions, "None", False),
    "map": (MapCounts, RowMapCounts, "None", False),
    "timers": (EventTimers, RowEventTimers, "EventTime", True),
    "noop": (NoOp, RowNoOp, "None", False),
}
