"""The changelog of one batch of one partition: the format, its writer and its replay.

In changelog mode (``checkpoint_mode="changelog"``) a checkpoint makes durable only what the
batch wrote, captured where every write reaches RocksDB
(:class:`~statebackend.rocksdb.instance.RocksDBInstance`): puts and deletes of every column
family (so every state kind, timers and TTL indexes included), range deletes, and column
families created or dropped. Replaying the changelogs of batches ``m+1..n`` in order onto
the materialized state of batch ``m`` gives exactly the state of batch ``n``.

File format (``changelog-<n>.sbcl``; all integers little-endian)::

    header   b"SBCL" | u8 version (2) | u8 compression (1 = snappy)
    frame*   u32 stored length (> 0) | u32 CRC32 of the stored bytes | stored bytes
    footer   u32 0 | u64 records | u64 raw bytes | u32 CRC32 of all raw bytes
             | i64 base | i64 batch

``base`` and ``batch`` say which step of the state the file is: it takes the state of
checkpoint ``base`` (-1: empty) to that of checkpoint ``batch`` (-2 for either: not recorded).
A version 1 file (pre-release, without them) is refused with
:class:`~statebackend.errors.FormatVersionError`. Replay checks that the changelogs of a manifest chain
without a gap or an overlap from its materialization to its own checkpoint, so a manifest
that lost or gained an entry is refused, whatever its JSON says.

A frame's stored bytes are the snappy compression of up to ~1 MiB of records, so the writer
streams to a local file with bounded memory. Records (raw bytes)::

    WRITE        u8 1 | cf | u32 n | n x u32 key length | n x u32 value length
                 (0xFFFFFFFF = delete) | the n keys | the n values
    DELETE_RANGE u8 2 | cf | u32 len | start | u32 len | end
    CREATE_CF    u8 3 | cf
    DROP_CF      u8 4 | cf

with ``cf`` = u16 length | UTF-8 name. A WRITE record carries one ``write`` call's entries
of one column family (distinct keys, so their order inside the record does not matter).
The manifest records the CRC32 and size of the whole file as of any other durable file;
the frame and footer checksums let a reader reject a truncated or damaged local copy on its
own.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import snappy

from ..errors import CorruptStateError, FormatVersionError
from ..model.manifest import changelog_id, changelog_name, is_changelog_name
from ..storage.checksum import format_crc32

__all__ = ["UNKNOWN", "ChangelogStats", "ChangelogWriter", "Record", "changelog_id",
           "changelog_name", "check_chain", "is_changelog_name", "read_records", "replay",
           "span"]

MAGIC = b"SBCL"
VERSION = 2
UNKNOWN = -2  # base or batch not recorded
SNAPPY = 1
FRAME_BYTES = 1 << 20

OP_WRITE, OP_DELETE_RANGE, OP_CREATE_CF, OP_DROP_CF = 1, 2, 3, 4
_DELETED = 0xFFFFFFFF
_HEADER = MAGIC + bytes([VERSION, SNAPPY])
_FRAME = struct.Struct("<II")
_FOOTER = struct.Struct("<QQI")
_SPAN = struct.Struct("<qq")

@dataclass(frozen=True)
class ChangelogStats:
    """What a finished changelog holds: its file size and CRC32, records and raw bytes."""

    size: int
    checksum: str
    records: int
    raw_bytes: int


def _cf(name: str) -> bytes:
    b = name.encode("utf-8")
    return struct.pack("<H", len(b)) + b


class ChangelogWriter:
    """Appends records to a local changelog file; :meth:`finish` seals it.

    The instance calls :meth:`write`, :meth:`delete_range`, :meth:`create_column_family`
    and :meth:`drop_column_family` after each change it applies.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by finish/abort
        self._fh.write(_HEADER)
        self._size = len(_HEADER)
        self._crc_file = zlib.crc32(_HEADER)
        self._crc_raw = 0
        self._buf = bytearray()
        self.records = 0
        self.raw_bytes = 0
        self._closed = False

    # --- records ------------------------------------------------------------------------

    def write(self, cf: str, entries: Mapping[bytes, bytes | None]) -> None:
        if not entries:
            return
        keys = list(entries)
        values = [entries[k] for k in keys]
        n = len(keys)
        klens = struct.pack(f"<{n}I", *map(len, keys))
        vlens = struct.pack(f"<{n}I", *(_DELETED if v is None else len(v) for v in values))
        present = values if None not in values else [v for v in values if v is not None]
        self._append(bytes([OP_WRITE]), _cf(cf), struct.pack("<I", n), klens, vlens,
                     b"".join(keys), b"".join(present))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        self._append(bytes([OP_DELETE_RANGE]), _cf(cf), struct.pack("<I", len(start)), start,
                     struct.pack("<I", len(end)), end)

    def create_column_family(self, cf: str) -> None:
        self._append(bytes([OP_CREATE_CF]), _cf(cf))

    def drop_column_family(self, cf: str) -> None:
        self._append(bytes([OP_DROP_CF]), _cf(cf))

    def _append(self, *parts: bytes) -> None:
        if self._closed:
            raise ValueError(f"changelog {self.path} is already finished")
        before = len(self._buf)
        for part in parts:  # into the frame buffer directly: one copy per byte
            self._buf += part
        self.records += 1
        self.raw_bytes += len(self._buf) - before
        if len(self._buf) >= FRAME_BYTES:
            self._flush_frame()

    def _flush_frame(self) -> None:
        if not self._buf:
            return
        self._crc_raw = zlib.crc32(self._buf, self._crc_raw)
        stored = snappy.compress(self._buf)
        self._buf = bytearray()
        self._emit(_FRAME.pack(len(stored), zlib.crc32(stored)) + stored)

    def _emit(self, data: bytes) -> None:
        self._fh.write(data)
        self._crc_file = zlib.crc32(data, self._crc_file)
        self._size += len(data)

    # --- lifecycle ----------------------------------------------------------------------

    def finish(self, base: int = UNKNOWN, batch: int = UNKNOWN) -> ChangelogStats:
        """Write the last frame and the footer and close; returns size and CRC32.

        ``base`` and ``batch``: the checkpoint whose state the recording started from
        (-1: empty) and the one it ends at (see the module notes).

        No fsync: the durable copy is what counts, and a local copy is used only after its
        size and CRC32 match the manifest's.
        """
        self._flush_frame()
        self._emit(struct.pack("<I", 0) + _FOOTER.pack(self.records, self.raw_bytes,
                                                       self._crc_raw) + _SPAN.pack(base, batch))
        self._fh.close()
        self._closed = True
        return ChangelogStats(self._size, format_crc32(self._crc_file), self.records,
                              self.raw_bytes)

    def abort(self) -> None:
        """Close and delete the file (the batch failed: its writes are not state)."""
        if not self._closed:
            self._closed = True
            self._fh.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def closed(self) -> bool:
        return self._closed


# --- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    op: int
    cf: str
    entries: dict[bytes, bytes | None] | None = None  # WRITE
    start: bytes = b""  # DELETE_RANGE
    end: bytes = b""


def _corrupt(where: str, what: str) -> CorruptStateError:
    return CorruptStateError(f"changelog {where}: {what}; the file is truncated or damaged "
                             f"(restore falls back to durable storage, or restore from "
                             f"another retained checkpoint)", path=where)


def read_records(data: bytes, where: str = "<changelog>") -> Iterator[Record]:
    """Records of a whole changelog file, every frame and the footer verified.

    Raises
    ------
    CorruptStateError
        Bad header, a frame failing its CRC32, a missing footer or a record that does not
        parse.
    """
    mv = memoryview(data)
    footer = _footer_size(mv, where)
    pos = 6
    crc_raw = 0
    records = raw_bytes = 0
    while True:
        if pos + 4 > len(mv):
            raise _corrupt(where, "ends before its footer")
        (n,) = struct.unpack_from("<I", mv, pos)
        if n == 0:
            if pos + 4 + footer != len(mv):
                raise _corrupt(where, "footer is not at the end")
            want_records, want_raw, want_crc = _FOOTER.unpack_from(mv, pos + 4)
            if (want_records, want_raw, want_crc) != (records, raw_bytes, crc_raw):
                raise _corrupt(where, f"footer says {want_records} records / {want_raw} bytes, "
                                      f"found {records} / {raw_bytes} (or checksum mismatch)")
            return
        if pos + _FRAME.size + n > len(mv):
            raise _corrupt(where, "frame runs past the end")
        _n, crc = _FRAME.unpack_from(mv, pos)
        stored = bytes(mv[pos + _FRAME.size: pos + _FRAME.size + n])
        if zlib.crc32(stored) != crc:
            raise _corrupt(where, f"frame at byte {pos} fails its CRC32")
        pos += _FRAME.size + n
        try:
            raw = snappy.decompress(stored)
        except Exception as exc:  # noqa: BLE001 - snappy raises its own types
            raise _corrupt(where, f"frame does not decompress ({exc})") from exc
        crc_raw = zlib.crc32(raw, crc_raw)
        raw_bytes += len(raw)
        for rec in _parse(raw, where):
            records += 1
            yield rec


def _footer_size(mv: memoryview, where: str) -> int:
    if bytes(mv[:4]) != MAGIC:
        raise _corrupt(where, "not a changelog (bad magic)")
    if len(mv) >= 6 and 0 < mv[4] < VERSION:
        raise FormatVersionError(where, "changelog", mv[4], VERSION)
    if len(mv) < 6 or mv[4] != VERSION or mv[5] != SNAPPY:
        raise _corrupt(where, f"unsupported version/compression {bytes(mv[4:6])!r}")
    return _FOOTER.size + _SPAN.size


def span(data: bytes, where: str = "<changelog>") -> tuple[int, int]:
    """``(base, batch)`` of a changelog (its last footer fields; ``UNKNOWN`` for what it
    does not record). Reads only the header and the end; :func:`read_records` verifies
    the rest."""
    mv = memoryview(data)
    footer = _footer_size(mv, where)
    if len(mv) < 6 + 4 + footer:
        raise _corrupt(where, "ends before its footer")
    base, batch = _SPAN.unpack_from(mv, len(mv) - _SPAN.size)
    return int(base), int(batch)


def check_chain(spans: list[tuple[str, int, tuple[int, int]]], start: int, end: int,
                where: str) -> None:
    """Changelogs ``(path, batch its name says, (base, batch))`` in replay order must
    take the state from checkpoint ``start`` (-1: empty) to checkpoint ``end`` without a
    gap or an overlap; what a file does not record is not checked.

    Raises
    ------
    CorruptStateError
        Naming the first file that breaks the chain.
    """
    state = start
    for path, named, (base, batch) in spans:
        if batch not in (UNKNOWN, named):
            raise CorruptStateError(f"changelog {path} holds batch {batch}, its name says "
                                    f"{named}: {where} names a file of another batch",
                                    path=path)
        if base != UNKNOWN and base != state:
            raise CorruptStateError(
                f"changelog {path} applies to the state of checkpoint {base}, but the ones "
                f"before it in {where} end at {state}: a changelog is missing or extra, so "
                f"replay would give another state than the checkpoint's", path=path)
        state = named
    if state != end:
        raise CorruptStateError(f"{where}: its changelogs end at batch {state}, not at its "
                                f"own checkpoint {end}: a changelog is missing",
                                path=spans[-1][0] if spans else where)


def _parse(raw: bytes, where: str) -> Iterator[Record]:
    mv = memoryview(raw)
    pos = 0
    try:
        while pos < len(mv):
            op = mv[pos]
            (ln,) = struct.unpack_from("<H", mv, pos + 1)
            cf = bytes(mv[pos + 3: pos + 3 + ln]).decode("utf-8")
            pos += 3 + ln
            if op == OP_WRITE:
                (n,) = struct.unpack_from("<I", mv, pos)
                pos += 4
                klens = struct.unpack_from(f"<{n}I", mv, pos)
                pos += 4 * n
                vlens = struct.unpack_from(f"<{n}I", mv, pos)
                pos += 4 * n
                keys = []
                for kl in klens:
                    keys.append(bytes(mv[pos: pos + kl]))
                    pos += kl
                entries: dict[bytes, bytes | None] = {}
                for k, vl in zip(keys, vlens):
                    if vl == _DELETED:
                        entries[k] = None
                    else:
                        entries[k] = bytes(mv[pos: pos + vl])
                        pos += vl
                yield Record(op, cf, entries)
            elif op == OP_DELETE_RANGE:
                (a,) = struct.unpack_from("<I", mv, pos)
                start = bytes(mv[pos + 4: pos + 4 + a])
                pos += 4 + a
                (b,) = struct.unpack_from("<I", mv, pos)
                end = bytes(mv[pos + 4: pos + 4 + b])
                pos += 4 + b
                yield Record(op, cf, start=start, end=end)
            elif op in (OP_CREATE_CF, OP_DROP_CF):
                yield Record(op, cf)
            else:
                raise _corrupt(where, f"unknown record type {op}")
            if pos > len(mv):
                raise _corrupt(where, "record runs past its frame")
    except (struct.error, UnicodeDecodeError) as exc:
        raise _corrupt(where, f"record does not parse ({exc})") from exc


def replay(instance, data: bytes, where: str = "<changelog>") -> int:
    """Apply one changelog to an open instance (which must not be recording).

    Parameters
    ----------
    instance : RocksDBInstance
        Holds exactly the state before the changelog's batch.
    data : bytes
        The whole file.

    Returns
    -------
    int
        Records applied.
    """
    n = 0
    for rec in read_records(data, where):
        n += 1
        if rec.op == OP_WRITE:
            assert rec.entries is not None
            instance.write({rec.cf: rec.entries}, wal=False)
        elif rec.op == OP_DELETE_RANGE:
            instance.delete_range(rec.cf, rec.start, rec.end)
        elif rec.op == OP_CREATE_CF:
            instance.column_family(rec.cf)
        elif rec.op == OP_DROP_CF:
            instance.drop_column_family(rec.cf)
    return n
