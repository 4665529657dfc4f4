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

:func:`restore_report` tells, per partition of a checkpoint, where its state was restored
from (working directory, local copy, durable storage): after a task failure only the
failed partition falls back, the others keep their working directory.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import (
    IncompatibleStateError,
    OptionsError,
    RestartsExhaustedError,
    UnsafePathError,
)
from .recovery.restart import Clock, MonotonicClock, RestartDecision, RestartStrategy

__all__ = [
    "FailureRecord",
    "PartitionRestore",
    "SupervisionResult",
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


class QueryLike(Protocol):
    """What :func:`supervise` needs of a started query (``pyspark`` ``StreamingQuery``)."""

    def awaitTermination(self, timeout: int | None = None) -> bool | None: ...


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
    failures: list[FailureRecord] = []
    starts = 0
    log.info("supervising a streaming query with restart strategy %s", strategy.describe())
    while True:
        query = None
        try:
            query = start_query()
            starts += 1
            query.awaitTermination()
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
        clock.sleep(decision.delay_s)
        strategy.on_restart(clock.now())


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


def restore_report(backend: Any, operator_id: str, checkpoint_id: int
                   ) -> dict[int, PartitionRestore]:
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

    Returns
    -------
    dict of int to PartitionRestore
    """
    from .storage.manifests import read_manifest

    coord = backend.coordinator(operator_id)
    record = coord.get(checkpoint_id)
    out: dict[int, PartitionRestore] = {}
    for partition, path in sorted(record.manifests.items()):
        m = read_manifest(coord.store, path, operator_id=operator_id)
        r = m.metrics.get("restore", {}) or {}
        src = str(r.get("source", "?"))
        # dataclasses.asdict keeps the enum: "RestoreSource.DURABLE" or "durable"
        src = src.split(".")[-1].lower()
        out[partition] = PartitionRestore(
            partition, src, r.get("checkpoint_id"), int(r.get("bytes_downloaded", 0) or 0),
            r.get("fallback_reason"))
    return out


def restore_counts(report: dict[int, PartitionRestore]) -> dict[str, int]:
    """``{"working_dir": 1, "local_copy": 1}``: partitions per restore source."""
    return dict(Counter(r.source for r in report.values()))
