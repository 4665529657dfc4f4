"""How state is laid out in RocksDB keys. Pure functions, no IO.

Every key starts with the 2-byte big-endian key group, so a key group is a prefix range
(clipping on rescale is a ``delete_range``, extraction a prefix scan).

- value, list, reducing, aggregating states: ``key = grouping key`` (the current key
  bytes, which start with the key group).
- map state and timers by key: ``key = grouping key + part + u32be(len(grouping key))``.
  The trailing length makes the composite self-describing: a prefix scan for grouping key
  ``A`` also meets entries of a longer grouping key ``A + x``, and the suffix (``len(A+x)``,
  never ``len(A)``) tells them apart without assuming the grouping-key encoding is
  prefix-free.
- timers by time: ``key group + ts + grouping key`` (time order within a key group).
- TTL index: ``key group + expiry + u8 len(state) + state + RocksDB key of the entry``.

Timestamps are signed int64 stored as big-endian ``ts + 2**63`` so byte order is time order.
"""

from __future__ import annotations

import struct

__all__ = ["encode_ts", "decode_ts", "composite", "split_composite", "timer_by_time_key",
           "split_timer_by_time_key", "ttl_index_key", "split_ttl_index_key", "KG_LEN",
           "TS_LEN", "next_key_group"]

KG_LEN = 2
TS_LEN = 8
_TS = struct.Struct(">Q")
_LEN = struct.Struct(">I")
_OFFSET = 1 << 63


def encode_ts(ts: int) -> bytes:
    """Order-preserving 8 bytes of a signed int64 timestamp."""
    return _TS.pack(ts + _OFFSET)


def decode_ts(b: bytes, pos: int = 0) -> int:
    return _TS.unpack_from(b, pos)[0] - _OFFSET


def length_suffix(grouping_key: bytes) -> bytes:
    return _LEN.pack(len(grouping_key))


def composite(grouping_key: bytes, part: bytes) -> bytes:
    """Key of one element (map entry, timer) of ``grouping_key``."""
    return grouping_key + part + _LEN.pack(len(grouping_key))


def split_composite(key: bytes) -> tuple[bytes, bytes]:
    """``(grouping key, part)`` of a :func:`composite` key."""
    n = _LEN.unpack_from(key, len(key) - 4)[0]
    return key[:n], key[n:-4]


def timer_by_time_key(grouping_key: bytes, ts: int) -> bytes:
    return grouping_key[:KG_LEN] + encode_ts(ts) + grouping_key


def split_timer_by_time_key(key: bytes) -> tuple[bytes, int]:
    """``(grouping key, ts)``."""
    return key[KG_LEN + TS_LEN:], decode_ts(key, KG_LEN)


def ttl_index_key(state: bytes, rocks_key: bytes, expiry: int) -> bytes:
    return rocks_key[:KG_LEN] + encode_ts(expiry) + bytes((len(state),)) + state + rocks_key


def split_ttl_index_key(key: bytes) -> tuple[str, bytes, int]:
    """``(state name, RocksDB key of the entry, expiry)``."""
    n = key[KG_LEN + TS_LEN]
    start = KG_LEN + TS_LEN + 1
    return (key[start:start + n].decode("utf-8"), key[start + n:],
            decode_ts(key, KG_LEN))


def next_key_group(kg: bytes) -> bytes | None:
    """The key group after ``kg`` (None after the last one)."""
    n = int.from_bytes(kg, "big") + 1
    return None if n >= 1 << (8 * KG_LEN) else n.to_bytes(KG_LEN, "big")
