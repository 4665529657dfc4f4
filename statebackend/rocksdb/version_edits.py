"""Which SST files a RocksDB ``MANIFEST-<n>`` says the database is made of.

RocksDB refuses to open a directory that lacks a table file its MANIFEST lists. Reading
the MANIFEST (a log of ``VersionEdit`` records) tells, without opening anything, which
``<number>.sst`` files must be present: ``statebackend verify`` uses it to check a
partition manifest's file list against the private files it uploaded, as a restore
would find out only when RocksDB refuses to open.

Formats (RocksDB ``db/log_format.h`` and ``db/version_edit.cc``): the log is 32 KiB blocks
of records, each ``crc32c(4) length(2) type(1) payload`` (recyclable types add a 4-byte
log number), fragments joined by FIRST/MIDDLE/LAST; a record is one VersionEdit, a
sequence of ``varint32 tag`` fields. Fields this reader does not know but RocksDB marks
safe to ignore are skipped; any other unknown field raises :class:`ValueError` (the
caller then says it could not check, rather than guess). Record checksums are not
verified here: the whole file's CRC32 is checked against the partition manifest.
"""

from __future__ import annotations

__all__ = ["live_sst_numbers", "sst_name"]

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_RECYCLABLE = {5: _FULL, 6: _FIRST, 7: _MIDDLE, 8: _LAST}
_META_TYPES = (9, 10, 11)  # set-compression / user-defined-timestamp records: no edit

# VersionEdit tags
_COMPARATOR, _LOG_NUMBER, _NEXT_FILE, _LAST_SEQUENCE, _COMPACT_CURSOR = 1, 2, 3, 4, 5
_DELETED_FILE, _NEW_FILE, _PREV_LOG_NUMBER, _MIN_LOG_TO_KEEP = 6, 7, 9, 10
_NEW_FILE2, _NEW_FILE3, _NEW_FILE4 = 100, 102, 103
_CF, _CF_ADD, _CF_DROP, _MAX_CF = 200, 201, 202, 203
_IN_ATOMIC_GROUP = 300
_SAFE_IGNORE = 1 << 13
_TERMINATE = 1  # end of a NewFile4's custom fields
_CUSTOM_PATH_ID = 65


def sst_name(number: int) -> str:
    """File name of table file ``number`` (``000012.sst``)."""
    return f"{number:06d}.sst"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self) -> int:
        result = shift = 0
        while True:
            if self.pos >= len(self.data) or shift > 63:
                raise ValueError("truncated varint")
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def slice(self) -> bytes:
        n = self.varint()
        if self.pos + n > len(self.data):
            raise ValueError("truncated length-prefixed field")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _records(data: bytes) -> list[bytes]:
    """The logical records of a RocksDB log file."""
    out: list[bytes] = []
    pending: bytearray | None = None
    pos = 0
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer: zero padding
            pos += left
            continue
        kind = data[pos + 6] if pos + 6 < len(data) else 0
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        header = 7
        if kind in _RECYCLABLE:
            header = 11
            kind = _RECYCLABLE[kind]
        if kind == 0 and length == 0:  # preallocated zeroes: the rest of the block
            pos += left
            continue
        if pos + header + length > len(data):
            raise ValueError(f"record at byte {pos} runs past the end of the file")
        payload = data[pos + header:pos + header + length]
        pos += header + length
        if kind in _META_TYPES:
            continue
        if kind == _FULL:
            out.append(bytes(payload))
        elif kind == _FIRST:
            pending = bytearray(payload)
        elif kind in (_MIDDLE, _LAST):
            if pending is None:
                raise ValueError(f"record fragment without a start at byte {pos}")
            pending += payload
            if kind == _LAST:
                out.append(bytes(pending))
                pending = None
        else:
            raise ValueError(f"unknown log record type {kind} at byte {pos}")
    return out


def live_sst_numbers(data: bytes) -> set[int]:
    """Numbers of the table files live after replaying MANIFEST ``data``, across every
    column family (see :func:`live_sst_sizes`)."""
    return set(live_sst_sizes(data))


def live_sst_sizes(data: bytes) -> dict[int, int]:
    """Number -> size in bytes of the table files live after replaying MANIFEST ``data``,
    across every column family: RocksDB checks these sizes when it opens the snapshot.

    Raises
    ------
    ValueError
        The content is not a MANIFEST this reader understands.
    """
    live: dict[int, set[tuple[int, int]]] = {}  # column family -> {(level, number)}
    sizes: dict[int, int] = {}
    for rec in _records(data):
        r = _Reader(rec)
        cf = 0
        while not r.done():
            tag = r.varint()
            if tag in (_LOG_NUMBER, _NEXT_FILE, _LAST_SEQUENCE, _PREV_LOG_NUMBER,
                       _MIN_LOG_TO_KEEP, _MAX_CF, _IN_ATOMIC_GROUP):
                r.varint()
            elif tag == _COMPARATOR or tag == _CF_ADD:
                r.slice()
                if tag == _CF_ADD:
                    live.setdefault(cf, set())
            elif tag == _CF:
                cf = r.varint()
            elif tag == _CF_DROP:
                live.pop(cf, None)
            elif tag == _COMPACT_CURSOR:
                r.varint()
                r.slice()
            elif tag == _DELETED_FILE:
                level, number = r.varint(), r.varint()
                live.setdefault(cf, set()).discard((level, number))
            elif tag in (_NEW_FILE, _NEW_FILE2, _NEW_FILE3, _NEW_FILE4):
                level = r.varint()
                number = r.varint() & 0x3FFFFFFFFFFFFFFF  # low bits: the file number
                if tag == _NEW_FILE3:
                    r.varint()  # path id
                sizes[number] = r.varint()  # file size
                r.slice()  # smallest key
                r.slice()  # largest key
                if tag != _NEW_FILE:
                    r.varint()  # smallest sequence number
                    r.varint()  # largest sequence number
                if tag == _NEW_FILE4:
                    while True:
                        custom = r.varint()
                        if custom == _TERMINATE:
                            break
                        r.slice()
                live.setdefault(cf, set()).add((level, number))
            elif tag & _SAFE_IGNORE:
                r.slice()
            else:
                raise ValueError(f"unknown VersionEdit field {tag}")
    return {number: sizes[number] for files in live.values() for _level, number in files}
