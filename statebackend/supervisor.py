"""Supervise a streaming query: restart it after failures as a restart strategy says.

A query over our operators restarts from the last completed checkpoint by construction:
Spark replays the failed micro-batch from its offset log, and every task of that batch
restores the state committed for the batch before (invariant 1). What the supervisor adds
is the policy: whether and when to start again, logged with its reason every time, and a
final :class:`~statebackend.errors.RestartsExhaustedError` carrying the last failure when
the strategy gives up::

    def start():
        out = backend.transform_with_state(spark.readStream...groupBy("k"), Proc(), schema)
        return out.writeStream.option("checkpointLocation", ck).start()

    result = backend.supervise(start)          # strategy from the options
    result.failures[0].decision.reason         # "exponential-delay: restart 1 in 1.07s ..."

Ctrl-C (SIGINT) while a supervised query runs stops it cleanly: :class:`InterruptGuard`
turns the signal into a flag, the waiting thread stops the query itself (never in the
middle of a py4j call), completes what the last batch published, and one line says which
batch was the last committed and that running the same command again resumes from there;
the process then exits with status 130. A second Ctrl-C exits at once.

:func:`restore_report` tells, per partition of a checkpoint, where its state was restored
from (working directory, local copy, durable storage): after a task failure only the
failed partition falls back, the others keep their working directory.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from .errors import (
    IncompatibleStateError,
    OptionsError,
    RestartsExhaustedError,
    UnsafePathError,
)
from .progress import ProgressFn
from .restart import Clock, MonotonicClock, RestartDecision, RestartStrategy

__all__ = [
    "EXIT_INTERRUPTED",
    "FailureRecord",
    "InterruptGuard",
    "PartitionRestore",
    "SupervisionResult",
    "await_query",
    "committed_batches",
    "interrupted_line",
    "is_recoverable",
    "restore_counts",
    "restore_report",
    "supervise",
]

log = logging.getLogger("statebackend.supervisor")

# Errors a restart cannot fix: the same configuration meets the same state again. Names
# too, because an error raised in a Python worker reaches the driver as text inside
# Spark's StreamingQueryException.
_FATAL: tuple[type[BaseException], ...] = (IncompatibleStateError, OptionsError,
                                           UnsafePathError)
_FATAL_NAMES = ("IncompatibleStateError", "OptionsError", "UnknownOptionError",
                "UnsafePathError")


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a process stopped by Ctrl-C


class QueryLike(Protocol):
    """What :func:`supervise` needs of a started query (``pyspark`` ``StreamingQuery``)."""

    def awaitTermination(self, timeout: float | None = None) -> bool | None: ...

    def stop(self) -> None: ...


# --- Ctrl-C -------------------------------------------------------------------------


class InterruptGuard:
    """Within ``with InterruptGuard() as guard:``, Ctrl-C (SIGINT) only sets
    ``guard.interrupted``; a second Ctrl-C exits the process at once with status 130.

    PySpark's own handler raises ``KeyboardInterrupt`` wherever the main thread is, usually
    inside a py4j call waiting for the JVM, which breaks that connection (the py4j
    tracebacks a user sees). Here the signal only sets a flag that the waiting code polls
    (:func:`await_query`), so the query is stopped by an ordinary call. Outside the main
    thread (where Python delivers no signals) the guard does nothing.

    Parameters
    ----------
    stream : file, optional
        Where the second Ctrl-C says it exits without waiting (default ``sys.stderr``).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.interrupted = False
        self._stream = stream
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            # None: the previous handler was not installed from Python
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None
                          else self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.interrupted:
            self.interrupted = True
            return
        try:
            stream = self._stream or sys.stderr
            stream.write("\ninterrupted again: exiting without waiting for the query to stop\n")
            stream.flush()
        finally:
            os._exit(EXIT_INTERRUPTED)  # the JVM exits too when its stdin pipe closes

    def sleep(self, clock: Clock, seconds: float) -> None:
        """``clock.sleep(seconds)``, cut short by Ctrl-C on the real clock."""
        if not isinstance(clock, MonotonicClock):
            clock.sleep(seconds)
            return
        end = time.monotonic() + seconds
        while not self.interrupted and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))


def await_query(query: QueryLike, guard: InterruptGuard, poll_s: float = 0.5,
                on_poll: Callable[[Any], None] | None = None, quiet_stop: bool = True) -> bool:
    """Wait until ``query`` terminates (True) or Ctrl-C is pressed (False: the query has
    then been stopped). A failed query raises its exception, as ``awaitTermination`` does.

    ``on_poll(query)`` runs in this thread every ``poll_s`` seconds while waiting. With
    ``quiet_stop``, Spark's log is silenced before the stop: cancelling a running batch
    makes Spark log the aborted jobs and tasks as errors with Java stacks.
    """
    while not guard.interrupted:
        # pyspark answers False while the query runs; anything else means it ended
        if query.awaitTermination(poll_s) is not False:
            return True
        if on_poll is not None:
            on_poll(query)
    if quiet_stop:
        from .spark.jvm import silence_spark_log

        silence_spark_log(query)
    query.stop()
    return False


def spark_committed_batch(query: Any) -> int | None:
    """The last micro-batch Spark committed in this run of ``query`` (None: none yet).

    Spark reports a batch's progress only after writing its commit log, so this is what a
    rerun resumes after. Our operator's checkpoint of the batch being stopped may already
    be complete: Spark then runs that batch again, from the state of the one before.
    """
    ids = []
    for p in getattr(query, "recentProgress", None) or []:
        b = getattr(p, "batchId", None)
        if b is None and isinstance(p, dict):
            b = p.get("batchId")
        if b is not None:
            ids.append(int(b))
    return max(ids) if ids else None


def committed_batches(last_completed: dict[str, int | None], query: Any) -> dict[str, int | None]:
    """Per operator, the batch a rerun resumes after: the latest completed checkpoint, but
    never beyond the last batch Spark committed."""
    spark = spark_committed_batch(query) if query is not None else None
    if spark is None:
        return last_completed
    return {op: None if n is None else min(n, spark) for op, n in last_completed.items()}


def interrupted_line(last_completed: dict[str, int | None]) -> str:
    """The one line printed after a Ctrl-C: the last committed batch and how to resume.

    ``last_completed``: operator id -> its latest completed checkpoint (micro-batch id).
    """
    ids = {v for v in last_completed.values()}
    if not ids or ids == {None}:
        return ("interrupted: no batch was committed yet; run the same command again to "
                "start from the beginning")
    if len(ids) == 1:
        return (f"interrupted: batch {ids.pop()} is the last committed batch; run the same "
                f"command again to resume from there")
    each = ", ".join(f"{op} {'-' if n is None else n}" for op, n in sorted(last_completed.items()))
    return (f"interrupted: last committed batch per operator: {each}; run the same command "
            f"again to resume from there")


@dataclass
class FailureRecord:
    """One failure of the supervised query and what was decided about it.

    Attributes
    ----------
    start : int
        Which start of the query failed (0 is the first).
    at : float
        Clock reading at the failure.
    error : BaseException
        The failure (for Spark, a ``StreamingQueryException`` whose text holds the task's
        Python traceback).
    decision : RestartDecision
        Restart or give up, the delay and the reason.
    last_completed : dict of str to int or None
        Per operator known to the backend, the latest completed checkpoint when the
        failure was handled: the point the restart continues from.
    """

    start: int
    at: float
    error: BaseException
    decision: RestartDecision
    last_completed: dict[str, int | None] = field(default_factory=dict)


@dataclass
class SupervisionResult:
    """How a supervised query ended (successfully: failures are what it survived)."""

    query: Any
    starts: int
    failures: list[FailureRecord]


def is_recoverable(error: BaseException) -> bool:
    """False when restarting cannot help: a typed configuration or compatibility error.

    Checks the exception chain, and the text of the message for the error names, since a
    worker's exception reaches the driver only as text. Storage and corruption errors
    stay recoverable: an outage looks the same as corruption until it is over, and the
    restart strategy bounds how often it is tried.
    """
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, _FATAL):
            return False
        e = e.__cause__ or e.__context__
    text = str(error)
    desc = getattr(error, "desc", None)  # pyspark's CapturedException keeps the JVM text
    if isinstance(desc, str):
        text += desc
    return not any(f"statebackend.errors.{name}" in text for name in _FATAL_NAMES)


def supervise(start_query: Callable[[], QueryLike], strategy: RestartStrategy, *,
              backend: Any = None, clock: Clock | None = None,
              recoverable: Callable[[BaseException], bool] = is_recoverable,
              exit_on_interrupt: bool = True, stream: TextIO | None = None,
              ) -> SupervisionResult:
    """Run ``start_query()`` until its query ends without error, restarting it after each
    failure as ``strategy`` decides.

    Parameters
    ----------
    start_query : callable
        Builds and starts the query, returning it (a ``StreamingQuery``); called again
        for every restart. It must use the same Spark ``checkpointLocation`` and state
        location every time, so the restart continues from the last completed checkpoint.
    strategy : RestartStrategy
        Fresh for this supervision (it keeps the failure history).
    backend : RocksDBStateBackend, optional
        Before each restart its pending checkpoints are completed (a checkpoint all of
        whose partitions published before the failure), and the latest completed
        checkpoint per operator is recorded in the failure record.
    clock : Clock, optional
        Time source and sleep (default: the monotonic clock).
    recoverable : callable, optional
        ``error -> bool``; a failure it refuses ends supervision at once.
    exit_on_interrupt : bool
        On Ctrl-C the query is stopped, the pending checkpoints completed and one line
        written to ``stream`` (the last committed batch, and that the same command
        resumes from there); then ``SystemExit(130)`` ends the program without a
        traceback (default), or, with False, ``KeyboardInterrupt`` is raised for the
        caller to handle. A second Ctrl-C exits at once.
    stream : file, optional
        Where the interruption line goes (default ``sys.stderr``).

    Returns
    -------
    SupervisionResult
        The final query (terminated without error), how often it was started, and every
        failure with its decision.

    Raises
    ------
    RestartsExhaustedError
        The strategy gave up, or the failure cannot be fixed by a restart; its
        ``__cause__`` is the last failure and ``failures`` lists them all.
    """
    clock = clock or MonotonicClock()
    log.info("supervising a streaming query with restart strategy %s", strategy.describe())
    with InterruptGuard(stream) as guard:
        return _supervise(start_query, strategy, backend, clock, recoverable, guard,
                          exit_on_interrupt, stream)


def _supervise(start_query: Callable[[], QueryLike], strategy: RestartStrategy, backend: Any,
               clock: Clock, recoverable: Callable[[BaseException], bool],
               guard: InterruptGuard, exit_on_interrupt: bool, stream: TextIO | None,
               ) -> SupervisionResult:
    failures: list[FailureRecord] = []
    starts = 0
    while True:
        query = None
        try:
            if guard.interrupted:
                _interrupted(backend, exit_on_interrupt, stream)
            query = start_query()
            starts += 1
            if not await_query(query, guard, quiet_stop=exit_on_interrupt):
                _interrupted(backend, exit_on_interrupt, stream, query)
            error = _query_exception(query)
            if error is None:
                if failures:
                    log.info("supervised query finished after %d restart(s)", len(failures))
                return SupervisionResult(query, starts, failures)
        except Exception as exc:  # noqa: BLE001 - every failure goes to the strategy
            if query is None:
                starts += 1  # starting itself failed: that start counts too
            error = exc
        finally:
            _stop_quietly(query)
        if guard.interrupted:  # failed while being stopped: still an interruption
            _interrupted(backend, exit_on_interrupt, stream)
        now = clock.now()
        if not recoverable(error):
            decision = RestartDecision(False, 0.0, "the failure cannot be fixed by a restart "
                                                   f"({type(error).__name__}: typed state or "
                                                   f"configuration error)")
        else:
            decision = strategy.on_failure(now)
        record = FailureRecord(starts - 1, now, error, decision, _latest(backend))
        failures.append(record)
        summary = _one_line(error)
        if not decision.restart:
            log.error("supervised query failed (start %d): %s; giving up: %s",
                      starts, summary, decision.reason)
            exc_out = RestartsExhaustedError(
                f"streaming query failed {len(failures)} time(s); giving up: "
                f"{decision.reason}. Last failure: {summary}")
            exc_out.failures = failures  # type: ignore[attr-defined]
            raise exc_out from error
        log.warning("supervised query failed (start %d): %s; restarting: %s (from "
                    "checkpoint(s) %s)", starts, summary, decision.reason,
                    record.last_completed or "-")
        guard.sleep(clock, decision.delay_s)
        strategy.on_restart(clock.now())


def _interrupted(backend: Any, exit_on_interrupt: bool, stream: TextIO | None,
                 query: Any = None) -> None:
    """After Ctrl-C stopped the query: say where a rerun resumes, then leave."""
    line = interrupted_line(committed_batches(_latest(backend), query))
    log.info("supervised query %s", line)
    out = stream or sys.stderr
    out.write(line + "\n")
    out.flush()
    if exit_on_interrupt:
        raise SystemExit(EXIT_INTERRUPTED)
    raise KeyboardInterrupt


def _query_exception(query: Any) -> BaseException | None:
    get = getattr(query, "exception", None)
    if get is None:
        return None
    try:
        return get()
    except Exception:  # noqa: BLE001 - a query whose state cannot be read: count it ended
        return None


def _stop_quietly(query: Any) -> None:
    if query is None:
        return
    try:
        if getattr(query, "isActive", False):
            query.stop()
    except Exception:  # noqa: BLE001 - stopping a failed query is best effort
        log.debug("stopping the failed query raised", exc_info=True)


def _latest(backend: Any) -> dict[str, int | None]:
    """Complete what can be completed, then the latest completed checkpoint per operator."""
    if backend is None:
        return {}
    out: dict[str, int | None] = {}
    try:
        backend.complete()
        for op in backend.operator_ids():
            latest = backend.coordinator(op).latest()
            out[op] = None if latest is None else latest.checkpoint_id
    except Exception:  # noqa: BLE001 - the record is informative; the restart goes on
        log.warning("could not read the completed checkpoints", exc_info=True)
    return out


def _one_line(error: BaseException) -> str:
    """The most telling line of a (possibly huge, JVM-wrapped) error message."""
    text = str(error)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if "Error" in line and ":" in line and not line.startswith("at "):
            return line[:300]
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"{type(error).__name__}: {first[:300]}"


# --- where partitions restored from -------------------------------------------------


@dataclass(frozen=True)
class PartitionRestore:
    """Where one partition's task found its state for one checkpoint."""

    partition: int
    source: str  # empty, working_dir, local_copy or durable
    restored_checkpoint: int | None
    bytes_downloaded: int
    fallback_reason: str | None
    executor: str | None = None  # the Spark executor that ran the task (None: not recorded)


def restore_report(backend: Any, operator_id: str, checkpoint_id: int, *,
                   progress: ProgressFn | None = None) -> dict[int, PartitionRestore]:
    """Per partition, how the task that wrote completed checkpoint ``checkpoint_id``
    restored its state (from the restore metrics in the partition manifests).

    Parameters
    ----------
    backend : RocksDBStateBackend
        The backend of the query.
    operator_id : str
        The operator.
    checkpoint_id : int
        A completed checkpoint (micro-batch id).
    progress : callable, optional
        Called after each partition manifest read (:class:`statebackend.progress.Progress`
        shows it on a terminal).

    Returns
    -------
    dict of int to PartitionRestore
    """
    from .storage.manifests import read_manifest

    coord = backend.coordinator(operator_id)
    record = coord.get(checkpoint_id)
    out: dict[int, PartitionRestore] = {}
    total = len(record.manifests)
    for partition, path in sorted(record.manifests.items()):
        m = read_manifest(coord.store, path, operator_id=operator_id)
        r = m.metrics.get("restore", {}) or {}
        src = str(r.get("source", "?"))
        # dataclasses.asdict keeps the enum: "RestoreSource.DURABLE" or "durable"
        src = src.split(".")[-1].lower()
        out[partition] = PartitionRestore(
            partition, src, r.get("checkpoint_id"), int(r.get("bytes_downloaded", 0) or 0),
            r.get("fallback_reason"), m.metrics.get("executor"))
        if progress is not None:
            progress(len(out), total, unit="manifests")
    return out


def restore_counts(report: dict[int, PartitionRestore]) -> dict[str, int]:
    """``{"working_dir": 1, "local_copy": 1}``: partitions per restore source."""
    return dict(Counter(r.source for r in report.values()))
