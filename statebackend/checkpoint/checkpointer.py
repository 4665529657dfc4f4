"""Checkpoint and restore of one (operator, partition): the API the Spark layer calls.

A task for batch ``b`` of partition ``p`` does::

    cp = PartitionCheckpointer(store, operator_id, p, options, local_root)
    instance, rmetrics = cp.restore(manifest_of_b_minus_1)   # None: empty state
    ...  # process rows
    manifest, cmetrics = cp.checkpoint(instance, b, attempt, key_group_range, states)
    instance.close()

Restore tries, in order: the working directory when it is exactly the requested
checkpoint and attempt and untouched since; the local secondary copy, verified file by file
against the manifest and hard-linked into a fresh working directory; durable storage. A
problem on either local path falls back to durable storage (logged once); a problem in
durable storage raises :class:`CorruptStateError` and leaves no working directory behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CheckpointError, CorruptStateError
from ..options import StateBackendOptions
from ..recovery.local import WORK_DIR, LocalCopyError, LocalRecovery
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore
from ..storage.manifests import operator_store
from .manifest import PartitionManifest, StateDescriptor, check_component
from .metrics import CheckpointMetrics, RestoreMetrics, RestoreSource
from .restore import download_checkpoint, validate_manifest
from .snapshot import LocalSnapshot, take_snapshot
from .uploader import upload_snapshot

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
    """

    def __init__(self, store: DurableStore, operator_id: str, partition: int,
                 options: StateBackendOptions | None = None, local_root: str | None = None,
                 *, open_instance: InstanceFactory | None = None,
                 working_dir_name: str = WORK_DIR) -> None:
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
        self.restored_from: PartitionManifest | None = None
        self._restored = False

    @property
    def working_dir(self) -> str:
        return self.local.working_dir

    # --- restore ----------------------------------------------------------------------

    def restore(self, manifest: PartitionManifest | None
                ) -> tuple[RocksDBInstance, RestoreMetrics]:
        """Open the working instance holding exactly the state of ``manifest``.

        Parameters
        ----------
        manifest : PartitionManifest or None
            The checkpoint to restore (for batch ``b``, the one chosen for ``b-1``);
            None starts from empty state.

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
        t0 = time.perf_counter()
        self._restored = True
        self.restored_from = manifest
        if manifest is None:
            self.local.discard_working_dir()
            inst = self._open(self.local.working_dir)
            return inst, RestoreMetrics(None, self.partition, RestoreSource.EMPTY,
                                        time.perf_counter() - t0)
        validate_manifest(manifest, self.operator_id)
        reasons: list[str] = []

        found = self._from_working_dir(manifest, reasons)
        if found is not None:
            return found, self._metrics(manifest, RestoreSource.WORKING_DIR, t0, reasons)
        if self.options.local_recovery:
            found = self._from_local_copy(manifest, reasons)
            if found is not None:
                return found, self._metrics(manifest, RestoreSource.LOCAL_COPY, t0, reasons)
        if reasons:
            # One line per restore, whatever went wrong locally: it is recoverable noise.
            log.warning("checkpoint %d partition %d: restoring from durable storage (%s)",
                        manifest.checkpoint_id, manifest.partition, "; ".join(reasons))
        inst, nbytes, nfiles = self._from_durable(manifest)
        return inst, self._metrics(manifest, RestoreSource.DURABLE, t0, reasons,
                                   nbytes, nfiles)

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
        return RestoreMetrics(manifest.checkpoint_id, self.partition, RestoreSource.RESIDENT,
                              duration_s)

    def _metrics(self, m: PartitionManifest, source: RestoreSource, t0: float,
                 reasons: list[str], nbytes: int = 0, nfiles: int = 0) -> RestoreMetrics:
        return RestoreMetrics(m.checkpoint_id, self.partition, source,
                              time.perf_counter() - t0, nbytes, nfiles,
                              "; ".join(reasons) or None)

    def _from_working_dir(self, m: PartitionManifest, reasons: list[str]
                          ) -> RocksDBInstance | None:
        if m.partition != self.partition:
            return None
        marker = self.local.working_dir_matches(m.checkpoint_id, m.attempt)
        if marker is None:
            return None
        # Opening for writing ends "clean": remove the marker first, so a crash while
        # open can never make a modified directory look committed.
        self.local.clear_clean_marker()
        try:
            inst = self._open(self.local.working_dir)
        except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
            reasons.append(f"working directory does not open ({exc})")
            return None
        if marker.sequence_number is not None:
            seq = int(inst.db.latest_sequence_number())
            if seq != marker.sequence_number:
                inst.close()
                reasons.append(f"working directory was written after checkpoint "
                               f"{m.checkpoint_id} (sequence {seq} != "
                               f"{marker.sequence_number})")
                return None
        return inst

    def _from_local_copy(self, m: PartitionManifest, reasons: list[str]
                         ) -> RocksDBInstance | None:
        copy_root = LocalRecovery(os.path.dirname(os.path.dirname(self.local.partition_dir)),
                                  self.operator_id, m.partition)
        if not os.path.isdir(copy_root.copy_dir(m.checkpoint_id, m.attempt)):
            return None  # never kept here (other executor): not a problem worth a warning
        try:
            d = copy_root.verify_copy(m, threads=max(2, self.options.download_threads))
            path = self.local.materialize_copy(d, m.files)
        except (LocalCopyError, OSError) as exc:
            reasons.append(f"local copy unusable: {exc}")
            return None
        try:
            return self._open(path)
        except Exception as exc:  # noqa: BLE001 - RocksDB refusing to open: fall back
            reasons.append(f"local copy does not open ({exc})")
            return None

    def _from_durable(self, m: PartitionManifest) -> tuple[RocksDBInstance, int, int]:
        tmp = self.local.fresh_dir()
        try:
            nbytes, nfiles = download_checkpoint(self.store, m, tmp)
            path = self.local.install_working_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            inst = self._open(path)
        except Exception as exc:  # noqa: BLE001 - verified files that do not open: corrupt
            self.local.discard_working_dir()
            raise CorruptStateError(
                f"checkpoint {m.checkpoint_id} partition {m.partition}: files downloaded "
                f"from durable storage passed their checksums but RocksDB refuses to open "
                f"them ({exc})", checkpoint_id=m.checkpoint_id, partition=m.partition,
                path=m.path) from exc
        return inst, nbytes, nfiles

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
        manifest, _metrics = self._upload(snapshot, base_manifest, key_group_range, states)
        return manifest

    def checkpoint(self, instance: RocksDBInstance, checkpoint_id: int, attempt: str,
                   key_group_range: tuple[int, int] | None = None,
                   states: Sequence[StateDescriptor] = (),
                   base_manifest: PartitionManifest | None = None,
                   extra_metrics: Mapping[str, Any] | None = None,
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

        Returns
        -------
        tuple of (PartitionManifest, CheckpointMetrics)
            The published manifest and what the checkpoint cost.

        Raises
        ------
        StorageError, CheckpointError
            The durable copy failed; nothing was published.
        """
        snapshot = self.snapshot_sync(instance, checkpoint_id, attempt)
        return self._upload(snapshot, base_manifest, key_group_range, states, extra_metrics)

    def _upload(self, snapshot: LocalSnapshot, base: PartitionManifest | None,
                key_group_range: tuple[int, int] | None, states: Sequence[StateDescriptor],
                extra_metrics: Mapping[str, Any] | None = None,
                ) -> tuple[PartitionManifest, CheckpointMetrics]:
        base = self._check_base(base)
        kgr = key_group_range or (0, self.options.max_parallelism - 1)
        try:
            manifest, metrics = upload_snapshot(
                self.store, snapshot, base=base, key_group_range=kgr,
                max_parallelism=self.options.max_parallelism, states=states,
                incremental=self.options.incremental, extra_metrics=extra_metrics)
        except BaseException:
            # The snapshot of an unpublished checkpoint is no secondary copy of anything.
            self.local.remove_copy(snapshot.directory)
            raise
        self._keep_local(snapshot)
        return manifest, metrics

    def _check_base(self, base: PartitionManifest | None) -> PartitionManifest | None:
        if not self._restored:
            return base
        if base is None:
            return self.restored_from
        if self.restored_from is None or base.path != self.restored_from.path:
            restored = None if self.restored_from is None else self.restored_from.path
            raise CheckpointError(f"base manifest {base.path} is not the one this state was "
                                  f"restored from ({restored}); only files of the restored "
                                  f"checkpoint may be reused")
        return base

    def _keep_local(self, snapshot: LocalSnapshot) -> None:
        """Secondary copy and clean marker after publication; never fails the checkpoint."""
        try:
            if snapshot.working_dir == self.local.working_dir:
                self.local.write_clean_marker(snapshot.checkpoint_id, snapshot.attempt,
                                              snapshot.sequence_number)
            if self.options.local_recovery and self.options.num_local_retained > 0:
                self.local.retain(keep=[snapshot.directory])
            else:
                self.local.remove_copy(snapshot.directory)
                self.local.retain()
        except Exception:  # noqa: BLE001 - invariant 7: secondary is secondary
            log.warning("checkpoint %d partition %d: keeping the local copy failed",
                        snapshot.checkpoint_id, snapshot.partition, exc_info=True)
