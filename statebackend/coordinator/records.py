"""Reading an operator's completed-checkpoint records, and the coordinator's result types.

Functions here serve the coordinator and the readers of a checkpoint (restoring tasks,
savepoints, ``read_state``, the CLI): they list and read records and the
``_checkpoints/LATEST.json`` pointer, and write nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .. import keygroups
from ..checkpoint.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    MANIFEST_NAME,
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
    completed_record_path,
    parse_latest_pointer,
)
from ..errors import CheckpointNotFoundError, CorruptStateError, UnsafePathError
from ..storage.base import DurableStore

PINS_DIR = "_pins"
GC_DIR = "_gc"
WATERMARK_PATH = f"{GC_DIR}/swept.json"

_RECORD_NAME = re.compile(r"^chk-(\d+)\.json$")
_PIN_NAME = re.compile(r"^chk-(\d+)$")


def key_group_range(partition: int, parallelism: int, max_parallelism: int) -> tuple[int, int]:
    """Inclusive key-group range ``(start, end)`` owned by ``partition`` of ``parallelism``
    (:func:`statebackend.keygroups.key_group_range` as the tuple manifests record)."""
    r = keygroups.key_group_range(partition, parallelism, max_parallelism)
    return r.start, r.end


def _records_in(names: Iterable[str]) -> dict[int, str]:
    out = {}
    for rel in names:
        m = _RECORD_NAME.match(rel.rsplit("/", 1)[-1])
        if m and rel == completed_record_path(int(m.group(1))):
            out[int(m.group(1))] = rel
    return out


def _manifests_by_partition(listing: Iterable[str]) -> dict[int, list[str]]:
    """Manifest paths (``chk-<n>/p<p>/<attempt>/_MANIFEST.json``) of a listing, by partition."""
    out: dict[int, list[str]] = {}
    for rel in listing:
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_NAME and parts[1][:1] == "p" \
                and parts[1][1:].isdigit():
            out.setdefault(int(parts[1][1:]), []).append(rel)
    return out


def _parse_or_error(raw: bytes | PartitionManifest | Exception | None, where: str
                    ) -> PartitionManifest | Exception | None:
    """A manifest parsed from ``raw`` (passed through when already parsed or missing), or
    the error that parsing raised (handed to the caller's thread)."""
    if raw is None or isinstance(raw, (PartitionManifest, Exception)):
        return raw
    try:
        return PartitionManifest.from_json(raw, where=where)
    except (CorruptStateError, UnsafePathError) as exc:
        return exc


def listed_records(store: DurableStore, operator_id: str) -> dict[int, str]:
    """Checkpoint id -> path (relative to the operator) of every completed-checkpoint
    record of an operator, from one listing of its ``_checkpoints/`` directory (the
    retained records plus at most a few being discarded)."""
    prefix = f"{check_component(operator_id)}/"
    return _records_in(p[len(prefix):] for p in store.list_dir(prefix + CHECKPOINTS_DIR))


def completed_ids(ostore: DurableStore) -> list[int]:
    """Sorted ids of the completed-checkpoint records under an operator's own store (one
    listing of its ``_checkpoints/``)."""
    return sorted(_records_in(ostore.list_dir(CHECKPOINTS_DIR)))


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
    newest = read_latest_pointer(store, prefix)
    if newest is not None and newest > max(listed, default=-1):
        # a coordinator may have written that record and the pointer after our listing
        listed = listed_records(store, operator_id)
        if newest not in listed:
            raise missing_latest(newest, f"{store.root}/{operator_id}")
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


def missing_latest(checkpoint_id: int, where: str) -> CorruptStateError:
    rel = completed_record_path(checkpoint_id)
    return CorruptStateError(
        f"{rel}: the record of checkpoint {checkpoint_id}, the newest completed one "
        f"({LATEST_PATH} says so), is missing under {where}; older records would serve an "
        f"older state. Restore the record from a backup, or let the query's next start "
        f"rebuild it from the checkpoint's manifests", checkpoint_id=checkpoint_id, path=rel)


def require_completed_record(store: DurableStore, operator_id: str,
                             checkpoint_id: int | None = None) -> CompletedCheckpoint:
    """The record of completed checkpoint ``checkpoint_id`` (default: the latest) of an
    operator, for the readers of a checkpoint (savepoints, read_state, metrics).

    Raises
    ------
    CheckpointNotFoundError
        The operator has no completed checkpoint, or none with that id is retained.
    """
    from ..storage.manifests import operator_store, read_completed_record

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


@dataclass(frozen=True)
class CheckpointInfo:
    """One restore point, as :meth:`CheckpointCoordinator.list_completed` shows it."""

    checkpoint_id: int
    parallelism: int
    full_size: int
    incremental_size: int
    created_at_ms: int
    pinned: bool


@dataclass(frozen=True)
class RestorePoint:
    """A retained checkpoint and its chosen manifests, ready for restore tasks."""

    record: CompletedCheckpoint
    manifests: Mapping[int, PartitionManifest]


@dataclass
class GcReport:
    """What one :meth:`CheckpointCoordinator.collect_garbage` run did."""

    deleted: list[str] = field(default_factory=list)
    forgotten: list[int] = field(default_factory=list)
    swept: list[int] = field(default_factory=list)
    watermark: int | None = None
