"""What a reader of stored state reads: a checkpoint's or a savepoint's view (record,
manifests, states, grouping-key types) and its units (one partition, or one savepoint data
file), and how a unit is opened. No Spark needed; :mod:`statebackend.read.rows`
decodes the units into rows.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint.restore import open_checkpoint
from ..errors import CorruptStateError, StateError
from ..keys.ranges import KeyGroupRange
from ..model.manifest import CompletedCheckpoint, PartitionManifest, StateDescriptor
from ..model.schema import Schema, parse_ddl
from ..rocksdb.instance import RocksDBInstance
from ..state.evolution import merge_descriptors
from ..storage.base import DurableStore
from ..storage.manifests import operator_store, read_recorded_manifests

if TYPE_CHECKING:
    from ..savepoint.format import SavepointManifest

TIMER_SCHEMA = "ts BIGINT"


@dataclass(frozen=True)
class StateRow:
    """One stored entry of a state."""

    partition_id: int
    key: tuple[Any, ...]
    state_name: str
    user_key: tuple[Any, ...] | None
    value: tuple[Any, ...]
    expiration_ms: int | None


@dataclass(frozen=True)
class ReadUnit:
    """What one reader (a loop step on the driver, a Spark task) opens: one partition of a
    checkpoint (``manifest``) or one data file of a savepoint (``savepoint`` and the key
    groups it covers). Small and picklable: it is shipped to executors."""

    partition: int
    key_group_start: int
    key_group_end: int
    manifest: PartitionManifest | None = None
    savepoint: str | None = None  # the savepoint's name (under the operator root)

    @property
    def full_size(self) -> int:
        return self.manifest.full_size if self.manifest is not None else 0


@dataclass(frozen=True)
class CheckpointView:
    """A completed checkpoint's record and chosen manifests, with what decoding needs."""

    record: CompletedCheckpoint
    manifests: dict[int, PartitionManifest]
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    states: dict[str, StateDescriptor]

    @property
    def label(self) -> str:
        return f"checkpoint {self.record.checkpoint_id} of {self.record.operator_id!r}"

    @property
    def checkpoint_id(self) -> int:
        return self.record.checkpoint_id

    def units(self) -> list[ReadUnit]:
        """One unit per partition, in partition order."""
        return [ReadUnit(p, m.key_group_start, m.key_group_end, manifest=m)
                for p, m in sorted(self.manifests.items())]


@dataclass(frozen=True)
class SavepointView:
    """A savepoint's manifest, with what decoding needs: read like a checkpoint whose
    partitions are the savepoint's data files."""

    manifest: SavepointManifest
    key_columns: tuple[str, ...]
    key_types: tuple[str, ...]
    states: dict[str, StateDescriptor]

    @property
    def label(self) -> str:
        return f"savepoint {self.manifest.name!r} of {self.manifest.operator_id!r}"

    @property
    def checkpoint_id(self) -> int | None:
        return self.manifest.checkpoint_id

    def units(self) -> list[ReadUnit]:
        """One unit per data file, in key-group order."""
        files = sorted(self.manifest.files.items(), key=lambda kv: kv[1]["key_group_start"])
        return [ReadUnit(i, int(f["key_group_start"]), int(f["key_group_end"]),
                         savepoint=self.manifest.name) for i, (_n, f) in enumerate(files)]


StateView = CheckpointView | SavepointView


def _key_columns(recorded: set[tuple[tuple[str, ...], tuple[str, ...]]],
                 key_types: Sequence[str] | None, label: str
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if len(recorded) > 1:
        raise CorruptStateError(f"{label}: partitions record different grouping-key types "
                                f"{sorted(recorded)}")
    types: tuple[str, ...]
    columns: tuple[str, ...] = ()
    if key_types is not None:
        types = tuple(key_types)
    elif recorded:
        types, columns = next(iter(recorded))
    else:
        raise StateError(f"{label} does not record its grouping-key types (written by an "
                         f"older version); pass them, e.g. key_types=['string'] (CLI: "
                         f"--key-types string)")
    if len(columns) != len(types):
        columns = tuple(f"key_{i}" for i in range(len(types)))
    return columns, types


def load_savepoint(store: DurableStore, operator_id: str, name: str, *,
                   key_types: Sequence[str] | None = None) -> SavepointView:
    """Read the manifest of savepoint ``name`` of ``operator_id`` (only that file).

    Raises
    ------
    CheckpointNotFoundError
        No published savepoint of that name.
    StateError
        The key types are neither recorded nor given.
    """
    from ..savepoint.reader import SavepointReader
    from ..savepoint.writer import savepoint_dir

    m = SavepointReader(operator_store(store, operator_id).child(savepoint_dir(name))).manifest
    label = f"savepoint {name!r} of {operator_id!r}"
    recorded = set()
    if m.metrics.get("key_types") is not None:
        recorded.add((tuple(m.metrics["key_types"]), tuple(m.metrics.get("key_columns") or ())))
    columns, types = _key_columns(recorded, key_types, label)
    return SavepointView(m, columns, types, {d.name: d for d in m.states})


@contextmanager
def open_unit(store: DurableStore, operator_id: str, unit: ReadUnit,
              temp_dir: str | None = None) -> Iterator[RocksDBInstance]:
    """The state of ``unit``, downloaded (verified) into a private temporary directory and
    opened there; closed and removed on exit. The durable state is only read."""
    from ..savepoint.reader import SavepointReader
    from ..savepoint.writer import savepoint_dir

    ostore = operator_store(store, operator_id)
    tmp = tempfile.mkdtemp(prefix=f"sb-read-p{unit.partition}-", dir=temp_dir)
    try:
        if unit.manifest is not None:
            inst = open_checkpoint(ostore, unit.manifest, tmp)
        else:
            assert unit.savepoint is not None
            inst = RocksDBInstance(tmp)
            try:
                SavepointReader(ostore.child(savepoint_dir(unit.savepoint))).restore_into(
                    inst, KeyGroupRange(unit.key_group_start, unit.key_group_end))
            except BaseException:
                inst.close()
                raise
        with inst:
            yield inst
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_checkpoint(store: DurableStore, operator_id: str, checkpoint_id: int | None = None,
                    *, key_types: Sequence[str] | None = None) -> CheckpointView:
    """Read the record and manifests of a completed checkpoint (the latest by default).

    Parameters
    ----------
    store : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator's directory name.
    checkpoint_id : int, optional
        A completed checkpoint; defaults to the latest one.
    key_types : sequence of str, optional
        Spark type names of the grouping columns, for checkpoints whose manifests do not
        record them.

    Raises
    ------
    CheckpointNotFoundError
        No such completed checkpoint.
    CorruptStateError
        The manifests disagree on a state's schema or on the key types.
    StateError
        The key types are neither recorded nor given.
    """
    from ..storage.records import require_completed_record

    ostore = operator_store(store, operator_id)
    record = require_completed_record(store, operator_id, checkpoint_id)
    manifests = read_recorded_manifests(ostore, record)
    states: dict[str, StateDescriptor] = {}
    recorded: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    for m in manifests.values():
        for d in m.states:
            old = states.setdefault(d.name, d)
            merged = merge_descriptors(old, d)
            if merged is not None:
                states[d.name] = merged
            else:
                raise CorruptStateError(f"checkpoint {record.checkpoint_id}: state {d.name!r} "
                                        f"has different schemas in different partitions",
                                        checkpoint_id=record.checkpoint_id, path=m.path)
        if m.key_types:
            recorded.add((m.key_types, m.key_columns))
    columns, types = _key_columns(recorded, key_types,
                                  f"checkpoint {record.checkpoint_id} of {operator_id!r}")
    return CheckpointView(record, manifests, columns, types, states)


def select_states(view: StateView, state_name: str | None) -> list[StateDescriptor]:
    """The descriptors to read: one named state, or every state (timers included)."""
    if state_name is None:
        return [view.states[n] for n in sorted(view.states)]
    d = view.states.get(state_name)
    if d is None:
        raise StateError(f"{view.label} has no state {state_name!r}; its states are "
                         f"{sorted(view.states)}")
    return [d]


def value_schema(d: StateDescriptor) -> Schema:
    return parse_ddl(TIMER_SCHEMA if d.kind == "timers" else d.value_schema or "")


def user_key_schema(d: StateDescriptor) -> Schema | None:
    return parse_ddl(d.user_key_schema) if d.kind == "map" and d.user_key_schema else None



def select_units(view: StateView, partitions: Iterable[int] | None) -> list[ReadUnit]:
    """The units of ``partitions`` (default all), refusing partitions the view lacks."""
    units = view.units()
    if partitions is None:
        return units
    by_partition = {u.partition: u for u in units}
    wanted = sorted(set(partitions))
    unknown = [p for p in wanted if p not in by_partition]
    if unknown:
        raise StateError(f"{view.label} has partitions 0..{len(units) - 1}; no partition "
                         f"{unknown}")
    return [by_partition[p] for p in wanted]

