"""The shared-state registry: a pure model of which durable files completed checkpoints use.

No IO happens here. :class:`SharedStateRegistry` is an immutable value; every change
(register a completed checkpoint, pin, unpin, forget a discarded one) returns a new value.
:mod:`statebackend.coordinator.coordinator` reads and writes durable storage around it.

Reference representation
------------------------
One entry per durable file, keyed by its physical path (relative to the operator root),
holding the *set of retained checkpoint ids* whose chosen manifests reference it. The
reference count is the size of that set. A set rather than a bare counter because:

- registering the same completed checkpoint twice (a crash between writing its record and
  applying it, then a rebuild) cannot count it twice: the operation is idempotent;
- subsuming a checkpoint removes exactly the references it added, whatever the order;
- the whole value is a fold over the completed-checkpoint records, so it can be rebuilt
  from them alone after a driver restart (invariant 6) and compared for equality in tests.

Changelog mode
--------------
A changelog checkpoint's manifest lists its base materialization's files and the changelogs
after it, so both are counted here like any SST: a changelog subsumed by a newer
materialization loses its last reference when the checkpoints that listed it are subsumed.
A materialization still uploading in the background is named only as *pending* (its files'
names are not known yet); :meth:`SharedStateRegistry.sweep_bound` keeps the coordinator's
sweeps below the oldest batch the newest retained checkpoint names as pending, so its files
are neither swept nor leaked: once adopted they are referenced, once abandoned they are
swept.

Retention
---------
Every completed checkpoint whose record is still in durable storage is *known*. It is
*retained* when it is among the ``num_retained`` newest known checkpoints, pinned, or the
one before the latest while the latest's record is not ``committed`` (completed before
Spark's commit of its micro-batch was known: Spark may run that micro-batch again, from
the state before it); otherwise it is *subsumed*: its references no longer count, and it
stays known only until its unreferenced files are deleted (then the coordinator deletes
its record and calls :meth:`SharedStateRegistry.forget`). Retention is derived, never stored, so a rebuild gets
the same answer. A subsumed checkpoint never comes back: :meth:`SharedStateRegistry.pin`
refuses it, and a newer checkpoint can only push it further down.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..errors import CheckpointNotFoundError
from ..model.manifest import CompletedCheckpoint, PartitionManifest

__all__ = [
    "Retention",
    "RegisteredCheckpoint",
    "SharedStateRegistry",
    "referenced_paths",
]


class Retention(enum.Enum):
    """Where a known completed checkpoint stands.

    ``RETAINED`` -> ``SUBSUMED`` (pushed out by newer checkpoints, or unpinned) ->
    forgotten (its files are gone and its record deleted). Pinning keeps a checkpoint
    ``RETAINED``; no transition leads back from ``SUBSUMED``.
    """

    RETAINED = "retained"
    SUBSUMED = "subsumed"


def referenced_paths(manifests: Iterable[PartitionManifest]) -> frozenset[str]:
    """Every durable path a set of partition manifests needs: their files and themselves,
    and in changelog mode the ``_MATERIALIZED.json`` of the materialization whose files
    they list (kept as long as those files, for ``describe`` and ``verify``)."""
    out: set[str] = set()
    for m in manifests:
        out.add(m.path)
        out.update(f.path for f in m.files)
        ref = m.materialization
        if ref is not None:
            own = ref.path(m.partition)
            prefix = own.rsplit("/", 1)[0] + "/"
            if any(f.path.startswith(prefix) for f in m.files):
                out.add(own)
    return frozenset(out)


@dataclass(frozen=True)
class RegisteredCheckpoint:
    """A completed checkpoint as the registry sees it: its record and every path it uses.

    Attributes
    ----------
    record : CompletedCheckpoint
        The durable record (``_checkpoints/chk-<n>.json``).
    paths : frozenset of str
        Paths (relative to the operator root) of every file of its chosen manifests and of
        the manifests themselves.
    """

    record: CompletedCheckpoint
    paths: frozenset[str]
    pending: frozenset[int] = frozenset()

    @property
    def checkpoint_id(self) -> int:
        return self.record.checkpoint_id

    @classmethod
    def of(cls, record: CompletedCheckpoint,
           manifests: Iterable[PartitionManifest]) -> RegisteredCheckpoint:
        """Build from a record and its chosen manifests (which must be the ones it names)."""
        ms = list(manifests)
        named = {m.partition: m.path for m in ms}
        if named != dict(record.manifests):
            raise ValueError(f"checkpoint {record.checkpoint_id}: manifests {named} are not "
                             f"the ones its record names {dict(record.manifests)}")
        pending = frozenset(m.pending_materialization.checkpoint_id for m in ms
                            if m.pending_materialization is not None)
        return cls(record, referenced_paths(ms), pending)


def _frozen(d: dict[str, frozenset[int]]) -> Mapping[str, frozenset[int]]:
    return MappingProxyType(d)


@dataclass(frozen=True)
class SharedStateRegistry:
    """Which completed checkpoints are known, which are retained, and who uses each file.

    Build an empty one with ``SharedStateRegistry(num_retained)`` and change it with the
    methods below, each returning a new registry.

    Attributes
    ----------
    num_retained : int
        How many of the newest completed checkpoints are retained (pins come on top).
    checkpoints : Mapping[int, RegisteredCheckpoint]
        Every known completed checkpoint (retained or subsumed), by id.
    pins : frozenset of int
        Pinned checkpoint ids (always retained while known).
    refs : Mapping[str, frozenset[int]]
        Path -> ids of the *retained* checkpoints referencing it. Paths with no retained
        reference have no entry.
    """

    num_retained: int
    checkpoints: Mapping[int, RegisteredCheckpoint] = field(
        default_factory=lambda: MappingProxyType({}))
    pins: frozenset[int] = frozenset()
    refs: Mapping[str, frozenset[int]] = field(default_factory=lambda: _frozen({}))

    def __post_init__(self) -> None:
        if self.num_retained < 1:
            raise ValueError(f"num_retained must be >= 1 (the latest checkpoint is always "
                             f"kept), got {self.num_retained}")

    # --- derived ----------------------------------------------------------------------

    @property
    def latest_id(self) -> int | None:
        """Id of the newest known completed checkpoint (always retained), or None."""
        return max(self.checkpoints) if self.checkpoints else None

    def retained_ids(self) -> list[int]:
        """Ids of the retained checkpoints, oldest first."""
        ids = sorted(self.checkpoints)
        keep = set(self.promised_ids())
        if len(ids) > 1 and not self.checkpoints[ids[-1]].record.committed:
            keep.add(ids[-2])  # Spark may run the latest's micro-batch again from its base
        return sorted(keep)

    def promised_ids(self) -> list[int]:
        """The retained ids whose files must exist: the ``num_retained`` newest and the
        pinned. The one kept for a rerun of an uncommitted latest is a best effort (a
        coordinator that knew of the commit may already be deleting it)."""
        newest = sorted(self.checkpoints)[-self.num_retained:]
        return sorted(set(newest) | (self.pins & self.checkpoints.keys()))

    def subsumed_ids(self) -> list[int]:
        """Ids of known checkpoints that are no longer retained, oldest first."""
        kept = set(self.retained_ids())
        return sorted(n for n in self.checkpoints if n not in kept)

    def retention(self, checkpoint_id: int) -> Retention:
        if checkpoint_id not in self.checkpoints:
            raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} is not a known "
                                          f"completed checkpoint")
        return (Retention.RETAINED if checkpoint_id in self.retained_ids()
                else Retention.SUBSUMED)

    def is_referenced(self, path: str) -> bool:
        """True when a retained checkpoint references ``path``."""
        return path in self.refs

    def sweep_bound(self, latest: int) -> int:
        """Sweeps of ``chk-<k>/`` may run for ``k`` below this: ``latest``, or the oldest
        batch whose materialization the newest retained checkpoint names as pending.

        Only the newest one matters: a materialization an older checkpoint named as
        pending and the newest does not was adopted since (its files are referenced now)
        or abandoned (garbage; no restore reads a pending materialization's files)."""
        retained = self.retained_ids()
        pending = self.checkpoints[max(retained)].pending if retained else ()
        return min([latest, *pending])

    def unreferenced_paths(self, checkpoint_id: int) -> frozenset[str]:
        """Paths of a (subsumed) checkpoint that no retained checkpoint references."""
        return frozenset(p for p in self.checkpoints[checkpoint_id].paths if p not in self.refs)

    # --- changes ----------------------------------------------------------------------

    def register(self, checkpoint: RegisteredCheckpoint) -> SharedStateRegistry:
        """Add a completed checkpoint; older ones beyond retention become subsumed.

        Idempotent: registering a checkpoint already known returns an equal registry.
        """
        n = checkpoint.checkpoint_id
        if n in self.checkpoints:
            if self.checkpoints[n].paths != checkpoint.paths:
                raise ValueError(f"checkpoint {n} is already registered with other files")
            return self
        cps = dict(self.checkpoints)
        cps[n] = checkpoint
        return self._with(cps, self.pins)

    def mark_committed(self, checkpoint_id: int) -> SharedStateRegistry:
        """The checkpoint's record, rewritten as ``committed`` (Spark committed its
        micro-batch since it completed): the checkpoint before it may now be subsumed."""
        cp = self.checkpoints[checkpoint_id]
        if cp.record.committed:
            return self
        cps = dict(self.checkpoints)
        cps[checkpoint_id] = replace(cp, record=replace(cp.record, committed=True))
        return self._with(cps, self.pins)

    def pin(self, checkpoint_id: int) -> SharedStateRegistry:
        """Keep a retained checkpoint retained until :meth:`unpin`."""
        if self.retention(checkpoint_id) is not Retention.RETAINED:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} is subsumed (its files are being deleted) and "
                f"cannot be pinned; pin one of the retained checkpoints "
                f"{self.retained_ids()}")
        if checkpoint_id in self.pins:
            return self
        return self._with(dict(self.checkpoints), self.pins | {checkpoint_id})

    def unpin(self, checkpoint_id: int) -> SharedStateRegistry:
        """Let retention drop the checkpoint again (no-op when it is not pinned)."""
        if checkpoint_id not in self.pins:
            return self
        return self._with(dict(self.checkpoints), self.pins - {checkpoint_id})

    def forget(self, checkpoint_id: int) -> SharedStateRegistry:
        """Drop a subsumed checkpoint whose unreferenced files are deleted."""
        if self.retention(checkpoint_id) is not Retention.SUBSUMED:
            raise ValueError(f"checkpoint {checkpoint_id} is retained and cannot be forgotten")
        cps = dict(self.checkpoints)
        del cps[checkpoint_id]
        return self._with(cps, self.pins - {checkpoint_id})

    # --- internals --------------------------------------------------------------------

    def _with(self, cps: dict[int, RegisteredCheckpoint],
              pins: frozenset[int]) -> SharedStateRegistry:
        # References are patched for the checkpoints whose retention changed (usually one
        # in, one out), not recomputed over every retained file: at 1,000 partitions that
        # is tens of thousands of paths per completion. A checkpoint's paths never change
        # once known (register refuses that), so patching equals recomputing; the
        # rebuild-equality tests hold it to that.
        probe = replace(self, checkpoints=MappingProxyType(cps), pins=frozenset(pins),
                        refs=_frozen({}))
        before = {n for n in self.retained_ids() if n in cps}
        dropped = set(self.retained_ids()) - before
        after = set(probe.retained_ids())
        refs = dict(self.refs)
        for n in (before - after) | dropped:
            for p in self.checkpoints[n].paths:
                left = refs.get(p, frozenset()) - {n}
                if left:
                    refs[p] = left
                else:
                    refs.pop(p, None)
        for n in after - before:
            for p in cps[n].paths:
                refs[p] = refs.get(p, frozenset()) | {n}
        return replace(probe, refs=_frozen(refs))

    @classmethod
    def rebuild(cls, num_retained: int, checkpoints: Iterable[RegisteredCheckpoint],
                pins: Iterable[int] = ()) -> SharedStateRegistry:
        """The registry derived from completed-checkpoint records alone (and the pins)."""
        cps = {c.checkpoint_id: c for c in checkpoints}
        reg = cls(num_retained)
        return reg._with(cps, frozenset(p for p in pins if p in cps))
