"""Rolling slices' changelog pieces: a batch's changelog cut by key-group range.

A rolling partition (:mod:`.slices`) keeps, for every key group, the changes made after its
unit was written. A changelog kept whole lives until every slice was rewritten after it
(one rotation of ``N`` batches), so a partition referenced ``1 + cN`` of its state at churn
``c``. Cut into pieces by key-group range, a piece is dropped as soon as the slices of its
range were rewritten after its batch, on average half a rotation: ``1 + cN/2`` referenced
for the same bytes written (``1 + 1/(cN)`` of the changed bytes), which is what lets a count
near ``0.5/c`` meet both 3x written and ~1.3x referenced.

A batch that wrote records cuts its changelog (:func:`split_changelog`) into pieces over
key-group ranges aligned with the rotation (:func:`piece_ranges`: :data:`PIECES` groups of
the slices by their next turn, none for the slice the batch rewrote); writes and range
deletes go to the pieces of their key groups, a column family dropped goes to every piece (the writes to it before the
drop are dead and left out, so each piece holds at most one drop per column family and its
writes after it), and the global column families' records to none (the batch's global unit
holds them). A batch that wrote nothing leaves one empty piece over the whole range, so
every batch after a key group's unit has a piece covering it: :func:`delta_problems` checks
exactly that, and that each piece is in its own batch's directory of this partition, for a
restore and for ``verify``. A restore replays the pieces in batch order
(:func:`replay_piece`), each clipped to the key groups whose unit is older, a drop applied
once per batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from ..errors import CorruptStateError
from ..keys.kernels import sorted_items
from ..model.manifest import PartitionManifest, SliceRef
from ..model.slice_ref import DELTA
from ..rocksdb.instance import RocksDBInstance
from .changelog import (
    OP_CREATE_CF,
    OP_DELETE_RANGE,
    OP_DROP_CF,
    OP_WRITE,
    ChangelogWriter,
    read_records,
    span,
)
from .slices import (
    GLOBAL_COLUMN_FAMILIES,
    Coverage,
    by_turn,
    covering,
    ingest_moved,
    kg_end,
    kg_of,
    kg_prefix,
    outside,
    replay_filtered,
    slice_ranges,
    stale_entries,
    write_sst,
)

PIECES = 8
"""Pieces a batch's changelog is cut into (fewer for fewer key groups): more pieces are
dropped sooner (a piece lives until the last slice of its range is rewritten) but cost a
request each per batch."""


def piece_ranges(key_group_range: tuple[int, int], n: int, versions: dict[int, int],
                 rewritten: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The key-group ranges a batch's changelog is cut into, aligned with the rotation:
    the ``n`` slices but those the batch ``rewritten`` (their units hold its changes), in
    the order they are rewritten next (oldest unit first, ``versions`` as in
    :func:`~.slices.due_ranges`), :data:`PIECES` groups of consecutive ones, each group's
    contiguous runs a range. A piece is dropped once the last slice of its range is
    rewritten: grouped by turn it lives until its group's turn (on average ~9/16 of a
    rotation with 8 groups), not until a fixed range's last slice (~5/8). Ranges in key
    order; fixed equal ranges when the turns are not a rotation (over ``2 x PIECES``
    runs)."""
    done = set(rewritten)
    todo = [r for r in slice_ranges(key_group_range, n) if r not in done]
    if not todo:
        return []
    order = by_turn(todo, versions)
    groups = min(PIECES, len(order))
    runs: list[tuple[int, int]] = []
    for g in range(groups):
        group = sorted(order[g * len(order) // groups: (g + 1) * len(order) // groups])
        first, last = group[0]
        for a, b in group[1:]:
            if a != last + 1:
                runs.append((first, last))
                first = a
            last = b
        runs.append((first, last))
    if len(runs) > 2 * PIECES:
        return slice_ranges(key_group_range, PIECES)
    return sorted(runs)


def split_changelog(path: str, key_group_range: tuple[int, int], base: int, batch: int,
                    directory: str, ranges: Sequence[tuple[int, int]] | None = None
                    ) -> list[tuple[SliceRef, list[str]]]:
    """Cut the finished changelog at ``path`` into pieces under ``directory`` (see the
    module docstring), over ``ranges`` (:func:`piece_ranges`; default :data:`PIECES`
    equal ones); each piece with its local path. One pass over the records: each entry
    goes to the piece of its key group (none: its slice's unit holds it)."""
    with open(path, "rb") as fh:
        records = list(read_records(fh.read(), path))
    last_drop = {r.cf: i for i, r in enumerate(records) if r.op == OP_DROP_CF}
    ranges = ((list(ranges) if ranges else slice_ranges(key_group_range, PIECES)) if records
              else [key_group_range])
    refs = [SliceRef(first, last, batch, (), DELTA) for first, last in ranges]
    paths = [os.path.join(directory, ref.file_name(0)) for ref in refs]
    writers = [ChangelogWriter(p) for p in paths]
    piece_of = {kg: i for i, (first, last) in enumerate(ranges)
                for kg in range(first, last + 1)}
    for i, r in enumerate(records):
        if i < last_drop.get(r.cf, -1) or r.cf in GLOBAL_COLUMN_FAMILIES:
            continue  # dead before its column family's drop; or the global unit's
        if r.op == OP_WRITE:
            assert r.entries is not None
            parts: list[dict[bytes, bytes | None]] = [{} for _w in writers + [None]]
            for k, v in r.entries.items():
                parts[piece_of.get(kg_of(k), -1)][k] = v
            parts.pop()  # the rewritten slices' entries: in their units
            for w, part in zip(writers, parts):
                w.write(r.cf, part)
        elif r.op == OP_DELETE_RANGE:
            for w, (first, last) in zip(writers, ranges):
                start, end = max(r.start, kg_prefix(first)), min(r.end, kg_end(last))
                if start < end:
                    w.delete_range(r.cf, start, end)
        else:
            for w in writers:
                (w.create_column_family if r.op == OP_CREATE_CF
                 else w.drop_column_family)(r.cf)
    for w in writers:
        w.finish(base=base, batch=batch)
    return [(ref, [p]) for ref, p in zip(refs, paths)]


def delta_problems(m: PartitionManifest, after: int, end: int
                   ) -> tuple[int, list[tuple[str, str]]]:
    """Whether ``m``'s deltas carry every key group from ``after`` (where its whole
    changelogs end) to batch ``end``: the batch the state reaches, and ``(path, what is
    wrong)`` for each piece not in its batch's directory of this partition and for the
    first batch a key group has no piece of."""
    deltas = [d for d in m.slices if d.is_delta]
    if not deltas:
        return after, []
    problems = []
    have = m.slice_files
    for d in deltas:
        f = have.get(d.file_name(0))  # one not listed: verify's slices_listed, unit_files
        home = f"chk-{d.checkpoint_id}/p{m.partition}/"
        if f is not None and not f.path.startswith(home):
            problems.append((f.path, f"slices: the piece {d.file_name(0)} of batch "
                                     f"{d.checkpoint_id} is at {f.path}, not under {home}: "
                                     f"another partition's or batch's changes"))
    versions = covering((m.key_group_start, m.key_group_end), m.slices,
                        m.materialized_id).versions
    by_batch: dict[int, list[SliceRef]] = {}
    for d in deltas:
        by_batch.setdefault(d.checkpoint_id, []).append(d)
    for b in range(after + 1, end + 1):
        pieces = by_batch.get(b, [])
        missing = [kg for kg, v in versions.items() if v < b and not any(
            d.first_kg <= kg <= d.last_kg for d in pieces)]
        if missing:
            problems.append((m.path, f"slices: batch {b}'s changes to key groups "
                                     f"{missing[0]}..{missing[-1]} are in no listed piece "
                                     f"(their unit is of batch {versions[missing[0]]}): a "
                                     f"piece is missing"))
            return b - 1, problems
    return end, problems


def replay_piece(instance: RocksDBInstance, d: SliceRef, data: bytes, where: str,
                 cover: Coverage, units: Sequence[SliceRef],
                 dropped: set[tuple[int, str]]) -> int:
    """Replay piece ``d`` (its bytes ``data``, read from ``where``) onto a state with every
    unit in place and the pieces of earlier batches replayed; records read. ``dropped``:
    the column families a piece of the same batch dropped already (shared by the pieces
    of a restore). A piece whose footer names another batch, or holding a key outside its
    range, is refused."""
    _footer_checked(d, data, where)
    return replay_filtered(instance, data, d.checkpoint_id, cover, units, where,
                           within=(d.first_kg, d.last_kg), dropped=dropped)


def _footer_checked(d: SliceRef, data: bytes, where: str) -> None:
    got = span(data, where)[1]
    if got != d.checkpoint_id:
        raise CorruptStateError(f"the piece {d.file_name(0)} holds the changes of batch "
                                f"{got}, not {d.checkpoint_id}", path=where)


MERGE_BYTES = 256 << 20
"""Bytes of pieces one merge of a restore takes (:class:`Merged`): the memory their latest
values hold until its SST files are written."""


class Merged:
    """Pieces of a restore merged while its units download: per column family the latest
    write of each key whose unit is older than its batch, so they go in with one ingest
    (or write) per column family once the units are in place, not one replay per piece
    after them. Only writes merge (a last write wins whatever came before it): a piece
    with a range delete or a column-family drop is replayed alone (:func:`replay_piece`)
    between the merges before and after it.

    :meth:`to_files` writes them as one SST file per column family (by the thread that
    merged them, while the units still download), so what is left after the units is an
    ingest: 150 MB of merged pieces went in 0.49 s as a write, and the write's memtables
    cost another flush when the instance closed or checkpointed. Each later merge's files
    are ingested after the earlier ones, so RocksDB gives them newer sequence numbers: the
    same precedence as replaying in batch order."""

    def __init__(self, cover: Coverage, number: int = 0) -> None:
        self.cover = cover
        self.number = number  # of the merges of one restore, in order
        self.writes: dict[str, dict[bytes, bytes | None]] = {}
        self.files: dict[str, str] = {}  # column family -> its SST file (to_files)
        self.created: list[str] = []
        self.bytes = self.pieces = 0

    def add(self, d: SliceRef, data: bytes, where: str) -> bool:
        """Merge piece ``d`` (checked as :func:`replay_piece` checks it); False, with
        nothing merged, when it holds something other than writes."""
        _footer_checked(d, data, where)
        within = (d.first_kg, d.last_kg)
        records = list(read_records(data, where))
        if any(r.op not in (OP_WRITE, OP_CREATE_CF) for r in records):
            return False
        for r in records:
            if r.op == OP_CREATE_CF:
                self.created.append(r.cf)
                continue
            if r.cf in GLOBAL_COLUMN_FAMILIES:
                raise outside(r.cf, within, where)  # a piece holds no global change
            assert r.entries is not None
            keep = stale_entries(r.cf, r.entries, d.checkpoint_id, self.cover.versions,
                                 within, where)
            self.writes.setdefault(r.cf, {}).update(keep)
        self.bytes += len(data)
        self.pieces += 1
        return True

    def to_files(self, directory: str) -> None:
        """Write the merged writes as an SST file per column family into ``directory``
        (on the instance's file system: :meth:`apply` moves them in), in key order."""
        for i, (cf, entries) in enumerate(sorted(self.writes.items())):
            path = os.path.join(directory, f"merged-{self.number}-{i}.sst")
            if entries and write_sst(zip(*sorted_items(entries)), path):
                self.files[cf] = path
        self.writes = {}

    def apply(self, instance: RocksDBInstance) -> None:
        for cf in self.created:
            instance.column_family(cf)
        for cf, path in self.files.items():
            ingest_moved(instance, cf, [path])
        for cf, entries in self.writes.items():
            if entries:
                instance.write({cf: entries}, wal=False)


def merged_ahead(pieces: Sequence[SliceRef], fetched: Iterator[tuple[object, bytes, bool]],
                 cover: Coverage, most: int = MERGE_BYTES,
                 directory: str | None = None) -> Iterator[tuple]:
    """In batch order: ``("merged", Merged)`` of each run of pieces of writes, at most
    ``most`` bytes each (a larger piece alone), in SST files in ``directory`` when given,
    and ``("piece", d, file, data)`` of each piece holding a range delete or a drop;
    ``fetched`` yields ``(file, data, downloaded)`` of each piece."""
    merged = Merged(cover)

    def done() -> Iterator[tuple]:
        """The merge so far, if it holds any piece (in SST files), and a new one."""
        nonlocal merged
        if merged.pieces:
            if directory is not None:
                merged.to_files(directory)
            yield "merged", merged
            merged = Merged(cover, merged.number + 1)

    for d, (f, data, _downloaded) in zip(pieces, fetched):
        if merged.bytes + len(data) > most:
            yield from done()
        if not merged.add(d, data, f.path):
            yield from done()
            yield "piece", d, f, data
    yield from done()
