"""Reading savepoints: open the manifest, seek to the key groups needed, restore them.

A reader fetches each data file's trailer and index once (two small ranged reads), then
for a key-group range one contiguous byte range per file (blocks are laid out key group
by key group), and verifies and decompresses only the blocks of that range.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptStateError, IncompatibleStateError, StorageError
from ..keys.ranges import KeyGroupRange
from ..rocksdb.instance import RocksDBInstance
from ..state.evolution import merge_meta_entry
from ..storage.base import DurableStore
from .format import (
    GLOBAL_KEY_GROUP,
    SAVEPOINT_MANIFEST,
    TRAILER_SIZE,
    BlockInfo,
    SavepointFile,
    SavepointManifest,
    decode_footer,
    decode_trailer,
    verify_block,
)

__all__ = ["SavepointReader", "check_max_parallelism", "read_range"]

_MAX_READ = 64 << 20  # bytes per ranged read: bounds memory on big key-group ranges
_BATCH_ENTRIES = 20_000  # entries per WriteBatch when restoring


def read_range(store: DurableStore, path: str, start: int, end: int) -> bytes:
    """Bytes ``start..end`` (exclusive) of ``path``: a ranged read when the store offers one."""
    ranged = getattr(store, "read_range", None)
    if ranged is not None:
        return bytes(ranged(path, start, end))
    fs = getattr(store, "fs", None)
    full_path = getattr(store, "full_path", None)
    if fs is not None and full_path is not None:
        try:
            return bytes(fs.cat_file(full_path(path), start=start, end=end))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"ranged read of {path} [{start}, {end}) failed: {exc}") from exc
    return store.get_bytes(path)[start:end]  # minimal stores (test doubles)


def check_max_parallelism(found: int, configured: int, where: str) -> None:
    """Refuse state written with another ``max_parallelism``, saying how to migrate."""
    if found != configured:
        raise IncompatibleStateError(
            f"{where} was written with max_parallelism={found}, this query uses "
            f"max_parallelism={configured}. Key groups are fixed for the life of the state: "
            f"run with max_parallelism={found}, or migrate offline by reading a savepoint "
            f"with max_parallelism={found} and writing a new one with {configured} "
            f"(every key is rehashed to its new key group): `statebackend migrate-savepoint "
            f"URL OPERATOR NAME NEW_NAME --max-parallelism {configured}` or "
            f"statebackend.savepoint.migrate.migrate_savepoint(...), then start from the new "
            f"savepoint")


@dataclass(frozen=True)
class RestoreStats:
    """What one :meth:`SavepointReader.restore_into` read and wrote."""

    entries: int
    blocks: int
    bytes_read: int
    files: int
    seconds: float


class SavepointReader:
    """Random access to one savepoint.

    Parameters
    ----------
    store : DurableStore
        Rooted at the savepoint directory (``<root>/<operator_id>/_savepoints/<name>``).

    Raises
    ------
    CheckpointNotFoundError
        (from :meth:`manifest`) The directory holds no published savepoint.
    """

    def __init__(self, store: DurableStore) -> None:
        self.store = store
        self._manifest: SavepointManifest | None = None
        self._files: dict[str, SavepointFile] = {}

    @property
    def manifest(self) -> SavepointManifest:
        if self._manifest is None:
            from ..errors import CheckpointNotFoundError

            try:
                data = self.store.get_bytes(SAVEPOINT_MANIFEST)
            except FileNotFoundError:
                raise CheckpointNotFoundError(
                    f"no savepoint at {self.store.root}: {SAVEPOINT_MANIFEST} is missing (the "
                    f"savepoint was never completed, or the path is wrong)") from None
            self._manifest = SavepointManifest.from_json(data, where=SAVEPOINT_MANIFEST)
        return self._manifest

    def file(self, name: str) -> SavepointFile:
        """The decoded index of one data file (read once, then cached)."""
        f = self._files.get(name)
        if f is None:
            info = self.manifest.files.get(name)
            if info is None:
                raise CorruptStateError(f"savepoint {self.store.root}: no data file {name}",
                                        path=name)
            size = int(info["size"])
            actual = self.store.size(name)
            if actual != size:
                raise CorruptStateError(f"savepoint file {name} has {actual} bytes, the "
                                        f"savepoint manifest says {size}", path=name)
            off, mlen, nblocks, crc = decode_trailer(
                read_range(self.store, name, size - TRAILER_SIZE, size), name)
            if off + mlen + nblocks * 32 != size - TRAILER_SIZE:
                raise CorruptStateError(f"savepoint file {name}: index offsets are inconsistent "
                                        f"with its size", path=name)
            meta, blocks = decode_footer(read_range(self.store, name, off, size - TRAILER_SIZE),
                                         mlen, nblocks, crc, name)
            f = self._files[name] = SavepointFile(name, meta, blocks)
        return f

    # --- reading ---------------------------------------------------------------------

    def _blocks(self, name: str, blocks: list[BlockInfo]
                ) -> Iterator[tuple[str, BlockInfo, list[tuple[bytes, bytes]], int]]:
        """Verified entries of ``blocks`` (contiguous in the file), read in few ranged reads."""
        f = self.file(name)
        i = 0
        while i < len(blocks):
            j = i + 1
            start = blocks[i].offset
            while j < len(blocks) and blocks[j].offset + blocks[j].length - start <= _MAX_READ \
                    and blocks[j].offset == blocks[j - 1].offset + blocks[j - 1].length:
                j += 1
            end = blocks[j - 1].offset + blocks[j - 1].length
            data = read_range(self.store, name, start, end)
            for b in blocks[i:j]:
                cf = f.meta.column_families[b.cf]
                stored = data[b.offset - start:b.offset - start + b.length]
                yield cf, b, verify_block(b, stored, f.meta.compression, cf_name=cf,
                                          path=f"{self.store.root}/{name}"), len(stored)
            i = j

    def read_key_group(self, key_group: int) -> dict[str, list[tuple[bytes, bytes]]]:
        """Entries of one key group, by column family (only its blocks are read)."""
        out: dict[str, list[tuple[bytes, bytes]]] = {}
        for name in self.manifest.files_for(key_group, key_group):
            blocks = self.file(name).blocks_of(key_group)
            for cf, _b, entries, _n in self._blocks(name, blocks):
                out.setdefault(cf, []).extend(entries)
        return out

    def read_global(self) -> dict[str, dict[bytes, bytes]]:
        """Entries of the column families not keyed by key group, merged over all files."""
        out: dict[str, dict[bytes, bytes]] = {}
        for name in sorted(self.manifest.files):
            for cf, _b, entries, _n in self._blocks(name, self.file(name).blocks_of(
                    GLOBAL_KEY_GROUP)):
                merged = out.setdefault(cf, {})
                for k, v in entries:
                    merged[k] = v if k not in merged else merge_meta_entry(k, merged[k], v)
        return out

    def restore_into(self, instance: RocksDBInstance, kg_range: KeyGroupRange,
                     max_parallelism: int | None = None) -> RestoreStats:
        """Write the state of ``kg_range`` (plus the global column families) into ``instance``.

        Parameters
        ----------
        instance : RocksDBInstance
            Usually empty; entries are put, nothing is deleted.
        kg_range : KeyGroupRange
            Key groups the new partition owns.
        max_parallelism : int, optional
            The query's value; refused when it differs from the savepoint's.

        Raises
        ------
        IncompatibleStateError
            ``max_parallelism`` differs.
        CorruptKeyGroupError
            A block of a needed key group is corrupt (names the key group and file).
        """
        t0 = time.perf_counter()
        m = self.manifest
        if max_parallelism is not None:
            check_max_parallelism(m.max_parallelism, max_parallelism,
                                  f"savepoint {m.name!r} of operator {m.operator_id!r}")
        entries = blocks = nbytes = nfiles = 0
        for name in sorted(m.files):
            for cf in self.file(name).meta.column_families:
                instance.column_family(cf)  # every state exists after restore, empty or not
        batch: dict[str, dict[bytes, Any]] = {}
        pending = 0
        for cf, gkv in self.read_global().items():
            batch.setdefault(cf, {}).update(gkv)
            pending += len(gkv)
        if not kg_range.is_empty:
            for name in m.files_for(kg_range.start, kg_range.end):
                nfiles += 1
                wanted = self.file(name).blocks_in(kg_range.start, kg_range.end)
                for cf, _b, kv, n in self._blocks(name, wanted):
                    batch.setdefault(cf, {}).update(kv)
                    pending += len(kv)
                    entries += len(kv)
                    blocks += 1
                    nbytes += n
                    if pending >= _BATCH_ENTRIES:
                        instance.write(batch)
                        batch, pending = {}, 0
        if pending:
            instance.write(batch)
        return RestoreStats(entries, blocks, nbytes, nfiles, time.perf_counter() - t0)
