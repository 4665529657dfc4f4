"""The import tests' processor (workers unpickle it by module name): every kind of state
Spark's transformWithStateInPandas keeps, each with a TTL, and timers; their input, and the
two exports they compare (Spark's ``statestore`` source and our ``read_state``), shared by
tests/spark/test_import_spark.py and the Connect job."""

from __future__ import annotations

import json

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

#: 2100-01-01: timers the tests register never fire; their number is part of the output
FAR = 4_102_444_800_000


class EveryState(StatefulProcessor):
    """A count with a nested record (value state), the values seen in order (list state)
    and a count per tag (map state), all with TTLs; the last value without a TTL; one
    timer per distinct value."""

    def init(self, handle) -> None:
        self.handle = handle
        self.cnt = handle.getValueState(
            "cnt", "n BIGINT, info STRUCT<first: BIGINT, seen: ARRAY<STRING>>", 3_600_000)
        self.hist = handle.getListState("hist", "v BIGINT", 7_200_000)
        self.tags = handle.getMapState("tags", "t STRING", "c BIGINT", 10_800_000)
        self.last = handle.getValueState("last", "x BIGINT")

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
        before = self.last.get()[0] if self.last.exists() else -1
        self.last.update((v,))
        hist = [r[0] for r in self.hist.get()]
        tags = dict((k[0], v[0]) for k, v in self.tags.iterator())
        yield pd.DataFrame({
            "k": [key[0]], "n": [n], "hist": [",".join(map(str, hist))],
            "tags": [",".join(f"{t}={tags[t]}" for t in sorted(tags))],
            "seen": [",".join(seen[-5:])], "before": [before],
            "timers": [len(list(self.handle.listTimers()))]})

    def close(self) -> None:
        pass


OUT = ("k STRING, n BIGINT, hist STRING, tags STRING, seen STRING, before BIGINT, "
       "timers BIGINT")


T0 = pd.Timestamp("2026-11-28 09:00:00")


def batch(i: int) -> pd.DataFrame:
    """Micro-batch ``i``: a null key, a key seen once (once-<i>), repeated keys, event
    times out of order."""
    keys = ["a", "b", None, "a", f"once-{i}", "c", "b", "a"]
    return pd.DataFrame({"k": keys, "x": [(7 * i + j) % 11 for j in range(len(keys))],
                         "ts": [T0 + pd.Timedelta(seconds=30 * i - 5 * j)
                                for j in range(len(keys))]})


BEFORE = [batch(i) for i in range(3)]  # Spark's operator, before the move
AFTER = [batch(i) for i in range(3, 6)]  # after it


def spark_query(df):
    """Spark's own operator with the processor."""
    return df.groupBy("k").transformWithStateInPandas(EveryState(), OUT, "Update",
                                                      "ProcessingTime")


def _canon(v) -> str:
    return json.dumps(v.asDict(recursive=True) if hasattr(v, "asDict") else v,
                      sort_keys=True, default=str)


def spark_export(spark, ck: str) -> dict[str, list[tuple]]:
    """Spark's export of every state, as (key, user key, value, expiry) in list order."""
    read = spark.read.format("statestore")
    out: dict[str, list[tuple]] = {}
    for r in read.option("stateVarName", "cnt").load(ck).collect():
        out.setdefault("cnt", []).append((r.key.k, None, _canon(r.value.value),
                                          r.value.ttlExpirationMs))
    for r in read.option("stateVarName", "last").load(ck).collect():  # no TTL
        out.setdefault("last", []).append((r.key.k, None, _canon(r.value), None))
    for r in read.option("stateVarName", "hist").option("flattenCollectionTypes", "false"
                                                         ).load(ck).collect():
        for e in r.list_value:
            out.setdefault("hist", []).append((r.key.k, None, _canon(e.value),
                                               e.ttlExpirationMs))
    for r in read.option("stateVarName", "tags").option("flattenCollectionTypes", "true"
                                                         ).load(ck).collect():
        out.setdefault("tags", []).append((r.key.k, _canon(r.user_map_key),
                                           _canon(r.user_map_value.value),
                                           r.user_map_value.ttlExpirationMs))
    return out


def ours_export(backend, spark, operator_id: str, savepoint: str) -> dict[str, list[tuple]]:
    """``read_state`` of the savepoint, in :func:`spark_export`'s form."""
    out: dict[str, list[tuple]] = {}
    for name in ("cnt", "last", "hist", "tags"):
        rows = backend.read_state(spark, operator_id, state_name=name,
                                  savepoint=savepoint).collect()
        out[name] = [(r.key.k, None if r.user_key is None else _canon(r.user_key),
                      _canon(r.value), r.expiration_ms) for r in rows]
    return out


def in_key_order(entries: list[tuple]) -> dict:
    """Entries per key, in their order (a list's order is part of its value)."""
    per: dict = {}
    for e in entries:
        per.setdefault(e[0], []).append(e[1:])
    return per


def assert_same_exports(ours: dict[str, list[tuple]], theirs: dict[str, list[tuple]]) -> None:
    """Every entry equal, expiries included; each key's list in Spark's order."""
    for name in ("cnt", "last", "tags"):
        assert sorted(ours[name], key=str) == sorted(theirs[name], key=str), name
    assert in_key_order(ours["hist"]) == in_key_order(theirs["hist"])
