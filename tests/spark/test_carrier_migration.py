"""A streaming query checkpointed with today's plan (``placement="shuffle"``) moving to the
carrier plan (``placement="carrier"``).

The carrier adds a Spark stateful operator to the query's plan. Restarted from its Spark
checkpoint, the query would have to load that operator's state store at the version of
the last batch, which was never written, and Spark refuses to. The documented step
(docs/scaling.md, "Moving a running query to the carrier plan"): write a savepoint, and
start the carrier query with a new Spark checkpoint location and a new state location
from that savepoint. Its results continue those of the old query.
"""

from __future__ import annotations

import pytest
from harness import check_batches, random_batches, run_stream, running_counts, write_batches
from processors import RunningCount

from statebackend import RocksDBStateBackend, StateBackendOptions

pytestmark = [pytest.mark.spark]

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
DATA = random_batches(5, seed=11, keys=7)


def _backend(location: str, local: str, placement: str, **kw) -> RocksDBStateBackend:
    return RocksDBStateBackend(location, StateBackendOptions(
        parallelism=2, local_dir=local, placement=placement), **kw)


def _count(be):
    return lambda df: be.transform_with_state(df.groupBy("k"), RunningCount(), OUT, "Update",
                                              "None", operator_id="counts")


def test_restart_with_the_carrier_is_refused_by_spark(spark, tmp_path):
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    write_batches(inp, DATA[:3])
    run_stream(spark, inp, SCHEMA, _count(_backend(str(tmp_path / "state"),
                                                   str(tmp_path / "local"), "shuffle")), ck)
    write_batches(inp, DATA[3:], start=3)
    carrier = _backend(str(tmp_path / "state"), str(tmp_path / "local"), "carrier")
    with pytest.raises(Exception) as err:
        run_stream(spark, inp, SCHEMA, _count(carrier), ck)
    # Spark's own refusal: the new operator has no state store to load at that version
    assert "state" in str(err.value).lower(), str(err.value)[:2000]


def test_move_to_the_carrier_with_a_savepoint(spark, tmp_path):
    inp = str(tmp_path / "in")
    write_batches(inp, DATA[:3])
    old = _backend(str(tmp_path / "state"), str(tmp_path / "local"), "shuffle")
    first = run_stream(spark, inp, SCHEMA, _count(old), str(tmp_path / "ck"))
    old.complete("counts")
    sp = old.savepoint("counts", "move")
    assert sp is not None
    # the new query: a new Spark checkpoint, a new state location, from the savepoint
    inp2 = str(tmp_path / "in2")
    write_batches(inp2, DATA[3:])
    url = f"{tmp_path / 'state'}/counts/_savepoints/move"
    new = _backend(str(tmp_path / "state2"), str(tmp_path / "local2"), "carrier",
                   from_savepoint=url)
    second = run_stream(spark, inp2, SCHEMA, _count(new), str(tmp_path / "ck2"))
    ref = running_counts(DATA)[0]
    check_batches(first, {b: ref[b] for b in range(3)})
    check_batches(second, {b - 3: ref[b] for b in range(3, 5)})


def test_savepoint_state_of_a_partition_without_rows(spark, tmp_path):
    """The carrier query's first micro-batch has rows of one key, so one partition runs no
    task: the driver writes that partition's first checkpoint from the savepoint (not
    empty state), and its keys keep counting from the old query's counts afterwards."""
    import pandas as pd

    inp = str(tmp_path / "in")
    write_batches(inp, DATA[:3])
    old = _backend(str(tmp_path / "state"), str(tmp_path / "local"), "shuffle")
    run_stream(spark, inp, SCHEMA, _count(old), str(tmp_path / "ck"))
    old.complete("counts")
    assert old.savepoint("counts", "move") is not None
    one_key = DATA[3][DATA[3]["k"] == DATA[3]["k"].iloc[0]].reset_index(drop=True)
    later = [one_key, DATA[4]]
    inp2, ck2 = str(tmp_path / "in2"), str(tmp_path / "ck2")
    write_batches(inp2, later[:1])
    new = _backend(str(tmp_path / "state2"), str(tmp_path / "local2"), "carrier",
                   from_savepoint=f"{tmp_path / 'state'}/counts/_savepoints/move")
    second = run_stream(spark, inp2, SCHEMA, _count(new), ck2)
    new.complete("counts", up_to=0)
    state = new.read_state(spark, "counts").toPandas()
    assert len(state[state["state_name"] == "count"]) == pd.concat(DATA[:3])["k"].nunique()
    write_batches(inp2, later[1:], start=1)
    second.update(run_stream(spark, inp2, SCHEMA, _count(new), ck2))
    ref = running_counts([*DATA[:3], *later])[0]
    check_batches(second, {b - 3: ref[b] for b in range(3, 5)})
