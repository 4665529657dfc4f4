"""Unit tests of the task side that need no SparkSession: grouping and output assembly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inproc import frames, run_task

from statebackend.keys.grouping_key import decode_grouping_key
from statebackend.keys.groups import key_groups
from statebackend.spark.plan import TICK_COL, KeySpec
from statebackend.task.context import PTIME_COL, TaskInput, group_by_key
from statebackend.task.runner import concat_frames


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "é", ""]), st.integers(-3, 3)),
                min_size=0, max_size=40))
def test_group_by_key_gives_every_row_once_under_its_key(rows):
    pdf = pd.DataFrame(rows, columns=["k", "n"]) if rows else pd.DataFrame(
        {"k": pd.Series([], dtype=object), "n": pd.Series([], dtype="int64")})
    pdf["x"] = np.arange(len(pdf))
    spec = KeySpec(("k", "n"), ("string", "bigint"))
    kg = key_groups([pdf["k"], pdf["n"].to_numpy()], list(spec.types), 128) if len(pdf) else []
    g = group_by_key(pdf, spec, kg)
    # without Spark's key groups the task computes the same ones per key
    computed = group_by_key(pdf, spec, None, 128)
    assert computed.key_bytes == g.key_bytes and computed.key_groups.tolist() == g.key_groups.tolist()
    assert list(g.frame.columns) == ["k", "n", "x"]
    seen = []
    assert len(set(g.keys)) == len(g.keys)
    for i in range(len(g)):
        rows_i = g.rows(i)
        assert len(rows_i) > 0
        assert set(zip(rows_i["k"], rows_i["n"])) == {g.keys[i]}
        assert decode_grouping_key(g.key_bytes[i], list(spec.types))[1] == g.keys[i]
        seen.extend(rows_i["x"].tolist())
    assert sorted(seen) == list(range(len(pdf)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=4), min_size=1, max_size=12),
       st.booleans())
def test_concat_frames_equals_pandas_concat(sizes, mixed):
    # the runner drops empty outputs before assembling, so frames here are non-empty
    frames = []
    for i, vals in enumerate(sizes):
        v = [float(x) for x in vals] if (mixed and i % 2) else vals
        frames.append(pd.DataFrame({"k": [f"k{x}" for x in vals], "v": v}))
    expected = pd.concat(frames, ignore_index=True)
    pd.testing.assert_frame_equal(concat_frames(frames), expected)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=6),
                max_size=10),
       st.integers(1, 12))
def test_task_input_frames_are_the_rows_in_order_without_ticks(raw, min_rows):
    # raw: Spark's frames, each a list of (is tick, event time in s); ticks carry the
    # processing time like every row and are dropped before anyone sees the rows
    frames = [pd.DataFrame({
        "k": [f"k{i}" for i in range(len(rows))],
        "ts": pd.to_datetime([t for _, t in rows], unit="s"),
        TICK_COL: [tick for tick, _ in rows],
        PTIME_COL: np.full(len(rows), 777, np.int64)}) for rows in raw]
    source = TaskInput(iter(frames), event_time_col="ts")
    got = list(source.chunks(min_rows))
    user = [(f"k{i}", t) for rows in raw for i, (tick, t) in enumerate(rows) if not tick]
    assert [(k, int(t.value // 10**9)) for g in got for k, t in zip(g["k"], g["ts"])] == user
    assert all(TICK_COL not in g.columns and len(g) for g in got)
    assert all(len(g) >= min_rows for g in got[:-1])
    # a frame is handed over as soon as it has min_rows: less than one more raw frame
    assert all(len(g) < min_rows + 6 for g in got)
    assert source.rows == len(user)
    assert source.max_event_time_ms == (max(t for _, t in user) * 1000 if user else None)
    any_rows = any(raw)
    assert (source.batch_processing_time() == 777) == any_rows


# --- map_in_pandas's input read in frames, and a failure while reading it -----------------

def _run_task(tmp_path, batch: int, attempt: str, frames, frame_rows=4):
    # the lifecycle that closes its instance after each task (keep_instances_open has its
    # own tests in test_resident.py)
    return run_task(str(tmp_path), batch, attempt, frames, frame_rows,
                    keep_instances_open=False)


@pytest.mark.parametrize("fail_at", [0, 2])
def test_input_lost_mid_task_costs_no_committed_state(tmp_path, fail_at):
    # A lost shuffle block surfaces as an exception from Spark's batch iterator. On the
    # first frame it comes before the state is opened: the retry reuses the working
    # directory. On a later one the working directory has been opened (its clean marker
    # is gone): the retry restores from the local copy. Either way the retry sees exactly
    # batch 0's state and counts batch 1 once.
    b0 = ["a", "b", "a", "c", "a", "d", "b"]
    b1 = ["a", "b", "e", "a", "e", "e", "f", "a"]
    out0, _ = _run_task(tmp_path, 0, "t0", frames(b0))
    assert out0.groupby("k")["v"].max().to_dict() == {"a": 3, "b": 2, "c": 1, "d": 1}

    def lost(rows):
        for i, frame in enumerate(frames(rows)):
            if i == fail_at:
                raise OSError("shuffle block lost")
            yield frame

    with pytest.raises(OSError, match="shuffle block lost"):
        _run_task(tmp_path, 1, "t1-failed", lost(b1))
    out1, source = _run_task(tmp_path, 1, "t1-retry", frames(b1))
    assert source == ("working_dir" if fail_at == 0 else "local_copy")
    assert out1.groupby("k")["v"].max().to_dict() == {"a": 6, "b": 3, "e": 3, "f": 1}


def test_batches_that_ran_no_task_are_passed_over_and_a_reset_is_refused(memory_url):
    """Spark prunes the operator in a micro-batch whose input is empty as planned, so
    nothing is published for it: the next batch restores from the last batch that ran. A
    batch with something published is never passed over, and with no state at all where
    completed checkpoints exist the task refuses to start empty."""
    from statebackend.errors import IncompatibleStateError
    from statebackend.storage import open_store
    from statebackend.storage.records import completed_ids
    from statebackend.task.runner import check_continuity, last_batch_that_ran

    store = open_store(memory_url[0])
    store.put_bytes_atomic("_checkpoints/chk-3.json", b"{}")
    store.put_bytes_atomic("chk-4/p0/a/_MANIFEST.json", b"{}")  # published, not completed
    completed = completed_ids(store)
    assert completed == [3]
    assert last_batch_that_ran(store, 6, completed) == 4  # 5 and 6 ran no task
    assert last_batch_that_ran(store, 4, completed) == 4  # something published: not skipped
    assert last_batch_that_ran(store, 3, completed) == 3
    assert last_batch_that_ran(open_store(memory_url[0] + "-empty"), 2, []) == -1
    check_continuity([], 7)
    with pytest.raises(IncompatibleStateError, match="completed checkpoints 3..3"):
        check_continuity(completed, 7)
