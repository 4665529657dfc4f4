"""The supervisor against fake queries: restarts as the strategy says, logs each decision
with its reason, gives up with the last error, never restarts what a restart cannot fix."""

from __future__ import annotations

import io
import logging
import os
import random
import signal
import subprocess
import sys

import pytest

from statebackend.errors import (
    CorruptStateError,
    IncompatibleStateError,
    RestartsExhaustedError,
    StorageError,
)
from statebackend.restart import ExponentialDelay, FixedDelay, ManualClock, NoRestart
from statebackend.supervisor import is_recoverable, supervise

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeQuery:
    """Runs for ``run_s`` seconds of the manual clock, then fails with ``error`` (or ends)."""

    def __init__(self, clock: ManualClock, run_s: float, error: BaseException | None) -> None:
        self.clock, self.run_s, self.error = clock, run_s, error
        self.isActive = True
        self.stopped = False

    def awaitTermination(self, timeout=None):
        self.clock.advance(self.run_s)
        self.isActive = False
        if self.error is not None:
            raise self.error
        return None

    def exception(self):
        return None

    def stop(self):
        self.stopped = True


def starter(clock: ManualClock, errors: list[BaseException | None], run_s: float = 1.0):
    queries: list[FakeQuery] = []

    def start():
        q = FakeQuery(clock, run_s, errors[len(queries)])
        queries.append(q)
        return q

    return start, queries


def test_survives_three_failures_under_exponential_delay(caplog) -> None:
    clock = ManualClock()
    errors = [RuntimeError("boom 1"), StorageError("outage"), RuntimeError("boom 3"), None]
    start, queries = starter(clock, errors)
    strategy = ExponentialDelay(1.0, 60.0, 2.0, 0.1, 3600.0, rng=random.Random(3))
    with caplog.at_level(logging.WARNING, logger="statebackend.supervisor"):
        result = supervise(start, strategy, clock=clock)
    assert result.starts == 4 and len(queries) == 4
    assert result.query is queries[-1]
    assert [f.start for f in result.failures] == [0, 1, 2]
    assert [str(f.error) for f in result.failures] == ["boom 1", "outage", "boom 3"]
    for f, backoff in zip(result.failures, (1.0, 2.0, 4.0)):
        assert f.decision.restart
        assert backoff * 0.9 <= f.decision.delay_s <= backoff * 1.1
    assert clock.sleeps == [f.decision.delay_s for f in result.failures]
    # every decision logged with its reason
    restarts = [r for r in caplog.records if "restarting" in r.getMessage()]
    assert len(restarts) == 3
    assert all("exponential-delay: restart" in r.getMessage() for r in restarts)


def test_gives_up_with_the_last_error_when_the_strategy_says_so(caplog) -> None:
    clock = ManualClock()
    errors: list[BaseException | None] = [RuntimeError(f"boom {i}") for i in range(5)]
    start, queries = starter(clock, errors)
    with caplog.at_level(logging.ERROR, logger="statebackend.supervisor"):
        with pytest.raises(RestartsExhaustedError) as info:
            supervise(start, FixedDelay(2, 5.0), clock=clock)
    assert len(queries) == 3
    assert str(info.value.__cause__) == "boom 2"
    assert "all 2 restart attempts used" in str(info.value)
    assert len(info.value.failures) == 3
    assert clock.sleeps == [5.0, 5.0]
    assert any("giving up" in r.getMessage() for r in caplog.records)


def test_no_restart_strategy_fails_on_first_error() -> None:
    clock = ManualClock()
    start, queries = starter(clock, [RuntimeError("x"), None])
    with pytest.raises(RestartsExhaustedError):
        supervise(start, NoRestart(), clock=clock)
    assert len(queries) == 1 and clock.sleeps == []


def test_a_query_that_ends_cleanly_is_not_restarted() -> None:
    clock = ManualClock()
    start, queries = starter(clock, [None])
    result = supervise(start, FixedDelay(3, 1), clock=clock)
    assert result.starts == 1 and result.failures == [] and clock.sleeps == []


def test_failure_to_start_counts_as_a_failure() -> None:
    clock = ManualClock()
    calls = []

    def start():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("cluster not reachable")
        return FakeQuery(clock, 1, None)

    result = supervise(start, FixedDelay(1, 0.5), clock=clock)
    assert result.starts == 2 and len(result.failures) == 1
    assert isinstance(result.failures[0].error, ConnectionError)


def test_unfixable_errors_end_supervision_at_once() -> None:
    clock = ManualClock()
    start, queries = starter(clock, [IncompatibleStateError("max_parallelism changed"), None])
    with pytest.raises(RestartsExhaustedError, match="cannot be fixed by a restart") as info:
        supervise(start, FixedDelay(10, 1), clock=clock)
    assert isinstance(info.value.__cause__, IncompatibleStateError)
    assert len(queries) == 1 and clock.sleeps == []


def test_recoverable_classification() -> None:
    assert is_recoverable(RuntimeError("x"))
    assert is_recoverable(StorageError("outage"))
    assert is_recoverable(CorruptStateError("bad file"))  # may be an outage: strategy decides
    assert not is_recoverable(IncompatibleStateError("x"))
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = IncompatibleStateError("inner")
    assert not is_recoverable(wrapped)
    # how a worker's error reaches the driver: as text in a JVM exception
    assert not is_recoverable(RuntimeError(
        "Job aborted ... File \"runner.py\" ...\nstatebackend.errors.IncompatibleStateError: "
        "state was written with max_parallelism=128"))
    assert is_recoverable(RuntimeError("statebackend.errors.StorageError: upload failed"))


class FakeBackend:
    def __init__(self) -> None:
        self.completed = 0

    def complete(self):
        self.completed += 1
        return []

    def operator_ids(self):
        return ["op"]

    def coordinator(self, op):
        backend = self

        class C:
            def latest(self_inner):
                class R:
                    checkpoint_id = backend.completed - 1
                return R() if backend.completed else None
        return C()


def test_pending_checkpoints_are_completed_and_recorded_before_each_restart() -> None:
    clock = ManualClock()
    backend = FakeBackend()
    start, _ = starter(clock, [RuntimeError("a"), RuntimeError("b"), None])
    result = supervise(start, FixedDelay(5, 0), backend=backend, clock=clock)
    assert backend.completed == 2
    assert [f.last_completed for f in result.failures] == [{"op": 0}, {"op": 1}]


# --- Ctrl-C -------------------------------------------------------------------------------


class RunningQuery:
    """Runs until stopped; the ``ctrl_c_at``-th wait receives a SIGINT, as from a terminal."""

    def __init__(self, ctrl_c_at: int = 2) -> None:
        self.waits, self.ctrl_c_at, self.stopped = 0, ctrl_c_at, False

    def awaitTermination(self, timeout=None):
        self.waits += 1
        if self.waits == self.ctrl_c_at:
            os.kill(os.getpid(), signal.SIGINT)
        return self.stopped

    @property
    def isActive(self):
        return not self.stopped

    def exception(self):
        return None

    def stop(self):
        self.stopped = True


def test_ctrl_c_stops_the_query_says_where_it_resumes_and_exits_130() -> None:
    query, backend, out = RunningQuery(), FakeBackend(), io.StringIO()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as info:
        supervise(lambda: query, NoRestart(), backend=backend, clock=ManualClock(), stream=out)
    assert info.value.code == 130
    assert query.stopped and backend.completed == 1
    assert out.getvalue() == ("interrupted: batch 0 is the last committed batch; run the same "
                              "command again to resume from there\n")
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_ctrl_c_can_be_left_to_the_caller() -> None:
    query, out = RunningQuery(), io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        supervise(lambda: query, NoRestart(), clock=ManualClock(), stream=out,
                  exit_on_interrupt=False)
    assert query.stopped
    assert out.getvalue().startswith("interrupted: no batch was committed yet")


def test_a_second_ctrl_c_exits_at_once() -> None:
    script = (
        "import time\n"
        "from statebackend.supervisor import InterruptGuard, await_query\n"
        "class Q:\n"
        "    def awaitTermination(self, t):\n"
        "        time.sleep(t); return False\n"
        "    def stop(self):\n"
        "        print('stopping', flush=True); time.sleep(120)\n"
        "with InterruptGuard() as g:\n"
        "    print('ready', flush=True)\n"
        "    await_query(Q(), g, 0.05, quiet_stop=False)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)  # the first: the query is being stopped (slowly)
    assert proc.stdout.readline() == "stopping\n"
    proc.send_signal(signal.SIGINT)  # the second: out now, not after the 120 s stop
    assert proc.wait(timeout=60) == 130
    err = proc.stderr.read() if proc.stderr else ""
    assert "interrupted again" in err and "Traceback" not in err


def test_the_resume_line_never_names_a_batch_spark_has_not_committed():
    from statebackend.supervisor import committed_batches, spark_committed_batch

    class Query:  # recentProgress as pyspark reports it: one entry per committed batch
        recentProgress = [{"batchId": 0}, {"batchId": 1}]

    # our checkpoint of batch 2 completed, but Spark was stopped before committing it:
    # a rerun runs batch 2 again, so the line names batch 1
    assert spark_committed_batch(Query()) == 1
    assert committed_batches({"op": 2}, Query()) == {"op": 1}
    assert committed_batches({"op": 0, "none": None}, Query()) == {"op": 0, "none": None}
    # nothing committed in this run (or no query): the checkpoints say it
    Query.recentProgress = []
    assert committed_batches({"op": 2}, Query()) == {"op": 2}
    assert committed_batches({"op": 2}, None) == {"op": 2}
