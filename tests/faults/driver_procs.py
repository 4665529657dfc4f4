"""The processor of driver_job.py (workers import it by module name from PYTHONPATH)."""

from __future__ import annotations

import time

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor


class SlowCount(StatefulProcessor):
    """A running count per key; every task first sleeps ``sleep_s`` (so that a micro-batch
    lasts long enough for a kill from outside to land in the middle of one)."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s

    def init(self, handle):
        self.count = handle.getValueState("count", "count BIGINT")
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        old = self.count.get()
        total = n + (old[0] if old is not None else 0)
        self.count.update((total,))
        yield pd.DataFrame({"k": [key[0]], "v": [total]})

    def close(self):
        pass
