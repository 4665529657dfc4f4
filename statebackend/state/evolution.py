"""Schema evolution: which schema changes a state accepts, and reading old values.

Every value a state stores (each list element, each map value) starts with the u16 id of
the schema version it was written with (see :class:`~.codec.RowCodec`'s ``tag``)::

    u16le schema id | [i64le expiry, when that version has a TTL] | encoded row

A state's descriptor records its current version (``schema_id``, ``value_schema``,
``ttl_ms``) and every earlier one (``history``: ``(id, value DDL, has TTL)``), so a value
is always read through the schema it was written with and then projected onto the
current one: fields matched by name at every depth, widened where the type widened,
the field's DEFAULT (else None) for a field the old value lacks, dropped when the new schema lacks it. Values are
never rewritten by a schema change; a value is stored under the new version when the
user next writes it.

A version's id is derived from its DDL and TTL flag (CRC32, 16 bits), so partitions that
evolved independently give the same version the same id, and their descriptors merge
(:func:`merge_descriptors`) on rescale and when a checkpoint is read.

Every stored descriptor of a state with values has a ``schema_id``; one without (values
with no id, a pre-release layout) is refused with
:class:`~statebackend.errors.FormatVersionError` (:func:`check_stored_descriptor`).

Accepted changes (at every depth of structs, arrays and map values): added fields
(nullable, or with a DDL ``DEFAULT``, which old values then read as), removed fields, reordered fields, widening (:data:`WIDENING`, decimals to a
precision and scale that hold every old value), NOT NULL to nullable, adding, removing or
changing a TTL. Refused, with :class:`~statebackend.errors.SchemaEvolutionError` before
anything is written: narrowing and other type changes, nullable to NOT NULL, an added NOT
NULL field, any change of a map state's user key or of a map type's key. A rename is a
removal plus an addition: the renamed field reads as None in old values.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import (
    CorruptStateError,
    FormatVersionError,
    SchemaEvolutionError,
)
from ..keys.values import RowCodec, _row_factory, compile_codec
from ..model.manifest import StateDescriptor
from ..model.schema import DataType, Field, Schema, parse_ddl

__all__ = ["WIDENING", "TAG", "TAG_EXPIRY", "NO_EXPIRY", "Versions", "check_evolution",
           "merge_descriptors", "version_id", "evolve", "descriptor_json", "merge_meta_entry"]

EXPIRY = struct.Struct("<q")
TAG = struct.Struct("<H")
TAG_EXPIRY = struct.Struct("<Hq")
#: The expiry given to values written before the state had a TTL: they keep living until
#: they are written again (then the TTL applies).
NO_EXPIRY = (1 << 63) - 1

_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
#: Type widenings a stored value is read through (writer type -> reader types), as Spark's
#: transformWithState schema evolution (Avro's promotions) allows.
WIDENING: dict[str, frozenset[str]] = {
    "tinyint": frozenset({"smallint", "int", "bigint", "float", "double"}),
    "smallint": frozenset({"int", "bigint", "float", "double"}),
    "int": frozenset({"bigint", "float", "double"}),
    "bigint": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "date": frozenset({"timestamp", "timestamp_ntz"}),
    "string": frozenset({"binary"}),
    "binary": frozenset({"string"}),
}

_REMEDY = ("Keep the earlier type (a wider one is accepted), or store the data under a "
           "new state name and delete_state({name!r}) once nothing reads it.")


def version_id(value_schema: str | None, has_ttl: bool, taken: set[int] | None = None) -> int:
    """The id of the schema version ``(value_schema, has_ttl)``: 16 bits of a CRC32, the
    next free one when another version already holds it."""
    vid = zlib.crc32(f"{value_schema}\x00{int(has_ttl)}".encode()) & 0xFFFF
    while taken and vid in taken:
        vid = (vid + 1) & 0xFFFF
    return vid


# --- compatibility ----------------------------------------------------------------------


def _fail(state: str, path: str, change: str) -> SchemaEvolutionError:
    return SchemaEvolutionError(state, path, change, _REMEDY.format(name=state))


def _check_type(state: str, path: str, w: DataType, r: DataType) -> None:
    if w == r:
        return
    if w.name != r.name:
        if r.name in WIDENING.get(w.name, ()):
            return
        if w.name in WIDENING.get(r.name, ()) or (w.name in _INTEGRAL and r.name in _INTEGRAL):
            raise _fail(state, path, f"narrowing {w.ddl()} to {r.ddl()}")
        raise _fail(state, path, f"changing type {w.ddl()} to {r.ddl()}")
    if w.name == "decimal":
        if r.scale >= w.scale and r.precision - r.scale >= w.precision - w.scale:
            return
        raise _fail(state, path, f"narrowing {w.ddl()} to {r.ddl()}")
    if w.name == "array":
        assert w.element is not None and r.element is not None
        if w.contains_null and not r.contains_null:
            raise _fail(state, path, "making array elements NOT NULL")
        _check_type(state, f"{path}.element", w.element, r.element)
    elif w.name == "map":
        assert w.key is not None and r.key is not None and w.value is not None
        assert r.value is not None
        if w.key != r.key:
            raise _fail(state, f"{path}.key", f"changing the map key type {w.key.ddl()} to "
                                              f"{r.key.ddl()}")
        if w.value_contains_null and not r.value_contains_null:
            raise _fail(state, path, "making map values NOT NULL")
        _check_type(state, f"{path}.value", w.value, r.value)
    elif w.name == "struct":
        assert w.fields is not None and r.fields is not None
        _check_fields(state, path, w.fields, r.fields)


def _check_fields(state: str, path: str, wf: tuple[Field, ...], rf: tuple[Field, ...]) -> None:
    old = {f.name: f for f in wf}
    for f in rf:
        p = f"{path}.{f.name}" if path else f.name
        o = old.get(f.name)
        if o is None:
            if not f.nullable and f.default is None:
                raise _fail(state, p, f"adding NOT NULL field {f.name!r} without a DEFAULT "
                                      f"(old values have no value for it; a rename is a "
                                      f"removal plus an addition)")
            continue
        if o.nullable and not f.nullable:
            raise _fail(state, p, "making a nullable field NOT NULL")
        _check_type(state, p, o.type, f.type)


def check_evolution(old: StateDescriptor, new: StateDescriptor) -> None:
    """Refuse ``new`` when it cannot read every value stored under ``old``'s versions.

    Raises
    ------
    SchemaEvolutionError
        Naming the state, the field and the change.
    """
    name = new.name
    if old.kind != new.kind:
        raise SchemaEvolutionError(
            name, "", f"changing the state's kind from {old.kind} to {new.kind}",
            f"Use another name for the new state, or delete_state({name!r}) first (its "
            f"data is lost).")
    if old.blocks != new.blocks:
        raise SchemaEvolutionError(
            name, "", f"changing its number of value blocks from {old.blocks} to "
                      f"{new.blocks}", f"Keep value_blocks={old.blocks}, or use another "
                                       f"state name.")
    if old.user_key_schema != new.user_key_schema:
        raise SchemaEvolutionError(
            name, "user key", f"changing the map's user key schema from "
                              f"({old.user_key_schema}) to ({new.user_key_schema})",
            "Keep the user key schema (user keys are stored as encoded bytes and looked up "
            "by them), or store the data in a new map state.")
    if old.value_schema == new.value_schema and (old.ttl_ms is None) == (new.ttl_ms is None):
        return
    reader = parse_ddl(new.value_schema or "")
    for ddl in {old.value_schema, *(h[1] for h in old.history)}:
        _check_fields(name, "", parse_ddl(ddl or "").fields, reader.fields)


def evolve(old: StateDescriptor | None, new: StateDescriptor) -> StateDescriptor:
    """``new`` with its version id and history, given the stored descriptor ``old``
    (None: a new state). Checks the change (see :func:`check_evolution`)."""
    has_ttl = new.ttl_ms is not None
    if old is None:
        return replace(new, schema_id=version_id(new.value_schema, has_ttl), history=())
    check_evolution(old, new)
    if old.value_schema == new.value_schema and (old.ttl_ms is None) == (not has_ttl):
        return replace(new, schema_id=old.schema_id, history=old.history)
    assert old.schema_id is not None
    versions = {h[0]: (h[1], h[2]) for h in old.history}
    versions[old.schema_id] = (old.value_schema or "", old.ttl_ms is not None)
    same = [vid for vid, v in versions.items() if v == (new.value_schema, has_ttl)]
    vid = same[0] if same else version_id(new.value_schema, has_ttl, set(versions))
    versions.pop(vid, None)
    return replace(new, schema_id=vid, history=tuple(
        (i, ddl, t) for i, (ddl, t) in sorted(versions.items())))


def merge_descriptors(a: StateDescriptor, b: StateDescriptor) -> StateDescriptor | None:
    """One descriptor that reads the values of both (the same state as stored by two
    partitions), or None when they conflict. The one whose history holds the other's
    current version is the newer; the merged history is the union."""
    if a == b:
        return a
    if (a.schema_id is None) != (b.schema_id is None):
        return None  # values with and without schema ids: not one layout
    if (a.kind, a.user_key_schema, a.blocks) != (b.kind, b.user_key_schema, b.blocks) or \
            a.schema_id is None or b.schema_id is None:
        return None if (a.kind, a.value_schema, a.user_key_schema, a.blocks,
                        a.ttl_ms is None) != (b.kind, b.value_schema, b.user_key_schema,
                                              b.blocks, b.ttl_ms is None) else a
    if a.schema_id == b.schema_id:
        newer, older = a, b
    elif any(h[0] == a.schema_id for h in b.history):
        newer, older = b, a
    elif any(h[0] == b.schema_id for h in a.history):
        newer, older = a, b
    else:
        return None
    versions = {h[0]: h for h in (*older.history, *newer.history)}
    versions[older.schema_id] = (older.schema_id, older.value_schema, older.ttl_ms is not None)
    versions.pop(newer.schema_id, None)  # type: ignore[arg-type]
    return replace(newer, history=tuple(versions[k] for k in sorted(versions)))


def descriptor_json(d: StateDescriptor) -> bytes:
    """How ``_meta`` stores a descriptor (keys absent when unset, as older versions wrote)."""
    return json.dumps(
        {"name": d.name, "kind": d.kind, "value_schema": d.value_schema,
         "user_key_schema": d.user_key_schema, "ttl_ms": d.ttl_ms,
         **({"blocks": d.blocks} if d.blocks is not None else {}),
         **({"schema_id": d.schema_id} if d.schema_id is not None else {}),
         **({"history": [list(h) for h in d.history]} if d.history else {})},
        sort_keys=True).encode("utf-8")


META_STATE_PREFIX = b"state/"


def check_stored_descriptor(d: StateDescriptor, where: str) -> StateDescriptor:
    """``d``, a descriptor read from storage, if its state's values carry schema ids.

    Raises
    ------
    FormatVersionError
        A state with values but no ``schema_id``: written by a pre-release version whose
        values carried no id, which this version no longer reads.
    """
    if d.schema_id is None and d.kind != "timers":
        raise FormatVersionError(f"{where} (state {d.name!r})", "state value",
                                 "values without schema ids", "values tagged with schema ids")
    return d


def merge_meta_entry(key: bytes, a: bytes, b: bytes) -> bytes:
    """The ``_meta`` entry for ``key`` when two instances hold one (rescaling, a
    savepoint's partitions): a state's descriptors merged so that every schema version
    either stored stays readable; otherwise ``a``."""
    if not key.startswith(META_STATE_PREFIX) or a == b:
        return a
    try:
        da, db = (StateDescriptor(**json.loads(x)) for x in (a, b))
    except (ValueError, TypeError):
        return a
    where = f"_meta entry {key.decode('utf-8', 'replace')}"
    check_stored_descriptor(da, where)
    check_stored_descriptor(db, where)
    merged = merge_descriptors(da, db)
    return a if merged is None or merged == da else descriptor_json(merged)


# --- reading values of any version ------------------------------------------------------


def _converter(w: DataType, r: DataType) -> Callable[[Any], Any] | None:
    """``old value -> value of type r``; None when values need no change."""
    if w == r:
        return None
    if w.name != r.name:
        if r.name in ("float", "double"):
            return float
        if r.name == "binary":
            return lambda x: x.encode("utf-8")
        if r.name == "string" and w.name == "binary":
            return lambda x: bytes(x).decode("utf-8", errors="replace")
        if r.name in ("timestamp", "timestamp_ntz") and w.name == "date":
            import datetime as dt
            return lambda d: dt.datetime(d.year, d.month, d.day)
        return None  # integral widening: Python ints already
    if w.name == "array":
        assert w.element is not None and r.element is not None
        conv = _converter(w.element, r.element)
        if conv is None:
            return None
        return lambda v: [None if x is None else conv(x) for x in v]
    if w.name == "map":
        assert w.value is not None and r.value is not None
        vconv = _converter(w.value, r.value)
        if vconv is None:
            return None
        return lambda v: {k: None if x is None else vconv(x) for k, x in v.items()}
    if w.name == "struct":
        assert w.fields is not None and r.fields is not None
        proj = _projector(w.fields, r.fields)
        if proj is None:
            return None
        make = _row_factory(tuple(f.name for f in r.fields))
        return lambda v: make(proj(tuple(v)))
    return None  # decimal widening and nullability: the same Python values


def _projector(wf: tuple[Field, ...], rf: tuple[Field, ...]
               ) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """``old tuple -> new tuple`` by field name; None when it would be the identity."""
    index = {f.name: i for i, f in enumerate(wf)}
    plan: list[tuple[int | None, Callable[[Any], Any] | None, Any]] = []
    for f in rf:
        i = index.get(f.name)
        plan.append((i, None if i is None else _converter(wf[i].type, f.type),
                     f.default_value() if i is None else None))
    if len(wf) == len(rf) and all(i == k and c is None for k, (i, c, _) in enumerate(plan)):
        return None

    def project(v: tuple[Any, ...]) -> tuple[Any, ...]:
        # an added field: its DEFAULT (None without one)
        return tuple(d if i is None else v[i] if c is None or v[i] is None else c(v[i])
                     for i, c, d in plan)
    return project


class _Version:
    __slots__ = ("vid", "ttl", "decode", "project")

    def __init__(self, vid: int, ddl: str, ttl: bool, reader: Schema, label: str) -> None:
        self.vid = vid
        self.ttl = ttl
        schema = parse_ddl(ddl)
        self.decode = compile_codec(schema, f"{label} (schema {vid})").decode
        self.project = _projector(schema.fields, reader.fields)


class Versions:
    """Every schema version of one state, to read its stored values.

    Parameters
    ----------
    d : StateDescriptor
        The state's descriptor (its current version and history).
    label : str
        How errors name the state.
    """

    def __init__(self, d: StateDescriptor, label: str | None = None) -> None:
        self.name = d.name
        self.label = label or f"state {d.name!r}"
        check_stored_descriptor(d, self.label)
        assert d.schema_id is not None
        self.ttl = d.ttl_ms is not None
        self.schema = parse_ddl(d.value_schema or "")
        self.current_id = d.schema_id
        self.evolved = bool(d.history)
        self._versions: dict[int, _Version] = {}
        for vid, ddl, ttl in ((d.schema_id, d.value_schema or "", self.ttl), *d.history):
            self._versions[vid] = _Version(vid, ddl, ttl, self.schema, self.label)
        self._current_tag = TAG.pack(d.schema_id)
        self._encode: Callable[[Any], bytes] | None = None

    def _version(self, raw: bytes) -> _Version:
        vid = TAG.unpack_from(raw)[0]
        v = self._versions.get(vid)
        if v is None:
            raise CorruptStateError(f"{self.label}: a stored value has schema id {vid}, which "
                                    f"none of the state's recorded schema versions has "
                                    f"({sorted(self._versions)})")
        return v

    def read(self, raw: bytes) -> tuple[int | None, tuple[Any, ...]]:
        """``(expiry or None, value in the current schema)`` of one stored value."""
        v = self._version(raw)
        exp = EXPIRY.unpack_from(raw, 2)[0] if v.ttl else None
        row = v.decode(raw[10:] if v.ttl else raw[2:])
        if v.project is not None:
            row = v.project(row)
        return (exp if self.ttl and exp != NO_EXPIRY else None), row

    def normalize_list(self, raw: bytes | None) -> bytes | None:
        """A list state's value with every element in the current layout."""
        if raw is None:
            return None
        from ..keys.values import decode_varint, encode_varint
        out: list[bytes] = []
        changed = False
        pos, end = 0, len(raw)
        while pos < end:
            n, pos = decode_varint(raw, pos)
            e = raw[pos:pos + n]
            pos += n
            if e[:2] != self._current_tag:
                e = self.normalize(e)  # type: ignore[assignment]
                changed = True
            out.append(encode_varint(len(e)))
            out.append(e)
        return b"".join(out) if changed else raw

    def view(self, cf: Any, elements: bool = False) -> _NormalizingView:
        """``cf`` (a column-family view: ``get(key)``, ``get([keys])``) returning every
        value in the current layout; ``elements``: the values are lists of elements."""
        return _NormalizingView(cf, self.normalize_list if elements else self.normalize)

    def normalize(self, raw: bytes | None) -> bytes | None:
        """``raw`` in the current version's layout (unchanged when it already is)."""
        if raw is None or raw[:2] == self._current_tag:
            return raw
        exp, row = self.read(raw)
        if self._encode is None:
            self._encode = RowCodec(self.schema, self.label).encode
        payload = self._encode(row)
        if self.ttl:
            return TAG_EXPIRY.pack(self.current_id, NO_EXPIRY if exp is None else exp) + payload
        return self._current_tag + payload


class _NormalizingView:
    """Point reads of an evolved state's column family, in the current layout."""

    __slots__ = ("_cf", "_normalize")

    def __init__(self, cf: Any, normalize: Callable[[bytes | None], bytes | None]) -> None:
        self._cf = cf
        self._normalize = normalize

    def get(self, key: Any) -> Any:
        raw = self._cf.get(key)
        if key.__class__ is list:
            return list(map(self._normalize, raw))
        return self._normalize(raw)
