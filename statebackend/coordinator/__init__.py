"""Driver side: checkpoint completion, the shared-state registry, retention and deletion."""

from __future__ import annotations

from .coordinator import (
    CheckpointCoordinator,
    CheckpointInfo,
    GcReport,
    RestorePoint,
    key_group_range,
)
from .registry import RegisteredCheckpoint, Retention, SharedStateRegistry, referenced_paths

__all__ = [
    "CheckpointCoordinator",
    "CheckpointInfo",
    "GcReport",
    "RegisteredCheckpoint",
    "RestorePoint",
    "Retention",
    "SharedStateRegistry",
    "key_group_range",
    "referenced_paths",
]
