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
from dataclasses import replace
from typing import Any

from ..errors import CheckpointError, CommitFailedError, CorruptStateError, StorageError
from ..options import StateBackendOptions
from ..recovery.local import WORK_DIR, LocalCopyError, LocalRecovery, copy_in_flight
from ..rocksdb.instance import RocksDBInstance
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from ..storage.manifests import operator_store, publish_manifest
from ..storage.priority import critical_path
from .changelog import ChangelogWriter
from .fencing import check_publisher
from .manifest import (
    FileEntry,
    MaterializationRef,
    PartitionManifest,
    StateDescriptor,
    attempt_dir,
    changelog_name,
    check_component,
    check_relative,
)
from .materialize import (
    Lineage,
    materialization_due,
    materialize_in_background,
    materialize_inline,
    try_adopt,
    upload_materialization,
)
from .metrics import CheckpointMetrics, RestoreMetrics, RestoreSource
from .restore import (
    download_checkpoint,
    local_changelog_name,
    replay_changelogs,
    validate_manifest,
)
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
        inst, metrics = self._restore(manifest, list(reasons or ()))
        if self.options.checkpoint_mode == "changelog":
            self.start_recording(inst)
        return inst, metrics

    def _restore(self, manifest: PartitionManifest | None, reasons: list[str]
                 ) -> tuple[RocksDBInstance, RestoreMetrics]:
        t0 = time.perf_counter()
        self._restored = True
        self.restored_from = manifest
        if manifest is None:
            self.local.discard_working_dir()
            inst = self._open(self.local.working_dir)
            return inst, RestoreMetrics(None, self.partition, RestoreSource.EMPTY,
                                        time.perf_counter() - t0)
        validate_manifest(manifest, self.operator_id)

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
        if self.options.checkpoint_mode == "changelog":
            self.start_recording(instance)
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
        ref = m.snapshot_ref
        if ref is None:
            # changelogs only (no materialization yet): local when every changelog is here
            if not all(os.path.exists(os.path.join(copy_root.changelogs_dir,
                                                   local_changelog_name(f)))
                       for f in m.changelog_files):
                return None
        elif not os.path.isdir(copy_root.copy_dir(ref.checkpoint_id, ref.attempt)):
            return None  # never kept here (other executor): not a problem worth a warning
        try:
            if ref is None:
                path = self.local.install_working_dir(self.local.fresh_dir())
            else:
                d = copy_root.verify_copy(m, threads=max(2, self.options.download_threads))
                path = self.local.materialize_copy(d, m.db_files)
        except (LocalCopyError, OSError) as exc:
            reasons.append(f"local copy unusable: {exc}")
            return None
        try:
            inst = self._open(path)
        except Exception as exc:  # noqa: BLE001 - RocksDB refusing to open: fall back
            reasons.append(f"local copy does not open ({exc})")
            return None
        try:
            # local changelogs first, each verified against the manifest; else durable
            replay_changelogs(inst, self.store, m, copy_root.changelogs_dir)
        except BaseException:
            inst.close()
            self.local.discard_working_dir()
            raise
        return inst

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
        try:
            nbytes += replay_changelogs(inst, self.store, m, self.local.changelogs_dir)
        except BaseException:
            inst.close()
            self.local.discard_working_dir()
            raise
        return inst, nbytes, nfiles + len(m.changelog_files)

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
        with critical_path():
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
        # the whole checkpoint is on the batch's critical path: background
        # materializations of this process start no upload meanwhile
        with critical_path():
            if self.options.checkpoint_mode == "changelog":
                return self._changelog_checkpoint(instance, checkpoint_id, attempt,
                                                  key_group_range, states, base_manifest,
                                                  extra_metrics)
            self.stop_recording(instance)
            snapshot = self.snapshot_sync(instance, checkpoint_id, attempt)
            return self._upload(snapshot, base_manifest, key_group_range, states,
                                extra_metrics)

    # --- changelog mode ---------------------------------------------------------------

    def start_recording(self, instance: RocksDBInstance) -> None:
        """Record every later write of ``instance`` into a fresh local changelog.

        :meth:`restore` calls it in changelog mode; a caller that keeps an instance open
        after :meth:`checkpoint` calls it before the next batch writes.
        """
        self.stop_recording(instance)
        instance.changelog = ChangelogWriter(self.local.recording_path())

    def stop_recording(self, instance: RocksDBInstance) -> None:
        """Discard an unfinished recording (its writes are not part of any checkpoint)."""
        rec = getattr(instance, "changelog", None)
        instance.changelog = None
        if rec is not None:
            rec.abort()

    def _changelog_checkpoint(self, instance: RocksDBInstance, n: int, attempt: str,
                              key_group_range: tuple[int, int] | None,
                              states: Sequence[StateDescriptor],
                              base: PartitionManifest | None,
                              extra_metrics: Mapping[str, Any] | None,
                              ) -> tuple[PartitionManifest, CheckpointMetrics]:
        """Make the batch's changelog durable and publish a manifest naming the base
        materialization and every changelog after it; maybe start a materialization."""
        check_component(attempt)
        base = self._check_base(base)
        rec = instance.changelog
        if rec is None or rec.closed:
            raise CheckpointError(
                f"checkpoint {n} partition {self.partition}: changelog mode needs the "
                f"instance's writes recorded since its restore, and none were; restore it "
                f"with this checkpointer (or call start_recording before writing)")
        t0 = time.perf_counter()
        instance.changelog = None
        kgr = key_group_range or (0, self.options.max_parallelism - 1)
        local_log = self.local.changelog_path(n, attempt)
        snapshot = None
        try:
            stats = rec.finish(base=-1 if base is None else base.checkpoint_id, batch=n)
            os.replace(rec.path, local_log)
            counts0 = self.store.request_counts()
            lineage = Lineage.of(base)
            if base is not None and base.partition != self.partition:
                # rescaled: the old partition's materialization in flight is not ours to
                # adopt (its changelogs, replayed before this batch's, still are the state)
                lineage = lineage.without_pending()
            lineage, adoption = try_adopt(self.store, lineage, self.partition, n,
                                          self.options.materialize_interval,
                                          self._materialization_uploading)
            inline = materialize_inline(lineage, stats.size)
            if inline or materialization_due(lineage, n, stats.size,
                                             self.options.materialize_interval,
                                             self.options.materialize_changelog_ratio):
                snapshot = self.snapshot_sync(instance, n, attempt)
                lineage = replace(lineage, pending=MaterializationRef(n, attempt))
            sync_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            if inline:
                lineage, own = self._materialize_now(snapshot, lineage, kgr, states), ()
            else:
                own = (self._upload_changelog(local_log, n, attempt, stats),)
            manifest = PartitionManifest(
                operator_id=self.operator_id, partition=self.partition, checkpoint_id=n,
                attempt=attempt, key_group_start=kgr[0], key_group_end=kgr[1],
                max_parallelism=self.options.max_parallelism,
                files=lineage.db_files + lineage.changelogs + own,
                base_checkpoint_id=None if base is None else base.checkpoint_id,
                states=tuple(states), created_at_ms=int(time.time() * 1000),
                mode="changelog", materialization=lineage.materialization,
                pending_materialization=lineage.pending, writer_epoch=self.writer_epoch)
            metrics = CheckpointMetrics(
                checkpoint_id=n, partition=self.partition, attempt=attempt,
                sync_duration_s=sync_s, async_duration_s=time.perf_counter() - t1,
                bytes_uploaded=manifest.incremental_size,
                files_uploaded=sum(f.uploaded for f in manifest.files),
                files_reused=sum(not f.uploaded for f in manifest.files),
                full_size=manifest.full_size,
                incremental_size=manifest.incremental_size)
            changelog = {"records": stats.records, "raw_bytes": stats.raw_bytes,
                         "bytes": stats.size, "since_materialization":
                         lineage.changelog_size + sum(f.size for f in own),
                         "adoption": adoption,
                         "materialization_started": snapshot is not None and not inline,
                         "materialized_inline": inline}
            extra = dict(extra_metrics or {})
            counts1 = self.store.request_counts()
            if counts0 is not None and counts1 is not None:
                # the changelog's requests, the adoption's read, plus the manifest's PUT
                extra["checkpoint_requests"] = (counts1 - counts0
                                                + RequestCounts(
                                                    put=1, head=int(self.writer_epoch is not None))
                                                ).to_dict()
            manifest = manifest.with_metrics(**extra, **metrics.to_dict(), changelog=changelog)
            check_publisher(self.store, manifest)
            publish_manifest(self.store, manifest)
        except BaseException:
            rec.abort()
            if snapshot is not None:
                self.local.remove_copy(snapshot.directory)
            try:
                os.unlink(local_log)
            except OSError:
                pass
            raise
        metrics = replace(metrics, async_duration_s=time.perf_counter() - t1)
        if inline:
            os.unlink(local_log)  # the materialization holds this batch's writes
        elif snapshot is not None:
            materialize_in_background(self.store, snapshot, lineage.db_files,
                                      key_group_range=kgr,
                                      max_parallelism=self.options.max_parallelism,
                                      states=states)
        self._keep_changelog_local(instance, manifest, local_log)
        return manifest, metrics

    def _materialization_uploading(self, ref: MaterializationRef) -> bool:
        """Whether a live process of this machine still uploads materialization ``ref``
        of this partition (its local copy is marked in flight)."""
        return copy_in_flight(self.local.copy_dir(ref.checkpoint_id, ref.attempt))

    def _upload_changelog(self, local_log: str, n: int, attempt: str, stats) -> FileEntry:
        """Upload batch ``n``'s changelog (critical path); its durable entry."""
        adir = attempt_dir(n, self.partition, attempt)
        name = changelog_name(n)
        try:
            # no listing first: the upload refuses an existing name (a reused attempt)
            (t,) = self.store.put_files([(local_log, check_relative(f"{adir}/{name}"))])
        except StorageError as exc:
            if isinstance(exc.__cause__, FileExistsError):
                raise CommitFailedError(
                    f"checkpoint {n} partition {self.partition}: attempt {attempt!r} "
                    f"already wrote {adir}/{name}; durable files are never overwritten, "
                    f"so retry under a fresh attempt name") from exc
            raise
        if (t.size, t.checksum) != (stats.size, stats.checksum):
            raise StorageError(f"checkpoint {n} partition {self.partition}: changelog "
                               f"changed while uploading ({stats.size} bytes "
                               f"{stats.checksum} -> {t.size} {t.checksum})")
        return FileEntry(name, t.path, t.size, t.checksum, shared=True, uploaded=True)

    def _materialize_now(self, snapshot: LocalSnapshot, lineage: Lineage,
                         kgr: tuple[int, int], states: Sequence[StateDescriptor]) -> Lineage:
        """Upload the materialization ``snapshot`` in the critical path (see
        :func:`~.materialize.materialize_inline`) and adopt it at once: the checkpoint
        names it and no changelog (its files uploaded now are marked ``uploaded``)."""
        published = upload_materialization(
            self.store, snapshot, lineage.db_files, key_group_range=kgr,
            max_parallelism=self.options.max_parallelism, states=states, background=False)
        return Lineage(lineage.pending, published.files, ())

    def _keep_changelog_local(self, instance: RocksDBInstance, manifest: PartitionManifest,
                              local_log: str) -> None:
        """Clean marker and local copies after publication; never fails the checkpoint."""
        try:
            if instance.path == self.local.working_dir:
                self.local.write_clean_marker(manifest.checkpoint_id, manifest.attempt,
                                              int(instance.db.latest_sequence_number()))
            if self.options.local_recovery:
                keep = []
                if manifest.materialization is not None:
                    ref = manifest.materialization
                    keep.append(self.local.copy_dir(ref.checkpoint_id, ref.attempt))
                self.local.retain(keep=keep)
                self.local.prune_changelogs(manifest.materialized_id, keep=[local_log])
            else:
                self.local.prune_changelogs(None)
                if os.path.exists(local_log):
                    os.unlink(local_log)
                self.local.retain()
        except Exception:  # noqa: BLE001 - invariant 7: secondary is secondary
            log.warning("checkpoint %d partition %d: keeping the local changelog failed",
                        manifest.checkpoint_id, self.partition, exc_info=True)

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
                incremental=self.options.incremental, extra_metrics=extra_metrics,
                writer_epoch=self.writer_epoch)
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
        # a carried-over manifest and the checkpoint it carries hold the same files
        # (statebackend.checkpoint.carry)
        if self.restored_from is None or (_origin_path(base)
                                          != _origin_path(self.restored_from)):
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


def _origin_path(m: PartitionManifest) -> str:
    from .carry import carried_origin

    return (carried_origin(m) or m).path

