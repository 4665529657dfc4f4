"""Processors for queries that chain stateful operators on ``eventTimeColumnName``
(tests/spark/test_chaining.py). Each is an ordinary PySpark processor, run unchanged on
Spark's operator and on ours."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

EMIT_SCHEMA = "k STRING, ts TIMESTAMP, n BIGINT"


def _max_ts(rows) -> tuple[int, pd.Timestamp | None]:
    n, mx = 0, None
    for pdf in rows:
        n += len(pdf)
        t = pd.to_datetime(pdf["ts"]).max()
        mx = t if mx is None else max(mx, t)
    return n, mx


class EmitLatest(StatefulProcessor):
    """Per key and batch: (k, latest input time, running row count)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n, mx = _max_ts(rows)
        old = self.count.get()
        total = n + (old[0] if old is not None else 0)
        self.count.update((total,))
        yield pd.DataFrame({"k": [key[0]], "ts": [mx], "n": [total]})

    def close(self):
        pass


class EmitAnHourEarlier(StatefulProcessor):
    """Emits its input's latest time minus one hour: older than the watermark as soon as
    the watermark is past the first batch's times."""

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        _, mx = _max_ts(rows)
        yield pd.DataFrame({"k": [key[0]], "ts": [mx - pd.Timedelta(hours=1)], "n": [1]})

    def close(self):
        pass


class EmitAtWatermark(StatefulProcessor):
    """Emits a row timed exactly at the batch's watermark (once it is past 0): allowed, as
    Spark checks output against the previous batch's watermark, the one for late events."""

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        wm = timerValues.getCurrentWatermarkInMs()
        if wm > 0:
            yield pd.DataFrame({"k": [key[0]], "ts": [pd.Timestamp(wm, unit="ms")], "n": [wm]})

    def close(self):
        pass


class SumUntilWatermark(StatefulProcessor):
    """Downstream of an emitting operator: sums ``n`` per key and emits the sum when the
    watermark passes the earliest ``ts`` of the sum (an event-time timer)."""

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("total", "total BIGINT, first BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        s, first = 0, None
        for pdf in rows:
            s += int(pdf["n"].sum())
            t = int(pd.to_datetime(pdf["ts"]).min().value // 1_000_000)
            first = t if first is None else min(first, t)
        old = self.total.get()
        if old is None:
            self.handle.registerTimer(first)
        else:
            s, first = s + old[0], old[1]
        self.total.update((s, first))
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        t = self.total.get()
        self.total.clear()
        yield pd.DataFrame({"k": [key[0]], "v": [t[0] if t else 0]})

    def close(self):
        pass
