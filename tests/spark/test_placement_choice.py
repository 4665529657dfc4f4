"""``placement="auto"`` (the default) decides each streaming operator's plan on the driver
from durable facts: the location's recorded plan, the query's shape, the session's master
(statebackend/spark/placement.py). These tests hold the decision table; the Spark tests
of the same choices are in test_placement_default.py.
"""

from __future__ import annotations

import logging

import pytest

from statebackend.model.manifest import CompletedCheckpoint, PartitionManifest
from statebackend.spark import placement
from statebackend.spark.placement import choose, log_choice, one_machine


class _Session:
    pass


class _Frame:
    sparkSession = _Session()


def _record(plan: str | None, writer_run: str | None = "run-1") -> CompletedCheckpoint:
    return CompletedCheckpoint(
        operator_id="op", checkpoint_id=4, parallelism=1, max_parallelism=8,
        manifests={0: "chk-4/p0/a1/_MANIFEST.json"}, placement=plan,
        writer_epoch=None if writer_run is None else 1, writer_query="q",
        writer_run=writer_run)


@pytest.fixture
def world(monkeypatch):
    """The session's master and the operator upstream, as the test sets them."""
    facts = {"master": "local[2]", "upstream": None}
    monkeypatch.setattr(placement, "master_of", lambda spark: facts["master"])
    monkeypatch.setattr(placement, "stateful_upstream", lambda df: facts["upstream"])
    return facts


@pytest.mark.parametrize("master, expected", [
    ("local", True), ("local[2]", True), ("local[*]", True), ("local[4,3]", True),
    ("local-cluster[2,1,1024]", False), ("spark://h:7077", False), ("yarn", False),
    ("k8s://https://h", False), (None, False)])
def test_one_machine_is_local_n_only(master, expected):
    assert one_machine(master) is expected


@pytest.mark.parametrize("master, timers, carrier", [
    ("local[2]", "None", False),            # one machine, no timers: every task is local
    ("local[2]", "EventTime", True),        # timers: the no-data micro-batches
    ("local[2]", "ProcessingTime", True),
    ("local-cluster[2,1,1024]", "None", True),
    ("spark://h:7077", "EventTime", True),
    (None, "None", True),                   # a server that does not say: a cluster
])
def test_a_new_location(world, master, timers, carrier):
    world["master"] = master
    chosen = choose(_Frame(), "auto", None, "Update", timers)
    assert chosen.carrier is carrier, chosen
    assert not chosen.fallback


@pytest.mark.parametrize("plan, master, carrier", [
    ("shuffle", "spark://h:7077", False),   # an upgrade keeps a running query's plan
    ("carrier", "local[2]", True),          # moved to one machine: still the carrier
    (None, "spark://h:7077", False),        # written before plans were recorded
])
def test_a_location_keeps_its_recorded_plan(world, plan, master, carrier):
    world["master"] = master
    chosen = choose(_Frame(), "auto", _record(plan), "Update", "EventTime")
    assert chosen.carrier is carrier, chosen
    assert "the location's checkpoints ran the" in chosen.reason


def test_a_location_only_batch_jobs_wrote_decides_afresh(world):
    world["master"] = "spark://h:7077"
    chosen = choose(_Frame(), "auto", _record(None, writer_run="batch-1f2e"), "Update", "None")
    assert chosen.carrier and "new location on a cluster" in chosen.reason


@pytest.mark.parametrize("option, carrier", [("shuffle", False), ("carrier", True)])
def test_an_explicit_option_wins(world, option, carrier):
    for plan in ("shuffle", "carrier"):
        for master in ("local[2]", "spark://h:7077"):
            world["master"] = master
            assert choose(_Frame(), option, _record(plan), "Append", "None").carrier is carrier


@pytest.mark.parametrize("output_mode, upstream, timers, etc, why", [
    ("Complete", None, "None", None, "output mode 'Complete'"),
    ("Append", None, "None", ("t", 0), "eventTimeColumnName"),
    ("Append", "Aggregate", "None", None, "streaming aggregation"),
    ("Update", "Aggregate", "None", None, "streaming aggregation"),
    ("Update", "FlatMapGroupsWithState", "None", None, "only in Append mode"),
    ("Update", "Deduplicate", "None", None, "only in Append mode"),
    ("Append", "TransformWithState", "EventTime", None, "event-time timeouts after it"),
])
def test_shapes_spark_refuses_fall_back_with_one_log_line(world, caplog, output_mode,
                                                           upstream, timers, etc, why):
    world.update(master="spark://h:7077", upstream=upstream)
    for option in ("auto", "carrier"):
        chosen = choose(_Frame(), option, None, output_mode, timers, etc)
        assert not chosen.carrier and chosen.fallback, chosen
        assert why in chosen.reason
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="statebackend"):
            log_choice("op", option, chosen)
        [line] = [r for r in caplog.records if r.name == "statebackend"]
        assert line.levelno == logging.WARNING
        msg = line.getMessage()
        assert why in msg and f"placement={option!r}" in msg and "placement='shuffle'" in msg


def test_shapes_spark_accepts_keep_the_carrier(world):
    """Several applyInPandasWithStates in Append mode (Spark accepts them), another
    stateful operator before one without event-time timers."""
    world.update(master="spark://h:7077", upstream="FlatMapGroupsWithState")
    assert choose(_Frame(), "auto", None, "Append", "None").carrier
    assert choose(_Frame(), "auto", None, "append", "ProcessingTime").carrier


def test_no_fallback_line_where_the_shuffle_plan_was_chosen_anyway(world, caplog):
    world.update(master="local[2]")
    chosen = choose(_Frame(), "auto", None, "Complete", "None")
    assert not chosen.carrier and not chosen.fallback
    with caplog.at_level(logging.INFO, logger="statebackend"):
        log_choice("op", "auto", chosen)
    assert [r.levelno for r in caplog.records if r.name == "statebackend"] == [logging.INFO]


def test_the_plan_round_trips_through_records_and_manifests():
    rec = _record("carrier")
    assert CompletedCheckpoint.from_json(rec.to_json()).placement == "carrier"
    assert '"placement"' not in _record(None).to_json()  # the bytes older versions wrote
    m = PartitionManifest(operator_id="op", partition=0, checkpoint_id=4, attempt="a1",
                          key_group_start=0, key_group_end=7, max_parallelism=8, files=(),
                          placement="shuffle")
    assert PartitionManifest.from_json(m.to_json()).placement == "shuffle"


def test_an_edited_plan_is_a_corrupt_record_not_a_silent_choice():
    from statebackend.errors import CorruptStateError

    text = _record("carrier").to_json().replace('"carrier"', '"elsewhere"')
    with pytest.raises(CorruptStateError, match="placement 'elsewhere'"):
        CompletedCheckpoint.from_json(text)
    m = PartitionManifest(operator_id="op", partition=0, checkpoint_id=4, attempt="a1",
                          key_group_start=0, key_group_end=7, max_parallelism=8, files=(),
                          placement="carrier")
    with pytest.raises(CorruptStateError, match="placement"):
        PartitionManifest.from_json(m.to_json().replace('"carrier"', '7'))
