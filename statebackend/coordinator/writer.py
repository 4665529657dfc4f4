"""Whom a coordinator acts as: the writer epoch, its run and query, and whether it may change
the location (invariant 10).

:class:`WriterRole` owns this state for one coordinator and answers, before every
completion and collection, which writer the coordinator acts for; the coordinator applies
what follows for its registry (read the records again after a takeover, the owner's
retention, the repairs only the owner makes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..checkpoint.fencing import (
    check_owner,
    fenced_error,
    resolve_owner,
    writer_history,
)
from ..errors import WriterFencedError
from ..model.manifest import WriterStamp
from ..storage.base import DurableStore

log = logging.getLogger("statebackend.coordinator.coordinator")


@dataclass
class WriterRole:
    """The writer one coordinator of operator ``operator_id`` acts as.

    Attributes
    ----------
    epoch : int or None
        The writer epoch last acted under (None: not resolved yet; 0: nobody has claimed
        the location).
    run : str or None
        The run that holds :attr:`epoch`.
    stamp : WriterStamp or None
        Its stamp, which records and ``LATEST.json`` carry.
    history : dict
        Runs that held epochs (run id -> highest epoch), for ``LATEST.json``.
    for_owner : bool
        Acting for the owning run (its retention applies), or for no run in particular.
    """

    store: DurableStore
    operator_id: str
    fencing: bool
    own_retention: bool
    epoch: int | None = None
    run: str | None = None
    stamp: WriterStamp | None = None
    history: dict[str, int] = field(default_factory=dict)
    for_owner: bool = True
    #: planning (or being built): no run in particular may change the location yet
    deferring: bool = False
    _not_owner_logged: set[str] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        return f"{self.operator_id}/"

    @property
    def current(self) -> WriterStamp | None:
        """The stamp written into records (None: no fencing, or no writer yet)."""
        return self.stamp if self.fencing and self.epoch else None

    def check(self) -> None:
        """Before a record is written or a file deleted: the epoch acted under is still
        the newest (a listing of ``_writers/`` and a read of ``LATEST.json``)."""
        if self.fencing and self.epoch:  # 0: no writer has claimed the location yet
            check_owner(self.store, self.epoch, self.prefix)

    def resolve(self, run_id: str | None, known_latest: int) -> tuple[bool, str | None]:
        """Act for run ``run_id``, or for the newest writer when None.

        The owner is the newest epoch in ``_writers/`` or in the records
        (:func:`~statebackend.checkpoint.fencing.resolve_owner`). Costs a listing and a read
        while the epoch stays the newest; after a takeover, a few small reads.

        Returns
        -------
        tuple of (bool, str or None)
            Whether to act at all (False: ``run_id`` never held an epoch here, its tasks
            were refused: another query owns the location, so change nothing), and why
            the records must be read again (None: they need not: no takeover, and no
            completion newer than ``known_latest`` by another coordinator).

        Raises
        ------
        WriterFencedError
            ``run_id`` held an older epoch: a newer run took the location over.
        """
        if not self.fencing:
            self.for_owner = True
            return True, None
        if self.epoch is not None and run_id in (None, self.run):
            try:
                ptr = check_owner(self.store, self.epoch, self.prefix)
            except WriterFencedError:
                pass
            else:
                self.for_owner = run_id is not None or not self.epoch
                if ptr is not None and ptr.checkpoint_id > known_latest:
                    return True, f"another coordinator completed checkpoint {ptr.checkpoint_id}"
                return True, None
        owner = resolve_owner(self.store, self.prefix)
        latest = owner.writer
        if latest is None:
            self.epoch, self.run, self.stamp = 0, None, None  # nobody claimed it yet
            self.for_owner = True
            return True, None
        if run_id is not None and latest.run_id != run_id:
            held = owner.held_by(self.store, run_id, self.prefix)
            if held is not None:
                raise fenced_error(f"{self.store.root}/{self.operator_id}", held, latest)
            if run_id not in self._not_owner_logged:
                self._not_owner_logged.add(run_id)
                log.warning("operator %s: run %s never took a writer epoch of this location "
                            "(%s owns it); its coordinator completes, retains and deletes "
                            "nothing here", self.operator_id, run_id, latest.describe())
            return False, None
        moved = self.epoch is not None and latest.epoch != self.epoch
        self.epoch, self.run, self.stamp = latest.epoch, latest.run_id, latest.stamp
        self.history = writer_history(self.store, owner, self.prefix)
        self.for_owner = run_id is not None
        return True, f"{latest.describe()} took the location over" if moved else None

    def may_change(self) -> bool:
        """Whether the coordinator may delete, apply retention and repair the location's
        metadata now (invariant 10: only the owner does): acting for the owning run, for a
        location no streaming query owns (a batch run's, or nobody's), without fencing, or
        for a call by hand (``backend.complete()``, a savepoint, ``statebackend gc``: the
        newest writer's retention at least). While :attr:`deferring` (the coordinator
        being built, a query being planned: which cannot know yet whether it is the
        owner's restart or another query), for no run in particular on a streaming
        query's location it only completes checkpoints the owner's tasks published (a
        restart starts from them; the record is the one the owner's coordinator writes)
        and leaves deletions and repairs to the owner's next completion."""
        if not self.fencing or self.own_retention or self.for_owner or not self.deferring:
            return True
        return self.stamp is None or self.stamp.query_id is None

    def of_another_query(self, query_id: str | None) -> bool:
        """Whether a manifest published for ``query_id`` belongs to another streaming
        query than the owner's."""
        own = self.stamp.query_id if self.fencing and self.stamp is not None else None
        return own is not None and query_id is not None and query_id != own
