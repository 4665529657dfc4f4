"""Processors of the import tests (workers unpickle them by module name): every kind of
state Spark's transformWithStateInPandas keeps, each with a TTL, and timers."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

#: 2100-01-01: timers the tests register never fire; their number is part of the output
FAR = 4_102_444_800_000


class EveryState(StatefulProcessor):
    """A count with a nested record (value state), the values seen in order (list state)
    and a count per tag (map state), all with TTLs; one timer per distinct value."""

    def init(self, handle) -> None:
        self.handle = handle
        self.cnt = handle.getValueState(
            "cnt", "n BIGINT, info STRUCT<first: BIGINT, seen: ARRAY<STRING>>", 3_600_000)
        self.hist = handle.getListState("hist", "v BIGINT", 7_200_000)
        self.tags = handle.getMapState("tags", "t STRING", "c BIGINT", 10_800_000)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - PySpark's name
        cur = self.cnt.get() if self.cnt.exists() else None
        n = cur[0] if cur is not None else 0
        first = cur[1][0] if cur is not None else None
        seen = list(cur[1][1]) if cur is not None else []
        for pdf in rows:
            for v in pdf.iloc[:, 1]:  # by position, as user code does
                v = int(v)
                n += 1
                first = v if first is None else first
                seen.append(f"s{v % 4}")
                self.hist.appendValue((v,))
                tag = (f"t{v % 3}",)
                old = self.tags.getValue(tag) if self.tags.containsKey(tag) else None
                self.tags.updateValue(tag, ((old[0] if old else 0) + v,))
                self.handle.registerTimer(FAR + v)
        self.cnt.update((n, (first, seen[-5:])))
        hist = [r[0] for r in self.hist.get()]
        tags = dict((k[0], v[0]) for k, v in self.tags.iterator())
        yield pd.DataFrame({
            "k": [key[0]], "n": [n], "hist": [",".join(map(str, hist))],
            "tags": [",".join(f"{t}={tags[t]}" for t in sorted(tags))],
            "seen": [",".join(seen[-5:])],
            "timers": [len(list(self.handle.listTimers()))]})

    def close(self) -> None:
        pass


OUT = "k STRING, n BIGINT, hist STRING, tags STRING, seen STRING, timers BIGINT"
