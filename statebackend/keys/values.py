"""Value codecs: compact, deterministic bytes for tuples of a :class:`Schema`.

Layout of one encoded row::

    [null bitmap: ceil(n/8) bytes LE] [fixed-width fields, struct little-endian]
    [variable fields in field order: varint length + bytes, absent when null]

Fixed-width fields (boolean, integers, floats, date as int32 days, timestamps as int64
microseconds) are packed with one ``struct`` call; a null fixed field is packed as zero and
flagged in the bitmap. Strings are UTF-8; decimals are their unscaled integer as signed
big-endian bytes; arrays are ``varint count, bitmap, elements``; a struct is one encoded
row of its fields (this same layout, nested); a map is ``varint length`` + its keys as an
array + its values as an array. Complex types nest to any depth; they decode as Spark hands
them to Python: arrays as lists, maps as dicts, structs as ``pyspark.sql.Row``.

The encoder and decoder of a schema are generated Python functions, compiled once per
state, because this is the per-row hot path: a generated function does one ``struct`` call
and no per-field dispatch. Decoding only slices bytes and calls ``struct``: no pickle, no
code named by the data runs on load. Encoding is deterministic (equal tuples give equal
bytes), which map-state user keys rely on.
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections.abc import Callable
from typing import Any

from ..errors import SchemaError
from ..model.schema import DataType, Schema
from .scalars import (
    _EPOCH,
    _EPOCH_ORDINAL,
    _Bad,
    _decimal_decoder,
    _decimal_encoder,
    _describe,
    _from_days,
    _from_micros,
    _to_binary,
    _to_bool,
    _to_days,
    _to_micros,
    _to_utf8,
)

__all__ = ["RowCodec", "compile_codec", "encode_varint", "decode_varint"]

_FIXED = {"boolean": "?", "tinyint": "b", "smallint": "h", "int": "i", "bigint": "q",
          "float": "f", "double": "d", "date": "i", "timestamp": "q", "timestamp_ntz": "q"}
_BITMAP = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: Precomputed one-byte varints: most strings are shorter than 128 bytes.
_VL = [bytes((i,)) for i in range(128)]


# --- varints ----------------------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128."""
    if n < 128:
        return _VL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """``(value, position after it)`` of the varint at ``buf[pos]``."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _checked_fixed(t: DataType) -> Callable[[Any], Any]:
    """Converter to the internal value packed by struct, raising :class:`_Bad`."""
    fmt = struct.Struct("<" + _FIXED[t.name])
    pre: Callable[[Any], Any] | None = {
        "boolean": _to_bool, "date": _to_days, "timestamp": _to_micros,
        "timestamp_ntz": _to_micros}.get(t.name)

    def conv(v: Any) -> Any:
        x = pre(v) if pre is not None else v
        if t.name in ("float", "double"):
            if isinstance(x, (str, bytes)) or not hasattr(x, "__float__"):
                raise _Bad(f"expected a float, got {_describe(v)}")
        try:
            fmt.pack(x)
        except (struct.error, TypeError, OverflowError) as exc:
            raise _Bad(f"expected {t.ddl()}, got {_describe(v)} ({exc})") from None
        return x

    return conv


def _scalar_encoder(t: DataType) -> Callable[[Any], Any]:
    if t.name in _FIXED:
        return _checked_fixed(t)
    if t.name == "string":
        return _to_utf8
    if t.name == "binary":
        return _to_binary
    if t.name == "decimal":
        return _decimal_encoder(t.precision, t.scale)
    if t.name == "array":
        return _array_encoder(t)
    if t.name == "map":
        return _map_encoder(t)
    if t.name == "struct":
        return _struct_encoder(t)
    raise SchemaError(f"unsupported type {t.ddl()}")


def _scalar_decoder(t: DataType) -> Callable[[Any], Any] | None:
    """``bytes (or the unpacked fixed value) -> Python value``; None: kept as unpacked."""
    if t.name == "decimal":
        return _decimal_decoder(t.scale)
    if t.name == "array":
        return _array_decoder(t)
    if t.name == "map":
        return _map_decoder(t)
    if t.name == "struct":
        return _struct_decoder(t)
    return {"date": _from_days, "timestamp": _from_micros, "timestamp_ntz": _from_micros,
            "string": lambda b: b.decode("utf-8"), "binary": bytes}.get(t.name)


# --- arrays -----------------------------------------------------------------------------


def _array_encoder(t: DataType) -> Callable[[Any], bytes]:
    el = t.element
    assert el is not None
    conv = _scalar_encoder(el)
    fixed = _FIXED.get(el.name)

    def enc(v: Any) -> bytes:
        if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
            raise _Bad(f"expected a list for {t.ddl()}, got {_describe(v)}")
        items = list(v.tolist() if hasattr(v, "tolist") else v)
        n = len(items)
        bits = 0
        vals = []
        for i, x in enumerate(items):
            if x is None:
                if not t.contains_null:
                    raise _Bad(f"element {i} is None but the array does not contain nulls")
                bits |= 1 << i
                vals.append(0 if fixed else None)
            else:
                try:
                    vals.append(conv(x))
                except _Bad as exc:
                    raise _Bad(f"element {i}: {exc}") from None
        out = [encode_varint(n), bits.to_bytes((n + 7) // 8, "little")]
        if fixed:
            out.append(struct.pack(f"<{n}{fixed}", *vals))
        else:
            for x in vals:
                if x is not None:
                    out.append(encode_varint(len(x)))
                    out.append(x)
        return b"".join(out)

    return enc


def _array_decoder(t: DataType) -> Callable[[bytes], list[Any]]:
    el = t.element
    assert el is not None
    fixed = _FIXED.get(el.name)
    post = _scalar_decoder(el)

    def dec(b: bytes) -> list[Any]:
        n, pos = decode_varint(b, 0)
        nb = (n + 7) // 8
        bits = int.from_bytes(b[pos:pos + nb], "little")
        pos += nb
        if fixed:
            vals: list[Any] = list(struct.unpack_from(f"<{n}{fixed}", b, pos))
            if post is not None:
                vals = [post(x) for x in vals]
        else:
            vals = []
            for i in range(n):
                if bits >> i & 1:
                    vals.append(None)
                    continue
                ln, pos = decode_varint(b, pos)
                raw = b[pos:pos + ln]
                pos += ln
                vals.append(post(raw) if post is not None else raw)
        if bits:
            for i in range(n):
                if bits >> i & 1:
                    vals[i] = None
        return vals

    return dec


# --- maps and structs -------------------------------------------------------------------


def _map_arrays(t: DataType) -> tuple[DataType, DataType]:
    assert t.key is not None and t.value is not None
    return (DataType("array", element=t.key, contains_null=False),
            DataType("array", element=t.value, contains_null=t.value_contains_null))


def _map_encoder(t: DataType) -> Callable[[Any], bytes]:
    keys_t, values_t = _map_arrays(t)
    enc_keys, enc_values = _array_encoder(keys_t), _array_encoder(values_t)

    def enc(v: Any) -> bytes:
        items = getattr(v, "items", None)
        if items is None:
            raise _Bad(f"expected a dict for {t.ddl()}, got {_describe(v)}")
        pairs = list(items())
        try:
            kb = enc_keys([k for k, _ in pairs])
        except _Bad as exc:
            raise _Bad(f"map key: {exc}") from None
        try:
            vb = enc_values([x for _, x in pairs])
        except _Bad as exc:
            raise _Bad(f"map value: {exc}") from None
        return encode_varint(len(kb)) + kb + vb

    return enc


def _map_decoder(t: DataType) -> Callable[[bytes], dict[Any, Any]]:
    keys_t, values_t = _map_arrays(t)
    dec_keys, dec_values = _array_decoder(keys_t), _array_decoder(values_t)

    def dec(b: bytes) -> dict[Any, Any]:
        n, pos = decode_varint(b, 0)
        return dict(zip(dec_keys(b[pos:pos + n]), dec_values(b[pos + n:])))

    return dec


def _struct_codec(t: DataType) -> RowCodec:
    assert t.fields is not None
    return RowCodec(Schema(t.fields), t.ddl())


def _struct_encoder(t: DataType) -> Callable[[Any], bytes]:
    encode = _struct_codec(t).encode

    def enc(v: Any) -> bytes:
        if not isinstance(v, (tuple, list, dict)):
            raise _Bad(f"expected a Row, tuple or dict for {t.ddl()}, got {_describe(v)}")
        try:
            return encode(v)
        except SchemaError as exc:
            raise _Bad(str(exc)) from None

    return enc


def _row_factory(names: tuple[str, ...]) -> Callable[[tuple[Any, ...]], Any]:
    """Structs come back as ``pyspark.sql.Row`` with field names, as Spark's state calls
    return them (a plain tuple where pyspark is not importable)."""
    try:
        from pyspark.sql.types import _create_row
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return tuple
    cols = list(names)
    return lambda values: _create_row(cols, values)


def _struct_decoder(t: DataType) -> Callable[[bytes], Any]:
    codec = _struct_codec(t)
    decode, make = codec.decode, _row_factory(codec.schema.names)

    def dec(b: bytes) -> Any:
        return make(decode(b))

    return dec


# --- the compiled row codec -------------------------------------------------------------


class RowCodec:
    """Encoder and decoder of tuples of one schema.

    Parameters
    ----------
    schema : Schema
        The declared schema.
    label : str
        How errors name the owner, e.g. ``"state 'count'"`` or ``"map 'm' user key"``.
    tag : int, optional
        A schema id (u16) that :attr:`encode` writes as the row's first two bytes
        (little-endian) and :attr:`decode` skips, inside the same ``struct`` call as the
        null bitmap, so a tagged row costs no more to encode or decode than an untagged
        one. Stored state values carry it (see :mod:`.evolution`); nested structs and
        map user keys do not.

    Attributes
    ----------
    encode : callable
        ``tuple-like -> bytes``; raises :class:`SchemaError` naming the label and field.
    decode : callable
        ``bytes -> tuple``.
    """

    def __init__(self, schema: Schema, label: str, tag: int | None = None) -> None:
        if tag is not None and not 0 <= tag <= 0xFFFF:
            raise ValueError(f"a schema tag is a u16, got {tag!r}")
        self.schema = schema
        self.label = label
        self.tag = tag
        self._field_checks = [self._field_check(i) for i in range(len(schema))]
        self.encode: Callable[[Any], bytes]
        self.decode: Callable[[bytes], tuple[Any, ...]]
        self._compile()

    # --- errors -----------------------------------------------------------------------

    def _field_check(self, i: int) -> Callable[[Any], Any]:
        f = self.schema.fields[i]
        return _scalar_encoder(f.type)

    def _error(self, i: int, message: str) -> SchemaError:
        f = self.schema.fields[i]
        return SchemaError(f"{self.label} field {f.name!r} ({f.type.ddl()}): {message}")

    def _diagnose(self, v: tuple[Any, ...], cause: BaseException | None = None) -> SchemaError:
        """Find the field that made the fast encoder fail, for a precise message."""
        for i, (f, x) in enumerate(zip(self.schema.fields, v)):
            if x is None:
                if not f.nullable:
                    return self._error(i, "is None but the field is NOT NULL")
                continue
            try:
                self._field_checks[i](x)
            except _Bad as exc:
                return self._error(i, str(exc))
        return SchemaError(f"{self.label}: cannot encode {v!r} as ({self.schema.ddl()}): {cause}")

    def _arity(self, v: Any) -> SchemaError:
        return SchemaError(f"{self.label}: expected a tuple of {len(self.schema)} field(s) "
                           f"({self.schema.ddl()}), got {len(v)} value(s): {v!r}")

    def _normalize(self, v: Any) -> tuple[Any, ...]:
        """Accept lists, Rows (reordered by field name), dicts; refuse anything else."""
        names = self.schema.names
        if isinstance(v, tuple):
            row_fields = getattr(v, "__fields__", None)
            if row_fields is not None and tuple(row_fields) != names and \
                    sorted(row_fields) == sorted(names):
                d = dict(zip(row_fields, v))
                return tuple(d[n] for n in names)
            return tuple(v)
        if isinstance(v, list):
            return tuple(v)
        if isinstance(v, dict):
            extra = set(v) - set(names)
            missing = [n for n in names if n not in v]
            if extra or missing:
                raise SchemaError(f"{self.label}: dict keys do not match ({self.schema.ddl()}): "
                                  f"missing {missing}, unexpected {sorted(map(str, extra))}")
            return tuple(v[n] for n in names)
        hint = " (wrap a single value in a tuple, e.g. (x,))" if len(names) == 1 else ""
        raise SchemaError(f"{self.label}: expected a tuple of ({self.schema.ddl()}), "
                          f"got {_describe(v)}{hint}")

    # --- code generation --------------------------------------------------------------

    def _compile(self) -> None:
        fields = self.schema.fields
        nb = (len(fields) + 7) // 8
        bitmap_fmt = _BITMAP.get(nb)
        fixed_idx = [i for i, f in enumerate(fields) if f.type.name in _FIXED]
        var_idx = [i for i, f in enumerate(fields) if f.type.name not in _FIXED]
        fmt = (bitmap_fmt or f"{nb}s") + "".join(_FIXED[fields[i].type.name]
                                                  for i in fixed_idx)
        tagged = self.tag is not None
        # The tag is packed with the bitmap and skipped as padding when unpacking.
        st = struct.Struct(("<H" if tagged else "<") + fmt)
        ust = struct.Struct(("<2x" if tagged else "<") + fmt)
        ns: dict[str, Any] = {
            "_pack": st.pack, "_unpack_from": ust.unpack_from, "_FIXED_SIZE": st.size,
            "_VL": _VL, "_varint": encode_varint, "_read_varint": decode_varint,
            "_Bad": _Bad, "_struct_error": struct.error, "_self": self,
            "_to_bool": _to_bool, "_to_days": _to_days, "_to_micros": _to_micros,
            "_from_days": _from_days, "_from_micros": _from_micros, "_date": _dt.date,
            "_datetime": _dt.datetime, "_EPOCH_ORDINAL": _EPOCH_ORDINAL, "_EPOCH": _EPOCH,
            "_timedelta": _dt.timedelta, "_int_from_bytes": int.from_bytes,
        }
        enc = self._encoder_lines(ns, nb, bitmap_fmt, fixed_idx, var_idx)
        dec = self._decoder_lines(ns, bitmap_fmt, fixed_idx, var_idx)
        src = "\n".join(enc) + "\n\n" + "\n".join(dec) + "\n"
        # Generated from the schema only (field indexes and type tags), never from data.
        exec(compile(src, f"<codec {self.label}>", "exec"), ns)  # noqa: S102
        self.encode = ns["encode"]
        self.decode = ns["decode"]
        self.source = src

    def _args(self) -> str:
        n = len(self.schema.fields)
        return ", ".join(f"a{i}" for i in range(n)) + ("," if n == 1 else "")

    def _encoder_lines(self, ns: dict[str, Any], nb: int, bitmap_fmt: str | None,
                       fixed_idx: list[int], var_idx: list[int]) -> list[str]:
        """Source of ``encode``: per-field conversion, one ``_pack``, then the tail."""
        fields = self.schema.fields
        enc = ["def encode(v):",
               "    if v.__class__ is not tuple:",
               "        v = _self._normalize(v)",
               f"    if len(v) != {len(fields)}:",
               "        raise _self._arity(v)",
               f"    {self._args()} = v",
               "    bits = 0"]
        for i, f in enumerate(fields):
            t = f.type.name
            enc.append(f"    if a{i} is None:")
            if f.nullable:
                enc.append(f"        bits |= {1 << i}")
                if t in _FIXED:
                    enc.append(f"        a{i} = 0")
            else:
                enc.append(f"        raise _self._error({i}, 'is None but the field is NOT NULL')")
            enc.append("    else:")
            enc.extend("        " + line for line in self._encode_body(i, t, ns))
        bits_expr = "bits" if bitmap_fmt else f"bits.to_bytes({nb}, 'little')"
        fixed_args = "".join(f", a{i}" for i in fixed_idx)
        tag = f"{self.tag}, " if self.tag is not None else ""
        enc += ["    try:",
                f"        out = _pack({tag}{bits_expr}{fixed_args})",
                "    except (_struct_error, TypeError, OverflowError) as exc:",
                "        raise _self._diagnose(v, exc) from None"]
        for i in var_idx:
            enc += [f"    if a{i} is not None:",
                    f"        ln = len(a{i})",
                    f"        out += (_VL[ln] if ln < 128 else _varint(ln)) + a{i}"]
        enc.append("    return out")
        return enc

    def _decoder_lines(self, ns: dict[str, Any], bitmap_fmt: str | None,
                       fixed_idx: list[int], var_idx: list[int]) -> list[str]:
        """Source of ``decode``: one ``_unpack_from``, the variable tail, then nulls."""
        fields = self.schema.fields
        head = ", ".join(["bits"] + [f"a{i}" for i in fixed_idx]) + ","
        dec = ["def decode(buf):", f"    {head} = _unpack_from(buf, 0)"]
        if not bitmap_fmt:
            dec.append("    bits = _int_from_bytes(bits, 'little')")
        if var_idx:
            dec.append("    pos = _FIXED_SIZE")
        for i in var_idx:
            t = fields[i].type.name
            dec += [f"    if bits & {1 << i}:",
                    f"        a{i} = None",
                    "    else:",
                    "        ln = buf[pos]",
                    "        pos += 1",
                    "        if ln >= 128:",
                    "            ln, pos = _read_varint(buf, pos - 1)"]
            if t == "string":
                dec.append(f"        a{i} = buf[pos:pos + ln].decode('utf-8')")
            elif t == "binary":
                dec.append(f"        a{i} = buf[pos:pos + ln]")
            else:
                ns[f"_dec{i}"] = _scalar_decoder(fields[i].type)
                dec.append(f"        a{i} = _dec{i}(buf[pos:pos + ln])")
            dec.append("        pos += ln")
        for i in fixed_idx:
            t = fields[i].type.name
            if t == "date":
                dec.append(f"    a{i} = _date.fromordinal(a{i} + _EPOCH_ORDINAL)")
            elif t in ("timestamp", "timestamp_ntz"):
                dec.append(f"    a{i} = _EPOCH + _timedelta(microseconds=a{i})")
        nullable_fixed = [i for i in fixed_idx if fields[i].nullable]
        if nullable_fixed:
            dec.append("    if bits:")
            for i in nullable_fixed:
                dec.append(f"        if bits & {1 << i}: a{i} = None")
        dec.append(f"    return ({self._args()})")
        return dec

    def _encode_body(self, i: int, t: str, ns: dict[str, Any]) -> list[str]:
        """Per-field conversion of a non-None value to what ``_pack`` or the tail takes."""
        if t in ("tinyint", "smallint", "int", "bigint"):
            # struct refuses floats and strings for integer codes; a failure is diagnosed.
            return ["pass"]
        if t in ("float", "double"):
            return ["pass"]  # struct refuses str/bytes for float codes (no __float__)
        if t == "boolean":
            return [f"if a{i}.__class__ is not bool:",
                    "    try:",
                    f"        a{i} = _to_bool(a{i})",
                    "    except _Bad as exc:",
                    f"        raise _self._error({i}, str(exc)) from None"]
        if t == "date":
            return [f"if a{i}.__class__ is _date:",
                    f"    a{i} = a{i}.toordinal() - _EPOCH_ORDINAL",
                    "else:",
                    "    try:",
                    f"        a{i} = _to_days(a{i})",
                    "    except _Bad as exc:",
                    f"        raise _self._error({i}, str(exc)) from None"]
        if t in ("timestamp", "timestamp_ntz"):
            return ["try:",
                    f"    a{i} = _to_micros(a{i})",
                    "except _Bad as exc:",
                    f"    raise _self._error({i}, str(exc)) from None"]
        if t == "string":
            ns[f"_conv{i}"] = _to_utf8
            return [f"if a{i}.__class__ is str:",
                    "    try:",
                    f"        a{i} = a{i}.encode('utf-8')",
                    "    except UnicodeEncodeError:",
                    f"        raise _self._error({i}, 'string is not valid unicode') from None",
                    "else:",
                    "    try:",
                    f"        a{i} = _conv{i}(a{i})",
                    "    except _Bad as exc:",
                    f"        raise _self._error({i}, str(exc)) from None"]
        ns[f"_conv{i}"] = self._field_checks[i]
        return ["try:",
                f"    a{i} = _conv{i}(a{i})",
                "except _Bad as exc:",
                f"    raise _self._error({i}, str(exc)) from None"]


def compile_codec(schema: Schema, label: str, tag: int | None = None) -> RowCodec:
    """Compile the codec of ``schema``; errors will name ``label``; ``tag``: see
    :class:`RowCodec`."""
    return RowCodec(schema, label, tag)
