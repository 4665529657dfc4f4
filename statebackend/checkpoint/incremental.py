"""Incremental mode: a native RocksDB checkpoint every batch, uploading only the SST files
the base checkpoint does not already hold (:mod:`.uploader`)."""

from __future__ import annotations

import logging

from ..model.manifest import PartitionManifest
from ..rocksdb.instance import RocksDBInstance
from .changelog_mode import stop_recording
from .snapshot import LocalSnapshot
from .strategy import CheckpointOperation, CheckpointRequest, CheckpointStrategy, CheckpointTarget
from .task_metrics import CheckpointMetrics
from .uploader import upload_snapshot

log = logging.getLogger(__name__)


class IncrementalStrategy(CheckpointStrategy):
    """Sync part: flush and hard-link a native checkpoint into the attempt's local copy."""

    def restored(self, instance: RocksDBInstance) -> None:
        """Nothing to record: the next checkpoint compares files, not writes."""

    def sync_part(self, instance: RocksDBInstance,
                  request: CheckpointRequest) -> CheckpointOperation:
        # a recording left from changelog mode (the instance kept open across a switch)
        stop_recording(instance)
        snapshot = self.target.snapshot_sync(instance, request.checkpoint_id, request.attempt)
        return SnapshotUpload(self.target, snapshot, request)


class SnapshotUpload(CheckpointOperation):
    """Upload a native checkpoint's new files, publish, keep the local secondary copy."""

    def __init__(self, target: CheckpointTarget, snapshot: LocalSnapshot,
                 request: CheckpointRequest) -> None:
        self.target = target
        self.snapshot = snapshot
        self.request = request

    def run(self) -> tuple[PartitionManifest, CheckpointMetrics]:
        t, snapshot, req = self.target, self.snapshot, self.request
        try:
            manifest, metrics = upload_snapshot(
                t.store, snapshot, base=req.base, key_group_range=req.key_group_range,
                max_parallelism=t.options.max_parallelism, states=req.states,
                incremental=t.options.incremental, extra_metrics=req.extra_metrics,
                writer_epoch=t.writer_epoch, facts=req.facts)
        except BaseException:
            # The snapshot of an unpublished checkpoint is no secondary copy of anything.
            t.local.remove_copy(snapshot.directory)
            raise
        self._keep_local()
        return manifest, metrics

    def _keep_local(self) -> None:
        """Secondary copy and clean marker after publication; never fails the checkpoint."""
        t, snapshot = self.target, self.snapshot
        try:
            if snapshot.working_dir == t.local.working_dir:
                t.local.write_clean_marker(snapshot.checkpoint_id, snapshot.attempt,
                                           snapshot.sequence_number)
            if t.options.local_recovery and t.options.num_local_retained > 0:
                t.local.retain(keep=[snapshot.directory])
            else:
                t.local.remove_copy(snapshot.directory)
                t.local.retain()
        except Exception:  # noqa: BLE001 - invariant 7: secondary is secondary
            log.warning("checkpoint %d partition %d: keeping the local copy failed",
                        snapshot.checkpoint_id, snapshot.partition, exc_info=True)
