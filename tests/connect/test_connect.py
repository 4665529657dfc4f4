"""Every swap-in, reader and checkpoint completion on a Spark Connect session, compared with
Spark's own operators on Connect and with ours on a classic session.

The Connect side runs in its own process (tests/connect/connect_job.py: pyspark puts a
whole process into Connect mode), on a local Connect server pyspark starts; this module
runs the same scenarios on the classic ``spark`` session and compares, micro-batch by
micro-batch, and reads the state the Connect run wrote with the classic readers.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fidelity_cases import fidelity_batches
from harness import (
    assert_same,
    check_batches,
    early,
    killed_at_end,
    random_batches,
    running_counts,
    write_batches,
)

from statebackend import RocksDBStateBackend

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "connect_job.py")
sys.path.insert(0, os.path.dirname(JOB))
from connect_job import EVERY_STATE, FIDELITY  # noqa: E402


def start_early(request: pytest.FixtureRequest) -> Callable[[], Path]:
    """The job that runs every Connect scenario once (one local Connect server, ~3 minutes
    on 2 cores), run in the background (tests/conftest.py, ``_jobs_started_early``); a
    job still running at the end of the run (interrupted before its tests) is killed."""
    work = request.getfixturevalue("tmp_path_factory").mktemp("connect")
    input_dir = work / "fidelity-input"
    write_batches(str(input_dir), fidelity_batches())
    procs = killed_at_end(request)

    def job() -> Path:
        with open(work / "job.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, JOB, str(work), str(input_dir)],
                                          stdout=log, stderr=subprocess.STDOUT, text=True,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        procs[0].wait(timeout=2400)
        return work

    return job


@pytest.fixture(scope="module")
def connect_run(request) -> Path:
    """The work directory of the Connect job, once it ended; each test then reads what its
    scenario left under ``results/``."""
    return early(request, __name__)


def _result(work: Path, scenario: str) -> Path:
    out = work / "results" / scenario
    error = out / "error.json"
    assert not error.exists(), json.loads(error.read_text())["error"]
    assert out.exists(), f"scenario {scenario} did not run; see {work / 'job.log'}"
    return out


def _batches(d: Path) -> dict[int, pd.DataFrame]:
    out = {}
    for f in sorted(d.glob("*.pkl")):
        pdf = pd.read_pickle(f)
        out[int(f.stem)] = pdf.sort_values(list(pdf.columns)).reset_index(drop=True)
    return out


def _canon(v: Any) -> Any:
    """A value as both kinds of session hand it to pandas, in one form: Rows and dicts as
    dicts, arrays as lists, timestamps as UTC instants."""
    if hasattr(v, "asDict"):
        return {k: _canon(x) for k, x in v.asDict().items()}
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, list | tuple | np.ndarray):
        return [_canon(x) for x in v]
    if isinstance(v, pd.Timestamp | datetime.datetime):
        ts = pd.Timestamp(v)
        return (ts.tz_localize(None) if ts.tzinfo is None else
                ts.tz_convert("UTC").tz_localize(None)).isoformat()
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def _rows(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(_canon(v) for v in row) for row in frame.itertuples(index=False)]


@pytest.mark.parametrize("name", FIDELITY)
def test_fidelity_case_on_connect_equals_spark_and_classic(spark, connect_run,
                                                          fidelity_classic, name):
    out = _result(connect_run, name)
    ours, theirs = _batches(out / "ours"), _batches(out / "theirs")
    # the 6 micro-batches with input, and any no-data micro-batch Spark ran
    assert len(theirs) >= 6 and sum(len(f) for f in theirs.values()) > 0
    # on Connect: ours gives Spark's own operator's rows in every micro-batch
    assert_same(ours, theirs)
    # on classic (the job's session: Spark's defaults, or no-data micro-batches off,
    # Case.session): the same case gives the same rows; the run's one classic run of the
    # case (conftest.fidelity_classic), which tests/spark/test_fidelity.py compares with
    # Spark's operator on classic
    classic, _, _ = fidelity_classic(name)
    assert_same(ours, classic)
    # read_state on Connect (every state as JSON, each state typed) = the classic reader's
    # rows of the state the Connect run wrote
    meta = json.loads((out / "meta.json").read_text())
    reader = RocksDBStateBackend(meta["state"])
    views = pd.read_pickle(out / "read_state.pkl")
    assert EVERY_STATE in views and len(views) > 1
    for state, frame in views.items():
        expected = reader.read_state(spark, meta["operator_id"],
                                     state_name=None if state == EVERY_STATE else state
                                     ).toPandas()
        assert list(frame.columns) == list(expected.columns)
        assert _rows(frame) == _rows(expected), state


def test_exactly_once_restart_change_feed_savepoint_and_progress_on_connect(spark,
                                                                            connect_run):
    out = _result(connect_run, "restart")
    data = random_batches(5, seed=29)
    # a task failed once in each run and the query restarted on more input: the rows of
    # a failure-free run
    check_batches(_batches(out / "batches"), running_counts(data)[0])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["latest"] == 4 and len(meta["retained"]) >= 2
    # completed by the session's listener, without a call to complete()
    assert meta["by_listener"] == 4
    # the backend's metrics were in Spark's progress under the observation name
    assert meta["observed"] and all(o is not None and o["rows"] > 0 and o["partitions"] == 2
                                    and o["input_rows"] > 0 for o in meta["observed"])
    # the change feed Connect read = the classic reader's
    reader = RocksDBStateBackend(meta["state"])
    changes = pd.read_pickle(out / "changes.pkl")
    expected = reader.read_changes(spark, "rc", meta["retained"][0],
                                   meta["retained"][-1]).toPandas()
    assert len(changes) > 0 and _rows(changes) == _rows(expected)
    # the savepoint Connect took holds the latest checkpoint's entries
    def entries(frame: pd.DataFrame) -> list:
        return sorted(map(repr, _rows(frame[["key", "state_name", "user_key", "value"]])))

    saved = reader.read_state(spark, "rc", savepoint=meta["savepoint"]).toPandas()
    latest = reader.read_state(spark, "rc").toPandas()
    assert len(latest) >= len(running_counts(data)[1]) and entries(saved) == entries(latest)


def test_map_in_pandas_with_value_blocks_on_connect(spark, connect_run):
    out = _result(connect_run, "vector")
    data = random_batches(3, seed=41, rows=120, keys=60)
    ref, totals = running_counts(data)
    check_batches(_batches(out / "batches"), ref)
    frames = pd.read_pickle(out / "read_state.pkl")
    got = {_canon(r)["k"]: _canon(v)["c"] for r, v in
           zip(frames["typed"]["key"], frames["typed"]["value"])}
    assert got == totals
    # the distributed reader and the driver reader agree on Connect, and with classic
    assert _rows(frames["typed"]) == _rows(frames["driver"])
    meta = json.loads((out / "meta.json").read_text())
    classic = RocksDBStateBackend(meta["state"]).read_state(
        spark, "vec", state_name="columnState").toPandas()
    assert _rows(frames["typed"]) == _rows(classic)


def test_supervise_on_connect(connect_run):
    meta = json.loads((_result(connect_run, "supervise") / "meta.json").read_text())
    assert meta == {"starts": 1, "failures": 0, "latest": 1}


def test_demo_on_a_connect_session(connect_run):
    """The demo with ``--remote``: a local Connect server of its own (the job's last
    scenario, after the job's session stopped), the totals checked at the end."""
    out = _result(connect_run, "demo")
    stdout = (out / "stdout.txt").read_text()
    assert json.loads((out / "meta.json").read_text()) == {"code": 0}, stdout[-3000:]
    assert "totals match" in stdout
    assert [line.split("|")[0].strip() for line in stdout.splitlines()
            if line.startswith("batch ")] == ["batch   0", "batch   1", "batch   2"]


def test_a_move_from_sparks_store_on_connect(connect_run):
    """The one-step move on Connect: the savepoint's read_state equals Spark's export (read
    on Connect), and the moved query's micro-batches equal Spark's query continuing from
    its checkpoint."""
    import import_procs as IP

    out = _result(connect_run, "import")
    exports = pd.read_pickle(out / "exports.pkl")
    IP.assert_same_exports(exports["ours"], exports["spark"])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rows"]["cnt"] == 7 and meta["rows"]["$timers"] > 7
    theirs, ours = _batches(out / "theirs"), _batches(out / "ours")
    assert sorted(theirs) == [3, 4, 5]
    assert_same({b + 3: v for b, v in ours.items()}, theirs)
