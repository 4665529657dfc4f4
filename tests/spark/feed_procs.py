"""A processor that puts and deletes every kind of state the readers expose, for the
distributed reader and change-feed tests (on the workers' PYTHONPATH, see conftest.py)."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

HOUR_MS = 3_600_000


class FeedStates(StatefulProcessor):
    """Per key: a count cleared every time it reaches a multiple of 4 (value, deletes), the
    last x with a TTL (expiration_ms), the last four x (list, rewritten when it grows past
    four), counts per x % 3 removed at 3 (map, deletes) and one processing-time timer an
    hour ahead, replaced every batch (timer puts and deletes)."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count BIGINT")
        self.last = handle.getValueState("last", "x BIGINT", HOUR_MS)
        self.items = handle.getListState("items", "x BIGINT")
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        old = self.count.get()
        total = len(xs) + (old[0] if old else 0)
        if total % 4 == 0:
            self.count.clear()
        else:
            self.count.update((total,))
        self.last.update((xs[-1],))
        self.items.appendList([(x,) for x in xs])
        cur = [t[0] for t in self.items.get()]
        if len(cur) > 4:
            self.items.put([(x,) for x in cur[-3:]])
        for x in xs:
            sub = (x % 3,)
            c = self.m.getValue(sub) if self.m.containsKey(sub) else None
            c = (c[0] if c else 0) + 1
            if c >= 3:
                self.m.removeKey(sub)
            else:
                self.m.updateValue(sub, (c,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + HOUR_MS
                                  + sum(xs))
        yield pd.DataFrame({"k": [key[0]], "v": [total]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        return iter([])

    def close(self):
        pass
