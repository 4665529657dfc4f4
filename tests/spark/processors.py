"""StatefulProcessors and applyInPandasWithState functions used by the Spark tests.

They live in their own module (on the workers' PYTHONPATH, see conftest.py) because Spark
workers unpickle user classes by module name. Each is an ordinary PySpark processor: the
differential tests run the very same object on Spark's operator and on ours.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout


class RunningCount(StatefulProcessor):
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


class ListOps(StatefulProcessor):
    """appendValue for small batches, appendList for larger, put to keep the last 5."""

    def init(self, handle):
        self.items = handle.getListState("items", "x BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        if len(xs) == 1:
            self.items.appendValue((xs[0],))
        else:
            self.items.appendList([(x,) for x in xs])
        cur = [t[0] for t in self.items.get()]
        if len(cur) > 5:
            cur = cur[-5:]
            self.items.put([(x,) for x in cur])
        yield pd.DataFrame({"k": [key[0]], "v": [sum(cur) * 100 + len(cur)]})

    def close(self):
        pass


class MapOps(StatefulProcessor):
    """Counts per (key, x % 3); an entry that reaches 3 is removed."""

    def init(self, handle):
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            for x in pdf["x"]:
                sub = (int(x) % 3,)
                c = self.m.getValue(sub) if self.m.containsKey(sub) else None
                c = (c[0] if c else 0) + 1
                if c >= 3:
                    self.m.removeKey(sub)
                else:
                    self.m.updateValue(sub, (c,))
        entries = sorted((k[0], v[0]) for k, v in self.m.iterator())
        v = sum(s * 10 + c for s, c in entries)
        yield pd.DataFrame({"k": [key[0]], "v": [v * 1000 + len(entries)]})

    def close(self):
        pass


class ProcessingTimer(StatefulProcessor):
    """Registers a timer just after this batch's processing time; it fires next batch."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        old = self.count.get()
        self.count.update((n + (old[0] if old else 0),))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield pd.DataFrame({"k": [key[0]], "v": [n]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        c = self.count.get()
        self.count.clear()
        yield pd.DataFrame({"k": [key[0]], "v": [-(c[0] if c else 0)]})

    def close(self):
        pass


class EventTimer(StatefulProcessor):
    """Sums values per key and emits the sum when the watermark passes the key's max event time."""

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("total", "total BIGINT, maxts BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        s, mx = 0, 0
        for pdf in rows:
            s += int(pdf["x"].sum())
            mx = max(mx, int(pd.to_datetime(pdf["ts"]).max().value // 1_000_000))
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


class TtlCount(RunningCount):
    """A count whose state expires 1 ms after each update: every batch starts over."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT", 1)


class InitialCount(RunningCount):
    """RunningCount that starts from an initial-state DataFrame (k, init)."""

    def handleInitialState(self, key, initialState, timerValues):
        self.count.update((int(initialState["init"].iloc[0]),))


def count_fn(key, pdfs, state):
    """applyInPandasWithState, no timeout: running count."""
    n = sum(len(p) for p in pdfs)
    total = n + (state.get[0] if state.exists else 0)
    state.update((total,))
    yield pd.DataFrame({"k": [key[0]], "v": [total]})


def event_timeout_fn(key, pdfs, state):
    """applyInPandasWithState with EventTimeTimeout: emit the sum when the key goes quiet."""
    if state.hasTimedOut:
        s = state.get[0]
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "v": [-s]})
        return
    s, mx = 0, 0
    for p in pdfs:
        s += int(p["x"].sum())
        mx = max(mx, int(pd.to_datetime(p["ts"]).max().value // 1_000_000))
    if state.exists:
        s += state.get[0]
    state.update((s,))
    state.setTimeoutTimestamp(mx + 1)
    yield pd.DataFrame({"k": [key[0]], "v": [s]})


NO_TIMEOUT = GroupStateTimeout.NoTimeout
EVENT_TIMEOUT = GroupStateTimeout.EventTimeTimeout


class FailOnce(RunningCount):
    """RunningCount whose first attempt of partition 0 in micro-batch 1 fails mid-batch,
    after it has already updated some state (the retry must not see those updates)."""

    def handleInputRows(self, key, rows, timerValues):
        from pyspark import TaskContext

        out = list(super().handleInputRows(key, rows, timerValues))
        tc = TaskContext.get()
        if (tc.partitionId() == 0 and tc.attemptNumber() == 0
                and tc.getLocalProperty("streaming.sql.batchId") == "1"):
            raise RuntimeError("injected failure on the first attempt")
        yield from out



class AllStates(StatefulProcessor):
    """A running count (value), every x (list) and counts per x % 3 (map), for read_state."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")
        self.items = handle.getListState("items", "x BIGINT")
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        old = self.count.get()
        self.count.update((len(xs) + (old[0] if old else 0),))
        self.items.appendList([(x,) for x in xs])
        for x in xs:
            c = self.m.getValue((x % 3,)) if self.m.containsKey((x % 3,)) else None
            self.m.updateValue((x % 3,), ((c[0] if c else 0) + 1,))
        yield pd.DataFrame({"k": [key[0]], "v": [len(xs)]})

    def close(self):
        pass


class RowRunningCount(StatefulProcessor):
    """The Row flavour (for ``transformWithState``): takes and yields pyspark Rows."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        n = sum(1 for _ in rows)
        old = self.count.get()
        total = n + (old[0] if old is not None else 0)
        self.count.update((total,))
        yield Row(k=key[0], v=total)

    def close(self):
        pass


def vector_count(frames, state):
    """map_in_pandas: running count per key with whole-column state access."""
    for pdf in frames:
        assert list(pdf.columns) == ["k", "x", "ts"], pdf.columns  # only the user's columns
        g = pdf.groupby("k").size()
        keys = pd.Series(g.index, name="k")
        old = state.get(keys)["c"].fillna(0).astype("int64").to_numpy()
        new = old + g.to_numpy()
        state.put(keys, pd.DataFrame({"c": new}))
        yield pd.DataFrame({"k": g.index, "v": new})


def vector_count_frames(frames, state):
    """vector_count that also reports, per output row, the task's partition, the index of
    the frame within the task and that frame's row count."""
    from pyspark import TaskContext

    part = TaskContext.get().partitionId()
    for i, pdf in enumerate(frames):
        for out in vector_count(iter([pdf]), state):
            yield out.assign(p=part, i=i, f=len(pdf))


def vector_count_n(frames, state):
    """map_in_pandas keyed by the bigint column ``n`` (the plan ships Spark's key groups)."""
    for pdf in frames:
        assert list(pdf.columns) == ["n", "x"], pdf.columns  # only the user's columns
        g = pdf.groupby("n").size()
        keys = pd.Series(g.index, name="n")
        old = state.get(keys)["c"].fillna(0).astype("int64").to_numpy()
        new = old + g.to_numpy()
        state.put(keys, pd.DataFrame({"c": new}))
        yield pd.DataFrame({"n": g.index, "v": new})


def vector_touch_all(frames, state):
    """map_in_pandas that asks for the state of keys its partition does not own."""
    for pdf in frames:
        state.get(pd.Series([f"k{i}" for i in range(40)], name="k"))
        yield pdf[["k"]].assign(v=0)
