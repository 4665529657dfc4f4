"""Checkpoint metrics on durable storage: written beside the checkpoints after each one
completed, read back by ``statebackend metrics`` and :meth:`checkpoint_metrics`, and
logged as one line per batch. What they measure: :mod:`statebackend.metrics`.

Durable layout (beside the checkpoints, under the operator root)::

    _metrics/chk-<n>.jsonl   line 1: the checkpoint totals; then one line per partition

One immutable file per checkpoint (object stores cannot append). These files are written
after the checkpoint completed and are not referenced by any record, so retention never
depends on them; :func:`read_metrics` reads them back in checkpoint order. The newest
:data:`METRICS_KEPT` are kept: every :data:`METRICS_DELETE_EVERY` checkpoints, one bulk
delete removes the ones that fell out of that window, so nothing grows with the number of
checkpoints ever taken.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from .metrics import (
    CheckpointStats,
    PartitionStats,
    aggregate,
    combine_progress,
    partition_progress,
)
from .storage.accounting import RequestCounts
from .storage.records import METRICS_DIR

if TYPE_CHECKING:
    from .model.manifest import CompletedCheckpoint, PartitionManifest
    from .storage.base import DurableStore

__all__ = [
    "METRICS_DIR",
    "checkpoint_stats",
    "format_line",
    "metrics_path",
    "read_metrics",
    "record_checkpoint",
    "write_metrics",
]

log = logging.getLogger("statebackend.metrics")

#: Metrics files kept (checkpoints); older ones are deleted in batches.
METRICS_KEPT = 1000
#: One bulk delete of old metrics files per this many checkpoints.
METRICS_DELETE_EVERY = 100
_NAME = re.compile(r"^chk-(\d+)\.jsonl$")


def metrics_path(checkpoint_id: int) -> str:
    """Path of a checkpoint's metrics file, relative to the operator root."""
    return f"{METRICS_DIR}/chk-{checkpoint_id}.jsonl"


def checkpoint_stats(store: DurableStore, operator_id: str, checkpoint_id: int
                     ) -> CheckpointStats:
    """Read a completed checkpoint's record and manifests and aggregate them.

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root (the operator lives under ``operator_id/``).
    operator_id : str
        The operator's directory name.
    checkpoint_id : int
        A completed (and still retained) checkpoint.

    Raises
    ------
    CheckpointNotFoundError
        The checkpoint has no completed record, or a manifest it names is gone.
    """
    from .storage.manifests import operator_store, read_recorded_manifests
    from .storage.records import require_completed_record

    ostore = operator_store(store, operator_id)
    record = require_completed_record(store, operator_id, checkpoint_id)
    return aggregate(record, list(read_recorded_manifests(ostore, record).values()))


def format_line(s: CheckpointStats) -> str:
    """The one log line of a completed checkpoint."""
    def ms(v: float | None) -> str:
        return "?" if v is None else f"{v:.0f}ms"

    rocks = s.rocksdb
    extra = ""
    if rocks:
        extra = (f" keys~{rocks.get('estimated_keys', 0)} sst={_size(rocks.get('live_sst_bytes', 0))}"
                 f" memtable={_size(rocks.get('memtable_bytes', 0))}")
    sources = ",".join(f"{k}:{v}" for k, v in s.restore_sources.items())
    return (f"{s.operator_id} checkpoint {s.checkpoint_id}: {s.rows} rows, {s.keys} keys, "
            f"e2e={ms(s.end_to_end_ms)} sync={ms(s.sync_ms)} async={ms(s.async_ms)} "
            f"start_delay={ms(s.start_delay_ms)} uploaded={_size(s.bytes_uploaded)} "
            f"({s.files_uploaded} files) reused={_size(s.bytes_reused)} ({s.files_reused} "
            f"files) full={_size(s.full_size)} restore={sources} in {ms(s.restore_ms)}{extra}")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def write_metrics(store: DurableStore, s: CheckpointStats) -> str:
    """Publish ``s`` as ``_metrics/chk-<n>.jsonl`` under the operator root; returns the path.

    Line 1 is the checkpoint (without partitions), then one line per partition.
    """
    from .storage.manifests import operator_store

    # progress is derived from the partition lines: read_metrics computes it again
    head = s.to_dict(partitions=False)
    head.pop("progress", None)
    lines = [json.dumps({"kind": "checkpoint", **head}, sort_keys=True)]
    for p in s.partitions:
        lines.append(json.dumps({"kind": "partition", "operator_id": s.operator_id,
                                 "checkpoint_id": s.checkpoint_id, **asdict(p)},
                                sort_keys=True))
    rel = metrics_path(s.checkpoint_id)
    ostore = operator_store(store, s.operator_id)
    ostore.put_bytes_atomic(rel, ("\n".join(lines) + "\n").encode())
    return rel


def record_checkpoint(store: DurableStore, record: CompletedCheckpoint,
                      manifests: Iterable[PartitionManifest] | None = None,
                      completion_requests: RequestCounts | None = None
                      ) -> CheckpointStats | None:
    """Aggregate, write and log the metrics of a just-completed checkpoint.

    ``manifests``: its chosen manifests when the caller holds them (the coordinator just
    read them), so they are not read again; ``completion_requests``: the driver's requests
    to complete it. Never raises: metrics must not fail a completion that already happened.
    """
    try:
        if manifests is None:
            s = checkpoint_stats(store, record.operator_id, record.checkpoint_id)
            if completion_requests is not None:
                s = replace(s, requests={**s.requests,
                                         "completion": completion_requests.to_dict()})
        else:
            s = aggregate(record, manifests, completion_requests)
        write_metrics(store, s)
        _forget_old_metrics(store, record.operator_id, record.checkpoint_id)
    except Exception:  # noqa: BLE001 - metrics are best effort by design
        log.warning("metrics of checkpoint %d of %s could not be recorded",
                    record.checkpoint_id, record.operator_id, exc_info=True)
        return None
    log.info("%s", format_line(s))
    return s


def _forget_old_metrics(store: DurableStore, operator_id: str, checkpoint_id: int) -> None:
    n = checkpoint_id
    if n % METRICS_DELETE_EVERY or n < METRICS_KEPT:
        return
    from .storage.manifests import operator_store

    old = range(max(0, n - METRICS_KEPT - METRICS_DELETE_EVERY), n - METRICS_KEPT + 1)
    operator_store(store, operator_id).delete([metrics_path(k) for k in old])


def read_metrics(store: DurableStore, operator_id: str, *, partitions: bool = False
                 ) -> list[dict[str, Any]]:
    """Every recorded metrics line of an operator, in checkpoint order.

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator's directory name.
    partitions : bool
        Also return the per-partition lines (``kind == "partition"``).

    Returns
    -------
    list of dict
        Parsed JSON lines; a malformed file is skipped with a warning.
    """
    from .storage.manifests import operator_store

    ostore = operator_store(store, operator_id)
    found = []
    for rel in ostore.list_dir(METRICS_DIR):
        m = _NAME.match(rel.rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), rel))
    out: list[dict[str, Any]] = []
    for _n, rel in sorted(found):
        try:
            lines = [json.loads(x) for x in ostore.get_bytes(rel).decode().splitlines() if x]
        except (FileNotFoundError, ValueError) as exc:
            log.warning("skipping unreadable metrics file %s: %s", rel, exc)
            continue
        _add_progress(lines)
        out.extend(x for x in lines if partitions or x.get("kind") == "checkpoint")
    return out


def _add_progress(lines: list[dict[str, Any]]) -> None:
    # the checkpoint line's "progress": the fold of its partition lines (not stored twice)
    names = PartitionStats.__dataclass_fields__
    try:
        parts = [PartitionStats(**{k: v for k, v in x.items() if k in names})
                 for x in lines if x.get("kind") == "partition"]
    except TypeError:  # a line of an older version without some field: no progress
        return
    progress = combine_progress(partition_progress(p) for p in parts)
    for x in lines:
        if x.get("kind") == "checkpoint":
            x["progress"] = progress
