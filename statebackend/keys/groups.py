"""Keys to key groups: Spark's Murmur3 hash of scalars and of whole columns.

Pure: no Spark, no RocksDB. A key's group is ``pmod(hash(key), max_parallelism)`` where
``hash`` is exactly Spark SQL's ``hash()`` (Murmur3_x86_32, seed 42, what Spark's
``HashPartitioning`` uses), so the Spark layer can compute the same group in SQL. Which
partition owns a key group is :mod:`statebackend.keys.ranges`; the values that route rows
to their partition, :mod:`statebackend.keys.placement`.

Types are named by Spark's ``simpleString`` ("string", "binary", "int", "bigint",
"smallint", "tinyint", "boolean", "date", "timestamp", "timestamp_ntz", "float",
"double"); Spark's ``typeName`` aliases ("integer", "long", "short", "byte") are accepted.

Values and nulls
----------------
* Null is ``None``, ``pd.NA``, ``NaT`` or an Arrow null; it leaves the running hash
  unchanged. In non-float columns a float ``NaN`` (pandas' missing value in object
  columns) is a null too; in float columns ``NaN`` is a value, hashed as Java's canonical
  NaN, and ``-0.0`` hashes as ``0.0``, as Spark does.
* Python ``datetime`` values follow PySpark's own conversion: for "timestamp" a naive
  datetime is local time and an aware one is converted; for "timestamp_ntz" the wall
  clock is taken as UTC. numpy/pandas/Arrow timestamps are instants (naive = UTC).
  Dates are days since 1970-01-01; ints are accepted as days (date) or microseconds
  (timestamps).
* Scalars are type-checked strictly. Whole string/binary columns are checked only for
  being str, bytes or null (the kernels hash either as their bytes), to stay fast.
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SchemaError
from . import kernels as _kernels
from .kernels import hash_bytes, hash_int, hash_long, to_signed32
from .ranges import DEFAULT_MAX_PARALLELISM, check_max_parallelism

__all__ = [
    "SEED",
    "TYPES",
    "key_group",
    "key_groups",
    "normalise_type",
    "spark_hash",
    "spark_hashes",
]

SEED = 42
"""The seed of Spark's ``hash()`` and of its hash partitioner."""

TYPES = ("string", "binary", "int", "bigint", "smallint", "tinyint", "boolean", "date",
         "timestamp", "timestamp_ntz", "float", "double")
"""The grouping-key types supported, as Spark ``simpleString`` names."""

_ALIASES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint",
            "str": "string", "bool": "boolean"}

# Integer types: (hash width in bits, min, max). Spark hashes byte/short/int/date/boolean
# with hashInt, bigint/timestamps with hashLong.
_INT_RANGES = {
    "tinyint": (32, -(1 << 7), (1 << 7) - 1),
    "smallint": (32, -(1 << 15), (1 << 15) - 1),
    "int": (32, -(1 << 31), (1 << 31) - 1),
    "date": (32, -(1 << 31), (1 << 31) - 1),
    "boolean": (32, 0, 1),
    "bigint": (64, -(1 << 63), (1 << 63) - 1),
    "timestamp": (64, -(1 << 63), (1 << 63) - 1),
    "timestamp_ntz": (64, -(1 << 63), (1 << 63) - 1),
}
_BYTES_TYPES = ("string", "binary")
_CANONICAL_NAN32 = 0x7FC00000  # Java's Float.floatToIntBits(NaN)
_CANONICAL_NAN64 = 0x7FF8000000000000  # Java's Double.doubleToLongBits(NaN)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def normalise_type(type_: str) -> str:
    """Return the canonical type tag for ``type_`` (lower case, aliases resolved).

    Raises
    ------
    SchemaError
        If the type is not a supported grouping-key type.
    """
    if not isinstance(type_, str):
        raise SchemaError(f"a key type is a Spark type name such as 'string', got {type_!r}")
    t = type_.strip().lower()
    t = _ALIASES.get(t, t)
    if t not in TYPES:
        raise SchemaError(f"unsupported grouping-key type {type_!r}; supported: {', '.join(TYPES)}")
    return t


# --- scalars ----------------------------------------------------------------------------


def is_null(value: Any, type_: str) -> bool:
    """True if ``value`` is a null of a column of type ``type_`` (canonical tag)."""
    if value is None:
        return True
    name = type(value).__name__
    if name in ("NAType", "NaTType"):
        return True
    if isinstance(value, np.datetime64):
        return bool(np.isnat(value))
    if type_ not in ("float", "double") and isinstance(value, float) and math.isnan(value):
        return True
    return False


def _float_bits(value: Any, type_: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise SchemaError(f"a {type_} key must be a number, got {value!r}")
    if type_ == "float":
        with np.errstate(over="ignore"):
            f = np.array(value, dtype=np.float32)
        if f == 0:  # -0.0 hashes and encodes as 0.0, as Spark normalises it
            return 0
        return _CANONICAL_NAN32 if np.isnan(f) else int(f.view(np.uint32))
    d = np.array(value, dtype=np.float64)
    if d == 0:
        return 0
    return _CANONICAL_NAN64 if np.isnan(d) else int(d.view(np.uint64))


def _timestamp_micros(value: Any, type_: str) -> int:
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[us]").astype(np.int64))
    if isinstance(value, dt.datetime):
        # Same as PySpark's TimestampType / TimestampNTZType.toInternal.
        if type_ == "timestamp_ntz":
            seconds = calendar.timegm(value.timetuple())
        elif value.tzinfo is not None:
            seconds = calendar.timegm(value.utctimetuple())
        else:
            seconds = int(time.mktime(value.timetuple()))
        return int(seconds) * 1_000_000 + value.microsecond
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise SchemaError(f"a {type_} key must be a datetime, numpy datetime64 or int "
                      f"(microseconds), got {value!r}")


def _date_days(value: Any) -> int:
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[D]").astype(np.int64))
    if isinstance(value, dt.date):  # datetime too: its date part, as PySpark does
        return value.toordinal() - _EPOCH_ORDINAL
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise SchemaError(f"a date key must be a date, numpy datetime64 or int (days), got {value!r}")


def to_internal(value: Any, type_: str) -> int | bytes | None:
    """Spark's internal form of one key value: what is hashed and encoded.

    Parameters
    ----------
    value : object
        A Python (or numpy/pandas) scalar.
    type_ : str
        Canonical type tag (see :func:`normalise_type`).

    Returns
    -------
    int, bytes or None
        None for a null; bytes (UTF-8 for strings) for string/binary; the float's IEEE
        bits (normalised) for float/double; otherwise the integer value (days for dates,
        microseconds for timestamps, 0/1 for booleans).

    Raises
    ------
    SchemaError
        If the value does not fit the type.
    """
    if is_null(value, type_):
        return None
    if type_ == "string":
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise SchemaError(f"a string key must be valid Unicode: {exc}") from None
        raise SchemaError(f"a string key must be str, got {type(value).__name__}: {value!r}")
    if type_ == "binary":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise SchemaError(f"a binary key must be bytes, got {type(value).__name__}: {value!r}")
    if type_ in ("float", "double"):
        return _float_bits(value, type_)
    if type_ == "boolean":
        if isinstance(value, (bool, np.bool_)):
            return int(bool(value))
        raise SchemaError(f"a boolean key must be bool, got {value!r}")
    if type_ == "date":
        v = _date_days(value)
    elif type_ in ("timestamp", "timestamp_ntz"):
        v = _timestamp_micros(value, type_)
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        v = int(value)
    else:
        raise SchemaError(f"a {type_} key must be an int, got {type(value).__name__}: {value!r}")
    _, lo, hi = _INT_RANGES[type_]
    if not lo <= v <= hi:
        raise SchemaError(f"{v} is out of range for a {type_} key ({lo}..{hi})")
    return v


def _hash_internal(v: int | bytes | None, type_: str, seed: int) -> int:
    """Unsigned hash of one internal value (null: seed unchanged)."""
    if v is None:
        return seed & 0xFFFFFFFF
    if isinstance(v, bytes):
        return hash_bytes(v, seed)
    if type_ == "float" or _INT_RANGES.get(type_, (64,))[0] == 32:
        return hash_int(v, seed)
    return hash_long(v, seed)


def _check_arity(n_values: int, types: Sequence[str]) -> list[str]:
    if isinstance(types, str):
        raise SchemaError("types must be a sequence of type names, e.g. ['string'], not a str")
    tags = [normalise_type(t) for t in types]
    if not tags:
        raise SchemaError("a grouping key needs at least one column")
    if n_values != len(tags):
        raise SchemaError(f"a key has {n_values} values but {len(tags)} types were given")
    return tags


def spark_hash(values: Sequence[Any], types: Sequence[str], seed: int = SEED) -> int:
    """Spark SQL's ``hash(values...)`` of one key, as a signed 32-bit int.

    Parameters
    ----------
    values : sequence
        The key's column values (one per type).
    types : sequence of str
        Spark type names of the columns.
    seed : int, default 42
        Initial seed; column ``i``'s hash seeds column ``i + 1``.

    Returns
    -------
    int
        The hash, in ``[-2**31, 2**31)``; equal to Spark's ``hash()``.

    Examples
    --------
    >>> spark_hash([1], ["int"])
    -559580957
    """
    tags = _check_arity(len(values), types)
    h = seed & 0xFFFFFFFF
    for value, t in zip(values, tags):
        h = _hash_internal(to_internal(value, t), t, h)
    return to_signed32(h)


def key_group(values: Sequence[Any], types: Sequence[str],
              max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of one key: ``pmod(spark_hash(values, types), max_parallelism)``.

    Examples
    --------
    >>> key_group(["alice"], ["string"], 128) == spark_hash(["alice"], ["string"]) % 128
    True
    """
    check_max_parallelism(max_parallelism)
    return spark_hash(values, types) % max_parallelism  # Python's % is pmod


# --- whole columns -----------------------------------------------------------------


def _is_arrow(col: Any) -> bool:
    return type(col).__module__.split(".")[0] == "pyarrow"


def _is_pandas(col: Any) -> bool:
    return type(col).__module__.split(".")[0] == "pandas"


def _arrow_bytes_spec(arr: Any, type_: str) -> tuple:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        try:
            arr = arr.cast(pa.large_string() if type_ == "string" else pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"an Arrow column of type {t} cannot be a {type_} key: {exc}") from None
        t = arr.type
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    n = len(arr)
    _, obuf, dbuf = arr.buffers()
    width = np.int64 if large else np.int32
    if obuf is None:  # an empty array may carry no buffers
        offsets = np.zeros(n + 1, dtype=width)
    else:
        offsets = np.frombuffer(obuf, dtype=width)[arr.offset:arr.offset + n + 1]
    data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None else np.empty(0, np.uint8)
    mask = None
    if arr.null_count:
        mask = np.ascontiguousarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return ("a64" if large else "a32", offsets, data, mask)


def _bytes_spec(col: Any, type_: str) -> tuple:
    if _is_arrow(col):
        return _arrow_bytes_spec(col, type_)
    if _is_pandas(col):
        dtype = getattr(col, "dtype", None)
        if "pyarrow" in str(dtype):
            import pyarrow as pa

            return _arrow_bytes_spec(pa.array(col), type_)
        if isinstance(dtype, np.dtype) and dtype.kind == "O":  # the kernels read None, NaN and pd.NA as nulls themselves
            return ("obj", col.tolist())
        return ("obj", col.to_numpy(dtype=object, na_value=None).tolist())
    if isinstance(col, np.ndarray):
        return ("obj", col.tolist())
    return ("obj", col if isinstance(col, list) else list(col))


def _ints_from_scalars(items: Sequence[Any], type_: str) -> tuple[np.ndarray, np.ndarray | None]:
    vals = [to_internal(v, type_) for v in items]
    mask = np.fromiter((v is not None for v in vals), dtype=bool, count=len(vals))
    # Float bits are unsigned (up to 2**64 - 1): go through uint64 and reinterpret.
    raw = [0 if v is None else v for v in vals]
    if type_ == "double":
        arr = np.array(raw, dtype=np.uint64).view(np.int64)
    else:
        arr = np.array(raw, dtype=np.int64)
    return arr, (None if mask.all() else mask)


def _float_bits_array(values: np.ndarray, type_: str) -> np.ndarray:
    """Normalised IEEE bits (as int64 holding uint32 bits, or int64 bits for double)."""
    if type_ == "float":
        with np.errstate(over="ignore"):
            f = np.ascontiguousarray(values, dtype=np.float32)
        f = np.where(f == 0, np.float32(0), f)
        bits = f.view(np.uint32).copy()
        bits[np.isnan(f)] = _CANONICAL_NAN32
        return bits.astype(np.int64)
    d = np.ascontiguousarray(values, dtype=np.float64)
    d = np.where(d == 0, 0.0, d)
    bits = d.view(np.uint64).copy()
    bits[np.isnan(d)] = np.uint64(_CANONICAL_NAN64)
    return bits.view(np.int64)


def _numpy_internal(arr: np.ndarray, mask: np.ndarray | None, type_: str
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    kind = arr.dtype.kind
    if kind in "OUS":
        items = arr.tolist()
        if mask is not None:
            items = [v if m else None for v, m in zip(items, mask.tolist())]
        return _ints_from_scalars(items, type_)
    if type_ in ("float", "double"):
        if kind not in "iufb" or kind == "b":
            raise SchemaError(f"a {type_} key column must be numeric, got dtype {arr.dtype}")
        return _float_bits_array(arr, type_), mask
    if kind == "M":
        nat = np.isnat(arr)
        unit = "datetime64[D]" if type_ == "date" else "datetime64[us]"
        if type_ not in ("date", "timestamp", "timestamp_ntz"):
            raise SchemaError(f"a {type_} key column cannot hold datetimes (dtype {arr.dtype})")
        vals = arr.astype(unit).view(np.int64)
        if nat.any():
            vals = np.where(nat, 0, vals)
            mask = ~nat if mask is None else (mask & ~nat)
        arr = vals
    elif kind == "b":
        if type_ != "boolean":
            raise SchemaError(f"a {type_} key column cannot hold booleans (dtype {arr.dtype})")
        arr = arr.astype(np.int64)
    elif kind in "iu":
        if type_ == "boolean":
            raise SchemaError(f"a boolean key column must hold booleans, got dtype {arr.dtype}")
    else:
        raise SchemaError(f"a {type_} key column cannot have dtype {arr.dtype}")
    _, lo, hi = _INT_RANGES[type_]
    if len(arr):
        check = arr if mask is None else arr[mask]
        if len(check) and (int(check.min()) < lo or int(check.max()) > hi):
            raise SchemaError(f"values out of range for a {type_} key column ({lo}..{hi})")
    return np.ascontiguousarray(arr, dtype=np.int64), mask


def _arrow_internal(arr: Any, type_: str) -> tuple[np.ndarray, np.ndarray | None]:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    mask = None
    if arr.null_count:
        mask = np.ascontiguousarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    t = arr.type
    if pa.types.is_timestamp(t):
        if type_ not in ("timestamp", "timestamp_ntz"):
            raise SchemaError(f"an Arrow {t} column cannot be a {type_} key")
        arr = arr.cast(pa.timestamp("us", tz=t.tz), safe=False).cast(pa.int64())
    elif pa.types.is_date(t):
        arr = arr.cast(pa.date32()).cast(pa.int32())
        if type_ != "date":
            raise SchemaError(f"an Arrow {t} column cannot be a {type_} key")
    elif pa.types.is_boolean(t):
        arr = arr.cast(pa.int8())
        if type_ != "boolean":
            raise SchemaError(f"an Arrow {t} column cannot be a {type_} key")
    elif not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise SchemaError(f"an Arrow {t} column cannot be a {type_} key")
    if mask is not None:
        arr = arr.fill_null(0)
    values = np.asarray(arr.to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(t):
        values = values.astype(bool)
    return _numpy_internal(values, mask, type_)


def _pandas_internal(s: Any, type_: str) -> tuple[np.ndarray, np.ndarray | None]:
    import pandas as pd
    import pyarrow as pa

    dtype = s.dtype
    if "pyarrow" in str(dtype) or isinstance(dtype, pd.DatetimeTZDtype):
        return _arrow_internal(pa.array(s), type_)
    if isinstance(dtype, pd.api.extensions.ExtensionDtype) and dtype.kind in "iufb":
        na = s.isna().to_numpy()
        np_dtype = {"b": bool, "f": np.float64}.get(dtype.kind, np.int64)
        values = s.to_numpy(dtype=np_dtype, na_value=0)
        return _numpy_internal(values, ~na if na.any() else None, type_)
    return _numpy_internal(np.asarray(s.to_numpy()), None, type_)


def _numeric_internal(col: Any, type_: str) -> tuple[np.ndarray, np.ndarray | None]:
    if _is_arrow(col):
        return _arrow_internal(col, type_)
    if _is_pandas(col):
        return _pandas_internal(col, type_)
    if isinstance(col, np.ndarray):
        return _numpy_internal(col, None, type_)
    return _ints_from_scalars(list(col), type_)


def column_specs(columns: Sequence[Any], types: Sequence[str]
                 ) -> tuple[list[tuple], list[tuple], int]:
    """Turn key columns into the kernels' column specs (see :mod:`statebackend.keys.kernels`).

    Parameters
    ----------
    columns : sequence
        One column per key field: numpy arrays, pandas Series, pyarrow (chunked) arrays or
        lists of Python values.
    types : sequence of str
        Spark type names, one per column.

    Returns
    -------
    hash_specs, encode_specs : list of tuple
        Specs for ``hash_columns`` and ``encode_keys``.
    n : int
        Number of rows.
    """
    if isinstance(columns, (np.ndarray,)) or _is_pandas(columns) or _is_arrow(columns):
        raise SchemaError("columns must be a sequence of columns, e.g. [df['user']], "
                          "not a single column")
    tags = _check_arity(len(columns), types)
    hash_specs: list[tuple] = []
    encode_specs: list[tuple] = []
    n: int | None = None
    for col, t in zip(columns, tags):
        if t in _BYTES_TYPES:
            spec = _bytes_spec(col, t)
            rows = len(spec[1]) if spec[0] == "obj" else len(spec[1]) - 1
            hash_specs.append(spec)
            encode_specs.append(spec)
        else:
            values, mask = _numeric_internal(col, t)
            rows = len(values)
            if mask is not None:
                mask = np.ascontiguousarray(mask, dtype=bool)
            if t == "float":
                hash_specs.append(("i32", values.astype(np.uint32).view(np.int32), mask))
                encode_specs.append(("f32", values.astype(np.uint32), mask))
            elif t == "double":
                hash_specs.append(("i64", values, mask))
                encode_specs.append(("f64", values.view(np.uint64), mask))
            else:
                if _INT_RANGES[t][0] == 32:
                    hash_specs.append(("i32", values.astype(np.int32), mask))
                else:
                    hash_specs.append(("i64", values, mask))
                encode_specs.append(("int", values, mask))
        if n is None:
            n = rows
        elif rows != n:
            raise SchemaError(f"key columns differ in length: {n} and {rows} rows")
    assert n is not None  # _check_arity guarantees at least one column
    return hash_specs, encode_specs, n


def spark_hashes(columns: Sequence[Any], types: Sequence[str], seed: int = SEED) -> np.ndarray:
    """Spark's ``hash(cols...)`` of every row, as an ``int32`` array (vectorised)."""
    hash_specs, _, n = column_specs(columns, types)
    out = np.full(n, to_signed32(seed), dtype=np.int32)
    _kernels.hash_columns(hash_specs, out, 0)
    return out


def key_groups(columns: Sequence[Any], types: Sequence[str],
               max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> np.ndarray:
    """The key group of every row of whole key columns (the hot path).

    Parameters
    ----------
    columns : sequence
        One column per key field (numpy arrays, pandas Series, pyarrow arrays, or lists).
    types : sequence of str
        Spark type names, one per column.
    max_parallelism : int, default 128
        Number of key groups.

    Returns
    -------
    numpy.ndarray of int32
        ``pmod(hash(cols...), max_parallelism)`` per row, as Spark computes it.

    Examples
    --------
    >>> key_groups([["a", "b"]], ["string"], 128).tolist() == [
    ...     key_group(["a"], ["string"], 128), key_group(["b"], ["string"], 128)]
    True
    """
    check_max_parallelism(max_parallelism)
    hash_specs, _, n = column_specs(columns, types)
    out = np.full(n, SEED, dtype=np.int32)
    _kernels.hash_columns(hash_specs, out, max_parallelism)
    return out
