"""The change feed of an operator: what was put and deleted between two retained checkpoints.

Rows have the columns of :mod:`statebackend.read.rows` after two more:

==============  =============================================================
batch_id        the checkpoint (micro-batch) whose state first holds the change
operation       ``put`` or ``delete``
partition_id    ... then the columns of ``read_state``
==============  =============================================================

The unit is an *entry*, as the state stores it: a value state's key, a map state's
(key, user key), a timer's (key, ts), a list state's whole list. A ``put`` gives the entry's
new content (a list: one row per element, in order, together the new list); a ``delete``
names the entry (``user_key`` for a map, ``value`` holds a timer's ts, else ``value`` is
null). Replaying the feed onto checkpoint ``a``'s state batch by batch — delete the named
entries, replace the put ones — gives checkpoint ``b``'s state.

Where the changes come from, per partition:

* **changelogs** (changelog mode) when checkpoint ``b``'s manifest lists checkpoint ``a``'s
  base and changelogs (or a materialization of ``a`` itself as its base) and then the
  changelog of every later batch up to ``b``: one
  ``batch_id`` per batch, the net effect of that batch per entry (a key put twice in a
  batch appears once). A delete of an entry that did not exist may appear (the state
  deleted what it did not know was absent); replaying it changes nothing.
* **comparison** otherwise (incremental mode; a materialization between ``a`` and ``b``; a
  range deletion or dropped state in a changelog; value blocks, which a changelog holds
  only whole): both checkpoints are opened and merged in key order, and every difference
  is one change with ``batch_id = b``.

The driver reads only records and manifests; each partition is one unit of work
(:func:`change_rows` on the driver or in the CLI, :func:`read_changes` one Spark task per
partition). Different parallelism in ``a`` and ``b`` (a rescale) is handled by comparison:
each partition of ``b`` is compared with the key groups it owns in ``a``'s partitions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..checkpoint.changelog import OP_CREATE_CF, OP_WRITE, read_records
from ..checkpoint.restore import fetch_changelog
from ..errors import StateError
from ..model.manifest import FileEntry, PartitionManifest, StateDescriptor, changelog_id
from ..progress import ProgressFn
from ..rocksdb.instance import RocksDBInstance
from ..state.evolution import merge_descriptors
from ..storage.base import DurableStore
from ..storage.manifests import operator_store
from .rows import (
    CheckpointView,
    EntryDecoder,
    ReadUnit,
    load_checkpoint,
    open_unit,
    rows_to_pandas,
    select_states,
    spark_schema,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ChangeRow", "ChangeUnit", "change_rows", "changes_schema", "changes_to_pandas",
           "plan_changes", "select_change_units", "unit_changes"]

PUT = "put"
DELETE = "delete"


@dataclass(frozen=True)
class ChangeRow:
    """One row of the change feed (see the module docstring)."""

    batch_id: int
    operation: str
    partition_id: int
    key: tuple[Any, ...]
    state_name: str
    user_key: tuple[Any, ...] | None
    value: tuple[Any, ...] | None
    expiration_ms: int | None


@dataclass(frozen=True)
class ChangeUnit:
    """One partition of checkpoint ``b`` and what it is compared with: ``old`` are the units
    of ``a`` that own some of its key groups; ``changelogs`` the changelogs to decode
    instead (None: compare)."""

    new: ReadUnit
    old: tuple[ReadUnit, ...]
    changelogs: tuple[FileEntry, ...] | None


@dataclass(frozen=True)
class ChangePlan:
    """What :func:`plan_changes` read: both checkpoints and one unit per partition of b."""

    operator_id: str
    from_id: int
    to_id: int
    view: CheckpointView  # b's, with the states of both checkpoints
    units: tuple[ChangeUnit, ...]


def _chain(m: PartitionManifest) -> tuple[Any, tuple[str, ...]]:
    return m.materialization, tuple(f.path for f in m.changelog_files)


def changelogs_between(old: PartitionManifest, new: PartitionManifest
                       ) -> tuple[FileEntry, ...] | None:
    """The changelogs that turn ``old``'s state into ``new``'s, or None when ``new``'s
    manifest does not hold them all (another mode, another base, a gap)."""
    if old.mode != "changelog" or new.mode != "changelog":
        return None
    if (old.key_group_start, old.key_group_end) != (new.key_group_start, new.key_group_end):
        return None
    base_old, logs_old = _chain(old)
    base_new, logs_new = _chain(new)
    if base_new is not None and (base_new.checkpoint_id, base_new.attempt) == \
            (old.checkpoint_id, old.attempt):
        after = new.changelog_files  # new's base is a snapshot of old's very state
    elif base_old == base_new and logs_new[:len(logs_old)] == logs_old:
        after = new.changelog_files[len(logs_old):]
    else:
        return None
    ids = [changelog_id(f.name) for f in after]
    if ids != list(range(old.checkpoint_id + 1, new.checkpoint_id + 1)):
        return None  # a batch without a changelog (materialized inline) or a gap
    return after


def plan_changes(store: DurableStore, operator_id: str, from_id: int, to_id: int, *,
                 key_types: Sequence[str] | None = None) -> ChangePlan:
    """Read the records and manifests of checkpoints ``from_id`` and ``to_id`` (both
    retained) and decide, per partition of ``to_id``, changelogs or comparison.

    Raises
    ------
    StateError
        ``from_id`` is not before ``to_id``, or the two use different max_parallelism.
    CheckpointNotFoundError
        Either checkpoint is not retained.
    """
    if from_id >= to_id:
        raise StateError(f"a change feed runs from an older checkpoint to a newer one; got "
                         f"from {from_id} to {to_id}")
    a = load_checkpoint(store, operator_id, from_id, key_types=key_types)
    b = load_checkpoint(store, operator_id, to_id, key_types=key_types)
    if a.record.max_parallelism != b.record.max_parallelism:
        raise StateError(f"checkpoints {from_id} and {to_id} of {operator_id!r} use "
                         f"max_parallelism {a.record.max_parallelism} and "
                         f"{b.record.max_parallelism}: their keys are not comparable")
    # b's schema wins for a state both declare; a's schema versions stay readable
    states = {**a.states, **{n: merge_descriptors(d, a.states[n]) or d
                             if n in a.states else d for n, d in b.states.items()}}
    view = replace(b, states=states)
    old_units = a.units()
    blocks = any(d.kind == "blocks" for d in states.values())
    units = []
    for u in b.units():
        old = tuple(o for o in old_units if o.key_group_start <= u.key_group_end
                    and o.key_group_end >= u.key_group_start)
        logs = None
        if len(old) == 1 and not blocks:
            assert old[0].manifest is not None and u.manifest is not None
            logs = changelogs_between(old[0].manifest, u.manifest)
        units.append(ChangeUnit(u, old, logs))
    return ChangePlan(operator_id, from_id, to_id, view, tuple(units))


# --- one unit ------------------------------------------------------------------------------


def unit_changes(store: DurableStore, plan: ChangePlan, unit: ChangeUnit,
                 states: Sequence[StateDescriptor], temp_dir: str | None = None
                 ) -> Iterator[ChangeRow]:
    """The changes of one partition of ``b``, from its changelogs when it has them and they
    hold only entry writes, else by comparing the two checkpoints."""
    decoders = {d.name: EntryDecoder(d, plan.view.key_types) for d in states}
    if unit.changelogs is not None:
        batches = _changelog_batches(store, plan, unit, decoders)
        if batches is not None:
            for batch_id, per_cf in batches:
                yield from _rows(batch_id, unit.new.partition, per_cf, decoders)
            return
    yield from _compare(store, plan, unit, decoders, temp_dir)


def _changelog_batches(store: DurableStore, plan: ChangePlan, unit: ChangeUnit,
                       decoders: dict[str, EntryDecoder]
                       ) -> list[tuple[int, dict[str, dict[bytes, bytes | None]]]] | None:
    """Per batch, the net writes of the batch per state; None when a changelog holds
    something the feed cannot name entry by entry (a range deletion, a dropped state)."""
    assert unit.changelogs is not None and unit.new.manifest is not None
    ostore = operator_store(store, plan.operator_id)
    out = []
    for f in unit.changelogs:
        data, _ = fetch_changelog(ostore, unit.new.manifest, f)
        per_cf: dict[str, dict[bytes, bytes | None]] = {}
        for rec in read_records(data, where=f.path):
            if rec.cf not in decoders or rec.op == OP_CREATE_CF:
                continue
            if rec.op != OP_WRITE:
                return None
            assert rec.entries is not None
            per_cf.setdefault(rec.cf, {}).update(rec.entries)
        out.append((changelog_id(f.name), per_cf))
    return out


def _rows(batch_id: int, partition: int, per_cf: dict[str, dict[bytes, bytes | None]],
          decoders: dict[str, EntryDecoder]) -> Iterator[ChangeRow]:
    for cf in sorted(per_cf):
        dec = decoders[cf]
        for k in sorted(per_cf[cf]):
            yield from _entry_rows(batch_id, partition, cf, dec, k, per_cf[cf][k])


def _entry_rows(batch_id: int, partition: int, cf: str, dec: EntryDecoder, k: bytes,
                raw: bytes | None) -> Iterator[ChangeRow]:
    if raw is not None:
        n = 0
        for key, user_key, value, exp in dec.rows(k, raw):
            n += 1
            yield ChangeRow(batch_id, PUT, partition, key, cf, user_key, value, exp)
        if n:
            return  # an empty list is no entry: fall through to a delete
    key, user_key, value, exp = dec.identity(k)
    yield ChangeRow(batch_id, DELETE, partition, key, cf, user_key, value, exp)


def _kg_bounds(unit: ReadUnit) -> tuple[bytes, bytes | None]:
    end = unit.key_group_end + 1
    return unit.key_group_start.to_bytes(2, "big"), (end.to_bytes(2, "big") if end < 1 << 16
                                                     else None)


def _scan(inst: RocksDBInstance, cf: str, unit: ReadUnit) -> Iterator[tuple[bytes, bytes]]:
    if cf not in inst.column_family_names():
        return iter(())
    start, end = _kg_bounds(unit)
    return inst.scan_range(cf, start, end)


def _compare(store: DurableStore, plan: ChangePlan, unit: ChangeUnit,
             decoders: dict[str, EntryDecoder], temp_dir: str | None) -> Iterator[ChangeRow]:
    """Merge b's partition with the key groups it owns in a, state by state in key order."""
    p, batch_id = unit.new.partition, plan.to_id
    with ExitStack() as stack:
        new = stack.enter_context(open_unit(store, plan.operator_id, unit.new, temp_dir))
        olds = [stack.enter_context(open_unit(store, plan.operator_id, o, temp_dir))
                for o in unit.old]
        for cf in sorted(decoders):
            dec = decoders[cf]
            # a's partitions own disjoint key-group ranges in order: chained, still sorted
            old_it = heapq.merge(*(_scan(i, cf, unit.new) for i in olds))
            for k, before, after in _merge(old_it, _scan(new, cf, unit.new)):
                if dec.kind == "blocks":
                    yield from _block_changes(batch_id, p, cf, dec, k, before, after)
                else:
                    yield from _entry_rows(batch_id, p, cf, dec, k, after)


def _merge(old: Iterator[tuple[bytes, bytes]], new: Iterator[tuple[bytes, bytes]]
           ) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """``(key, old value, new value)`` for every key whose value differs (None: absent)."""
    o = next(old, None)
    n = next(new, None)
    while o is not None or n is not None:
        if n is None or (o is not None and o[0] < n[0]):
            assert o is not None
            yield o[0], o[1], None
            o = next(old, None)
        elif o is None or n[0] < o[0]:
            yield n[0], None, n[1]
            n = next(new, None)
        else:
            if o[1] != n[1]:
                yield n[0], o[1], n[1]
            o, n = next(old, None), next(new, None)


def _block_changes(batch_id: int, partition: int, cf: str, dec: EntryDecoder, k: bytes,
                   before: bytes | None, after: bytes | None) -> Iterator[ChangeRow]:
    """A value block holds many keys: the changes are the keys whose values differ."""
    from ..state.value import decode_block

    was = decode_block(cf, k, before) if before is not None else {}
    now = decode_block(cf, k, after) if after is not None else {}
    for gk in sorted(set(was) | set(now)):
        v = now.get(gk)
        if v == was.get(gk):
            continue
        key = dec.grouping_key(gk)
        if v is None:
            yield ChangeRow(batch_id, DELETE, partition, key, cf, None, None, None)
        else:
            yield ChangeRow(batch_id, PUT, partition, key, cf, None, dec.decode(v), None)


# --- the feed: on the driver, as pandas, as a Spark DataFrame -------------------------------


def change_rows(store: DurableStore, operator_id: str, from_id: int, to_id: int,
                state_name: str | None = None, *, partitions: Iterable[int] | None = None,
                key_types: Sequence[str] | None = None, temp_dir: str | None = None,
                progress: ProgressFn | None = None,
                plan: ChangePlan | None = None) -> Iterator[ChangeRow]:
    """The change feed from checkpoint ``from_id`` to ``to_id``, read in this process, one
    partition after the other; in partition order, then batch, state and key order.

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator's directory name.
    from_id, to_id : int
        Two retained checkpoints, ``from_id < to_id``.
    state_name : str, optional
        Only this state (default: all, timers included).
    partitions : iterable of int, optional
        Only these partitions of ``to_id``.
    key_types : sequence of str, optional
        Grouping-key types, for checkpoints that do not record them.
    temp_dir : str, optional
        Where checkpoints are downloaded for comparison.
    progress : callable, optional
        ``progress(partitions, total, 0, 0)`` after each partition.
    plan : ChangePlan, optional
        An already made :func:`plan_changes` (the ids above are then not read again).

    Raises
    ------
    CheckpointNotFoundError
        Either checkpoint is not retained.
    StateError
        See :func:`plan_changes`; no such state or partition.
    """
    plan = plan or plan_changes(store, operator_id, from_id, to_id, key_types=key_types)
    states = select_states(plan.view, state_name)
    units = select_change_units(plan, partitions)
    for i, u in enumerate(units):
        yield from unit_changes(store, plan, u, states, temp_dir)
        if progress is not None:
            progress(i + 1, len(units), 0, 0)


def select_change_units(plan: ChangePlan, partitions: Iterable[int] | None) -> list[ChangeUnit]:
    if partitions is None:
        return list(plan.units)
    by = {u.new.partition: u for u in plan.units}
    unknown = sorted(set(partitions) - set(by))
    if unknown:
        raise StateError(f"checkpoint {plan.to_id} of {plan.operator_id!r} has partitions "
                         f"0..{len(by) - 1}; no partition {unknown}")
    return [by[p] for p in sorted(set(partitions))]


def changes_to_pandas(rows: Iterable[ChangeRow], plan: ChangePlan,
                      state_name: str | None = None) -> pd.DataFrame:
    """Flat frame of the feed: ``batch_id``, ``operation``, then the columns of
    :func:`~statebackend.read.rows.rows_to_pandas`."""
    rows = list(rows)
    frame = rows_to_pandas(rows, plan.view, state_name)
    frame.insert(0, "operation", [r.operation for r in rows])
    frame.insert(0, "batch_id", [r.batch_id for r in rows])
    frame["batch_id"] = frame["batch_id"].astype("int64")
    return frame


def changes_schema(plan: ChangePlan, state_name: str | None = None) -> str:
    """The DDL of the DataFrame :func:`read_changes` returns."""
    return f"batch_id BIGINT, operation STRING, {spark_schema(plan.view, state_name)}"
