"""Garbage collection on a background thread (``background_gc``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from .records import GcReport

log = logging.getLogger("statebackend.coordinator.coordinator")


class BackgroundCollection:
    """Garbage collection on one background thread: a request while a collection runs
    asks for one more run after it, not one per request (completions come faster than
    deletions on a slow store)."""

    def __init__(self, name: str, collect: Callable[[], GcReport]) -> None:
        self._collect = collect
        self._name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gc-{name}")
        self._lock = threading.Lock()
        self._future: Future[GcReport] | None = None
        self._again = False

    def request(self) -> None:
        with self._lock:
            if self._future is not None and not self._future.done():
                self._again = True
                return
            self._future = self._pool.submit(self._run)

    def _run(self) -> GcReport:
        while True:
            try:
                report = self._collect()
            except Exception:  # noqa: BLE001 - the next completion retries it
                log.exception("background garbage collection of %s failed; it will be "
                              "retried after the next completion", self._name)
                report = GcReport()
            with self._lock:
                if not self._again:
                    return report
                self._again = False

    def wait(self) -> None:
        """Block until no collection runs or is asked for."""
        while True:
            with self._lock:
                fut = self._future
            if fut is None:
                return
            fut.result()
            with self._lock:
                if self._future is fut and fut.done():
                    return

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
