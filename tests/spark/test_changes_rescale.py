"""The change feed of map_in_pandas state without a SparkSession (the partition task runs
in this process, as benchmarks/large_state.py does): across a rescale (every partition of
B compared with the key groups it owns in A's partitions), and a Hypothesis property: for
random histories of puts and deletes in either checkpoint mode, the feed between any two
checkpoints replayed onto the first gives the second."""

from __future__ import annotations

import itertools
import os
import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebackend.coordinator import CheckpointCoordinator
from statebackend.keys.groups import key_groups
from statebackend.local import resident
from statebackend.options import StateBackendOptions
from statebackend.read.changes import change_rows, plan_changes
from statebackend.read.rows import read_rows
from statebackend.spark.plan import KG_COL, KeySpec
from statebackend.storage import open_store
from statebackend.task import runner
from statebackend.task.context import PTIME_COL, OperatorConfig
from statebackend.task.vector import vector_config, vector_process

MAXP = 16


def upsert_or_delete(frames, state):
    """v >= 0: put it; v < 0: delete the key."""
    for pdf in frames:
        keys = pdf[["k"]].reset_index(drop=True)
        gone = pdf["v"].to_numpy() < 0
        if gone.any():
            state.delete(keys[gone].reset_index(drop=True))
        if (~gone).any():
            state.put(keys[~gone].reset_index(drop=True),
                      pd.DataFrame({"v": pdf["v"].to_numpy()[~gone]}))
    return iter(())


def run_batch(root: str, batch: int, parallelism: int, keys, values, **options) -> None:
    durable = os.path.join(root, "durable")
    opts = StateBackendOptions(parallelism=parallelism, max_parallelism=MAXP,
                               local_dir=os.path.join(root, "local"), num_retained=10,
                               **options)
    config = OperatorConfig(operator_id="op", checkpoint_location=durable, storage_options={},
                            options=opts, parallelism=parallelism,
                            key=KeySpec(("k",), ("bigint",)))
    config = vector_config(config, None)
    process = vector_process(upsert_or_delete, config, "v BIGINT", None)
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    kg = np.asarray(key_groups([keys], ["bigint"], MAXP), dtype=np.int32)
    part = kg.astype(np.int64) * parallelism // MAXP
    coord = CheckpointCoordinator(open_store(durable), "op", parallelism, MAXP,
                                  num_retained=10)
    original = runner.task_identity
    try:
        for p in range(parallelism):
            sel = part == p
            frame = pd.DataFrame({"k": keys[sel], "v": values[sel], KG_COL: kg[sel],
                                  PTIME_COL: np.full(int(sel.sum()), 1_700_000_000_000)})
            runner.task_identity = lambda _c, _ours=None, p=p: (batch, p, f"b{batch}-p{p}")
            for _ in runner.run_partition(config, iter([frame]), process):
                pass
        assert coord.try_complete(batch) is not None
    finally:
        runner.task_identity = original
        resident.close_all()
        coord.close()


def test_change_feed_across_a_rescale(tmp_path):
    root = str(tmp_path)
    run_batch(root, 0, 2, np.arange(100), np.arange(100))
    # keys 50..99 rewritten (60..69 to the same value), 0..9 deleted, 100..149 new
    keys = np.arange(0, 150)
    values = np.where(keys < 10, -1, np.where((keys >= 60) & (keys < 70), keys, keys * 2))
    run_batch(root, 1, 4, keys[(keys < 10) | (keys >= 50)], values[(keys < 10) | (keys >= 50)])
    store = open_store(os.path.join(root, "durable"))
    before = {r.key: r.value for r in read_rows(store, "op", 0)}
    after = {r.key: r.value for r in read_rows(store, "op", 1)}
    assert len(before) == 100 and len(after) == 140

    plan = plan_changes(store, "op", 0, 1)
    assert [len(u.old) for u in plan.units] == [1, 1, 1, 1]  # each new partition: one old
    assert all(u.changelogs is None for u in plan.units)
    feed = list(change_rows(store, "op", 0, 1, plan=plan))
    assert {r.partition_id for r in feed} == {0, 1, 2, 3}
    puts = {r.key: r.value for r in feed if r.operation == "put"}
    deletes = {r.key for r in feed if r.operation == "delete"}
    assert deletes == {(k,) for k in range(10)}
    assert set(puts) == {(k,) for k in range(50, 150) if not 60 <= k < 70}
    replayed = {k: v for k, v in before.items() if k not in deletes} | puts
    assert replayed == after
    # down to 3 partitions: a new partition spans parts of two old ones (merged in key order)
    run_batch(root, 2, 3, np.arange(140, 160), np.arange(140, 160) * 3)
    final = {r.key: r.value for r in read_rows(store, "op", 2)}
    for a in (0, 1):
        plan = plan_changes(store, "op", a, 2)
        assert max(len(u.old) for u in plan.units) == 2
        feed = list(change_rows(store, "op", a, 2, plan=plan))
        start = {r.key: r.value for r in read_rows(store, "op", a)}
        gone = {r.key for r in feed if r.operation == "delete"}
        replayed = {k: v for k, v in start.items() if k not in gone} | {
            r.key: r.value for r in feed if r.operation == "put"}
        assert replayed == final, a


def _state(store, checkpoint):
    return {r.key: r.value for r in read_rows(store, "op", checkpoint)}


# a batch: key -> new value, or -1 to delete it (keys 0..39)
HISTORIES = st.lists(st.dictionaries(st.integers(0, 39), st.integers(-1, 5), min_size=1,
                                     max_size=25), min_size=2, max_size=5)


@pytest.mark.parametrize("mode", ["incremental", "changelog"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=HISTORIES)
def test_change_feed_replays_random_histories(mode, history):
    with tempfile.TemporaryDirectory() as root:
        for b, writes in enumerate(history):
            keys = np.array(sorted(writes), dtype=np.int64)
            run_batch(root, b, 2, keys, [writes[k] for k in keys], checkpoint_mode=mode,
                      materialize_interval=2)
        store = open_store(os.path.join(root, "durable"))
        states = [_state(store, b) for b in range(len(history))]
        for a, b in itertools.combinations(range(len(history)), 2):
            plan = plan_changes(store, "op", a, b)
            if mode == "incremental":
                assert all(u.changelogs is None for u in plan.units)
            state = dict(states[a])
            feed = list(change_rows(store, "op", a, b, plan=plan))
            for batch in sorted({r.batch_id for r in feed}):
                for r in feed:
                    if r.batch_id == batch:
                        if r.operation == "delete":
                            state.pop(r.key, None)
                        else:
                            state[r.key] = r.value
            assert state == states[b], (a, b)
