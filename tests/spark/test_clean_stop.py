"""Clean stops: Ctrl-C in the demo, and scripts that stop a query (or not) and exit.

A terminal sends Ctrl-C to the whole foreground process group, so the demo runs in a new
process group and the test signals the group, as the terminal would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from harness import early

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend import demo as demo_module
from statebackend.spark import listener as listener_module
from statebackend.spark.session import session_key

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NOISE = ("Traceback", "Py4J", "py4j", "StreamingQueryListenerBus", "threw an exception")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    return env


def _run_until(argv: list[str], stop_after: str, timeout: float = 600):
    """Start ``argv`` in its own process group; once a line of its output starts with
    ``stop_after``, send SIGINT to the group. Returns (exit status, output, lines seen
    before the signal)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=_env(), cwd=REPO)
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines, before = [], None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if before is None and line.startswith(stop_after):
                before = len(lines)
                os.killpg(proc.pid, signal.SIGINT)
        proc.wait()
    finally:
        timer.cancel()
    return proc.returncode, "".join(lines), before


def _demo_args(work: str) -> list[str]:
    return ["--dir", os.path.join(work, "demo"), "--events", "400", "--keys", "60",
            "--partitions", "2", "--batches", "8"]


def start_early(request: pytest.FixtureRequest) -> Callable[[], dict[str, Any]]:
    """The two scripts of the tests below (the demo stopped by Ctrl-C, the job that stops
    its query and exits), each a process with a JVM of its own, run one after the other in
    the background (tests/conftest.py, ``_jobs_started_early``); each test checks what
    its script did."""
    tmp = request.getfixturevalue("tmp_path_factory")
    demo, job = str(tmp.mktemp("ctrl-c")), str(tmp.mktemp("stop-and-exit"))

    def scripts() -> dict[str, Any]:
        return {"demo": (demo, _run_until([sys.executable, "-m", "statebackend.demo"]
                                          + _demo_args(demo), stop_after="batch   1")),
                "job": (job, subprocess.run(
                    [sys.executable, os.path.join(HERE, "stop_and_exit_job.py"),
                     os.path.join(job, "job")], capture_output=True, text=True, env=_env(),
                    cwd=REPO, timeout=600))}

    return scripts


def _script(request: pytest.FixtureRequest, name: str) -> tuple[str, Any]:
    """(its work directory, what it returned) of a script of :func:`start_early`."""
    return early(request, __name__)[name]


def test_ctrl_c_stops_the_demo_cleanly_and_the_rerun_resumes(spark, request, capsys):
    work, (code, out, before) = _script(request, "demo")
    common = _demo_args(work)
    assert before is not None, out
    assert code == 130, out
    after = out.splitlines()[before:]
    resume = [ln for ln in after if ln.startswith("interrupted:")]
    assert len(resume) == 1, out
    assert "is the last committed batch; run the same command again to resume" in resume[0]
    committed = int(resume[0].split("batch ")[1].split()[0])
    assert committed >= 1
    # nothing else after the batch lines: no traceback, no py4j, no listener error
    assert not [ln for ln in after if not ln.startswith(("batch ", "interrupted:"))], out
    assert not [w for w in NOISE if w in out], out
    # the same command again resumes after the last committed batch; totals match
    assert demo_module.main(common) == 0
    second = capsys.readouterr().out
    assert f"batch {committed:>3} " not in second and "batch   7" in second
    assert "totals match" in second


def test_a_script_that_stops_a_query_and_exits_prints_no_listener_error(request):
    tmp, proc = _script(request, "job")
    work = os.path.join(tmp, "job")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    done = int(out.split("stopped after batch ")[1].split()[0])
    assert done >= 2
    assert not [w for w in NOISE if w in out], out
    # what the run published but did not complete, the next run completes (as it plans)
    backend = RocksDBStateBackend(os.path.join(work, "state"),
                                  StateBackendOptions(parallelism=2))  # as the job's
    backend.complete("counts")
    assert backend.coordinator("counts").latest().checkpoint_id >= done


def test_the_listener_leaves_the_bus_when_the_last_query_ends(spark, tmp_path):
    import processors as P
    from harness import random_batches, run_stream, write_batches

    write_batches(str(tmp_path / "in"), random_batches(2, seed=5))
    be = RocksDBStateBackend(str(tmp_path / "state"), StateBackendOptions(
        parallelism=2, local_dir=str(tmp_path / "local")))
    run_stream(spark, str(tmp_path / "in"), "k STRING, x BIGINT, ts TIMESTAMP",
               lambda df: be.transform_with_state(df.groupBy("k"), P.RunningCount(),
                                                  "k STRING, v BIGINT", operator_id="rc"),
               str(tmp_path / "ck"))
    listener = listener_module._SESSION_LISTENERS[session_key(spark)]
    deadline = time.monotonic() + 60
    while listener._in_bus and time.monotonic() < deadline:  # the bus is asynchronous
        time.sleep(0.1)
    assert not listener._in_bus
    # it completed the checkpoints before leaving
    assert be.coordinator("rc").latest().checkpoint_id == 1
    # planning again brings it back
    be.transform_with_state(spark.readStream.schema("k STRING, x BIGINT, ts TIMESTAMP")
                            .parquet(str(tmp_path / "in")).groupBy("k"), P.RunningCount(),
                            "k STRING, v BIGINT", operator_id="rc")
    assert listener._in_bus
    listener_module.release(spark)
    assert not listener._in_bus
