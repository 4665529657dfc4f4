"""Checkpoints: pure manifest models and the lifecycle of one partition's checkpoint."""

from __future__ import annotations

from typing import Any

from .manifest import (
    CompletedCheckpoint,
    FileEntry,
    PartitionManifest,
    StateDescriptor,
    choose_manifest,
)
from .metrics import CheckpointMetrics, RestoreMetrics, RestoreSource

__all__ = [
    "CheckpointMetrics",
    "CompletedCheckpoint",
    "FileEntry",
    "LocalSnapshot",
    "PartitionCheckpointer",
    "PartitionManifest",
    "RestoreMetrics",
    "RestoreSource",
    "StateDescriptor",
    "choose_manifest",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: the checkpointer depends on storage and recovery, which themselves
    # import the pure manifest model from this package.
    if name == "PartitionCheckpointer":
        from .checkpointer import PartitionCheckpointer

        return PartitionCheckpointer
    if name == "LocalSnapshot":
        from .snapshot import LocalSnapshot

        return LocalSnapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
