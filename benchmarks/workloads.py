"""Workload functions for benchmarks.compare (imported by Spark workers by module name)."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor


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


def count_fn(key, pdfs, state):
    n = sum(len(p) for p in pdfs)
    total = n + (state.get[0] if state.exists else 0)
    state.update((total,))
    yield pd.DataFrame({"k": [key[0]], "v": [total]})


def passthrough(batches):
    """Stateless lower bound: count per key inside the partition, no state."""
    for pdf in batches:
        g = pdf.groupby("k").size()
        yield pd.DataFrame({"k": g.index, "v": g.to_numpy()})


def vector_count(batches, state):
    """Batch-at-a-time running count with vectorised state access."""
    for pdf in batches:
        g = pdf.groupby("k").size()
        old = state.get(pd.Series(g.index, name="k"))["c"].fillna(0).astype("int64").to_numpy()
        new = old + g.to_numpy()
        state.put(pd.Series(g.index, name="k"), pd.DataFrame({"c": new}))
        yield pd.DataFrame({"k": g.index, "v": new})
