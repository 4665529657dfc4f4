"""Processors and functions written the way users write them, for the fidelity suite.

Each one leans on a corner of Spark's semantics a swap-in must reproduce: late rows
dropped before the processor sees them, frames indexed from 0 (``.at[0, ...]``,
``.loc[0]``), PySpark's exception classes, nested state types read back exactly as Spark
returns them (``repr`` of the value is part of the output), null keys, keys seen once.
They live in their own module because Spark workers unpickle them by module name.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pandas as pd
from pyspark.errors import PySparkException, PySparkRuntimeError, PySparkValueError
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

GAP_MS = 10_000
EVENT_TIMEOUT = GroupStateTimeout.EventTimeTimeout
NO_TIMEOUT = GroupStateTimeout.NoTimeout


def ms(ts) -> int:
    return int(pd.Timestamp(ts).value // 1_000_000)


def key_repr(key) -> str:
    return repr(tuple(key))


def canon(v) -> str:
    """``repr`` with map entries in key order: Spark hands a map value back in the order of
    a JVM hash map, ours in insertion order (README, known differences); everything else,
    types, Row field names and nulls included, must match exactly."""
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: repr(kv[0]))
        return "{" + ", ".join(f"{canon(k)}: {canon(x)}" for k, x in items) + "}"
    if isinstance(v, Row) and hasattr(v, "__fields__"):
        return "Row(" + ", ".join(f"{n}={canon(x)}" for n, x in zip(v.__fields__, v)) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(canon(x) for x in v) + "]"
    if isinstance(v, tuple):
        return f"{type(v).__name__}(" + ", ".join(canon(x) for x in v) + ")"
    return repr(v)


# --- event time --------------------------------------------------------------------


class EventSessions(StatefulProcessor):
    """Sessions per key closed by an event-time timer GAP_MS after the last event."""

    def init(self, handle):
        self.handle = handle
        self.session = handle.getValueState("session", "start TIMESTAMP, last TIMESTAMP, n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True)
        first, last = pdf["ts"].min(), pdf["ts"].max()
        cur = self.session.get()
        if cur is not None:
            self.handle.deleteTimer(ms(cur[1]) + GAP_MS)
            first, last = min(first, pd.Timestamp(cur[0])), max(last, pd.Timestamp(cur[1]))
        n = len(pdf) + (cur[2] if cur is not None else 0)
        self.session.update((first.to_pydatetime(), last.to_pydatetime(), n))
        self.handle.registerTimer(ms(last) + GAP_MS)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        start, last, n = self.session.get()
        self.session.clear()
        yield pd.DataFrame({"k": [key[0]], "v": [n],
                            "s": [f"{start.isoformat()}..{last.isoformat()} "
                                  f"wm={timerValues.getCurrentWatermarkInMs()}"]})

    def close(self):
        pass


class MinMax(StatefulProcessor):
    """Minimum and maximum of x per key (EventTime mode: late rows must not count)."""

    def init(self, handle):
        self.bounds = handle.getValueState("bounds", "lo BIGINT, hi BIGINT, n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True)
        lo, hi, n = int(pdf["x"].min()), int(pdf["x"].max()), len(pdf)
        if self.bounds.exists():
            olo, ohi, on = self.bounds.get()
            lo, hi, n = min(lo, olo), max(hi, ohi), n + on
        self.bounds.update((lo, hi, n))
        yield pd.DataFrame({"k": [key[0]], "v": [n], "s": [f"{lo}..{hi}"]})

    def close(self):
        pass


class RowMinMax(StatefulProcessor):
    """MinMax in the Row flavour (``transformWithState``)."""

    def init(self, handle):
        self.bounds = handle.getValueState("bounds", "lo BIGINT, hi BIGINT, n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [r.x for r in rows]
        lo, hi, n = min(xs), max(xs), len(xs)
        if self.bounds.exists():
            olo, ohi, on = self.bounds.get()
            lo, hi, n = min(lo, olo), max(hi, ohi), n + on
        self.bounds.update((lo, hi, n))
        yield Row(k=key[0], v=n, s=f"{lo}..{hi}")

    def close(self):
        pass


def apply_sessions(key, pdfs, state):
    """applyInPandasWithState with an event-time timeout: a session closes GAP_MS after
    its last event; reads the first row of each frame by position."""
    if state.hasTimedOut:
        start, last, n = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "v": [n], "s": [f"closed {start}..{last}"]})
        return
    firsts = []
    n, last = 0, None
    for pdf in pdfs:
        firsts.append(int(pdf.at[0, "x"]))
        n += len(pdf)
        m = pdf["ts"].max()
        last = m if last is None else max(last, m)
    if state.exists:
        start, old_last, old_n = state.get
        last, n = max(pd.Timestamp(old_last), last), n + old_n
    else:
        start = pdf.loc[0, "ts"]
    state.update((pd.Timestamp(start).to_pydatetime(), last.to_pydatetime(), n))
    state.setTimeoutTimestamp(ms(last) + GAP_MS)
    yield pd.DataFrame({"k": [key[0]], "v": [n], "s": [f"open firsts={firsts}"]})


class FirstSeen(StatefulProcessor):
    """Deduplication: one output row per key, the first time it is seen (EventTime mode)."""

    def init(self, handle):
        self.seen = handle.getValueState("seen", "at TIMESTAMP")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True)
        if self.seen.exists():
            return iter([])
        first = pdf.sort_values(["ts", "x"]).iloc[0]
        self.seen.update((first["ts"].to_pydatetime(),))
        return iter([pd.DataFrame({"k": [key[0]], "v": [int(first["x"])],
                                   "s": [str(first["ts"])]})])

    def close(self):
        pass


# --- frames by position, initial state -----------------------------------------------


class InitialByPosition(StatefulProcessor):
    """A running total that reads its initial state and its input by position."""

    def init(self, handle):
        self.total = handle.getValueState("total", "total BIGINT")

    def handleInitialState(self, key, initialState, timerValues):
        self.total.update((int(initialState.at[0, "init"]),))

    def handleInputRows(self, key, rows, timerValues):
        total = self.total.get()[0] if self.total.exists() else 0
        heads = []
        for pdf in rows:
            heads.append(int(pdf.loc[0, "x"]))  # label 0: the frame's first row
            total += int(pdf["x"].sum())
        self.total.update((total,))
        yield pd.DataFrame({"k": [key[0]], "v": [total], "s": [str(heads)]})

    def close(self):
        pass


def apply_by_position(key, pdfs, state):
    """applyInPandasWithState without timeout reading rows by label."""
    firsts = [int(pdf.at[0, "x"]) for pdf in pdfs]
    first, n = (state.get[0], state.get[1]) if state.exists else (firsts[0], 0)
    state.update((first, n + len(firsts), str(firsts)))
    yield pd.DataFrame({"k": [key[0]], "v": [first], "s": [str(firsts)]})


def apply_catches(key, pdfs, state):
    """applyInPandasWithState catching PySpark's exceptions, as functions written for Spark
    do: ``state.get`` of a key without state, a timeout set without a timeout conf."""
    n = sum(len(p) for p in pdfs)
    outcomes = []
    try:
        prev = state.get[0]
    except PySparkValueError as e:
        prev = 0
        outcomes.append(f"PySparkValueError {e.getCondition()}")
    try:
        state.setTimeoutDuration(1000)
    except PySparkRuntimeError as e:
        outcomes.append(f"PySparkRuntimeError {e.getCondition()}")
    except PySparkException as e:
        outcomes.append(f"{type(e).__name__} {e.getCondition()}")
    state.update((prev + n,))
    yield pd.DataFrame({"k": [key[0]], "v": [prev + n], "s": ["/".join(outcomes)]})


# --- lists, maps, TTL ----------------------------------------------------------------


class TopK(StatefulProcessor):
    """The three largest x per key, kept in a list state."""

    K = 3

    def init(self, handle):
        self.top = handle.getListState("top", "x BIGINT, tag STRING")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True)
        cur = [tuple(t) for t in self.top.get()] if self.top.exists() else []
        cand = cur + [(int(x), str(t)) for x, t in zip(pdf["x"], pdf["tag"])]
        best = sorted(cand, key=lambda t: (-t[0], t[1]))[: self.K]
        self.top.put(best)
        yield pd.DataFrame({"k": [key[0]], "v": [best[0][0]], "s": [repr(best)]})

    def close(self):
        pass


class RowTopK(StatefulProcessor):
    """TopK in the Row flavour, appending and trimming."""

    K = 3

    def init(self, handle):
        self.top = handle.getListState("top", "x BIGINT, tag STRING")

    def handleInputRows(self, key, rows, timerValues):
        for r in rows:
            self.top.appendValue((r.x, r.tag))
        best = sorted((tuple(t) for t in self.top.get()), key=lambda t: (-t[0], t[1]))[: self.K]
        self.top.clear()
        self.top.appendList(best)
        yield Row(k=key[0], v=best[0][0], s=repr(best))

    def close(self):
        pass


class MapWithTtl(StatefulProcessor):
    """Counts per tag in two map states: one whose entries expire 1 ms after each write
    (so only this batch's tags survive) and one without TTL."""

    def init(self, handle):
        self.recent = handle.getMapState("recent", "tag STRING", "c BIGINT", 1)
        self.all = handle.getMapState("all", "tag STRING", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True)
        for tag, c in pdf.groupby("tag").size().items():
            for m in (self.recent, self.all):
                old = m.getValue((tag,)) if m.containsKey((tag,)) else None
                m.updateValue((tag,), (int(c) + (old[0] if old else 0),))
        recent = sorted((k[0], v[0]) for k, v in self.recent.iterator())
        everything = sorted((k[0], v[0]) for k, v in self.all.iterator())
        yield pd.DataFrame({"k": [key[0]], "v": [len(everything)],
                            "s": [f"recent={recent} all={everything}"]})

    def close(self):
        pass


# --- errors --------------------------------------------------------------------------


class CatchesPySparkErrors(StatefulProcessor):
    """Calls ``deleteIfExists`` outside ``init`` and catches PySpark's exception, as
    processors written for Spark do (a cleanup attempted late, then carried on without).

    Other misuses are left out because Spark's own Python client loses its connection to
    the JVM after them (a wrongly typed update, a state used after ``deleteIfExists``), so
    there is no Spark behaviour to compare with; tests/spark/test_fidelity.py checks ours.
    """

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        total = n + (self.count.get()[0] if self.count.exists() else 0)
        self.count.update((total,))
        try:
            self.handle.deleteIfExists("count")
            outcome = "ok"
        except PySparkRuntimeError as e:
            outcome = "PySparkRuntimeError " + str(e).split("[", 1)[1].split("]", 1)[0]
        except PySparkException:
            outcome = "PySparkException"
        yield pd.DataFrame({"k": [key[0]], "v": [total], "s": [outcome]})

    def close(self):
        pass


# --- nested and composite state types ------------------------------------------------

NESTED_SCHEMA = (
    "tags ARRAY<ARRAY<STRING>>, by_tag MAP<STRING, ARRAY<BIGINT>>, "
    "stats STRUCT<n: BIGINT, last: STRUCT<x: BIGINT, at: TIMESTAMP>>, "
    "amount DECIMAL(12,2), day DATE, raw BINARY, "
    "events ARRAY<STRUCT<x: BIGINT, tag: STRING>>, "
    "sub MAP<STRING, STRUCT<c: BIGINT, xs: ARRAY<BIGINT>>>, ntz TIMESTAMP_NTZ")


def nested_next(old, xs: list[int], tags: list[str], at) -> tuple:
    """The next nested value: every field changes with the input, nulls at several levels."""
    if old is None:
        tags_acc, by_tag, n, events, sub = [], {}, 0, [], {}
    else:
        tags_acc = [list(t) if t is not None else None for t in old[0]]
        by_tag = {k: (list(v) if v is not None else None) for k, v in old[1].items()}
        n = old[2][0]
        events = [e for e in old[6]]
        sub = {k: v for k, v in old[7].items()}
    tags_acc = (tags_acc + [sorted(tags) + [None], None])[-4:]
    for x, t in zip(xs, tags):
        by_tag[t] = ((by_tag.get(t) or []) + [x])[-3:]
    by_tag["none"] = None
    n += len(xs)
    events = (events + [Row(x=xs[0], tag=tags[0]), None])[-4:]
    sub[tags[-1]] = Row(c=len(xs), xs=xs[:3] + [None])
    sub["empty"] = Row(c=None, xs=None)
    amount = decimal.Decimal(sum(xs)) / 4
    return (tags_acc, by_tag, Row(n=n, last=Row(x=xs[-1], at=at.to_pydatetime())),
            amount.quantize(decimal.Decimal("0.01")), dt.date(2026, 11, 1) + dt.timedelta(days=n % 7),
            bytes([n % 256, 0, 255]), events, sub, dt.datetime(2026, 11, 24, 12, 0) +
            dt.timedelta(seconds=n))


class NestedState(StatefulProcessor):
    """Keeps a deeply nested value per key and emits ``repr`` of what it reads back."""

    def init(self, handle):
        self.v = handle.getValueState("v", NESTED_SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True).sort_values(["x", "tag"])
        before = self.v.get()
        self.v.update(nested_next(before, [int(x) for x in pdf["x"]], list(pdf["tag"]),
                                  pdf["ts"].max()))
        yield pd.DataFrame({"k": [key[0]], "v": [len(pdf)],
                            "s": [canon(before) + " -> " + canon(self.v.get())]})

    def close(self):
        pass


class RowNestedState(StatefulProcessor):
    """NestedState in the Row flavour."""

    def init(self, handle):
        self.v = handle.getValueState("v", NESTED_SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        rs = sorted(rows, key=lambda r: (r.x, r.tag))
        before = self.v.get()
        self.v.update(nested_next(before, [r.x for r in rs], [r.tag for r in rs],
                                  pd.Timestamp(max(r.ts for r in rs))))
        yield Row(k=key[0], v=len(rs), s=canon(before) + " -> " + canon(self.v.get()))

    def close(self):
        pass


class CompositeStates(StatefulProcessor):
    """A list of structs and a map with a struct key and a struct value holding an array."""

    def init(self, handle):
        self.history = handle.getListState("history", "at TIMESTAMP, xs ARRAY<BIGINT>")
        self.buckets = handle.getMapState("buckets", "tag STRING, bucket BIGINT",
                                          "c BIGINT, xs ARRAY<BIGINT>")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows), ignore_index=True).sort_values(["x", "tag"])
        self.history.appendValue((pdf["ts"].max().to_pydatetime(), [int(x) for x in pdf["x"]]))
        for (tag, bucket), g in pdf.groupby(["tag", pdf["x"] // 50]):
            uk = (tag, int(bucket))
            old = self.buckets.getValue(uk) if self.buckets.containsKey(uk) else None
            xs = [int(x) for x in g["x"]]
            self.buckets.updateValue(uk, (len(xs) + (old[0] if old else 0),
                                          ((list(old[1]) if old else []) + xs)[-3:]))
        hist = [repr(tuple(h)) for h in self.history.get()]
        buckets = sorted((repr(tuple(k)), repr(tuple(v))) for k, v in self.buckets.iterator())
        yield pd.DataFrame({"k": [key[0]], "v": [len(hist)], "s": [f"{hist} {buckets}"]})

    def close(self):
        pass


# --- null keys -----------------------------------------------------------------------


class KeyEcho(StatefulProcessor):
    """A running count that reports the key as the processor receives it (null keys)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        total = n + (self.count.get()[0] if self.count.exists() else 0)
        self.count.update((total,))
        yield pd.DataFrame({"k": [key[0]], "v": [total], "s": [key_repr(key)]})

    def close(self):
        pass


def apply_key_echo(key, pdfs, state):
    """applyInPandasWithState: the running count and the key as received."""
    n = sum(len(p) for p in pdfs)
    total = n + (state.get[0] if state.exists else 0)
    state.update((total,))
    yield pd.DataFrame({"k": [key[0]], "v": [total], "s": [key_repr(key)]})


# --- misuse Spark's client survives ----------------------------------------------------


def outcome(call) -> str:
    """What ``call()`` gives, as text: its result's type and ``repr``, or the exception's
    class, error condition and message (iterators are drained inside the call). The class
    named is the nearest one PySpark or Python defines: statebackend's errors subclass
    PySpark's (``StateError`` is a ``PySparkRuntimeError``)."""
    try:
        r = call()
    except Exception as e:  # noqa: BLE001 - the class is part of the outcome
        cls = next(c for c in type(e).__mro__
                   if c.__module__.split(".")[0] in ("pyspark", "builtins"))
        cond = e.getCondition() if isinstance(e, PySparkException) else None
        return f"{cls.__name__} [{cond}] {e}"
    return f"{type(r).__name__} {canon(r)}"


class MisusedStates(StatefulProcessor):
    """Every state call a processor can get wrong without Spark losing its worker: objects
    Spark's client converts (a one-character string as a map key, a list, a Row, numpy and
    pandas scalars), objects it refuses before calling the JVM (an int where a tuple goes,
    a string in a TIMESTAMP field), and states deleted with ``deleteIfExists`` in ``init``.
    Works in both flavours; ``rows`` is only counted."""

    def init(self, handle):
        import numpy as np

        self.np = np
        self.handle = handle
        self.value = handle.getValueState("value", "c BIGINT")
        self.pair = handle.getValueState("pair", "name STRING, at TIMESTAMP")
        self.items = handle.getListState("items", "c BIGINT")
        self.by_name = handle.getMapState("by_name", "name STRING", "c BIGINT")
        self.by_pair = handle.getMapState("by_pair", "name STRING, n BIGINT", "c BIGINT, s STRING")
        self.nested = handle.getValueState(
            "nested", "inner STRUCT<a: BIGINT, b: BIGINT>, tags ARRAY<STRUCT<x: BIGINT, y: BIGINT>>")
        self.gone_v = handle.getValueState("gone_v", "c BIGINT")
        self.gone_l = handle.getListState("gone_l", "c BIGINT")
        self.gone_m = handle.getMapState("gone_m", "name STRING", "c BIGINT")
        for name in ("gone_v", "gone_l", "gone_m", "never_declared"):
            handle.deleteIfExists(name)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(r) if isinstance(r, pd.DataFrame) else 1 for r in rows)
        np, v, p, li, m, m2 = self.np, self.value, self.pair, self.items, self.by_name, self.by_pair
        nv = self.nested
        at = pd.Timestamp("2026-11-24 09:00:01.5")
        calls = [
            # conversions Spark's client makes
            ("value update list", lambda: v.update([n])),
            ("value get", lambda: v.get()),
            ("value update numpy", lambda: v.update((np.int64(n + 1),))),
            ("value get", lambda: v.get()),
            ("value update Row", lambda: v.update(Row(c=n + 2))),
            ("value get", lambda: v.get()),
            ("pair update pandas", lambda: p.update(("a", at))),
            ("pair get", lambda: p.get()),
            ("pair update Row out of order", lambda: p.update(Row(at=at, name="b"))),
            ("pair update list numpy", lambda: p.update(["c", np.datetime64("2026-11-24T09:00:02")])),
            ("pair get", lambda: p.get()),
            ("list put", lambda: li.put([(1,), [np.int32(2)], Row(c=3)])),
            ("list get", lambda: list(li.get())),
            ("list append", lambda: li.appendValue([np.int64(4)])),
            ("list appendList", lambda: li.appendList([[5], (6,)])),
            ("list get", lambda: list(li.get())),
            ("map update str key", lambda: m.updateValue("7", (n,))),
            ("map contains str key", lambda: m.containsKey("7")),
            ("map contains tuple key", lambda: m.containsKey(("7",))),
            ("map contains list key", lambda: m.containsKey(["7"])),
            ("map contains Row key", lambda: m.containsKey(Row(name="7"))),
            ("map contains absent", lambda: m.containsKey("8")),
            ("map get str key", lambda: m.getValue("7")),
            ("map get absent", lambda: m.getValue("8")),
            ("map update numpy key", lambda: m.updateValue((np.str_("x"),), [np.int64(1)])),
            ("map keys", lambda: sorted(m.keys())),
            ("map values", lambda: sorted(m.values())),
            ("map iterator", lambda: sorted(m.iterator())),
            ("map remove str key", lambda: m.removeKey("x")),
            ("map keys", lambda: sorted(m.keys())),
            ("map2 update list key", lambda: m2.updateValue(["a", np.int64(1)], [2, "s"])),
            ("map2 update Row key", lambda: m2.updateValue(Row(name="b", n=2), Row(c=3, s="t"))),
            ("map2 get", lambda: m2.getValue(("a", 1))),
            ("map2 iterator", lambda: sorted(m2.iterator())),
            # nested structs: Rows by position, dicts by name
            ("nested update Rows", lambda: nv.update((Row(b=2, a=1), [Row(y=6, x=5)]))),
            ("nested get", lambda: nv.get()),
            ("nested update dicts", lambda: nv.update(({"b": 2, "a": 1}, [{"y": 6, "x": 5}]))),
            ("nested get", lambda: nv.get()),
            ("nested update list Rows", lambda: nv.update([[3, 4], [Row(y=8, x=7), (9, 10)]])),
            ("nested get", lambda: nv.get()),
            # refused by Spark's client before it reaches the JVM
            ("value update int", lambda: v.update(5)),
            ("value update None", lambda: v.update(None)),
            ("pair update str time", lambda: p.update(("a", "noon"))),
            ("list append int", lambda: li.appendValue(5)),
            ("list put ints", lambda: li.put([1, 2])),
            ("map update int key", lambda: m.updateValue(7, (1,))),
            ("map contains int key", lambda: m.containsKey(7)),
            ("map get int key", lambda: m.getValue(7)),
            ("map remove int key", lambda: m.removeKey(7)),
            ("map update int value", lambda: m.updateValue("k", 1)),
            ("value get", lambda: v.get()),
            # states deleted in init
            ("gone value exists", lambda: self.gone_v.exists()),
            ("gone value get", lambda: self.gone_v.get()),
            ("gone value update", lambda: self.gone_v.update((1,))),
            ("gone value clear", lambda: self.gone_v.clear()),
            ("gone list exists", lambda: self.gone_l.exists()),
            ("gone list get", lambda: list(self.gone_l.get())),
            ("gone list put", lambda: self.gone_l.put([(1,)])),
            ("gone list append", lambda: self.gone_l.appendValue((1,))),
            ("gone list appendList", lambda: self.gone_l.appendList([(1,)])),
            ("gone list clear", lambda: self.gone_l.clear()),
            ("gone map exists", lambda: self.gone_m.exists()),
            ("gone map get", lambda: self.gone_m.getValue("a")),
            ("gone map contains", lambda: self.gone_m.containsKey("a")),
            ("gone map update", lambda: self.gone_m.updateValue("a", (1,))),
            ("gone map iterator", lambda: list(self.gone_m.iterator())),
            ("gone map keys", lambda: list(self.gone_m.keys())),
            ("gone map values", lambda: list(self.gone_m.values())),
            ("gone map remove", lambda: self.gone_m.removeKey("a")),
            ("gone map clear", lambda: self.gone_m.clear()),
            # timers in timeMode None: Spark's client asks only when iterated
            ("listTimers not iterated", lambda: (self.handle.listTimers(), "called")[1]),
        ]
        out = [(i, f"{what}: {outcome(call)}") for i, (what, call) in enumerate(calls)]
        return self.emit(key[0], out)

    def emit(self, k, out):
        yield pd.DataFrame({"k": [k] * len(out), "v": [i for i, _ in out],
                            "s": [s for _, s in out]})

    def close(self):
        pass


class RowMisusedStates(MisusedStates):
    """MisusedStates in the Row flavour (``transformWithState``)."""

    def emit(self, k, out):
        for i, s in out:
            yield Row(k=k, v=i, s=s)


class MisusedTimers(StatefulProcessor):
    """Timer calls with timestamps of the wrong type, in ProcessingTime mode (the timers
    lie far in the future: none fires)."""

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        import numpy as np

        for _ in rows:
            pass
        h, far = self.handle, 4_000_000_000_000
        calls = [
            ("register numpy", lambda: h.registerTimer(np.int64(far))),
            ("register str", lambda: h.registerTimer("soon")),
            ("register float", lambda: h.registerTimer(float(far + 1))),
            ("register None", lambda: h.registerTimer(None)),
            ("register bool", lambda: h.registerTimer(True)),
            ("register too big", lambda: h.registerTimer(1 << 64)),
            ("delete str", lambda: h.deleteTimer("soon")),
            ("delete float", lambda: h.deleteTimer(float(far))),
            ("delete numpy", lambda: h.deleteTimer(np.int32(7))),
            ("list", lambda: sorted(h.listTimers())),
        ]
        return self.emit(key[0], [(i, f"{what}: {outcome(call)}")
                                  for i, (what, call) in enumerate(calls)])

    def emit(self, k, out):
        yield pd.DataFrame({"k": [k] * len(out), "v": [i for i, _ in out],
                            "s": [s for _, s in out]})

    def close(self):
        pass
