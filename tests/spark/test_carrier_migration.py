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

import os

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
    # Spark's own refusal: the shuffle plan's Spark checkpoint has no state directory, and
    # Spark 4 refuses a restart that adds a stateful operator (docs/scaling.md: why the
    # move is a new query, not in place)
    assert not os.path.exists(os.path.join(ck, "state"))
    assert "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY" in str(err.value), \
        str(err.value)[:2000]


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


def _cli(*argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``python -m statebackend.cli`` (a real process)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "statebackend.cli", *argv], env=env,
                          capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def test_the_move_command_continues_the_old_query(spark, tmp_path):
    """``statebackend move`` on a stopped shuffle-plan query, then its printed restart step
    followed exactly: every output of the new query continues the old one's, and the state
    read back equals the reference; the moved location is refused by a second move."""
    import json

    from statebackend.savepoint.move import move_to_carrier
    from statebackend.storage import open_store

    old_loc, inp = str(tmp_path / "state"), str(tmp_path / "in")
    write_batches(inp, DATA[:3])
    old = _backend(old_loc, str(tmp_path / "local"), "shuffle")
    first = run_stream(spark, inp, SCHEMA, _count(old), str(tmp_path / "ck"))
    old.complete("counts")

    code, out, err = _cli("move", old_loc, "counts", "--json")
    assert code == 0, err
    step = json.loads(out)
    assert step["placement"] == "carrier" and step["checkpoint_id"] == 2
    assert step["state_location"] == old_loc + "-carrier"
    assert step["savepoint"] == f"{old_loc}/counts/_savepoints/move-to-carrier"
    assert f"from_savepoint={step['savepoint']!r}" in step["restart"]
    assert 'placement="carrier"' in step["restart"]
    # the API gives the same step (another savepoint name: savepoints are never replaced)
    api = move_to_carrier(open_store(old_loc), old_loc, "counts", name="again")
    assert (api.state_location, api.checkpoint_id) == (step["state_location"], 2)
    assert api.savepoint.endswith("/counts/_savepoints/again")

    # the restart step: a new Spark checkpoint, the new location, the carrier, the
    # savepoint, and the source from where the old query stopped (the batches it never read)
    inp2 = str(tmp_path / "in2")
    write_batches(inp2, DATA[3:])
    new = RocksDBStateBackend(step["state_location"], StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local2"), placement=step["placement"]),
        from_savepoint=step["from_savepoint"])
    second = run_stream(spark, inp2, SCHEMA, _count(new), str(tmp_path / "ck2"))
    ref, totals = running_counts(DATA)
    check_batches({**first, **{b + 3: df for b, df in second.items()}}, ref)
    new.complete("counts")
    rows = new.read_state(spark, "counts", state_name="count").collect()
    assert {r.key.k: r.value["count"] for r in rows} == totals

    # the new location uses the carrier: a second move is refused, and so is a --to
    # that holds the operator's state; nothing is written either time
    code, out, err = _cli("move", step["state_location"], "counts")
    assert (code, out) == (2, "") and "already uses the carrier" in err, err
    assert "Traceback" not in err
    code, out, err = _cli("move", old_loc, "counts", "--name", "third",
                          "--to", step["state_location"])
    assert (code, out) == (2, "") and "already holds state" in err, err
    assert not os.path.exists(f"{old_loc}/counts/_savepoints/third")
