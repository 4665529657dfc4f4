"""Writing savepoints: one data file per RocksDB instance, and whole savepoints from a
completed checkpoint.

A savepoint is taken from a *completed* checkpoint, so the running query is never paused:
each partition's checkpoint files are downloaded (or hard-linked from the local copy) into
a scratch directory, opened there, and written out key group by key group. The caller
pins the checkpoint meanwhile (:meth:`RocksDBStateBackend.savepoint` does) so retention
cannot delete its files half-way.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ..checkpoint.restore import open_checkpoint
from ..errors import CorruptStateError, StateBackendError, StorageError
from ..keys.grouping_key import key_group_bounds
from ..keys.ranges import KeyGroupRange
from ..model.manifest import (
    CompletedCheckpoint,
    PartitionManifest,
    StateDescriptor,
    check_component,
)
from ..progress import ProgressFn
from ..rocksdb.instance import RocksDBInstance
from ..state.evolution import merge_descriptors
from ..storage.base import DurableStore
from ..storage.manifests import operator_store, read_manifest, read_recorded_manifests
from .format import (
    GLOBAL_KEY_GROUP,
    MAGIC,
    SAVEPOINT_MANIFEST,
    BlockInfo,
    FileMeta,
    SavepointManifest,
    compress,
    data_file_name,
    encode_block,
    encode_footer,
)

__all__ = [
    "GLOBAL_COLUMN_FAMILIES",
    "merge_state",
    "SAVEPOINTS_DIR",
    "FileStats",
    "create_savepoint",
    "savepoint_dir",
    "write_data_file",
]

log = logging.getLogger(__name__)

SAVEPOINTS_DIR = "_savepoints"
"""Under the operator root; the coordinator's retention and sweeps never look here."""

GLOBAL_COLUMN_FAMILIES = frozenset({"_meta"})
"""Column families whose keys do not start with a key group (the state layer's
descriptors and timer-service marker): restored into every partition."""


def savepoint_dir(name: str) -> str:
    """Directory of savepoint ``name``, relative to the operator root."""
    return f"{SAVEPOINTS_DIR}/{check_component(name)}"


@dataclass(frozen=True)
class FileStats:
    """What writing one data file produced."""

    path: str
    entries: int
    raw_bytes: int
    stored_bytes: int
    blocks: int
    seconds: float


def write_data_file(instance: RocksDBInstance, path: str, kg_range: KeyGroupRange,
                    max_parallelism: int, states: Sequence[StateDescriptor] = (),
                    compression: str = "snappy") -> FileStats:
    """Write the entries of ``kg_range`` of every column family of ``instance`` to ``path``.

    Blocks are written key group by key group (all column families of key group ``g``,
    then ``g + 1``), so a reader restoring a key-group range reads one contiguous byte
    range of the file.

    Parameters
    ----------
    instance : RocksDBInstance
        An open instance (not written while this runs).
    path : str
        Local file to create.
    kg_range : KeyGroupRange
        Key groups the file covers (those of the instance's partition).
    max_parallelism : int
        Key groups of the state.
    states : sequence of StateDescriptor
        Declared states, recorded in the file.
    compression : {"snappy", "none"}
        Per-block compression.

    Returns
    -------
    FileStats
    """
    t0 = time.perf_counter()
    compress(b"", compression)  # refuse an unknown compression before writing anything
    cfs = sorted(instance.column_family_names())
    with open(path, "wb") as out:
        w = _BlockWriter(out, compression)
        for i, cf in enumerate(cfs):
            if cf in GLOBAL_COLUMN_FAMILIES:
                entries = list(instance.scan_range(cf, b"", None))
                if entries:
                    w.emit(i, GLOBAL_KEY_GROUP, entries)
        if not kg_range.is_empty:
            _write_keyed(instance, cfs, kg_range, w.emit)
        out.write(encode_footer(
            FileMeta(max_parallelism, kg_range.start, kg_range.end, compression, tuple(cfs),
                     tuple(states)), w.blocks, w.offset))
        out.flush()
        os.fsync(out.fileno())
    return FileStats(path, w.entries, w.raw_bytes, w.stored_bytes, len(w.blocks),
                     time.perf_counter() - t0)


class _BlockWriter:
    """Appends compressed blocks to a data file and indexes them."""

    def __init__(self, out: BinaryIO, compression: str) -> None:
        out.write(MAGIC)
        self.out = out
        self.compression = compression
        self.offset = len(MAGIC)
        self.blocks: list[BlockInfo] = []
        self.raw_bytes = self.stored_bytes = self.entries = 0

    def emit(self, cf_idx: int, kg: int, entries: list[tuple[bytes, bytes]]) -> None:
        raw, n = encode_block(entries)
        stored = compress(raw, self.compression)
        self.out.write(stored)
        self.blocks.append(BlockInfo(cf_idx, kg, self.offset, len(stored), len(raw), n,
                                     zlib.crc32(stored)))
        self.offset += len(stored)
        self.raw_bytes += len(raw)
        self.stored_bytes += len(stored)
        self.entries += n


def _write_keyed(instance: RocksDBInstance, cfs: list[str], kg_range: KeyGroupRange,
                 emit: Callable[[int, int, list[tuple[bytes, bytes]]], None]) -> None:
    """Merge one range scan per column family into key-group-major blocks."""
    start, end = key_group_bounds(kg_range)
    scans: dict[int, Iterator[tuple[bytes, bytes]]] = {}
    heads: dict[int, tuple[bytes, bytes] | None] = {}
    for i, cf in enumerate(cfs):
        if cf in GLOBAL_COLUMN_FAMILIES:
            continue
        scans[i] = instance.scan_range(cf, start, end)
        heads[i] = next(scans[i], None)
    while True:
        live = [h[0][:2] for h in heads.values() if h is not None]
        if not live:
            return
        prefix = min(live)
        kg = int.from_bytes(prefix, "big")
        for i in sorted(heads):
            head = heads[i]
            if head is None or head[0][:2] != prefix:
                continue
            entries = []
            it = scans[i]
            while head is not None and head[0][:2] == prefix:
                entries.append(head)
                head = next(it, None)
            heads[i] = head
            emit(i, kg, entries)


# --- whole savepoints -----------------------------------------------------------------


def create_savepoint(root: DurableStore, operator_id: str, name: str | None = None, *,
                     checkpoint_id: int | None = None, compression: str = "snappy",
                     local_root: str | None = None,
                     open_instance: Callable[[str], RocksDBInstance] = RocksDBInstance,
                     progress: ProgressFn | None = None) -> SavepointManifest:
    """Write savepoint ``name`` of ``operator_id`` from a completed checkpoint.

    Parameters
    ----------
    root : DurableStore
        Rooted at the backend root.
    operator_id : str
        The operator.
    name : str, optional
        Savepoint name (letters, digits, ``._=-``); default ``sp-<checkpoint id>-<ms>``.
    checkpoint_id : int, optional
        The completed checkpoint to copy; default the latest.
    compression : {"snappy", "none"}
        Per-block compression.
    local_root : str, optional
        Scratch space (a temporary directory by default).
    open_instance : callable
        ``path -> RocksDBInstance``.
    progress : callable, optional
        ``progress(partitions, total, bytes, total_bytes)`` after each partition is
        written (bytes: its checkpoint files); see :mod:`statebackend.progress`.

    Returns
    -------
    SavepointManifest
        As published at ``<operator_id>/_savepoints/<name>/_SAVEPOINT.json``.

    Raises
    ------
    CheckpointNotFoundError
        No such completed checkpoint.
    StorageError
        A savepoint of that name already exists, or an upload failed (nothing published).
    """
    from ..storage.records import require_completed_record

    t0 = time.perf_counter()
    op_store = operator_store(root, operator_id)
    record = require_completed_record(root, operator_id, checkpoint_id)
    name = name or f"sp-{record.checkpoint_id}-{int(time.time() * 1000)}"
    sp_dir = savepoint_dir(name)
    refuse_existing(op_store, operator_id, name)
    scratch = tempfile.mkdtemp(prefix="sb-savepoint-", dir=local_root)
    try:
        copied = _copy_partitions(op_store, record, sp_dir, scratch, compression,
                                  open_instance, progress)
        manifest = _manifest_of(op_store, record, operator_id, name, compression, copied, t0)
        # Published last (invariant 3): a reader never sees a savepoint missing a file.
        op_store.put_bytes_atomic(f"{sp_dir}/{SAVEPOINT_MANIFEST}", manifest.to_json())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("savepoint %s of %s from checkpoint %d: %d entries, %d -> %d bytes",
             name, operator_id, record.checkpoint_id, copied.entries, copied.raw,
             copied.stored)
    return manifest


def refuse_existing(op_store: DurableStore, operator_id: str, name: str) -> None:
    """StorageError when savepoint ``name`` exists (savepoints are never overwritten)."""
    sp_dir = savepoint_dir(name)
    if op_store.exists(f"{sp_dir}/{SAVEPOINT_MANIFEST}") or op_store.list_dir(sp_dir):
        raise StorageError(f"savepoint {name!r} of operator {operator_id!r} already exists "
                           f"under {sp_dir}; savepoints are never overwritten, pick another name")


@dataclass
class _Copied:
    """What :func:`_copy_partitions` wrote: data files, states, totals, key types."""

    files: dict[str, dict] = field(default_factory=dict)
    states: dict[str, StateDescriptor] = field(default_factory=dict)
    key_info: dict[str, list[str]] = field(default_factory=dict)
    raw: int = 0
    stored: int = 0
    entries: int = 0


def _manifest_of(op_store: DurableStore, record: CompletedCheckpoint, operator_id: str,
                 name: str, compression: str, copied: _Copied, t0: float) -> SavepointManifest:
    return SavepointManifest(
        name=name, operator_id=operator_id, checkpoint_id=record.checkpoint_id,
        parallelism=record.parallelism, max_parallelism=record.max_parallelism,
        compression=compression, files=copied.files,
        states=tuple(copied.states[k] for k in sorted(copied.states)),
        metrics={"entries": copied.entries, "raw_bytes": copied.raw,
                 "stored_bytes": copied.stored, "seconds": time.perf_counter() - t0,
                 "max_event_time_ms": _max_event_time(op_store, record), **copied.key_info},
        created_at_ms=int(time.time() * 1000))


def _copy_partitions(op_store: DurableStore, record: CompletedCheckpoint, sp_dir: str,
                     scratch: str, compression: str,
                     open_instance: Callable[[str], RocksDBInstance],
                     progress: ProgressFn | None) -> _Copied:
    """Write and upload one data file per partition of ``record``."""
    copied = _Copied()
    done_bytes = 0
    recorded = read_recorded_manifests(op_store, record)
    for i, p in enumerate(sorted(record.manifests)):
        m = recorded[p]
        for k, v in (("key_columns", m.key_columns), ("key_types", m.key_types)):
            # How grouping keys decode: a max_parallelism migration rehashes them.
            if k not in copied.key_info and v:
                copied.key_info[k] = list(v)
        rng = KeyGroupRange(m.key_group_start, m.key_group_end)
        fname = data_file_name(rng.start, rng.end)
        local_file = os.path.join(scratch, fname)
        stats = _write_partition(op_store, m, scratch, local_file, rng, compression,
                                 open_instance)
        t = op_store.put_file(local_file, f"{sp_dir}/{fname}")
        os.unlink(local_file)
        copied.files[fname] = {"key_group_start": rng.start, "key_group_end": rng.end,
                               "size": t.size, "checksum": t.checksum, "partition": p,
                               "entries": stats.entries}
        for d in m.states:
            merge_state(copied.states, d)
        copied.raw += stats.raw_bytes
        copied.stored += stats.stored_bytes
        copied.entries += stats.entries
        done_bytes += m.full_size
        if progress is not None:
            progress(i + 1, len(record.manifests), done_bytes, record.full_size)
    return copied


def merge_state(states: dict[str, StateDescriptor], d: StateDescriptor) -> None:
    """Add ``d`` to ``states`` (name -> descriptor of a savepoint): partitions may know
    different schema versions of a state, and the savepoint keeps them all."""
    known = states.get(d.name, d)
    states[d.name] = merge_descriptors(known, d) or known


def _max_event_time(op_store: DurableStore, record: CompletedCheckpoint) -> int | None:
    best = None
    for path in record.manifests.values():
        try:
            v = read_manifest(op_store, path).max_event_time_ms
        except (FileNotFoundError, CorruptStateError):
            continue
        if v is not None:
            best = int(v) if best is None else max(best, int(v))
    return best


def _write_partition(op_store: DurableStore, m: PartitionManifest, scratch: str,
                     local_file: str, rng: KeyGroupRange, compression: str,
                     open_instance: Callable[[str], RocksDBInstance]) -> FileStats:
    d = os.path.join(scratch, f"p{m.partition}")
    os.makedirs(d)
    try:
        inst = open_checkpoint(op_store, m, d, open_instance)
        try:
            return write_data_file(inst, local_file, rng, m.max_parallelism, m.states,
                                   compression)
        finally:
            inst.close()
    except StateBackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception
        # verified files RocksDB cannot open or read back: a damaged checkpoint, typed
        raise CorruptStateError(
            f"checkpoint {m.checkpoint_id} partition {m.partition}: RocksDB cannot open or "
            f"read the state of {m.path} ({type(exc).__name__}: {exc}); 'statebackend "
            f"verify' names what is wrong", checkpoint_id=m.checkpoint_id,
            partition=m.partition, path=m.path) from exc
    finally:
        shutil.rmtree(d, ignore_errors=True)
