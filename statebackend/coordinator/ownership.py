"""The coordinator's state, its paths, and the writer epoch it acts under.

:class:`_Owner` is the base of the coordinator's parts (completion, garbage collection,
rebuild): it declares the state they share and proves, before every completion and
deletion, that the location is still this writer's (invariant 10).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..checkpoint.fencing import (
    Owner,
    check_owner,
    fenced_error,
    resolve_owner,
    writer_history,
)
from ..errors import CorruptStateError, WriterFencedError
from ..model.manifest import PartitionManifest, WriterStamp
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from .records import GcReport
from .registry import SharedStateRegistry

log = logging.getLogger("statebackend.coordinator.coordinator")


class _Owner:
    """State and helpers shared by the parts of :class:`CheckpointCoordinator`."""

    store: DurableStore
    operator_id: str
    parallelism: int
    max_parallelism: int
    num_retained: int
    fencing: bool
    own_retention: bool
    last_completion_requests: RequestCounts | None
    _clock: Callable[[], float]
    _lock: threading.RLock
    _registry: SharedStateRegistry
    _watermark: int | None
    _initial_swept: bool
    _published: dict[int, dict[str, PartitionManifest]]
    _digests: dict[str, str]
    _listings: dict[int, frozenset[str]]
    _pool: ThreadPoolExecutor | None
    _gc_future: Future[GcReport] | None
    _gc_again: bool
    _epoch: int | None
    _epoch_run: str | None
    _stamp: WriterStamp | None
    _history: dict[str, int]
    _damaged: dict[int, CorruptStateError]
    _damage_logged: frozenset
    _for_owner: bool
    _repairs_due: bool
    _not_owner_logged: set[str]

    if TYPE_CHECKING:
        def rebuild(self, *, collect: bool = True) -> SharedStateRegistry: ...
        def collect_garbage(self) -> GcReport: ...
        def _after_change(self) -> None: ...

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
        the newest (a listing of ``_writers/`` and a read of ``LATEST.json``)."""
        if self.fencing and self._epoch:  # 0: no writer has claimed the location yet
            check_owner(self.store, self._epoch, f"{self.operator_id}/")

    def _act_as_owner(self, run_id: str | None = None) -> bool:
        """Resolve the epoch to act under (under the lock), before a completion or a
        collection: run ``run_id``'s, or the newest writer's for no run in particular.

        The owner is the newest epoch in ``_writers/`` or in the records
        (:func:`~statebackend.checkpoint.fencing.resolve_owner`). Costs a listing and a read
        while the epoch stays the newest; after a takeover, a few small reads and a rebuild
        of the registry (the older writer may have completed checkpoints since this
        coordinator read the records). Acting for the owning run, it also makes the repairs
        a rebuild left to the owner (:meth:`_may_change`).

        Returns
        -------
        bool
            False when ``run_id`` never held an epoch of this location (its tasks were
            refused: another query owns it): such a coordinator changes nothing here.

        Raises
        ------
        WriterFencedError
            ``run_id`` held an older epoch: a newer run took the location over.
        """
        if not self.fencing:
            self._for_owner = True
            self._repair_if_due()
            return True
        prefix = f"{self.operator_id}/"
        if self._epoch is not None and run_id in (None, self._epoch_run):
            try:
                ptr = check_owner(self.store, self._epoch, prefix)
            except WriterFencedError:
                pass
            else:
                self._for_owner = run_id is not None or not self._epoch
                if ptr is not None and ptr.checkpoint_id > self._known_latest():
                    self._reread("another coordinator completed checkpoint "
                                 f"{ptr.checkpoint_id}")
                self._retain_for(self._for_owner)
                self._repair_if_due()
                return True
        owner = resolve_owner(self.store, prefix)
        latest = owner.writer
        if latest is None:
            self._epoch, self._epoch_run, self._stamp = 0, None, None  # nobody claimed it yet
            self._retain_for(True)
            self._repair_if_due()
            return True
        if run_id is not None and latest.run_id != run_id:
            self._refuse(run_id, owner)
            return False
        moved = self._epoch is not None and latest.epoch != self._epoch
        self._epoch, self._epoch_run, self._stamp = latest.epoch, latest.run_id, latest.stamp
        self._history = writer_history(self.store, owner, prefix)
        self._for_owner = run_id is not None
        if moved:
            self._reread(f"{latest.describe()} took the location over")
        self._retain_for(self._for_owner)
        self._repair_if_due()
        return True

    def _refuse(self, run_id: str, owner: Owner) -> None:
        """Run ``run_id`` is not the owner: fenced if it held an epoch, else (another
        query's run, refused at its tasks) logged once."""
        latest = owner.writer
        assert latest is not None
        held = owner.held_by(self.store, run_id, f"{self.operator_id}/")
        if held is not None:
            raise fenced_error(f"{self.store.root}/{self.operator_id}", held, latest)
        if run_id not in self._not_owner_logged:
            self._not_owner_logged.add(run_id)
            log.warning("operator %s: run %s never took a writer epoch of this location "
                        "(%s owns it); its coordinator completes, retains and deletes "
                        "nothing here", self.operator_id, run_id, latest.describe())

    def _may_change(self) -> bool:
        """Whether this coordinator may delete, apply retention and repair the location's
        metadata now (invariant 10: only the owner does): when it acts for the owning run,
        for a location no streaming query owns (a batch run's, or nobody's), without
        fencing, or for an operator's explicit command (``own_retention``). Acting for no
        run in particular on a streaming query's location (a restart's planning, which
        cannot know yet whether it is that query or another one, a reader, a savepoint), it
        only completes checkpoints the owner's tasks published (a restart starts from
        them; the record is the one the owner's coordinator writes) and leaves the rest to
        the owner's next completion."""
        if not self.fencing or self.own_retention or self._for_owner:
            return True
        return self._stamp is None or self._stamp.query_id is None

    def _repair_if_due(self) -> None:
        """Make the repairs a rebuild found and left to the owner (stale pins, a damaged
        ``LATEST.json``), now that this coordinator may (under the lock)."""
        if self._repairs_due and self._may_change():
            self._repairs_due = False
            self.rebuild(collect=False)

    def owns(self, run_id: str | None = None) -> bool:
        """Whether this coordinator may change the location for run ``run_id`` (None: for
        no run in particular, as the newest writer): False for a run that never held an
        epoch here (another query owns it).

        Raises
        ------
        WriterFencedError
            ``run_id`` held an older epoch.
        """
        with self._lock:
            return self._act_as_owner(run_id)

    def _known_latest(self) -> int:
        latest = self._registry.latest_id
        return -1 if latest is None else latest

    def _reread(self, why: str) -> None:
        """The records changed behind this coordinator's back: its registry is stale, and
        retention or a sweep on it could delete what a newer record names."""
        log.info("operator %s: %s; reading the completed checkpoints again",
                 self.operator_id, why)
        self.rebuild(collect=False)

    def _retain_for(self, owner_run: bool) -> None:
        """Retention applies this coordinator's ``num_retained`` when it acts for the
        owning run (or nobody owns the location); acting for no run in particular (a
        restart's planning, a manual call: possibly another query's coordinator) it never
        keeps fewer checkpoints than the owner's newest record says its writer keeps."""
        self._for_owner = owner_run
        want = self.num_retained
        latest = self._registry.latest_id
        if not owner_run and not self.own_retention and latest is not None:
            recorded = self._registry.checkpoints[latest].record.num_retained
            want = max(want, recorded or 0)
        if want != self._registry.num_retained:
            reg = self._registry
            self._registry = SharedStateRegistry.rebuild(want, reg.checkpoints.values(),
                                                         reg.pins)

    @property
    def writer_stamp(self) -> WriterStamp | None:
        """The writer this coordinator last acted as (None: no fencing, or no writer yet):
        what the manifests it publishes for the owner (the carrier's) carry."""
        with self._lock:
            return self._stamp if self.fencing and self._epoch else None

    # --- registry access ----------------------------------------------------------------

    @property
    def registry(self) -> SharedStateRegistry:
        """The current registry (an immutable value)."""
        return self._registry

    @property
    def watermark(self) -> int | None:
        """Every ``chk-<k>/`` with ``k`` below it has been swept."""
        return self._watermark
