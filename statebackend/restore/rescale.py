"""Restoring a partition whose key-group range differs from the stored layout.

Two sources:

* **An incremental checkpoint written with another parallelism.** The old partition whose
  range overlaps the new one most is restored the normal way (working dir, local copy,
  durable), so its SST files are reused and the next checkpoint uploads little; the key
  groups outside the new range are removed with ``delete_range`` in every keyed column
  family; the other overlapping old partitions are opened in scratch directories (their
  local copy hard-linked when present, else downloaded) and their overlapping key groups
  copied in by range scans into write batches.
* **A savepoint.** An empty instance receives exactly the key-group blocks of the new
  range (see :mod:`statebackend.savepoint.reader`).

Column families not keyed by key group (``_meta``: state descriptors and the
timer-service marker) are taken from the base instance and completed with the entries of
the other sources that the base lacks (a state declared only on another partition).

The new partition's first checkpoint takes the overlapping old partition as its base
manifest, so it reuses the SST files that survived the clip (registered by a completed
checkpoint: invariant 4) and uploads the rest; the old layout's files stay referenced by
the old records until retention subsumes them.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..checkpoint.checkpointer import PartitionCheckpointer
from ..checkpoint.restore import open_checkpoint, replay_changelogs
from ..errors import IncompatibleStateError
from ..keys.grouping_key import key_group_bounds
from ..keys.ranges import KeyGroupRange, key_group_range, rescale_sources
from ..local.disk import LocalCopyError, LocalRecovery
from ..model.manifest import CompletedCheckpoint, PartitionManifest
from ..rocksdb.instance import RocksDBInstance
from ..savepoint.reader import SavepointReader, check_max_parallelism
from ..savepoint.writer import GLOBAL_COLUMN_FAMILIES
from ..state.evolution import merge_meta_entry
from ..storage.manifests import read_recorded_manifests

__all__ = [
    "RescaleMetrics",
    "clip_to_range",
    "copy_key_groups",
    "merge_global",
    "restore_from_savepoint",
    "restore_rescaled",
]

log = logging.getLogger(__name__)

_BATCH_ENTRIES = 20_000


@dataclass
class RescaleMetrics:
    """How a rescaled partition was assembled."""

    partition: int
    key_groups: tuple[int, int]
    source: str  # "rescaled_checkpoint" or "savepoint"
    base_partition: int | None = None
    base: dict = field(default_factory=dict)  # restore metrics of the base instance
    copied_from: list[int] = field(default_factory=list)
    entries_copied: int = 0
    seconds: float = 0.0


def _keyed(instance: RocksDBInstance) -> list[str]:
    return [cf for cf in instance.column_family_names() if cf not in GLOBAL_COLUMN_FAMILIES]


def clip_to_range(instance: RocksDBInstance, kg_range: KeyGroupRange,
                  max_parallelism: int) -> None:
    """Delete every key group outside ``kg_range`` in every keyed column family."""
    outside = []
    if kg_range.start > 0:
        outside.append(KeyGroupRange(0, kg_range.start - 1))
    if kg_range.end < max_parallelism - 1:
        outside.append(KeyGroupRange(kg_range.end + 1, max_parallelism - 1))
    for cf in _keyed(instance):
        for r in outside:
            instance.delete_range(cf, *key_group_bounds(r))


def copy_key_groups(src: RocksDBInstance, dst: RocksDBInstance, kg_range: KeyGroupRange,
                    batch_entries: int = _BATCH_ENTRIES) -> int:
    """Copy every keyed entry of ``kg_range`` from ``src`` into ``dst``; returns the count."""
    if kg_range.is_empty:
        return 0
    start, end = key_group_bounds(kg_range)
    n = 0
    for cf in _keyed(src):
        dst.column_family(cf)
        batch: dict[bytes, bytes | None] = {}
        for k, v in src.scan_range(cf, start, end):
            batch[k] = v
            if len(batch) >= batch_entries:
                dst.write({cf: batch})
                n += len(batch)
                batch = {}
        if batch:
            dst.write({cf: batch})
            n += len(batch)
    return n


def merge_global(src: RocksDBInstance, dst: RocksDBInstance) -> None:
    """Add the global (not key-grouped) entries of ``src`` that ``dst`` lacks."""
    for cf in src.column_family_names():
        if cf not in GLOBAL_COLUMN_FAMILIES:
            continue
        entries = dict(src.scan_range(cf, b"", None))
        if not entries:
            continue
        have = dst.multi_get(cf, list(entries))
        # Entries dst lacks, and state descriptors whose schema versions differ (merged).
        missing: dict[bytes, bytes | None] = {
            k: v if h is None else merge_meta_entry(k, h, v)
            for (k, v), h in zip(entries.items(), have)
            if h is None or merge_meta_entry(k, h, v) != h}
        if missing:
            dst.write({cf: missing})


def _open_source(checkpointer: PartitionCheckpointer, m: PartitionManifest, scratch: str,
                 open_instance: Callable[[str], RocksDBInstance], local_root: str
                 ) -> RocksDBInstance:
    """Open old partition ``m.partition`` in ``scratch``: local copy if it verifies, else download."""
    copy = LocalRecovery(local_root, m.operator_id, m.partition)
    ref = m.snapshot_ref
    if checkpointer.options.local_recovery and ref is not None and \
            os.path.isdir(copy.copy_dir(ref.checkpoint_id, ref.attempt)):
        try:
            d = copy.verify_copy(m, threads=max(2, checkpointer.options.download_threads))
            for f in m.db_files:
                src, dst = os.path.join(d, f.name), os.path.join(scratch, f.name)
                if f.shared:
                    try:
                        os.link(src, dst)
                        continue
                    except OSError:
                        pass
                shutil.copy2(src, dst)  # private files: RocksDB rewrites them on open
            inst = open_instance(scratch)
            try:
                # the whole partition's changelogs: the caller copies only the key groups
                # the new range owns, which clips the replay to them
                replay_changelogs(inst, checkpointer.store, m, copy.changelogs_dir)
            except BaseException:
                inst.close()
                raise
            return inst
        except (LocalCopyError, OSError) as exc:
            log.info("partition %d: local copy of old partition %d unusable (%s); downloading",
                     checkpointer.partition, m.partition, exc)
            shutil.rmtree(scratch, ignore_errors=True)
            os.makedirs(scratch)
    return open_checkpoint(checkpointer.store, m, scratch, open_instance)


def restore_rescaled(checkpointer: PartitionCheckpointer, record: CompletedCheckpoint,
                     parallelism: int, max_parallelism: int, local_root: str,
                     open_instance: Callable[[str], RocksDBInstance] = RocksDBInstance,
                     ) -> tuple[RocksDBInstance, RescaleMetrics, list[PartitionManifest]]:
    """Assemble partition ``checkpointer.partition`` of ``parallelism`` from ``record``.

    Parameters
    ----------
    checkpointer : PartitionCheckpointer
        Of the *new* partition; its :meth:`~PartitionCheckpointer.restore` opens the base.
    record : CompletedCheckpoint
        The completed checkpoint written with another parallelism.
    parallelism, max_parallelism : int
        The query's values.
    local_root : str
        Where the old partitions' local copies may be, and scratch space.
    open_instance : callable
        ``path -> RocksDBInstance``.

    Returns
    -------
    tuple of (RocksDBInstance, RescaleMetrics, list of PartitionManifest)
        The open instance holding exactly the new range, how it was built, and the
        manifests of the old partitions it was built from (the first is the base: pass
        it, or nothing, as the base of the next checkpoint).

    Raises
    ------
    IncompatibleStateError
        ``max_parallelism`` differs from the record's.
    """
    t0 = time.perf_counter()
    p = checkpointer.partition
    target = key_group_range(p, parallelism, max_parallelism)
    ordered = _ordered_sources(record, p, parallelism, max_parallelism)
    manifests = read_recorded_manifests(checkpointer.store, record, sorted(q for q, _ in ordered))
    base_q = ordered[0][0]
    instance, base_metrics = checkpointer.restore(manifests[base_q])
    metrics = RescaleMetrics(p, (target.start, target.end), "rescaled_checkpoint", base_q,
                             base={"source": str(base_metrics.source),
                                   "seconds": base_metrics.duration_s})
    try:
        clip_to_range(instance, target, max_parallelism)
        for q, overlap in ordered[1:]:
            metrics.entries_copied += _copy_from(checkpointer, manifests[q], overlap,
                                                 instance, open_instance, local_root)
            metrics.copied_from.append(q)
    except BaseException:
        instance.close()
        checkpointer.local.discard_working_dir()
        raise
    metrics.seconds = time.perf_counter() - t0
    log.info("partition %d of %d: rescaled from checkpoint %d (parallelism %d): base p%d, "
             "%d entries copied from %s in %.3fs", p, parallelism, record.checkpoint_id,
             record.parallelism, base_q, metrics.entries_copied, metrics.copied_from,
             metrics.seconds)
    return instance, metrics, [manifests[q] for q, _ in ordered]


def _ordered_sources(record: CompletedCheckpoint, partition: int, parallelism: int,
                     max_parallelism: int) -> list[tuple[int, KeyGroupRange]]:
    """The old partitions (with their overlap) that new ``partition`` takes key groups
    from, largest overlap first; ties go to the lower old partition (deterministic)."""
    check_max_parallelism(record.max_parallelism, max_parallelism,
                          f"checkpoint {record.checkpoint_id} of operator {record.operator_id!r}")
    sources = rescale_sources(partition, parallelism, record.parallelism, max_parallelism)
    missing = [q for q, _ in sources if q not in record.manifests]
    if missing:
        raise IncompatibleStateError(f"checkpoint {record.checkpoint_id} has no partitions "
                                     f"{missing} of its parallelism {record.parallelism}")
    return sorted(sources, key=lambda s: (-len(s[1]), s[0]))


def _copy_from(checkpointer: PartitionCheckpointer, m: PartitionManifest,
               overlap: KeyGroupRange, instance: RocksDBInstance,
               open_instance: Callable[[str], RocksDBInstance], local_root: str) -> int:
    """Copy the key groups ``overlap`` (and the global entries) of the old partition whose
    manifest is ``m`` into ``instance``, through a scratch instance; the entries copied."""
    scratch = checkpointer.local.fresh_dir()
    try:
        src = _open_source(checkpointer, m, scratch, open_instance, local_root)
        try:
            copied = copy_key_groups(src, instance, overlap)
            merge_global(src, instance)
        finally:
            src.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return copied


def restore_from_savepoint(checkpointer: PartitionCheckpointer, reader: SavepointReader,
                           parallelism: int, max_parallelism: int
                           ) -> tuple[RocksDBInstance, RescaleMetrics]:
    """Open an empty instance for partition ``checkpointer.partition`` and fill it with
    the key groups it owns from the savepoint (reading only their blocks).

    Raises
    ------
    IncompatibleStateError
        ``max_parallelism`` differs from the savepoint's.
    CorruptKeyGroupError
        A needed block is corrupt; the working directory is discarded.
    """
    t0 = time.perf_counter()
    check_max_parallelism(reader.manifest.max_parallelism, max_parallelism,
                          f"savepoint {reader.manifest.name!r}")
    p = checkpointer.partition
    target = key_group_range(p, parallelism, max_parallelism)
    instance, _ = checkpointer.restore(None)
    try:
        stats = reader.restore_into(instance, target, max_parallelism)
    except BaseException:
        instance.close()
        checkpointer.local.discard_working_dir()
        raise
    metrics = RescaleMetrics(p, (target.start, target.end), "savepoint",
                             entries_copied=stats.entries,
                             seconds=time.perf_counter() - t0)
    return instance, metrics
