"""The restore tiers of one partition: working directory, local copy, durable storage.

:meth:`PartitionRestorer.restore` tries, in order: the working directory when it is
exactly the requested checkpoint and attempt and untouched since; the local secondary
copy, verified file by file against the manifest and hard-linked into a fresh working
directory; durable storage. A problem on either local path falls back to durable storage
(logged once); a problem in durable storage raises :class:`CorruptStateError` and leaves
no working directory behind. Changelogs named by the manifest are replayed on top.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable

from ..errors import CorruptStateError
from ..local.disk import LocalCopyError, LocalRecovery
from ..model.manifest import PartitionManifest
from ..options import StateBackendOptions
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore
from .restore import (
    download_checkpoint,
    local_changelog_name,
    replay_changelogs,
    validate_manifest,
)
from .task_metrics import RestoreMetrics, RestoreSource

log = logging.getLogger("statebackend.checkpoint.checkpointer")

InstanceFactory = Callable[[str], RocksDBInstance]


class PartitionRestorer:
    """Opens the working instance of one partition holding exactly a manifest's state.

    Parameters
    ----------
    store : DurableStore
        Rooted at the operator root.
    operator_id : str
        Operator directory name.
    partition : int
        Partition index.
    local : LocalRecovery
        The partition's local directories.
    options : StateBackendOptions
        Reads ``local_recovery`` and ``download_threads``.
    open_instance : callable
        ``path -> RocksDBInstance``.
    """

    def __init__(self, store: DurableStore, operator_id: str, partition: int,
                 local: LocalRecovery, options: StateBackendOptions,
                 open_instance: InstanceFactory) -> None:
        self.store = store
        self.operator_id = operator_id
        self.local = local
        self.partition = partition
        self.options = options
        self._open = open_instance

    def restore(self, manifest: PartitionManifest | None, reasons: list[str]
                ) -> tuple[RocksDBInstance, RestoreMetrics]:
        """See :meth:`~.checkpointer.PartitionCheckpointer.restore`."""
        t0 = time.perf_counter()
        if manifest is None:
            self.local.discard_working_dir()
            inst = self._open(self.local.working_dir)
            return inst, RestoreMetrics(checkpoint_id=None, partition=self.partition,
                                        source=RestoreSource.EMPTY,
                                        duration_s=time.perf_counter() - t0)
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

    def _metrics(self, m: PartitionManifest, source: RestoreSource, t0: float,
                 reasons: list[str], nbytes: int = 0, nfiles: int = 0) -> RestoreMetrics:
        return RestoreMetrics(checkpoint_id=m.checkpoint_id, partition=self.partition,
                              source=source, duration_s=time.perf_counter() - t0,
                              bytes_downloaded=nbytes, files_downloaded=nfiles,
                              fallback_reason="; ".join(reasons) or None)

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
            # (rolling slices' units are not kept locally: durable restores them)
            if m.slices or not all(os.path.exists(os.path.join(copy_root.changelogs_dir,
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
        # rolling slices: their units and changelog pieces are read by replay_changelogs
        return inst, nbytes, nfiles + len(m.changelog_files) + len(m.slice_files)

