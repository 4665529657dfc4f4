"""Completes checkpoints on the driver when Spark finishes a micro-batch."""

from __future__ import annotations

import logging
import threading
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("statebackend.listener")


class _SessionListener(StreamingQueryListener):
    """One listener per Spark session, completing checkpoints for the newest backend object
    of each checkpoint location (a backend re-created for a restarted query replaces the
    old one, whose coordinators may hold an outdated parallelism)."""

    def __init__(self) -> None:
        self._backends: dict[str, Any] = {}
        self._lock = threading.Lock()

    def register(self, backend: Any) -> None:
        with self._lock:
            self._backends[backend.checkpoint_location] = backend

    def _complete_all(self, up_to: int | None = None) -> None:
        with self._lock:
            backends = list(self._backends.values())
        for backend in backends:
            try:
                backend.complete(up_to=up_to)
            except Exception:  # a listener must never kill the listener bus
                log.exception("statebackend: completing checkpoints of %s failed (will retry "
                              "next batch)", backend.checkpoint_location)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        # the batch just finished: ids before it with nothing published ran no task of ours
        batch = getattr(getattr(event, "progress", None), "batchId", None)
        self._complete_all(int(batch) if batch is not None else None)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self._complete_all()


_SESSION_LISTENERS: dict[int, _SessionListener] = {}
_REGISTRY_LOCK = threading.Lock()


def register_backend(spark: Any, backend: Any) -> None:
    """Have ``backend``'s checkpoints completed after every micro-batch of ``spark``."""
    key = id(spark.sparkContext._jsc)
    with _REGISTRY_LOCK:
        listener = _SESSION_LISTENERS.get(key)
        if listener is None:
            listener = _SESSION_LISTENERS[key] = _SessionListener()
            spark.streams.addListener(listener)
    listener.register(backend)
