"""The distributed state reader and the change feed, on a query that puts and deletes every
kind of state (value, TTL value, list, map, timers), in both checkpoint modes.

- ``read_state`` (one Spark task per partition) returns exactly the rows of the driver
  reader, in the same order, for every retained checkpoint, every state, and a savepoint.
- The change feed between any two retained checkpoints, replayed onto the first one's
  state, gives the second one's; the Spark feed equals the driver's.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import feed_procs as F
import pytest
from harness import early, kill_group, killed_at_end, random_batches, run_streams, write_batches

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import StateError
from statebackend.read.changes import change_rows, plan_changes
from statebackend.read.rows import load_checkpoint, load_savepoint, read_rows
from statebackend.storage import open_store

pytestmark = pytest.mark.spark

SCHEMA = "k STRING, x BIGINT, ts TIMESTAMP"
OUT = "k STRING, v BIGINT"
BATCHES = 7
STATES = ["_timers", "count", "items", "last", "m"]


@pytest.fixture(scope="module")
def runs(spark_no_data, tmp_path_factory):
    """The query in each checkpoint mode, both at once over the same input (run_streams);
    per mode ``(backend, store, checkpoint ids, mode)``."""
    # ProcessingTime mode (the TTL'd state): under availableNow the query could not end
    # with no-data micro-batches on (conftest.spark_no_data)
    spark = spark_no_data
    root = tmp_path_factory.mktemp("feed")
    write_batches(str(root / "in"), random_batches(BATCHES, seed=26, rows=40, keys=30))
    # every checkpoint retained; changelog mode materializes every third batch, so some
    # pairs of checkpoints share a base (changelogs) and others do not (comparison)
    backends = {mode: RocksDBStateBackend(str(root / mode / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(root / mode / "local"), num_retained=BATCHES + 1,
        checkpoint_mode=mode, materialize_interval=3, materialize_inline_ratio=0))
        for mode in ("incremental", "changelog")}
    run_streams(spark, str(root / "in"), SCHEMA, {
        mode: (lambda df, be=be: be.transform_with_state(
            df.groupBy("k"), F.FeedStates(), OUT, "Update", "ProcessingTime",
            operator_id="feed"), str(root / mode / "ck"))
        for mode, be in backends.items()})
    out = {}
    for mode, be in backends.items():
        be.complete()
        ids = [c.checkpoint_id for c in be.coordinator("feed").list_completed()]
        assert ids == list(range(BATCHES))
        out[mode] = (be, open_store(str(root / mode / "state")), ids, mode)
    return out


@pytest.fixture(scope="module", params=["incremental", "changelog"])
def run(runs, request):
    return runs[request.param]


def _kinds(store, ckpt):
    return {n: d.kind for n, d in load_checkpoint(store, "feed", ckpt).states.items()}


def test_the_query_wrote_every_kind_of_state(run):
    _be, store, ids, _mode = run
    rows = list(read_rows(store, "feed", ids[-1]))
    by_state = {s: [r for r in rows if r.state_name == s] for s in STATES}
    assert all(by_state[s] for s in STATES), {s: len(v) for s, v in by_state.items()}
    assert _kinds(store, ids[-1]) == {"_timers": "timers", "count": "value", "items": "list",
                                      "last": "value", "m": "map"}
    assert all(r.expiration_ms is not None for r in by_state["last"])  # TTL
    assert all(r.user_key is not None for r in by_state["m"])
    assert {r.partition_id for r in rows} == {0, 1}


def test_distributed_reader_equals_driver_reader(spark, run):
    be, store, ids, _mode = run
    for ckpt in ids:  # every retained checkpoint, every state at once (JSON values)
        df = be.read_state(spark, "feed", checkpoint_id=ckpt)
        assert df.rdd.getNumPartitions() == 2  # one task per partition
        got = df.collect()
        want = be.read_state(spark, "feed", checkpoint_id=ckpt, distributed=False).collect()
        assert got == want and len(got) > 0
        assert len(got) == sum(1 for _ in read_rows(store, "feed", ckpt))
    for state in STATES:  # typed columns, latest checkpoint
        got = be.read_state(spark, "feed", state_name=state).collect()
        want = be.read_state(spark, "feed", state_name=state, distributed=False).collect()
        assert got == want and len(got) > 0
        native = [(r.partition_id, r.key, r.state_name, r.user_key, r.value, r.expiration_ms)
                  for r in read_rows(store, "feed", ids[-1], state)]
        assert [(r.partition_id, tuple(r.key), r.state_name,
                 None if r.user_key is None else tuple(r.user_key), tuple(r.value),
                 r.expiration_ms) for r in got] == native


def test_distributed_reader_of_a_savepoint(spark, run):
    be, store, ids, mode = run
    name = f"sp-{mode}"
    be.savepoint("feed", name, checkpoint_id=ids[-2])
    view = load_savepoint(store, "feed", name)
    df = be.read_state(spark, "feed", savepoint=name)
    assert df.rdd.getNumPartitions() == len(view.units()) == 2
    got = df.collect()
    assert got == be.read_state(spark, "feed", savepoint=name, distributed=False).collect()
    # the savepoint holds exactly the state of its checkpoint (same key-group ranges)
    assert got == be.read_state(spark, "feed", checkpoint_id=ids[-2]).collect()
    with pytest.raises(StateError, match="not both"):
        be.read_state(spark, "feed", checkpoint_id=ids[-2], savepoint=name)


# --- the change feed ---------------------------------------------------------------------


def _identity(kind, r):
    if kind == "timers":
        return r.state_name, r.key, r.value
    return r.state_name, r.key, r.user_key if kind == "map" else None


def _model(rows, kinds):
    """State as entries: (state, key, user key or timer ts) -> content (a list's: all rows)."""
    m: dict = {}
    for r in rows:
        kind = kinds[r.state_name]
        content = (r.value, r.expiration_ms)
        if kind == "list":
            m.setdefault(_identity(kind, r), []).append(content)
        else:
            assert _identity(kind, r) not in m
            m[_identity(kind, r)] = [content]
    return m


def _replay(model, feed, kinds):
    """Apply the feed batch by batch: deletes remove an entry, the puts of one entry in one
    batch are its new content."""
    m = dict(model)
    batches = sorted({r.batch_id for r in feed})
    for b in batches:
        puts: dict = {}
        for r in (r for r in feed if r.batch_id == b):
            ident = _identity(kinds[r.state_name], r)
            if r.operation == "delete":
                assert ident not in puts, "an entry is put or deleted once per batch"
                m.pop(ident, None)
            else:
                assert r.operation == "put"
                puts.setdefault(ident, []).append((r.value, r.expiration_ms))
        m.update(puts)
    return m


def test_change_feed_replayed_onto_a_gives_b(run):
    _be, store, ids, mode = run
    kinds = _kinds(store, ids[-1])
    states = {c: _model(read_rows(store, "feed", c), kinds) for c in ids}
    sources = set()
    multi_batch = 0
    for a, b in itertools.combinations(ids, 2):  # every pair of retained checkpoints
        plan = plan_changes(store, "feed", a, b)
        sources.update("changelog" if u.changelogs is not None else "compare"
                       for u in plan.units)
        feed = list(change_rows(store, "feed", a, b, plan=plan))
        if all(u.changelogs is not None for u in plan.units):
            # one batch id per changelog: every batch changed something in each partition
            assert {(r.partition_id, r.batch_id) for r in feed} == {
                (p, i) for p in (0, 1) for i in range(a + 1, b + 1)}, (a, b)
            multi_batch += b - a > 1
        else:
            assert {r.batch_id for r in feed} == {b}, (a, b)
        assert feed, (a, b)
        assert all(a < r.batch_id <= b for r in feed)
        assert {r.operation for r in feed} == {"put", "delete"}, (a, b)
        assert _replay(states[a], feed, kinds) == states[b], (a, b)
        if all(u.changelogs is None for u in plan.units):
            # a comparison names exactly the entries that differ, nothing else
            changed = {i for i in set(states[a]) | set(states[b])
                       if states[a].get(i) != states[b].get(i)}
            assert {_identity(kinds[r.state_name], r) for r in feed} == changed, (a, b)
    if mode == "changelog":  # both ways of finding the changes were exercised
        assert sources == {"changelog", "compare"} and multi_batch > 0
    else:
        assert sources == {"compare"}


def test_change_feed_of_one_state_and_through_spark(spark, run):
    be, store, ids, _mode = run
    for a, b in [(0, 1), (0, ids[-1]), (2, 5)]:
        want = list(change_rows(store, "feed", a, b))
        got = be.read_changes(spark, "feed", a, b).collect()
        assert len(got) == len(want)
        assert [(r.batch_id, r.operation, r.partition_id, tuple(r.key), r.state_name)
                for r in got] == [(r.batch_id, r.operation, r.partition_id, r.key, r.state_name)
                                  for r in want]
        for r, w in zip(got, want):
            assert (json.loads(r.value) if r.value else None) == (
                None if w.value is None else _values(store, w))
    typed = be.read_changes(spark, "feed", 0, ids[-1], state_name="m").collect()
    want = list(change_rows(store, "feed", 0, ids[-1], "m"))
    assert [(r.operation, tuple(r.key), tuple(r.user_key),
             None if r.value is None else tuple(r.value)) for r in typed] == \
        [(w.operation, w.key, w.user_key, w.value) for w in want]
    assert {r.operation for r in typed} == {"put", "delete"}
    with pytest.raises(StateError, match="older checkpoint to a newer"):
        be.read_changes(spark, "feed", 3, 3)


def _values(store, row):
    d = load_checkpoint(store, "feed", None).states[row.state_name]
    from statebackend.read.rows import value_schema

    return dict(zip(value_schema(d).names, row.value))


def test_cli_changes_writes_the_feed(run, tmp_path):
    import io

    import pandas as pd

    from statebackend.cli import main
    from statebackend.read.changes import changes_to_pandas

    _be, store, ids, _mode = run
    out = io.StringIO()
    path = str(tmp_path / "changes.parquet")
    assert main(["changes", store.root, "feed", "--from", "1", "--to", str(ids[-1]), "-o", path,
                 "--json", "-q"], out) == 0
    summary = json.loads(out.getvalue())
    got = pd.read_parquet(path)
    plan = plan_changes(store, "feed", 1, ids[-1])
    want = changes_to_pandas(change_rows(store, "feed", 1, ids[-1], plan=plan), plan)
    pd.testing.assert_frame_equal(got, want)
    assert list(got.columns[:4]) == ["batch_id", "operation", "partition_id", "key.k"]
    assert summary["rows"] == len(got) == summary["put"] + summary["delete"] > 0
    out = io.StringIO()  # one state, typed columns, CSV on standard output
    assert main(["changes", store.root, "feed", "--from", "0", "--to", "2", "--state", "m",
                 "-o", "-", "--partition", "1"], out) == 0
    csv = pd.read_csv(io.StringIO(out.getvalue()))
    rows = list(change_rows(store, "feed", 0, 2, "m", partitions=[1]))
    assert list(csv.columns) == ["batch_id", "operation", "partition_id", "key.k", "state_name",
                                 "user_key.sub", "value.c", "expiration_ms"]
    assert len(csv) == len(rows) > 0 and set(csv["partition_id"]) == {1}
    assert list(zip(csv["operation"], csv["key.k"], csv["user_key.sub"])) == [
        (r.operation, r.key[0], r.user_key[0]) for r in rows]
    assert main(["changes", store.root, "feed", "--from", "2", "--to", "1", "-o", path]) != 0


ARROW_DDL = ("i INT, s STRUCT<a: BIGINT, b: STRING, d: DATE, x: DECIMAL(10,2), f: DOUBLE, "
             "bin: BINARY, ok: BOOLEAN, arr: ARRAY<STRUCT<q: INT>>>, n STRING")
PICKLED_DDL = "i INT, s STRUCT<t: TIMESTAMP, m: MAP<STRING, BIGINT>>, n STRING"


def _unit_rows(ddl, i):
    import datetime as dt
    import decimal

    for j in range(3):
        if ddl == ARROW_DDL:
            s = None if j == 2 else (j * 10**12, f"b{i}{j}", dt.date(2026, 1, 1 + j),
                                     decimal.Decimal(f"{j}.25"), j / 3, bytes([i, j]), j == 1,
                                     [(j,), None] if j else [])
        else:
            s = None if j == 2 else (dt.datetime(2026, 1, 1, 12, j, 0, 123456),
                                     {"a": j, "b": None})
        yield (i, s, None if j == 1 else f"n{j}")


@pytest.mark.parametrize("ddl", [ARROW_DDL, PICKLED_DDL], ids=["arrow", "pickled"])
def test_unit_dataframe_converts_values_as_create_dataframe_does(spark, ddl):
    """The executors' rows (Arrow batches, or pickled rows for timestamps and maps) give the
    values the driver reader's createDataFrame gives, one partition per unit."""
    from functools import partial

    from statebackend.spark.readers import unit_dataframe

    df = unit_dataframe(spark, 3, ddl, partial(_unit_rows, ddl))
    assert df.rdd.getNumPartitions() == 3
    want = spark.createDataFrame([r for i in range(3) for r in _unit_rows(ddl, i)], ddl)
    assert df.schema == want.schema
    assert df.collect() == want.collect()


def start_early(request: pytest.FixtureRequest) -> Callable[[], tuple]:
    """Starts the process of :func:`cluster_reader` (a cluster costs a driver and two
    executor JVMs to start, and its executors' Python workers, ~25 s) in the background
    (tests/conftest.py, ``_jobs_started_early``); it then waits for requests on stdin."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    log = request.getfixturevalue("tmp_path_factory").mktemp("cluster-read") / "stderr.log"
    procs = killed_at_end(request)

    def job() -> tuple[subprocess.Popen, Path]:
        with open(log, "w") as err:
            procs.append(subprocess.Popen([sys.executable, os.path.join(here, "cluster_read.py")],
                                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=err, text=True, start_new_session=True))
        assert procs[0].stdout is not None
        procs[0].stdout.readline()  # READY (or the end of its output)
        return procs[0], log

    return job


@pytest.fixture(scope="module")
def cluster_reader(request):
    """``read(url, op, a, b)`` on one local-cluster[2,1,1024] (tests/spark/cluster_read.py)
    for both checkpoint modes, started early (:func:`start_early`)."""
    proc, log = early(request, __name__)

    def read(url: str, op: str, a: int, b: int) -> dict:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([url, op, a, b]) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise AssertionError(f"cluster_read.py ended ({proc.wait()}): "
                             + log.read_text()[-4000:])

    try:
        yield read
    finally:
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            kill_group(proc)


def test_distributed_readers_on_local_cluster(spark, run, cluster_reader):
    """On local-cluster[2,1,1024] (executors in their own JVMs and Python workers) both
    distributed readers give exactly the driver's rows."""
    be, store, ids, _mode = run
    got = cluster_reader(store.root, "feed", 1, ids[-1])
    for c in ids:
        want = [r.asDict(recursive=True) for r in
                be.read_state(spark, "feed", checkpoint_id=c, distributed=False).collect()]
        assert got["state"][str(c)] == want and want, c
    want = [(r.batch_id, r.operation, r.partition_id, list(r.key), r.state_name)
            for r in change_rows(store, "feed", 1, ids[-1])]
    assert [(r["batch_id"], r["operation"], r["partition_id"], [r["key"]["k"]],
             r["state_name"]) for r in got["changes"]] == want and want
