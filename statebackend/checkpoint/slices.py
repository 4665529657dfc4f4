"""Rolling slices: a durable form of the state that is rewritten a slice at a time.

With ``rolling_slices = N > 0`` a changelog-mode partition does not materialize RocksDB
snapshots. Its key-group range is cut into ``N`` contiguous slices
(:func:`slice_ranges`); each batch writes its changelog and rewrites **one** slice, the
entries of those key groups in every column family keyed by key group as SST files made
with ``SstFileWriter`` (:func:`write_units`), plus the small column families not keyed by
key group (``_meta``) whole. Slice ``checkpoint_id mod N`` is due at batch
``checkpoint_id``; a batch whose changelog is at least the state it started from (the load)
rewrites them all. A manifest names, for every key group, the newest unit holding it
(:class:`~statebackend.model.manifest.SliceRef`), the base materialization while some key
group has no unit newer than it, and the changelogs after the oldest unit
(:func:`covering`).

Why: RocksDB's leveled compaction rewrites most of a partition's bottom level when changes
are spread uniformly, and a materialization of RocksDB's files uploads that rewrite, holds
the old and the new base side by side while it travels, and writes many times the changed
bytes. Here what a batch makes durable is its changelog plus ``1/N`` of the state, whatever
RocksDB compacts locally; the previous unit of the rewritten slice and the changelogs
older than every unit are garbage as soon as the checkpoint is retained alone.

A restore (``replay_changelogs`` in :mod:`~statebackend.checkpoint.restore`) opens the
base (or an empty instance), downloads every unit at once and puts them in place
(:func:`ingest_units`: what a unit replaces deleted when a base is open, each column
family's files ingested in one call), then replays the changelogs after the oldest unit
with :func:`replay_filtered`: writes and range deletes only on the key groups whose unit
is older than the changelog, a column family dropped only when no later unit holds it.
Every key group thus ends at its unit's state with the later changelogs on top: exactly
the checkpoint's state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rocksdict import IngestExternalFileOptions, Options, SstFileWriter

from ..errors import CorruptStateError
from ..model.manifest import FileEntry, PartitionManifest, SliceRef
from ..options import StateBackendOptions
from ..rocksdb.instance import DEFAULT_CF, RocksDBInstance
from .changelog import OP_CREATE_CF, OP_DELETE_RANGE, OP_DROP_CF, OP_WRITE, read_records

GLOBAL_COLUMN_FAMILIES = frozenset({DEFAULT_CF, "_meta"})
"""Column families whose keys do not start with a key group: written whole by every
batch's global unit."""


def rolling_on(options: StateBackendOptions) -> bool:
    """Whether changelog-mode partitions checkpoint rolling slices: ``rolling_slices``
    above 0, or None under ``checkpoint_mode="auto"`` (the count then derived per
    partition, :func:`slice_count`)."""
    if options.rolling_slices is None:
        return options.checkpoint_mode == "auto" and options.incremental
    return options.rolling_slices > 0


def slice_ranges(key_group_range: tuple[int, int], n: int) -> list[tuple[int, int]]:
    """``min(n, key groups)`` contiguous, near-equal ``(first, last)`` slices of the range."""
    a, b = key_group_range
    count = b - a + 1
    n = max(1, min(n, count))
    return [(a + i * count // n, a + (i + 1) * count // n - 1) for i in range(n)]


def due_ranges(key_group_range: tuple[int, int], n: int, versions: dict[int, int],
               rewrite_all: bool) -> list[tuple[int, int]]:
    """The slices a batch rewrites: all of them, or the one whose unit is oldest
    (``versions``: key group -> batch of the unit holding it, :attr:`Coverage.versions`;
    ties go to the first), so a batch that rewrote none (it changed nothing) delays no
    slice's turn. The same answer on every attempt of the batch."""
    ranges = slice_ranges(key_group_range, n)
    return ranges if rewrite_all else by_turn(ranges, versions)[:1]


def by_turn(ranges: Sequence[tuple[int, int]], versions: dict[int, int]
            ) -> list[tuple[int, int]]:
    """``ranges`` in the order they are rewritten next: oldest unit first (a range's age
    is its oldest key group's), ties in key order."""
    return sorted(ranges, key=lambda r: (min(versions.get(kg, -1)
                                             for kg in range(r[0], r[1] + 1)), r[0]))


AUTO_SLICES = 32
"""``rolling_slices=None``: the count a partition starts with (no changelog sizes yet)."""
AUTO_RATE_SHARE = 0.55
"""``rolling_slices=None``: ``N x churn`` aimed at. Each batch writes ``1/N`` of the state
besides its changelog, so ``1 + 1/0.55 = 2.8`` times the changed bytes; the changelog
pieces kept (:mod:`.deltas`) are ``~N x churn / 2 = 0.28`` of the state."""
MIN_AUTO_SLICES = 4
KEEP_COUNT_WITHIN = 1.5
"""A derived count is kept while the ideal one is within this factor of it."""


def slice_count(requested: int | None, key_group_range: tuple[int, int],
                units: Sequence[SliceRef], state_size: int,
                changelog_sizes: Sequence[int]) -> int:
    """How many slices a rolling partition is cut into this batch.

    ``requested`` (``rolling_slices``) when set. None: derived from durable facts, the
    lineage's ``units``, the bytes its units and base hold (``state_size``) and the sizes
    of its changelogs (this batch's included): ``0.55 x state / mean changelog``, between 4
    and the partition's key groups, so what a batch writes stays near 2.8x what it changed
    and the pieces kept near 28% of the state whatever the churn (docs/options.md,
    "Rolling slices"). The current count (the newest unit's :attr:`SliceRef.of`) is kept while that is
    within a factor of 1.5 of it, so the cut does not move with every change of rate.
    Without changelog sizes: the current count, else 32. 0 (whole materializations) for
    a partition of fewer than 4 key groups.
    """
    kgs = key_group_range[1] - key_group_range[0] + 1
    if requested is not None:
        return requested
    if kgs < MIN_AUTO_SLICES:
        return 0  # a slice of one key group in four or fewer is most of the partition
    keyed = [u for u in units if not u.is_global and not u.is_delta]
    current = None
    if keyed:
        newest = max(keyed, key=lambda u: u.checkpoint_id)
        current = newest.of or max(1, round(kgs / (newest.last_kg - newest.first_kg + 1)))
    sizes = [c for c in changelog_sizes if c > 0]
    if not sizes or state_size <= 0:
        return current or min(AUTO_SLICES, kgs)
    ideal = AUTO_RATE_SHARE * state_size / (sum(sizes) / len(sizes))
    n = max(MIN_AUTO_SLICES, min(round(ideal), kgs))
    if current is not None and current / KEEP_COUNT_WITHIN <= ideal <= (
            current * KEEP_COUNT_WITHIN):
        return current
    return n


def kg_prefix(kg: int) -> bytes:
    return kg.to_bytes(2, "big")


def kg_end(last_kg: int) -> bytes:
    return kg_prefix(last_kg + 1)  # key groups are < 2**15, so last + 1 fits


@dataclass(frozen=True)
class Coverage:
    """Which unit holds each key group of a lineage, and what it still needs.

    Attributes
    ----------
    versions : dict of int to int
        Key group -> batch of the unit holding it (the base's batch, or -1 for empty
        state, where no unit does).
    global_version : int
        Batch of the global unit (the base's, or -1).
    start : int
        The oldest of them: changelogs after it are needed, the others are not.
    needs_base : bool
        Whether some key group (or the global column families) still comes from the base.
    """

    versions: dict[int, int]
    global_version: int
    start: int
    needs_base: bool


def covering(key_group_range: tuple[int, int], slices: Sequence[SliceRef],
             base_id: int | None) -> Coverage:
    """The :class:`Coverage` of the units in ``slices`` (deltas ignored) over a base of
    batch ``base_id`` (None: empty)."""
    floor = -1 if base_id is None else base_id
    a, b = key_group_range
    versions = dict.fromkeys(range(a, b + 1), floor)
    global_version = floor
    for s in slices:
        if s.checkpoint_id <= floor or s.is_delta:
            continue
        if s.is_global:
            global_version = max(global_version, s.checkpoint_id)
            continue
        for kg in range(max(a, s.first_kg), min(b, s.last_kg) + 1):
            versions[kg] = max(versions[kg], s.checkpoint_id)
    start = min([global_version, *versions.values()])
    needs = base_id is not None and start == floor
    return Coverage(versions, global_version, start, needs)


def merge_slices(old: Sequence[SliceRef], new: Sequence[SliceRef]) -> tuple[SliceRef, ...]:
    """``old`` without the units ``new`` replaces whole (the same or a smaller range; the
    global unit by the global unit), then ``new``: in batch order. Deltas replace nothing
    and are replaced by nothing (:func:`prune_slices` drops them)."""
    def replaced(s: SliceRef) -> bool:
        return not s.is_delta and any(not n.is_delta and (
            (s.is_global and n.is_global) or (
                not s.is_global and not n.is_global and n.first_kg <= s.first_kg
                and s.last_kg <= n.last_kg)) for n in new)
    kept = [s for s in old if not replaced(s)]
    return tuple(sorted([*kept, *new], key=lambda s: (s.checkpoint_id, s.is_delta,
                                                     s.first_kg)))


def prune_slices(slices: Sequence[SliceRef], coverage: Coverage) -> tuple[SliceRef, ...]:
    """The units that still hold some key group's newest state, and the deltas some key
    group's older unit still needs."""
    def useful(s: SliceRef) -> bool:
        if s.is_delta:
            return any(coverage.versions.get(kg, s.checkpoint_id) < s.checkpoint_id
                       for kg in range(s.first_kg, s.last_kg + 1))
        if s.is_global:
            return s.checkpoint_id == coverage.global_version
        return any(coverage.versions.get(kg) == s.checkpoint_id
                   for kg in range(s.first_kg, s.last_kg + 1))
    return tuple(s for s in slices if useful(s))


# --- writing units ---------------------------------------------------------------------


def write_sst(entries: Iterable[tuple[bytes, bytes | None]], path: str) -> bool:
    """Entries (in key order; a None value is a delete) into an SST file at ``path``;
    False (no file) when none."""
    writer = None
    for k, v in entries:
        if writer is None:
            writer = SstFileWriter(options=Options(raw_mode=True))
            writer.open(path)
        if v is None:
            del writer[k]
        else:
            writer[k] = v
    if writer is None:
        return False
    writer.finish()
    return True


def write_units(instance: RocksDBInstance, ranges: Sequence[tuple[int, int]],
                checkpoint_id: int, directory: str, of: int = 0
                ) -> list[tuple[SliceRef, list[str]]]:
    """Write the units of ``ranges`` (slices of a cut into ``of``) and the global unit from
    ``instance`` (nothing may write it meanwhile) into ``directory``; each unit with its
    files' local paths, in :meth:`SliceRef.file_name` order."""
    os.makedirs(directory, exist_ok=True)
    cfs = sorted(instance.column_family_names())
    out: list[tuple[SliceRef, list[str]]] = []
    units = [(-1, -1)] + list(ranges)
    for first, last in units:
        names: list[str] = []
        paths: list[str] = []
        for cf in cfs:
            is_global = cf in GLOBAL_COLUMN_FAMILIES
            if is_global != (first < 0):
                continue
            ref = SliceRef(first, last, checkpoint_id, tuple(names) + (cf,))
            path = os.path.join(directory, ref.file_name(len(names)))
            entries = (instance.scan_range(cf, b"", None) if is_global
                       else instance.scan_range(cf, kg_prefix(first), kg_end(last)))
            if write_sst(entries, path):
                names.append(cf)
                paths.append(path)
        out.append((SliceRef(first, last, checkpoint_id, tuple(names),
                             of=0 if first < 0 else of), paths))
    return out


# --- restoring ---------------------------------------------------------------------------


def _clear(instance: RocksDBInstance, unit: SliceRef) -> None:
    """Delete what ``unit`` replaces: its key groups in every keyed column family, or every
    global column family whole."""
    for cf in instance.column_family_names():
        if (cf in GLOBAL_COLUMN_FAMILIES) != unit.is_global:
            continue
        if unit.is_global:
            _clear_cf(instance, cf)
        else:
            instance.delete_range(cf, kg_prefix(unit.first_kg), kg_end(unit.last_kg))


def ingest_unit(instance: RocksDBInstance, unit: SliceRef, paths: Sequence[str]) -> None:
    """Replace ``unit``'s part of the state by its files (``paths``, in file order); the
    files are moved into the instance."""
    _clear(instance, unit)
    for cf, path in zip(unit.column_families, paths):
        _ingest_checked(instance, cf, [path], [unit])


def ingest_units(instance: RocksDBInstance, units: Sequence[tuple[SliceRef, Sequence[str]]],
                 clear: bool) -> None:
    """Put every unit in place (``(unit, local paths)``, in batch order): what each unit
    replaces deleted first when ``clear`` (a base is open), then each column family's files
    ingested in one call when no two units overlap (else one unit after another)."""
    if units_overlap([u for u, _p in units]):
        for u, paths in units:
            ingest_unit(instance, u, paths)
        return
    if clear:
        for u, _p in units:
            _clear(instance, u)
    by_cf: dict[str, tuple[list[str], list[SliceRef]]] = {}
    for u, paths in units:
        for cf, path in zip(u.column_families, paths):
            files, owners = by_cf.setdefault(cf, ([], []))
            files.append(path)
            owners.append(u)
    for cf, (files, owners) in by_cf.items():
        _ingest_checked(instance, cf, files, owners)


def units_overlap(units: Sequence[SliceRef]) -> bool:
    """Whether two units keyed by key group share one (then they go in one by one)."""
    keyed = sorted((u.first_kg, u.last_kg) for u in units if not u.is_global)
    return any(b[0] <= a[1] for a, b in zip(keyed, keyed[1:]))


def _ingest_checked(instance: RocksDBInstance, cf: str, paths: Sequence[str],
                    units: Sequence[SliceRef]) -> None:
    """Ingest ``paths`` (moved) into ``cf``; refused when one of them holds a key outside
    the key groups of its unit (``units[i]`` for ``paths[i]``): a unit's file that is
    another partition's or another slice's, intact and with its checksum right, would
    otherwise restore a different state. RocksDB checks a snapshot's files against the
    unique ids its MANIFEST records; an ingested file has no such record."""
    before = {f["name"] for f in instance.live_files()}
    sizes: dict[int, list[SliceRef]] = {}
    for p, u in zip(paths, units):
        sizes.setdefault(os.path.getsize(p), []).append(u)
    ingest_moved(instance, cf, paths)
    if cf in GLOBAL_COLUMN_FAMILIES:
        return
    for f in instance.live_files():
        owners = [] if f["name"] in before else sizes.get(int(f["size"]), [])
        # a file already compacted with others is not seen here; check_range still sees
        # a key of another partition
        if owners and not any(kg_prefix(u.first_kg) <= f["start_key"]
                              and f["end_key"] < kg_end(u.last_kg) for u in owners):
            raise _foreign(cf, f["start_key"], f["end_key"], owners[0])


def ingest_moved(instance: RocksDBInstance, cf: str, paths: Sequence[str]) -> None:
    """Ingest the SST files ``paths`` into ``cf``, moved (hard-linked) rather than copied:
    they are newer than everything in it."""
    opts = IngestExternalFileOptions()
    opts.set_move_files(True)
    instance.column_family(cf).ingest_external_file(list(paths), opts)


def check_range(instance: RocksDBInstance, key_group_range: tuple[int, int]) -> None:
    """Refuse a state holding a key outside ``key_group_range`` in a column family keyed
    by key group (after units are ingested: one of them was another partition's file)."""
    lo, hi = kg_prefix(key_group_range[0]), kg_end(key_group_range[1])
    for cf in instance.column_family_names():
        if cf in GLOBAL_COLUMN_FAMILIES:
            continue
        for start, end in ((b"", lo), (hi, None)):
            for k, _v in instance.scan_range(cf, start, end):
                raise _foreign(cf, k, k, None, key_group_range)


def _foreign(cf: str, lo: bytes, hi: bytes, unit: SliceRef | None,
             key_group_range: tuple[int, int] | None = None) -> CorruptStateError:
    whose = (f"its unit's key groups {unit.first_kg}..{unit.last_kg} (batch "
             f"{unit.checkpoint_id})" if unit is not None
             else f"the partition's key groups {key_group_range[0]}..{key_group_range[1]}")
    return CorruptStateError(
        f"a slice file of column family {cf!r} holds keys of key groups "
        f"{kg_of(lo)}..{kg_of(hi)}, outside {whose}: it is another partition's or "
        f"another slice's file; the committed state cannot be restored from it")


def kg_of(key: bytes) -> int:
    return int.from_bytes(key[:2].ljust(2, b"\0"), "big")


def replay_filtered(instance: RocksDBInstance, data: bytes, batch: int, coverage: Coverage,
                    units: Sequence[SliceRef], where: str,
                    within: tuple[int, int] | None = None,
                    dropped: set[tuple[int, str]] | None = None) -> int:
    """Apply changelog ``batch`` to the key groups whose unit is older than it, on a state
    where every unit is already in place (:func:`ingest_units`); records read.

    Writes and range deletes are clipped to those key groups (the others' units already
    hold their effect); a column family dropped is dropped only when no unit at or after
    ``batch`` holds it (else it was made again later: its stale key groups are cleared).
    A piece of a changelog (:mod:`.deltas`) passes its key groups ``within`` (a key outside
    them is refused) and the set of ``(batch, column family)`` already ``dropped`` by
    another piece of its batch (a drop is applied once)."""
    n = 0
    stale_global = coverage.global_version < batch
    versions = coverage.versions
    for rec in read_records(data, where):
        n += 1
        is_global = rec.cf in GLOBAL_COLUMN_FAMILIES
        if within is not None and is_global and rec.op in (OP_WRITE, OP_DELETE_RANGE):
            raise outside(rec.cf, within, where)  # a piece holds no global change
        if rec.op == OP_WRITE:
            assert rec.entries is not None
            if is_global:
                if stale_global:
                    instance.write({rec.cf: rec.entries}, wal=False)
                continue
            keep = stale_entries(rec.cf, rec.entries, batch, versions, within, where)
            if keep:
                instance.write({rec.cf: keep}, wal=False)
        elif rec.op == OP_DELETE_RANGE:
            if within is not None and not (kg_prefix(within[0]) <= rec.start
                                           and rec.end <= kg_end(within[1])):
                raise outside(rec.cf, within, where)
            if is_global:
                if stale_global:
                    instance.delete_range(rec.cf, rec.start, rec.end)
                continue
            _delete_stale(instance, rec.cf, rec.start, rec.end, batch, versions)
        elif rec.op == OP_CREATE_CF:
            instance.column_family(rec.cf)
        elif rec.op == OP_DROP_CF:
            if dropped is not None:
                if (batch, rec.cf) in dropped:
                    continue
                dropped.add((batch, rec.cf))
            if rec.cf not in instance.column_family_names():
                continue
            held_later = any(u.checkpoint_id >= batch and rec.cf in u.column_families
                             for u in units)
            if not held_later:
                instance.drop_column_family(rec.cf)
            elif not is_global:
                _delete_stale(instance, rec.cf, b"", kg_end(MAX_KEY_GROUP), batch, versions)
            elif stale_global:
                _clear_cf(instance, rec.cf)
    return n


def stale_entries(cf: str, entries: dict[bytes, bytes | None], batch: int,
                   versions: dict[int, int], within: tuple[int, int] | None, where: str
                   ) -> dict[bytes, bytes | None]:
    """The entries of key groups whose unit is older than ``batch``; refused when one is
    outside a piece's key groups ``within``. When every key group from the first key's to
    the last's is older (a piece's usual case), all of them, checked by those two keys
    alone (keys order by key group first); else one key-group decode per key."""
    if entries:
        first, last = kg_of(min(entries)), kg_of(max(entries))
        if ((within is None or within[0] <= first and last <= within[1])
                and all(versions.get(kg, -1) < batch for kg in range(first, last + 1))):
            return entries
    keep = {}
    for k, v in entries.items():
        kg = kg_of(k)
        if within is not None and not within[0] <= kg <= within[1]:
            raise outside(cf, within, where)
        if versions.get(kg, -1) < batch:
            keep[k] = v
    return keep


def outside(cf: str, within: tuple[int, int], where: str) -> CorruptStateError:
    return CorruptStateError(f"{where}: a piece of key groups {within[0]}..{within[1]} "
                             f"holds a change of {cf!r} outside them: another "
                             f"partition's or range's piece", path=where)


MAX_KEY_GROUP = (1 << 15) - 1


def _delete_stale(instance: RocksDBInstance, cf: str, start: bytes, end: bytes, batch: int,
                  versions: dict[int, int]) -> None:
    """``delete_range(start, end)`` on the key groups whose unit is older than ``batch``."""
    if start >= end:
        return
    for kg in range(kg_of(start), min(kg_of(end), MAX_KEY_GROUP) + 1):
        if versions.get(kg, -1) >= batch:
            continue
        lo, hi = max(start, kg_prefix(kg)), min(end, kg_end(kg))
        if lo < hi:
            instance.delete_range(cf, lo, hi)


def _clear_cf(instance: RocksDBInstance, cf: str) -> None:
    keys = [k for k, _v in instance.scan_range(cf, b"", None)]
    if keys:
        instance.write({cf: dict.fromkeys(keys)})


def unit_files(manifest: PartitionManifest, units: Sequence[SliceRef]
               ) -> list[list[FileEntry]]:
    """The entries of each unit's files in ``manifest`` (refused when one is missing)."""
    have = manifest.slice_files  # a dict built from every file: once for all units
    out = []
    for unit in units:
        entries = []
        for name in unit.file_names():
            f = have.get(name)
            if f is None:
                raise CorruptStateError(
                    f"checkpoint {manifest.checkpoint_id} partition {manifest.partition} "
                    f"({manifest.path}): slice file {name} of the unit of batch "
                    f"{unit.checkpoint_id} is not among its files; the committed state "
                    f"cannot be restored", checkpoint_id=manifest.checkpoint_id,
                    partition=manifest.partition, path=manifest.path)
            entries.append(f)
        out.append(entries)
    return out


def fetch_unit_paths(manifest: PartitionManifest, units: Sequence[SliceRef], directory: str
                     ) -> list[tuple[SliceRef, list[tuple[FileEntry, str]]]]:
    """Each unit with ``(entry, local path)`` for each of its files, under ``directory``."""
    return [(u, [(f, os.path.join(directory, f"{u.checkpoint_id}-{f.name}")) for f in fs])
            for u, fs in zip(units, unit_files(manifest, units))]
