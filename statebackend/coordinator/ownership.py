"""The coordinator's state, its paths, and the writer it acts as.

:class:`_Owner` is the base of the coordinator's parts (completion, garbage collection,
rebuild): it declares the state they share and, through its
:class:`~statebackend.coordinator.writer.WriterRole`, proves before every completion and
deletion that the location is still this writer's (invariant 10).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..errors import CorruptStateError
from ..model.manifest import WriterStamp
from ..storage.accounting import RequestCounts
from ..storage.base import DurableStore
from .background import BackgroundCollection
from .published import PublishedManifests
from .records import GcReport
from .registry import SharedStateRegistry
from .writer import WriterRole

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
    _published: PublishedManifests
    _background: BackgroundCollection | None
    _writer: WriterRole
    _damaged: dict[int, CorruptStateError]
    _damage_logged: frozenset
    _repairs_due: bool

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
            self._writer.check()
            self.store.delete([self._abs(r) for r in rels])
        return rels

    # --- fencing ------------------------------------------------------------------------

    def _act_as_owner(self, run_id: str | None = None) -> bool:
        """Resolve the writer to act as (under the lock), before a completion or a
        collection: run ``run_id``, or the newest writer for no run in particular
        (:meth:`WriterRole.resolve`); then read the records again after a takeover (the
        older writer may have completed checkpoints since), apply the owner's retention,
        and, acting for the owning run, make the repairs a rebuild left to the owner.

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
        acting, reread = self._writer.resolve(run_id, self._known_latest())
        if not acting:
            return False
        if reread is not None:
            self._reread(reread)
        self._retain_for(self._writer.for_owner)
        self._repair_if_due()
        return True

    def _repair_if_due(self) -> None:
        """Make the repairs a rebuild found and left to the owner (stale pins, a damaged
        ``LATEST.json``), now that this coordinator may (under the lock)."""
        if self._repairs_due and self._writer.may_change():
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
        self._writer.for_owner = owner_run
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
            return self._writer.current

    # --- registry access ----------------------------------------------------------------

    @property
    def registry(self) -> SharedStateRegistry:
        """The current registry (an immutable value)."""
        return self._registry

    @property
    def watermark(self) -> int | None:
        """Every ``chk-<k>/`` with ``k`` below it has been swept."""
        return self._watermark
