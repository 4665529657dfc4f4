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
    check_owner,
    epoch_path,
    fenced_error,
    held_before,
    list_epochs,
    read_epoch,
)
from ..model.manifest import PartitionManifest
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
    last_completion_requests: RequestCounts | None
    _clock: Callable[[], float]
    _lock: threading.RLock
    _registry: SharedStateRegistry
    _watermark: int | None
    _published: dict[int, dict[str, PartitionManifest]]
    _digests: dict[str, str]
    _listings: dict[int, frozenset[str]]
    _pool: ThreadPoolExecutor | None
    _gc_future: Future[GcReport] | None
    _gc_again: bool
    _epoch: int | None
    _epoch_run: str | None

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
