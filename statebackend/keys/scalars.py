"""Conversions of single values to and from what the value codecs pack: booleans, dates as
days, timestamps as microseconds (as PySpark converts them), UTF-8, binary and decimals as
their unscaled integer. :mod:`statebackend.keys.values` compiles them into row codecs."""

from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Callable
from typing import Any

_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


class _Bad(Exception):
    """Internal: a value does not fit its type (message says what was expected)."""


def _describe(v: Any) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '...' if len(r) > 40 else r}"


def _to_bool(v: Any) -> bool:
    if v.__class__ is bool:
        return v
    dtype = getattr(v, "dtype", None)  # numpy.bool_
    if dtype is not None and getattr(dtype, "kind", "") == "b":
        return bool(v)
    raise _Bad(f"expected a bool, got {_describe(v)}")


def _to_days(v: Any) -> int:
    if isinstance(v, _dt.datetime):
        v = v.date()
    if isinstance(v, _dt.date):
        return v.toordinal() - _EPOCH_ORDINAL
    raise _Bad(f"expected a datetime.date, got {_describe(v)}")


def _to_micros(v: Any) -> int:
    if not isinstance(v, _dt.datetime):
        raise _Bad(f"expected a datetime.datetime, got {_describe(v)}")
    if v.tzinfo is not None:
        # Aware datetimes become the worker's local wall clock, which is what PySpark
        # itself returns for TimestampType; naive ones are stored exactly as given.
        v = v.astimezone().replace(tzinfo=None)
    td = v - _EPOCH
    return (td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds


def _from_days(d: int) -> _dt.date:
    return _dt.date.fromordinal(d + _EPOCH_ORDINAL)


def _from_micros(us: int) -> _dt.datetime:
    return _EPOCH + _dt.timedelta(microseconds=us)


def _to_utf8(v: Any) -> bytes:
    if isinstance(v, str):
        if hasattr(v, "tolist"):
            # a numpy string scalar: its Python value, as Spark's client takes it
            # (numpy drops trailing NUL characters there)
            v = v.tolist()
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Bad(f"string is not valid unicode ({exc.reason})") from None
    raise _Bad(f"expected a str, got {_describe(v)}")


def _to_binary(v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise _Bad(f"expected bytes, got {_describe(v)}")


#: Decimal arithmetic wide enough for DECIMAL(38, s) whatever the thread's context says
#: (Python's default precision is 28 digits: it would round or refuse wider values).
_DECIMAL_CONTEXT = decimal.Context(prec=80, Emax=999_999, Emin=-999_999)


def _decimal_encoder(precision: int, scale: int) -> Callable[[Any], bytes]:
    ctx = _DECIMAL_CONTEXT
    quantum = decimal.Decimal(1).scaleb(-scale, context=ctx)
    limit = 10 ** precision

    def enc(v: Any) -> bytes:
        if isinstance(v, bool) or not isinstance(v, (decimal.Decimal, int)):
            raise _Bad(f"expected a decimal.Decimal, got {_describe(v)}")
        d = decimal.Decimal(v)
        if not d.is_finite():
            raise _Bad(f"decimal {v} is not finite")
        q = d.quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=ctx)
        unscaled = int(q.scaleb(scale, context=ctx))
        if abs(unscaled) >= limit:
            raise _Bad(f"{v} does not fit DECIMAL({precision},{scale})")
        return unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)

    return enc


def _decimal_decoder(scale: int) -> Callable[[bytes], decimal.Decimal]:
    ctx = _DECIMAL_CONTEXT

    def dec(b: bytes) -> decimal.Decimal:
        return decimal.Decimal(int.from_bytes(b, "big", signed=True)).scaleb(-scale, context=ctx)
    return dec
