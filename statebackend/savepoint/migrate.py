"""Offline ``max_parallelism`` migration: a savepoint read with the old value, written with
the new.

A key's key group is ``pmod(murmur3(key), max_parallelism)``, and every RocksDB key starts
with it, so changing ``max_parallelism`` moves almost every key to another key group.
Knowing the old key group does not give the new one (``h mod 128`` does not determine
``h mod 256``), so each grouping key is decoded with its column types and hashed again.

What is rewritten, per column family (see :mod:`statebackend.keys.layout`):

==========================================  ================================================
column family                               key, and what changes
==========================================  ================================================
value, list, reducing, aggregating states   ``grouping key``: its 2-byte prefix
map states, ``_timers``                     ``grouping key + part + u32 len``: the prefix
``_timers_by_time``                         ``kg + ts + grouping key``: both key groups
``_ttl``                                    ``kg + expiry + u8 n + state + RocksDB key``:
                                            both key groups (the embedded RocksDB key starts
                                            with the grouping key)
``_meta``                                   not keyed by key group: copied as it is
==========================================  ================================================

Only key-group bytes change: the rest of every key, and every value, is copied byte for
byte (values hold no keys: TTL expiries and encoded rows only). Rewritten entries are put
into one scratch RocksDB instance, which sorts them, and each new partition's data file is
written from it by :func:`~statebackend.savepoint.writer.write_data_file`, so the new
savepoint has exactly the format of one taken from a checkpoint: every key group's entries
in one block per column family, in key order.

Each grouping key is also hashed with the *old* ``max_parallelism`` and must land in the
key group it was stored in; a mismatch means the key types are wrong and nothing is
published.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import (
    CorruptStateError,
    IncompatibleStateError,
    OptionsError,
    SchemaError,
    StorageError,
)
from ..keys.grouping_key import decode_grouping_key
from ..keys.groups import normalise_type, spark_hashes
from ..keys.layout import KG_LEN, TS_LEN
from ..keys.ranges import check_parallelism, key_group_range
from ..progress import ProgressFn
from ..rocksdb.instance import RocksDBInstance
from ..storage.base import DurableStore
from ..storage.manifests import operator_store
from .format import SAVEPOINT_MANIFEST, SavepointManifest, data_file_name
from .reader import SavepointReader
from .writer import GLOBAL_COLUMN_FAMILIES, refuse_existing, savepoint_dir, write_data_file

__all__ = ["KeyRehasher", "migrate_savepoint"]

log = logging.getLogger(__name__)

# Internal column families of the state layer (statebackend.state.backend) and their layouts.
_TIMERS_CF = "_timers"
_TIMERS_BY_TIME_CF = "_timers_by_time"
_TTL_CF = "_ttl"
_META_STATE_PREFIX = b"state/"
_VALUE_LIKE = frozenset({"value", "list", "reducing", "aggregating"})
_COMPOSITE = frozenset({"map", "timers"})
# Decoded as plain integers, these hash exactly as Spark does (to_internal takes days and
# microseconds); decoding to date/datetime and back would go through local time, which is
# not one-to-one around daylight-saving changes.
_DECODE_AS = {"date": "int", "timestamp": "bigint", "timestamp_ntz": "bigint"}
_BATCH_ENTRIES = 20_000


class KeyRehasher:
    """Rewrites the key-group bytes of RocksDB keys for another ``max_parallelism``.

    Parameters
    ----------
    key_types : sequence of str
        Spark type names of the grouping-key columns.
    old_max_parallelism, new_max_parallelism : int
        Key groups the keys were written with, and the ones to rewrite them for.
    kinds : dict of str to str
        State kind (``"value"``, ``"list"``, ``"map"``, ...) of each state column family,
        from the ``_meta`` column family.
    """

    def __init__(self, key_types: Sequence[str], old_max_parallelism: int,
                 new_max_parallelism: int, kinds: dict[str, str]) -> None:
        self.types = [normalise_type(t) for t in key_types]
        self._decode_types = [_DECODE_AS.get(t, t) for t in self.types]
        self.old_max_parallelism = old_max_parallelism
        self.new_max_parallelism = new_max_parallelism
        self.kinds = dict(kinds)
        self._prefix: dict[bytes, bytes] = {}  # grouping key -> its new 2-byte prefix

    # --- grouping keys ---------------------------------------------------------------

    def _decode(self, data: bytes, cf: str) -> tuple[int, tuple, int]:
        try:
            return decode_grouping_key(data, self._decode_types)
        except (CorruptStateError, SchemaError) as exc:
            raise self._wrong_types(cf, data, f"it does not decode ({exc})") from None

    def _wrong_types(self, cf: str, data: bytes, why: str) -> IncompatibleStateError:
        return IncompatibleStateError(
            f"column family {cf!r}: key {bytes(data[:32])!r} is not a grouping key of types "
            f"{self.types}: {why}. Pass the key types the query grouped by (key_types=, "
            f"--key-types)")

    def prime(self, grouping_keys: Iterable[bytes], cf: str) -> None:
        """Compute the new prefixes of many grouping keys at once (one vectorised hash).

        Each key is decoded, hashed once, and checked to hash to its stored key group
        with the old ``max_parallelism``; :meth:`new_prefix` then finds it cached.
        """
        todo = [gk for gk in dict.fromkeys(grouping_keys) if gk not in self._prefix]
        if not todo:
            return
        rows = []
        for gk in todo:
            _, values, consumed = self._decode(gk, cf)
            if consumed != len(gk):
                raise self._wrong_types(cf, gk, f"{len(gk) - consumed} bytes are left over")
            rows.append(values)
        cols = [list(c) for c in zip(*rows)]
        try:
            hashes = spark_hashes(cols, self.types).astype(np.int64)
        except SchemaError as exc:
            raise self._wrong_types(cf, todo[0], f"it does not hash ({exc})") from None
        old = hashes % self.old_max_parallelism  # numpy's % is pmod for a positive divisor
        new = hashes % self.new_max_parallelism
        for gk, o, n in zip(todo, old.tolist(), new.tolist()):
            stored = (gk[0] << 8) | gk[1]
            if o != stored:
                raise self._wrong_types(
                    cf, gk, f"it hashes to key group {o} with max_parallelism="
                    f"{self.old_max_parallelism} but is stored in key group {stored}")
            self._prefix[gk] = n.to_bytes(KG_LEN, "big")

    def new_prefix(self, gk: bytes, cf: str) -> bytes:
        """New key-group prefix of grouping key ``gk`` (exactly one grouping key)."""
        p = self._prefix.get(gk)
        if p is None:
            self.prime((gk,), cf)
            p = self._prefix[gk]
        return p

    # --- whole keys, by layout ---------------------------------------------------------

    def _split_entry(self, key: bytes, kind: str | None, cf: str) -> bytes:
        """The grouping key at the head of a state's (or ``_timers``') key."""
        if kind in _VALUE_LIKE:
            return key
        if kind in _COMPOSITE:
            if len(key) < KG_LEN + 4:
                raise self._wrong_types(cf, key, "it is too short for a composite key")
            n = int.from_bytes(key[-4:], "big")
            if not KG_LEN <= n <= len(key) - 4:
                raise self._wrong_types(cf, key, f"its grouping-key length {n} is impossible")
            return key[:n]
        # A state no descriptor describes (an index entry of a deleted state): the
        # encoding is self-delimiting given the types, so the head still decodes.
        return key[:self._decode(key, cf)[2]]

    def _ttl_parts(self, key: bytes) -> tuple[int, str, bytes]:
        """``(end of the state name, state name, RocksDB key)`` of a TTL index entry."""
        head = KG_LEN + TS_LEN
        if len(key) <= head:
            raise self._wrong_types(_TTL_CF, key, "it is too short for a TTL index entry")
        n = key[head]
        end = head + 1 + n
        rocks_key = key[end:]
        if rocks_key[:KG_LEN] != key[:KG_LEN]:
            raise CorruptStateError(f"TTL index entry {key[:32]!r} is in another key group "
                                    f"than the entry it indexes")
        return end, key[head + 1:end].decode("utf-8", errors="replace"), rocks_key

    def grouping_key(self, cf: str, key: bytes) -> bytes:
        """The grouping key a key of column family ``cf`` belongs to.

        Raises
        ------
        IncompatibleStateError
            The column family has an unknown layout, or the key does not fit it.
        """
        if cf == _TIMERS_BY_TIME_CF:
            head = KG_LEN + TS_LEN
            if key[:KG_LEN] != key[head:head + KG_LEN]:
                raise CorruptStateError(f"timer {key[:32]!r} is in another key group than its "
                                        f"grouping key")
            return key[head:]
        if cf == _TTL_CF:
            _, state, rocks_key = self._ttl_parts(key)
            return self._split_entry(rocks_key, self.kinds.get(state), f"{cf}/{state}")
        if cf == _TIMERS_CF:
            return self._split_entry(key, "timers", cf)
        kind = self.kinds.get(cf)
        if kind == "blocks":
            raise IncompatibleStateError(
                f"state {cf!r} keeps its values in value blocks (map_in_pandas with "
                f"value_blocks), which cannot move to another max_parallelism yet: a block "
                f"holds many keys that the new max_parallelism would spread over other key "
                f"groups. Rescale without changing max_parallelism, or write this state "
                f"without value_blocks")
        if kind is None:
            raise IncompatibleStateError(
                f"column family {cf!r} holds entries but no state descriptor says how its keys "
                f"are laid out; this migration knows value, list, reducing, aggregating and "
                f"map states, timers and the TTL index")
        return self._split_entry(key, kind, cf)

    def rewrite(self, cf: str, key: bytes) -> bytes:
        """The key ``key`` of column family ``cf`` with every key group rewritten.

        Raises
        ------
        IncompatibleStateError
            The key does not decode with the key types, or its grouping key does not hash
            to the key group it is stored in (wrong key types), or the column family has
            an unknown layout.
        """
        p = self.new_prefix(self.grouping_key(cf, key), cf)
        if cf == _TIMERS_BY_TIME_CF:
            head = KG_LEN + TS_LEN
            return p + key[KG_LEN:head] + p + key[head + KG_LEN:]
        if cf == _TTL_CF:
            end = self._ttl_parts(key)[0]
            return p + key[KG_LEN:end] + p + key[end + KG_LEN:]
        return p + key[KG_LEN:]


def _kinds(meta: dict[bytes, bytes]) -> dict[str, str]:
    """State name -> kind, from the ``_meta`` column family's descriptors."""
    out = {}
    for k, v in meta.items():
        if k.startswith(_META_STATE_PREFIX):
            d = json.loads(v)
            out[d["name"]] = d["kind"]
    return out


def migrate_savepoint(location: str | DurableStore, operator_id: str, name: str, target: str,
                      new_max_parallelism: int, *, key_types: Sequence[str] | None = None,
                      parallelism: int | None = None, compression: str | None = None,
                      storage_options: dict[str, Any] | None = None,
                      local_root: str | None = None,
                      open_instance: Callable[[str], RocksDBInstance] = RocksDBInstance,
                      progress: ProgressFn | None = None) -> SavepointManifest:
    """Write savepoint ``target`` holding the state of savepoint ``name`` rekeyed for
    ``new_max_parallelism``; the source is only read.

    Long because this docstring documents the ten parameters of a public API; the body
    is the order of the steps, each a helper (:func:`_migrate`, :func:`_rekey_into`,
    :func:`_write_files`).

    Parameters
    ----------
    location : str or DurableStore
        The backend's ``checkpoint_location`` (any fsspec URL), or a store rooted there.
    operator_id : str
        The operator; savepoints live under ``<location>/<operator_id>/_savepoints/``.
    name : str
        The savepoint to read (written with the old ``max_parallelism``).
    target : str
        Name of the new savepoint (must not exist: savepoints are never overwritten).
    new_max_parallelism : int
        Key groups of the new savepoint (then run the query with this ``max_parallelism``
        and ``from_savepoint=target``).
    key_types : sequence of str, optional
        Spark types of the grouping-key columns; default those the savepoint records
        (savepoints written from a checkpoint of the Spark runner record them).
    parallelism : int, optional
        Partitions (data files) of the new savepoint; default the source's. Any value
        ``<= new_max_parallelism`` restores into any parallelism later.
    compression : {"snappy", "none"}, optional
        Default the source's.
    storage_options : dict, optional
        fsspec options when ``location`` is a URL.
    local_root : str, optional
        Scratch space (needs about the state's uncompressed size); a temporary directory
        by default.
    open_instance : callable
        ``path -> RocksDBInstance`` for the scratch instance.
    progress : callable, optional
        Told of each key group read (bytes: the source files read completely), then of
        each data file written; see :mod:`statebackend.progress`.

    Returns
    -------
    SavepointManifest
        As published at ``<operator_id>/_savepoints/<target>/_SAVEPOINT.json``; its
        ``metrics["migrated_from"]`` names the source.

    Raises
    ------
    CheckpointNotFoundError
        No savepoint ``name``.
    OptionsError
        Bad ``new_max_parallelism`` or ``parallelism``, or no key types known.
    IncompatibleStateError
        A key does not decode with the key types, or does not hash to its stored key
        group with the old ``max_parallelism`` (wrong key types); nothing is published.
    StorageError
        ``target`` exists, or an upload failed (nothing published).
    """
    t0 = time.perf_counter()
    op_store = operator_store(_open_root(location, storage_options), operator_id)
    if target == name:
        raise StorageError(f"the migrated savepoint needs a new name: {name!r} is the source, "
                           f"and savepoints are never overwritten")
    reader = SavepointReader(op_store.child(savepoint_dir(name)))
    src = reader.manifest  # CheckpointNotFoundError when there is no such savepoint
    parallelism = src.parallelism if parallelism is None else parallelism
    check_parallelism(parallelism, new_max_parallelism)
    compression = compression or src.compression
    key_types = _key_types(src, key_types)
    refuse_existing(op_store, operator_id, target)
    scratch = tempfile.mkdtemp(prefix="sb-migrate-", dir=local_root)
    try:
        manifest, keyed = _migrate(reader, op_store, name, target, scratch, key_types,
                                   new_max_parallelism, parallelism, compression,
                                   open_instance, progress)
        manifest.metrics["seconds"] = time.perf_counter() - t0
        # Published last: a reader never sees a savepoint missing a file.
        op_store.put_bytes_atomic(f"{savepoint_dir(target)}/{SAVEPOINT_MANIFEST}",
                                  manifest.to_json())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("savepoint %s of %s migrated to %s: max_parallelism %d -> %d, %d entries",
             name, operator_id, target, src.max_parallelism, new_max_parallelism, keyed)
    return manifest


def _open_root(location: str | DurableStore,
               storage_options: dict[str, Any] | None) -> DurableStore:
    if isinstance(location, str):
        from ..storage import open_store

        return open_store(location, storage_options=storage_options)
    return location


def _migrate(reader: SavepointReader, op_store: DurableStore, name: str, target: str,
             scratch: str,
             key_types: Sequence[str], new_max_parallelism: int, parallelism: int,
             compression: str, open_instance: Callable[[str], RocksDBInstance],
             progress: ProgressFn | None) -> tuple[SavepointManifest, int]:
    """Rekey savepoint ``name`` (``reader``) into a scratch instance and upload its data files;
    returns the manifest to publish (its ``seconds`` still to set) and the keyed entries."""
    src = reader.manifest
    inst = open_instance(os.path.join(scratch, "db"))
    try:
        keyed, global_entries = _rekey_into(reader, inst, key_types, new_max_parallelism,
                                            progress)
        files, totals = _write_files(inst, op_store, savepoint_dir(target), scratch,
                                     parallelism, new_max_parallelism, src, compression,
                                     progress)
    finally:
        inst.close()
    # Each file repeats the global column families; the rest must be a bijection.
    written = totals["entries"] - len(files) * global_entries
    if written != keyed:
        raise CorruptStateError(f"migrating savepoint {name!r}: {keyed} keyed entries "
                                f"read but {written} written; two keys collided after "
                                f"rekeying")
    metrics: dict[str, Any] = {
        k: v for k, v in src.metrics.items()
        if k in ("max_event_time_ms", "key_columns")}
    metrics.update(totals, seconds=0.0, key_types=list(key_types),
                   migrated_from={"savepoint": name, "max_parallelism": src.max_parallelism,
                                  "parallelism": src.parallelism})
    manifest = SavepointManifest(
        name=target, operator_id=src.operator_id, checkpoint_id=src.checkpoint_id,
        parallelism=parallelism, max_parallelism=new_max_parallelism,
        compression=compression, files=files, states=src.states, metrics=metrics,
        created_at_ms=int(time.time() * 1000))
    return manifest, keyed


def _key_types(src: SavepointManifest, key_types: Sequence[str] | None) -> list[str]:
    recorded = src.metrics.get("key_types")
    if key_types is None:
        if not recorded:
            raise OptionsError(
                "key_types", None,
                f"savepoint {src.name!r} does not record its grouping-key types (it predates "
                f"them, or was not written by the Spark runner); pass key_types= (CLI: "
                f"--key-types), e.g. ['string'] for a groupBy on one string column")
        return list(recorded)
    if isinstance(key_types, str):
        raise OptionsError("key_types", key_types,
                           "key_types is a sequence of type names, e.g. ['string', 'int']")
    if recorded and [normalise_type(t) for t in recorded] != [normalise_type(t)
                                                             for t in key_types]:
        raise OptionsError("key_types", list(key_types),
                           f"savepoint {src.name!r} records key types {list(recorded)}, "
                           f"not {list(key_types)}; omit key_types to use the recorded ones")
    return list(key_types)


def _rekey_into(reader: SavepointReader, inst: RocksDBInstance, key_types: Sequence[str],
                new_max_parallelism: int, progress: ProgressFn | None = None
                ) -> tuple[int, int]:
    """Put every entry of the savepoint, rekeyed, into ``inst``.

    Returns
    -------
    tuple of (int, int)
        Keyed entries read, and entries of the global column families.
    """
    src = reader.manifest
    for fname in sorted(src.files):
        for cf in reader.file(fname).meta.column_families:
            inst.column_family(cf)  # every state survives, empty or not
    glob = reader.read_global()
    inst.write(glob)
    rehasher = KeyRehasher(key_types, src.max_parallelism, new_max_parallelism,
                           _kinds(glob.get("_meta", {})))
    keyed = pending = 0
    batch: dict[str, dict[bytes, bytes | None]] = {}
    rewrite = rehasher.rewrite
    # bytes read: a source file counts once its last key group is read
    ends: dict[int, int] = {}
    for f in src.files.values():
        ends[int(f["key_group_end"])] = ends.get(int(f["key_group_end"]), 0) + int(f["size"])
    total_bytes, done_bytes = sum(ends.values()), 0
    for kg in range(src.max_parallelism):
        blocks = {cf: entries for cf, entries in reader.read_key_group(kg).items()
                  if cf not in GLOBAL_COLUMN_FAMILIES}  # those are not stored per key group
        for cf, entries in blocks.items():
            # Hash every grouping key of the key group in one vectorised call.
            rehasher.prime([rehasher.grouping_key(cf, k) for k, _ in entries], cf)
        for cf, entries in blocks.items():
            out = batch.setdefault(cf, {})
            for k, v in entries:
                out[rewrite(cf, k)] = v
            keyed += len(entries)
            pending += len(entries)
        if pending >= _BATCH_ENTRIES:
            inst.write(batch)
            batch, pending = {}, 0
        if progress is not None:
            done_bytes += ends.get(kg, 0)
            progress(kg + 1, src.max_parallelism, done_bytes, total_bytes,
                     unit="key groups read")
    if batch:
        inst.write(batch)
    return keyed, sum(len(kv) for kv in glob.values())


def _write_files(inst: RocksDBInstance, op_store: DurableStore, sp_dir: str, scratch: str,
                 parallelism: int, max_parallelism: int, src: SavepointManifest,
                 compression: str, progress: ProgressFn | None = None
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """One data file per new partition, uploaded; ``(files, totals)`` for the manifest."""
    files: dict[str, dict[str, Any]] = {}
    totals = {"entries": 0, "raw_bytes": 0, "stored_bytes": 0}
    for p in range(parallelism):
        rng = key_group_range(p, parallelism, max_parallelism)
        fname = data_file_name(rng.start, rng.end)
        local_file = os.path.join(scratch, fname)
        stats = write_data_file(inst, local_file, rng, max_parallelism, src.states, compression)
        t = op_store.put_file(local_file, f"{sp_dir}/{fname}")
        os.unlink(local_file)
        files[fname] = {"key_group_start": rng.start, "key_group_end": rng.end,
                        "size": t.size, "checksum": t.checksum, "partition": p,
                        "entries": stats.entries}
        totals["entries"] += stats.entries
        totals["raw_bytes"] += stats.raw_bytes
        totals["stored_bytes"] += stats.stored_bytes
        if progress is not None:
            progress(p + 1, parallelism, sum(f["size"] for f in files.values()),
                     unit="files written")
    return files, totals
