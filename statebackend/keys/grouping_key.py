"""The byte layout of RocksDB keys: key group, then the grouping key.

Every RocksDB key of the backend starts with::

    +----------------+------------------+------------------+-----+----------------------
    | key group      | field of column 0| field of column 1| ... | (user key of map state,
    | 2 bytes, BE    |                  |                  |     |  appended by its owner)
    +----------------+------------------+------------------+-----+----------------------

so all keys of one key group form one contiguous, sorted prefix range (a ``delete_range``
clips a rescaled instance; a prefix scan extracts a key group). Fields, by type:

=====================================  =================================================
type                                   field
=====================================  =================================================
int, bigint, smallint, tinyint, date,  ``0x00`` if null, else unsigned LEB128 varint of
timestamp, timestamp_ntz, boolean      ``zigzag(v) + 1`` (dates in days, timestamps in
                                       microseconds, booleans 0/1): 1 byte for
                                       -64..63, 10 bytes at most
float, double                          ``0x00`` if null, else ``0x01`` + the IEEE bits
                                       big-endian (4 or 8 bytes; ``-0.0`` stored as
                                       ``0.0`` and every NaN as Java's canonical NaN,
                                       as Spark groups them)
string (UTF-8), binary                 ``0x00`` if null, else varint ``len + 1`` + bytes
=====================================  =================================================

Each field is self-delimiting given its type, so for fixed types the encoding is
prefix-free: no grouping key's bytes followed by more bytes is another grouping key's
encoding. It is compact, deterministic (one encoding per value, checked on decode), and
decoding only parses bytes (no pickle, no code runs).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CorruptStateError, OptionsError, SchemaError
from . import kernels as _kernels
from .groups import _INT_RANGES, SEED, _check_arity, column_specs, to_internal
from .kernels import KEY_GROUP_PREFIXES, NULL_FIELD, bytes_field, int_field
from .ranges import MAX_MAX_PARALLELISM, KeyGroupRange, check_max_parallelism

__all__ = [
    "KEY_GROUP_PREFIX_LEN",
    "decode_grouping_key",
    "encode_grouping_key",
    "encode_grouping_keys",
    "encode_keys_with_groups",
    "key_group_bounds",
    "key_group_of",
    "key_group_prefix",
]

KEY_GROUP_PREFIX_LEN = 2
"""Bytes of the key-group prefix at the head of every RocksDB key."""

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


def _check_kg(kg: Any) -> int:
    if (not isinstance(kg, (int, np.integer)) or isinstance(kg, bool)
            or not 0 <= kg < MAX_MAX_PARALLELISM):
        raise OptionsError("key_group", kg,
                           f"a key group must be an int in 0..{MAX_MAX_PARALLELISM - 1}, got {kg!r}")
    return int(kg)


def key_group_prefix(kg: int) -> bytes:
    """The 2-byte big-endian prefix shared by every key of key group ``kg``."""
    return KEY_GROUP_PREFIXES[_check_kg(kg)]


def key_group_bounds(kg_range: KeyGroupRange) -> tuple[bytes, bytes]:
    """``(start, end_exclusive)`` byte bounds covering every key of ``kg_range``.

    For ``delete_range(start, end)`` and bounded scans: a key ``k`` belongs to a key group
    of the range exactly when ``start <= k < end``.

    Raises
    ------
    OptionsError
        If the range is empty (it has no byte bounds).
    """
    if kg_range.is_empty:
        raise OptionsError("kg_range", kg_range, "an empty key-group range has no byte bounds")
    # end + 1 <= MAX_MAX_PARALLELISM = 0x8000, which still fits in 2 bytes.
    return KEY_GROUP_PREFIXES[kg_range.start], KEY_GROUP_PREFIXES[kg_range.end + 1]


def key_group_of(data: bytes) -> int:
    """The key group at the head of an encoded key."""
    if len(data) < KEY_GROUP_PREFIX_LEN:
        raise CorruptStateError(f"a key needs {KEY_GROUP_PREFIX_LEN} bytes of key group, "
                                f"got {len(data)} bytes: {bytes(data[:8])!r}")
    return (data[0] << 8) | data[1]


def _field(value: Any, type_: str) -> bytes:
    v = to_internal(value, type_)
    if v is None:
        return NULL_FIELD
    if isinstance(v, bytes):
        return bytes_field(v)
    if type_ == "float":
        return b"\x01" + v.to_bytes(4, "big")
    if type_ == "double":
        return b"\x01" + v.to_bytes(8, "big")
    return int_field(v)


def encode_grouping_key(values: Sequence[Any], types: Sequence[str], kg: int) -> bytes:
    """Encode one grouping key with its key-group prefix.

    Parameters
    ----------
    values : sequence
        The key's column values (a tuple, as PySpark passes ``key``).
    types : sequence of str
        Spark type names of the key columns.
    kg : int
        The key's key group (see :func:`statebackend.keys.groups.key_group`).

    Returns
    -------
    bytes
        ``key_group_prefix(kg)`` followed by one field per column.

    Examples
    --------
    >>> encode_grouping_key(("a", 1), ["string", "int"], 5)
    b'\\x00\\x05\\x02a\\x03'
    """
    tags = _check_arity(len(values), types)
    return KEY_GROUP_PREFIXES[_check_kg(kg)] + b"".join(
        _field(v, t) for v, t in zip(values, tags))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Read one canonical unsigned LEB128 varint at ``pos`` (at most 10 bytes)."""
    result = shift = 0
    start = pos
    n = len(data)
    while True:
        if pos >= n:
            raise CorruptStateError(f"truncated varint at byte {start} of key {bytes(data)!r}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0 and pos - start > 1:
                raise CorruptStateError(f"non-canonical varint at byte {start} of key "
                                        f"{bytes(data)!r}")
            return result, pos
        shift += 7
        if pos - start >= 10:
            raise CorruptStateError(f"varint longer than 10 bytes at byte {start} of key "
                                    f"{bytes(data)!r}")


def _from_int(v: int, type_: str) -> Any:
    """Python value PySpark gives for Spark's internal int ``v`` of ``type_``."""
    if type_ == "boolean":
        return bool(v)
    try:
        if type_ == "date":
            return dt.date.fromordinal(v + _EPOCH_ORDINAL)
        if type_ == "timestamp":  # PySpark's TimestampType.fromInternal: naive local time
            return dt.datetime.fromtimestamp(v // 1_000_000).replace(microsecond=v % 1_000_000)
        if type_ == "timestamp_ntz":
            return _EPOCH_NAIVE + dt.timedelta(microseconds=v)
    except (OverflowError, OSError, ValueError) as exc:
        raise SchemaError(f"{type_} value {v} is outside what Python's datetime can hold: "
                          f"{exc}") from None
    return v


def decode_grouping_key(data: bytes, types: Sequence[str]) -> tuple[int, tuple, int]:
    """Decode the key group and grouping key at the head of ``data``.

    Parameters
    ----------
    data : bytes
        An encoded key, possibly followed by more bytes (a map state's user key).
    types : sequence of str
        Spark type names of the key columns.

    Returns
    -------
    kg : int
        The key group.
    key : tuple
        The values as PySpark gives them to a processor (str, bytes, int, bool, float,
        ``datetime.date``, ``datetime.datetime``; None for nulls).
    consumed : int
        Bytes read, prefix included: ``data[consumed:]`` is what follows the key.

    Raises
    ------
    CorruptStateError
        If the bytes are not a valid encoding for these types.
    """
    tags = _check_arity(len(types), types)
    kg = key_group_of(data)
    pos = KEY_GROUP_PREFIX_LEN
    out: list[Any] = []
    for t in tags:
        if t in ("float", "double"):
            v, pos = _decode_float(data, pos, t)
        else:
            v, pos = _decode_varint_field(data, pos, t)
        out.append(v)
    return kg, tuple(out), pos


def _decode_float(data: bytes, pos: int, t: str) -> tuple[Any, int]:
    """A float/double field at ``pos``: marker byte (0 null, 1 value), then big-endian."""
    n = len(data)
    if pos >= n:
        raise CorruptStateError(f"truncated {t} field in key {bytes(data)!r}")
    marker = data[pos]
    pos += 1
    if marker == 0:
        return None, pos
    width = 4 if t == "float" else 8
    if marker != 1 or pos + width > n:
        raise CorruptStateError(f"bad {t} field at byte {pos - 1} of key {bytes(data)!r}")
    return struct.unpack_from(">f" if width == 4 else ">d", data, pos)[0], pos + width


def _decode_varint_field(data: bytes, pos: int, t: str) -> tuple[Any, int]:
    """A field led by a varint ``w`` at ``pos``: 0 null; bytes of length ``w - 1`` for
    strings and binary; ``zigzag(value) + 1`` for integer-like types."""
    w, pos = _varint(data, pos)
    if w == 0:
        return None, pos
    if t in ("string", "binary"):
        size = w - 1
        if pos + size > len(data):
            raise CorruptStateError(f"truncated {t} field in key {bytes(data)!r}")
        raw = bytes(data[pos:pos + size])
        pos += size
        if t == "binary":
            return raw, pos
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError as exc:
            raise CorruptStateError(f"string field is not UTF-8 ({exc}) in key "
                                    f"{bytes(data)!r}") from None
    z = w - 1
    v = (z >> 1) ^ -(z & 1)  # zigzag back to signed
    _, lo, hi = _INT_RANGES[t]
    if not lo <= v <= hi:
        raise CorruptStateError(f"{t} field {v} out of range in key {bytes(data)!r}")
    return _from_int(v, t), pos


def encode_keys_with_groups(columns: Sequence[Any], types: Sequence[str],
                             max_parallelism: int) -> tuple[np.ndarray, list[bytes]]:
    """Key groups and encoded grouping keys of whole key columns, from one conversion of
    the columns feeding both native kernels (hash, then encode).

    Parameters
    ----------
    columns : sequence
        One column per key field (numpy arrays, pandas Series, pyarrow arrays or lists).
    types : sequence of str
        Spark type names of the key columns.
    max_parallelism : int
        Number of key groups.

    Returns
    -------
    tuple of (numpy.ndarray of int32, list of bytes)
        ``pmod(hash(row), max_parallelism)`` and ``encode_grouping_key(row, types, kg)``
        of every row.
    """
    check_max_parallelism(max_parallelism)
    hash_specs, encode_specs, n = column_specs(columns, types)
    kgs = np.full(n, SEED, dtype=np.int32)
    _kernels.hash_columns(hash_specs, kgs, max_parallelism)
    return kgs, _kernels.encode_keys(encode_specs, kgs)


def encode_grouping_keys(columns: Sequence[Any], types: Sequence[str],
                         key_groups: np.ndarray) -> list[bytes]:
    """Encode whole columns of grouping keys, each with its key-group prefix.

    Parameters
    ----------
    columns : sequence
        One column per key field (numpy arrays, pandas Series, pyarrow arrays or lists).
    types : sequence of str
        Spark type names of the key columns.
    key_groups : numpy.ndarray
        The key group of every row (e.g. from :func:`statebackend.keys.groups.key_groups`).

    Returns
    -------
    list of bytes
        ``encode_grouping_key(row, types, kg)`` of every row, computed by the native
        kernel when available.
    """
    _, specs, n = column_specs(columns, types)
    kgs = np.ascontiguousarray(key_groups, dtype=np.int32)
    if kgs.ndim != 1 or len(kgs) != n:
        raise SchemaError(f"key_groups has shape {kgs.shape}, expected ({n},)")
    if n and (int(kgs.min()) < 0 or int(kgs.max()) >= MAX_MAX_PARALLELISM):
        raise OptionsError("key_groups", None,
                           f"key groups must lie in 0..{MAX_MAX_PARALLELISM - 1}")
    return _kernels.encode_keys(specs, kgs)
