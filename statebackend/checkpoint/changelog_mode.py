"""Changelog mode: the batch's changelog every batch, a materialization every few.

Sync part (:meth:`ChangelogStrategy.sync_part`): close the batch's recording into the
attempt's local changelog, take up a published materialization (:func:`~.materialize.try_adopt`)
and, when one is due, a native checkpoint to materialize. Async part
(:class:`ChangelogUpload`): upload the changelog (or, for a batch that rewrote most of the
state, the materialization itself), publish a manifest naming the base materialization
and every changelog after it, then queue the materialization's upload in the background
and keep the changelog locally.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import replace

from ..errors import CheckpointError, CommitFailedError, StorageError
from ..local.disk import LocalRecovery, copy_in_flight
from ..model.changelog_sources import live_sources
from ..model.manifest import (
    FileEntry,
    MaterializationRef,
    PartitionManifest,
    SliceRef,
    attempt_dir,
    changelog_id,
    changelog_name,
    check_relative,
)
from ..rocksdb.instance import RocksDBInstance
from . import deltas, slices
from .changelog import ChangelogWriter
from .materialize import (
    MIN_CHANGELOG_BYTES,
    Lineage,
    materialization_due,
    materialize_in_background,
    materialize_inline,
    small_enough_inline,
    try_adopt,
    upload_materialization,
)
from .publish import publish_checkpoint
from .snapshot import LocalSnapshot
from .strategy import CheckpointOperation, CheckpointRequest, CheckpointStrategy, CheckpointTarget
from .task_metrics import CheckpointMetrics

log = logging.getLogger(__name__)


def start_recording(local: LocalRecovery, instance: RocksDBInstance) -> None:
    """Record every later write of ``instance`` into a fresh local changelog."""
    stop_recording(instance)
    instance.changelog = ChangelogWriter(local.recording_path())


def stop_recording(instance: RocksDBInstance) -> None:
    """Discard an unfinished recording (its writes are not part of any checkpoint)."""
    rec = getattr(instance, "changelog", None)
    instance.changelog = None
    if rec is not None:
        rec.abort()


class ChangelogStrategy(CheckpointStrategy):
    """Checkpoints of the writes recorded since the restore (see the module docstring)."""

    def loads_small(self, instance: RocksDBInstance, request: CheckpointRequest) -> bool:
        """A first batch under ``auto`` with slices derived (:func:`~.strategy.mode_for`
        recorded it) that wrote less than ``auto_changelog_size`` (or whose partition is
        too small to slice): it checkpoints incrementally, as ``auto`` does below the
        line; only a large load is written as slices."""
        o, rec = self.target.options, instance.changelog
        return (request.base is None and o.rolling_slices is None and slices.rolling_on(o)
                and rec is not None and not rec.closed
                and (rec.raw_bytes < o.auto_changelog_size or slices.slice_count(
                    None, request.key_group_range, (), 1, ()) == 0))

    def restored(self, instance: RocksDBInstance) -> None:
        start_recording(self.target.local, instance)

    def sync_part(self, instance: RocksDBInstance,
                  request: CheckpointRequest) -> CheckpointOperation:
        rec = instance.changelog
        if rec is None or rec.closed:
            raise CheckpointError(
                f"checkpoint {request.checkpoint_id} partition {self.target.partition}: "
                f"changelog mode needs the instance's writes recorded since its restore, "
                f"and none were; restore it with this checkpointer (or call "
                f"start_recording before writing)")
        op = ChangelogUpload(self.target, instance, request, rec)
        try:
            op.prepare()
        except BaseException:
            op.abort()
            raise
        return op


class ChangelogUpload(CheckpointOperation):
    """One changelog checkpoint, from its sync part (:meth:`prepare`) to publication."""

    def __init__(self, target: CheckpointTarget, instance: RocksDBInstance,
                 request: CheckpointRequest, rec: ChangelogWriter) -> None:
        self.target = target
        self.instance = instance
        self.request = request
        self.rec = rec
        self.t0 = time.perf_counter()
        instance.changelog = None
        self.local_log = target.local.changelog_path(request.checkpoint_id, request.attempt)
        self.snapshot: LocalSnapshot | None = None
        self.inline = False
        # rolling slices (options.rolling_slices): the units this batch wrote, and where
        self.units: list[tuple[SliceRef, list[str]]] = []
        self.unit_dir: str | None = None
        self.prune_upto: int | None = None

    def prepare(self) -> None:
        """The sync part: the batch's changelog closed locally, the lineage to build on,
        and a native checkpoint when a materialization is due."""
        t, req, n = self.target, self.request, self.request.checkpoint_id
        base = req.base
        self.stats = self.rec.finish(base=-1 if base is None else base.checkpoint_id, batch=n)
        os.replace(self.rec.path, self.local_log)
        self.counts0 = t.store.request_counts()
        lineage = Lineage.continuing(base, t.partition, req.key_group_range)
        lineage, self.adoption = try_adopt(t.store, lineage, t.partition, n,
                                           t.options.materialize_interval,
                                           self._materialization_uploading)
        o = t.options
        if slices.rolling_on(o) and self._slice_count(lineage) > 0:
            self._write_units(lineage)
            self.lineage = lineage
            self.sync_s = time.perf_counter() - self.t0
            return
        self.inline = materialize_inline(lineage, self.stats.size)
        if self.inline or materialization_due(
                lineage, n, self.stats.size, o.materialize_interval,
                o.materialize_changelog_ratio, o.inline_ratio()):
            self.snapshot = t.snapshot_sync(self.instance, n, req.attempt)
            self.inline = self.inline or small_enough_inline(
                self.snapshot, lineage, self.stats.size, o.inline_ratio())
            lineage = replace(lineage, pending=MaterializationRef(n, req.attempt))
        self.lineage = lineage
        self.sync_s = time.perf_counter() - self.t0

    def _slice_count(self, lineage: Lineage) -> int:
        """This batch's number of slices (:func:`~.slices.slice_count`), 0: none."""
        unit_names = {nm for u in lineage.slices if not u.is_delta for nm in u.file_names()}
        held = lineage.materialized_size + sum(f.size for f in lineage.slice_files
                                               if f.name in unit_names)
        sizes = [c.size for c in lineage.changelogs]
        if 0 < self.stats.records and self.stats.size < held:
            sizes.append(self.stats.size)  # a batch's rate (not a load, not idle)
        self.slice_n = slices.slice_count(self.target.options.rolling_slices,
                                          self.request.key_group_range, lineage.slices,
                                          held, sizes)
        return self.slice_n

    def _write_units(self, lineage: Lineage) -> None:
        """Rolling slices: write the batch's due slice (all of them when the batch wrote at
        least the state it started from: a load; none when it changed nothing) and the
        global unit, and cut its changelog into pieces by key-group range (:mod:`.deltas`),
        while nothing writes the instance."""
        t, req, n = self.target, self.request, self.request.checkpoint_id
        held = lineage.materialized_size + lineage.changelog_size + lineage.slices_size
        base = req.base
        # rescaled (a base of other key groups): the units and changelogs of the old
        # partition do not cover this range, so the first batch writes it whole
        rescaled = base is not None and (base.key_group_start,
                                         base.key_group_end) != req.key_group_range
        rewrite_all = rescaled or not lineage.slices and lineage.materialization is None or (
            self.stats.size >= MIN_CHANGELOG_BYTES and self.stats.size >= held)
        os.makedirs(t.local.partition_dir, exist_ok=True)
        self.unit_dir = tempfile.mkdtemp(prefix=f".units-{n}-", dir=t.local.partition_dir)
        pieces = None
        if rewrite_all or self.stats.records:  # (nothing changed: the oldest slice waits)
            versions = slices.covering(req.key_group_range, lineage.slices,
                                       lineage.materialized_id).versions
            ranges = slices.due_ranges(req.key_group_range, self.slice_n, versions,
                                       rewrite_all)
            self.units = slices.write_units(self.instance, ranges, n, self.unit_dir,
                                            self.slice_n)
            pieces = deltas.piece_ranges(req.key_group_range, self.slice_n, versions, ranges)
        if rewrite_all:
            return  # every key group's unit is this batch's: no changelog needed
        self.units += deltas.split_changelog(self.local_log, req.key_group_range,
                                             -1 if base is None else base.checkpoint_id, n,
                                             self.unit_dir, pieces)

    def _rolled(self) -> tuple[Lineage, tuple[SliceRef, ...], bool]:
        """The lineage after this batch's units: units merged and pruned, the base and the
        changelogs no key group needs dropped; and whether the batch's own changelog is
        needed (some key group's unit is older than the batch)."""
        lineage, n = self.lineage, self.request.checkpoint_id
        merged = slices.merge_slices(lineage.slices, [u for u, _p in self.units])
        cover = slices.covering(self.request.key_group_range, merged, lineage.materialized_id)
        kept = slices.prune_slices(merged, cover)
        # a restore of rolling slices reads its changelogs from durable storage (the local
        # copy tier needs a base snapshot), so no local changelog is kept
        self.prune_upto = n
        old_names = {nm for u in kept if u.checkpoint_id != n for nm in u.file_names()}
        rolled = Lineage(
            lineage.materialization if cover.needs_base else None,
            lineage.db_files if cover.needs_base else (),
            tuple(c for c in lineage.changelogs if changelog_id(c.name) > cover.start),
            lineage.pending, kept,
            tuple(f for f in lineage.slice_files if f.name in old_names),
            lineage.changelog_sources)
        # the batch's changelog travels as pieces (deltas) when it wrote them
        return rolled, kept, cover.start < n and not any(u.is_delta for u, _p in self.units)

    def run(self) -> tuple[PartitionManifest, CheckpointMetrics]:
        t, req = self.target, self.request
        try:
            t1 = time.perf_counter()
            if self.units or self.unit_dir is not None:
                self.lineage, kept, own_needed = self._rolled()
                # a piece no key group needs (its range was all rewritten by this batch)
                self.units = [(u, p) for u, p in self.units if not u.is_delta or u in kept]
                own, unit_entries = self._upload_changelog_and_units(own_needed)
                self.lineage = replace(self.lineage,
                                       slice_files=self.lineage.slice_files + unit_entries)
            elif self.inline:
                self.lineage, own = self._materialize_now(), ()
            else:
                own = (self._upload_changelog(),)
            manifest = self._manifest(own)
            changelog = {"records": self.stats.records, "raw_bytes": self.stats.raw_bytes,
                         "bytes": self.stats.size, "since_materialization":
                         self.lineage.changelog_size + sum(f.size for f in own),
                         "adoption": self.adoption,
                         "materialization_started": self.snapshot is not None
                         and not self.inline,
                         "materialized_inline": self.inline,
                         "slices_written": len([u for u, _p in self.units
                                                if not u.is_global]),
                         "slice_bytes": sum(os.path.getsize(p) for _u, ps in self.units
                                            for p in ps if os.path.exists(p))}
            manifest, metrics = publish_checkpoint(
                t.store, manifest, sync_duration_s=self.sync_s, async_start=t1,
                counts0=self.counts0, extra_metrics=req.extra_metrics, facts=req.facts,
                changelog=changelog)
        except BaseException:
            self.abort()
            raise
        if self.unit_dir is not None:
            shutil.rmtree(self.unit_dir, ignore_errors=True)
        if self.inline:
            os.unlink(self.local_log)  # the materialization holds this batch's writes
        elif self.snapshot is not None:
            materialize_in_background(t.store, self.snapshot, self.lineage.db_files,
                                      key_group_range=req.key_group_range,
                                      max_parallelism=t.options.max_parallelism,
                                      states=req.states)
        self._keep_changelog_local(manifest)
        return manifest, metrics

    def abort(self) -> None:
        """Nothing published: drop the recording, the snapshot and the local changelog."""
        self.rec.abort()
        if self.snapshot is not None:
            self.target.local.remove_copy(self.snapshot.directory)
        if self.unit_dir is not None:
            shutil.rmtree(self.unit_dir, ignore_errors=True)
        try:
            os.unlink(self.local_log)
        except OSError:
            pass

    def _manifest(self, own: tuple[FileEntry, ...]) -> PartitionManifest:
        """The manifest to publish; refused (nothing published) when a reader would
        refuse its changelogs as another partition's."""
        t, req, lineage, base = self.target, self.request, self.lineage, self.request.base
        kgr = req.key_group_range
        manifest = PartitionManifest(
            operator_id=t.operator_id, partition=t.partition,
            checkpoint_id=req.checkpoint_id, attempt=req.attempt, key_group_start=kgr[0],
            key_group_end=kgr[1], max_parallelism=t.options.max_parallelism,
            files=lineage.db_files + lineage.slice_files + lineage.changelogs + own,
            base_checkpoint_id=None if base is None else base.checkpoint_id,
            states=req.states, created_at_ms=int(time.time() * 1000),
            mode="changelog", materialization=lineage.materialization,
            pending_materialization=lineage.pending, writer_epoch=t.writer_epoch,
            slices=lineage.slices,
            changelog_sources=live_sources(lineage.changelog_sources,
                                           lineage.changelogs + own))
        for f in manifest.foreign_changelogs():
            raise CheckpointError(
                f"checkpoint {req.checkpoint_id} partition {t.partition}: its base "
                f"{None if base is None else base.path} lists a {manifest.misplaced(f)}, "
                f"so readers would refuse the checkpoint and nothing is published; "
                f"restore from another retained checkpoint")
        return manifest

    def _materialization_uploading(self, ref: MaterializationRef) -> bool:
        """Whether a live process of this machine still uploads materialization ``ref``
        of this partition (its local copy is marked in flight)."""
        return copy_in_flight(self.target.local.copy_dir(ref.checkpoint_id, ref.attempt))

    def _upload_changelog(self) -> FileEntry:
        """Upload the batch's changelog (critical path); its durable entry."""
        own, _units = self._upload_changelog_and_units(True)
        return own[0]

    def _upload_changelog_and_units(self, changelog: bool
                                    ) -> tuple[tuple[FileEntry, ...], tuple[FileEntry, ...]]:
        """Upload the batch's changelog (when ``changelog``) and the files of its units
        together (critical path); their durable entries."""
        t, n, attempt, stats = (self.target, self.request.checkpoint_id, self.request.attempt,
                                self.stats)
        adir = attempt_dir(n, t.partition, attempt)
        name = changelog_name(n)
        items = [(self.local_log, check_relative(f"{adir}/{name}"))] if changelog else []
        unit_files = [(u.file_name(i), p) for u, ps in self.units for i, p in enumerate(ps)]
        items += [(p, check_relative(f"{adir}/{nm}")) for nm, p in unit_files]
        try:
            # no listing first: the upload refuses an existing name (a reused attempt)
            transfers = t.store.put_files(items)
        except StorageError as exc:
            if isinstance(exc.__cause__, FileExistsError):
                raise CommitFailedError(
                    f"checkpoint {n} partition {t.partition}: attempt {attempt!r} "
                    f"already wrote {adir}/{name}; durable files are never overwritten, "
                    f"so retry under a fresh attempt name") from exc
            raise
        units = tuple(FileEntry(nm, tr.path, tr.size, tr.checksum, shared=True, uploaded=True)
                      for (nm, _p), tr in zip(unit_files, transfers[len(transfers)
                                                                   - len(unit_files):]))
        if not changelog:
            return (), units
        tr = transfers[0]
        if (tr.size, tr.checksum) != (stats.size, stats.checksum):
            raise StorageError(f"checkpoint {n} partition {t.partition}: changelog "
                               f"changed while uploading ({stats.size} bytes "
                               f"{stats.checksum} -> {tr.size} {tr.checksum})")
        return (FileEntry(name, tr.path, tr.size, tr.checksum, shared=True, uploaded=True),
                ), units

    def _materialize_now(self) -> Lineage:
        """Upload the materialization in the critical path (see
        :func:`~.materialize.materialize_inline`) and adopt it at once: the checkpoint
        names it and no changelog (its files uploaded now are marked ``uploaded``)."""
        assert self.snapshot is not None
        published = upload_materialization(
            self.target.store, self.snapshot, self.lineage.db_files,
            key_group_range=self.request.key_group_range,
            max_parallelism=self.target.options.max_parallelism, states=self.request.states,
            background=False)
        return Lineage(self.lineage.pending, published.files, ())

    def _keep_changelog_local(self, manifest: PartitionManifest) -> None:
        """Clean marker and local copies after publication; never fails the checkpoint."""
        local, instance, local_log = self.target.local, self.instance, self.local_log
        try:
            if instance.path == local.working_dir:
                local.write_clean_marker(manifest.checkpoint_id, manifest.attempt,
                                         int(instance.db.latest_sequence_number()))
            if self.target.options.local_recovery:
                keep = []
                if manifest.materialization is not None:
                    ref = manifest.materialization
                    keep.append(local.copy_dir(ref.checkpoint_id, ref.attempt))
                local.retain(keep=keep)
                if self.prune_upto is None:
                    local.prune_changelogs(manifest.materialized_id, keep=[local_log])
                else:
                    local.prune_changelogs(self.prune_upto)
            else:
                local.prune_changelogs(None)
                if os.path.exists(local_log):
                    os.unlink(local_log)
                local.retain()
        except Exception:  # noqa: BLE001 - invariant 7: secondary is secondary
            log.warning("checkpoint %d partition %d: keeping the local changelog failed",
                        manifest.checkpoint_id, self.target.partition, exc_info=True)
