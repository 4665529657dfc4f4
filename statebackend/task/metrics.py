"""What one task records in its manifest besides the checkpoint's own metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


class TaskClock:
    """Where a task's time went: :meth:`lap` closes a phase, named by what it did."""

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.ms[phase] = round(1000 * (now - self._last), 3)
        self._last = now

    def waited(self, read_s: float) -> None:
        """Move ``read_s`` (waiting for Spark's rows while the function ran, for streamed
        input) from the ``process`` phase to ``input``."""
        self.ms["input"] += 1000 * read_s
        self.ms["process"] -= 1000 * read_s

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start


@dataclass(frozen=True)
class TaskMetrics:
    """The task's part of its manifest's ``metrics`` (what readers of the state depend
    on, key types and event time, goes in typed manifest fields instead:
    :class:`~statebackend.checkpoint.publish.ManifestFacts`).

    Attributes
    ----------
    restore : mapping
        How the restore went (its metrics as a dict).
    rows, keys : int
        Input rows processed, and distinct keys (0 for ``map_in_pandas``).
    processing_time_ms : int
        Spark's batch timestamp.
    rocksdb : mapping
        RocksDB's properties before the checkpoint flushes.
    task_ms : mapping
        Where the task's time went before the checkpoint (``input`` counts every wait for
        Spark's rows, ``process`` the function's time without them).
    late_rows_dropped : int or None
        With a watermark: the late rows this batch dropped.
    restore_requests : mapping or None
        The store requests of the restore and the watermark's reads.
    executor : str or None
        Spark's id of the executor that ran the task (``driver`` in local mode): with
        ``restore``, which executor found or missed the state (benchmarks.cluster_recovery
        tells a lost executor's partitions from the rest by it).
    """

    restore: Mapping[str, Any]
    rows: int
    keys: int
    processing_time_ms: int
    rocksdb: Mapping[str, Any]
    task_ms: Mapping[str, float]
    late_rows_dropped: int | None = None
    restore_requests: Mapping[str, int] | None = None
    executor: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON form (optional entries only when set)."""
        d: dict[str, Any] = {
            "restore": self.restore, "rows": self.rows, "keys": self.keys,
            "processing_time_ms": self.processing_time_ms,
            "rocksdb": self.rocksdb, "task_ms": dict(self.task_ms)}
        if self.late_rows_dropped is not None:
            d["late_rows_dropped"] = self.late_rows_dropped
        if self.restore_requests is not None:
            d["restore_requests"] = self.restore_requests
        if self.executor is not None:
            d["executor"] = self.executor
        return d


def as_dict(obj: Any) -> dict:
    """Restore metrics of any kind (a dataclass, a dict, None) as a dict."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    return {"value": str(obj)}
