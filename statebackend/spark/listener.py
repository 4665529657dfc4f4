"""Completes checkpoints on the driver when Spark finishes a micro-batch.

One listener per Spark session, added when a backend plans an operator and removed
(``spark.streams.removeListener``) when the last streaming query it saw start has ended
and no operator was planned since, at interpreter exit, or by :func:`release` before a
session stops. A Python listener still registered when the Python side goes away makes
Spark's listener bus log an error with a Java stack for every event it can no longer
deliver. Removing it loses nothing: a checkpoint left uncompleted is completed by the
next run (or the next ``backend.complete()``), which completes every checkpoint whose
partitions have all published.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import threading
import traceback
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from ..errors import WriterFencedError
from ..redact import redact_text, redact_url
from .session import is_connect, session_key, wait_for_listener_bus

log = logging.getLogger("statebackend.listener")

# How long removal waits for a callback that is already running (completing a checkpoint
# reads and writes a few small files).
_DRAIN_TIMEOUT_S = 30.0


def observation_name(checkpoint_location: str, operator_id: str) -> str:
    """The name of the observed metric (rows the operator output per micro-batch) that a
    streaming operator's plan carries: a progress event holding it comes from a query that
    runs that operator, so the micro-batch it reports is one Spark committed for it."""
    digest = hashlib.sha1(f"{checkpoint_location}\0{operator_id}".encode()).hexdigest()[:10]
    return f"statebackend:{operator_id}@{digest}"


class _SessionListener(StreamingQueryListener):
    """One listener per Spark session, completing checkpoints for the newest backend object
    of each checkpoint location (a backend re-created for a restarted query replaces the
    old one, whose coordinators may hold an outdated parallelism)."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._backends: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jvm_lock = threading.Lock()  # one addListener/removeListener call at a time
        self.wanted = False  # should Spark's bus hold this listener?
        self._in_bus = False  # does it (as far as our own calls went)?
        self._plans = 0  # operators planned so far: one planned after a start is a new query
        self._active: dict[str, int] = {}  # run id -> plans counted when it started
        self._running = 0  # callbacks in progress
        # run id -> the (location, operator) its progress events reported: what its end
        # completes, for that run (a run refused at its tasks reports none)
        self._seen: dict[str, set[tuple[str, str]]] = {}

    def register(self, backend: Any) -> None:
        with self._lock:
            self._backends[backend.checkpoint_location] = backend
            self._plans += 1
            self.wanted = True
        self.sync()

    def unregister(self) -> None:
        with self._lock:
            self.wanted = False
        self.sync()

    def sync(self) -> None:
        """Add the listener to Spark's bus or remove it, as ``wanted`` says now."""
        with self._jvm_lock:
            with self._lock:
                wanted = self.wanted
            if wanted == self._in_bus:
                return
            try:
                if wanted:
                    self._spark.streams.addListener(self)
                else:
                    self._spark.streams.removeListener(self)
                self._in_bus = wanted
            except Exception:  # noqa: BLE001 - a stopped session has no bus to leave
                if wanted:
                    raise
                log.debug("removing the statebackend listener failed", exc_info=True)
                self._in_bus = False

    def drain(self, timeout: float = _DRAIN_TIMEOUT_S) -> bool:
        """Wait until no callback runs (once removed, none starts)."""
        with self._lock:
            return self._idle.wait_for(lambda: self._running == 0, timeout)

    def _enter(self) -> bool:
        with self._lock:
            if not self.wanted:
                return False  # being removed: an event still queued for us is ignored
            self._running += 1
            return True

    def _exit(self) -> None:
        with self._lock:
            self._running -= 1
            self._idle.notify_all()

    def _complete_all(self, up_to: int | None, observed: frozenset[str] | None,
                      run_id: str | None) -> None:
        """Complete, for run ``run_id``, the checkpoints of the operators the run's query
        runs: given ``observed`` (the observed-metric names of a progress event), those
        named there, as committed up to ``up_to``; without (the run ended), those its
        progress events named. Another query's events say nothing of an operator, and a
        run that never owned a location completes nothing in it."""
        with self._lock:
            backends = list(self._backends.values())
            if observed is None:
                targets = self._seen.pop(run_id, set())
        if observed is not None:
            targets = {(b.checkpoint_location, op) for b in backends
                       for op in b.operator_ids()
                       if observation_name(b.checkpoint_location, op) in observed}
            with self._lock:
                self._seen.setdefault(run_id, set()).update(targets)
        for backend in backends:
            try:
                for op in backend.operator_ids():
                    if (backend.checkpoint_location, op) in targets:
                        backend.complete(op, up_to=up_to, run_id=run_id)
            except WriterFencedError as exc:  # the query's own tasks fail on it too
                log.error("statebackend: %s", exc)
            except Exception:  # a listener must never kill the listener bus
                # the traceback may quote the location: redact it as the location itself
                log.error("statebackend: completing checkpoints of %s failed (will retry "
                          "next batch)\n%s", redact_url(backend.checkpoint_location),
                          redact_text(traceback.format_exc(), backend.checkpoint_location))

    def onQueryStarted(self, event: Any) -> None:
        if not self._enter():
            return
        try:
            with self._lock:
                self._active[str(event.runId)] = self._plans
        finally:
            self._exit()

    def onQueryProgress(self, event: Any) -> None:
        if not self._enter():
            return
        try:
            # Spark committed the batch just finished: ids before it with nothing published
            # ran no task of ours
            progress = getattr(event, "progress", None)
            batch = getattr(progress, "batchId", None)
            observed = frozenset(getattr(progress, "observedMetrics", None) or ())
            run = getattr(progress, "runId", None)
            if batch is not None:
                self._complete_all(int(batch), observed, None if run is None else str(run))
        finally:
            self._exit()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if not self._enter():
            return
        try:
            self._complete_all(None, None, str(event.runId))
            with self._lock:
                plans_at_start = self._active.pop(str(event.runId), None)
                # The last query we saw start has ended and nothing was planned since it
                # started (a restart plans its operators again before it starts).
                last = (plans_at_start is not None and not self._active
                        and self._plans == plans_at_start)
                if last:
                    self.wanted = False
        finally:
            self._exit()
        if last:
            if is_connect(self._spark):
                # Connect's client calls listeners holding its bus's lock, and removing
                # one waits for the bus's thread: that is this thread, so remove from
                # another one, once this callback has returned
                threading.Thread(target=self.sync, name="statebackend-listener-removal",
                                 daemon=True).start()
            else:
                self.sync()


_SESSION_LISTENERS: dict[Any, _SessionListener] = {}
_REGISTRY_LOCK = threading.Lock()
_AT_EXIT = False


def register_backend(spark: Any, backend: Any) -> None:
    """Have ``backend``'s checkpoints completed after every micro-batch of ``spark``."""
    global _AT_EXIT
    key = session_key(spark)
    with _REGISTRY_LOCK:
        listener = _SESSION_LISTENERS.get(key)
        if listener is None:
            listener = _SESSION_LISTENERS[key] = _SessionListener(spark)
        if not _AT_EXIT:
            # registered after pyspark's exit hook (which kills the JVM), so runs before it
            atexit.register(release_all)
            _AT_EXIT = True
    listener.register(backend)


def release(spark: Any) -> None:
    """Remove the session's listener (call it before ``spark.stop()``), waiting for a
    callback already running; planning an operator again adds it again."""
    with _REGISTRY_LOCK:
        listener = _SESSION_LISTENERS.pop(session_key(spark), None)
    if listener is not None:
        _release(listener)


def release_all() -> None:
    """Remove every session's listener (runs at interpreter exit)."""
    with _REGISTRY_LOCK:
        listeners = list(_SESSION_LISTENERS.values())
        _SESSION_LISTENERS.clear()
    for listener in listeners:
        _release(listener)


def _release(listener: _SessionListener) -> None:
    listener.unregister()
    # An event Spark's bus took before the removal may still be on its way to Python:
    # the process must not end before it is answered (callbacks now return at once).
    try:
        wait_for_listener_bus(listener._spark, _DRAIN_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - stopped session (no bus) or a timeout: go on
        log.debug("waiting for Spark's listener bus failed", exc_info=True)
    if not listener.drain():
        log.warning("statebackend: a listener callback still runs after %.0f s; the "
                    "checkpoint it completes is completed by the next run instead",
                    _DRAIN_TIMEOUT_S)
