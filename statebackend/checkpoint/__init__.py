"""The lifecycle of one partition's checkpoint: snapshot, incremental or changelog upload,
publication, restore, materialization and writer fencing (the model is in
:mod:`statebackend.model`)."""

from __future__ import annotations

from .checkpointer import PartitionCheckpointer
from .snapshot import LocalSnapshot
from .task_metrics import CheckpointMetrics, RestoreMetrics, RestoreSource

__all__ = [
    "CheckpointMetrics",
    "LocalSnapshot",
    "PartitionCheckpointer",
    "RestoreMetrics",
    "RestoreSource",
]
