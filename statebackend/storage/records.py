"""Reading an operator's completed-checkpoint records: listing them, the newest one (checked
against ``_checkpoints/LATEST.json``) and a required one. The coordinator writes them; tasks,
savepoints, read_state and metrics read them through here."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import CheckpointNotFoundError, CorruptStateError
from ..model.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    CompletedCheckpoint,
    check_component,
    completed_record_path,
    parse_latest_pointer,
)
from ..redact import redact_text
from .base import DurableStore
from .manifests import operator_store, read_completed_record

__all__ = [
    "completed_ids",
    "listed_records",
    "METRICS_DIR",
    "missing_latest",
    "newest_completed",
    "newest_metrics",
    "read_latest_pointer",
    "read_latest_record",
    "records_in",
    "require_completed_record",
]

_RECORD_NAME = re.compile(r"^chk-(\d+)\.json$")
# One file per completed checkpoint, written after its record (statebackend.metrics_store):
# evidence that a checkpoint completed when its record is gone.
METRICS_DIR = "_metrics"
_METRICS_NAME = re.compile(r"^chk-(\d+)\.jsonl$")


def records_in(names: Iterable[str]) -> dict[int, str]:
    out = {}
    for rel in names:
        m = _RECORD_NAME.match(rel.rsplit("/", 1)[-1])
        if m and rel == completed_record_path(int(m.group(1))):
            out[int(m.group(1))] = rel
    return out


def listed_records(store: DurableStore, operator_id: str) -> dict[int, str]:
    """Checkpoint id -> path (relative to the operator) of every completed-checkpoint
    record of an operator, from one listing of its ``_checkpoints/`` directory (the
    retained records plus at most a few being discarded)."""
    prefix = f"{check_component(operator_id)}/"
    return records_in(p[len(prefix):] for p in store.list_dir(prefix + CHECKPOINTS_DIR))


def completed_ids(ostore: DurableStore) -> list[int]:
    """Sorted ids of the completed-checkpoint records under an operator's own store (one
    listing of its ``_checkpoints/``)."""
    return sorted(records_in(ostore.list_dir(CHECKPOINTS_DIR)))


def read_latest_record(store: DurableStore, operator_id: str) -> CompletedCheckpoint | None:
    """The newest completed-checkpoint record of an operator, or None (for restoring tasks).

    Raises
    ------
    CorruptStateError
        ``_checkpoints/LATEST.json`` names a newer checkpoint whose record is missing (a
        reader would otherwise silently serve the one before it).
    """
    prefix = f"{check_component(operator_id)}/"
    listed = listed_records(store, operator_id)
    newest, evidence = newest_completed(store, prefix)
    if newest is not None and newest > max(listed, default=-1):
        # a coordinator may have written that record and the pointer after our listing
        listed = listed_records(store, operator_id)
        if newest not in listed:
            raise missing_latest(newest, f"{store.root}/{operator_id}", evidence=evidence)
    for _n, rel in sorted(listed.items(), reverse=True):
        try:
            return CompletedCheckpoint.from_json(store.get_bytes(prefix + rel), where=rel)
        except FileNotFoundError:
            continue  # discarded between the listing and the read; an older one is newer now
    return None


def read_latest_pointer(store: DurableStore, prefix: str) -> int | None:
    """The newest completed checkpoint id as ``_checkpoints/LATEST.json`` says (None:
    none written yet)."""
    try:
        return parse_latest_pointer(store.get_bytes(prefix + LATEST_PATH))
    except FileNotFoundError:
        return None


def newest_metrics(store: DurableStore, prefix: str) -> int | None:
    """The newest checkpoint with a metrics file (one listing of ``_metrics/``)."""
    ids = [int(m.group(1)) for p in store.list_dir(prefix + METRICS_DIR)
           for m in [_METRICS_NAME.match(p.rsplit("/", 1)[-1])] if m]
    return max(ids, default=None)


def newest_completed(store: DurableStore, prefix: str) -> tuple[int | None, str]:
    """The newest checkpoint known to have completed, by ``LATEST.json`` or by the metrics
    file written after each record, and which of them says so (a record deleted together
    with the pointer rewritten to match is still found by its metrics)."""
    pointer = read_latest_pointer(store, prefix)
    metrics = newest_metrics(store, prefix)
    if metrics is not None and (pointer is None or metrics >= pointer):  # the stronger
        return metrics, f"its metrics {METRICS_DIR}/chk-{metrics}.jsonl were written"
    return pointer, f"{LATEST_PATH} says so"


def missing_latest(checkpoint_id: int, where: str, *, published: bool | None = None,
                   evidence: str = f"{LATEST_PATH} says so") -> CorruptStateError:
    """The error of a newest record gone (``published``: whether the checkpoint's files
    were found, None: not looked)."""
    rel = completed_record_path(checkpoint_id)
    if published is False:
        how = (f"Nothing of checkpoint {checkpoint_id} is left to complete it from. Restore "
               f"the record from a backup, or, to go on from the newest record left and "
               f"lose the state after it, delete {LATEST_PATH} and the {METRICS_DIR}/ "
               f"files of later checkpoints")
    elif published:
        how = (f"Its published manifests are incomplete or damaged. Restore the record (or "
               f"the checkpoint's files) from a backup, or, to go on from the newest record "
               f"left and lose the state after it, delete {LATEST_PATH} and the "
               f"{METRICS_DIR}/ files of later checkpoints")
    else:
        how = (f"Restore the record from a backup; the query's next start completes it "
               f"again from the checkpoint's manifests when they are all there. To go on "
               f"from the newest record left and lose the state after it, delete "
               f"{LATEST_PATH} and the {METRICS_DIR}/ files of later checkpoints")
    return CorruptStateError(
        f"{rel}: the record of checkpoint {checkpoint_id}, the newest completed one "
        f"({evidence}), is missing under {redact_text(where)}; older records "
        f"would serve an older state (a rollback). {how}", checkpoint_id=checkpoint_id,
        path=rel)


def require_completed_record(store: DurableStore, operator_id: str,
                             checkpoint_id: int | None = None) -> CompletedCheckpoint:
    """The record of completed checkpoint ``checkpoint_id`` (default: the latest) of an
    operator, for the readers of a checkpoint (savepoints, read_state, metrics).

    Raises
    ------
    CheckpointNotFoundError
        The operator has no completed checkpoint, or none with that id is retained.
    """
    if checkpoint_id is None:
        record = read_latest_record(store, operator_id)
        if record is None:
            raise CheckpointNotFoundError(f"operator {operator_id!r} has no completed "
                                          f"checkpoint under {store.root}")
        return record
    record = read_completed_record(operator_store(store, operator_id), checkpoint_id)
    if record is None:
        raise CheckpointNotFoundError(
            f"checkpoint {checkpoint_id} of operator {operator_id!r} is not a retained "
            f"completed checkpoint (no {completed_record_path(checkpoint_id)} under "
            f"{store.root}/{operator_id})")
    return record
