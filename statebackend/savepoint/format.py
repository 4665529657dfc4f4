"""The savepoint file format: key-group blocks, block index, footer, checksums. Pure, no IO.

A savepoint of one operator is a directory::

    _SAVEPOINT.json                  the savepoint manifest, published last
    part-<first>-<last>.sbsp         one data file per source partition (key groups first..last)

A data file is self-contained (it references no checkpoint file)::

    +--------+---------+---------+-----+----------------+-------------+---------+
    | magic  | block 0 | block 1 | ... | metadata JSON  | block table | trailer |
    | 8 B    |         |         |     | (utf-8)        | 32 B / row  | 32 B    |
    +--------+---------+---------+-----+----------------+-------------+---------+

* A **block** holds the entries of one column family in one key group, in key order, each
  as ``u32 key length, u32 value length, key, value`` (big-endian), compressed on its own
  with snappy (or stored raw when the file's ``compression`` is ``"none"``). Column
  families whose keys do not start with a key group (the state layer's ``_meta``) are
  stored as blocks of key group ``-1`` ("global" blocks), which every reader restores.
* A **block table row** is ``u16 column family index, i16 pad, i32 key group, u64 offset,
  u32 stored length, u32 raw length, u32 entries, u32 crc32 of the stored bytes``; rows
  are sorted by (key group, column family), so a reader finds a key group's blocks by
  binary search and reads only their byte ranges.
* The **metadata** holds the format version, ``max_parallelism``, the file's key-group
  range, the compression, the column-family names and the state descriptors (schemas and
  TTLs).
* The **trailer** is ``u64 metadata offset, u32 metadata length, u32 block count, u32
  crc32 of metadata and table, u16 format version, 2 pad bytes, magic (8 B)``; a reader
  reads it first (the last 32 bytes), then the metadata and table, then only the blocks
  it needs.

Every block is checked (CRC32 of the stored bytes, then the raw length after
decompression, then that each key starts with the block's key group) before any entry
is used; a failure raises :class:`~statebackend.errors.CorruptKeyGroupError` naming the key
group and the file.
"""

from __future__ import annotations

import json
import struct
import zlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CorruptKeyGroupError, CorruptStateError, OptionsError
from ..model.manifest import StateDescriptor, check_component

__all__ = [
    "FORMAT_VERSION",
    "GLOBAL_KEY_GROUP",
    "MAGIC",
    "SAVEPOINT_MANIFEST",
    "TRAILER_SIZE",
    "BlockInfo",
    "FileMeta",
    "SavepointFile",
    "SavepointManifest",
    "compress",
    "data_file_name",
    "decode_block",
    "decode_footer",
    "decode_trailer",
    "decompress",
    "encode_block",
    "encode_footer",
    "verify_block",
]

FORMAT_VERSION = 1
MAGIC = b"SBSAVEP\x01"
SAVEPOINT_MANIFEST = "_SAVEPOINT.json"
GLOBAL_KEY_GROUP = -1
"""Key group of blocks of column families not keyed by key group (restored everywhere)."""

COMPRESSIONS = ("snappy", "none")

_PAIR = struct.Struct(">II")
_ROW = struct.Struct(">HhiQIIII")
_TRAILER = struct.Struct(">QIIIH2x8s")
TRAILER_SIZE = _TRAILER.size
ROW_SIZE = _ROW.size


# --- compression ----------------------------------------------------------------------


def compress(raw: bytes, compression: str) -> bytes:
    """Stored bytes of a block (``compression`` is ``"snappy"`` or ``"none"``)."""
    if compression == "none":
        return raw
    if compression == "snappy":
        import snappy  # python-snappy: imported lazily, only writers and readers need it

        return bytes(snappy.compress(raw))
    raise OptionsError("snapshot_compression", compression,
                       f"snapshot_compression must be one of {COMPRESSIONS}, got {compression!r}")


def decompress(stored: bytes, compression: str) -> bytes:
    """Raw bytes of a stored block; raises ``ValueError`` when they do not decompress."""
    if compression == "none":
        return stored
    if compression == "snappy":
        import snappy

        try:
            return bytes(snappy.decompress(stored))
        except Exception as exc:  # noqa: BLE001 - snappy raises its own error types
            raise ValueError(f"snappy: {exc}") from exc
    raise ValueError(f"unknown compression {compression!r}")


# --- blocks ---------------------------------------------------------------------------


def encode_block(entries: Iterable[tuple[bytes, bytes]]) -> tuple[bytes, int]:
    """Raw bytes of a block and its entry count: ``u32 klen, u32 vlen, key, value`` each."""
    parts: list[bytes] = []
    pack = _PAIR.pack
    n = 0
    for k, v in entries:
        parts.append(pack(len(k), len(v)))
        parts.append(k)
        parts.append(v)
        n += 1
    return b"".join(parts), n


def decode_block(raw: bytes) -> list[tuple[bytes, bytes]]:
    """Entries of a raw block; ``ValueError`` when it is truncated."""
    out = []
    pos = 0
    end = len(raw)
    unpack = _PAIR.unpack_from
    mv = memoryview(raw)
    while pos < end:
        if pos + 8 > end:
            raise ValueError(f"truncated entry header at byte {pos}")
        kl, vl = unpack(raw, pos)
        pos += 8
        if pos + kl + vl > end:
            raise ValueError(f"entry at byte {pos - 8} overruns the block ({kl}+{vl} bytes)")
        out.append((bytes(mv[pos:pos + kl]), bytes(mv[pos + kl:pos + kl + vl])))
        pos += kl + vl
    return out


@dataclass(frozen=True)
class BlockInfo:
    """One row of the block table."""

    cf: int  # index into FileMeta.column_families
    key_group: int  # GLOBAL_KEY_GROUP for column families not keyed by key group
    offset: int
    length: int  # stored bytes
    raw_length: int
    entries: int
    crc32: int

    def pack(self) -> bytes:
        return _ROW.pack(self.cf, 0, self.key_group, self.offset, self.length,
                         self.raw_length, self.entries, self.crc32)


def verify_block(info: BlockInfo, stored: bytes, compression: str, *, cf_name: str,
                 path: str) -> list[tuple[bytes, bytes]]:
    """Check and decode one stored block.

    Raises
    ------
    CorruptKeyGroupError
        The CRC, the length, the decompression or a key's key-group prefix is wrong.
    """
    what = (f"key group {info.key_group}" if info.key_group != GLOBAL_KEY_GROUP
            else "the global block")

    def bad(reason: str) -> CorruptKeyGroupError:
        return CorruptKeyGroupError(
            f"savepoint file {path}: {what} of column family {cf_name!r} is corrupt "
            f"({reason}); restore from another savepoint or checkpoint, or restore only "
            f"partitions that do not own this key group", key_group=info.key_group, path=path)

    if len(stored) != info.length:
        raise bad(f"{len(stored)} bytes read, {info.length} expected")
    crc = zlib.crc32(stored)
    if crc != info.crc32:
        raise bad(f"crc32 {crc:08x} != {info.crc32:08x}")
    try:
        raw = decompress(stored, compression)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if len(raw) != info.raw_length:
        raise bad(f"{len(raw)} bytes after decompression, {info.raw_length} expected")
    try:
        entries = decode_block(raw)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if len(entries) != info.entries:
        raise bad(f"{len(entries)} entries, {info.entries} expected")
    if info.key_group != GLOBAL_KEY_GROUP:
        prefix = info.key_group.to_bytes(2, "big")
        for k, _ in entries:
            if k[:2] != prefix:
                raise bad(f"key {k[:16]!r} is not in the key group")
    return entries


# --- metadata, table, trailer ----------------------------------------------------------


@dataclass(frozen=True)
class FileMeta:
    """What a data file says about itself (the JSON metadata of the footer)."""

    max_parallelism: int
    key_group_start: int
    key_group_end: int  # inclusive
    compression: str
    column_families: tuple[str, ...]
    states: tuple[StateDescriptor, ...] = ()
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        d = asdict(self)
        d["column_families"] = list(self.column_families)
        return json.dumps(d, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, where: str) -> FileMeta:
        try:
            d = json.loads(data)
            d["column_families"] = tuple(d["column_families"])
            d["states"] = tuple(StateDescriptor(**s) for s in d.get("states", ()))
            return cls(**d)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"savepoint file {where}: metadata is malformed ({exc})",
                                    path=where) from exc


def encode_footer(meta: FileMeta, blocks: Sequence[BlockInfo], meta_offset: int) -> bytes:
    """Metadata, block table and trailer, to append after the last block at ``meta_offset``."""
    rows = sorted(blocks, key=lambda b: (b.key_group, b.cf))
    body = meta.to_json()
    table = b"".join(b.pack() for b in rows)
    crc = zlib.crc32(table, zlib.crc32(body))
    return body + table + _TRAILER.pack(meta_offset, len(body), len(rows), crc,
                                        FORMAT_VERSION, MAGIC)


def decode_trailer(trailer: bytes, where: str) -> tuple[int, int, int, int]:
    """``(metadata offset, metadata length, block count, crc)`` from the last 32 bytes."""
    if len(trailer) != TRAILER_SIZE:
        raise CorruptStateError(f"savepoint file {where} is truncated: {len(trailer)}-byte "
                                f"trailer", path=where)
    off, mlen, nblocks, crc, version, magic = _TRAILER.unpack(trailer)
    if magic != MAGIC:
        raise CorruptStateError(f"{where} is not a savepoint data file (bad magic "
                                f"{magic!r})", path=where)
    if version != FORMAT_VERSION:
        raise CorruptStateError(f"savepoint file {where} has format {version}; this version "
                                f"reads format {FORMAT_VERSION}", path=where)
    return off, mlen, nblocks, crc


def decode_footer(footer: bytes, meta_len: int, nblocks: int, crc: int,
                  where: str) -> tuple[FileMeta, list[BlockInfo]]:
    """Metadata and block table from the footer bytes (trailer excluded)."""
    if len(footer) != meta_len + nblocks * ROW_SIZE or zlib.crc32(footer) != crc:
        raise CorruptStateError(f"savepoint file {where}: block index fails its checksum",
                                path=where)
    meta = FileMeta.from_json(footer[:meta_len], where)
    rows = [BlockInfo(*(v for i, v in enumerate(_ROW.unpack_from(footer, meta_len + j * ROW_SIZE))
                        if i != 1))
            for j in range(nblocks)]
    if meta.format_version != FORMAT_VERSION:
        raise CorruptStateError(f"savepoint file {where}: format {meta.format_version} is not "
                                f"supported", path=where)
    return meta, rows


@dataclass
class SavepointFile:
    """A decoded footer: metadata plus a block table searchable by key group."""

    path: str
    meta: FileMeta
    blocks: list[BlockInfo]
    _kgs: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.blocks.sort(key=lambda b: (b.key_group, b.cf))
        self._kgs = [b.key_group for b in self.blocks]

    def blocks_of(self, key_group: int) -> list[BlockInfo]:
        """The blocks of one key group (or of ``GLOBAL_KEY_GROUP``), by column family."""
        i = bisect_left(self._kgs, key_group)
        out = []
        while i < len(self.blocks) and self._kgs[i] == key_group:
            out.append(self.blocks[i])
            i += 1
        return out

    def blocks_in(self, start: int, end: int) -> list[BlockInfo]:
        """Blocks of key groups ``start..end`` (inclusive), in file order of key group."""
        i = bisect_left(self._kgs, start)
        j = bisect_left(self._kgs, end + 1)
        return self.blocks[i:j]


# --- the savepoint manifest -----------------------------------------------------------


def data_file_name(start: int, end: int, attempt: str | None = None) -> str:
    """``part-<first>-<last>.sbsp``; with the writing task's attempt when tasks write the
    files (an import from Spark's store), so no attempt overwrites another's."""
    tail = "" if attempt is None else f"-{check_component(attempt)}"
    return f"part-{start:05d}-{end:05d}{tail}.sbsp"


@dataclass(frozen=True)
class SavepointManifest:
    """``_SAVEPOINT.json``: the files of a savepoint and what they cover.

    ``files`` maps data file names to ``{"key_group_start", "key_group_end", "size",
    "checksum"}``; together they cover ``0..max_parallelism-1`` exactly once.
    ``metrics`` may hold ``key_types`` and ``key_columns`` (how grouping keys decode, so a
    :func:`~statebackend.savepoint.migrate.migrate_savepoint` can rehash them without
    being told) and, for a migrated savepoint, ``migrated_from``.
    """

    name: str
    operator_id: str
    checkpoint_id: int | None
    parallelism: int
    max_parallelism: int
    compression: str
    files: dict[str, dict[str, Any]]
    states: tuple[StateDescriptor, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at_ms: int = 0
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for f in self.files:
            check_component(f)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SavepointManifest:
        try:
            d = json.loads(data)
            if d.get("format_version") != FORMAT_VERSION:
                raise CorruptStateError(f"{where}: savepoint format {d.get('format_version')!r}"
                                        f" is not supported (this version reads "
                                        f"{FORMAT_VERSION})", path=where)
            d["states"] = tuple(StateDescriptor(**s) for s in d.get("states", ()))
            return cls(**d)
        except CorruptStateError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStateError(f"{where}: savepoint manifest is malformed ({exc})",
                                    path=where) from exc

    def files_for(self, start: int, end: int) -> Iterator[str]:
        """Data files whose key-group range overlaps ``start..end``."""
        for name, f in sorted(self.files.items()):
            if f["key_group_start"] <= end and f["key_group_end"] >= start:
                yield name
