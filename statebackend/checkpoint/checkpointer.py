"""Checkpoint and restore of one (operator, partition): the API the Spark layer calls.

A task for batch ``b`` of partition ``p`` does::

    cp = PartitionCheckpointer(store, operator_id, p, options, local_root)
    instance, rmetrics = cp.restore(manifest_of_b_minus_1)   # None: empty state
    ...  # process rows
    manifest, cmetrics = cp.checkpoint(instance, b, attempt, key_group_range, states)
    instance.close()

Restores go through the tiers of :class:`~.restorer.PartitionRestorer` (working
directory, local copy, durable storage); checkpoints through the strategy of the
checkpoint mode (:mod:`.strategy`: :class:`~.incremental.IncrementalStrategy` or
:class:`~.changelog_mode.ChangelogStrategy`), which share one publish path
(:mod:`.publish`). This class holds what both sides share: the partition's local
directories, and the manifest restored, the only base a checkpoint may reuse files of.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CheckpointError
from ..local.disk import WORK_DIR, LocalRecovery
from ..model.carry import origin_path
from ..model.manifest import PartitionManifest, StateDescriptor, check_component
from ..options import StateBackendOptions
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore
from ..storage.manifests import operator_store
from ..storage.priority import critical_path
from .changelog_mode import ChangelogStrategy, start_recording, stop_recording
from .incremental import IncrementalStrategy, SnapshotUpload
from .publish import ManifestFacts
from .restore import validate_manifest
from .restorer import PartitionRestorer
from .snapshot import LocalSnapshot, take_snapshot
from .strategy import CheckpointRequest, CheckpointStrategy, mode_for
from .task_metrics import CheckpointMetrics, RestoreMetrics, RestoreSource

log = logging.getLogger(__name__)

InstanceFactory = Callable[[str], RocksDBInstance]


class PartitionCheckpointer:
    """Checkpoints and restores of one partition of one operator.

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root; the operator's files live under ``<root>/<operator_id>``.
    operator_id : str
        Operator directory name (letters, digits, ``._=-``).
    partition : int
        Partition index.
    options : StateBackendOptions, optional
        Reads ``incremental``, ``local_recovery``, ``num_local_retained``,
        ``max_parallelism`` and ``download_threads``.
    local_root : str, optional
        Local directory for working directories and secondary copies (defaults to
        ``options.local_dir``, with ``{executor_id}`` resolved as ``driver``).
    open_instance : callable, optional
        ``path -> RocksDBInstance``; lets the caller pass its RocksDB options.
    working_dir_name : str, optional
        Name of the working directory under the partition directory (default ``work``);
        instances kept open between tasks each get a name of their own.
    writer_epoch : int, optional
        The writer epoch of the task (:mod:`statebackend.checkpoint.fencing`): every
        manifest carries it, and is published only while it still owns the location.
    """

    def __init__(self, store: DurableStore, operator_id: str, partition: int,
                 options: StateBackendOptions | None = None, local_root: str | None = None,
                 *, open_instance: InstanceFactory | None = None,
                 working_dir_name: str = WORK_DIR, writer_epoch: int | None = None) -> None:
        self.options = options or StateBackendOptions()
        root = local_root or (self.options.local_dir
                              and self.options.resolved_local_dir(executor_id="driver"))
        if not root:
            raise ValueError("PartitionCheckpointer needs a local_root (or options.local_dir)")
        self.operator_id = check_component(operator_id)
        self.partition = partition
        self.store = operator_store(store, operator_id)
        self.local = LocalRecovery(root, operator_id, partition,
                                   num_retained=self.options.num_local_retained,
                                   working_dir_name=working_dir_name)
        self._open = open_instance or RocksDBInstance
        self.writer_epoch = writer_epoch
        self.restored_from: PartitionManifest | None = None
        self._restored = False
        self.restorer = PartitionRestorer(self.store, self.operator_id, partition, self.local,
                                          self.options, self._open)
        self.strategy: CheckpointStrategy = self._strategy(None)

    @property
    def working_dir(self) -> str:
        return self.local.working_dir

    # --- restore ----------------------------------------------------------------------

    def restore(self, manifest: PartitionManifest | None, reasons: list[str] | None = None
                ) -> tuple[RocksDBInstance, RestoreMetrics]:
        """Open the working instance holding exactly the state of ``manifest``.

        Parameters
        ----------
        manifest : PartitionManifest or None
            The checkpoint to restore (for batch ``b``, the one chosen for ``b-1``);
            None starts from empty state.
        reasons : list of str, optional
            Why a faster source was already passed over (a kept-open instance that was
            not handed over); reported with the restore's own fallback reasons.

        Returns
        -------
        tuple of (RocksDBInstance, RestoreMetrics)

        Raises
        ------
        CorruptStateError
            A durable file is missing or corrupt, or the downloaded state does not open.
        UnsafePathError
            The manifest names a path outside the checkpoint root.
        """
        self._restored = True
        self.restored_from = manifest
        inst, metrics = self.restorer.restore(manifest, list(reasons or ()))
        self.strategy = self._strategy(manifest)
        self.strategy.restored(inst)
        return inst, metrics

    def resume(self, manifest: PartitionManifest, instance: RocksDBInstance,
               duration_s: float = 0.0) -> RestoreMetrics:
        """Continue from ``instance``, kept open since it produced ``manifest``.

        The caller vouches that the instance holds exactly the state of ``manifest`` (it
        took that checkpoint and nothing was written since: see
        :class:`statebackend.recovery.resident.ResidentInstances`); the next checkpoint
        reuses the files of ``manifest`` as it would after :meth:`restore`.
        """
        validate_manifest(manifest, self.operator_id)
        if os.path.dirname(instance.path) != self.local.partition_dir:
            raise CheckpointError(f"instance at {instance.path} is not a working directory "
                                  f"of partition {self.partition} ({self.local.partition_dir})")
        self._restored = True
        self.restored_from = manifest
        self.local.use_working_dir(os.path.basename(instance.path))
        # the next checkpoint writes to it: it is no longer "exactly the manifest"
        self.local.clear_clean_marker()
        self.strategy = self._strategy(manifest)
        self.strategy.restored(instance)
        return RestoreMetrics(checkpoint_id=manifest.checkpoint_id, partition=self.partition,
                              source=RestoreSource.RESIDENT, duration_s=duration_s)

    # --- checkpoint -------------------------------------------------------------------

    def snapshot_sync(self, instance: RocksDBInstance, checkpoint_id: int,
                      attempt: str) -> LocalSnapshot:
        """Flush and take a native checkpoint into this attempt's local copy directory.

        Parameters
        ----------
        instance : RocksDBInstance
            The open working instance.
        checkpoint_id : int
            Batch / checkpoint number.
        attempt : str
            A name unique to this task attempt (letters, digits, ``._=-``).
        """
        check_component(attempt)
        try:
            directory = self.local.copy_dir(checkpoint_id, attempt)
            return take_snapshot(instance, directory, operator_id=self.operator_id,
                                 partition=self.partition, checkpoint_id=checkpoint_id,
                                 attempt=attempt)
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain exceptions
            raise CheckpointError(f"checkpoint {checkpoint_id} partition {self.partition}: "
                                  f"native checkpoint failed ({exc})") from exc

    def upload_async(self, snapshot: LocalSnapshot,
                     base_manifest: PartitionManifest | None = None,
                     key_group_range: tuple[int, int] | None = None,
                     states: Sequence[StateDescriptor] = ()) -> PartitionManifest:
        """Upload ``snapshot`` and publish its manifest; see :meth:`checkpoint`.

        ``base_manifest`` defaults to the manifest this checkpointer restored from; passing
        another one than that is refused (invariant 4).
        """
        request = self._request(snapshot.checkpoint_id, snapshot.attempt, key_group_range,
                                states, base_manifest, None)
        with critical_path():
            manifest, _metrics = SnapshotUpload(self, snapshot, request).run()
        return manifest

    def checkpoint(self, instance: RocksDBInstance, checkpoint_id: int, attempt: str,
                   key_group_range: tuple[int, int] | None = None,
                   states: Sequence[StateDescriptor] = (),
                   base_manifest: PartitionManifest | None = None,
                   extra_metrics: Mapping[str, Any] | None = None,
                   facts: ManifestFacts | None = None,
                   ) -> tuple[PartitionManifest, CheckpointMetrics]:
        """Take checkpoint ``checkpoint_id`` of the instance: sync snapshot, then upload.

        Parameters
        ----------
        instance : RocksDBInstance
            The working instance (close it afterwards, before writing again).
        checkpoint_id : int
            Batch / checkpoint number.
        attempt : str
            A name unique to this task attempt.
        key_group_range : tuple of int, optional
            ``(first, last)`` key groups owned; defaults to all of ``max_parallelism``.
        states : sequence of StateDescriptor
            Declared states, recorded in the manifest.
        base_manifest : PartitionManifest, optional
            Defaults to the restored manifest.
        extra_metrics : mapping, optional
            The caller's metrics, recorded in the manifest.
        facts : ManifestFacts, optional
            The caller's typed manifest fields (key types, event time, watermark).

        Returns
        -------
        tuple of (PartitionManifest, CheckpointMetrics)
            The published manifest and what the checkpoint cost.

        Raises
        ------
        StorageError, CheckpointError
            The durable copy failed; nothing was published.
        """
        check_component(attempt)
        request = self._request(checkpoint_id, attempt, key_group_range, states,
                                base_manifest, extra_metrics, facts)
        # the whole checkpoint is on the batch's critical path: background
        # materializations of this process start no upload meanwhile
        with critical_path():
            strategy = self.strategy
            if isinstance(strategy, ChangelogStrategy) and strategy.loads_small(instance,
                                                                                request):
                strategy = IncrementalStrategy(self)
            operation = strategy.sync_part(instance, request)
            return operation.run()

    def _request(self, checkpoint_id: int, attempt: str,
                 key_group_range: tuple[int, int] | None, states: Sequence[StateDescriptor],
                 base: PartitionManifest | None, extra_metrics: Mapping[str, Any] | None,
                 facts: ManifestFacts | None = None) -> CheckpointRequest:
        kgr = key_group_range or (0, self.options.max_parallelism - 1)
        return CheckpointRequest.of(checkpoint_id, attempt, kgr, states,
                                    self._check_base(base), extra_metrics, facts)

    # --- changelog mode ---------------------------------------------------------------

    def start_recording(self, instance: RocksDBInstance) -> None:
        """Record every later write of ``instance`` into a fresh local changelog.

        :meth:`restore` calls it in changelog mode; a caller that keeps an instance open
        after :meth:`checkpoint` calls it before the next batch writes.
        """
        start_recording(self.local, instance)

    def stop_recording(self, instance: RocksDBInstance) -> None:
        """Discard an unfinished recording (its writes are not part of any checkpoint)."""
        stop_recording(instance)

    def _strategy(self, restored: PartitionManifest | None) -> CheckpointStrategy:
        if mode_for(self.options, restored) == "changelog":
            return ChangelogStrategy(self)
        return IncrementalStrategy(self)

    def _check_base(self, base: PartitionManifest | None) -> PartitionManifest | None:
        if not self._restored:
            return base
        if base is None:
            return self.restored_from
        # a carried-over manifest and the checkpoint it carries hold the same files
        # (statebackend.model.carry)
        if self.restored_from is None or (origin_path(base)
                                          != origin_path(self.restored_from)):
            restored = None if self.restored_from is None else self.restored_from.path
            raise CheckpointError(f"base manifest {base.path} is not the one this state was "
                                  f"restored from ({restored}); only files of the restored "
                                  f"checkpoint may be reused")
        return base
