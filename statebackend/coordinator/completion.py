"""Completing a checkpoint: choose one valid published attempt per partition, write the
record (the commit point), register it.

Part of :class:`~statebackend.coordinator.CheckpointCoordinator`; the safety argument is
in :mod:`statebackend.coordinator.coordinator`.
"""

from __future__ import annotations

from dataclasses import replace

from ..checkpoint.fencing import WriterEpoch, fenced_error
from ..errors import IncompatibleStateError
from ..model.manifest import (
    LATEST_PATH,
    CompletedCheckpoint,
    PartitionManifest,
    checkpoint_dir,
    choose_manifest,
    completed_record_path,
    latest_pointer,
    manifests_by_partition,
)
from .ownership import _Owner, log
from .records import key_group_range
from .registry import RegisteredCheckpoint


class _Completion(_Owner):
    """:meth:`try_complete` and the reading and checking of published manifests."""

    # --- completion ---------------------------------------------------------------------

    def try_complete(self, checkpoint_id: int, *, committed: bool = True,
                     run_id: str | None = None) -> CompletedCheckpoint | None:
        """Complete checkpoint ``checkpoint_id`` if every partition has published it.

        Lists only the partition directories ``chk-<n>/p<p>/``, chooses one valid
        manifest per partition with :func:`~statebackend.model.manifest.choose_manifest`
        (an attempt is valid when its manifest parses, describes this operator, partition,
        checkpoint and key groups, and every file it references exists), writes the record
        atomically, registers it and applies retention.

        Parameters
        ----------
        checkpoint_id : int
            The checkpoint (micro-batch) id.
        committed : bool
            Whether Spark is known to have committed the micro-batch. False (completing
            from the published attempts alone, as a restart's planning does) keeps the
            checkpoint before it retained until a newer one completes: Spark runs a
            micro-batch it did not commit again, from the state before it. True for a
            checkpoint completed earlier without it rewrites its record as committed.
        run_id : str, optional
            The Spark run that finished the micro-batch: refused with
            :class:`~statebackend.errors.WriterFencedError` when a newer run of the query
            took the location over. None: act as the newest writer.

        Returns
        -------
        CompletedCheckpoint or None
            The record (also when it was already complete), or None when some partition has
            no valid published attempt yet, or a newer checkpoint already completed.

        Raises
        ------
        IncompatibleStateError
            A manifest was written for another ``max_parallelism`` or key-group range.
        StorageError
            Durable storage failed; nothing was recorded, so calling again is safe.
        WriterFencedError
            ``run_id`` no longer owns the location (see ``fencing``).
        """
        with self._lock:
            self.last_completion_requests = None
            if not self._act_as_owner(run_id):
                return None  # not this run's location: another query owns it
            known = self._registry.checkpoints.get(checkpoint_id)
            if known is None:
                record = self._complete_locked(checkpoint_id, committed)
                if record is None:
                    return None
            elif committed and not known.record.committed:
                record = self._mark_committed(known.record)
            else:
                return known.record
        self._after_change()
        return record

    def _complete_locked(self, checkpoint_id: int,
                         committed: bool) -> CompletedCheckpoint | None:
        """try_complete of a checkpoint not known yet (under the lock)."""
        counts0 = self.store.request_counts()
        reg = self._registry
        latest = reg.latest_id
        if latest is not None and checkpoint_id < latest:
            log.info("checkpoint %d of %s is older than the latest completed %d; its "
                     "files will be swept", checkpoint_id, self.operator_id, latest)
            return None
        # One listing of the checkpoint's directory (paged: ~1,000 files per request),
        # not one per partition; then the new manifests read in parallel.
        listing = frozenset(self._list(checkpoint_dir(checkpoint_id)))
        by_partition = manifests_by_partition(listing)
        self._published.read_many(checkpoint_id, sorted(
            rel for rels in by_partition.values() for rel in rels))
        chosen: dict[int, PartitionManifest] = {}
        for p in range(self.parallelism):
            m = self._choose(checkpoint_id, p, by_partition.get(p, []), listing)
            if m is None:
                return None
            chosen[p] = m
        ms = list(chosen.values())
        self._check_chosen_epochs(checkpoint_id, ms)
        if not committed:
            # Another coordinator of this operator (the backend object of a query that just
            # ended) may have recorded it as committed: never take that back, or retention
            # here would count on a predecessor that one may be deleting.
            committed = self._recorded_committed(checkpoint_id)
        record = CompletedCheckpoint(
            operator_id=self.operator_id, checkpoint_id=checkpoint_id,
            parallelism=self.parallelism, max_parallelism=self.max_parallelism,
            manifests={p: m.path for p, m in chosen.items()},
            full_size=sum(m.full_size for m in ms),
            incremental_size=sum(m.incremental_size for m in ms),
            created_at_ms=int(self._clock() * 1000), committed=committed,
            manifest_digests={p: d for p, m in chosen.items()
                              if (d := self._published.digest(m.path)) is not None},
            placement=_one_placement(ms), **self._writer_fields())
        # The commit point: once the record is durable the checkpoint is complete, and
        # a crash from here on is finished by rebuild() from this record.
        self._writer.check()
        self.store.put_bytes_atomic(self._abs(record.path), record.to_json().encode())
        self.store.put_bytes_atomic(self._abs(LATEST_PATH), latest_pointer(
            checkpoint_id, record.writer, self._writer.history if record.writer else None))
        self._registry = reg.register(RegisteredCheckpoint.of(record, ms))
        self._published.completed(checkpoint_id, listing)
        counts1 = self.store.request_counts()
        if counts0 is not None and counts1 is not None:
            self.last_completion_requests = counts1 - counts0
        return record

    def _writer_fields(self) -> dict:
        """The writer stamp a record carries (none without fencing or an owner)."""
        w = self._writer.current
        if w is None:
            return {}
        keep = self._registry.num_retained
        latest = self._registry.latest_id
        if not self._writer.for_owner and not self.own_retention and latest is not None:
            # completing for no run in particular: the record the owner writes, so its
            # retention, not this coordinator's
            keep = self._registry.checkpoints[latest].record.num_retained or keep
        return dict(writer_epoch=w.epoch, writer_query=w.query_id, writer_run=w.run_id,
                    num_retained=keep)

    def _check_chosen_epochs(self, checkpoint_id: int, ms: list[PartitionManifest]) -> None:
        """A chosen manifest published under a newer epoch than the one acted under: a
        newer writer exists whose ``_writers/`` file is gone. Refused, as a newer file is."""
        epoch = self._writer.epoch
        if not (self.fencing and epoch is not None):
            return
        newest = max((m.writer_epoch or 0 for m in ms), default=0)
        if newest > epoch:
            m = next(m for m in ms if m.writer_epoch == newest)
            raise fenced_error(
                f"{self.store.root}/{self.operator_id}", epoch,
                WriterEpoch(newest, None, "?", 0, f"its manifest {m.path} of checkpoint "
                            f"{checkpoint_id} says so; its _writers/ file is missing", ""))

    def _recorded_committed(self, checkpoint_id: int) -> bool:
        try:
            raw = self.store.get_bytes(self._abs(completed_record_path(checkpoint_id)))
        except FileNotFoundError:
            return False
        rel = completed_record_path(checkpoint_id)
        return CompletedCheckpoint.from_json(raw, where=rel).committed

    def _mark_committed(self, record: CompletedCheckpoint) -> CompletedCheckpoint:
        """Rewrite a record completed before Spark's commit was known as committed (under
        the lock; the checkpoint before it may be subsumed now: collect afterwards)."""
        record = replace(record, committed=True)
        self._writer.check()
        self.store.put_bytes_atomic(self._abs(record.path), record.to_json().encode())
        self._registry = self._registry.mark_committed(record.checkpoint_id)
        return record

    def anything_published(self, checkpoint_id: int) -> bool:
        """Whether any attempt of any partition wrote anything for ``checkpoint_id`` (one
        bounded listing of that checkpoint's directory)."""
        return bool(self._list(checkpoint_dir(checkpoint_id)))

    def _choose(self, checkpoint_id: int, partition: int, rels: list[str],
                listing: frozenset[str]) -> PartitionManifest | None:
        valid = []
        for rel in sorted(rels):
            m = self._published.read(checkpoint_id, rel)
            if m is None:
                continue
            if not self._check_compatible(m, partition):
                continue
            if self._of_another_query(m):
                continue
            missing = self._missing_files(m, listing)
            if missing:
                log.warning("attempt %s of checkpoint %d partition %d references missing "
                            "files %s; treating it as failed", m.attempt, checkpoint_id,
                            partition, missing[:5])
                continue
            valid.append(m)
        return choose_manifest(valid) if valid else None

    def _check_compatible(self, m: PartitionManifest, partition: int) -> bool:
        """False for an attempt of another layout (a run with another parallelism that died
        before this checkpoint completed): a failed attempt, not this partition's state.
        A different max_parallelism is a configuration error."""
        want = key_group_range(partition, self.parallelism, self.max_parallelism)
        got = (m.key_group_start, m.key_group_end)
        if m.max_parallelism == self.max_parallelism and got != want:
            log.warning("attempt %s of checkpoint %d partition %d covers key groups %s, this "
                        "layout expects %s; treating it as failed", m.attempt,
                        m.checkpoint_id, partition, got, want)
            return False
        if m.max_parallelism != self.max_parallelism:
            raise IncompatibleStateError(
                f"{m.path}: manifest covers key groups {got} of max_parallelism "
                f"{m.max_parallelism}, expected {want} of {self.max_parallelism} for partition "
                f"{partition} of {self.parallelism}; configure the coordinator with the "
                f"query's parallelism and max_parallelism")
        return True

    def _of_another_query(self, m: PartitionManifest) -> bool:
        """A manifest another streaming query's task published (its fencing evidence gone,
        say) is not this location's state: a failed attempt, never chosen."""
        if not self._writer.of_another_query(m.writer_query):
            return False
        log.warning("attempt %s of checkpoint %d partition %d was published by query %s, "
                    "not by the location's owner, query %s; treating it as failed",
                    m.attempt, m.checkpoint_id, m.partition, m.writer_query,
                    self._writer.stamp.query_id if self._writer.stamp else None)
        return True

    def _missing_files(self, m: PartitionManifest, listing: frozenset[str]) -> list[str]:
        missing = []
        for f in m.files:
            if f.path in listing or self._registry.is_referenced(f.path):
                continue  # listed just now, or kept alive by a retained record
            # A file from outside this partition directory that no retained record holds:
            # reused from a non-chosen attempt of the base. Rare, so one HEAD each.
            if self.store.size(self._abs(f.path)) != f.size:
                missing.append(f.path)
        return missing

    def chosen_manifests(self, checkpoint_id: int) -> list[PartitionManifest] | None:
        """The chosen manifests of a checkpoint this coordinator just completed, as it read
        them (None when it no longer holds them: read them from the store instead)."""
        with self._lock:
            reg = self._registry
            if checkpoint_id not in reg.checkpoints:
                return None
            cache = self._published.of(checkpoint_id)
            paths = reg.checkpoints[checkpoint_id].record.manifests.values()
            if not all(p in cache for p in paths):
                return None
            return [cache[p] for p in paths]


def _one_placement(ms: list[PartitionManifest]) -> str | None:
    """The plan every chosen manifest names (None: none names one, or they differ)."""
    named = {m.placement for m in ms}
    return named.pop() if len(named) == 1 else None
