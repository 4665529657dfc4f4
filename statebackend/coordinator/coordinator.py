"""The checkpoint coordinator: completes checkpoints, applies retention, deletes files.

It runs on the driver, one per stateful operator, around the pure
:class:`~statebackend.coordinator.registry.SharedStateRegistry`. Everything durable it reads
or writes lives under ``<store root>/<operator_id>/``::

    chk-<n>/p<p>/<attempt>/...          uploads and manifests (written by tasks)
    _checkpoints/chk-<n>.json           completed-checkpoint records (written here)
    _pins/chk-<n>                       pin markers (written here)
    _gc/swept.json                      sweep watermark (written here)

Safety argument (invariants 4-6)
--------------------------------
*What can reference a file.* A completed record references the files of its chosen
manifests. A task of checkpoint ``m`` restores from checkpoint ``m - 1``: from its record,
or, before that record exists, from any published attempt of ``m - 1``; its manifest then
lists files of that base manifest plus its own uploads (a manifest lists *all* its files,
not a delta). So when ``L`` is the latest completed checkpoint, every file an in-flight
checkpoint can still reference is (a) referenced by a retained record, (b) listed by a
published manifest of ``L`` (any attempt: the *protected* set), or (c) under ``chk-<m>/``
for some ``m > L``.

*What is deleted.* Only files that are none of (a), (b), (c):

1. files of subsumed checkpoints that no retained record references and are not
   protected: enumerated from the subsumed record, so no listing is needed;
2. files found by bounded *sweeps* of ``chk-<k>/`` for ``W <= k < L`` (one listing per
   checkpoint id): failed attempts, attempts that died before publishing, aborted and
   skipped checkpoints. ``W``, the sweep watermark, moves past ``k`` only once ``chk-<k>/``
   holds nothing but files retained records reference, and is persisted, so each
   directory is swept a bounded number of times and no step lists the whole store.

*Crash safety: recomputation, not a pending-deletions log.* The record of checkpoint ``n``
is written (atomically) before anything that depends on it. A subsumed checkpoint's
record is deleted only after all of its unreferenced files are gone (data files first,
then its manifests, then the record), and the watermark is persisted only after its
sweeps. Hence after a crash at any step, the records still present, the pins and ``W``
say exactly what is left to do: :meth:`CheckpointCoordinator.rebuild` derives the registry
from them and runs the same idempotent collection again. A file protected only by (b)
keeps its subsumed record (or holds ``W`` back) until the protection ends, so it is never
forgotten.

*Late attempts.* An attempt that publishes after its checkpoint completed is never chosen
by the coordinator. Before writing a record, :meth:`CheckpointCoordinator.try_complete`
verifies that every file of every chosen manifest exists, so a manifest that referenced a
file already deleted (a task that restored from a straggler) is rejected as a failed
attempt rather than recorded.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from .. import keygroups
from ..checkpoint.fencing import (
    check_owner,
    epoch_path,
    fenced_error,
    held_before,
    list_epochs,
    read_epoch,
)
from ..checkpoint.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    MANIFEST_NAME,
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
    checkpoint_dir,
    choose_manifest,
    completed_record_path,
    latest_pointer,
    manifest_digest,
    parse_latest_pointer,
)
from ..errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptStateError,
    IncompatibleStateError,
    UnsafePathError,
)
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from .registry import RegisteredCheckpoint, SharedStateRegistry, referenced_paths

__all__ = [
    "CheckpointCoordinator",
    "CheckpointInfo",
    "GcReport",
    "RestorePoint",
    "key_group_range",
    "listed_records",
    "read_latest_record",
    "require_completed_record",
]

log = logging.getLogger(__name__)

PINS_DIR = "_pins"
GC_DIR = "_gc"
WATERMARK_PATH = f"{GC_DIR}/swept.json"

_RECORD_NAME = re.compile(r"^chk-(\d+)\.json$")
_PIN_NAME = re.compile(r"^chk-(\d+)$")


def key_group_range(partition: int, parallelism: int, max_parallelism: int) -> tuple[int, int]:
    """Inclusive key-group range ``(start, end)`` owned by ``partition`` of ``parallelism``
    (:func:`statebackend.keygroups.key_group_range` as the tuple manifests record)."""
    r = keygroups.key_group_range(partition, parallelism, max_parallelism)
    return r.start, r.end


def _records_in(names: Iterable[str]) -> dict[int, str]:
    out = {}
    for rel in names:
        m = _RECORD_NAME.match(rel.rsplit("/", 1)[-1])
        if m and rel == completed_record_path(int(m.group(1))):
            out[int(m.group(1))] = rel
    return out


def _manifests_by_partition(listing: Iterable[str]) -> dict[int, list[str]]:
    """Manifest paths (``chk-<n>/p<p>/<attempt>/_MANIFEST.json``) of a listing, by partition."""
    out: dict[int, list[str]] = {}
    for rel in listing:
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] == MANIFEST_NAME and parts[1][:1] == "p" \
                and parts[1][1:].isdigit():
            out.setdefault(int(parts[1][1:]), []).append(rel)
    return out


def _parse_or_error(raw: bytes | PartitionManifest | Exception | None, where: str
                    ) -> PartitionManifest | Exception | None:
    """A manifest parsed from ``raw`` (passed through when already parsed or missing), or
    the error that parsing raised (handed to the caller's thread)."""
    if raw is None or isinstance(raw, (PartitionManifest, Exception)):
        return raw
    try:
        return PartitionManifest.from_json(raw, where=where)
    except (CorruptStateError, UnsafePathError) as exc:
        return exc


def listed_records(store: DurableStore, operator_id: str) -> dict[int, str]:
    """Checkpoint id -> path (relative to the operator) of every completed-checkpoint
    record of an operator, from one listing of its ``_checkpoints/`` directory (the
    retained records plus at most a few being discarded)."""
    prefix = f"{check_component(operator_id)}/"
    return _records_in(p[len(prefix):] for p in store.list_dir(prefix + CHECKPOINTS_DIR))


def completed_ids(ostore: DurableStore) -> list[int]:
    """Sorted ids of the completed-checkpoint records under an operator's own store (one
    listing of its ``_checkpoints/``)."""
    return sorted(_records_in(ostore.list_dir(CHECKPOINTS_DIR)))


def read_latest_record(store: DurableStore, operator_id: str) -> CompletedCheckpoint | None:
    """The newest completed-checkpoint record of an operator, or None (for restoring tasks).

    Raises
    ------
    CorruptStateError
        ``_checkpoints/LATEST.json`` names a newer checkpoint whose record is missing (a
        reader would otherwise silently serve the one before it).
    """
    prefix = f"{check_component(operator_id)}/"
    listed = listed_records(store, operator_id)
    newest = read_latest_pointer(store, prefix)
    if newest is not None and newest > max(listed, default=-1):
        # a coordinator may have written that record and the pointer after our listing
        listed = listed_records(store, operator_id)
        if newest not in listed:
            raise missing_latest(newest, f"{store.root}/{operator_id}")
    for _n, rel in sorted(listed.items(), reverse=True):
        try:
            return CompletedCheckpoint.from_json(store.get_bytes(prefix + rel), where=rel)
        except FileNotFoundError:
            continue  # discarded between the listing and the read; an older one is newer now
    return None


def read_latest_pointer(store: DurableStore, prefix: str) -> int | None:
    """The newest completed checkpoint id as ``_checkpoints/LATEST.json`` says (None:
    none written yet)."""
    try:
        return parse_latest_pointer(store.get_bytes(prefix + LATEST_PATH))
    except FileNotFoundError:
        return None


def missing_latest(checkpoint_id: int, where: str) -> CorruptStateError:
    rel = completed_record_path(checkpoint_id)
    return CorruptStateError(
        f"{rel}: the record of checkpoint {checkpoint_id}, the newest completed one "
        f"({LATEST_PATH} says so), is missing under {where}; older records would serve an "
        f"older state. Restore the record from a backup, or let the query's next start "
        f"rebuild it from the checkpoint's manifests", checkpoint_id=checkpoint_id, path=rel)


def require_completed_record(store: DurableStore, operator_id: str,
                             checkpoint_id: int | None = None) -> CompletedCheckpoint:
    """The record of completed checkpoint ``checkpoint_id`` (default: the latest) of an
    operator, for the readers of a checkpoint (savepoints, read_state, metrics).

    Raises
    ------
    CheckpointNotFoundError
        The operator has no completed checkpoint, or none with that id is retained.
    """
    from ..storage.manifests import operator_store, read_completed_record

    if checkpoint_id is None:
        record = read_latest_record(store, operator_id)
        if record is None:
            raise CheckpointNotFoundError(f"operator {operator_id!r} has no completed "
                                          f"checkpoint under {store.root}")
        return record
    record = read_completed_record(operator_store(store, operator_id), checkpoint_id)
    if record is None:
        raise CheckpointNotFoundError(
            f"checkpoint {checkpoint_id} of operator {operator_id!r} is not a retained "
            f"completed checkpoint (no {completed_record_path(checkpoint_id)} under "
            f"{store.root}/{operator_id})")
    return record


@dataclass(frozen=True)
class CheckpointInfo:
    """One restore point, as :meth:`CheckpointCoordinator.list_completed` shows it."""

    checkpoint_id: int
    parallelism: int
    full_size: int
    incremental_size: int
    created_at_ms: int
    pinned: bool


@dataclass(frozen=True)
class RestorePoint:
    """A retained checkpoint and its chosen manifests, ready for restore tasks."""

    record: CompletedCheckpoint
    manifests: Mapping[int, PartitionManifest]


@dataclass
class GcReport:
    """What one :meth:`CheckpointCoordinator.collect_garbage` run did."""

    deleted: list[str] = field(default_factory=list)
    forgotten: list[int] = field(default_factory=list)
    swept: list[int] = field(default_factory=list)
    watermark: int | None = None


class _RecordVanished(Exception):
    """Retention moved while the registry was being rebuilt: a checkpoint listed as
    retained lost its manifest because another coordinator completed a newer one."""


class CheckpointCoordinator:
    """Driver-side completion, retention and garbage collection of one operator's checkpoints.

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root; this operator's files live under ``operator_id/``.
    operator_id : str
        The operator's directory name.
    parallelism, max_parallelism : int
        Partitions of the checkpoints completed from now on, and key groups (fixed).
    num_retained : int
        Completed checkpoints kept (pinned ones come on top). At least 1.
    background_gc : bool
        When True, deletions run on one background thread after each completion instead
        of inside :meth:`try_complete`; :meth:`close` waits for them.
    clock : callable
        Seconds since the epoch, for record times (tests pass a fake one).
    rebuild : bool
        Rebuild the registry from durable records now (the normal case; tests turn it off
        to inspect a half-done state).
    fencing : bool
        Complete, retain and delete only as the owner of the location
        (:mod:`statebackend.checkpoint.fencing`): before each of these steps, one HEAD
        proves that no newer writer epoch exists. A completion for a run
        (:meth:`try_complete`'s ``run_id``, which the listener passes) whose run was
        fenced raises :class:`~statebackend.errors.WriterFencedError`; one for no run in
        particular (planning, a manual ``complete()``) follows the newest writer,
        rebuilding its registry first when that changed.

    Notes
    -----
    Methods are thread-safe: one lock serialises completion, pins and each bounded step
    of garbage collection, so a file is never judged unreferenced while a completion that
    references it is being verified.
    """

    def __init__(self, store: DurableStore, operator_id: str, parallelism: int,
                 max_parallelism: int, num_retained: int = 3, *, background_gc: bool = False,
                 clock: Callable[[], float] = time.time, rebuild: bool = True,
                 fencing: bool = True) -> None:
        if parallelism < 1 or max_parallelism < parallelism:
            raise IncompatibleStateError(
                f"need 1 <= parallelism <= max_parallelism, got parallelism={parallelism}, "
                f"max_parallelism={max_parallelism}")
        self.store = store
        self.operator_id = check_component(operator_id)
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.num_retained = num_retained
        self._clock = clock
        self._lock = threading.RLock()
        self._registry = SharedStateRegistry(num_retained)
        self._watermark: int | None = None
        # Published manifests read so far, by checkpoint id then path: the protected set
        # is made from those of the latest checkpoint, so they are not read twice.
        self._published: dict[int, dict[str, PartitionManifest]] = {}
        self._digests: dict[str, str] = {}  # manifest path -> digest of the bytes read
        # The listing of chk-<latest>/ taken when it completed: the protected set is made
        # from it instead of listing again at every collection.
        self._listings: dict[int, frozenset[str]] = {}
        #: Requests of the last completion (listing, manifest reads, record), when the
        #: store counts them (None otherwise). Includes background GC running meanwhile.
        self.last_completion_requests: RequestCounts | None = None
        self._pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gc-{operator_id}")
            if background_gc else None)
        self._gc_future: Future[GcReport] | None = None
        self._gc_again = False
        self.fencing = fencing
        # the writer epoch this coordinator last acted under, and the run it acts for
        # the carrier plan's carry-over of partitions that ran no task in a committed
        # micro-batch (statebackend.checkpoint.carry.carry_on_driver), set by the backend
        self.carry: Callable[..., list[int]] | None = None
        self._epoch: int | None = None
        self._epoch_run: str | None = None  # the run that holds self._epoch
        if rebuild:
            with self._lock:
                self._act_as_owner()  # the writer the records below were written under
            self.rebuild()

    # --- paths ------------------------------------------------------------------------

    def _abs(self, rel: str) -> str:
        return f"{self.operator_id}/{rel}"

    def _list(self, rel_dir: str) -> list[str]:
        prefix = f"{self.operator_id}/"
        return [p[len(prefix):] for p in self.store.list_dir(self._abs(rel_dir))
                if p.startswith(prefix)]

    def _delete(self, rels: Iterable[str]) -> list[str]:
        rels = sorted(set(rels))
        if rels:
            self._check_owner()
            self.store.delete([self._abs(r) for r in rels])
        return rels

    # --- fencing ------------------------------------------------------------------------

    def _check_owner(self) -> None:
        """Before a record is written or a file deleted: the epoch acted under is still
        the newest (one HEAD)."""
        if self.fencing and self._epoch:  # 0: no writer has claimed the location yet
            check_owner(self.store, self._epoch, f"{self.operator_id}/")

    def _act_as_owner(self, run_id: str | None = None) -> None:
        """Resolve the epoch to act under (under the lock), before a completion or a
        collection: run ``run_id``'s (WriterFencedError when a newer run took over), or
        the newest writer's for no run in particular. Costs one HEAD while the epoch stays
        the newest; after a takeover, a listing, a few small reads and a rebuild of the
        registry (the older writer may have completed checkpoints since this coordinator
        read the records)."""
        if not self.fencing:
            return
        prefix = f"{self.operator_id}/"
        if (self._epoch is not None and run_id in (None, self._epoch_run)
                and not self.store.exists(prefix + epoch_path(self._epoch + 1))):
            return
        epochs = list_epochs(self.store, prefix)
        latest = read_epoch(self.store, epochs[-1], prefix) if epochs else None
        if latest is None:
            self._epoch = 0  # no writer has claimed the location yet: HEAD epoch 1 next
            return
        if run_id is not None and latest.run_id != run_id:
            held = held_before(self.store, epochs[:-1], run_id, prefix)
            if held is not None:
                raise fenced_error(f"{self.store.root}/{self.operator_id}", held, latest)
        moved = self._epoch is not None and latest.epoch != self._epoch
        self._epoch, self._epoch_run = latest.epoch, latest.run_id
        if moved:
            log.info("operator %s: %s took the location over; reading the completed "
                     "checkpoints again", self.operator_id, latest.describe())
            self.rebuild(collect=False)

    # --- registry access ----------------------------------------------------------------

    @property
    def registry(self) -> SharedStateRegistry:
        """The current registry (an immutable value)."""
        return self._registry

    @property
    def watermark(self) -> int | None:
        """Every ``chk-<k>/`` with ``k`` below it has been swept."""
        return self._watermark

    # --- completion ---------------------------------------------------------------------

    def try_complete(self, checkpoint_id: int, *, committed: bool = True,
                     run_id: str | None = None) -> CompletedCheckpoint | None:
        """Complete checkpoint ``checkpoint_id`` if every partition has published it.

        Lists only the partition directories ``chk-<n>/p<p>/``, chooses one valid
        manifest per partition with :func:`~statebackend.checkpoint.manifest.choose_manifest`
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
            self._act_as_owner(run_id)
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
        by_partition = _manifests_by_partition(listing)
        self._read_published_many(checkpoint_id, sorted(
            rel for rels in by_partition.values() for rel in rels))
        chosen: dict[int, PartitionManifest] = {}
        for p in range(self.parallelism):
            m = self._choose(checkpoint_id, p, by_partition.get(p, []), listing)
            if m is None:
                return None
            chosen[p] = m
        ms = list(chosen.values())
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
            manifest_digests={p: self._digests[m.path] for p, m in chosen.items()
                              if m.path in self._digests})
        # The commit point: once the record is durable the checkpoint is complete, and
        # a crash from here on is finished by rebuild() from this record.
        self._check_owner()
        self.store.put_bytes_atomic(self._abs(record.path), record.to_json().encode())
        self.store.put_bytes_atomic(self._abs(LATEST_PATH), latest_pointer(checkpoint_id))
        self._registry = reg.register(RegisteredCheckpoint.of(record, ms))
        for n in [n for n in self._published if n < checkpoint_id]:
            for rel in self._published.pop(n):
                self._digests.pop(rel, None)
        self._listings = {checkpoint_id: listing}
        counts1 = self.store.request_counts()
        if counts0 is not None and counts1 is not None:
            self.last_completion_requests = counts1 - counts0
        return record

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
        self._check_owner()
        self.store.put_bytes_atomic(self._abs(record.path), record.to_json().encode())
        self._registry = self._registry.mark_committed(record.checkpoint_id)
        return record

    def anything_published(self, checkpoint_id: int) -> bool:
        """Whether any attempt of any partition wrote anything for ``checkpoint_id`` (one
        bounded listing of that checkpoint's directory)."""
        return bool(self._list(checkpoint_dir(checkpoint_id)))

    def _read_published_many(self, checkpoint_id: int, rels: list[str]) -> None:
        """Read (in parallel) the manifests among ``rels`` not read before."""
        cache = self._published.setdefault(checkpoint_id, {})
        todo = [rel for rel in rels if rel not in cache]
        if len(todo) > 1:
            # parsed in the reading threads, while other reads still wait for the store
            parsed = self.store.get_bytes_many([self._abs(r) for r in todo],
                                               then=self._digest_and_parse)
            for rel, m in zip(todo, parsed):
                self._parse_published(checkpoint_id, rel, m)

    def _digest_and_parse(self, path: str, raw: bytes | None
                          ) -> PartitionManifest | Exception | None:
        """In a reading thread: remember the digest of a manifest's bytes (the record of
        its checkpoint keeps it), then parse it."""
        rel = path[len(self.operator_id) + 1:]
        if raw is not None:
            self._digests[rel] = manifest_digest(raw)
        return _parse_or_error(raw, rel)

    def _choose(self, checkpoint_id: int, partition: int, rels: list[str],
                listing: frozenset[str]) -> PartitionManifest | None:
        valid = []
        for rel in sorted(rels):
            m = self._read_published(checkpoint_id, rel)
            if m is None:
                continue
            if not self._check_compatible(m, partition):
                continue
            missing = self._missing_files(m, listing)
            if missing:
                log.warning("attempt %s of checkpoint %d partition %d references missing "
                            "files %s; treating it as failed", m.attempt, checkpoint_id,
                            partition, missing[:5])
                continue
            valid.append(m)
        return choose_manifest(valid) if valid else None

    def _read_published(self, checkpoint_id: int, rel: str) -> PartitionManifest | None:
        cache = self._published.setdefault(checkpoint_id, {})
        if rel in cache:
            return cache[rel]
        try:
            raw = self.store.get_bytes(self._abs(rel))
        except FileNotFoundError:
            raw = None
        return self._parse_published(checkpoint_id, rel,
                                     self._digest_and_parse(self._abs(rel), raw))

    def _parse_published(self, checkpoint_id: int, rel: str,
                         raw: bytes | PartitionManifest | Exception | None
                         ) -> PartitionManifest | None:
        cache = self._published.setdefault(checkpoint_id, {})
        if raw is None:
            return None  # deleted (aborted) between the listing and the read
        try:
            m = _parse_or_error(raw, rel)
            if isinstance(m, Exception):
                raise m
        except (CorruptStateError, UnsafePathError) as exc:
            log.warning("ignoring unreadable manifest %s: %s", rel, exc)
            return None
        if m.path != rel or m.operator_id != self.operator_id:
            log.warning("ignoring manifest at %s: it describes operator %r path %s",
                        rel, m.operator_id, m.path)
            return None
        cache[rel] = m
        return m

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
            cache = self._published.get(checkpoint_id, {})
            paths = reg.checkpoints[checkpoint_id].record.manifests.values()
            if not all(p in cache for p in paths):
                return None
            return [cache[p] for p in paths]

    # --- restore points -----------------------------------------------------------------

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint's record, or None when there is none."""
        with self._lock:
            n = self._registry.latest_id
            return None if n is None else self._registry.checkpoints[n].record

    def list_completed(self) -> list[CheckpointInfo]:
        """The retained checkpoints (restore points), oldest first, with sizes and times."""
        with self._lock:
            reg = self._registry
            return [CheckpointInfo(n, r.parallelism, r.full_size, r.incremental_size,
                                   r.created_at_ms, n in reg.pins)
                    for n in reg.retained_ids()
                    for r in [reg.checkpoints[n].record]]

    def get(self, checkpoint_id: int) -> CompletedCheckpoint:
        """The record of a retained checkpoint.

        Raises
        ------
        CheckpointNotFoundError
            The checkpoint is not complete, or no longer retained.
        """
        with self._lock:
            reg = self._registry
            if checkpoint_id not in reg.retained_ids():
                raise CheckpointNotFoundError(
                    f"checkpoint {checkpoint_id} of {self.operator_id} is not a retained "
                    f"completed checkpoint; retained: {reg.retained_ids()}")
            return reg.checkpoints[checkpoint_id].record

    def restore(self, checkpoint_id: int | None = None, *, verify: bool = True) -> RestorePoint:
        """Read a retained checkpoint's chosen manifests (the latest one by default).

        To continue a query from a checkpoint older than the latest, :meth:`pin` it first
        so retention keeps it until a checkpoint built on it completes.

        Parameters
        ----------
        checkpoint_id : int, optional
            Defaults to the latest completed checkpoint.
        verify : bool
            Also check that every referenced file exists with its recorded size.

        Raises
        ------
        CheckpointNotFoundError
            No such retained checkpoint.
        CorruptStateError
            A manifest or file is missing or has the wrong size.
        """
        if checkpoint_id is None:
            rec = self.latest()
            if rec is None:
                raise CheckpointNotFoundError(f"operator {self.operator_id} has no completed "
                                              f"checkpoint")
        else:
            rec = self.get(checkpoint_id)
        manifests = {}
        items = sorted(rec.manifests.items())
        raws = self.store.get_bytes_many([self._abs(rel) for _p, rel in items])
        for (p, rel), raw in zip(items, raws):
            if raw is None:
                raise CorruptStateError(f"checkpoint {rec.checkpoint_id}: manifest {rel} of "
                                        f"partition {p} is missing", path=rel, partition=p,
                                        checkpoint_id=rec.checkpoint_id)
            m = PartitionManifest.from_json(raw, where=rel)
            rec.check_manifest(p, m, raw, rel)
            if verify:
                sizes = self.store.sizes([self._abs(f.path) for f in m.files])
                for f, got in zip(m.files, sizes):
                    if got != f.size:
                        raise CorruptStateError(
                            f"checkpoint {rec.checkpoint_id} partition {p}: file {f.path} "
                            f"should have {f.size} bytes, found "
                            f"{'none' if got is None else got}", path=f.path, partition=p,
                            checkpoint_id=rec.checkpoint_id)
            manifests[p] = m
        return RestorePoint(rec, manifests)

    def pin(self, checkpoint_id: int) -> None:
        """Keep a retained checkpoint (and its files) until :meth:`unpin`; survives restarts."""
        with self._lock:
            new = self._registry.pin(checkpoint_id)  # validates before anything is written
            self.store.put_bytes_atomic(self._abs(f"{PINS_DIR}/chk-{checkpoint_id}"), b"")
            self._registry = new

    def unpin(self, checkpoint_id: int) -> None:
        """Let retention drop a pinned checkpoint again (no-op when it is not pinned)."""
        with self._lock:
            # Marker first: a crash after it leaves the checkpoint unpinned, which only
            # makes it eligible for deletion sooner, as the caller asked.
            self.store.delete([self._abs(f"{PINS_DIR}/chk-{checkpoint_id}")])
            self._registry = self._registry.unpin(checkpoint_id)
        self._after_change()

    def abort(self, checkpoint_id: int) -> list[str]:
        """Give up on the attempts of an uncompleted checkpoint published so far.

        Deletes the files under ``chk-<n>/`` that nothing retained or protected references
        (manifests first, so a half-done abort never leaves a manifest whose files are
        gone). Call it when no task of the checkpoint is running; a re-run of the same
        micro-batch may publish new attempts and complete the checkpoint later, and
        anything an attempt still running writes is swept once a newer checkpoint
        completes.

        Returns
        -------
        list of str
            Deleted paths (relative to the operator root).

        Raises
        ------
        CheckpointError
            The checkpoint is already complete.
        """
        with self._lock:
            if checkpoint_id in self._registry.checkpoints:
                raise CheckpointError(f"checkpoint {checkpoint_id} of {self.operator_id} is "
                                      f"complete and cannot be aborted; unpin it or let "
                                      f"retention drop it instead")
            protected = self._protected()
            listing = self._list(checkpoint_dir(checkpoint_id))
            doomed = [p for p in listing if not self._registry.is_referenced(p)
                      and p not in protected]
            deleted = self._delete(p for p in doomed if p.endswith("/" + MANIFEST_NAME))
            deleted += self._delete(p for p in doomed if not p.endswith("/" + MANIFEST_NAME))
            self._published.pop(checkpoint_id, None)
            return deleted

    # --- garbage collection -------------------------------------------------------------

    def _protected(self) -> frozenset[str]:
        """Files of every published attempt of the latest checkpoint (see module notes)."""
        latest = self._registry.latest_id
        if latest is None:
            return frozenset()
        # The listing taken when the latest checkpoint completed, not a new one: an attempt
        # of it published after its record was written is missing from it, but no task
        # restores from such an attempt (readers take the record's manifest once it
        # exists), so its files protect nothing; they are swept with the directory later.
        listing = self._listings.get(latest)
        if listing is None:  # after a rebuild: not listed since
            listing = frozenset(self._list(checkpoint_dir(latest)))
            self._listings[latest] = listing
        rels = sorted(r for rs in _manifests_by_partition(listing).values() for r in rs)
        self._read_published_many(latest, rels)
        for rel in rels:
            self._read_published(latest, rel)
        return referenced_paths(self._published.get(latest, {}).values())

    def collect_garbage(self) -> GcReport:
        """Delete what no retained checkpoint and no in-flight checkpoint can reference.

        Idempotent and resumable: each step is bounded (one checkpoint's files, or one
        listing of one ``chk-<k>/`` directory) and holds the coordinator's lock only for
        that step.

        Returns
        -------
        GcReport
        """
        report = GcReport()
        with self._lock:
            self._act_as_owner()
            latest = self._registry.latest_id
            if latest is None:
                return report
            protected = self._protected()
            start = self._watermark
            if start is None:
                start = min(self._registry.checkpoints)
        # Sweeps first: they move the watermark, and a crash before it is persisted only
        # repeats them.
        w: int | None = None
        # a materialization still uploading under chk-<j>/ holds sweeps below j
        bound = self._registry.sweep_bound(latest)
        for k in range(start, bound):
            with self._lock:
                reg = self._registry
                # Manifests of known subsumed checkpoints stay until their checkpoint is
                # forgotten: a rebuild needs them to find that checkpoint's files.
                kept = protected | {p for c in reg.subsumed_ids()
                                    for p in reg.checkpoints[c].record.manifests.values()}
                # A fresh listing, not the one taken at completion: it also finds what
                # attempts still running then wrote since (stragglers).
                listing = self._list(checkpoint_dir(k))
                doomed = [p for p in listing if not reg.is_referenced(p) and p not in kept]
                report.deleted += self._delete(doomed)
                report.swept.append(k)
                # Files only an attempt of the latest checkpoint references may become
                # garbage later: the watermark stays at the first such directory, so the
                # next collection sweeps it (and the ones after it) again.
                if w is None and any(p in protected and not reg.is_referenced(p)
                                     for p in listing):
                    w = k
        if w is None:
            w = max(start, bound)
        with self._lock:
            if w != self._watermark:
                self.store.put_bytes_atomic(self._abs(WATERMARK_PATH),
                                            json.dumps({"swept_below": w}).encode())
                self._watermark = w
            report.watermark = self._watermark
            subsumed = self._registry.subsumed_ids()
        for c in subsumed:
            with self._lock:
                reg = self._registry
                if c not in reg.subsumed_ids():
                    continue
                cp = reg.checkpoints[c]
                manifests = set(cp.record.manifests.values())
                free = reg.unreferenced_paths(c)
                blocked = free & protected
                report.deleted += self._delete(free - blocked - manifests)
                if blocked:
                    # Keep the manifests and the record: they are how a rebuild finds the
                    # blocked files once the latest checkpoint's attempts stop using them.
                    continue
                report.deleted += self._delete(free & manifests)
                self._delete([cp.record.path, f"{PINS_DIR}/chk-{c}"])
                self._registry = reg.forget(c)
                report.forgotten.append(c)
        return report

    def _after_change(self) -> None:
        if self._pool is None:
            self.collect_garbage()
            return
        with self._lock:
            if self._gc_future is not None and not self._gc_future.done():
                self._gc_again = True  # one more run after the current one, not one each
                return
            self._gc_future = self._pool.submit(self._background_gc)

    def _background_gc(self) -> GcReport:
        while True:
            try:
                report = self.collect_garbage()
            except Exception:  # noqa: BLE001 - the next completion retries it
                log.exception("background garbage collection of %s failed; it will be "
                              "retried after the next completion", self.operator_id)
                report = GcReport()
            with self._lock:
                if not self._gc_again:
                    return report
                self._gc_again = False

    def wait_for_gc(self) -> None:
        """Block until background garbage collection is idle (no-op without it)."""
        while True:
            with self._lock:
                fut = self._gc_future
            if fut is None:
                return
            fut.result()
            with self._lock:
                if self._gc_future is fut and fut.done():
                    return

    # --- rebuild ------------------------------------------------------------------------

    def rebuild(self, *, collect: bool = True) -> SharedStateRegistry:
        """Derive the registry from the durable records and pins, then finish pending work
        (unless ``collect`` is False).

        Reads ``_checkpoints/`` (the records), ``_pins/`` and the sweep watermark, and the
        manifests the records name. A record written but not applied before a crash is
        applied; deletions a crash interrupted are recomputed and run (in the background
        with ``background_gc``).

        Returns
        -------
        SharedStateRegistry

        Raises
        ------
        CorruptStateError
            A record is unreadable, or a retained checkpoint's manifest is missing.
        """
        with self._lock:
            records = {}
            listed = _records_in(self._list(CHECKPOINTS_DIR))
            for n, rel in listed.items():
                records[n] = CompletedCheckpoint.from_json(self.store.get_bytes(self._abs(rel)),
                                                           where=rel)
            pins = set()
            for rel in self._list(PINS_DIR):
                m = _PIN_NAME.match(rel.rsplit("/", 1)[-1])
                if m and int(m.group(1)) in records:
                    pins.add(int(m.group(1)))
                else:
                    self._delete([rel])  # stale: its checkpoint is gone
            # Retention depends only on ids and pins, so it is known before any manifest
            # is read; subsumed checkpoints may have lost manifests to a half-done deletion.
            probe = SharedStateRegistry.rebuild(
                self.num_retained,
                [RegisteredCheckpoint(r, frozenset()) for r in records.values()], pins)
            # only the promised ones must have their manifests: the checkpoint an
            # uncommitted latest keeps for a rerun may be gone (not corrupt)
            retained = set(probe.promised_ids())
            try:
                cps = [self._load(r, must_exist=r.checkpoint_id in retained, listed=listed)
                       for r in records.values()]
            except _RecordVanished:
                # another coordinator of this operator (an earlier backend object of this
                # driver still collecting garbage, say) applied retention since the
                # listing: its deletions are consistent, so read the records again
                return self._rebuild_again()
            self._registry = SharedStateRegistry.rebuild(self.num_retained, cps, pins)
            try:
                raw = self.store.get_bytes(self._abs(WATERMARK_PATH))
                self._watermark = int(json.loads(raw)["swept_below"])
            except FileNotFoundError:
                self._watermark = None
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptStateError(f"{WATERMARK_PATH} is malformed ({exc}); delete it "
                                        f"to sweep again from the oldest record",
                                        path=WATERMARK_PATH) from exc
            self._published.clear()
            self._digests.clear()
            self._listings.clear()
            self._recover_latest_record()
            reg = self._registry
        if records and collect:
            self._after_change()
        return reg

    def _recover_latest_record(self) -> None:
        """A record newer than every record listed was completed and is gone (deleted
        by hand, lost): complete it again from its published manifests (the same choice,
        so the same state), or refuse to go on from an older one (under the lock)."""
        newest = read_latest_pointer(self.store, f"{self.operator_id}/")
        latest = self._registry.latest_id
        if newest is None or newest <= (-1 if latest is None else latest):
            return
        if self.store.exists(self._abs(completed_record_path(newest))):
            # written by another coordinator after our listing: read at the next rebuild
            return
        log.warning("operator %s: the record of checkpoint %d, the newest completed one, is "
                    "missing; completing it again from its manifests", self.operator_id,
                    newest)
        if self._complete_locked(newest, committed=False) is None:
            raise missing_latest(newest, f"{self.store.root}/{self.operator_id}")

    def _load(self, record: CompletedCheckpoint, *, must_exist: bool,
              listed: dict[int, str]) -> RegisteredCheckpoint:
        manifests = []
        items = sorted(record.manifests.items())
        raws = self.store.get_bytes_many([self._abs(rel) for _p, rel in items])
        for (p, rel), raw in zip(items, raws):
            if raw is not None:
                m = PartitionManifest.from_json(raw, where=rel)
                record.check_manifest(p, m, raw, rel)
                manifests.append(m)
            elif must_exist:
                # Another coordinator of this operator (an earlier backend object of this
                # driver finishing its last completion) deletes a subsumed checkpoint's
                # manifests, then its record: if the records changed since they were
                # listed, the manifest went to retention, not to corruption.
                if (not self.store.exists(self._abs(record.path))
                        or _records_in(self._list(CHECKPOINTS_DIR)) != listed):
                    raise _RecordVanished(record.checkpoint_id)
                raise CorruptStateError(
                    f"retained checkpoint {record.checkpoint_id}: manifest {rel} of "
                    f"partition {p} is missing; restore from another retained checkpoint",
                    checkpoint_id=record.checkpoint_id, partition=p, path=rel)
            # else: a subsumed checkpoint loses its manifests only after all its other
            # unreferenced files are deleted, so nothing is lost by not reading them.
        if len(manifests) == len(items):
            return RegisteredCheckpoint.of(record, manifests)
        return RegisteredCheckpoint(
            record, referenced_paths(manifests) | frozenset(record.manifests.values()))

    def _rebuild_again(self) -> SharedStateRegistry:
        self._rebuild_attempts = getattr(self, "_rebuild_attempts", 0) + 1
        try:
            if self._rebuild_attempts > 5:
                raise CorruptStateError(
                    f"operator {self.operator_id}: completed checkpoints keep disappearing "
                    f"while the registry is rebuilt: is another driver running this query?")
            return self.rebuild()
        finally:
            self._rebuild_attempts -= 1

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for background garbage collection and stop its thread."""
        if self._pool is not None:
            self.wait_for_gc()
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> CheckpointCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
