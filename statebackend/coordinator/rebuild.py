"""Rebuilding the registry from the durable records (invariant 6), after a restart or a
takeover, and finishing what a crash interrupted.

Part of :class:`~statebackend.coordinator.CheckpointCoordinator`.
"""

from __future__ import annotations

import json

from ..errors import CorruptStateError
from ..model.manifest import (
    CHECKPOINTS_DIR,
    LATEST_PATH,
    CompletedCheckpoint,
    PartitionManifest,
    checkpoint_dir,
    completed_record_path,
    latest_pointer,
)
from ..storage.records import (
    METRICS_DIR,
    missing_latest,
    newest_completed,
    newest_metrics,
    records_in,
)
from .ownership import _Owner, log
from .records import _PIN_NAME, PINS_DIR, WATERMARK_PATH
from .registry import RegisteredCheckpoint, SharedStateRegistry, referenced_paths


def damage_remedy(checkpoint_id: int) -> str:
    """What to do about a damaged retained checkpoint (one wording for logs, errors and
    the CLI)."""
    return (f"checkpoint {checkpoint_id} is skipped: restoring it fails, the newest intact "
            f"checkpoint restores, and garbage collection deletes nothing until it is "
            f"repaired. Put the damaged file back from a backup, or give the checkpoint up "
            f"by deleting its record {completed_record_path(checkpoint_id)}")


class _RecordVanished(Exception):
    """Retention moved while the registry was being rebuilt: a checkpoint listed as
    retained lost its manifest because another coordinator completed a newer one."""

class _Rebuild(_Owner):
    """:meth:`rebuild` and the loading of retained checkpoints."""

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
            listed = records_in(self._list(CHECKPOINTS_DIR))
            try:
                records = self._read_records(listed)
            except _RecordVanished:
                return self._rebuild_again()
            pins = self._read_pins(records)
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
            self._retain_for(self._writer.for_owner)
            self._report_damage()
            self._watermark = self._read_watermark()
            self._published.clear()
            self._recover_latest_record()
            reg = self._registry
        if records and collect:
            self._after_change()
        return reg

    def _read_records(self, listed: dict[int, str]) -> dict[int, CompletedCheckpoint]:
        """The records listed, by checkpoint id; damaged ones (but the newest) reported in
        ``_damaged`` and skipped. :class:`_RecordVanished` when one was deleted after
        the listing: another coordinator of this operator applied retention since (as
        :meth:`_load`'s manifests)."""
        self._damaged = {}
        records = {}
        for n, rel in sorted(listed.items()):
            try:
                records[n] = CompletedCheckpoint.from_json(
                    self.store.get_bytes(self._abs(rel)), where=rel)
            except FileNotFoundError:
                raise _RecordVanished(n) from None
            except CorruptStateError as exc:
                if n == max(listed):
                    raise  # the newest state itself is damaged: nothing to skip to
                self._damaged[n] = exc  # an older one: reported and skipped
        return records

    def _read_pins(self, records: dict[int, CompletedCheckpoint]) -> set[int]:
        """The pinned checkpoint ids; deletes pins whose checkpoint is gone."""
        pins = set()
        for rel in self._list(PINS_DIR):
            m = _PIN_NAME.match(rel.rsplit("/", 1)[-1])
            if m and int(m.group(1)) in records:
                pins.add(int(m.group(1)))
            elif self._writer.may_change():
                self._delete([rel])  # stale: its checkpoint is gone
            else:
                self._repairs_due = True  # the owner deletes it
        return pins

    def _read_watermark(self) -> int | None:
        try:
            raw = self.store.get_bytes(self._abs(WATERMARK_PATH))
            return int(json.loads(raw)["swept_below"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"{WATERMARK_PATH} is malformed ({exc}); delete it "
                                    f"to sweep again from the oldest record",
                                    path=WATERMARK_PATH) from exc

    def _recover_latest_record(self) -> None:
        """A record newer than every record listed was completed and is gone (deleted
        by hand, lost): complete it again from its published manifests (the same choice,
        so the same state), or refuse to go on from an older one (under the lock). A
        pointer that does not parse, or that names a checkpoint of which nothing was ever
        left, is damage to the pointer alone: rewritten from the newest record, with a
        warning (degraded, not stuck; ``verify`` reports it until then)."""
        latest = self._registry.latest_id
        try:
            newest, evidence = newest_completed(self.store, f"{self.operator_id}/")
        except CorruptStateError as exc:
            done = newest_metrics(self.store, f"{self.operator_id}/")
            if done is not None and done > (-1 if latest is None else latest):
                raise missing_latest(done, f"{self.store.root}/{self.operator_id}",
                                     evidence=f"its metrics {METRICS_DIR}/chk-{done}.jsonl "
                                              f"were written") from exc
            log.warning("operator %s: %s; %s from the newest record (%s)",
                        self.operator_id, exc, self._rewrite_pointer(), latest)
            return
        if newest is None or newest <= (-1 if latest is None else latest):
            return
        if self.store.exists(self._abs(completed_record_path(newest))):
            # written by another coordinator after our listing: read at the next rebuild
            return
        published = bool(self._list(checkpoint_dir(newest)))
        if not published and evidence.startswith(LATEST_PATH):
            log.warning("operator %s: %s names checkpoint %d, of which nothing is stored; "
                        "the pointer is damaged (or that checkpoint was lost with all its "
                        "files). Going on from checkpoint %s; %s", self.operator_id,
                        LATEST_PATH, newest, latest, self._rewrite_pointer())
            return
        log.warning("operator %s: the record of checkpoint %d, the newest completed one, is "
                    "missing; completing it again from its manifests", self.operator_id,
                    newest)
        if not published or self._complete_locked(newest, committed=False) is None:
            raise missing_latest(newest, f"{self.store.root}/{self.operator_id}",
                                 published=published, evidence=evidence)

    def _rewrite_pointer(self) -> str:
        """Write ``LATEST.json`` again from the newest record, when this coordinator may
        (:meth:`~statebackend.coordinator.writer.WriterRole.may_change`; else the owner's next completion does); says which."""
        if not self._writer.may_change():
            self._repairs_due = True
            return "the owner's next completion writes it again"
        latest = self._registry.latest_id
        if latest is None:
            self._delete([LATEST_PATH])
            return "deleted it"
        rec = self._registry.checkpoints[latest].record
        self._writer.check()
        self.store.put_bytes_atomic(self._abs(LATEST_PATH), latest_pointer(
            latest, rec.writer, self._writer.history if rec.writer else None))
        return "wrote it again"

    def _report_damage(self) -> None:
        """One warning per set of damaged retained checkpoints (invariant 13)."""
        key = frozenset((n, str(e)) for n, e in self._damaged.items())
        if not key or key == self._damage_logged:
            return
        self._damage_logged = key
        for n, exc in sorted(self._damaged.items()):
            log.warning("operator %s: %s; %s", self.operator_id, exc, damage_remedy(n))

    def _load(self, record: CompletedCheckpoint, *, must_exist: bool,
              listed: dict[int, str]) -> RegisteredCheckpoint:
        manifests = []
        items = sorted(record.manifests.items())
        raws = self.store.get_bytes_many([self._abs(rel) for _p, rel in items])
        for (p, rel), raw in zip(items, raws):
            if raw is not None:
                try:
                    m = PartitionManifest.from_json(raw, where=rel)
                    record.check_manifest(p, m, raw, rel)
                except CorruptStateError as exc:
                    # degraded, not stuck: this checkpoint is skipped (restoring it fails
                    # on the same check) and what it names is unknown, so garbage
                    # collection deletes nothing until a repair
                    self._damaged.setdefault(record.checkpoint_id, exc)
                    continue
                manifests.append(m)
            elif must_exist:
                # Another coordinator of this operator (an earlier backend object of this
                # driver finishing its last completion) deletes a subsumed checkpoint's
                # manifests, then its record: if the records changed since they were
                # listed, the manifest went to retention, not to corruption.
                if (not self.store.exists(self._abs(record.path))
                        or records_in(self._list(CHECKPOINTS_DIR)) != listed):
                    raise _RecordVanished(record.checkpoint_id)
                self._damaged.setdefault(record.checkpoint_id, CorruptStateError(
                    f"retained checkpoint {record.checkpoint_id}: manifest {rel} of "
                    f"partition {p} is missing",
                    checkpoint_id=record.checkpoint_id, partition=p, path=rel))
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
