"""The driver process killed, and the query started again (markers ``spark``, ``faults``).

Each run is a separate driver process (``driver_job.py``) with its own SparkSession over
the same Spark ``checkpointLocation`` and state location, so the kill takes the driver's
JVM, the coordinator and every in-memory structure with it, as losing the driver machine
would. The final run must end with output per micro-batch, committed state and the
completed checkpoints identical to a failure-free run, and no file below the latest
checkpoint that no retained checkpoint references.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from harness import early, kill_group, killed_at_end

pytestmark = [pytest.mark.spark, pytest.mark.faults]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N_BATCHES = 6
OP = "counts"


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=path, **extra)


def _write_input(work: str, seed: int) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    data = [pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, 8, 30)],
                          "x": rng.integers(0, 10, 30).astype("int64")})
            for _ in range(N_BATCHES)]
    os.makedirs(os.path.join(work, "in"))
    base = time.time()
    for i, pdf in enumerate(data):
        pdf.to_parquet(os.path.join(work, "in", f"part-{i:05d}.parquet"), index=False)
        # one second apart: Spark's file source reads the oldest file first and breaks
        # ties in listing order, so equal times could reorder the micro-batches
        path = os.path.join(work, "in", f"part-{i:05d}.parquet")
        os.utime(path, (base + i, base + i))
    return data


def _reference(data: list[pd.DataFrame]) -> tuple[dict[str, list], dict[str, int]]:
    totals: dict[str, int] = {}
    out = {}
    for b, pdf in enumerate(data):
        counts = pdf.groupby("k").size()
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + int(n)
        out[str(b)] = sorted([k, totals[k]] for k in counts.index)
    return out, totals


def _start(work: str, **env: str) -> subprocess.Popen:
    """A driver that starts its SparkSession and waits for :func:`_go` before it touches
    the query: the next run's Python and JVM start while the previous run is working."""
    # its own process group: a kill takes the driver's JVM (a child) along, and nothing else
    return subprocess.Popen([sys.executable, os.path.join(HERE, "driver_job.py"), work],
                            env=_env(SB_WAIT_FOR_GO="1", **env), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _go(proc: subprocess.Popen) -> subprocess.Popen:
    """Let a driver of :func:`_start` run its query (the previous run has ended)."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc


def _reap(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:  # whatever of the group outlived its driver (the JVM exits on stdin EOF)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def _result(code: int, out: str, err: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert code == 0 and lines, err[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def _outputs(work: str) -> dict[str, list]:
    d = os.path.join(work, "out")
    return {n[len("batch-"):-len(".json")]: json.load(open(os.path.join(d, n)))
            for n in os.listdir(d) if n.endswith(".json")}


def _records(work: str) -> dict[str, bytes]:
    d = os.path.join(work, "state", "counts", "_checkpoints")
    # the records only (not LATEST.json, the pointer to the newest)
    return {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)
            if n.startswith("chk-")} if os.path.isdir(d) else {}


def _committed(work: str) -> tuple[list[int], dict[str, int], list[str]]:
    """From durable storage alone (no coordinator, whose rebuild would collect garbage):
    the completed checkpoints, the state of the latest, and the files under ``chk-<k>/``
    for ``k`` below the latest that no retained record references (leaks)."""
    from statebackend.model.manifest import CompletedCheckpoint
    from statebackend.read.rows import read_rows
    from statebackend.storage import open_store
    from statebackend.storage.manifests import read_manifest

    store = open_store(os.path.join(work, "state"))
    op_root = os.path.join(work, "state", OP)
    records = [CompletedCheckpoint.from_json(raw) for raw in _records(work).values()]
    completed = sorted(r.checkpoint_id for r in records)
    referenced: set[str] = set()
    for r in records:
        for path in r.manifests.values():
            referenced.add(path)
            referenced.update(f.path for f in read_manifest(store, path, operator_id=OP).files)
    leaked = []
    for name in os.listdir(op_root):
        if name.startswith("chk-") and int(name[4:]) < completed[-1]:
            for d, _dirs, files in os.walk(os.path.join(op_root, name)):
                leaked += [rel for f in files
                           if (rel := os.path.relpath(os.path.join(d, f), op_root))
                           not in referenced]
    state = {row.key[0]: int(row.value[0])
             for row in read_rows(store, OP, state_name="count", temp_dir=work)}
    return completed, state, sorted(leaked)


def _wait_for(path: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the query ended before it could be killed"


def start_early(request: pytest.FixtureRequest) -> Callable[[], None]:
    """The driver runs of the test below, run in the background (tests/conftest.py,
    ``_jobs_started_early``): each run is a process that mostly waits on its JVM. At the
    end of the run, any driver still alive (one waiting for its ``go`` after a failed
    assertion) is killed with its JVM."""
    work = str(request.getfixturevalue("tmp_path_factory").mktemp("driver-kill"))
    procs = killed_at_end(request)

    def start(work: str, **env: str) -> subprocess.Popen:
        procs.append(_start(work, **env))
        return procs[-1]

    def job() -> None:
        try:
            _driver_runs(work, start)
        finally:
            for proc in procs:
                kill_group(proc)

    return job


def test_driver_killed_in_completion_in_deletion_and_by_sigkill(request):
    """Four driver runs over one query: killed just before writing a completed record,
    killed halfway through a deletion, SIGKILLed from outside mid-stream, then a run
    without faults that finishes exactly once (:func:`_driver_runs`, which asserts each
    step; its failure is this test's)."""
    early(request, __name__)


def _driver_runs(work: str, start: Callable[..., subprocess.Popen]) -> None:
    data = _write_input(work, seed=31)
    fault_file = os.path.join(work, "fault.json")

    # run 1 dies inside the coordinator, just before the record of checkpoint 1 is written
    run1 = _go(start(work, SB_DRIVER_FAULT="record:1"))
    run2 = start(work, SB_DRIVER_FAULT="delete:3")
    code, _out, err = _reap(run1)
    assert code == 137, err[-3000:]
    assert json.load(open(fault_file))["path"].endswith("_checkpoints/chk-1.json")
    assert "chk-1.json" not in _records(work) and "chk-0.json" in _records(work)
    os.remove(fault_file)

    # run 2 completes checkpoint 1 (Spark had committed micro-batch 1) and dies in the
    # middle of a later deletion: half of one delete call's paths are gone
    _go(run2)
    run3 = start(work, SB_TASK_SLEEP_S="0.7")
    code, _out, err = _reap(run2)
    assert code == 137, err[-3000:]
    assert json.load(open(fault_file))["deleted"]
    after_delete_kill = max(int(n[4:-5]) for n in _records(work))

    # run 3 is SIGKILLed (driver and JVM) from outside, inside a micro-batch's tasks
    _go(run3)
    run4 = start(work)
    _wait_for(os.path.join(work, "state", OP, "_checkpoints",
                           f"chk-{after_delete_kill + 1}.json"), run3)
    time.sleep(0.5)
    os.killpg(run3.pid, signal.SIGKILL)
    assert _reap(run3)[0] == -signal.SIGKILL
    assert max(int(b) for b in _outputs(work)) < N_BATCHES - 1

    # run 4, without faults, finishes from what the killed drivers left behind
    res = _result(*_reap(_go(run4)))
    ref_out, ref_state = _reference(data)
    assert _outputs(work) == ref_out
    assert res["completed"] == [N_BATCHES - 1]  # num_retained=1
    completed, state, leaked = _committed(work)
    assert completed == [N_BATCHES - 1]
    assert state == ref_state
    assert leaked == []
