"""Changelog mode: the lineage a changelog checkpoint names, and materializations.

A changelog checkpoint of batch ``n`` publishes a manifest whose files are the base
materialization's snapshot files plus the changelogs of batches ``m+1..n`` after it
(:class:`Lineage`). Every few batches, or when those changelogs grow past a share of the
materialized state (:func:`materialization_due`), the task also takes a native RocksDB
checkpoint (hard links, synchronous) and names it ``pending_materialization`` in its
manifest; a thread of the worker process uploads its new SST files after the task's
output (:func:`materialize_in_background`) and publishes ``_MATERIALIZED.json``. A later
checkpoint adopts it (:meth:`Lineage.adopt`) only when that manifest is published, so
the base of a checkpoint is always durable (invariant 9); until then the pending name is
carried forward, protecting its files from the coordinator's sweeps, and it is abandoned
after :func:`pending_limit` batches (a worker that died mid-upload).

A materialization reuses a base SST only when name, size *and* CRC32 match: working
directories of one partition in different workers descend from the same snapshot but
flush different files under the same numbers, so a name alone does not identify a file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..errors import CorruptStateError
from ..local.disk import INFLIGHT_SUFFIX
from ..model.changelog_sources import derived_sources, extended_sources
from ..model.manifest import (
    MATERIALIZED_PREFIX,
    ChangelogSource,
    FileEntry,
    MaterializationRef,
    PartitionManifest,
    SliceRef,
    StateDescriptor,
    attempt_dir,
    changelog_id,
    check_relative,
)
from ..storage.base import DurableStore
from ..storage.checksum import file_crc32
from ..storage.manifests import read_manifest
from ..storage.priority import yield_to_critical_path
from .snapshot import LocalSnapshot

log = logging.getLogger(__name__)

MIN_CHANGELOG_BYTES = 1 << 20
"""Below this many changelog bytes since the last materialization, size never triggers one."""


def pending_limit(interval: int) -> int:
    """Batches after which a pending materialization that never published is abandoned."""
    return 2 * interval + 2


@dataclass(frozen=True)
class Lineage:
    """What a changelog checkpoint builds on: a materialization and the changelogs after it.

    Attributes
    ----------
    materialization : MaterializationRef or None
        Whose snapshot ``db_files`` are (None: empty state, no snapshot yet).
    db_files : tuple of FileEntry
        The snapshot's files, as durable entries (``uploaded=False`` when carried over).
    changelogs : tuple of FileEntry
        Changelogs after the materialization, in batch order.
    pending : MaterializationRef or None
        A materialization being uploaded in the background.
    slices, slice_files
        Rolling slices: the units and their files.
    changelog_sources : tuple of ChangelogSource
        Where ``changelogs`` before this partition's own are (other partitions'
        directories, after rescales: :mod:`statebackend.model.changelog_sources`); the
        manifest keeps those its changelogs still need (:func:`live_sources`).
    """

    materialization: MaterializationRef | None
    db_files: tuple[FileEntry, ...]
    changelogs: tuple[FileEntry, ...]
    pending: MaterializationRef | None = None
    slices: tuple[SliceRef, ...] = ()
    slice_files: tuple[FileEntry, ...] = ()
    changelog_sources: tuple[ChangelogSource, ...] = ()

    @classmethod
    def of(cls, restored: PartitionManifest | None) -> Lineage:
        """The lineage a checkpoint restored from ``restored`` continues."""
        if restored is None:
            return cls(None, (), ())
        carried = tuple(replace(f, uploaded=False) for f in restored.db_files)
        if restored.mode == "changelog":
            logs = restored.changelog_files
            sources = restored.changelog_sources
            if sources is None:  # written before they were recorded
                sources = derived_sources(logs, restored.partition)
            return cls(restored.materialization, carried,
                       tuple(replace(f, uploaded=False) for f in logs),
                       restored.pending_materialization, restored.slices,
                       tuple(replace(f, uploaded=False)
                             for f in restored.slice_files.values()), sources)
        # an incremental checkpoint is a materialization of itself (switching modes)
        return cls(restored.snapshot_ref, carried, ())

    @classmethod
    def continuing(cls, base: PartitionManifest | None, partition: int,
                   key_group_range: tuple[int, int]) -> Lineage:
        """The lineage partition ``partition`` (owning ``key_group_range``) continues from
        ``base``, the checkpoint its state was restored from.

        A base of another key-group range is a rescale's (the first overlapping old
        partition's checkpoint, maybe of this partition's number under the old layout):
        its changelogs, replayed before this partition's own, are in its directory, up to
        its checkpoint. Of another partition, its materialization in flight is not ours
        to adopt (its changelogs, replayed before this batch's, still are the state).
        """
        lineage = cls.of(base)
        if base is None:
            return lineage
        if base.partition != partition:
            lineage = lineage.without_pending()
        if base.partition != partition or \
                (base.key_group_start, base.key_group_end) != tuple(key_group_range):
            lineage = replace(lineage, changelog_sources=extended_sources(
                lineage.changelog_sources, base.partition, base.checkpoint_id))
        return lineage

    @property
    def materialized_id(self) -> int | None:
        return None if self.materialization is None else self.materialization.checkpoint_id

    @property
    def materialized_size(self) -> int:
        return sum(f.size for f in self.db_files)

    @property
    def changelog_size(self) -> int:
        return sum(f.size for f in self.changelogs)

    @property
    def slices_size(self) -> int:
        return sum(f.size for f in self.slice_files)

    def adopt(self, published: PartitionManifest) -> Lineage:
        """Take ``published`` (the pending materialization's manifest) as the new base.

        The changelogs up to its batch are subsumed; the ones after it stay.
        """
        ref = self.pending
        if ref is None or published.mode != "materialization" or \
                (published.checkpoint_id, published.attempt) != (ref.checkpoint_id, ref.attempt):
            raise ValueError(f"{published.path} is not the pending materialization {ref}")
        # rolling slices newer than the materialization still replace its key groups
        slices = tuple(s for s in self.slices if s.checkpoint_id > ref.checkpoint_id)
        names = {n for s in slices for n in s.file_names()}
        return Lineage(ref, tuple(replace(f, uploaded=False) for f in published.files),
                       tuple(c for c in self.changelogs
                             if changelog_id(c.name) > ref.checkpoint_id), None, slices,
                       tuple(f for f in self.slice_files if f.name in names),
                       self.changelog_sources)

    def without_pending(self) -> Lineage:
        return replace(self, pending=None)


def materialization_due(lineage: Lineage, checkpoint_id: int, own_changelog: int,
                        interval: int, ratio: float, inline_ratio: float = 0.0) -> bool:
    """Whether batch ``checkpoint_id`` starts a materialization (none may be pending):
    every batch with ``inline_ratio`` (``materialize_inline_ratio``) above 0, else after
    ``interval`` batches or changelogs over ``ratio`` of the materialized state."""
    if lineage.pending is not None:
        return False
    since = lineage.materialized_id
    if inline_ratio > 0 or since is None or checkpoint_id - since >= interval:
        return True
    grown = lineage.changelog_size + own_changelog
    return grown > max(MIN_CHANGELOG_BYTES, ratio * lineage.materialized_size)


def materialize_inline(lineage: Lineage, own_changelog: int) -> bool:
    """Whether batch's checkpoint should be a materialization taken in its critical path
    instead of a changelog (none may be pending).

    When a batch wrote at least as many changelog bytes as the state it started from (the
    first batch of a load, a rewrite of most keys), its new SST files are no bigger than
    its changelog: uploading them now costs the critical path no more, and spares the
    store a second copy of the same data and the next batches a background upload of it.
    """
    if lineage.pending is not None or own_changelog < MIN_CHANGELOG_BYTES:
        return False
    return own_changelog >= lineage.materialized_size + lineage.changelog_size


INLINE_SLACK_BYTES = 64 << 10
"""Allowance beyond ``materialize_inline_ratio`` times the changelog: the fixed part of a
flushed SST file (index, filter, properties: a few kB) makes a tiny batch's flush bigger
than twice its changelog."""


def small_enough_inline(snapshot: LocalSnapshot, lineage: Lineage, own_changelog: int,
                        ratio: float) -> bool:
    """Whether the materialization of ``snapshot`` costs the critical path so little more
    than the batch's changelog that it goes there (see :func:`materialize_inline`): new
    SST files at most ``ratio`` times the changelog plus :data:`INLINE_SLACK_BYTES` (0:
    never). The few kB of MANIFEST, OPTIONS and CURRENT go along, as in every incremental
    checkpoint.

    With level compaction most batches' snapshots differ from the last materialization by
    about the flushed memtable, the batch's own writes: uploading that instead of the
    changelog costs the batch the same, and the checkpoint then needs no changelog to replay
    and no background upload. Only a snapshot that also holds a compaction's rewrite goes
    to the background. New files are counted by name and size against the lineage's files
    (the upload itself compares checksums).
    """
    if ratio <= 0:
        return False
    durable = {f.name: f.size for f in lineage.db_files if f.shared}
    new = sum(f.size for f in snapshot.files if f.shared and durable.get(f.name) != f.size)
    return new <= ratio * own_changelog + INLINE_SLACK_BYTES


def try_adopt(store: DurableStore, lineage: Lineage, partition: int,
              checkpoint_id: int, interval: int,
              uploading: Callable[[MaterializationRef], bool] | None = None
              ) -> tuple[Lineage, str]:
    """Adopt the pending materialization when published; abandon it when too old.

    One read of durable storage, and only while a materialization is pending; a
    materialization manifest that does not read back whole is not adopted (pending, as
    if unpublished) rather than failing the checkpoint. Too old
    (:func:`pending_limit` batches) is not enough to abandon one that ``uploading`` says
    a live process of this machine is still uploading: a large state's materialization
    may take longer than that many short batches, and abandoning it would throw its
    upload away and start another as long.

    Returns
    -------
    tuple of (Lineage, str)
        The lineage to build on and what happened (``none``, ``adopted``, ``pending``,
        ``abandoned``).
    """
    ref = lineage.pending
    if ref is None:
        return lineage, "none"
    try:
        published = read_manifest(store, ref.path(partition))
    except FileNotFoundError:
        published = None
    except CorruptStateError as exc:
        # not a base yet, so nothing is lost: on a store whose writes are not all or
        # nothing it may be half-written (read again next batch); abandoned if it stays
        log.warning("partition %d checkpoint %d: materialization %d unreadable (%s); "
                    "not adopted", partition, checkpoint_id, ref.checkpoint_id, exc)
        published = None
    if published is None:
        if checkpoint_id - ref.checkpoint_id > pending_limit(interval) and not (
                uploading is not None and uploading(ref)):
            log.warning("partition %d: materialization of checkpoint %d (attempt %s) never "
                        "published; abandoning it", partition, ref.checkpoint_id, ref.attempt)
            return lineage.without_pending(), "abandoned"
        log.debug("partition %d checkpoint %d: materialization %d still pending",
                  partition, checkpoint_id, ref.checkpoint_id)
        return lineage, "pending"
    log.debug("partition %d checkpoint %d: materialization %d adopted", partition,
              checkpoint_id, ref.checkpoint_id)
    return lineage.adopt(published), "adopted"


# --- checksums of the files of earlier snapshots ---------------------------------------------

# A snapshot's files are hard links to the instance's immutable SST files, so the file a
# materialization reuses is, in a process that keeps its instance open, the very inode an
# earlier snapshot of this process uploaded or checked. Its checksum is known: reading the
# whole state again for a CRC pass per materialization (0.1-1.8 s at 500 MB, the
# materialization thread's third cost) is only needed for a file this process has not seen
# (another process's directory, a restore). The key is what identifies the bytes of a file
# nobody rewrites in place: device, inode, size and modification time.
_CHECKSUMS: OrderedDict[tuple[int, int, int, int], str] = OrderedDict()
_CHECKSUMS_LOCK = threading.Lock()
CHECKSUM_CACHE_ENTRIES = 65_536


def _stat_key(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def remember_checksum(path: str, checksum: str) -> None:
    """Record the checksum of the file at ``path`` as it is now."""
    key = _stat_key(path)
    with _CHECKSUMS_LOCK:
        _CHECKSUMS[key] = checksum
        _CHECKSUMS.move_to_end(key)
        while len(_CHECKSUMS) > CHECKSUM_CACHE_ENTRIES:
            _CHECKSUMS.popitem(last=False)


def known_checksum(path: str) -> str:
    """The checksum of the file at ``path``: remembered for its inode, else computed."""
    key = _stat_key(path)
    with _CHECKSUMS_LOCK:
        known = _CHECKSUMS.get(key)
        if known is not None:
            _CHECKSUMS.move_to_end(key)
            return known
    checksum = file_crc32(path)[1]
    remember_checksum(path, checksum)
    return checksum


# --- the background upload ------------------------------------------------------------------

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            # one thread per worker process: materializations of several partitions queue
            # rather than compete with the tasks for the machine's bandwidth
            _POOL = ThreadPoolExecutor(1, thread_name_prefix="sb-materialize")
        return _POOL


BACKGROUND_FILES = 4
"""Files a background materialization uploads at once, between two waits for the
critical path."""


def upload_materialization(store: DurableStore, snapshot: LocalSnapshot,
                           base_files: Sequence[FileEntry], *,
                           key_group_range: tuple[int, int], max_parallelism: int,
                           states: Sequence[StateDescriptor] = (),
                           background: bool = True) -> PartitionManifest:
    """Upload ``snapshot``'s files not already durable in ``base_files`` and publish
    ``_MATERIALIZED.json`` (last, atomically: invariant 3).

    ``background``: :data:`BACKGROUND_FILES` at a time, none started while a
    critical-path upload of the process runs (:mod:`~statebackend.storage.priority`); else
    all at once, in parallel (a materialization in a batch's critical path).
    """
    t0 = time.perf_counter()
    n, p, attempt = snapshot.checkpoint_id, snapshot.partition, snapshot.attempt
    adir = attempt_dir(n, p, attempt)
    base = {f.name: f for f in base_files if f.shared}
    entries: dict[str, FileEntry] = {}
    uploads = []
    for f in snapshot.files:
        local = os.path.join(snapshot.directory, f.name)
        b = base.get(f.name)
        if f.shared and b is not None and b.size == f.size and \
                known_checksum(local) == b.checksum:
            entries[f.name] = replace(b, uploaded=False)
        else:
            uploads.append((f, local, check_relative(f"{adir}/{MATERIALIZED_PREFIX}{f.name}")))
    log.debug("materialization %d partition %d: %d file(s) reused after CRC (%.3f s), "
              "%d to upload", n, p, len(entries), time.perf_counter() - t0, len(uploads))
    if background:
        transfers, yielded = _upload_in_background(store, uploads, n, p)
    else:
        transfers, yielded = store.put_files([(local, path) for _f, local, path in uploads]), 0.0
    for (f, local, _path), t in zip(uploads, transfers):
        if t.size != f.size:
            raise OSError(f"materialization {n} partition {p}: {f.name} changed while "
                          f"uploading ({f.size} -> {t.size} bytes)")
        remember_checksum(local, t.checksum)
        entries[f.name] = FileEntry(f.name, t.path, t.size, t.checksum, shared=f.shared,
                                    uploaded=True)
    manifest = PartitionManifest(
        operator_id=snapshot.operator_id, partition=p, checkpoint_id=n, attempt=attempt,
        key_group_start=key_group_range[0], key_group_end=key_group_range[1],
        max_parallelism=max_parallelism,
        files=tuple(entries[f.name] for f in snapshot.files), states=tuple(states),
        created_at_ms=int(time.time() * 1000), mode="materialization")
    manifest = manifest.with_metrics(
        bytes_uploaded=sum(t.size for t in transfers), files_uploaded=len(transfers),
        files_reused=len(snapshot.files) - len(transfers),
        async_duration_s=round(time.perf_counter() - t0, 6),
        yielded_to_critical_path_s=round(yielded, 6))
    store.put_bytes_atomic(manifest.path, manifest.to_json().encode())
    log.info("materialization %d partition %d attempt %s: uploaded %d file(s), %d bytes",
             n, p, attempt, len(transfers), sum(t.size for t in transfers))
    return manifest


def _upload_in_background(store: DurableStore, uploads: list, n: int, p: int
                          ) -> tuple[list, float]:
    """Upload ``(file, local, path)`` triples :data:`BACKGROUND_FILES` at a time, each group
    after the process's critical-path uploads and on the store's background threads; the
    transfers and the seconds waited."""
    transfers, yielded = [], 0.0
    for i in range(0, len(uploads), BACKGROUND_FILES):
        group = uploads[i:i + BACKGROUND_FILES]
        w = yield_to_critical_path()
        yielded += w
        t1 = time.perf_counter()
        transfers.extend(store.put_files([(local, path) for _f, local, path in group],
                                         background=True))
        log.debug("materialization %d partition %d: %s (%d bytes) waited %.3f s, "
                  "uploaded in %.3f s", n, p, ",".join(f.name for f, _l, _p in group),
                  sum(f.size for f, _l, _p in group), w, time.perf_counter() - t1)
    return transfers, yielded


def inflight_marker(copy_dir: str) -> str:
    return copy_dir + INFLIGHT_SUFFIX


def materialize_in_background(store: DurableStore, snapshot: LocalSnapshot,
                              base_files: Sequence[FileEntry], *,
                              key_group_range: tuple[int, int], max_parallelism: int,
                              states: Sequence[StateDescriptor] = ()
                              ) -> Future[PartitionManifest | None]:
    """Queue :func:`upload_materialization` on this process's materialization thread.

    The local snapshot directory is marked in flight (so no task prunes it) until the
    upload ends; a failure is logged and leaves the materialization pending, to be
    abandoned by a later checkpoint.
    """
    marker = inflight_marker(snapshot.directory)
    with open(marker, "w") as fh:
        fh.write(str(os.getpid()))

    queued = time.perf_counter()
    log.debug("materialization %d partition %d: queued", snapshot.checkpoint_id,
              snapshot.partition)

    def run() -> PartitionManifest | None:
        log.debug("materialization %d partition %d: started after %.3f s in the queue",
                  snapshot.checkpoint_id, snapshot.partition, time.perf_counter() - queued)
        try:
            return upload_materialization(store, snapshot, base_files,
                                          key_group_range=key_group_range,
                                          max_parallelism=max_parallelism, states=states)
        except Exception:  # noqa: BLE001 - a background failure only delays materialization
            log.warning("materialization %d partition %d failed", snapshot.checkpoint_id,
                        snapshot.partition, exc_info=True)
            return None
        finally:
            try:
                os.unlink(marker)
            except OSError:
                pass

    return _pool().submit(run)


def wait_for_materializations() -> None:
    """Block until this process's queued materializations have finished (tests, shutdown)."""
    with _POOL_LOCK:
        pool = _POOL
    if pool is not None:
        pool.submit(lambda: None).result()
