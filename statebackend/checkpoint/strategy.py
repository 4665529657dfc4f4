"""One strategy per checkpoint mode, behind one interface.

A checkpoint has a synchronous part, run while nothing may write the instance (flush and
native checkpoint, or closing the batch's changelog), and an asynchronous part, an
operation object that uploads what is new and publishes the manifest through the one
publish path (:func:`~.publish.publish_checkpoint`). The modes:

* :class:`~.incremental.IncrementalStrategy`: a native checkpoint every batch, uploading
  the SST files its base does not already hold;
* :class:`~.changelog_mode.ChangelogStrategy`: the batch's changelog every batch, and a
  materialization (a native checkpoint uploaded in the background) every few.

:class:`~.checkpointer.PartitionCheckpointer` picks one by :func:`mode_for` (the option
``checkpoint_mode``; under ``auto``, the size of the state restored) and runs
``strategy.sync_part(...)`` then ``operation.run()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..local.disk import LocalRecovery
from ..model.manifest import PartitionManifest, StateDescriptor
from ..options import StateBackendOptions
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore
from .publish import ManifestFacts
from .slices import rolling_on
from .snapshot import LocalSnapshot
from .task_metrics import CheckpointMetrics


class CheckpointTarget(Protocol):
    """What a strategy needs of the partition it checkpoints."""

    store: DurableStore  # rooted at the operator root
    local: LocalRecovery
    options: StateBackendOptions
    operator_id: str
    partition: int
    writer_epoch: int | None

    def snapshot_sync(self, instance: RocksDBInstance, checkpoint_id: int,
                      attempt: str) -> LocalSnapshot: ...


@dataclass(frozen=True)
class CheckpointRequest:
    """One checkpoint to take, its base already checked against the restore.

    Attributes
    ----------
    checkpoint_id : int
        Batch / checkpoint number.
    attempt : str
        A name unique to the task attempt.
    key_group_range : tuple of int
        ``(first, last)`` key groups owned.
    states : tuple of StateDescriptor
        Declared states, recorded in the manifest.
    base : PartitionManifest or None
        The checkpoint the state was restored from (None: empty state).
    extra_metrics : mapping
        The caller's metrics, recorded in the manifest.
    facts : ManifestFacts or None
        The caller's typed manifest fields.
    """

    checkpoint_id: int
    attempt: str
    key_group_range: tuple[int, int]
    states: tuple[StateDescriptor, ...]
    base: PartitionManifest | None
    extra_metrics: Mapping[str, Any]
    facts: ManifestFacts | None = None

    @classmethod
    def of(cls, checkpoint_id: int, attempt: str, key_group_range: tuple[int, int],
           states: Sequence[StateDescriptor], base: PartitionManifest | None,
           extra_metrics: Mapping[str, Any] | None,
           facts: ManifestFacts | None = None) -> CheckpointRequest:
        return cls(checkpoint_id, attempt, key_group_range, tuple(states), base,
                   extra_metrics or {}, facts)


class CheckpointOperation(ABC):
    """The asynchronous part of one checkpoint: upload, publish, keep local copies."""

    @abstractmethod
    def run(self) -> tuple[PartitionManifest, CheckpointMetrics]:
        """Make the checkpoint durable and publish its manifest.

        On failure nothing is published and the operation's local files are removed.
        """


class CheckpointStrategy(ABC):
    """How one checkpoint mode checkpoints a partition (see the module docstring)."""

    def __init__(self, target: CheckpointTarget) -> None:
        self.target = target

    @abstractmethod
    def restored(self, instance: RocksDBInstance) -> None:
        """``instance`` now holds the restored state and the batch is about to write it."""

    @abstractmethod
    def sync_part(self, instance: RocksDBInstance,
                  request: CheckpointRequest) -> CheckpointOperation:
        """The synchronous part; returns the asynchronous operation to run next.

        On failure nothing is left behind.
        """


def mode_for(options: StateBackendOptions, restored: PartitionManifest | None) -> str:
    """The checkpoint mode of a batch whose state was restored from ``restored``.

    ``checkpoint_mode="auto"``: ``changelog`` when ``restored`` references at least
    ``auto_changelog_size`` bytes, or half of that when it is a changelog checkpoint
    itself (a state near the line does not switch at every batch); ``incremental``
    otherwise and for empty state (``changelog`` with rolling slices, :meth:`~statebackend.options.StateBackendOptions.rolling`). A changelog checkpoint with a materialization still
    pending stays in changelog mode whatever its size: an incremental checkpoint would not
    carry the pending name that keeps the materialization's files (maybe still uploading
    in the background) from the coordinator's sweeps. Only the committed manifest decides,
    so every attempt of a batch, on any executor, checkpoints in the same mode.
    """
    if options.checkpoint_mode != "auto":
        return options.checkpoint_mode
    if not options.incremental:
        return "incremental"  # a full snapshot every batch, as asked
    if restored is None:
        # rolling slices: the first batch writes its state as slices, so a large load is
        # never held twice (as an incremental base and as the slices rotating it out);
        # with the count derived (rolling_slices=None) only a load of at least
        # auto_changelog_size does, the others checkpoint incrementally
        # (ChangelogStrategy.sync_part decides from what the batch wrote)
        return "changelog" if rolling_on(options) else "incremental"
    line = options.auto_changelog_size
    if restored.mode == "changelog":
        if restored.pending_materialization is not None:
            return "changelog"
        line //= 2
    return "changelog" if restored.full_size >= line else "incremental"
