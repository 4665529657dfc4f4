"""The coordinator's paths, listing helpers and result types.

Reading completed-checkpoint records and the ``_checkpoints/LATEST.json`` pointer, for the
coordinator and every other reader alike, is :mod:`statebackend.storage.records`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import CorruptStateError, UnsafePathError
from ..keys import ranges as keyranges
from ..model.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
)

PINS_DIR = "_pins"
GC_DIR = "_gc"
WATERMARK_PATH = f"{GC_DIR}/swept.json"

_PIN_NAME = re.compile(r"^chk-(\d+)$")


def key_group_range(partition: int, parallelism: int, max_parallelism: int) -> tuple[int, int]:
    """Inclusive key-group range ``(start, end)`` owned by ``partition`` of ``parallelism``
    (:func:`statebackend.keys.ranges.key_group_range` as the tuple manifests record)."""
    r = keyranges.key_group_range(partition, parallelism, max_parallelism)
    return r.start, r.end


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
