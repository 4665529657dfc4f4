"""Completes checkpoints on the driver when Spark finishes a micro-batch."""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("statebackend.listener")


class CompletionListener(StreamingQueryListener):
    """After each micro-batch, ask every coordinator of the backend to complete what all
    partitions have published. Completion is idempotent and also runs when an operator is
    planned, so a progress event that is missed (driver crash) is caught up later."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            self._backend.complete()
        except Exception:  # a listener must never kill the listener bus
            log.exception("statebackend: completing checkpoints failed (will retry next batch)")

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        try:
            self._backend.complete()
        except Exception:
            log.exception("statebackend: completing checkpoints at query end failed")
