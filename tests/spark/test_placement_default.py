"""The default ``placement="auto"`` on Spark (local[2]): timers and timeouts under Spark's
own defaults, a location the shuffle plan wrote kept on it, and the query shapes that fall
back to the shuffle plan with one log line.

Spark's defaults: ``spark.sql.streaming.noDataMicroBatches.enabled`` is true, so Spark
runs a micro-batch without input when a stateful operator asks for one (the watermark
moved past an event-time timer or timeout). Only a Spark stateful operator asks: the
shuffle plan (mapInPandas) never does, so its timers would wait for the next input. The
default therefore runs operators with timers in the carrier even on one machine, and
their rows must equal Spark's own operators' in every micro-batch, no-data micro-batches
included, on an ``availableNow`` query that ends.
"""

from __future__ import annotations

import logging

import pandas as pd
import pytest
from chain_procs import EMIT_SCHEMA, EmitLatest
from fidelity_cases import CASE_BY_NAME, SCHEMA, WATERMARK, builders, fidelity_batches
from harness import (
    assert_same,
    random_batches,
    recorded_plan,
    run_stream,
    running_counts,
    write_batches,
)
from processors import RunningCount

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.spark import placement
from statebackend.spark.session import stateful_upstream

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("defaults") / "input")
    write_batches(d, fidelity_batches())
    return d


def _backend(tmp_path, **kw) -> RocksDBStateBackend:
    return RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local"), **kw))


# Timers and timeouts under Spark's defaults, every micro-batch against Spark's own
# operators, with the plan the default recorded: tests/spark/test_fidelity.py (the suite's
# session has Spark's defaults; its event-time cases check the carrier was chosen).


def test_an_available_now_query_with_timers_ends(spark, tmp_path, input_dir):
    """The event-time sessions close in the micro-batches Spark closes them in, and the
    query ends by itself (a bounded wait, so a query that never ends fails the test).
    (Spark's shuffle partitions stay at the suite's 2: at Spark's 200 the same run takes
    minutes on two cores, for Spark's operator as for ours, and decides nothing here.)"""
    s = spark
    case = CASE_BY_NAME["event-sessions"]
    backend = _backend(tmp_path)
    theirs_q, ours_q = builders(case, backend, None)
    results = {}
    for who, build in (("theirs", theirs_q), ("ours", ours_q)):
        df = (s.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
              .withWatermark(*WATERMARK))
        out: dict[int, pd.DataFrame] = {}

        def collect(batch_df, batch_id, out=out):
            pdf = batch_df.toPandas()
            out[batch_id] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)

        q = (build(df).writeStream.foreachBatch(collect).outputMode("update")
             .option("checkpointLocation", str(tmp_path / f"ck-{who}"))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(600), f"{who}: the availableNow query did not end"
        results[who] = out
    assert len(results["theirs"]) > len(fidelity_batches())
    assert_same(results["ours"], results["theirs"])
    assert recorded_plan(backend, _only_operator(tmp_path), max(results["ours"])) == "carrier"


def _only_operator(tmp_path) -> str:
    import os

    [op] = [d for d in os.listdir(tmp_path / "state") if not d.startswith("_")]
    return op


COUNT_SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
COUNT_OUT = "k STRING, v BIGINT"


def test_a_location_the_shuffle_plan_wrote_keeps_it_and_continues_exactly(
        spark, tmp_path, monkeypatch):
    """Written with ``placement="shuffle"``, restarted with the default on what the
    driver takes for a cluster (where a new location gets the carrier): the recorded plan
    wins, so Spark's checkpoint (which has no stateful operator for a carrier) restarts,
    and the counts continue."""
    data = random_batches(6, seed=23, keys=7)
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")

    def count(be):
        return lambda df: be.transform_with_state(df.groupBy("k"), RunningCount(), COUNT_OUT,
                                                  "Update", "None", operator_id="counts")

    write_batches(inp, data[:3])
    old = _backend(tmp_path, placement="shuffle")
    out = run_stream(spark, inp, COUNT_SCHEMA, count(old), ck)
    assert recorded_plan(old, "counts", 2) == "shuffle"
    monkeypatch.setattr(placement, "master_of", lambda s: "spark://cluster:7077")
    write_batches(inp, data[3:], start=3)
    new = _backend(tmp_path)  # the default
    out = run_stream(spark, inp, COUNT_SCHEMA, count(new), ck, out=out)
    expected, totals = running_counts(data)
    assert_same(out, expected)
    assert recorded_plan(new, "counts", len(data) - 1) == "shuffle"
    rows = new.read_state(spark, "counts", state_name="count").collect()
    assert {r.key.k: r.value[0] for r in rows} == totals


def test_a_new_location_on_a_cluster_gets_the_carrier(spark, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(placement, "master_of", lambda s: "spark://cluster:7077")
    backend = _backend(tmp_path)
    df = spark.readStream.schema(COUNT_SCHEMA).parquet(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="statebackend"):
        out = backend.transform_with_state(df.groupBy("k"), RunningCount(), COUNT_OUT,
                                           "Update", "None", operator_id="counts")
    assert stateful_upstream(out) == "FlatMapGroupsWithState"  # the carrier's operator
    assert any("runs the carrier plan: a new location on a cluster" in r.getMessage()
               for r in caplog.records)


def _identity(frames, state):
    yield from frames


def _fallback_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "statebackend" and r.levelno == logging.WARNING
            and "runs the shuffle plan, not the carrier" in r.getMessage()]


def test_each_refused_shape_falls_back_with_its_log_line(spark, tmp_path, monkeypatch,
                                                         caplog):
    """On what the driver takes for a cluster: Complete mode, an event-time column in the
    output, an aggregation before the operator. Each plan is the shuffle plan (no Spark
    stateful operator of ours in it) and each says why in one line naming the option."""
    monkeypatch.setattr(placement, "master_of", lambda s: "spark://cluster:7077")
    df = (spark.readStream.schema(COUNT_SCHEMA).parquet(str(tmp_path))
          .withWatermark("ts", "5 seconds"))
    shapes = {
        "output mode 'Complete'": lambda be: be.map_in_pandas(
            df, "k", _identity, COUNT_SCHEMA, operator_id="m", output_mode="Complete"),
        "eventTimeColumnName": lambda be: be.transform_with_state(
            df.groupBy("k"), EmitLatest(), EMIT_SCHEMA, "Append", "EventTime",
            operator_id="t", eventTimeColumnName="ts"),
        "streaming aggregation": lambda be: be.map_in_pandas(
            df.groupBy(df.k, df.ts).count().withColumnRenamed("count", "x"), "k",
            _identity, "k STRING, ts TIMESTAMP, x BIGINT", operator_id="a"),
    }
    for i, (why, build) in enumerate(shapes.items()):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="statebackend"):
            out = build(_backend(tmp_path / str(i)))
        lines = _fallback_lines(caplog)
        assert len(lines) == 1 and why in lines[0], (why, lines)
        assert "placement='auto'" in lines[0] and "placement='shuffle'" in lines[0]
        assert stateful_upstream(out) in (None, "Aggregate"), why


def test_each_session_of_the_application_gets_its_own_listener(spark, tmp_path):
    """Spark keeps streaming listeners per session (``newSession()`` has its own
    ``streams``): a query of either session has its micro-batches completed by the
    listener, whichever session attached first."""
    import time

    data = random_batches(2, seed=31, keys=5)
    other = spark.newSession()  # a session of its own, whose query runs first
    for i, s in enumerate((other, spark)):
        inp = str(tmp_path / f"in{i}")
        write_batches(inp, data)
        be = _backend(tmp_path / f"s{i}")
        run_stream(s, inp, COUNT_SCHEMA, lambda df, be=be: be.transform_with_state(
            df.groupBy("k"), RunningCount(), COUNT_OUT, "Update", "None",
            operator_id="counts"), str(tmp_path / f"ck{i}"))
        coord = be.coordinator("counts")
        deadline = time.monotonic() + 120  # listener events are asynchronous
        while time.monotonic() < deadline and not (
                coord.latest() is not None and coord.latest().checkpoint_id == 1
                and coord.latest().committed):
            time.sleep(0.2)
        latest = coord.latest()
        assert latest is not None and latest.checkpoint_id == 1 and latest.committed, i
