"""Fidelity suite: processors and functions written as users write them, run on Spark's own
operators and on ours over the same input files, every micro-batch's output compared.

The input is what real streams deliver: realistic event times (late November 2026, not
epoch 0), rows out of order within a batch, rows so late that Spark drops them, rows late
only against the current watermark (which Spark keeps: it drops input at or before the
*previous* batch's watermark), null keys, an empty micro-batch, and keys seen in one batch
only. The processors read frames by position, catch PySpark's exceptions, and store nested
and composite state types whose ``repr`` as read back is part of the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fidelity_procs as F
import numpy as np
import pandas as pd
import pytest
from harness import assert_same, run_stream, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = [pytest.mark.spark, pytest.mark.slow]

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


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fidelity") / "input")
    write_batches(d, fidelity_batches())
    return d


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


def _builders(case: Case, backend: RocksDBStateBackend, init_df):
    """(Spark's query, ours) as functions of the input stream."""
    make = case.target if case.kind == "apply" else case.target
    init = {"initialState": init_df.groupBy("k")} if case.initial else {}
    if case.kind == "apply":
        return (lambda df: df.groupBy("k").applyInPandasWithState(
                    make, OUT, case.state_schema, "Update", case.mode),
                lambda df: backend.apply_in_pandas_with_state(
                    df.groupBy("k"), make, OUT, case.state_schema, "Update", case.mode))
    if case.kind == "row":
        return (lambda df: df.groupBy("k").transformWithState(make(), OUT, "Update", case.mode,
                                                              **init),
                lambda df: backend.transform_with_state(df.groupBy("k"), make(), OUT, "Update",
                                                        case.mode, flavour="row", **init))
    return (lambda df: df.groupBy("k").transformWithStateInPandas(make(), OUT, "Update",
                                                                  case.mode, **init),
            lambda df: backend.transform_with_state(df.groupBy("k"), make(), OUT, "Update",
                                                    case.mode, **init))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_output_as_spark(spark, tmp_path, input_dir, case: Case):
    backend = RocksDBStateBackend(str(tmp_path / "state"),
                                  StateBackendOptions(parallelism=2,
                                                      local_dir=str(tmp_path / "local")))
    init_df = spark.createDataFrame(pd.DataFrame({"k": ["user-1", "user-4", "nobody"],
                                                  "init": [1000, 4000, 9000]}))
    theirs_q, ours_q = _builders(case, backend, init_df)
    wm = WATERMARK if case.watermark else None
    theirs = run_stream(spark, input_dir, SCHEMA, theirs_q, str(tmp_path / "ck-spark"), wm)
    ours = run_stream(spark, input_dir, SCHEMA, ours_q, str(tmp_path / "ck-ours"), wm)
    assert len(theirs) == 6, sorted(theirs)
    assert sum(len(v) for v in theirs.values()) > 0
    assert_same(ours, theirs)
    if case.check is not None:
        case.check(ours)


def test_handle_misuse_is_a_pyspark_error_and_the_processor_goes_on(spark, tmp_path, input_dir):
    """``deleteIfExists`` outside ``init``: Spark raises PySparkRuntimeError with condition
    STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE and then loses its
    worker's connection to the JVM, so there is no Spark run to compare with; ours raises the
    same class and condition, and a processor that catches it carries on."""
    backend = RocksDBStateBackend(str(tmp_path / "state"),
                                  StateBackendOptions(parallelism=2,
                                                      local_dir=str(tmp_path / "local")))
    ours = run_stream(spark, input_dir, SCHEMA,
                      lambda df: backend.transform_with_state(
                          df.groupBy("k"), F.CatchesPySparkErrors(), OUT, "Update", "None"),
                      str(tmp_path / "ck-ours"))
    outcomes = set(pd.concat(ours.values())["s"])
    assert outcomes == {"PySparkRuntimeError "
                        "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE"}
    def key(k):
        return None if pd.isna(k) else k

    last = {key(k): int(v) for b in sorted(ours) for k, v in zip(ours[b]["k"], ours[b]["v"])}
    counts = pd.concat(fidelity_batches()).groupby("k", dropna=False).size()
    assert last == {key(k): int(n) for k, n in counts.items()}
