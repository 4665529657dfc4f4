"""The fidelity suite's cases, shared by the classic tests (test_fidelity.py) and the Spark
Connect job (tests/connect/connect_job.py): the input micro-batches, and for each processor
or function how Spark's own operator and ours are called on a stream.

The input is what real streams deliver: realistic event times (late November 2026, not
epoch 0), rows out of order within a batch, rows so late that Spark drops them, rows late
only against the current watermark (which Spark keeps: it drops input at or before the
*previous* batch's watermark), null keys, an empty micro-batch, and keys seen in one batch
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fidelity_procs as F
import numpy as np
import pandas as pd
from harness import never_ends_under_defaults

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP, tag STRING"
OUT = "k STRING, v BIGINT, s STRING"
BASE = pd.Timestamp("2026-11-24 09:00:00")
WATERMARK = ("ts", "5 seconds")


def _rows(rng, n: int, keys: list, start_s: float, spread_s: float) -> pd.DataFrame:
    return pd.DataFrame({
        "k": [keys[i] for i in rng.integers(0, len(keys), n)],
        "x": rng.integers(0, 100, n).astype("int64"),
        "ts": BASE + pd.to_timedelta(start_s + rng.random(n) * spread_s, unit="s"),
        "tag": [["a", "b", "c"][i] for i in rng.integers(0, 3, n)],
    })


def fidelity_batches(seed: int = 11) -> list[pd.DataFrame]:
    """Six micro-batches; event time advances ~10 s per batch, the watermark delay is 5 s.

    With Spark's rules the watermark for eviction of batch b is (max event time before b)
    - 5 s, and input at or before the previous batch's watermark is dropped:

    - b0: on time.
    - b1: rows 40 s behind (dropped by no one: the late-events watermark is still 0),
      out of order, null keys, a key seen only here.
    - b2: empty.
    - b3: rows at +2 s (at or before the late-events watermark, +10 s: dropped) and
      null keys.
    - b4: rows at +20 s (behind the eviction watermark, +30 s, but after the late-events
      watermark, +10 s: kept), rows at +5 s (dropped), a key seen only here.
    - b5: on time, a few dropped rows.
    """
    rng = np.random.default_rng(seed)
    keys = [f"user-{i}" for i in range(7)]
    b0 = _rows(rng, 30, keys, 0, 5)
    b1 = pd.concat([_rows(rng, 30, keys, 10, 5), _rows(rng, 4, keys, -40, 2),
                    _rows(rng, 3, [None], 11, 3), _rows(rng, 1, ["once-b1"], 12, 1)])
    b1 = b1.iloc[rng.permutation(len(b1))]  # out of order
    b2 = b0.iloc[:0]
    b3 = pd.concat([_rows(rng, 30, keys, 30, 5), _rows(rng, 5, keys, 2, 1),
                    _rows(rng, 2, [None], 31, 2)])
    b4 = pd.concat([_rows(rng, 25, keys, 40, 5), _rows(rng, 6, keys, 20, 2),
                    _rows(rng, 4, keys, 5, 1), _rows(rng, 1, ["once-b4"], 41, 1)])
    b4 = b4.iloc[rng.permutation(len(b4))]
    b5 = pd.concat([_rows(rng, 25, keys, 50, 5), _rows(rng, 3, keys, 8, 1)])
    return [b.reset_index(drop=True) for b in (b0, b1, b2, b3, b4, b5)]


@dataclass
class Case:
    """One processor or function, how to call it, and what its run must show."""

    name: str
    target: Any
    kind: str = "pandas"  # pandas / row (transformWithState) / apply
    mode: str = "None"  # timeMode, or the timeout conf for apply
    state_schema: str = ""  # apply only
    watermark: bool = False
    initial: bool = False
    check: Any = None  # extra assertion on our per-batch output
    kwargs: dict = field(default_factory=dict)

    def session(self, spark, spark_no_data):
        """The session to run the case in: Spark's defaults, or no-data micro-batches off
        where its ``availableNow`` query would never end
        (:func:`harness.never_ends_under_defaults`)."""
        return spark_no_data if never_ends_under_defaults(self.mode) else spark

    @property
    def event_timers(self) -> bool:
        """Event-time timers or an event-time timeout, with a watermark: Spark runs no-data
        micro-batches that fire them, and the default runs ours in the carrier."""
        return self.watermark and self.mode in ("EventTime", "EventTimeTimeout")

    @property
    def spark_adds_empty_batches(self) -> bool:
        """Spark's transformWithState without timers (timeMode None) in a query with a
        watermark runs a no-data micro-batch whenever the watermark advances, with no
        output; ours, having no timers, runs none (README "Known differences")."""
        return self.kind != "apply" and self.mode == "None" and self.watermark


def _late_rows_dropped(out: dict[int, pd.DataFrame]) -> None:
    # the final per-key counts: rows at or before the late-events watermark are not counted
    data = fidelity_batches()
    last: dict[str, int] = {}
    for b in sorted(out):
        for k, v in zip(out[b]["k"], out[b]["v"]):
            last[k] = int(v)
    everything = sum(len(b[b["k"].notna()]) for b in data)
    assert 0 < sum(last.values()) < everything


def _sessions_closed(out: dict[int, pd.DataFrame]) -> None:
    assert sum(len(v) for v in out.values()) > 0


CASES = [
    Case("event-sessions", F.EventSessions, mode="EventTime", watermark=True,
         check=_sessions_closed),
    Case("min-max-event-time", F.MinMax, mode="EventTime", watermark=True,
         check=_late_rows_dropped),
    # a watermark but no event-time mode: Spark drops nothing, and neither may we
    Case("min-max-no-time-mode", F.MinMax, mode="None", watermark=True),
    Case("row-min-max-event-time", F.RowMinMax, kind="row", mode="EventTime", watermark=True),
    Case("first-seen", F.FirstSeen, mode="EventTime", watermark=True),
    Case("top-k-list", F.TopK),
    Case("row-top-k-list", F.RowTopK, kind="row"),
    Case("map-with-ttl", F.MapWithTtl, mode="ProcessingTime"),
    Case("apply-catches-pyspark-errors", F.apply_catches, kind="apply", mode=F.NO_TIMEOUT,
         state_schema="c BIGINT"),
    Case("nested-state", F.NestedState),
    Case("row-nested-state", F.RowNestedState, kind="row"),
    Case("composite-states", F.CompositeStates),
    Case("null-keys", F.KeyEcho),
    Case("initial-state-by-position", F.InitialByPosition, initial=True),
    Case("apply-event-sessions", F.apply_sessions, kind="apply", mode=F.EVENT_TIMEOUT,
         state_schema="start TIMESTAMP, last TIMESTAMP, n BIGINT", watermark=True,
         check=_sessions_closed),
    # (Spark's applyInPandasWithState fails on an ARRAY state field: KeyError 'elementType'
    # in its worker; ours stores any type, tests/spark/test_nested_roundtrip.py)
    Case("apply-by-position", F.apply_by_position, kind="apply", mode=F.NO_TIMEOUT,
         state_schema="first BIGINT, n BIGINT, firsts STRING"),
    Case("apply-null-keys", F.apply_key_echo, kind="apply", mode=F.NO_TIMEOUT,
         state_schema="c BIGINT"),
]


def builders(case: Case, backend: Any, init_df, our_mode: str = "Update"):
    """(Spark's query, ours) as functions of the input stream. ``our_mode``: the output
    mode ours declares; it must be its query's under the carrier plan (Spark checks it of
    an applyInPandasWithState; its transformWithStateInPandas does not), and it changes
    no row an operator emits."""
    make = case.target if case.kind == "apply" else case.target
    init = {"initialState": init_df.groupBy("k")} if case.initial else {}
    if case.kind == "apply":
        return (lambda df: df.groupBy("k").applyInPandasWithState(
                    make, OUT, case.state_schema, "Update", case.mode),
                lambda df: backend.apply_in_pandas_with_state(
                    df.groupBy("k"), make, OUT, case.state_schema, our_mode, case.mode))
    if case.kind == "row":
        return (lambda df: df.groupBy("k").transformWithState(make(), OUT, "Update", case.mode,
                                                              **init),
                lambda df: backend.transform_with_state(df.groupBy("k"), make(), OUT, our_mode,
                                                        case.mode, flavour="row", **init))
    return (lambda df: df.groupBy("k").transformWithStateInPandas(make(), OUT, "Update",
                                                                  case.mode, **init),
            lambda df: backend.transform_with_state(df.groupBy("k"), make(), OUT, our_mode,
                                                    case.mode, **init))


CASE_BY_NAME = {c.name: c for c in CASES}
