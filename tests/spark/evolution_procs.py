"""Processors of the schema evolution restart tests: version 1 and version 2 of the same
query's code, whose state schemas differ by compatible changes (a module of its own, so
Spark workers unpickle them by name)."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor


class CountV1(StatefulProcessor):
    """A running count, the x of every row in a list, a count per x % 3 in a map."""

    def init(self, handle):
        self.acc = handle.getValueState("acc", "n INT, meta STRUCT<a: INT>")
        self.xs = handle.getListState("xs", "x INT")
        self.m = handle.getMapState("m", "sub BIGINT", "c INT")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        old = self.acc.get()
        n = len(xs) + (old[0] if old is not None else 0)
        self.acc.update((n, (len(xs),)))
        self.xs.appendList([(x,) for x in xs])
        for x in xs:
            c = self.m.getValue((x % 3,))
            self.m.updateValue((x % 3,), ((c[0] if c else 0) + 1,))
        yield pd.DataFrame({"k": [key[0]], "v": [n]})

    def close(self):
        pass


class CountV2(StatefulProcessor):
    """CountV1 after compatible changes: fields reordered, added (also inside the struct;
    one with a DEFAULT), widened (INT to BIGINT, at every depth), a TTL added to the list."""

    def init(self, handle):
        self.acc = handle.getValueState(
            "acc", "note STRING DEFAULT 'old', meta STRUCT<b: STRING, a: BIGINT>, n BIGINT")
        self.xs = handle.getListState("xs", "y STRING, x BIGINT", 3_600_000)
        self.m = handle.getMapState("m", "sub BIGINT", "c BIGINT, d DOUBLE")

    def handleInputRows(self, key, rows, timerValues):
        xs = [int(x) for pdf in rows for x in pdf["x"]]
        old = self.acc.get()
        n = len(xs) + (old[2] if old is not None else 0)
        self.acc.update(("v2", ("b", len(xs)), n))
        self.xs.appendList([("v2", x) for x in xs])
        for x in xs:
            c = self.m.getValue((x % 3,))
            self.m.updateValue((x % 3,), ((c[0] if c else 0) + 1, 0.5))
        yield pd.DataFrame({"k": [key[0]], "v": [n]})

    def close(self):
        pass


class CountNarrowed(StatefulProcessor):
    """An incompatible change: the count narrowed from BIGINT to SMALLINT."""

    def init(self, handle):
        self.acc = handle.getValueState(
            "acc", "note STRING, meta STRUCT<b: STRING, a: BIGINT>, n SMALLINT")

    def handleInputRows(self, key, rows, timerValues):
        yield pd.DataFrame({"k": [key[0]], "v": [0]})

    def close(self):
        pass


class RowCountV1(StatefulProcessor):
    """Row flavour: a running count."""

    def init(self, handle):
        self.acc = handle.getValueState("acc", "n INT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(1 for _ in rows)
        old = self.acc.get()
        n += old[0] if old is not None else 0
        self.acc.update((n,))
        yield Row(k=key[0], v=n)

    def close(self):
        pass


class RowCountV2(StatefulProcessor):
    """RowCountV1 with the count widened and a field added before it."""

    def init(self, handle):
        self.acc = handle.getValueState("acc", "extra STRING, n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(1 for _ in rows)
        old = self.acc.get()
        n += old[1] if old is not None else 0
        self.acc.update(("v2", n))
        yield Row(k=key[0], v=n)

    def close(self):
        pass


def count_v1(key, pdfs, state):
    """applyInPandasWithState, state schema ``n INT``."""
    n = sum(len(p) for p in pdfs) + (state.get[0] if state.exists else 0)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "v": [n]})


def count_v2(key, pdfs, state):
    """count_v1 with state schema ``extra STRING, n BIGINT``."""
    n = sum(len(p) for p in pdfs) + (state.get[1] if state.exists else 0)
    state.update(("v2", n))
    yield pd.DataFrame({"k": [key[0]], "v": [n]})


def vector_count_v2(frames, state):
    """map_in_pandas: the running count with state schema ``d DOUBLE, c BIGINT``."""
    for pdf in frames:
        g = pdf.groupby("k").size()
        keys = pd.Series(g.index, name="k")
        old = state.get(keys)["c"].fillna(0).astype("int64").to_numpy()
        new = old + g.to_numpy()
        state.put(keys, pd.DataFrame({"d": new / 2, "c": new}))
        yield pd.DataFrame({"k": g.index, "v": new})
