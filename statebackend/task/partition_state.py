"""The narrow task API: one partition's state, opened for a batch and committed.

As Spark's state store provider (``load(version)``, work, ``commit()``), a task does::

    state = PartitionState(config, partition)
    restored = state.load(checkpoint_id)        # the state committed for checkpoint_id - 1
    ...                                         # process rows against restored.instance
    manifest = state.commit(checkpoint_id, attempt, states, metrics)
    state.release(manifest)                     # close, or keep open for the next task

:meth:`PartitionState.load` owns everything about *which* state to open: resolving the
base manifest (:func:`resolve_base`), passing over micro-batches that ran no task
(:func:`last_batch_that_ran`), refusing to start over when committed state exists
(:func:`check_continuity`), and the restore order: a rescaled layout (assembled from the
old partitions), the instance this process kept open, one handed over by another worker,
the working directory, the local copy, durable storage, and a savepoint for a state with
no checkpoint yet. :meth:`PartitionState.commit` is the checkpoint (snapshot, upload,
publish) by the checkpoint mode's strategy behind
:class:`~statebackend.checkpoint.checkpointer.PartitionCheckpointer`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..checkpoint.checkpointer import PartitionCheckpointer
from ..checkpoint.fencing import WriterEpoch, claim
from ..checkpoint.publish import ManifestFacts
from ..errors import IncompatibleStateError
from ..local.disk import WORK_DIR
from ..local.resident import ResidentInstances, resident_instances
from ..model.carry import carried_origin, never_ran
from ..model.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
    StateDescriptor,
    checkpoint_dir,
    choose_manifest,
)
from ..restore.carry import carry_in_task
from ..rocksdb.instance import RocksDBInstance
from ..rocksdb.options import to_rocksdict_options
from ..storage import open_store
from ..storage.manifests import (
    list_published_manifests,
    operator_store,
    read_completed_record,
    read_recorded_manifests,
)
from ..storage.records import completed_ids
from .context import OperatorConfig, kg_range_of, local_root, run_identity

_STORES: dict[tuple, Any] = {}
# (location, operator, run id) -> the writer epoch this process's tasks of that run hold
_WRITERS: dict[tuple[str, str, str], WriterEpoch] = {}


@dataclass(frozen=True)
class Restored:
    """The instance a task starts from, and where it came from.

    Attributes
    ----------
    instance : RocksDBInstance
        Open, holding exactly the state committed before this batch.
    metrics : object
        How the restore went (``RestoreMetrics``, or ``RescaleMetrics`` after a rescale or
        a start from a savepoint).
    base : PartitionManifest or None
        The manifest restored: the next checkpoint's base.
    first : bool
        No state existed before this batch (initial state applies).
    max_event_time_ms : int or None
        The running max event time of the state restored.
    record : CompletedCheckpoint or None
        The record of the checkpoint restored, if it was complete when read.
    prev_id : int
        The checkpoint restored: the last batch before this one that ran.
    """

    instance: RocksDBInstance
    metrics: Any
    base: PartitionManifest | None
    first: bool
    max_event_time_ms: int | None
    record: CompletedCheckpoint | None = None
    prev_id: int = -1


@dataclass(frozen=True)
class _Base:
    """Which committed state a batch starts from (before opening anything)."""

    prev_id: int
    record: CompletedCheckpoint | None  # of prev_id, if completed when read
    manifest: PartitionManifest | None  # this partition's, in this layout
    rescaled: bool  # prev_id was written with another parallelism


class PartitionState:
    """One partition of one operator in one task: :meth:`load`, work, :meth:`commit`,
    :meth:`release`.

    Parameters
    ----------
    config : OperatorConfig
        The operator's configuration.
    partition : int
        The task's partition.
    working_dir_name : str, optional
        The working directory's name; instances kept open between tasks
        (``keep_instances_open``) each need one of their own.
    """

    def __init__(self, config: OperatorConfig, partition: int,
                 working_dir_name: str = WORK_DIR) -> None:
        self.config = config
        self.partition = partition
        self.root = root_store(config)
        self.store = operator_store(self.root, config.operator_id)
        db_options = to_rocksdict_options(config.options)

        def open_instance(path: str) -> RocksDBInstance:
            return RocksDBInstance(path, db_options=db_options)

        self._open = open_instance
        self.resident: ResidentInstances | None = (
            resident_instances(config.options.instance_idle_timeout)
            if config.options.keep_instances_open else None)
        self.checkpointer = PartitionCheckpointer(
            self.root, config.operator_id, partition, config.options,
            local_root(config.options), open_instance=open_instance,
            working_dir_name=working_dir_name)
        # taken before the restore: another query is refused before anything is touched
        self.writer = task_writer(config, self.store)
        self.checkpointer.writer_epoch = None if self.writer is None else self.writer.epoch
        self.restored: Restored | None = None
        self._counts0 = self.root.request_counts()

    def load(self, checkpoint_id: int) -> Restored:
        """Open the state committed for ``checkpoint_id - 1`` as this partition's instance.

        Micro-batches in which the operator ran no task (see :func:`last_batch_that_ran`)
        are passed over: the state restored is then that of the batch before them
        (``Restored.prev_id``).

        Raises
        ------
        IncompatibleStateError
            No state for the previous batch while completed checkpoints exist, or the
            state's ``max_parallelism`` is not this query's.
        CorruptStateError
            Durable state is missing or corrupt.
        """
        base = self._locate(checkpoint_id)
        restored = self._open_base(base)
        if self.resident is not None:
            self.resident.opened(self.checkpointer.local, restored.instance)
        self.restored = restored
        return restored

    def requests(self) -> dict[str, int] | None:
        """The store requests of this task so far (None: the store does not count)."""
        counts1 = self.root.request_counts()
        if self._counts0 is None or counts1 is None:
            return None
        return (counts1 - self._counts0).to_dict()

    def commit(self, checkpoint_id: int, attempt: str, states: Sequence[StateDescriptor],
               metrics: Mapping[str, Any], facts: ManifestFacts) -> PartitionManifest:
        """Checkpoint the loaded instance as ``checkpoint_id`` (snapshot, upload, publish)
        with ``metrics`` and ``facts`` in its manifest; the published manifest."""
        assert self.restored is not None, "commit before load"
        kg = kg_range_of(self.config, self.partition)
        instance = self.restored.instance
        # a load's level-0 files compacted before the snapshot, not after it (the state
        # would be uploaded twice); level sizes follow the state (a property read)
        instance.compact_bulk_load()
        instance.size_levels(self.config.options)
        published, _ = self.checkpointer.checkpoint(
            instance, checkpoint_id, attempt, (kg.start, kg.end), states,
            base_manifest=self.restored.base, extra_metrics=metrics, facts=facts)
        return published

    def release(self, published: PartitionManifest | None) -> None:
        """End of the task: close the instance, or keep it open for the next task of its
        partition when its checkpoint was published (``keep_instances_open``)."""
        if self.restored is None:
            return
        instance, local = self.restored.instance, self.checkpointer.local
        if self.resident is None:
            instance.close()
        elif published is None:
            self.resident.discard(local, instance)
        else:
            self.resident.give_back(local, instance, published)

    # --- which state ------------------------------------------------------------------

    def _locate(self, checkpoint_id: int) -> _Base:
        """The committed state batch ``checkpoint_id`` starts from: that of the batch
        before it, or of the last earlier batch that ran a task."""
        config, store = self.config, self.store
        kg = kg_range_of(config, self.partition)
        prev = checkpoint_id - 1
        while True:
            record = read_completed_record(store, prev) if prev >= 0 else None
            if record is not None and record.parallelism != config.parallelism:
                return _Base(prev, record, None, rescaled=True)
            base = resolve_base(store, self.partition, prev, (kg.start, kg.end), record)
            if base is None and record is None and prev >= 0 and config.carrier:
                # the carrier plan: this partition had no rows in batch prev, so ran no
                # task in it (statebackend.restore.carry); or batch prev was the previous
                # run's last, with another layout (its unwritten record)
                carried = carry_in_task(store, self.partition, prev, config.parallelism,
                                        (kg.start, kg.end), self.checkpointer.writer_epoch)
                if isinstance(carried, CompletedCheckpoint):
                    return _Base(prev, carried, None, rescaled=True)
                base = carried
            if base is None and prev >= 0:
                completed = completed_ids(store)
                ran = last_batch_that_ran(store, prev, completed) if record is None else prev
                if ran != prev:
                    prev = ran
                    continue
                check_continuity(completed, checkpoint_id)
            if base is not None and base.max_parallelism != config.max_parallelism:
                raise _max_parallelism_changed(base, config)
            # a carried-over manifest: restore the checkpoint it carries (its instance kept
            # open, working directory and local copy; the next checkpoint's base)
            return _Base(prev, record, carried_origin(base), rescaled=False)

    # --- the restore order ------------------------------------------------------------

    def _open_base(self, b: _Base) -> Restored:
        if b.rescaled:
            return self._rescaled(b)
        passed_over: list[str] = []  # faster sources that did not work out, for the report
        if self.resident is not None:
            kept = self._kept_open(b, passed_over)
            if kept is not None:
                return kept
        if (b.manifest is None or never_ran(b.manifest)) \
                and self.config.from_savepoint is not None:
            return self._from_savepoint(b)
        inst, rmetrics = self.checkpointer.restore(b.manifest, passed_over)
        return Restored(instance=inst, metrics=rmetrics, base=b.manifest,
                        first=b.manifest is None or never_ran(b.manifest),
                        max_event_time_ms=_event_time(b.manifest),
                        record=b.record, prev_id=b.prev_id)

    def _rescaled(self, b: _Base) -> Restored:
        """Assemble this partition's key-group range from the overlapping old partitions
        of a checkpoint written with another parallelism."""
        from ..restore.rescale import restore_rescaled

        assert b.record is not None
        if self.resident is not None:
            self.resident.forget(self.checkpointer.local)
        inst, rmetrics, sources = restore_rescaled(
            self.checkpointer, b.record, self.config.parallelism, self.config.max_parallelism,
            local_root(self.config.options), self._open)
        ets = [t for t in map(_event_time, sources) if t is not None]
        return Restored(instance=inst, metrics=rmetrics, base=carried_origin(sources[0]),
                        first=False,
                        max_event_time_ms=max(ets) if ets else None, record=b.record,
                        prev_id=b.prev_id)

    def _kept_open(self, b: _Base, passed_over: list[str]) -> Restored | None:
        """The instance this process kept open when it produced exactly the base; else
        ask another worker of this executor to hand its instance over (bounded wait)."""
        assert self.resident is not None
        t0 = time.perf_counter()
        kept = self.resident.take(self.checkpointer.local, b.manifest)
        if b.manifest is None:
            return None
        if kept is not None:
            rmetrics = self.checkpointer.resume(b.manifest, kept, time.perf_counter() - t0)
            return Restored(instance=kept, metrics=rmetrics, base=b.manifest, first=False,
                            max_event_time_ms=b.manifest.max_event_time_ms,
                            record=b.record, prev_id=b.prev_id)
        self.resident.request_handover(self.checkpointer.local, b.manifest,
                                       reasons=passed_over)
        return None

    def _from_savepoint(self, b: _Base) -> Restored:
        """Read this partition's key-group blocks from the configured savepoint."""
        from ..restore.rescale import restore_from_savepoint
        from ..savepoint.reader import SavepointReader

        sp = self.config.from_savepoint
        assert sp is not None
        reader = SavepointReader(open_store(sp.url, storage_options=sp.storage_options or None))
        inst, smetrics = restore_from_savepoint(self.checkpointer, reader,
                                                self.config.parallelism,
                                                self.config.max_parallelism)
        et = reader.manifest.metrics.get("max_event_time_ms")
        return Restored(instance=inst, metrics=smetrics, base=None, first=False,
                        max_event_time_ms=None if et is None else int(et), record=b.record,
                        prev_id=b.prev_id)


def _event_time(m: PartitionManifest | None) -> int | None:
    return None if m is None else m.max_event_time_ms


def _max_parallelism_changed(base: PartitionManifest,
                             config: OperatorConfig) -> IncompatibleStateError:
    return IncompatibleStateError(
        f"state was written with max_parallelism={base.max_parallelism}, this query uses "
        f"{config.max_parallelism}; it is fixed for the life of the state. To migrate, "
        f"write a savepoint with the old value, rewrite it for the new one with "
        f"`statebackend migrate-savepoint URL OPERATOR NAME NEW_NAME --max-parallelism "
        f"{config.max_parallelism}` (or statebackend.savepoint.migrate.migrate_savepoint), "
        f"and start from the new savepoint)")


def root_store(config: OperatorConfig):
    """One store per location per worker process: pools are reused across tasks."""
    # storage options nest (S3's client_kwargs is a dict): key by their canonical JSON
    key = (config.checkpoint_location,
           json.dumps(config.storage_options, sort_keys=True, default=repr))
    store = _STORES.get(key)
    if store is None:
        root = open_store(config.checkpoint_location,
                          upload_threads=config.options.upload_threads,
                          download_threads=config.options.download_threads,
                          storage_options=config.storage_options or None)
        store = _STORES[key] = root
    return store


def task_writer(config: OperatorConfig, store) -> WriterEpoch | None:
    """The writer epoch this task's run holds on the operator's location (with the query
    it runs for), taken by the run's first task in this process
    (:func:`~statebackend.checkpoint.fencing.claim`: a listing and a few small reads, once
    per run and process); None without fencing. Publication then proves it still owns the
    location (one HEAD per checkpoint).

    Raises
    ------
    StateLocationInUseError
        Another streaming query owns the location (before anything is restored or written).
    WriterFencedError
        A newer run of the same query took the location over.
    """
    if not config.options.fencing:
        return None
    query_id, run_id = run_identity(config)
    key = (config.checkpoint_location, config.operator_id, run_id)
    writer = _WRITERS.get(key)
    if writer is None:
        writer = _WRITERS[key] = claim(store, query_id, run_id)
    return writer


def resolve_base(store, partition: int, checkpoint_id: int,
                 kg_range: tuple[int, int] | None,
                 record: CompletedCheckpoint | None) -> PartitionManifest | None:
    """The manifest of ``partition`` committed for ``checkpoint_id`` (None: no state yet).

    The coordinator's record names it once the checkpoint is complete; before that (the
    listener runs after the batch ends), every reader applies the same deterministic rule
    to the published attempts. ``record``: the checkpoint's record as the task read it
    (None: not completed when read).
    """
    if checkpoint_id < 0:
        return None
    if record is not None:
        return read_recorded_manifests(store, record, [partition])[partition]
    published = list_published_manifests(store, checkpoint_id, partition)
    if kg_range is not None:
        # attempts of another layout (a run with another parallelism that died before
        # this checkpoint completed) are not this partition's state
        published = [m for m in published if (m.key_group_start, m.key_group_end) == kg_range]
    if published:
        chosen = choose_manifest(published)
        # The coordinator may have completed the checkpoint meanwhile with an attempt that
        # published after our listing; its record is the truth (the files of an attempt it
        # did not choose may be deleted), so look once more.
        record = read_completed_record(store, checkpoint_id)
        if record is not None and record.manifests.get(partition) not in (None, chosen.path):
            return read_recorded_manifests(store, record, [partition])[partition]
        return chosen
    return None


def check_continuity(completed: list[int], checkpoint_id: int) -> None:
    """Refuse to start from empty state when durable state of this operator exists
    (``completed``: the ids of its completed checkpoints): that means Spark's
    checkpointLocation was reset or our state was removed; silently starting over would
    lose committed state."""
    if completed:
        raise IncompatibleStateError(
            f"batch {checkpoint_id} expects state of batch {checkpoint_id - 1}, which does not "
            f"exist, but completed checkpoints {completed[0]}..{completed[-1]} do: was the "
            f"Spark checkpointLocation reset? Use a new state location for a new query, or "
            f"restart the query from its original Spark checkpoint.")


def last_batch_that_ran(store, prev: int, completed: list[int]) -> int:
    """``prev``, or the latest earlier batch with anything published when ``prev`` and the
    batches between have nothing at all (-1: none has); ``completed``: the operator's
    completed checkpoint ids (none is passed over).

    Spark runs no task of a ``mapInPandas`` whose whole input is empty as planned (an empty
    file, a no-data micro-batch): the optimizer prunes it, so that micro-batch publishes no
    manifest for any partition while Spark still commits it. Its state is the state of the
    batch before it. A batch with something published is never passed over (a partition
    missing from it is an error, raised by the caller). Costs one listing of one
    checkpoint's directory per batch passed over, and runs only when ``prev`` has neither
    a record nor a manifest of this partition.
    """
    floor = max([c for c in completed if c <= prev], default=-1)
    n = prev
    while n > floor and not store.list_dir(checkpoint_dir(n)):
        n -= 1
    return n
