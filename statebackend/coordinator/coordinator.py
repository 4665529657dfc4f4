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

Layout
------
:class:`CheckpointCoordinator` (here: construction, restore points, pins) is assembled
from one part per concern: :mod:`~statebackend.coordinator.completion` (choosing attempts,
writing records), :mod:`~statebackend.coordinator.garbage` (abort, sweeps, deletion of
subsumed checkpoints), :mod:`~statebackend.coordinator.rebuild` (the registry from the
records) and :mod:`~statebackend.coordinator.ownership` (the state they share: the lock,
the registry, paths). The state of one concern each is an object the coordinator holds:
:class:`~statebackend.coordinator.writer.WriterRole` (whom it acts as: the writer epoch,
its run and query, whether it may change the location),
:class:`~statebackend.coordinator.published.PublishedManifests` (the manifests read, their
digests, the latest checkpoint's listing) and
:class:`~statebackend.coordinator.background.BackgroundCollection` (the GC thread).
:mod:`~statebackend.coordinator.records` holds paths and result types; records are read
through :mod:`statebackend.storage.records`.
"""


from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from ..errors import CheckpointNotFoundError, CorruptStateError, IncompatibleStateError
from ..model.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
    check_component,
)
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from .background import BackgroundCollection
from .completion import _Completion
from .garbage import _Garbage
from .published import PublishedManifests
from .rebuild import _Rebuild
from .records import (
    PINS_DIR,
    CheckpointInfo,
    GcReport,
    RestorePoint,
    key_group_range,
)
from .registry import SharedStateRegistry
from .writer import WriterRole

__all__ = [
    "CheckpointCoordinator",
    "CheckpointInfo",
    "GcReport",
    "RestorePoint",
    "key_group_range",
]



class CheckpointCoordinator(_Completion, _Garbage, _Rebuild):
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
        (:mod:`statebackend.checkpoint.fencing`): before each of these steps, a listing
        of ``_writers/`` and a read of ``LATEST.json`` prove that no newer writer epoch
        exists. A completion for a run
        (:meth:`try_complete`'s ``run_id``, which the listener passes) whose run was
        fenced raises :class:`~statebackend.errors.WriterFencedError`; one for no run in
        particular (planning, a manual ``complete()``) follows the newest writer,
        rebuilding its registry first when that changed. A run that never held an epoch
        (its tasks were refused: another query owns the location) completes, retains and
        deletes nothing.
    own_retention : bool
        Apply ``num_retained`` also when acting for no run in particular (an operator's
        explicit ``statebackend gc --num-retained``). By default such a coordinator (a
        restart's planning, possibly another query's) never keeps fewer checkpoints than
        the owner's newest record says its writer keeps; the owner's own completions
        apply ``num_retained``.

    Notes
    -----
    Methods are thread-safe: one lock serialises completion, pins and each bounded step
    of garbage collection, so a file is never judged unreferenced while a completion that
    references it is being verified.
    """

    def __init__(self, store: DurableStore, operator_id: str, parallelism: int,
                 max_parallelism: int, num_retained: int = 3, *, background_gc: bool = False,
                 clock: Callable[[], float] = time.time, rebuild: bool = True,
                 fencing: bool = True, own_retention: bool = False) -> None:
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
        self._initial_swept = False  # the staged initial state, once per coordinator
        # published manifests read so far (and the listing of the latest checkpoint)
        self._published = PublishedManifests(store, self.operator_id)
        #: Requests of the last completion (listing, manifest reads, record), when the
        #: store counts them (None otherwise). Includes background GC running meanwhile.
        self.last_completion_requests: RequestCounts | None = None
        self._background = (BackgroundCollection(operator_id, self.collect_garbage)
                            if background_gc else None)
        self.fencing = fencing
        self.own_retention = own_retention
        # whom it acts as (the writer epoch, its run and query): statebackend.coordinator.writer
        self._writer = WriterRole(store, self.operator_id, fencing, own_retention)
        # retained checkpoints found damaged by the last rebuild: id -> the error
        self._damaged: dict[int, CorruptStateError] = {}
        self._damage_logged: frozenset = frozenset()
        self._repairs_due = False  # found by a rebuild, left to the owner (WriterRole.may_change)
        if rebuild:
            with self.planning():
                with self._lock:
                    self._act_as_owner()  # the writer the records below were written under
                self.rebuild()
    # --- restore points -----------------------------------------------------------------

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint's record, or None when there is none."""
        with self._lock:
            n = self._registry.latest_id
            return None if n is None else self._registry.checkpoints[n].record

    @property
    def damaged(self) -> dict[int, CorruptStateError]:
        """Retained checkpoints found damaged (id -> what is wrong), skipped until repaired:
        restoring one fails, garbage collection deletes nothing meanwhile."""
        with self._lock:
            return dict(self._damaged)

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

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """While a query is planned (and while this coordinator is built): acting for no
        run in particular, it completes what the owner's tasks published but deletes and
        repairs nothing on a streaming query's location, which may be another query's
        (:meth:`~statebackend.coordinator.writer.WriterRole.may_change`)."""
        with self._lock:
            before, self._writer.deferring = self._writer.deferring, True
        try:
            yield
        finally:
            with self._lock:
                self._writer.deferring = before

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for background garbage collection and stop its thread."""
        if self._background is not None:
            self._background.close()
            self._background = None

    def __enter__(self) -> CheckpointCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
