"""Retention and deletion: aborting a checkpoint, collecting garbage, in the background.

Part of :class:`~statebackend.coordinator.CheckpointCoordinator`; what may be deleted and
why is the safety argument in :mod:`statebackend.coordinator.coordinator`.
"""

from __future__ import annotations

import json

from ..errors import CheckpointError
from ..model.manifest import (
    INITIAL_STATE_DIR,
    MANIFEST_NAME,
    checkpoint_dir,
    manifests_by_partition,
)
from .ownership import _Owner
from .records import PINS_DIR, WATERMARK_PATH, GcReport
from .registry import referenced_paths


class _Garbage(_Owner):
    """:meth:`abort`, :meth:`collect_garbage` and the background collection thread."""

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
            if self._damaged:
                return []  # see collect_garbage
            protected = self._protected()
            listing = self._list(checkpoint_dir(checkpoint_id))
            doomed = [p for p in listing if not self._registry.is_referenced(p)
                      and p not in protected]
            deleted = self._delete(p for p in doomed if p.endswith("/" + MANIFEST_NAME))
            deleted += self._delete(p for p in doomed if not p.endswith("/" + MANIFEST_NAME))
            self._published.forget(checkpoint_id)
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
        listing = self._published.listing(latest, lambda: self._list(checkpoint_dir(latest)))
        rels = sorted(r for rs in manifests_by_partition(listing).values() for r in rs)
        self._published.read_many(latest, rels)
        for rel in rels:
            self._published.read(latest, rel)
        return referenced_paths(self._published.of(latest).values())

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
            if latest is None or self._damaged:
                # a damaged retained checkpoint names files nobody can list: keep them all
                return report
            protected = self._protected()
            start = self._watermark
            if start is None:
                start = min(self._registry.checkpoints)
            sweep_initial, self._initial_swept = not self._initial_swept, True
        if sweep_initial:
            # a checkpoint is complete: no run applies a staged initial state any more
            report.deleted += self._delete(self._list(INITIAL_STATE_DIR))
        # Sweeps first: they move the watermark, and a crash before it is persisted only
        # repeats them.
        w = self._sweep(start, latest, protected, report)
        with self._lock:
            if w != self._watermark:
                self.store.put_bytes_atomic(self._abs(WATERMARK_PATH),
                                            json.dumps({"swept_below": w}).encode())
                self._watermark = w
            report.watermark = self._watermark
            subsumed = self._registry.subsumed_ids()
        for c in subsumed:
            self._discard(c, protected, report)
        return report

    def _sweep(self, start: int, latest: int, protected: frozenset[str],
               report: GcReport) -> int:
        """Sweep ``chk-<k>/`` from ``start`` up; returns the new watermark."""
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
        return max(start, bound) if w is None else w

    def _discard(self, c: int, protected: frozenset[str], report: GcReport) -> None:
        """Delete subsumed checkpoint ``c``'s unreferenced files, then its manifests and
        record, and forget it (unless a file of it is still protected)."""
        with self._lock:
            reg = self._registry
            if c not in reg.subsumed_ids():
                return
            cp = reg.checkpoints[c]
            manifests = set(cp.record.manifests.values())
            free = reg.unreferenced_paths(c)
            blocked = free & protected
            report.deleted += self._delete(free - blocked - manifests)
            if blocked:
                # Keep the manifests and the record: they are how a rebuild finds the
                # blocked files once the latest checkpoint's attempts stop using them.
                return
            report.deleted += self._delete(free & manifests)
            self._delete([cp.record.path, f"{PINS_DIR}/chk-{c}"])
            self._registry = reg.forget(c)
            report.forgotten.append(c)

    def _after_change(self) -> None:
        """Collect garbage after a change, when this coordinator may (only the owner
        deletes and applies retention: :meth:`~statebackend.coordinator.writer.WriterRole.may_change`): now, or on the background
        thread."""
        if not self._writer.may_change():
            return
        if self._background is None:
            self.collect_garbage()
        else:
            self._background.request()

    def wait_for_gc(self) -> None:
        """Block until background garbage collection is idle (no-op without it)."""
        if self._background is not None:
            self._background.wait()
